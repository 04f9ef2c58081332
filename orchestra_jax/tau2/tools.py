"""Tool machinery shared by the domains: `ToolError`, the `@tool` decorator, `Toolkit`, and tools common to all.

A domain's tools are the methods of a `Toolkit` subclass marked with `@tool`. The JSON schema the model sees
is built from each method's signature (type annotations, defaults) plus the decorator's descriptions, and the
same annotations validate and convert the arguments of every call (`records.from_json`), so a tool body only
ever sees well-typed values. A tool signals a bad request by raising `ToolError`; the environment turns it
into the text of the tool result.

`@tool(..., writes=True)` marks a tool that may change the database: the environment runs it inside a
database transaction, so a call that fails leaves the database untouched even if it failed half-way.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import math
import operator
import typing
from collections.abc import Callable, Mapping
from typing import Any

from orchestra_jax.tau2.db import Database
from orchestra_jax.tau2.records import ValidationError, from_json, json_schema, to_json

__all__ = ["ToolError", "tool", "assertion", "ToolSpec", "Toolkit", "TransferTool", "CalculateTool",
           "format_result", "safe_calculate",
           "CALL_EXPERT_SCHEMA", "EXPERT_NAMES"]


class ToolError(Exception):
  """A tool call the domain refuses (unknown id, insufficient balance, bad arguments...). Its message is what
  the agent sees as the tool result."""


EXPERT_NAMES = ("expert-1", "expert-2", "expert-3")

CALL_EXPERT_SCHEMA: dict[str, Any] = {
  "type": "function",
  "function": {
    "name": "call_expert",
    "description": ("Hand the current conversation to a stronger expert model, which decides the next step "
                    "(a tool call or a reply to the user). Experts differ in ability and cost per call."),
    "parameters": {
      "type": "object",
      "properties": {
        "expert": {"type": "string", "enum": list(EXPERT_NAMES), "description": "Which expert to call."},
      },
      "required": ["expert"],
    },
  },
}


@dataclasses.dataclass(frozen=True)
class _ToolMeta:
  description: str
  writes: bool
  args: Mapping[str, str]
  name: str | None


def tool(description: str, *, writes: bool = False, args: Mapping[str, str] | None = None,
         name: str | None = None):
  """Mark a `Toolkit` method as a tool. `args`: a description per parameter; `writes`: may change the DB."""
  def mark(fn):
    fn.__tool_meta__ = _ToolMeta(" ".join(description.split()), writes, dict(args or {}), name)
    return fn
  return mark


def assertion(fn):
  """Mark a `Toolkit` method as an environment assertion (tau2 `env_assertions`): returns a bool."""
  fn.__assertion__ = True
  return fn


@dataclasses.dataclass(frozen=True)
class _Param:
  name: str
  annotation: Any
  required: bool
  default: Any
  loader: Callable[[Any], Any]


@dataclasses.dataclass(frozen=True)
class ToolSpec:
  """One tool: its name, schema (OpenAI form) and how to call it."""

  name: str
  description: str
  writes: bool
  method: str  # attribute name on the toolkit
  params: tuple[_Param, ...]
  schema: dict[str, Any]

  def bind(self, arguments: Mapping[str, Any] | None) -> dict[str, Any]:
    """Validated, typed keyword arguments (raises ToolError)."""
    if arguments is None:
      arguments = {}
    if not isinstance(arguments, Mapping):
      raise ToolError(f"Arguments of {self.name} must be a JSON object, got {type(arguments).__name__}.")
    known = {p.name for p in self.params}
    unexpected = sorted(k for k in arguments if k not in known)
    if unexpected:
      raise ToolError(f"Unexpected argument{'s' if len(unexpected) > 1 else ''} for {self.name}: "
                      f"{', '.join(unexpected)}. Expected: {', '.join(p.name for p in self.params) or 'none'}.")
    kwargs = {}
    for p in self.params:
      if p.name not in arguments:
        if p.required:
          raise ToolError(f"Missing required argument '{p.name}' for {self.name}.")
        continue
      try:
        kwargs[p.name] = p.loader(arguments[p.name])
      except ValidationError as e:
        raise ToolError(f"Invalid argument for {self.name}: {e.under(p.name)}.") from None
    return kwargs


def _build_spec(method_name: str, fn: Callable, meta: _ToolMeta) -> ToolSpec:
  hints = typing.get_type_hints(fn)
  sig = inspect.signature(fn)
  params = []
  props: dict[str, Any] = {}
  required: list[str] = []
  for pname, p in list(sig.parameters.items())[1:]:  # skip self
    if pname not in hints:
      raise TypeError(f"tool {method_name}: parameter {pname} has no annotation")
    is_required = p.default is inspect.Parameter.empty
    ann = hints[pname]
    params.append(_Param(pname, ann, is_required, None if is_required else p.default,
                         (lambda tp: (lambda v: from_json(tp, v)))(ann)))
    props[pname] = json_schema(ann, meta.args.get(pname))
    if is_required:
      required.append(pname)
  unknown = set(meta.args) - set(props)
  if unknown:
    raise TypeError(f"tool {method_name}: descriptions for unknown parameters {sorted(unknown)}")
  name = meta.name or method_name
  schema = {"type": "function", "function": {
    "name": name, "description": meta.description,
    "parameters": {"type": "object", "properties": props, "required": required}}}
  return ToolSpec(name, meta.description, meta.writes, method_name, tuple(params), schema)


def format_result(value: Any) -> str:
  """Tool result text: strings as they are, everything else as JSON."""
  if isinstance(value, str):
    return value
  return json.dumps(to_json(value), ensure_ascii=False)


class Toolkit:
  """Base of a domain's tools over one `Database`. Subclasses define `@tool` methods (and `@assertion`s)."""

  TOOLS: dict[str, ToolSpec] = {}
  ASSERTIONS: tuple[str, ...] = ()

  def __init_subclass__(cls, **kwargs):
    super().__init_subclass__(**kwargs)
    tools: dict[str, ToolSpec] = {}
    assertions = []
    seen: set[str] = set()
    for klass in cls.__mro__:  # the subclass's own tools first, then those of its mixins
      for attr, fn in vars(klass).items():
        if attr in seen:
          continue
        seen.add(attr)
        meta = getattr(fn, "__tool_meta__", None)
        if meta is not None:
          spec = _build_spec(attr, fn, meta)
          tools[spec.name] = spec
        if getattr(fn, "__assertion__", False):
          assertions.append(attr)
    cls.TOOLS = tools
    cls.ASSERTIONS = tuple(dict.fromkeys(assertions))

  def __init__(self, db: Database):
    self.db = db

  @classmethod
  def tool_schemas(cls) -> list[dict[str, Any]]:
    return [spec.schema for spec in cls.TOOLS.values()]

  def invoke(self, name: str, arguments: Mapping[str, Any] | None = None) -> Any:
    """Call a tool with JSON arguments; returns its typed result (raises ToolError). Write tools run in a
    transaction."""
    spec = self.TOOLS.get(name)
    if spec is None:
      raise ToolError(f"Unknown tool '{name}'. Available tools: {', '.join(sorted(self.TOOLS))}.")
    kwargs = spec.bind(arguments)
    method = getattr(self, spec.method)
    if spec.writes:
      with self.db.transaction():
        return method(**kwargs)
    return method(**kwargs)

  def run_assertion(self, name: str, arguments: Mapping[str, Any] | None = None) -> bool:
    if name not in self.ASSERTIONS:
      raise ToolError(f"Unknown assertion '{name}'. Available: {', '.join(self.ASSERTIONS) or 'none'}.")
    return bool(getattr(self, name)(**dict(arguments or {})))


