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
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import dataclasses
import http.server
import json
import logging
import math
import secrets
import signal
import socket
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Sequence

from orchestra_jax.errors import UserError

log = logging.getLogger(__name__)

DEFAULT_MAX_BATCH = 8
DEFAULT_MAX_LEN = 4096
MAX_BODY_BYTES = 32 << 20
_CHAT_STOP_TOKENS = ("<|im_end|>", "<|endoftext|>")
_TOOL_CALL_END = "</tool_call>"


class ServeError(UserError, ValueError):
  """A server option that cannot work (port in use, max-len too small); the message says which."""


class EngineClosed(RuntimeError):
  """The server is shutting down (or its engine stopped): the request was not served. HTTP 503."""


class BadRequest(Exception):
  """A request the server rejects; becomes an OpenAI error body `{"error": {"message", "type", "code"}}`."""

  def __init__(self, message: str, status: int = 400, kind: str = "invalid_request_error"):
    super().__init__(message)
    self.message, self.status, self.kind = message, status, kind


# --- the engine ----------------------------------------------------------------------------------------

@dataclasses.dataclass
class Generation:
  """What the engine returns for one request."""

  tokens: list[int]  # sampled ids, the final stop token included
  logprobs: list[float]
  finish_reason: str  # "stop" | "length" (the sampler's names; "tool_call" cannot happen, see Engine)


@dataclasses.dataclass
class _Request:
  prompt: list[int]
  sampling: Any  # SamplingParams
  seed: int
  future: concurrent.futures.Future


class Engine:
  """One background thread that owns a `Sampler` and runs its continuous-batching loop for many callers.

  `submit` may be called from any thread; it returns a Future that resolves to a `Generation` (or raises what
  went wrong for that request). A request the sampler rejects fails alone; an exception inside `step` fails
  the requests that were in the batch, after which a fresh sampler takes over, so the loop never dies.
  """

  def __init__(self, make_sampler: Callable[[], Any]):
    self._make_sampler = make_sampler
    self.sampler = make_sampler()
    self._cond = threading.Condition()
    self._queue: collections.deque[_Request] = collections.deque()
    self._running: dict[int, _Request] = {}  # slot -> request; engine thread only
    self._stopping = False
    self._thread: threading.Thread | None = None
    self.completed = 0  # requests finished (any outcome)
    self.generated_tokens = 0
    self.peak_batch = 0  # most requests decoding together so far

  @property
  def max_len(self) -> int:
    return self.sampler.max_len

  @property
  def batch_size(self) -> int:
    return self.sampler.batch_size

  def start(self) -> "Engine":
    if self._thread is None:
      self._thread = threading.Thread(target=self._loop, name="orchestra-serve-engine", daemon=True)
      self._thread.start()
    return self

  def alive(self) -> bool:
    return self._thread is not None and self._thread.is_alive()

  def queued(self) -> int:
    with self._cond:
      return len(self._queue)

  def submit(self, prompt: Sequence[int], sampling, seed: int = 0) -> concurrent.futures.Future:
    future: concurrent.futures.Future = concurrent.futures.Future()
    req = _Request([int(t) for t in prompt], sampling, int(seed), future)
    with self._cond:
      if self._stopping:
        future.set_exception(EngineClosed("the server is shutting down"))
        return future
      self._queue.append(req)
      self._cond.notify()
    return future

  def close(self, timeout: float = 30.0) -> None:
    """Stops the loop after the current step; queued and running requests fail with EngineClosed."""
    with self._cond:
      self._stopping = True
      self._cond.notify_all()
    if self._thread is not None:
      self._thread.join(timeout)
    with self._cond:
      leftover = list(self._queue) + list(self._running.values())
      self._queue.clear()
      self._running.clear()
    for req in leftover:
      _fail(req, EngineClosed("the server is shutting down"))

  def _loop(self) -> None:
    while True:
      with self._cond:
        while not self._stopping and not self._queue and not self.sampler.has_work():
          self._cond.wait()
        if self._stopping:
          return
        admit = []
        free = self.sampler.free_slots()
        while free and self._queue:
          admit.append((free.pop(0), self._queue.popleft()))
      for slot, req in admit:
        if not req.future.set_running_or_notify_cancel():
          continue  # cancelled while queued
        try:
          self.sampler.start(slot, req.prompt, req.sampling, req.seed)
        except Exception as e:  # a prompt the sampler rejects fails alone; the slot stays free
          self._finish(req, exc=e)
          continue
        self._running[slot] = req
      self.peak_batch = max(self.peak_batch, len(self._running))
      if not self.sampler.has_work():
        continue
      try:
        done = self.sampler.step()
      except Exception as e:  # a device failure: fail this batch, start over with a fresh cache
        log.exception("sampler step failed; failing %d requests and resetting the sampler", len(self._running))
        failed, self._running = list(self._running.values()), {}
        for req in failed:
          self._finish(req, exc=RuntimeError(f"generation failed: {type(e).__name__}: {e}"))
        try:
          self.sampler = self._make_sampler()
        except Exception:
          log.exception("could not rebuild the sampler; the engine stops")
          with self._cond:
            self._stopping = True
            queued = list(self._queue)
            self._queue.clear()
          for req in queued:
            _fail(req, EngineClosed("the engine stopped: the sampler could not be rebuilt after a failure"))
          return
        continue
      for turn in done:
        req = self._running.pop(turn.slot)
        self.sampler.release(turn.slot)
        self.generated_tokens += len(turn.tokens)
        self._finish(req, Generation(turn.tokens, turn.logprobs, turn.finish_reason))

  def _finish(self, req: _Request, result: Generation | None = None, exc: BaseException | None = None) -> None:
    self.completed += 1
    if exc is not None:
      _fail(req, exc)
    elif not req.future.done():
      req.future.set_result(result)


