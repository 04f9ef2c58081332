"""`Database`: the tables of one domain (table -> key -> typed record), copy-on-write per episode.

A domain's database is parsed and validated once (`Database.from_json`) and then frozen; every episode works
on `fork()`, which shares the frozen records and copies one only when a tool asks to change it (`edit`). An
episode therefore behaves exactly like a deep copy of the whole database (nothing it does is visible to the
frozen root or to other episodes), but starting one costs a few dictionary copies instead of copying and
re-hashing megabytes of JSON.

Rules for tool code: `get` / `rows` return shared records that must never be mutated; `edit` returns this
episode's own copy of a record, to be mutated freely; `put` and `delete` add, replace and remove records.

`transaction()` makes a block of changes atomic: when it raises, every table is restored as it was before
the block (the records edited inside a transaction are fresh copies, so the old objects stay intact).

`hash()` is the sha256 of the canonical JSON of the whole database (`records.canonical_json` of
`{table: {key: record}}`: sorted keys, no whitespace). The canonical JSON of the frozen root's records is
cached, so hashing an episode only serialises the records it changed.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import types
from collections.abc import Iterator, Mapping
from typing import Any

from orchestra_jax.tau2.records import ValidationError, canonical_json, from_json, to_json

__all__ = ["Database", "deep_merge"]


def _key_json(key: str) -> str:
  return json.dumps(key, ensure_ascii=False)


def deep_merge(target: Any, patch: Any) -> Any:
  """`patch` merged into `target` (JSON values): objects merge key by key, everything else is replaced."""
  if isinstance(target, dict) and isinstance(patch, Mapping):
    out = dict(target)
    for k, v in patch.items():
      out[k] = deep_merge(out[k], v) if k in out else copy.deepcopy(v)
    return out
  return copy.deepcopy(patch)


class Database:
  """Tables of typed records; see the module docstring."""

  def __init__(self, schema: Mapping[str, type], tables: dict[str, dict[str, Any]], *,
               _base: "Database | None" = None):
    if set(schema) != set(tables):
      raise ValueError(f"tables {sorted(tables)} do not match the schema {sorted(schema)}")
    self.schema = dict(schema)
    self._tables = tables
    self._base = _base
    self._owned: dict[str, set[str]] = {name: set() for name in tables}  # keys whose record is this db's own
    self._touched: set[str] = set()  # tables that may differ from the base's
    self._frozen = False
    self._record_json: dict[str, dict[str, str]] = {name: {} for name in tables}  # frozen roots only
    self._table_json: dict[str, str] = {}  # frozen roots only
    self._tx: dict[str, tuple[dict[str, Any], set[str]]] | None = None  # table -> (rows, owned) at tx start
    self._tx_touched: set[str] = set()
    self._tx_fresh: dict[str, set[str]] = {}

  # --- construction ---------------------------------------------------------------------------------------
  @classmethod
  def from_json(cls, schema: Mapping[str, type], data: Mapping[str, Any], *, freeze: bool = True) -> "Database":
    """Validate `{table: {key: record-json}}` into typed records (raises ValidationError)."""
    if not isinstance(data, Mapping):
      raise ValidationError("the database must be a JSON object of tables")
    missing = sorted(set(schema) - set(data))
    extra = sorted(set(data) - set(schema))
    if missing or extra:
      raise ValidationError(f"expected tables {sorted(schema)}; missing {missing}, unexpected {extra}")
    tables = {}
    for name, record_type in schema.items():
      rows = data[name]
      if not isinstance(rows, Mapping):
        raise ValidationError("expected an object of records", name)
      table = {}
      for key, raw in rows.items():
        try:
          table[key] = from_json(record_type, raw)
        except ValidationError as e:
          raise e.under(f"{name}.{key}") from None
      tables[name] = table
    db = cls(schema, tables)
    if freeze:
      db._frozen = True
    return db

  def freeze(self) -> "Database":
    """Make this database a read-only root that episodes fork from (must not be a fork itself)."""
    if self._base is not None:
      raise ValueError("only a root database can be frozen; use fork() copies for episodes")
    self._frozen = True
    return self

  @property
  def frozen(self) -> bool:
    return self._frozen

  def fork(self) -> "Database":
    """An independent copy (copy-on-write): changes to either side are never seen by the other."""
    if self._tx is not None:
      raise RuntimeError("cannot fork inside a transaction")
    if self._frozen:
      return Database(self.schema, {n: dict(rows) for n, rows in self._tables.items()}, _base=self)
    if self._base is None:  # an unfrozen root: plain deep copy
      return Database(self.schema, copy.deepcopy(self._tables))
    tables = {}
    for name, rows in self._tables.items():
      rows = dict(rows)
      for key in self._owned[name]:
        rows[key] = copy.deepcopy(rows[key])
      tables[name] = rows
    out = Database(self.schema, tables, _base=self._base)
    out._owned = {n: set(keys) for n, keys in self._owned.items()}
    out._touched = set(self._touched)
    return out

  # --- reading --------------------------------------------------------------------------------------------
  def _rows(self, table: str) -> dict[str, Any]:
    try:
      return self._tables[table]
    except KeyError:
      raise KeyError(f"no table {table!r} (tables: {', '.join(sorted(self._tables))})") from None

  def get(self, table: str, key: str, default: Any = None) -> Any:
    """The record (shared: do not mutate it; use `edit`), or `default`."""
    return self._rows(table).get(key, default)

  def has(self, table: str, key: str) -> bool:
    return key in self._rows(table)

  def rows(self, table: str) -> Mapping[str, Any]:
    """Read-only view of a table (its records are shared: do not mutate them)."""
    return types.MappingProxyType(self._rows(table))

  def tables(self) -> list[str]:
    return sorted(self._tables)

  def __len__(self) -> int:
    return sum(len(rows) for rows in self._tables.values())

  def __iter__(self) -> Iterator[str]:
    return iter(sorted(self._tables))

  # --- writing --------------------------------------------------------------------------------------------
  def _writable(self, table: str) -> dict[str, Any]:
    if self._frozen:
      raise RuntimeError("this database is frozen; fork() it to get an episode copy")
    rows = self._rows(table)
    if self._tx is not None and table not in self._tx:
      self._tx[table] = (dict(rows), set(self._owned[table]))
    self._touched.add(table)
    return rows

  def edit(self, table: str, key: str) -> Any:
    """This database's own copy of a record, to be mutated in place. KeyError if absent."""
    rows = self._writable(table)
    if key not in rows:
      raise KeyError(f"no record {key!r} in table {table!r}")
    if self._tx is not None:
      fresh = self._tx_fresh.setdefault(table, set())
      if key not in fresh:  # copy even an owned record, so a rollback gets the untouched object back
        rows[key] = copy.deepcopy(rows[key])
        fresh.add(key)
        self._owned[table].add(key)
      return rows[key]
    owned = self._owned[table]
    if key not in owned:
      rows[key] = copy.deepcopy(rows[key])
      owned.add(key)
    return rows[key]

  def put(self, table: str, key: str, record: Any) -> None:
    """Insert or replace a record (the object becomes this database's own; do not share it)."""
    record_type = self.schema[table]
    if not isinstance(record_type, type) or not isinstance(record, record_type):
      record = from_json(record_type, to_json(record))
    rows = self._writable(table)
    rows[key] = record
    self._owned[table].add(key)
    if self._tx is not None:
      self._tx_fresh.setdefault(table, set()).add(key)

  def delete(self, table: str, key: str) -> None:
    rows = self._writable(table)
    if key not in rows:
      raise KeyError(f"no record {key!r} in table {table!r}")
    del rows[key]
    self._owned[table].discard(key)

  def merge(self, patch: Mapping[str, Mapping[str, Any]]) -> None:
    """Deep-merge JSON `{table: {key: partial record}}` into the database (tau2's `initialization_data`):
    objects merge key by key, other values (lists included) are replaced; unknown keys create records."""
    for table, rows in patch.items():
      if table not in self.schema:
        raise ValidationError(f"no table {table!r} (tables: {', '.join(sorted(self.schema))})")
      for key, partial in rows.items():
        current = self.get(table, key)
        merged = deep_merge(to_json(current), partial) if current is not None else partial
        try:
          record = from_json(self.schema[table], merged)
        except ValidationError as e:
          raise e.under(f"{table}.{key}") from None
        self.put(table, key, record)

  @contextlib.contextmanager
  def transaction(self):
    """All changes in the block, or none of them if it raises."""
    if self._tx is not None:  # nested: the outer transaction already covers it
      yield self
      return
    self._tx = {}
    self._tx_touched = set(self._touched)
    self._tx_fresh = {}
    try:
      yield self
    except BaseException:
      for table, (rows, owned) in self._tx.items():
        self._tables[table] = rows
        self._owned[table] = owned
      self._touched = self._tx_touched
      raise
    finally:
      self._tx = None
      self._tx_fresh = {}

  # --- serialising ----------------------------------------------------------------------------------------
  def to_json(self) -> dict[str, dict[str, Any]]:
    """The whole database as JSON-shaped data (a fresh copy)."""
    return {name: {key: to_json(rec) for key, rec in rows.items()} for name, rows in self._tables.items()}

  def record_json(self, table: str, key: str) -> str:
    """Canonical JSON of one record."""
    rec = self._rows(table)[key]
    base = self._base
    if base is not None and key not in self._owned[table]:
      return base.record_json(table, key)
    if self._frozen:
      cache = self._record_json[table]
      text = cache.get(key)
      if text is None:
        text = cache[key] = canonical_json(to_json(rec))
      return text
    return canonical_json(to_json(rec))

  def _table_text(self, table: str) -> str:
    if self._base is not None and table not in self._touched:
      return self._base._table_text(table)
    if self._frozen and table in self._table_json:
      return self._table_json[table]
    rows = self._tables[table]
    text = "{" + ",".join(_key_json(key) + ":" + self.record_json(table, key) for key in sorted(rows)) + "}"
    if self._frozen:
      self._table_json[table] = text
    return text

  def canonical_json(self, use_cache: bool = True) -> str:
    """Canonical JSON text of the whole database. `use_cache=False` serialises every record afresh (to check
    that no shared record was mutated behind the cache's back)."""
    if not use_cache:
      return canonical_json(self.to_json())
    return "{" + ",".join(_key_json(t) + ":" + self._table_text(t) for t in sorted(self._tables)) + "}"

  def hash(self, use_cache: bool = True) -> str:
    """sha256 (hex) of `canonical_json()`."""
    return hashlib.sha256(self.canonical_json(use_cache).encode("utf-8")).hexdigest()
