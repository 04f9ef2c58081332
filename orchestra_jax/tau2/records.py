"""Typed records for the environment databases and tool arguments: plain dataclasses plus one small converter.

`from_json(tp, value)` validates JSON-shaped data against a type annotation and builds the typed value;
`to_json(value)` turns it back into JSON-shaped data. Supported annotations: `str`, `int`, `float`, `bool`,
`Any`, `Literal[...]`, `list[X]`, `dict[str, X]`, `X | None`, unions of dataclasses (the first member that
validates wins; give each member a `Literal` tag field so exactly one does) and dataclasses (unknown keys are
an error, missing keys are an error unless the field has a default).

Numbers are normalised to the declared type, as a lax JSON-schema validator would: an `int` field accepts
`3` or `3.0` (stored as `3`), a `float` field accepts `3` or `3.0` (stored as `3.0`). That keeps the canonical
JSON of a database independent of how an agent spelled a number.

A dataclass field whose default is `None` is optional in both directions: absent on input means `None`, and
`None` is left out on output. This is how records carry attributes that only some rows have (a reservation's
`status`, an order's `cancel_reason`), so a loaded database dumps back to exactly the file it came from.

`json_schema(tp)` gives the JSON schema of an annotation (tool parameters for the model); a dataclass field
may carry `metadata={"description": ...}`.
"""

from __future__ import annotations

import collections.abc as cabc
import dataclasses
import functools
import hashlib
import json
import types
import typing
from typing import Any, Callable, Literal, Union

from orchestra_jax.rollout.tool_calls import json_type

__all__ = ["ValidationError", "from_json", "to_json", "json_schema", "canonical_json", "sha256_json", "field"]


class ValidationError(ValueError):
  """Data that does not match its declared type. `path` locates the offending value ("a.b[2].c")."""

  def __init__(self, message: str, path: str = ""):
    self.message = message
    self.path = path
    super().__init__(f"{path}: {message}" if path else message)

  def under(self, prefix: str) -> "ValidationError":
    if not self.path:
      path = prefix
    elif self.path.startswith("["):
      path = prefix + self.path
    else:
      path = f"{prefix}.{self.path}" if prefix else self.path
    return ValidationError(self.message, path)


def field(description: str | None = None, **kwargs) -> Any:
  """`dataclasses.field` with an optional description for the JSON schema."""
  metadata = dict(kwargs.pop("metadata", {}) or {})
  if description:
    metadata["description"] = description
  return dataclasses.field(metadata=metadata, **kwargs)


def _short(value: Any, limit: int = 60) -> str:
  text = json.dumps(value, default=str)
  return text if len(text) <= limit else text[:limit - 3] + "..."


# --- loading ------------------------------------------------------------------------------------------------
def _load_str(v):
  if isinstance(v, str):
    return v
  raise ValidationError(f"expected a string, got {json_type(v)} {_short(v)}")


def _load_bool(v):
  if isinstance(v, bool):
    return v
  raise ValidationError(f"expected a boolean, got {json_type(v)} {_short(v)}")


def _load_int(v):
  if isinstance(v, int) and not isinstance(v, bool):
    return v
  if isinstance(v, float) and v.is_integer():
    return int(v)
  raise ValidationError(f"expected an integer, got {json_type(v)} {_short(v)}")


def _load_float(v):
  if isinstance(v, (int, float)) and not isinstance(v, bool):
    return float(v)
  raise ValidationError(f"expected a number, got {json_type(v)} {_short(v)}")


def _load_any(v):
  return v


_PRIMITIVE_LOADERS = {str: _load_str, bool: _load_bool, int: _load_int, float: _load_float, Any: _load_any,
                      object: _load_any}


@functools.lru_cache(maxsize=None)
def _loader(tp: Any) -> Callable[[Any], Any]:
  if tp in _PRIMITIVE_LOADERS:
    return _PRIMITIVE_LOADERS[tp]
  origin = typing.get_origin(tp)
  args = typing.get_args(tp)
  if origin is Literal:
    allowed = args

    def load_literal(v):
      for a in allowed:
        if v == a and type(v) is type(a):
          return a
      raise ValidationError(f"expected one of {', '.join(json.dumps(a) for a in allowed)}, got {_short(v)}")
    return load_literal
  if origin in (list, tuple, cabc.Sequence) or tp in (list, tuple):
    item = _loader(args[0]) if args else _load_any

    def load_list(v):
      if not isinstance(v, (list, tuple)):
        raise ValidationError(f"expected an array, got {json_type(v)} {_short(v)}")
      out = []
      for i, x in enumerate(v):
        try:
          out.append(item(x))
        except ValidationError as e:
          raise e.under(f"[{i}]") from None
      return out
    return load_list
  if origin in (dict, cabc.Mapping) or tp is dict:
    value_loader = _loader(args[1]) if args else _load_any

    def load_dict(v):
      if not isinstance(v, dict):
        raise ValidationError(f"expected an object, got {json_type(v)} {_short(v)}")
      out = {}
      for k, x in v.items():
        if not isinstance(k, str):
          raise ValidationError(f"object keys must be strings, got {_short(k)}")
        try:
          out[k] = value_loader(x)
        except ValidationError as e:
          raise e.under(k) from None
      return out
    return load_dict
  if origin in (Union, types.UnionType):
    members = [a for a in args if a is not type(None)]
    nullable = len(members) < len(args)
    loaders = [_loader(m) for m in members]
    if len(loaders) == 1:
      only = loaders[0]

      def load_optional(v):
        return None if v is None else only(v)
      return load_optional

    def load_union(v):
      if v is None and nullable:
        return None
      errors = []
      for load in loaders:
        try:
          return load(v)
        except ValidationError as e:
          errors.append(str(e))
      raise ValidationError("matches none of the allowed forms: " + " | ".join(errors))
    return load_union
  if dataclasses.is_dataclass(tp):
    return _dataclass_loader(tp)
  raise TypeError(f"unsupported annotation {tp!r}")