def _fail(req: _Request, exc: BaseException) -> None:
  if req.future.done():
    return
  if not req.future.running():
    req.future.set_running_or_notify_cancel()
  if not req.future.done():
    req.future.set_exception(exc)


# --- turning text into an OpenAI assistant message -------------------------------------------------------

def assistant_message(text: str, finish_reason: str) -> tuple[dict[str, Any], str]:
  """(OpenAI assistant message, OpenAI finish_reason) for a generated turn's decoded text (hermes format).

  `finish_reason` is the sampler's ("stop" / "length" / "tool_call"). The think block goes to
  `reasoning_content`, parsed `<tool_call>` blocks to `tool_calls`; blocks that fail to parse stay in
  `content` as text so nothing the model wrote is lost. Returns "tool_calls" when there are calls and the turn
  was not cut by the length limit.
  """
  from orchestra_jax.rollout import chat_format

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


def _messages(body: dict) -> list[dict[str, Any]]:
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


def _tools(body: dict) -> list[dict] | None:
  from orchestra_jax.rollout import chat_format

  tools = body.get("tools")
  if not tools:
    return None
  if not isinstance(tools, list):
    raise BadRequest("'tools' must be a list of {type: 'function', function: {name, description, parameters}}")
  try:
    return [chat_format.normalize_tool_schema(t) for t in tools]
  except (ValueError, TypeError, AttributeError) as e:
    raise BadRequest(f"'tools': {e}") from None


def _check_unsupported(body: dict) -> None:
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


def _stop_strings(body: dict) -> list[str]:
  stop = body.get("stop")
  if stop is None:
    return []
  if isinstance(stop, str):
    stop = [stop]
  if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
    raise BadRequest("'stop' must be a string or a list of strings")
  return [s for s in stop if s]


# --- the server ------------------------------------------------------------------------------------------

class _HTTPServer(http.server.ThreadingHTTPServer):
  daemon_threads = True
  allow_reuse_address = True
  request_queue_size = 512
  owner: "ModelServer"


