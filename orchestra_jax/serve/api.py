"""The OpenAI API of one model, without the transport: a request body in, a response body out.

`ModelApi` renders the prompt with the tokenizer's chat template, submits it to an `Engine`, waits for the
turn, applies `stop` strings and builds the `chat.completion` / `text_completion` body with usage counted in real
token ids. `http.ModelServer` puts it on a socket.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any, Sequence

from orchestra_jax.serve.engine import Engine, Generation
from orchestra_jax.serve.schema import (BadRequest, assistant_message, check_unsupported, parse_messages,
                                        parse_tools, sampling_params, stop_strings)
from orchestra_jax.tokenizer import TokenizerError


class ModelApi:
  """`/v1/models`, `/v1/chat/completions` and `/v1/completions` of one model served by `engine`.

  `config` the model's config (its vocab size bounds the token ids a request may send); `tokenizer` an
  `orchestra_jax.tokenizer.Tokenizer`; `stop_ids` the ids that end every turn (`schema.chat_stop_ids`). The
  methods are safe to call from many threads at once.
  """

  def __init__(self, config, tokenizer, engine: Engine, *, model_name: str, stop_ids: Sequence[int],
               model_path: str | None = None):
    self.config = config
    self.tokenizer = tokenizer
    self.engine = engine
    self.model_name = model_name
    self.model_path = model_path
    self.stop_ids = tuple(stop_ids)
    self.created = int(time.time())
    self._tok_lock = threading.Lock()  # HF fast tokenizers are not safe to call from many threads at once

  @property
  def max_len(self) -> int:
    return self.engine.max_len

  def models(self) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": self.created,
                                        "owned_by": "orchestra-jax", "root": self.model_path or self.model_name,
                                        "max_model_len": self.max_len}]}

  def _check_model(self, body: dict) -> None:
    model = body.get("model")
    if model is not None and model != self.model_name:
      raise BadRequest(f"The model `{model}` does not exist (this server serves `{self.model_name}`).", 404,
                       "NotFoundError")

  def _sampling(self, body: dict, prompt_len: int):
    return sampling_params(body, prompt_len, max_len=self.max_len, stop_ids=self.stop_ids,
                           vocab_size=self.config.vocab_size)

  def _generate(self, prompt: list[int], body: dict) -> Generation:
    sampling, seed = self._sampling(body, len(prompt))
    bad = [t for t in prompt if not 0 <= t < self.config.vocab_size]
    if bad:
      raise BadRequest(f"prompt token ids outside [0, {self.config.vocab_size}): {bad[:5]}")
    future = self.engine.submit(prompt, sampling, seed)
    try:
      return future.result()
    except ValueError as e:  # the sampler rejected the prompt
      raise BadRequest(str(e)) from None

  def _decode(self, tokens: Sequence[int]) -> str:
    with self._tok_lock:
      return self.tokenizer.decode(tokens, skip_special_tokens=True)

  def _apply_stop(self, gen: Generation, stops: list[str]) -> tuple[str, list[int], list[float], str]:
    """(text, tokens, logprobs, finish_reason), cut at the earliest stop string if any occurs."""
    text = self._decode(gen.tokens)
    hits = [text.find(s) for s in stops if s in text]
    if not hits:
      return text, gen.tokens, gen.logprobs, gen.finish_reason
    cut = min(hits)
    # The shortest token prefix whose text reaches the stop string (decoded text grows with the prefix).
    lo, hi = 1, len(gen.tokens)
    while lo < hi:
      mid = (lo + hi) // 2
      if any(s in self._decode(gen.tokens[:mid]) for s in stops):
        hi = mid
      else:
        lo = mid + 1
    return text[:cut], gen.tokens[:lo], gen.logprobs[:lo], "stop"

  def _logprobs(self, tokens: Sequence[int], logprobs: Sequence[float]) -> dict[str, Any]:
    entries = []
    with self._tok_lock:
      for t, lp in zip(tokens, logprobs):
        s = self.tokenizer.decode([t])
        entries.append({"token": s, "logprob": float(lp), "bytes": list(s.encode("utf-8")), "top_logprobs": []})
    return {"content": entries}

  def chat_completion(self, body: dict) -> dict[str, Any]:
    check_unsupported(body)
    self._check_model(body)
    messages = parse_messages(body)
    tools = parse_tools(body)
    if body.get("tool_choice") == "none":
      tools = None
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
      raise BadRequest("'chat_template_kwargs' must be an object")
    enable_thinking = kwargs.get("enable_thinking")
    if enable_thinking is not None and not isinstance(enable_thinking, bool):
      raise BadRequest("chat_template_kwargs.enable_thinking must be true or false")
    stops = stop_strings(body)
    try:
      with self._tok_lock:
        prompt = self.tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
                                                    enable_thinking=enable_thinking)
    except TokenizerError as e:
      raise BadRequest(f"cannot render the messages with the chat template: {e}") from None
    gen = self._generate(prompt, body)
    text, tokens, logprobs, reason = self._apply_stop(gen, stops)
    message, finish = assistant_message(text, reason)
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish,
                              "logprobs": self._logprobs(tokens, logprobs) if body.get("logprobs") else None}
    out = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
           "model": self.model_name, "choices": [choice],
           "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(tokens),
                     "total_tokens": len(prompt) + len(tokens)}}
    if body.get("return_token_ids"):
      out["prompt_token_ids"] = list(prompt)
      choice["token_ids"] = list(tokens)
    return out

  def completion(self, body: dict) -> dict[str, Any]:
    check_unsupported(body)
    self._check_model(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
      prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
      if not prompt:
        raise BadRequest("'prompt' is empty")
      with self._tok_lock:
        ids = self.tokenizer.encode(prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
      ids = list(prompt)
    elif prompt is None:
      raise BadRequest("'prompt' is required: a string or a list of token ids")
    else:
      raise BadRequest("'prompt' must be a string or a non-empty list of token ids (one prompt per request)")
    if not ids:
      raise BadRequest("'prompt' encodes to no tokens")
    gen = self._generate(ids, body)
    text, tokens, logprobs, reason = self._apply_stop(gen, stop_strings(body))
    choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": "length" if reason == "length" else "stop",
                              "logprobs": None}
    if body.get("logprobs") is not None and body.get("logprobs") is not False:  # legacy API: 0 = sampled only
      lp = self._logprobs(tokens, logprobs)["content"]
      choice["logprobs"] = {"tokens": [e["token"] for e in lp], "token_logprobs": [e["logprob"] for e in lp],
                            "top_logprobs": None, "text_offset": None}
    out = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
           "model": self.model_name, "choices": [choice],
           "usage": {"prompt_tokens": len(ids), "completion_tokens": len(tokens),
                     "total_tokens": len(ids) + len(tokens)}}
    if body.get("return_token_ids"):
      out["prompt_token_ids"] = list(ids)
      choice["token_ids"] = list(tokens)
    return out
