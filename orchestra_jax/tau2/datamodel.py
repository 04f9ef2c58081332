"""The typed data model of a synthesised domain: tables, their columns, primary and foreign keys.

It is compiled from two LLM stages: the JSON schema of each table (column types, enums, required columns,
descriptions) and the relations (each table's primary key and its foreign keys). Rows are plain JSON objects;
`Table.validate_row` checks and normalises one (an "integer" column accepts 3.0 and stores 3, a "number"
column stores 3 as 3.0, so the database hash does not depend on how a number was spelled), and
`DataModel.check_references` checks foreign keys across tables.

JSON form (the `data_model` entry of tools.json):

    {"tables": {"accounts": {"description": "...", "primary_key": "account_id",
                             "columns": {"account_id": {"type": "string", "description": "...", "required": true},
                                         "customer_id": {"type": "string", "ref": "customers", "required": true},
                                         "status": {"type": "string", "enum": ["active", "frozen"]},
                                         "tags": {"type": "array", "items": "string"}}}}}
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["COLUMN_TYPES", "InvalidSpec", "Column", "Table", "DataModel", "IDENT"]

COLUMN_TYPES = ("string", "integer", "number", "boolean", "array", "object")
ITEM_TYPES = ("string", "integer", "number", "boolean", "object")
IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


class InvalidSpec(ValueError):
  """Generated content (schema, rows, tools, task) that does not validate; the message says what is wrong and is
  shown to the LLM when the stage is retried."""


def _short(value: Any, limit: int = 60) -> str:
  text = json.dumps(value, default=str)
  return text if len(text) <= limit else text[:limit - 3] + "..."


def _check_value(kind: str, value: Any, where: str) -> Any:
  if kind == "string":
    if isinstance(value, str):
      return value
  elif kind == "integer":
    if isinstance(value, int) and not isinstance(value, bool):
      return value
    if isinstance(value, float) and value.is_integer():
      return int(value)
  elif kind == "number":
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
      return float(value)
  elif kind == "boolean":
    if isinstance(value, bool):
      return value
  elif kind == "array":
    if isinstance(value, list):
      return value
  elif kind == "object":
    if isinstance(value, dict):
      return value
  article = "an" if kind[0] in "aeiou" else "a"
  raise InvalidSpec(f"{where}: expected {article} {kind}, got {_short(value)}")


@dataclasses.dataclass(frozen=True)
class Column:
  name: str
  type: str
  description: str = ""
  required: bool = False
  enum: tuple[Any, ...] | None = None
  items: str | None = None  # item type of an array column
  ref: str | None = None  # foreign key: the table whose primary keys this column (or each array item) holds

  def coerce(self, value: Any, where: str = "") -> Any:
    """The normalised value (None allowed unless required); raises InvalidSpec."""
    where = where or self.name
    if value is None:
      if self.required:
        raise InvalidSpec(f"{where}: must not be null")
      return None
    value = _check_value(self.type, value, where)
    if self.type == "array" and self.items:
      value = [_check_value(self.items, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if self.enum is not None:
      values = value if self.type == "array" else [value]
      for v in values:
        if v not in self.enum:
          raise InvalidSpec(f"{where}: {_short(v)} is not one of {', '.join(json.dumps(e) for e in self.enum)}")
    return json.loads(json.dumps(value))  # a private copy

  def json_schema(self, description: str | None = None) -> dict[str, Any]:
    """JSON schema of a tool argument holding this column's value."""
    out: dict[str, Any] = {"type": self.type}
    if self.type == "array":
      out["items"] = {"type": self.items} if self.items else {}
    if self.enum is not None:
      if self.type == "array":
        out["items"] = {**out["items"], "enum": list(self.enum)}
      else:
        out["enum"] = list(self.enum)
    text = description or self.description
    if text:
      out["description"] = text
    return out

  def to_json(self) -> dict[str, Any]:
    out: dict[str, Any] = {"type": self.type}
    if self.description:
      out["description"] = self.description
    if self.required:
      out["required"] = True
    if self.enum is not None:
      out["enum"] = list(self.enum)
    if self.items:
      out["items"] = self.items
    if self.ref:
      out["ref"] = self.ref
    return out

  @classmethod
  def from_schema(cls, name: str, schema: Any, required: bool, where: str) -> "Column":
    """From a JSON-schema property (or this class's own JSON form)."""
    if not IDENT.match(name):
      raise InvalidSpec(f"{where}: column names must be identifiers (letters, digits, _), got {name!r}")
    if not isinstance(schema, Mapping):
      raise InvalidSpec(f"{where}.{name}: must be an object with a 'type', got {_short(schema)}")
    kind = schema.get("type")
    if isinstance(kind, list):  # ["string", "null"]: nullable
      kinds = [k for k in kind if k != "null"]
      kind = kinds[0] if len(kinds) == 1 else kind
    if kind not in COLUMN_TYPES:
      raise InvalidSpec(f"{where}.{name}.type: must be one of {', '.join(COLUMN_TYPES)}, got {_short(kind)}")
    items = schema.get("items")
    enum = schema.get("enum")
    if isinstance(items, Mapping):
      if enum is None and isinstance(items.get("enum"), list):
        enum = items["enum"]
      items = items.get("type")
    if kind == "array":
      if items is not None and items not in ITEM_TYPES:
        raise InvalidSpec(f"{where}.{name}.items: item type must be one of {', '.join(ITEM_TYPES)}, got {_short(items)}")
    else:
      items = None
    if enum is not None:
      if not isinstance(enum, list) or not enum:
        raise InvalidSpec(f"{where}.{name}.enum: must be a non-empty list")
      item_kind = items if kind == "array" else kind
      if item_kind in ("object", "array", None) and kind != "array":
        raise InvalidSpec(f"{where}.{name}.enum: only scalar columns can have an enum")
      if item_kind is not None:
        enum = [_check_value(item_kind, e, f"{where}.{name}.enum") for e in enum]
      enum = tuple(enum)
    description = schema.get("description") or ""
    if not isinstance(description, str):
      raise InvalidSpec(f"{where}.{name}.description: must be a string")
    ref = schema.get("ref")
    if ref is not None and not isinstance(ref, str):
      raise InvalidSpec(f"{where}.{name}.ref: must be a table name")
    if isinstance(schema.get("required"), bool):  # this class's own JSON form
      required = schema["required"]
    return cls(name=name, type=kind, description=description.strip(), required=required, enum=enum, items=items,
               ref=ref)