class _Handler(http.server.BaseHTTPRequestHandler):
  protocol_version = "HTTP/1.1"
  disable_nagle_algorithm = True
  server: _HTTPServer

  def setup(self):
    super().setup()
    self.server.owner._track(self.connection, True)

  def finish(self):
    try:
      super().finish()
    finally:
      self.server.owner._track(self.connection, False)

  def log_message(self, format, *args):  # noqa: A002 - signature fixed by the base class
    if self.server.owner.log_requests:
      sys.stderr.write(f"orchestra serve: {self.address_string()} {format % args}\n")

  def _send_json(self, status: int, obj: Any) -> None:
    data = json.dumps(obj, ensure_ascii=False).encode("utf-8")
    try:
      self.send_response(status)
      self.send_header("Content-Type", "application/json")
      self.send_header("Content-Length", str(len(data)))
      self.end_headers()
      self.wfile.write(data)
    except (BrokenPipeError, ConnectionResetError):  # the client gave up waiting; nothing left to tell it
      self.close_connection = True

  def _error(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
    self._send_json(status, {"error": {"message": message, "type": kind, "code": status}})

  def _route(self) -> str:
    return self.path.split("?", 1)[0].rstrip("/") or "/"

  def do_GET(self):
    owner, path = self.server.owner, self._route()
    if path in ("/v1/models", "/models"):
      self._send_json(200, owner.models())
    elif path == "/health":
      if owner.engine.alive():
        self._send_json(200, {"status": "ok", "model": owner.model_name, "queued": owner.engine.queued(),
                              "completed": owner.engine.completed})
      else:
        self._error(503, "the engine thread is not running", "server_error")
    elif path in ("/v1/chat/completions", "/v1/completions"):
      self._error(405, f"use POST for {path}")
    else:
      self._error(404, f"no route GET {self.path}", "not_found_error")

  def do_POST(self):
    owner, path = self.server.owner, self._route()
    try:
      length = int(self.headers.get("Content-Length") or 0)
    except ValueError:
      self.close_connection = True
      return self._error(400, "invalid Content-Length header")
    if length > MAX_BODY_BYTES:
      self.close_connection = True
      return self._error(413, f"request body of {length} bytes is over the {MAX_BODY_BYTES} byte limit")
    raw = self.rfile.read(length) if length > 0 else b""
    if path not in ("/v1/chat/completions", "/v1/completions", "/chat/completions", "/completions"):
      return self._error(404, f"no route POST {self.path}", "not_found_error")
    try:
      try:
        body = json.loads(raw)
      except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(f"request body is not valid JSON: {e}") from None
      if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
      if path.endswith("chat/completions"):
        result = owner.chat_completion(body)
      else:
        result = owner.completion(body)
    except BadRequest as e:
      return self._error(e.status, e.message, e.kind)
    except EngineClosed as e:
      return self._error(503, str(e), "server_error")
    except Exception as e:  # a bug or a failed generation: answer, never kill the handler silently
      log.exception("request to %s failed", path)
      return self._error(500, f"internal error: {type(e).__name__}: {e}", "server_error")
    self._send_json(200, result)


class ModelServer:
  """An OpenAI-compatible server for one model; `with ModelServer(...) as srv:` serves on a background thread.

  `config, params` as from `checkpoint.load_model`; `tokenizer` an `orchestra_jax.tokenizer.Tokenizer`.
  `port=0` picks a free port (see `base_url`).
  """

  def __init__(self, config, params, tokenizer, *, model_name: str, max_len: int = DEFAULT_MAX_LEN,
               max_batch: int = DEFAULT_MAX_BATCH, host: str = "127.0.0.1", port: int = 0, chunk_steps: int = 8,
               log_requests: bool = False, model_path: str | None = None):
    from orchestra_jax.rollout.sampler import MAX_STOP_IDS, Sampler

    if max_len < 2:
      raise ServeError(f"--max-len must be at least 2, got {max_len}")
    if max_batch < 1:
      raise ServeError(f"--max-batch must be at least 1, got {max_batch}")
    self.config = config
    self.tokenizer = tokenizer
    self.model_name = model_name
    self.model_path = model_path
    self.log_requests = log_requests
    self.created = int(time.time())
    self._tok_lock = threading.Lock()  # HF fast tokenizers are not safe to call from many threads at once
    self.stop_ids = self._chat_stop_ids(tokenizer, config)
    if len(self.stop_ids) > MAX_STOP_IDS:
      self.stop_ids = self.stop_ids[:MAX_STOP_IDS]

    def make_sampler():
      return Sampler(config, params, max_len=max_len, batch_size=max_batch, chunk_steps=chunk_steps,
                     stop_ids=self.stop_ids, tool_call_ids=())

    self.engine = Engine(make_sampler)
    try:
      self._httpd = _HTTPServer((host, port), _Handler)
    except OSError as e:
      raise ServeError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    self._httpd.owner = self
    self._thread: threading.Thread | None = None
    self._connections: set[socket.socket] = set()
    self._conn_lock = threading.Lock()

  @staticmethod
  def _chat_stop_ids(tokenizer, config) -> tuple[int, ...]:
    from orchestra_jax.tokenizer import TokenizerError

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
    return tuple(dict.fromkeys(int(i) for i in ids if i is not None and 0 <= i < config.vocab_size))

  # --- lifecycle -------------------------------------------------------------------------------------
  @property
  def port(self) -> int:
    return self._httpd.server_address[1]

  @property
  def host(self) -> str:
    return self._httpd.server_address[0]

  @property
  def base_url(self) -> str:
    host = self.host
    return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

  @property
  def max_len(self) -> int:
    return self.engine.max_len

  def warmup(self) -> float:
    """Compiles the greedy prefill and decode by generating two tokens; returns the seconds it took."""
    from orchestra_jax.rollout.sampler import SamplingParams

    start = time.perf_counter()
    self.engine.start()
    first = self.stop_ids[0] if self.stop_ids else 0
    self.engine.submit([first], SamplingParams(temperature=0.0, max_new_tokens=2), 0).result()
    return time.perf_counter() - start

  def start(self) -> "ModelServer":
    self.engine.start()
    if self._thread is None:
      self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                      name=f"orchestra-serve-{self.port}", daemon=True)
      self._thread.start()
    return self

  def serve_forever(self) -> None:
    """Serves on the calling thread until interrupted (the CLI)."""
    self.engine.start()
    self._httpd.serve_forever(poll_interval=0.2)

  def close(self) -> None:
    """Stops listening, fails requests still queued or decoding, and drops open keep-alive connections."""
    if self._thread is not None:
      self._httpd.shutdown()
      self._thread.join(timeout=5)
      self._thread = None
    self._httpd.server_close()
    self.engine.close()
    with self._conn_lock:
      conns = list(self._connections)
    for conn in conns:
      try:
        conn.shutdown(socket.SHUT_RDWR)
      except OSError:
        pass

  def _track(self, conn: socket.socket, add: bool) -> None:
    with self._conn_lock:
      (self._connections.add if add else self._connections.discard)(conn)

  def __enter__(self) -> "ModelServer":
    return self.start()

  def __exit__(self, *exc) -> None:
    self.close()

  # --- endpoints -------------------------------------------------------------------------------------
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
    from orchestra_jax.rollout.sampler import MAX_STOP_IDS, SamplingParams

    room = self.max_len - prompt_len
    if room < 1:
      raise BadRequest(f"the prompt has {prompt_len} tokens, but this server's --max-len {self.max_len} leaves "
                       f"room for prompts of at most {self.max_len - 1} tokens", kind="context_length_exceeded")
    max_tokens = body.get("max_completion_tokens")
    key = "max_completion_tokens"
    if max_tokens is None:
      max_tokens, key = body.get("max_tokens"), "max_tokens"
    max_tokens = _number({key: max_tokens}, key, room, int, lo=1)
    temperature = _number(body, "temperature", 1.0, float, lo=0)
    top_p = _number(body, "top_p", 1.0, float, lo=0, hi=1, lo_open=True)
    top_k = _number(body, "top_k", 0, int, lo=-1)
    stop_ids = list(self.stop_ids)
    extra = body.get("stop_token_ids")
    if extra is not None:
      if not isinstance(extra, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in extra):
        raise BadRequest("'stop_token_ids' must be a list of integers")
      bad = [t for t in extra if not 0 <= t < self.config.vocab_size]
      if bad:
        raise BadRequest(f"'stop_token_ids' holds ids outside [0, {self.config.vocab_size}): {bad}")
      stop_ids = list(dict.fromkeys(stop_ids + extra))
      if len(stop_ids) > MAX_STOP_IDS:
        raise BadRequest(f"at most {MAX_STOP_IDS - len(self.stop_ids)} 'stop_token_ids' besides the "
                         f"{len(self.stop_ids)} end tokens")
    seed = body.get("seed")
    if seed is None:
      seed = secrets.randbits(32)
    elif isinstance(seed, bool) or not isinstance(seed, int):
      raise BadRequest(f"'seed' must be an integer, got {json.dumps(seed)}")
    try:
      sampling = SamplingParams(temperature=temperature, top_p=top_p, top_k=max(0, top_k),
                                max_new_tokens=min(max_tokens, room), stop_ids=tuple(stop_ids))
    except ValueError as e:
      raise BadRequest(str(e)) from None
    return sampling, int(seed)

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
    from orchestra_jax.tokenizer import TokenizerError

    _check_unsupported(body)
    self._check_model(body)
    messages = _messages(body)
    tools = _tools(body)
    if body.get("tool_choice") == "none":
      tools = None
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
      raise BadRequest("'chat_template_kwargs' must be an object")
    enable_thinking = kwargs.get("enable_thinking")
    if enable_thinking is not None and not isinstance(enable_thinking, bool):
      raise BadRequest("chat_template_kwargs.enable_thinking must be true or false")
    stops = _stop_strings(body)
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
    _check_unsupported(body)
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
    text, tokens, logprobs, reason = self._apply_stop(gen, _stop_strings(body))
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


