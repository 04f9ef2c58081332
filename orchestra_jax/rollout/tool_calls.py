"""Tool calls in the hermes format Qwen3 writes: the tool-schema form, parsing a generated turn, schema checks.

* Schemas. `normalize_tool_schema` gives the OpenAI form `{"type": "function", "function": {...}}` that the chat
  template renders and the checks read.
* Parsing. `parse_assistant_turn` splits a generated turn into thinking, content and tool calls
  (`<tool_call>{json}</tool_call>` blocks), tolerating common slips (see its docstring).
* Validation. `validate_tool_calls` checks parsed calls against the tools' JSON schemas (and, when asked, refuses
  calls past a per-turn limit).
* Limits. A generated call is hostile input: its JSON text is capped in characters (`max_argument_chars`), its
  arguments in nesting depth (`max_argument_depth`), and integers too long for Python (over 4300 digits) are a
  bad call; each becomes a `ToolCallError`, so one degenerate turn costs its row a tool error, never the batch.

Error messages (`ToolCallError.message`) are written to be sent back to the model verbatim as a tool response.
`rollout.chat_format` re-exports these names: they are part of the chat format's API.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from orchestra_jax.tokenizer import ENDOFTEXT, IM_END, THINK_CLOSE, THINK_OPEN, TOOL_CALL_CLOSE, TOOL_CALL_OPEN

# Kinds of ToolCallError. The first four come from parsing, the rest from schema validation.
MALFORMED_JSON = "malformed_json"
MISSING_NAME = "missing_name"
BAD_ARGUMENTS = "bad_arguments"
UNTERMINATED = "unterminated"
UNKNOWN_TOOL = "unknown_tool"
MISSING_ARGUMENT = "missing_argument"
WRONG_TYPE = "wrong_type"
INVALID_VALUE = "invalid_value"  # not one of the schema's `enum`
UNEXPECTED_ARGUMENT = "unexpected_argument"  # only when the schema says additionalProperties: false
TOO_MANY_CALLS = "too_many_calls"  # past `validate_tool_calls(max_calls=)`: refused, not executed
ERROR_KINDS = (MALFORMED_JSON, MISSING_NAME, BAD_ARGUMENTS, UNTERMINATED, UNKNOWN_TOOL, MISSING_ARGUMENT,
               WRONG_TYPE, INVALID_VALUE, UNEXPECTED_ARGUMENT, TOO_MANY_CALLS)

# Parser limits (RolloutConfig / training_config.RolloutSection name the same values). Real tool calls are a few
# hundred characters and a few levels deep; these only stop degenerate output. The depth bound keeps every later
# recursive walk of the arguments (schema checks, dataclasses.asdict, json.dumps in the rollout writer) far from
# Python's recursion limit.
MAX_ARGUMENT_CHARS = 16_384
MAX_ARGUMENT_DEPTH = 32

CALL_FORMAT_HINT = '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'


# --- tool schemas --------------------------------------------------------------------------------------
def normalize_tool_schema(tool: Mapping[str, Any]) -> dict[str, Any]:
  """OpenAI form `{"type": "function", "function": {...}}`, which is what Qwen3 saw in training.

  A bare `{"name", "description", "parameters"}` schema is wrapped; an OpenAI-form one is returned as is.
  """
  if "function" in tool and isinstance(tool["function"], Mapping):
    return dict(tool)
  if "name" not in tool:
    raise ValueError(f"tool schema has no name: {tool!r}")
  return {"type": "function", "function": dict(tool)}


# --- parsing -------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ToolCall:
  """One parsed `<tool_call>` block."""

  name: str
  arguments: dict[str, Any]
  raw: str  # the exact text of the block, `<tool_call>` through `</tool_call>` (or end of text)
  index: int = 0  # position among this turn's `<tool_call>` blocks, counting failed ones too
  repairs: tuple[str, ...] = ()  # lenient fixes that were needed; a trainer may penalise them

  def to_dict(self) -> dict[str, Any]:
    return {"name": self.name, "arguments": self.arguments, "raw": self.raw, "index": self.index,
            "repairs": list(self.repairs)}

  @classmethod
  def from_dict(cls, d: Mapping[str, Any]) -> "ToolCall":
    return cls(name=d["name"], arguments=d["arguments"], raw=d["raw"], index=d.get("index", 0),
               repairs=tuple(d.get("repairs", ())))


@dataclasses.dataclass(frozen=True)
class ToolCallError:
  """A tool call that cannot be executed; `message` is meant to be shown to the model as the tool response."""

  kind: str  # one of ERROR_KINDS
  message: str
  raw: str  # the offending block's text
  index: int | None = None  # block position within the turn, when known
  name: str | None = None  # tool name, when known

  def to_dict(self) -> dict[str, Any]:
    return {"kind": self.kind, "message": self.message, "raw": self.raw, "index": self.index, "name": self.name}

  @classmethod
  def from_dict(cls, d: Mapping[str, Any]) -> "ToolCallError":
    return cls(kind=d["kind"], message=d["message"], raw=d["raw"], index=d.get("index"), name=d.get("name"))


@dataclasses.dataclass
class ParsedTurn:
  """A generated assistant turn split into its parts."""

  thinking: str | None  # inside `<think>…</think>` (stripped); None when the turn has no think block
  content: str  # text outside the think block and the tool calls (stripped)
  tool_calls: list[ToolCall] = dataclasses.field(default_factory=list)
  errors: list[ToolCallError] = dataclasses.field(default_factory=list)
  thinking_unterminated: bool = False  # `<think>` never closed: everything after it is thinking

  @property
  def has_tool_call(self) -> bool:
    return bool(self.tool_calls)


class _Fail(Exception):
  def __init__(self, kind: str, detail: str, name: str | None = None):
    super().__init__(detail)
    self.kind, self.detail, self.name = kind, detail, name


_DECODER = json.JSONDecoder()
_WS = " \t\r\n"


def _skip_ws(text: str, i: int) -> int:
  while i < len(text) and text[i] in _WS:
    i += 1
  return i


def _strip_trailing_commas(s: str) -> str:
  """Drop commas that directly precede `}` or `]` (ignoring whitespace), outside JSON strings."""
  out: list[str] = []
  in_str = esc = False
  for i, ch in enumerate(s):
    if in_str:
      out.append(ch)
      if esc:
        esc = False
      elif ch == "\\":
        esc = True
      elif ch == '"':
        in_str = False
      continue
    if ch == '"':
      in_str = True
    elif ch == ",":
      j = _skip_ws(s, i + 1)
      if j < len(s) and s[j] in "}]":
        continue
    out.append(ch)
  return "".join(out)


def _strip_code_fence(s: str) -> str | None:
  """`\\`\\`\\`json\\n{...}\\n\\`\\`\\`` -> `{...}`; None when `s` is not fenced."""
  if not (s.startswith("```") and s.endswith("```") and len(s) >= 6):
    return None
  inner = s[3:-3]
  nl = inner.find("\n")
  if nl >= 0 and inner[:nl].strip().isidentifier():  # language tag such as "json"
    inner = inner[nl + 1:]
  return inner.strip()


def _loads_lenient(body: str, repairs: list[str]) -> Any:
  """json.loads with whitespace, code-fence and trailing-comma slips forgiven (each recorded in `repairs`)."""
  s = body.strip()
  fenced = _strip_code_fence(s)
  if fenced is not None:
    s = fenced
    repairs.append("code_fence")
  try:
    return json.loads(s)
  except json.JSONDecodeError as e:
    first_error = e
  except RecursionError:
    raise _Fail(MALFORMED_JSON, "JSON nested too deeply") from None
  except ValueError as e:  # an integer over sys.get_int_max_str_digits(); not a JSONDecodeError
    raise _Fail(MALFORMED_JSON, _value_error_detail(e)) from None
  fixed = _strip_trailing_commas(s)
  if fixed != s:
    try:
      value = json.loads(fixed)
      repairs.append("trailing_comma")
      return value
    except (ValueError, RecursionError):
      pass
  raise _Fail(MALFORMED_JSON, f"{first_error.msg} at line {first_error.lineno} column {first_error.colno}")


def _value_error_detail(e: ValueError) -> str:
  if "digits" in str(e):
    return "a number has too many digits"
  return f"invalid JSON ({e})"


def _depth(value: Any, limit: int) -> int:
  """Nesting depth of containers in `value` (a scalar is 0, `{}` is 1), counted up to `limit + 1` at most.

  Iterative: the value may be nested deeper than Python's recursion limit allows a recursive walk to go."""
  deepest = 0
  stack = [(value, 1)]
  while stack:
    v, d = stack.pop()
    if isinstance(v, dict):
      items = v.values()
    elif isinstance(v, list):
      items = v
    else:
      continue
    deepest = max(deepest, d)
    if deepest > limit:
      return deepest
    stack.extend((item, d + 1) for item in items)
  return deepest