@dataclasses.dataclass(frozen=True)
class Table:
  name: str
  primary_key: str
  columns: Mapping[str, Column]
  description: str = ""

  @property
  def key_column(self) -> Column:
    return self.columns[self.primary_key]

  @property
  def required_columns(self) -> list[str]:
    return [c.name for c in self.columns.values() if c.required]

  def validate_row(self, row: Any, where: str = "") -> dict[str, Any]:
    """The normalised row (every column present, absent optional ones as null); raises InvalidSpec."""
    where = where or self.name
    if not isinstance(row, Mapping):
      raise InvalidSpec(f"{where}: a row must be an object, got {_short(row)}")
    unknown = sorted(set(row) - set(self.columns))
    if unknown:
      raise InvalidSpec(f"{where}: unknown column{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} "
                        f"(columns: {', '.join(self.columns)})")
    out = {}
    for name, col in self.columns.items():
      if name not in row and col.required:
        raise InvalidSpec(f"{where}: missing required column '{name}'")
      out[name] = col.coerce(row.get(name), f"{where}.{name}")
    return out

  def key_of(self, row: Mapping[str, Any]) -> str:
    return str(row[self.primary_key])

  def to_json(self) -> dict[str, Any]:
    return {"description": self.description, "primary_key": self.primary_key,
            "columns": {n: c.to_json() for n, c in self.columns.items()}}

  def json_schema(self) -> dict[str, Any]:
    """The table's row schema (shown to the LLM)."""
    props = {}
    for n, c in self.columns.items():
      props[n] = c.json_schema()
      if c.ref:
        props[n]["description"] = (props[n].get("description", "") + f" (a {c.ref} key)").strip()
    return {"type": "object", "description": self.description, "primary_key": self.primary_key,
            "properties": props, "required": self.required_columns}