# --- CLI -------------------------------------------------------------------------------------------------

def add_serve_parser(subparsers) -> argparse.ArgumentParser:
  """Adds `serve` to the `orchestra` sub-command parsers; returns its parser."""
  p = subparsers.add_parser(
      "serve", help="serve a checkpoint over an OpenAI-compatible HTTP API",
      formatter_class=argparse.RawDescriptionHelpFormatter,
      description="Serve one model over an OpenAI-compatible HTTP API (POST /v1/chat/completions, "
                  "POST /v1/completions, GET /v1/models, GET /health). Concurrent requests share one "
                  "continuously batched decode. Tool calls in the model's hermes output "
                  "(<tool_call>{json}</tool_call>) come back as OpenAI tool_calls, the <think> block as "
                  "reasoning_content. No streaming, n=1 only.",
      epilog="example:\n  orchestra serve --model runs/tiny --port 8000\n"
             "  curl -s 127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\\n"
             "    -d '{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 16}'")
  p.add_argument("--model", required=True, metavar="DIR",
                 help="orchestra checkpoint, HF Qwen3 directory or orchestra train WORKDIR[/checkpoints/STEP] to serve")
  p.add_argument("--port", type=int, default=8000, metavar="P",
                 help="TCP port to listen on; 0 picks a free one (default 8000)")
  p.add_argument("--host", default="127.0.0.1", metavar="ADDR",
                 help="address to bind (default 127.0.0.1, this machine only; the server has no authentication, "
                      "so think twice before 0.0.0.0)")
  p.add_argument("--max-batch", type=int, default=DEFAULT_MAX_BATCH, metavar="N",
                 help=f"requests decoded together (KV-cache rows); more wait in a queue (default {DEFAULT_MAX_BATCH})")
  p.add_argument("--max-len", type=int, default=None, metavar="L",
                 help=f"tokens per request, prompt plus completion (KV-cache row length); longer prompts get "
                      f"HTTP 400 (default: the smaller of {DEFAULT_MAX_LEN} and the model's max_position_embeddings)")
  p.add_argument("--served-model-name", default=None, metavar="NAME",
                 help="model name clients send and /v1/models lists; other names get 404 "
                      "(default: the model directory's name; for a training run, WORKDIR or "
                      "WORKDIR/checkpoints/N, '<workdir name>-step<N>')")
  p.add_argument("--tokenizer", default=None, metavar="DIR",
                 help="tokenizer directory (default: the model directory if it has tokenizer files, else the "
                      "bundled Qwen3 tokenizer)")
  p.add_argument("--no-warmup", action="store_true",
                 help="skip compiling the greedy path before listening (the first request then pays for it)")
  p.add_argument("--quiet", action="store_true", help="do not log one line per HTTP request to stderr")
  return p


