"""OpenAI chat/completions bodies <-> the project's chat format: request validation, sampling fields, stop
tokens, and the hermes (Qwen3) assistant turn parsed into an OpenAI message with `tool_calls`.

Pure functions of a request body (a parsed JSON object): each raises `BadRequest`, whose message the client gets
in an OpenAI error body, for a field it cannot honour. No HTTP and no model here.
"""

from __future__ import annotations

import json
import math
import secrets
import uuid
from typing import Any, Sequence

from orchestra_jax.rollout import chat_format
from orchestra_jax.rollout.sampling import MAX_STOP_IDS, SamplingParams
from orchestra_jax.tokenizer import TokenizerError

_CHAT_STOP_TOKENS = ("<|im_end|>", "<|endoftext|>")
_TOOL_CALL_END = "</tool_call>"


class BadRequest(Exception):
  """A request the server rejects; becomes an OpenAI error body `{"error": {"message", "type", "code"}}`."""

  def __init__(self, message: str, status: int = 400, kind: str = "invalid_request_error"):
    super().__init__(message)
    self.message, self.status, self.kind = message, status, kind


def chat_stop_ids(tokenizer, config) -> tuple[int, ...]:
  """The ids that end a chat turn: the chat end tokens and every eos, but not `</tool_call>` (a turn may hold
  several calls). At most `MAX_STOP_IDS`, the sampler's limit."""
  ids: list[int | None] = [tokenizer.eos_id, config.eos_token_id]
  for tok in _CHAT_STOP_TOKENS:
    try:
      ids.append(tokenizer.token_id(tok))
    except TokenizerError:
      pass
  try:
    tool_end = tokenizer.token_id(_TOOL_CALL_END)
  except TokenizerError:
    tool_end = None
  ids.extend(t for t in tokenizer.stop_ids if t != tool_end)
  return tuple(dict.fromkeys(int(i) for i in ids if i is not None and 0 <= i < config.vocab_size))[:MAX_STOP_IDS]


# --- turning text into an OpenAI assistant message -------------------------------------------------------