def _call_from_value(value: Any, repairs: list[str]) -> tuple[str, dict[str, Any]]:
  """Check the decoded JSON of a call and return (name, arguments)."""
  if not isinstance(value, dict):
    raise _Fail(MALFORMED_JSON, f"expected a JSON object, got {json_type(value)}")
  if "name" not in value and isinstance(value.get("function"), dict):  # OpenAI-style nesting
    value = value["function"]
    repairs.append("function_wrapper")
  name = value.get("name")
  if not isinstance(name, str) or not name.strip():
    raise _Fail(MISSING_NAME, 'no "name" string naming the function to call' if name is None
                else f'"name" must be a non-empty string, got {json.dumps(name, ensure_ascii=False)}')
  name = name.strip()
  if "arguments" in value:
    args = value["arguments"]
  elif "parameters" in value:
    args = value["parameters"]
    repairs.append("parameters_key")
  else:
    args = {}
    repairs.append("missing_arguments")
  if isinstance(args, str):
    if not args.strip():
      args = {}
    else:
      try:
        args = json.loads(args)
      except json.JSONDecodeError as e:
        raise _Fail(BAD_ARGUMENTS, f'"arguments" is a string that is not valid JSON ({e.msg})', name) from None
      except RecursionError:
        raise _Fail(BAD_ARGUMENTS, '"arguments" is nested too deeply', name) from None
      except ValueError as e:
        raise _Fail(BAD_ARGUMENTS, f'"arguments" is a string that is not valid JSON ({_value_error_detail(e)})',
                    name) from None
    repairs.append("arguments_string")
  if not isinstance(args, dict):
    raise _Fail(BAD_ARGUMENTS, f'"arguments" must be a JSON object, got {json_type(args)}', name)
  return name, args


