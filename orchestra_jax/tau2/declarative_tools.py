"""Declarative tools: what an LLM designs for a synthesised domain, executed without running model-written code.

A tool is one operation over one table of the data model; its arguments are named after the table's columns
and typed by them, so the JSON schema the agent sees is derived, not written by the LLM:

* `get`: the row whose primary key is given (argument named after the primary-key column).
* `list`: the rows matching every given filter (`filters`: columns; equality, strings case-insensitive, an
  array column matches when it contains the value), sorted by key, at most `limit` (default 50).
* `update`: change `fields` (optional arguments) of the row with the given key, then apply the constants in
  `set` (e.g. `{"status": "cancelled"}`); at least one change must be given.
* `create`: add a row from `fields` and `set`; the key is an argument when the primary key is among `fields`,
  else generated (`id_prefix` + the next free number; integer keys: max + 1). Fails if the key exists.
* `delete`: remove the row with the given key (refused while other rows reference it).
* `calculate`: arithmetic on an `expression` (numbers, + - * /, parentheses).
* `transfer`: hand the user to a human agent (`summary`); returns "Transfer successful".

`required` lists the filters / fields that must be given; `arg_descriptions` overrides argument descriptions.
Writes (update, create, delete) run in a database transaction and are checked against the data model
(column types, enums, foreign keys), so a failed call changes nothing.

JSON form of one tool (an entry of tools.json "tools"):

    {"name": "freeze_account", "description": "Freeze an account.", "operation": "update", "table": "accounts",
     "fields": [], "set": {"status": "frozen"}}

`make_toolkit(name, data_model, tools)` builds a class with the interface `tau2.Domain` expects of a toolkit
(`TOOLS` with `.writes` / `.schema`, `tool_schemas()`, `invoke(name, arguments)`, `run_assertion`), so the
generic `tau2.Environment` (call, db_hash, grading) runs synthesised domains unchanged.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from orchestra_jax.tau2.db import Database
from orchestra_jax.tau2.tools import ToolError, safe_calculate
from orchestra_jax.tau2.datamodel import IDENT, Column, DataModel, InvalidSpec, Table

__all__ = ["OPERATIONS", "WRITE_OPERATIONS", "ToolDef", "compile_tools", "make_toolkit", "DeclarativeToolkit"]

OPERATIONS = ("get", "list", "update", "create", "delete", "calculate", "transfer")
WRITE_OPERATIONS = ("update", "create", "delete")
TABLE_OPERATIONS = ("get", "list", "update", "create", "delete")
_TOOL_KEYS = ("name", "description", "operation", "table", "filters", "fields", "set", "required", "id_prefix",
              "limit", "arg_descriptions")
_EXPRESSION = Column("expression", "string", "The arithmetic expression to calculate, such as '2 + 2'. Numbers, "
                     "+ - * /, parentheses and spaces only.", required=True)
_SUMMARY = Column("summary", "string", "A summary of the user's issue.", required=True)


def _short(value: Any, limit: int = 60) -> str:
  text = json.dumps(value, default=str)
  return text if len(text) <= limit else text[:limit - 3] + "..."


@dataclasses.dataclass(frozen=True)
class ToolDef:
  """One declarative tool (see the module docstring). Build with `ToolDef.from_json(d, data_model)`."""

  name: str
  description: str
  operation: str
  table: str | None = None
  filters: tuple[str, ...] = ()
  fields: tuple[str, ...] = ()
  set: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  required: tuple[str, ...] = ()
  id_prefix: str | None = None
  limit: int = 50
  arg_descriptions: Mapping[str, str] = dataclasses.field(default_factory=dict)
  # derived
  params: tuple[Column, ...] = ()
  required_params: tuple[str, ...] = ()

  @property
  def writes(self) -> bool:
    return self.operation in WRITE_OPERATIONS

  @property
  def schema(self) -> dict[str, Any]:
    """OpenAI function-tool schema."""
    props = {c.name: c.json_schema(self.arg_descriptions.get(c.name)) for c in self.params}
    return {"type": "function", "function": {
        "name": self.name, "description": self.description,
        "parameters": {"type": "object", "properties": props, "required": list(self.required_params)}}}

  def to_json(self) -> dict[str, Any]:
    out: dict[str, Any] = {"name": self.name, "description": self.description, "operation": self.operation}
    if self.table is not None:
      out["table"] = self.table
    if self.filters:
      out["filters"] = list(self.filters)
    if self.fields:
      out["fields"] = list(self.fields)
    if self.set:
      out["set"] = dict(self.set)
    if self.required:
      out["required"] = list(self.required)
    if self.id_prefix is not None:
      out["id_prefix"] = self.id_prefix
    if self.operation == "list" and self.limit != 50:
      out["limit"] = self.limit
    if self.arg_descriptions:
      out["arg_descriptions"] = dict(self.arg_descriptions)
    return out

  @classmethod
  def from_json(cls, d: Any, model: DataModel, where: str = "tool") -> "ToolDef":
    if not isinstance(d, Mapping):
      raise InvalidSpec(f"{where}: a tool must be an object, got {_short(d)}")
    name = d.get("name")
    if not isinstance(name, str) or not IDENT.match(name):
      raise InvalidSpec(f"{where}.name: must be an identifier (letters, digits, _), got {_short(name)}")
    where = f"tool {name}"
    unknown = sorted(set(d) - set(_TOOL_KEYS))
    if unknown:
      raise InvalidSpec(f"{where}: unknown field{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                        f"allowed: {', '.join(_TOOL_KEYS)}")
    description = d.get("description")
    if not isinstance(description, str) or not description.strip():
      raise InvalidSpec(f"{where}.description: must be a non-empty string")
    op = d.get("operation")
    if op not in OPERATIONS:
      raise InvalidSpec(f"{where}.operation: must be one of {', '.join(OPERATIONS)}, got {_short(op)}")

    def names(key: str) -> tuple[str, ...]:
      value = d.get(key) or []
      if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidSpec(f"{where}.{key}: must be a list of column names")
      if len(set(value)) != len(value):
        raise InvalidSpec(f"{where}.{key}: lists a column twice")
      return tuple(value)

    filters, fields, required = names("filters"), names("fields"), names("required")
    set_values = d.get("set") or {}
    if not isinstance(set_values, Mapping):
      raise InvalidSpec(f"{where}.set: must be an object of column -> constant value")
    arg_desc = d.get("arg_descriptions") or {}
    if not isinstance(arg_desc, Mapping) or not all(isinstance(v, str) for v in arg_desc.values()):
      raise InvalidSpec(f"{where}.arg_descriptions: must be an object of argument -> text")
    id_prefix = d.get("id_prefix")
    if id_prefix is not None and (not isinstance(id_prefix, str) or not id_prefix):
      raise InvalidSpec(f"{where}.id_prefix: must be a non-empty string")
    limit = d.get("limit", 50)
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
      raise InvalidSpec(f"{where}.limit: must be a positive integer")
    table_name = d.get("table")
    table: Table | None = None
    if op in TABLE_OPERATIONS:
      if not isinstance(table_name, str) or table_name not in model.tables:
        raise InvalidSpec(f"{where}.table: must be one of {', '.join(model.tables)}, got {_short(table_name)}")
      table = model.tables[table_name]
    elif table_name is not None or filters or fields or set_values:
      raise InvalidSpec(f"{where}: a '{op}' tool takes no table, filters, fields or set")
    for key, cols in (("filters", filters), ("fields", fields), ("set", tuple(set_values))):
      for c in cols:
        if c not in table.columns:
          raise InvalidSpec(f"{where}.{key}: {c!r} is not a column of {table.name} "
                            f"(columns: {', '.join(table.columns)})")
    if filters and op != "list":
      raise InvalidSpec(f"{where}.filters: only 'list' tools take filters")
    if (fields or set_values) and op not in ("update", "create"):
      raise InvalidSpec(f"{where}: only 'update' and 'create' tools take fields or set")
    if id_prefix is not None and op != "create":
      raise InvalidSpec(f"{where}.id_prefix: only 'create' tools take id_prefix")
    set_clean = {}
    for c, v in set_values.items():
      set_clean[c] = table.columns[c].coerce(v, f"{where}.set.{c}")
    overlap = sorted(set(fields) & set(set_clean))
    if overlap:
      raise InvalidSpec(f"{where}: {', '.join(overlap)} both in fields and in set")

    # parameters
    params: list[Column] = []
    required_params: list[str] = []
    if op in ("get", "update", "delete"):
      key = table.key_column
      params.append(dataclasses.replace(key, required=True))
      required_params.append(key.name)
      if op == "update" and table.primary_key in fields + tuple(set_clean):
        raise InvalidSpec(f"{where}: an update cannot change the primary key {table.primary_key!r}")
      if op == "update" and not fields and not set_clean:
        raise InvalidSpec(f"{where}: an update needs fields (columns the caller sets) or set (constants)")
    if op == "list":
      for c in filters:  # an array column is filtered by one item value
        col = table.columns[c]
        if col.type == "array":
          col = dataclasses.replace(col, type=col.items or "string", items=None)
        params.append(dataclasses.replace(col, required=False))
    if op in ("update", "create"):
      params.extend(dataclasses.replace(table.columns[c], required=False) for c in fields)
    if op == "calculate":
      params.append(_EXPRESSION)
      required_params.append("expression")
    if op == "transfer":
      params.append(_SUMMARY)
      required_params.append("summary")
    param_names = [p.name for p in params]
    bad = sorted(set(required) - set(param_names))
    if bad:
      raise InvalidSpec(f"{where}.required: {', '.join(bad)} {'is not an argument' if len(bad) == 1 else 'are not arguments'}"
                        f" (arguments: {', '.join(param_names) or 'none'})")
    if op == "create":
      pk = table.primary_key
      if pk not in fields and pk not in set_clean and table.key_column.type == "string" and id_prefix is None:
        raise InvalidSpec(f"{where}: the primary key {pk!r} is not among fields, so give id_prefix for generated ids")
      # every required column must come from somewhere
      for c in table.required_columns:
        if c == pk or c in set_clean:
          continue
        if c not in fields:
          raise InvalidSpec(f"{where}: required column {c!r} of {table.name} is neither in fields nor in set")
      required = tuple(dict.fromkeys(list(required) + [c for c in fields if table.columns[c].required]))
    bad_desc = sorted(set(arg_desc) - set(param_names))
    if bad_desc:
      raise InvalidSpec(f"{where}.arg_descriptions: {', '.join(bad_desc)} not among the arguments")
    for r in required:
      if r not in required_params:
        required_params.append(r)
    params = [dataclasses.replace(p, required=p.name in required_params) for p in params]
    return cls(name=name, description=" ".join(description.split()), operation=op, table=table_name if table else None,
               filters=filters, fields=fields, set=set_clean, required=required, id_prefix=id_prefix, limit=limit,
               arg_descriptions=dict(arg_desc), params=tuple(params), required_params=tuple(required_params))


def compile_tools(tools: Any, model: DataModel) -> list[ToolDef]:
  """Validate a list of tool JSON objects against the data model (unique names)."""
  if not isinstance(tools, list) or not tools:
    raise InvalidSpec("tools must be a non-empty list of tool objects")
  out = [ToolDef.from_json(t, model, f"tools[{i}]") for i, t in enumerate(tools)]
  names = [t.name for t in out]
  dup = sorted({n for n in names if names.count(n) > 1})
  if dup:
    raise InvalidSpec(f"tool names must be unique; repeated: {', '.join(dup)}")
  return out


# --- execution ----------------------------------------------------------------------------------------------
def _matches(col: Column, have: Any, want: Any) -> bool:
  if col.type == "array":
    return isinstance(have, list) and any(_matches(dataclasses.replace(col, type=col.items or "string"), h, want)
                                          for h in have)
  if isinstance(have, str) and isinstance(want, str):
    return have.casefold() == want.casefold()
  return have == want


class DeclarativeToolkit:
  """Executes `ToolDef`s over a `Database` whose records are JSON rows. Use `make_toolkit` for a domain's class."""

  DOMAIN = "synth"
  MODEL: DataModel
  TOOLS: dict[str, ToolDef] = {}
  ASSERTIONS: tuple[str, ...] = ("assert_row_exists", "assert_field_equals")

  def __init__(self, db: Database):
    self.db = db

  @classmethod
  def tool_schemas(cls) -> list[dict[str, Any]]:
    return [t.schema for t in cls.TOOLS.values()]

  # --- arguments ------------------------------------------------------------------------------------
  def _bind(self, tool: ToolDef, arguments: Mapping[str, Any] | None) -> dict[str, Any]:
    if arguments is None:
      arguments = {}
    if not isinstance(arguments, Mapping):
      raise ToolError(f"Arguments of {tool.name} must be a JSON object, got {type(arguments).__name__}.")
    known = {p.name: p for p in tool.params}
    unexpected = sorted(k for k in arguments if k not in known)
    if unexpected:
      raise ToolError(f"Unexpected argument{'s' if len(unexpected) > 1 else ''} for {tool.name}: "
                      f"{', '.join(unexpected)}. Expected: {', '.join(known) or 'none'}.")
    out = {}
    for name, p in known.items():
      if name not in arguments or arguments[name] is None:
        if name in tool.required_params:
          raise ToolError(f"Missing required argument '{name}' for {tool.name}.")
        continue
      try:
        out[name] = p.coerce(arguments[name], name)
      except InvalidSpec as e:
        raise ToolError(f"Invalid argument for {tool.name}: {e}.") from None
    return out

  def _table(self, tool: ToolDef) -> Table:
    return self.MODEL.tables[tool.table]

  def _row(self, table: Table, key: Any) -> dict[str, Any]:
    row = self.db.get(table.name, str(key))
    if row is None:
      raise ToolError(f"{table.name} {key} not found.")
    return row

  def _check_row(self, table: Table, row: Mapping[str, Any]) -> dict[str, Any]:
    try:
      row = table.validate_row(row, table.name)
      self.MODEL.check_references(table.name, row, self.db.has)
    except InvalidSpec as e:
      raise ToolError(f"Invalid {table.name} row: {e}.") from None
    return row

  # --- operations -----------------------------------------------------------------------------------
  def invoke(self, name: str, arguments: Mapping[str, Any] | None = None) -> Any:
    tool = self.TOOLS.get(name)
    if tool is None:
      raise ToolError(f"Unknown tool '{name}'. Available tools: {', '.join(sorted(self.TOOLS))}.")
    args = self._bind(tool, arguments)
    op = getattr(self, f"_op_{tool.operation}")
    if tool.writes:
      with self.db.transaction():
        return op(tool, args)
    return op(tool, args)

  def _op_get(self, tool: ToolDef, args: dict[str, Any]) -> Any:
    table = self._table(tool)
    return self._row(table, args[table.primary_key])

  def _op_list(self, tool: ToolDef, args: dict[str, Any]) -> Any:
    table = self._table(tool)
    rows = self.db.rows(table.name)
    out = []
    for key in sorted(rows):
      row = rows[key]
      if all(_matches(table.columns[c], row.get(c), v) for c, v in args.items()):
        out.append(row)
        if len(out) >= tool.limit:
          break
    return out

  def _op_update(self, tool: ToolDef, args: dict[str, Any]) -> Any:
    table = self._table(tool)
    key = str(args.pop(table.primary_key))
    self._row(table, key)
    if not args and not tool.set:
      raise ToolError(f"{tool.name}: nothing to change; give at least one of {', '.join(tool.fields)}.")
    row = dict(self.db.get(table.name, key))
    row.update(args)
    row.update(json.loads(json.dumps(dict(tool.set))))
    row = self._check_row(table, row)
    target = self.db.edit(table.name, key)
    target.clear()
    target.update(row)
    return target

  def _op_create(self, tool: ToolDef, args: dict[str, Any]) -> Any:
    table = self._table(tool)
    row = dict(args)
    row.update(json.loads(json.dumps(dict(tool.set))))
    pk = table.primary_key
    if row.get(pk) is None:
      rows = self.db.rows(table.name)
      if table.key_column.type == "integer":
        row[pk] = max((int(k) for k in rows if k.lstrip("-").isdigit()), default=0) + 1
      else:
        n = len(rows) + 1
        while f"{tool.id_prefix}{n}" in rows:
          n += 1
        row[pk] = f"{tool.id_prefix}{n}"
    row = self._check_row(table, row)
    key = table.key_of(row)
    if self.db.has(table.name, key):
      raise ToolError(f"{table.name} {key} already exists.")
    self.db.put(table.name, key, row)
    return row

  def _op_delete(self, tool: ToolDef, args: dict[str, Any]) -> Any:
    table = self._table(tool)
    key = str(args[table.primary_key])
    self._row(table, key)
    for other in self.MODEL.tables.values():
      for col in other.columns.values():
        if col.ref != table.name:
          continue
        for okey, orow in self.db.rows(other.name).items():
          value = orow.get(col.name)
          values = value if isinstance(value, list) else [value]
          if any(v is not None and str(v) == key for v in values):
            raise ToolError(f"Cannot delete {table.name} {key}: {other.name} {okey} refers to it.")
    self.db.delete(table.name, key)
    return f"Deleted {table.name} {key}."

  def _op_calculate(self, tool: ToolDef, args: dict[str, Any]) -> Any:
    return safe_calculate(args["expression"])

  def _op_transfer(self, tool: ToolDef, args: dict[str, Any]) -> Any:
    return "Transfer successful"

  # --- env assertions (tau2 env_assertions) ---------------------------------------------------------
  def run_assertion(self, name: str, arguments: Mapping[str, Any] | None = None) -> bool:
    if name not in self.ASSERTIONS:
      raise ToolError(f"Unknown assertion '{name}'. Available: {', '.join(self.ASSERTIONS)}.")
    return bool(getattr(self, name)(**dict(arguments or {})))

  def assert_row_exists(self, table: str, key: Any) -> bool:
    return table in self.MODEL.tables and self.db.has(table, str(key))

  def assert_field_equals(self, table: str, key: Any, column: str, value: Any) -> bool:
    if table not in self.MODEL.tables:
      return False
    row = self.db.get(table, str(key))
    return row is not None and row.get(column) == value


def make_toolkit(domain: str, model: DataModel, tools: Sequence[ToolDef]) -> type[DeclarativeToolkit]:
  """A toolkit class for one domain (what `tau2.Domain` takes as `toolkit`)."""
  name = "".join(p.capitalize() for p in domain.replace("-", "_").split("_") if p) + "Tools"
  return type(name, (DeclarativeToolkit,), {"DOMAIN": domain, "MODEL": model, "TOOLS": {t.name: t for t in tools}})