def build_server(args, log_requests: bool | None = None) -> ModelServer:
  """The `ModelServer` that `orchestra serve` ARGS describes (model loaded, socket bound, nothing running yet)."""
  from orchestra_jax import checkpoint, tokenizer

  model_dir = Path(args.model)
  checkpoint.find_train_checkpoint(model_dir)  # a run's missing step: one line naming the finished ones
  if not model_dir.is_dir():
    raise checkpoint.CheckpointError(f"model directory {args.model} does not exist")
  if not 0 <= args.port <= 65535:
    raise ServeError(f"--port must be in [0, 65535], got {args.port}")
  tok_dir = args.tokenizer
  if tok_dir is None and any((model_dir / f).is_file() for f in checkpoint.TOKENIZER_FILES):
    tok_dir = str(model_dir)
  tok = tokenizer.load_tokenizer(tok_dir)
  config = checkpoint.read_model_config(model_dir)
  max_len = args.max_len
  if max_len is None:
    max_len = min(DEFAULT_MAX_LEN, config.max_position_embeddings or DEFAULT_MAX_LEN)
  elif config.max_position_embeddings and max_len > config.max_position_embeddings:
    print(f"orchestra serve: warning: --max-len {max_len} is over the model's max_position_embeddings "
          f"{config.max_position_embeddings}", file=sys.stderr)
  run = checkpoint.find_train_checkpoint(model_dir)  # a training run: "<workdir name>-step<N>", not "<N>"
  name = args.served_model_name or (f"{run.workdir.name}-step{run.step}" if run else model_dir.resolve().name)
  print(f"orchestra serve: loading {model_dir} ...", file=sys.stderr, flush=True)
  config, params = checkpoint.load_model(model_dir)
  return ModelServer(config, params, tok, model_name=name, max_len=max_len, max_batch=args.max_batch,
                     host=args.host, port=args.port, model_path=str(model_dir),
                     log_requests=not args.quiet if log_requests is None else log_requests)


def run_serve(args) -> None:
  """Runs `orchestra serve` until Ctrl-C. Raises UserError subclasses for problems a user can fix."""
  server = build_server(args)
  previous = None
  if threading.current_thread() is threading.main_thread():  # SIGTERM (docker stop, kill) stops like Ctrl-C

    def on_term(signum, frame):
      raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
  try:
    if not args.no_warmup:
      print("orchestra serve: compiling (warm-up) ...", file=sys.stderr, flush=True)
      print(f"orchestra serve: warm-up took {server.warmup():.1f}s", file=sys.stderr, flush=True)
    print(f"orchestra serve: serving {server.model_name!r} at {server.base_url}/v1 (max batch "
          f"{server.engine.batch_size}, max len {server.max_len}); Ctrl-C stops", flush=True)
    server.serve_forever()
  except KeyboardInterrupt:
    print("orchestra serve: stopping", file=sys.stderr)
  finally:
    server.close()
    if previous is not None:
      signal.signal(signal.SIGTERM, previous)