# --- shared tool bodies -------------------------------------------------------------------------------------
_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_UNOPS = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_ALLOWED_CHARS = set("0123456789+-*/(). ")


def _eval_node(node: ast.AST) -> float:
  if isinstance(node, ast.Expression):
    return _eval_node(node.body)
  if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
    return node.value
  if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
    return _BINOPS[type(node.op)](_eval_node(node.left), _eval_node(node.right))
  if isinstance(node, ast.UnaryOp) and type(node.op) in _UNOPS:
    return _UNOPS[type(node.op)](_eval_node(node.operand))
  raise ToolError("Invalid expression: only numbers, + - * / and parentheses are allowed.")


def safe_calculate(expression: str) -> str:
  """Evaluate an arithmetic expression (numbers, + - * /, parentheses); the result rounded to 2 decimals."""
  if not expression.strip():
    raise ToolError("Invalid expression: it is empty.")
  if not set(expression) <= _ALLOWED_CHARS:
    bad = "".join(sorted(set(expression) - _ALLOWED_CHARS))
    raise ToolError(f"Invalid characters in expression: {bad!r}. Only numbers, + - * / ( ) . are allowed.")
  try:
    tree = ast.parse(expression.strip(), mode="eval")
  except SyntaxError:
    raise ToolError(f"Invalid expression: {expression!r} is not valid arithmetic.") from None
  try:
    value = _eval_node(tree)
  except ZeroDivisionError:
    raise ToolError("Invalid expression: division by zero.") from None
  except OverflowError:
    raise ToolError("Invalid expression: the result is too large.") from None
  if not math.isfinite(value):
    raise ToolError("Invalid expression: the result is not a finite number.")
  return str(round(float(value), 2))


class TransferTool(Toolkit):
  """Mixin: `transfer_to_human_agents`."""

  @tool("Transfer the user to a human agent, with a summary of the user's issue. Only transfer if the user "
        "explicitly asks for a human agent, or the user's issue cannot be resolved by the agent with the "
        "available tools.",
        args={"summary": "A summary of the user's issue."})
  def transfer_to_human_agents(self, summary: str) -> str:
    return "Transfer successful"


class CalculateTool(Toolkit):
  """Mixin: `calculate`."""

  @tool("Calculate the result of a mathematical expression.",
        args={"expression": "The mathematical expression to calculate, such as '2 + 2'. The expression can "
                            "contain numbers, operators (+, -, *, /), parentheses, and spaces."})
  def calculate(self, expression: str) -> str:
    return safe_calculate(expression)
