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
* Safe text. Every text goes through `safe_text` right before it is tokenised: a lone UTF-16 surrogate (JSON
  `"\\ud800"` decodes to one, in a model's tool-call arguments or an expert's reply) cannot be encoded as UTF-8
  and makes the tokenizer raise, which would end every row of the batch; it becomes U+FFFD instead.
* Parsing. `parse_assistant_turn` splits a generated turn into thinking, content and tool calls, tolerating
  common slips (see its docstring); `validate_tool_calls` checks calls against the tools' JSON schemas. Error
  messages are written to be sent back to the model verbatim as a tool response. They live in
  `rollout.tool_calls` and are re-exported here, with the special tokens of `orchestra_jax.tokenizer`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# The special tokens and the tool-call names are re-exported: callers read the whole chat format from here.
from orchestra_jax.rollout.tool_calls import (BAD_ARGUMENTS, CALL_FORMAT_HINT, ERROR_KINDS,  # noqa: F401
                                              INVALID_VALUE, MALFORMED_JSON, MAX_ARGUMENT_CHARS, MAX_ARGUMENT_DEPTH,
                                              MISSING_ARGUMENT, MISSING_NAME, TOO_MANY_CALLS, UNEXPECTED_ARGUMENT,
                                              UNKNOWN_TOOL, UNTERMINATED, WRONG_TYPE,
                                              ParsedTurn, ToolCall, ToolCallError, json_type, normalize_tool_schema,
                                              parse_assistant_turn, tool_parameter_schemas, validate_tool_calls)
from orchestra_jax.tokenizer import (ENDOFTEXT, ENDOFTEXT_ID, IM_END, IM_END_ID, IM_START, IM_START_ID,  # noqa: F401
                                     SPECIAL_TOKEN_IDS, THINK_CLOSE, THINK_CLOSE_ID, THINK_OPEN, THINK_OPEN_ID,
                                     TOOL_CALL_CLOSE, TOOL_CALL_CLOSE_ID, TOOL_CALL_OPEN, TOOL_CALL_OPEN_ID,
                                     TOOL_RESPONSE_CLOSE, TOOL_RESPONSE_CLOSE_ID, TOOL_RESPONSE_OPEN,
                                     TOOL_RESPONSE_OPEN_ID)


def hf_tokenizer(tokenizer):
  """The transformers tokenizer behind `tokenizer`.

  Every function here takes either a transformers tokenizer or orchestra_jax.tokenizer.HFTokenizer (whose
  `.hf` is one): escaping control tokens needs transformers' `split_special_tokens`, which the small
  Tokenizer interface does not expose.
  """
  inner = getattr(tokenizer, "hf", None)
  return inner if inner is not None else tokenizer


def check_special_token_ids(tokenizer) -> None:
  """Raise if `tokenizer` is not a Qwen3-family tokenizer with the ids `orchestra_jax.tokenizer` hard-codes."""
  tokenizer = hf_tokenizer(tokenizer)
  for text, want in SPECIAL_TOKEN_IDS.items():
    got = tokenizer.convert_tokens_to_ids(text)
    if got != want:
      raise ValueError(f"tokenizer maps {text!r} to {got!r}, expected {want} (not a Qwen3 tokenizer?)")


def safe_text(text: str) -> str:
  """`text` with each lone surrogate replaced by U+FFFD; a str that is valid Unicode is returned as is.

  Through UTF-16 with surrogatepass, so a high + low pair that sits in the str as two code points is joined into
  its character rather than replaced."""
  try:
    text.encode("utf-8")
    return text
  except UnicodeEncodeError:
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def _encode(tokenizer, text: str, **kwargs) -> list[int]:
  """The one place chat text becomes token ids (made safe first: see `safe_text`)."""
  return [int(i) for i in tokenizer.encode(safe_text(text), add_special_tokens=False, **kwargs)]


# --- rendering -----------------------------------------------------------------------------------------
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
  return _encode(hf_tokenizer(tokenizer), text)


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
        ids.extend(_encode(tokenizer, pending))
        pending = ""
      ids.extend(_encode(tokenizer, text, split_special_tokens=True))
    else:
      pending += text
  if pending:
    ids.extend(_encode(tokenizer, pending))
  return ids


def tool_response_ids(tokenizer, contents: Sequence[str], last_token_id: int | None, *,
                      add_generation_prompt: bool = True, enable_thinking: bool = True,
                      escape_special_tokens: bool = True) -> list[int]:
  """`continuation_ids` for one tool message per result: the ids of a tool-response user turn."""
  return continuation_ids(tokenizer, [{"role": "tool", "content": c} for c in contents], last_token_id,
                          add_generation_prompt=add_generation_prompt, enable_thinking=enable_thinking,
                          escape_special_tokens=escape_special_tokens)