class DataModel:
  """Tables by name (insertion order)."""

  def __init__(self, tables: Mapping[str, Table]):
    self.tables = dict(tables)
    self._check()

  def __repr__(self) -> str:
    return f"DataModel({', '.join(self.tables)})"

  def table(self, name: str) -> Table:
    try:
      return self.tables[name]
    except KeyError:
      raise InvalidSpec(f"no table {name!r} (tables: {', '.join(self.tables)})") from None

  def _check(self) -> None:
    if not self.tables:
      raise InvalidSpec("the data model has no tables")
    for t in self.tables.values():
      if not IDENT.match(t.name):
        raise InvalidSpec(f"table names must be identifiers, got {t.name!r}")
      if t.primary_key not in t.columns:
        raise InvalidSpec(f"{t.name}.primary_key: {t.primary_key!r} is not a column of {t.name} "
                          f"(columns: {', '.join(t.columns)})")
      key = t.key_column
      if key.type not in ("string", "integer"):
        raise InvalidSpec(f"{t.name}.primary_key: column {key.name!r} must be a string or an integer, not {key.type}")
      for c in t.columns.values():
        if c.ref is not None:
          if c.ref not in self.tables:
            raise InvalidSpec(f"{t.name}.{c.name}: foreign key to unknown table {c.ref!r} "
                              f"(tables: {', '.join(self.tables)})")
          target = self.tables[c.ref].key_column.type
          own = c.items if c.type == "array" else c.type
          if own != target:
            raise InvalidSpec(f"{t.name}.{c.name}: holds {c.ref} keys, which are {target}s, but the column is "
                              f"{'an array of ' + str(own) if c.type == 'array' else own}")

  # --- building ---------------------------------------------------------------------------------------
  @classmethod
  def compile(cls, schemas: Mapping[str, Any], relations: Mapping[str, Any],
              descriptions: Mapping[str, str] | None = None) -> "DataModel":
    """From the schema stage (table -> JSON schema) and the relations stage (table -> {primary_key,
    foreign_keys: {column: table}}). Raises InvalidSpec naming the table and column."""
    descriptions = descriptions or {}
    tables = {}
    for name, schema in schemas.items():
      if not isinstance(schema, Mapping) or not isinstance(schema.get("properties"), Mapping):
        raise InvalidSpec(f"{name}: the schema must be an object with 'properties'")
      required = schema.get("required") or []
      if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise InvalidSpec(f"{name}.required: must be a list of column names")
      missing = sorted(set(required) - set(schema["properties"]))
      if missing:
        raise InvalidSpec(f"{name}.required: names columns that are not properties: {', '.join(missing)}")
      rel = relations.get(name)
      if not isinstance(rel, Mapping):
        raise InvalidSpec(f"{name}: no relations entry (primary_key, foreign_keys) for this table")
      pk = rel.get("primary_key")
      fks = rel.get("foreign_keys") or {}
      if not isinstance(pk, str):
        raise InvalidSpec(f"{name}.primary_key: must be a column name, got {_short(pk)}")
      if not isinstance(fks, Mapping):
        raise InvalidSpec(f"{name}.foreign_keys: must be an object of column -> table")
      columns = {}
      for cname, prop in schema["properties"].items():
        col = Column.from_schema(cname, prop, cname in required or cname == pk, name)
        if cname in fks:
          col = dataclasses.replace(col, ref=fks[cname])
        columns[cname] = col
      unknown = sorted(set(fks) - set(columns))
      if unknown:
        raise InvalidSpec(f"{name}.foreign_keys: names columns that do not exist: {', '.join(unknown)}")
      if pk not in columns:
        raise InvalidSpec(f"{name}.primary_key: {pk!r} is not a column (columns: {', '.join(columns)})")
      description = schema.get("description") or descriptions.get(name) or ""
      tables[name] = Table(name=name, primary_key=pk, columns=columns, description=str(description).strip())
    missing = sorted(set(relations) - set(schemas))
    if missing:
      raise InvalidSpec(f"relations name tables without a schema: {', '.join(missing)}")
    return cls(tables)

  @classmethod
  def from_json(cls, data: Any) -> "DataModel":
    if not isinstance(data, Mapping) or not isinstance(data.get("tables"), Mapping):
      raise InvalidSpec("the data model must be an object {\"tables\": {name: table}}")
    tables = {}
    for name, t in data["tables"].items():
      if not isinstance(t, Mapping) or not isinstance(t.get("columns"), Mapping):
        raise InvalidSpec(f"{name}: a table needs 'columns'")
      cols = {n: Column.from_schema(n, c, bool(c.get("required", False)) if isinstance(c, Mapping) else False, name)
              for n, c in t["columns"].items()}
      tables[name] = Table(name=name, primary_key=str(t.get("primary_key")), columns=cols,
                           description=str(t.get("description") or ""))
    return cls(tables)

  def to_json(self) -> dict[str, Any]:
    return {"tables": {n: t.to_json() for n, t in self.tables.items()}}

  # --- databases --------------------------------------------------------------------------------------
  def dependency_order(self) -> list[str]:
    """Tables ordered so that a table comes after the tables it references (cycles: declaration order)."""
    order: list[str] = []
    visiting: set[str] = set()

    def visit(name: str) -> None:
      if name in order or name in visiting:
        return
      visiting.add(name)
      for c in self.tables[name].columns.values():
        if c.ref and c.ref != name:
          visit(c.ref)
      visiting.discard(name)
      order.append(name)

    for name in self.tables:
      visit(name)
    return order

  def references(self, table: str, row: Mapping[str, Any]) -> list[tuple[str, str, Any]]:
    """(column, target table, key) for every foreign-key value in a row."""
    out = []
    for c in self.tables[table].columns.values():
      value = row.get(c.name)
      if c.ref is None or value is None:
        continue
      for v in (value if c.type == "array" else [value]):
        out.append((c.name, c.ref, v))
    return out

  def check_references(self, table: str, row: Mapping[str, Any], has_key, where: str = "") -> None:
    """Raise InvalidSpec when a foreign key of `row` names no row; `has_key(table, key_str) -> bool`."""
    for column, target, value in self.references(table, row):
      if not has_key(target, str(value)):
        raise InvalidSpec(f"{where or table}.{column}: {_short(value)} is not a key of table {target}")

  def validate_db(self, data: Any) -> dict[str, dict[str, dict[str, Any]]]:
    """A whole database `{table: {key: row}}`, normalised; raises InvalidSpec at the first problem."""
    if not isinstance(data, Mapping):
      raise InvalidSpec("the database must be an object of tables")
    missing = sorted(set(self.tables) - set(data))
    extra = sorted(set(data) - set(self.tables))
    if missing or extra:
      raise InvalidSpec(f"database tables do not match the data model: missing {missing}, unexpected {extra}")
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for name, table in self.tables.items():
      rows = data[name]
      if not isinstance(rows, Mapping):
        raise InvalidSpec(f"{name}: must be an object of key -> row")
      clean = {}
      for key, row in rows.items():
        row = table.validate_row(row, f"{name}.{key}")
        if table.key_of(row) != key:
          raise InvalidSpec(f"{name}.{key}: the row's {table.primary_key} is {_short(row[table.primary_key])}, "
                            "not its key")
        clean[key] = row
      out[name] = clean
    for name in self.tables:
      for key, row in out[name].items():
        self.check_references(name, row, lambda t, k: k in out[t], f"{name}.{key}")
    return out
