"""The Qwen3 (hermes-style) chat format: rendering prompts, the exact tokens between turns, parsing tool calls.

Three jobs, all pure functions (a tokenizer is passed in; nothing is read or written):

* Rendering. `render_messages` / `encode_prompt` go through the tokenizer's own chat template, so the first
  prompt is byte-for-byte what vLLM or transformers would build (tool JSON schemas inside `<tools></tools>` in
  the system turn).
* Continuing. A rollout grows one token sequence: prompt, generated tokens, tool response, generated tokens,
  ... `continuation_ids` / `tool_response_ids` give the ids that go between the end of the assistant's
  generated tokens and the next assistant generation prompt, i.e. what the Qwen3 template puts there:
  `<|im_end|>\\n<|im_start|>user\\n<tool_response>\\n...\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n`
  (the leading `<|im_end|>` only when the turn did not already end with it; consecutive tool messages share
  one user turn, as in the template). Where the incremental ids differ from re-rendering the whole
  conversation with the template and re-tokenising it, the difference is deliberate (the sampled tokens are
  what the policy saw and what its log-probs belong to):
    - the generated ids are kept as sampled; the template would re-tokenise the decoded text canonically;
    - the template rewrites past assistant turns: it drops an empty `<think>\\n\\n</think>\\n\\n` block from a
      non-final assistant turn, drops every think block of assistant turns before the latest real user
      message, and normalises whitespace around `</think>` and tool calls given as structured `tool_calls`;
    - a turn that ended without `<|im_end|>` (stopped on `</tool_call>`, cut at the length limit, or ended on
      `<|endoftext|>`) gets a `<|im_end|>` appended after its last sampled token;
    - with `escape_special_tokens=True` (default) control-token text inside tool results or user messages
      (e.g. a web page containing "<|im_end|>") is tokenised as plain text, where the template route would
      turn it into a control token and let a tool result end its own turn. Non-special added tokens such as
      `</tool_response>` are still matched, as in the template route.
  Tests check equality with the template route for every case that has none of these differences.
* Parsing. `parse_assistant_turn` splits a generated turn into thinking, content and tool calls, tolerating
  common slips (see its docstring); `validate_tool_calls` checks calls against the tools' JSON schemas. Error
  messages are written to be sent back to the model verbatim as a tool response.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

# --- special tokens ------------------------------------------------------------------------------------
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ENDOFTEXT = "<|endoftext|>"
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
TOOL_RESPONSE_OPEN = "<tool_response>"
TOOL_RESPONSE_CLOSE = "</tool_response>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

IM_START_ID = 151644
IM_END_ID = 151645  # eos of the chat model
ENDOFTEXT_ID = 151643  # pad; Qwen3's generation config also stops on it
TOOL_CALL_OPEN_ID = 151657
TOOL_CALL_CLOSE_ID = 151658
TOOL_RESPONSE_OPEN_ID = 151665
TOOL_RESPONSE_CLOSE_ID = 151666
THINK_OPEN_ID = 151667
THINK_CLOSE_ID = 151668

SPECIAL_TOKEN_IDS: dict[str, int] = {
    IM_START: IM_START_ID, IM_END: IM_END_ID, ENDOFTEXT: ENDOFTEXT_ID,
    TOOL_CALL_OPEN: TOOL_CALL_OPEN_ID, TOOL_CALL_CLOSE: TOOL_CALL_CLOSE_ID,
    TOOL_RESPONSE_OPEN: TOOL_RESPONSE_OPEN_ID, TOOL_RESPONSE_CLOSE: TOOL_RESPONSE_CLOSE_ID,
    THINK_OPEN: THINK_OPEN_ID, THINK_CLOSE: THINK_CLOSE_ID,
}

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
ERROR_KINDS = (MALFORMED_JSON, MISSING_NAME, BAD_ARGUMENTS, UNTERMINATED, UNKNOWN_TOOL, MISSING_ARGUMENT,
               WRONG_TYPE, INVALID_VALUE, UNEXPECTED_ARGUMENT)

CALL_FORMAT_HINT = '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'


def hf_tokenizer(tokenizer):
  """The transformers tokenizer behind `tokenizer`.

  Every function here takes either a transformers tokenizer or orchestra_jax.tokenizer.HFTokenizer (whose
  `.hf` is one): escaping control tokens needs transformers' `split_special_tokens`, which the small
  Tokenizer interface does not expose.
  """
  inner = getattr(tokenizer, "hf", None)
  return inner if inner is not None else tokenizer


def check_special_token_ids(tokenizer) -> None:
  """Raise if `tokenizer` is not a Qwen3-family tokenizer with the ids this module hard-codes."""
  tokenizer = hf_tokenizer(tokenizer)
  for text, want in SPECIAL_TOKEN_IDS.items():
    got = tokenizer.convert_tokens_to_ids(text)
    if got != want:
      raise ValueError(f"tokenizer maps {text!r} to {got!r}, expected {want} (not a Qwen3 tokenizer?)")


# --- rendering -----------------------------------------------------------------------------------------
def normalize_tool_schema(tool: Mapping[str, Any]) -> dict[str, Any]:
  """OpenAI form `{"type": "function", "function": {...}}`, which is what Qwen3 saw in training.

  A bare `{"name", "description", "parameters"}` schema is wrapped; an OpenAI-form one is returned as is.
  """
  if "function" in tool and isinstance(tool["function"], Mapping):
    return dict(tool)
  if "name" not in tool:
    raise ValueError(f"tool schema has no name: {tool!r}")
  return {"type": "function", "function": dict(tool)}


def render_messages(tokenizer, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None,
                    add_generation_prompt: bool = True, enable_thinking: bool = True) -> str:
  """The prompt text the tokenizer's own chat template builds (so it matches what serving stacks build)."""
  kwargs = {} if enable_thinking else {"enable_thinking": False}
  tool_list = [normalize_tool_schema(t) for t in tools] if tools else None
  hf = hf_tokenizer(tokenizer)
  return hf.apply_chat_template([dict(m) for m in messages], tools=tool_list,
                                add_generation_prompt=add_generation_prompt, tokenize=False, **kwargs)