def assistant_message(text: str, finish_reason: str) -> tuple[dict[str, Any], str]:
  """(OpenAI assistant message, OpenAI finish_reason) for a generated turn's decoded text (hermes format).

  `finish_reason` is the sampler's ("stop" / "length" / "tool_call"). The think block goes to
  `reasoning_content`, parsed `<tool_call>` blocks to `tool_calls`; blocks that fail to parse stay in
  `content` as text so nothing the model wrote is lost. Returns "tool_calls" when there are calls and the turn
  was not cut by the length limit.
  """
  parsed = chat_format.parse_assistant_turn(text, assume_closed=finish_reason == "tool_call")
  content = parsed.content
  for err in parsed.errors:  # keep unparseable blocks visible
    content = f"{content}\n{err.raw.strip()}" if content else err.raw.strip()
  message: dict[str, Any] = {"role": "assistant", "content": content}
  if parsed.thinking is not None:
    message["reasoning_content"] = parsed.thinking
  if parsed.tool_calls:
    message["tool_calls"] = [
        {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
         "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
        for c in parsed.tool_calls]
    if not content:
      message["content"] = None  # as OpenAI sends it for a pure tool-call turn
  if finish_reason == "length":
    reason = "length"
  elif parsed.tool_calls:
    reason = "tool_calls"
  else:
    reason = "stop"
  return message, reason


# --- request parsing -------------------------------------------------------------------------------------

def _number(body: dict, key: str, default, kind=float, lo=None, hi=None, lo_open=False):
  value = body.get(key)
  if value is None:
    return default
  if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
    raise BadRequest(f"'{key}' must be {'an integer' if kind is int else 'a number'}, got {json.dumps(value)}")
  value = kind(value)
  if not math.isfinite(value) or (lo is not None and (value <= lo if lo_open else value < lo)) or (
      hi is not None and value > hi):
    bounds = f"{'>' if lo_open else '>='} {lo}" if hi is None else f"in {'(' if lo_open else '['}{lo}, {hi}]"
    raise BadRequest(f"'{key}' must be {bounds}, got {json.dumps(body.get(key))}")
  return value


def _message_text(content: Any, where: str) -> Any:
  """OpenAI content (string, None, or a list of text parts) -> what the chat template expects."""
  if content is None or isinstance(content, str):
    return content
  if isinstance(content, list):
    parts = []
    for p in content:
      if isinstance(p, str):
        parts.append(p)
      elif isinstance(p, dict) and p.get("type", "text") == "text" and isinstance(p.get("text"), str):
        parts.append(p["text"])
      else:
        kind = p.get("type") if isinstance(p, dict) else type(p).__name__
        raise BadRequest(f"{where}: content part of type {kind!r} is not supported (text only)")
    return "".join(parts)
  raise BadRequest(f"{where}: content must be a string or a list of text parts")


def parse_messages(body: dict) -> list[dict[str, Any]]:
  """The body's `messages` as the chat template takes them: text parts joined, a null assistant content made
  "", tool-call `arguments` given as a JSON string parsed back into an object."""
  messages = body.get("messages")
  if messages is None:
    raise BadRequest("'messages' is required: a list of {role, content} objects")
  if not isinstance(messages, list) or not messages:
    raise BadRequest("'messages' must be a non-empty list of {role, content} objects")
  out = []
  for i, m in enumerate(messages):
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
      raise BadRequest(f"messages[{i}] must be an object with a string 'role'")
    m = dict(m)
    m["content"] = _message_text(m.get("content"), f"messages[{i}]")
    if m["content"] is None:
      if m["role"] in ("system", "user", "tool"):
        raise BadRequest(f"messages[{i}] ({m['role']}) needs 'content'")
      m["content"] = ""  # OpenAI sends null for a pure tool-call turn; the Qwen3 template needs a string
    calls = m.get("tool_calls")
    if calls is not None:
      if not isinstance(calls, list):
        raise BadRequest(f"messages[{i}].tool_calls must be a list")
      fixed = []
      for call in calls:  # the Qwen3 template reads tool_call.function.{name, arguments}; a string is kept
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
          raise BadRequest(f"messages[{i}].tool_calls entries must be {{type, function: {{name, arguments}}}}")
        fn = dict(call["function"])
        if isinstance(fn.get("arguments"), str):
          try:
            fn["arguments"] = json.loads(fn["arguments"]) if fn["arguments"].strip() else {}
          except json.JSONDecodeError:
            pass  # the template writes a string through as is
        fixed.append({**call, "function": fn})
      m["tool_calls"] = fixed
    out.append(m)
  return out


def parse_tools(body: dict) -> list[dict] | None:
  """The body's `tools` as normalised function schemas for the chat template; None when there are none."""
  tools = body.get("tools")
  if not tools:
    return None
  if not isinstance(tools, list):
    raise BadRequest("'tools' must be a list of {type: 'function', function: {name, description, parameters}}")
  try:
    return [chat_format.normalize_tool_schema(t) for t in tools]
  except (ValueError, TypeError, AttributeError) as e:
    raise BadRequest(f"'tools': {e}") from None


def check_unsupported(body: dict) -> None:
  """A clear 400 for each OpenAI feature this server does not have (rather than silently ignoring it)."""
  if body.get("stream"):
    raise BadRequest("streaming is not supported by this server; send 'stream': false")
  n = body.get("n")
  if n is not None and n != 1:
    raise BadRequest(f"only n=1 is supported, got n={json.dumps(n)}")
  best_of = body.get("best_of")
  if best_of is not None and best_of != 1:
    raise BadRequest(f"only best_of=1 is supported, got {json.dumps(best_of)}")
  if body.get("echo"):
    raise BadRequest("'echo' is not supported")
  top = body.get("top_logprobs")
  if top:
    raise BadRequest("'top_logprobs' is not supported (logprobs of the sampled tokens only)")
  if isinstance(body.get("logprobs"), int) and not isinstance(body.get("logprobs"), bool) and body["logprobs"] > 0:
    raise BadRequest("top logprobs are not supported (logprobs of the sampled tokens only)")
  choice = body.get("tool_choice")
  if choice not in (None, "auto", "none"):
    raise BadRequest(f"tool_choice {json.dumps(choice)} is not supported (only 'auto' or 'none')")
  fmt = body.get("response_format")
  if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
    raise BadRequest("'response_format' other than {'type': 'text'} is not supported")


def stop_strings(body: dict) -> list[str]:
  """The body's `stop` strings (applied to the decoded text once the turn has finished)."""
  stop = body.get("stop")
  if stop is None:
    return []
  if isinstance(stop, str):
    stop = [stop]
  if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
    raise BadRequest("'stop' must be a string or a list of strings")
  return [s for s in stop if s]


def sampling_params(body: dict, prompt_len: int, *, max_len: int, stop_ids: Sequence[int],
                    vocab_size: int) -> tuple[SamplingParams, int]:
  """(SamplingParams, seed) for a request whose prompt has `prompt_len` tokens, in a cache row of `max_len`.

  `max_tokens` defaults to and is clamped to the room left in the row; `stop_token_ids` add to `stop_ids` (the
  chat end tokens); no `seed` draws a random one.
  """
  room = max_len - prompt_len
  if room < 1:
    raise BadRequest(f"the prompt has {prompt_len} tokens, but this server's --max-len {max_len} leaves "
                     f"room for prompts of at most {max_len - 1} tokens", kind="context_length_exceeded")
  max_tokens = body.get("max_completion_tokens")
  key = "max_completion_tokens"
  if max_tokens is None:
    max_tokens, key = body.get("max_tokens"), "max_tokens"
  max_tokens = _number({key: max_tokens}, key, room, int, lo=1)
  temperature = _number(body, "temperature", 1.0, float, lo=0)
  top_p = _number(body, "top_p", 1.0, float, lo=0, hi=1, lo_open=True)
  top_k = _number(body, "top_k", 0, int, lo=-1)
  all_stop_ids = list(stop_ids)
  extra = body.get("stop_token_ids")
  if extra is not None:
    if not isinstance(extra, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in extra):
      raise BadRequest("'stop_token_ids' must be a list of integers")
    bad = [t for t in extra if not 0 <= t < vocab_size]
    if bad:
      raise BadRequest(f"'stop_token_ids' holds ids outside [0, {vocab_size}): {bad}")
    all_stop_ids = list(dict.fromkeys(all_stop_ids + extra))
    if len(all_stop_ids) > MAX_STOP_IDS:
      raise BadRequest(f"at most {MAX_STOP_IDS - len(stop_ids)} 'stop_token_ids' besides the "
                       f"{len(stop_ids)} end tokens")
  seed = body.get("seed")
  if seed is None:
    seed = secrets.randbits(32)
  elif isinstance(seed, bool) or not isinstance(seed, int):
    raise BadRequest(f"'seed' must be an integer, got {json.dumps(seed)}")
  try:
    sampling = SamplingParams(temperature=temperature, top_p=top_p, top_k=max(0, top_k),
                              max_new_tokens=min(max_tokens, room), stop_ids=tuple(all_stop_ids))
  except ValueError as e:
    raise BadRequest(str(e)) from None
  return sampling, int(seed)