def _error_message(kind: str, index: int, detail: str, name: str | None) -> str:
  who = f"Tool call #{index + 1}" + (f" ({name})" if name else "")
  if kind == UNTERMINATED:
    return f"{who} was not closed: {detail}. Finish each call with </tool_call>. Expected format:\n{CALL_FORMAT_HINT}"
  return f"{who} could not be parsed: {detail}. Expected format:\n{CALL_FORMAT_HINT}"


def _split_thinking(text: str) -> tuple[str, str | None, str, bool]:
  """(text before the think block, thinking or None, text after it, unterminated)."""
  first_call = text.find(TOOL_CALL_OPEN)
  limit = len(text) if first_call < 0 else first_call
  o = text.find(THINK_OPEN, 0, limit)
  if o >= 0:
    c = text.find(THINK_CLOSE, o + len(THINK_OPEN))
    if c < 0:
      return text[:o], text[o + len(THINK_OPEN):].strip(), "", True
    return text[:o], text[o + len(THINK_OPEN):c].strip(), text[c + len(THINK_CLOSE):], False
  c = text.find(THINK_CLOSE, 0, limit)
  if c >= 0:  # `<think>` was part of the prompt (templates that open the think block for the model)
    return "", text[:c].strip(), text[c + len(THINK_CLOSE):], False
  return "", None, text, False


def _strip_end_tokens(text: str) -> str:
  while True:
    s = text.rstrip(_WS)
    for tok in (IM_END, ENDOFTEXT):
      if s.endswith(tok):
        text = s[:-len(tok)]
        break
    else:
      return text


def _check_limits(name: str, args: dict[str, Any], size: int, max_chars: int | None, max_depth: int | None) -> None:
  if max_chars is not None and size > max_chars:
    raise _Fail(BAD_ARGUMENTS, f"the call is {size} characters long, over the limit of {max_chars} characters", name)
  if max_depth is not None:
    depth = _depth(args, max_depth)
    if depth > max_depth:
      raise _Fail(BAD_ARGUMENTS, f'"arguments" are nested more than {max_depth} levels deep', name)


