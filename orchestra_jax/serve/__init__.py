"""`orchestra serve`: an OpenAI-compatible HTTP server for one checkpoint, on the project's continuous-batching sampler.

    orchestra serve --model runs/tiny --port 8000
    curl -s localhost:8000/v1/chat/completions -d '{"messages": [{"role": "user", "content": "hi"}]}'

Architecture. Python's stdlib `ThreadingHTTPServer` runs one handler thread per connection. A handler parses and
validates the request, renders the prompt with the tokenizer's chat template, and hands (prompt ids, sampling
params, seed, a Future) to the `Engine`, then waits on the Future. The engine is a single background thread that
owns the `Sampler`: it starts queued requests in free cache slots, calls `Sampler.step()` (prefills + one decode
chunk), resolves the futures of finished turns and releases their slots. Requests that arrive while others are
decoding join the batch at the next step (continuous batching). A request's greedy output does not depend on
which other requests share the batch (see `rollout/sampler.py` on per-row independence).

Endpoints:
  POST /v1/chat/completions  messages, tools, temperature, top_p, top_k, max_tokens / max_completion_tokens,
                             stop (strings), stop_token_ids, seed, n (1 only), logprobs, tool_choice
                             ("auto"/"none"), chat_template_kwargs ({"enable_thinking": false}),
                             return_token_ids (vLLM extension: `prompt_token_ids` and the choice's `token_ids`)
  POST /v1/completions       the same sampling fields, `prompt` a string (or a list of token ids)
  GET  /v1/models            the served model name
  GET  /health               200 while the engine thread is alive

Semantics (close to vLLM's OpenAI server):
* Generation always stops at the chat end tokens (`<|im_end|>`, `<|endoftext|>`, the tokenizer's and config's eos).
  It does not stop at `</tool_call>`, so a turn may hold several calls.
* The assistant message is parsed as hermes output (Qwen3): `<think>...</think>` goes to `reasoning_content`,
  each `<tool_call>{json}</tool_call>` to `tool_calls` (`arguments` as a JSON string), the rest is `content`.
  A block that does not parse stays in `content` as text. finish_reason is "tool_calls" when the turn has calls
  and ended on a stop token, "length" when it ran out of tokens, else "stop".
* `stop` strings are applied to the decoded text after the turn has finished (generation is not cut short;
  `usage.completion_tokens` counts the tokens up to the one that completed the stop string).
* `max_tokens` defaults to (and is clamped to) the room left in a cache row: max_len - prompt tokens.
* usage counts real tokenizer ids: the prompt ids and the generated ids (the final stop token included).
* No streaming, n = 1, no forced tool choice, no response_format: each is a clear 400, as are malformed bodies,
  missing messages and prompts that do not fit `--max-len`. Unknown fields are ignored. A request naming a model
  other than the served one gets 404 (as in vLLM), so a misrouted client fails loudly.

Modules: `engine` (the batching thread over a `Sampler`), `schema` (request validation and translation to and
from the chat format, hermes tool calls to OpenAI `tool_calls`), `api` (`ModelApi`: request body -> response
body), `http` (`ModelServer`, the handler, `open_server`), `cli` (`add_serve_parser` / `run_serve`).

Names are imported lazily, so building the `orchestra` parser (`orchestra --help`) does not load JAX.
"""

from orchestra_jax.lazy import lazy_exports

_EXPORTS = {
  "DEFAULT_MAX_BATCH": "engine", "DEFAULT_MAX_LEN": "engine", "Engine": "engine", "EngineClosed": "engine",
  "Generation": "engine",
  "BadRequest": "schema", "assistant_message": "schema", "chat_stop_ids": "schema", "parse_messages": "schema",
  "parse_tools": "schema", "sampling_params": "schema",
  "ModelApi": "api",
  "MAX_BODY_BYTES": "http", "ModelServer": "http", "ServeError": "http", "open_server": "http",
  "add_serve_parser": "cli", "build_server": "cli", "run_serve": "cli",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