_MISSING = dataclasses.MISSING


def _dataclass_loader(cls: type) -> Callable[[Any], Any]:
  hints = typing.get_type_hints(cls)
  specs = []  # (name, loader, default, default_factory)
  for f in dataclasses.fields(cls):
    if not f.init:
      continue
    specs.append((f.name, _LazyLoader(hints[f.name]), f.default, f.default_factory))
  names = frozenset(s[0] for s in specs)

  def load_dataclass(v):
    if isinstance(v, cls):
      v = to_json(v)
    if not isinstance(v, dict):
      raise ValidationError(f"expected an object ({cls.__name__}), got {json_type(v)} {_short(v)}")
    kwargs = {}
    found = 0
    for name, load, default, factory in specs:
      if name in v:
        found += 1
        try:
          kwargs[name] = load(v[name])
        except ValidationError as e:
          raise e.under(name) from None
      elif default is not _MISSING:
        kwargs[name] = default
      elif factory is not _MISSING:
        kwargs[name] = factory()
      else:
        raise ValidationError(f"missing required field '{name}'")
    if found < len(v):
      extra = sorted(k for k in v if k not in names)
      raise ValidationError(f"unexpected field{'s' if len(extra) > 1 else ''} {', '.join(map(repr, extra))}"
                              f" for {cls.__name__}")
    return cls(**kwargs)
  return load_dataclass


class _LazyLoader:
  """Resolves a field's loader on first use, so recursive or forward-declared record types work."""
  __slots__ = ("tp", "fn")

  def __init__(self, tp):
    self.tp = tp
    self.fn = None

  def __call__(self, v):
    fn = self.fn
    if fn is None:
      fn = self.fn = _loader(self.tp)
    return fn(v)


def from_json(tp: Any, value: Any) -> Any:
  """Validate JSON-shaped `value` against annotation `tp` and build the typed value (raises ValidationError)."""
  return _loader(tp)(value)


# --- dumping ------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _dump_fields(cls: type) -> tuple[tuple[str, bool], ...]:
  return tuple((f.name, f.default is None) for f in dataclasses.fields(cls))


def to_json(value: Any) -> Any:
  """JSON-shaped copy of a typed value (dataclasses become dicts; fields whose default is None are left out
  when None)."""
  if isinstance(value, (str, int, float, bool)) or value is None:
    return value
  if isinstance(value, list) or isinstance(value, tuple):
    return [to_json(x) for x in value]
  if isinstance(value, dict):
    return {k: to_json(x) for k, x in value.items()}
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    out = {}
    for name, omit_none in _dump_fields(type(value)):
      x = getattr(value, name)
      if x is None and omit_none:
        continue
      out[name] = to_json(x)
    return out
  raise TypeError(f"cannot convert {type(value).__name__} to JSON")


def canonical_json(value: Any) -> str:
  """Canonical JSON text: sorted keys, no whitespace, UTF-8 characters kept as is."""
  return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def sha256_json(value: Any) -> str:
  return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()


# --- JSON schema --------------------------------------------------------------------------------------------
def _literal_type(values) -> str | None:
  kinds = {json_type(v) for v in values}
  return kinds.pop() if len(kinds) == 1 else None


def json_schema(tp: Any, description: str | None = None) -> dict[str, Any]:
  """JSON schema (the subset OpenAI function calling uses) of an annotation."""
  origin = typing.get_origin(tp)
  args = typing.get_args(tp)
  if tp is str:
    out = {"type": "string"}
  elif tp is bool:
    out = {"type": "boolean"}
  elif tp is int:
    out = {"type": "integer"}
  elif tp is float:
    out = {"type": "number"}
  elif tp is Any or tp is object:
    out = {}
  elif origin is Literal:
    out = {"enum": list(args)}
    kind = _literal_type(args)
    if kind:
      out = {"type": kind, **out}
  elif origin in (list, tuple, cabc.Sequence) or tp in (list, tuple):
    out = {"type": "array", "items": json_schema(args[0]) if args else {}}
  elif origin in (dict, cabc.Mapping) or tp is dict:
    out = {"type": "object"}
    if args:
      out["additionalProperties"] = json_schema(args[1])
  elif origin in (Union, types.UnionType):
    members = [a for a in args if a is not type(None)]
    out = json_schema(members[0]) if len(members) == 1 else {"anyOf": [json_schema(m) for m in members]}
  elif dataclasses.is_dataclass(tp):
    hints = typing.get_type_hints(tp)
    props, required = {}, []
    for f in dataclasses.fields(tp):
      props[f.name] = json_schema(hints[f.name], f.metadata.get("description"))
      if f.default is _MISSING and f.default_factory is _MISSING:
        required.append(f.name)
    out = {"type": "object", "properties": props, "required": required}
    if tp.__doc__ and not tp.__doc__.startswith(tp.__name__ + "("):
      out["description"] = " ".join(tp.__doc__.split())
  else:
    raise TypeError(f"unsupported annotation {tp!r}")
  if description:
    out = {**out, "description": description}
  return out