def parse_assistant_turn(text: str, *, assume_closed: bool = False, max_argument_chars: int | None = MAX_ARGUMENT_CHARS,
                         max_argument_depth: int | None = MAX_ARGUMENT_DEPTH) -> ParsedTurn:
  """Split generated text (decoded with special tokens kept) into thinking, content and tool calls.

  Handled: a `<think>…</think>` block (a `<tool_call>` inside it is thinking, not a call; a `</think>` with no
  opening tag before the first call means the prompt opened the block); any number of
  `<tool_call>{json}</tool_call>` blocks; `</tool_call>` or braces inside JSON strings (the JSON is decoded
  first and the closing tag looked for after it); text ending right after `</tool_call>` (stop string) or
  with a trailing `<|im_end|>` / `<|endoftext|>`.
  `assume_closed`: generation stopped on the `</tool_call>` stop string and the engine left it out of the
  text, so a final block that is complete JSON counts as closed instead of `unterminated`.

  Slips forgiven, each noted in `ToolCall.repairs`: whitespace/newlines around the JSON (not even noted);
  a markdown code fence around the JSON; trailing commas before `}` or `]`; `arguments` given as a JSON
  string holding an object (or an empty string); `parameters` instead of `arguments`; no `arguments` at all
  (taken as `{}`: a call to a tool without parameters); OpenAI nesting `{"function": {"name", "arguments"}}`.
  Not forgiven: single quotes, Python literals, extra closing braces, several objects in one block.
  Refused as BAD_ARGUMENTS (None lifts a limit): a block whose text after `<tool_call>` (JSON, whitespace and the
  closing tag) is over `max_argument_chars` characters,
  arguments nested deeper than `max_argument_depth` (the arguments object itself is level 1); as MALFORMED_JSON /
  BAD_ARGUMENTS: an integer longer than Python converts (4300 digits).
  """
  text = _strip_end_tokens(text)
  before, thinking, rest, unterminated_think = _split_thinking(text)
  content_parts = [before]
  calls: list[ToolCall] = []
  errors: list[ToolCallError] = []
  pos = index = 0
  while True:
    start = rest.find(TOOL_CALL_OPEN, pos)
    if start < 0:
      content_parts.append(rest[pos:])
      break
    content_parts.append(rest[pos:start])
    body_start = start + len(TOOL_CALL_OPEN)
    repairs: list[str] = []
    value: Any = None
    end = -1  # end of the block in `rest`
    # 1) Exact JSON, then the closing tag: survives `</tool_call>` inside a string value.
    j = _skip_ws(rest, body_start)
    try:
      value, k = _DECODER.raw_decode(rest, j)
      k = _skip_ws(rest, k)
      if rest.startswith(TOOL_CALL_CLOSE, k):
        end = k + len(TOOL_CALL_CLOSE)
      elif k == len(rest) and assume_closed:
        end = k
    except (ValueError, RecursionError):  # ValueError: JSONDecodeError, or an integer with too many digits
      pass
    try:
      if end < 0:  # 2) Up to the first closing tag, with lenient decoding.
        close = rest.find(TOOL_CALL_CLOSE, body_start)
        if close < 0:
          end = len(rest)
          if not assume_closed:
            raise _Fail(UNTERMINATED, "no </tool_call> after <tool_call>")
          body = rest[body_start:]
        else:
          end = close + len(TOOL_CALL_CLOSE)
          body = rest[body_start:close]
        value = _loads_lenient(body, repairs)
      name, args = _call_from_value(value, repairs)
      _check_limits(name, args, end - body_start, max_argument_chars, max_argument_depth)
      calls.append(ToolCall(name=name, arguments=args, raw=rest[start:end], index=index, repairs=tuple(repairs)))
    except _Fail as f:
      errors.append(ToolCallError(kind=f.kind, message=_error_message(f.kind, index, f.detail, f.name),
                                  raw=rest[start:end], index=index, name=f.name))
    pos = end
    index += 1
  content = "".join(content_parts).strip()
  return ParsedTurn(thinking=thinking, content=content, tool_calls=calls, errors=errors,
                    thinking_unterminated=unterminated_think)


# --- validation against tool schemas -------------------------------------------------------------------
def json_type(value: Any) -> str:
  """The JSON-schema type name of a decoded JSON value (for error messages and type checks)."""
  if value is None:
    return "null"
  if isinstance(value, bool):
    return "boolean"
  if isinstance(value, int):
    return "integer"
  if isinstance(value, float):
    return "number"
  if isinstance(value, str):
    return "string"
  if isinstance(value, list | tuple):
    return "array"
  if isinstance(value, dict):
    return "object"
  return type(value).__name__


def _is_type(value: Any, t: str) -> bool:
  actual = json_type(value)
  if t == "number":
    return actual in ("integer", "number")
  if t == "integer":
    return actual == "integer" or (actual == "number" and float(value).is_integer())
  return actual == t


def _short(value: Any, limit: int = 80) -> str:
  s = json.dumps(value, ensure_ascii=False)
  return s if len(s) <= limit else s[:limit - 3] + "..."


def _json_equal(a: Any, b: Any) -> bool:
  return a == b and (json_type(a) == json_type(b) or {json_type(a), json_type(b)} == {"integer", "number"})