def encode_prompt(tokenizer, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None,
                  add_generation_prompt: bool = True, enable_thinking: bool = True) -> list[int]:
  """Token ids of `render_messages` (control-token text in the messages is parsed, as serving stacks do)."""
  text = render_messages(tokenizer, messages, tools, add_generation_prompt, enable_thinking)
  return [int(i) for i in hf_tokenizer(tokenizer).encode(text, add_special_tokens=False)]


def _continuation_segments(messages: Sequence[Mapping[str, Any]], after_im_end: bool, add_generation_prompt: bool,
                           enable_thinking: bool) -> list[tuple[str, bool]]:
  """(text, is_payload) pieces; payload pieces (message contents) are always bounded by added tokens.

  Each payload piece starts right after an added token and ends right before one, so encoding the pieces
  one by one gives the same ids as encoding their concatenation (added tokens always split the text).
  """
  segs: list[tuple[str, bool]] = [("\n" if after_im_end else IM_END + "\n", False)]
  for i, m in enumerate(messages):
    role, content = m["role"], m.get("content")
    if not isinstance(content, str):
      raise ValueError(f"message {i} ({role}) needs string content, got {type(content).__name__}")
    if role == "tool":
      if i == 0 or messages[i - 1]["role"] != "tool":
        segs.append((IM_START + "user", False))
      segs.append(("\n" + TOOL_RESPONSE_OPEN, False))
      segs.append(("\n" + content + "\n", True))
      segs.append((TOOL_RESPONSE_CLOSE, False))
      if i == len(messages) - 1 or messages[i + 1]["role"] != "tool":
        segs.append((IM_END + "\n", False))
    elif role in ("user", "system"):
      segs.append((IM_START, False))
      segs.append((role + "\n" + content, True))
      segs.append((IM_END + "\n", False))
    else:
      raise ValueError(f"cannot append a {role!r} message between turns (assistant turns are generated)")
  if add_generation_prompt:
    segs.append((IM_START + "assistant\n", False))
    if not enable_thinking:
      segs.append((THINK_OPEN + "\n\n" + THINK_CLOSE + "\n\n", False))
  return segs


def render_continuation(messages: Sequence[Mapping[str, Any]], *, after_im_end: bool,
                        add_generation_prompt: bool = True, enable_thinking: bool = True) -> str:
  """Text the Qwen3 template puts after an assistant turn's generated text, through the next generation prompt.

  `messages` are tool / user / system messages (consecutive tool messages merge into one user turn, as in the
  template). `after_im_end`: the generated text already ends with `<|im_end|>`; if not, one is added first.
  """
  return "".join(t for t, _ in _continuation_segments(messages, after_im_end, add_generation_prompt, enable_thinking))