def _check_value(value: Any, schema: Any, path: str, out: list[tuple[str, str]]) -> None:
  """Append (kind, detail) for what `value` breaks in a basic JSON schema (type, enum, required, properties,
  additionalProperties: false, items). Combinators (anyOf, oneOf, $ref...) are accepted unchecked."""
  if not isinstance(schema, Mapping):
    return
  types = schema.get("type")
  if isinstance(types, str):
    types = [types]
  if isinstance(types, list) and types and not any(_is_type(value, t) for t in types):
    want = " or ".join(types)
    out.append((WRONG_TYPE, f'argument "{path}" must be {want}, got {json_type(value)} {_short(value)}'))
    return
  enum = schema.get("enum")
  if isinstance(enum, list) and not any(_json_equal(value, e) for e in enum):
    options = ", ".join(_short(e) for e in enum)
    out.append((INVALID_VALUE, f'argument "{path}" must be one of [{options}], got {_short(value)}'))
    return
  if isinstance(value, dict):
    props = schema.get("properties")
    props = props if isinstance(props, Mapping) else {}
    for key in schema.get("required") or ():
      if key not in value:
        where = f'"{path}.{key}"' if path else f'"{key}"'
        out.append((MISSING_ARGUMENT, f"missing required argument {where}" + _describe(props.get(key))))
    for key, sub in value.items():
      sub_path = f"{path}.{key}" if path else key
      if key in props:
        _check_value(sub, props[key], sub_path, out)
      elif schema.get("additionalProperties") is False:
        allowed = ", ".join(props) or "none"
        out.append((UNEXPECTED_ARGUMENT, f'unexpected argument "{sub_path}" (allowed: {allowed})'))
  elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
    for i, item in enumerate(value):
      _check_value(item, schema["items"], f"{path}[{i}]", out)


def _describe(prop: Any) -> str:
  if not isinstance(prop, Mapping):
    return ""
  bits = []
  if isinstance(prop.get("type"), str):
    bits.append(prop["type"])
  if isinstance(prop.get("enum"), list):
    bits.append("one of [" + ", ".join(_short(e) for e in prop["enum"]) + "]")
  if isinstance(prop.get("description"), str):
    bits.append(prop["description"].strip())
  return f" ({'; '.join(bits)})" if bits else ""


def tool_parameter_schemas(tool_schemas: Sequence[Mapping[str, Any]] | Mapping[str, Any]) -> dict[str, Any]:
  """name -> parameters schema, from OpenAI-form or bare tool schemas, or an existing name -> schema mapping."""
  if isinstance(tool_schemas, Mapping):
    return dict(tool_schemas)
  out: dict[str, Any] = {}
  for tool in tool_schemas:
    fn = normalize_tool_schema(tool)["function"]
    out[fn["name"]] = fn.get("parameters") or {}
  return out


def validate_tool_calls(parsed: ParsedTurn | Sequence[ToolCall],
                        tool_schemas: Sequence[Mapping[str, Any]] | Mapping[str, Any],
                        max_calls: int | None = None) -> list[ToolCallError]:
  """Errors for calls to unknown tools, missing required arguments, wrong basic types and values outside an
  `enum` (plus unexpected arguments when a schema sets additionalProperties: false). Parse errors already in
  `parsed.errors` are not repeated. `tool_schemas`: the list given to `render_messages`, or name -> params.
  `max_calls`: calls in block position `max_calls` or later (failed blocks count: the limit is on what the model
  wrote) get one TOO_MANY_CALLS error each instead of schema checks, so the caller refuses them."""
  calls = parsed.tool_calls if isinstance(parsed, ParsedTurn) else list(parsed)
  params = tool_parameter_schemas(tool_schemas)
  errors: list[ToolCallError] = []
  for call in calls:
    who = f'Tool call #{call.index + 1} ({call.name})'
    if max_calls is not None and call.index >= max_calls:
      errors.append(ToolCallError(TOO_MANY_CALLS, f"{who} was not run: at most {max_calls} tool calls per turn are "
                                  f"executed. Make fewer calls per turn.", call.raw, call.index, call.name))
      continue
    if call.name not in params:
      available = ", ".join(sorted(params)) or "none"
      errors.append(ToolCallError(UNKNOWN_TOOL, f'{who}: unknown tool "{call.name}". Available tools: {available}.',
                                  call.raw, call.index, call.name))
      continue
    found: list[tuple[str, str]] = []
    _check_value(call.arguments, params[call.name], "", found)
    for kind, detail in found:
      errors.append(ToolCallError(kind, f"{who}: {detail}.", call.raw, call.index, call.name))
  return errors