def render_tool_responses(contents: Sequence[str], *, after_im_end: bool, add_generation_prompt: bool = True,
                          enable_thinking: bool = True) -> str:
  """`render_continuation` for one tool message per result, in order."""
  return render_continuation([{"role": "tool", "content": c} for c in contents], after_im_end=after_im_end,
                             add_generation_prompt=add_generation_prompt, enable_thinking=enable_thinking)


def continuation_ids(tokenizer, messages: Sequence[Mapping[str, Any]], last_token_id: int | None, *,
                     add_generation_prompt: bool = True, enable_thinking: bool = True,
                     escape_special_tokens: bool = True) -> list[int]:
  """Ids to append after an assistant turn whose last sampled id is `last_token_id`, up to the next generation.

  A turn that ended with `<|im_end|>` gets `\\n` next; any other ending (`</tool_call>` stop string, length
  cut, `<|endoftext|>`, empty turn = None) gets `<|im_end|>\\n` first, which is how the template closes an
  assistant turn. With `escape_special_tokens`, control-token text inside message contents stays plain text.
  """
  tokenizer = hf_tokenizer(tokenizer)
  after_im_end = last_token_id == IM_END_ID
  ids: list[int] = []
  pending = ""
  for text, payload in _continuation_segments(messages, after_im_end, add_generation_prompt, enable_thinking):
    if payload and escape_special_tokens:
      if pending:
        ids.extend(tokenizer.encode(pending, add_special_tokens=False))
        pending = ""
      ids.extend(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))
    else:
      pending += text
  if pending:
    ids.extend(tokenizer.encode(pending, add_special_tokens=False))
  return [int(i) for i in ids]


def tool_response_ids(tokenizer, contents: Sequence[str], last_token_id: int | None, *,
                      add_generation_prompt: bool = True, enable_thinking: bool = True,
                      escape_special_tokens: bool = True) -> list[int]:
  """`continuation_ids` for one tool message per result: the ids of a tool-response user turn."""
  return continuation_ids(tokenizer, [{"role": "tool", "content": c} for c in contents], last_token_id,
                          add_generation_prompt=add_generation_prompt, enable_thinking=enable_thinking,
                          escape_special_tokens=escape_special_tokens)


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
  fixed = _strip_trailing_commas(s)
  if fixed != s:
    try:
      value = json.loads(fixed)
      repairs.append("trailing_comma")
      return value
    except (json.JSONDecodeError, RecursionError):
      pass
  raise _Fail(MALFORMED_JSON, f"{first_error.msg} at line {first_error.lineno} column {first_error.colno}")


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


def parse_assistant_turn(text: str, *, assume_closed: bool = False) -> ParsedTurn:
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
    except (json.JSONDecodeError, RecursionError):
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
      calls.append(ToolCall(name=name, arguments=args, raw=rest[start:end], index=index, repairs=tuple(repairs)))
    except _Fail as f:
      errors.append(ToolCallError(kind=f.kind, message=_error_message(f.kind, index, f.detail, f.name),
                                  raw=rest[start:end], index=index, name=f.name))
    pos = end
    index += 1
  content = "".join(content_parts).strip()
  return ParsedTurn(thinking=thinking, content=content, tool_calls=calls, errors=errors,
                    thinking_unterminated=unterminated_think)


# --- validation against tool schemas --------------------------------------------------------------------
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
                        tool_schemas: Sequence[Mapping[str, Any]] | Mapping[str, Any]) -> list[ToolCallError]:
  """Errors for calls to unknown tools, missing required arguments, wrong basic types and values outside an
  `enum` (plus unexpected arguments when a schema sets additionalProperties: false). Parse errors already in
  `parsed.errors` are not repeated. `tool_schemas`: the list given to `render_messages`, or name -> params."""
  calls = parsed.tool_calls if isinstance(parsed, ParsedTurn) else list(parsed)
  params = tool_parameter_schemas(tool_schemas)
  errors: list[ToolCallError] = []
  for call in calls:
    who = f'Tool call #{call.index + 1} ({call.name})'
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
