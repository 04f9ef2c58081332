"""`orchestra serve` on the wire: a stdlib `ThreadingHTTPServer` in front of a `ModelApi`, and `open_server`,
which loads a checkpoint directory into one.

One handler thread per connection parses the JSON body, calls the API (which waits on the engine) and writes the
answer; every failure becomes an OpenAI error body `{"error": {"message", "type", "code"}}`: 400 for a bad
request, 404 for an unknown route or model, 503 while shutting down, 500 for anything else.
"""

from __future__ import annotations

import http.server
import json
import logging
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from orchestra_jax import checkpoint
from orchestra_jax.errors import UserError
from orchestra_jax.rollout.sampler import Sampler, SamplingParams
from orchestra_jax.serve.api import ModelApi
from orchestra_jax.serve.engine import DEFAULT_MAX_BATCH, DEFAULT_MAX_LEN, Engine, EngineClosed
from orchestra_jax.serve.schema import BadRequest, chat_stop_ids
from orchestra_jax.tokenizer import load_tokenizer

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 32 << 20


class ServeError(UserError, ValueError):
  """A server option that cannot work (port in use, max-len too small); the message says which."""


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


class ModelServer(ModelApi):
  """An OpenAI-compatible server for one model; `with ModelServer(...) as srv:` serves on a background thread.

  `config, params` as from `checkpoint.load_model`; `tokenizer` an `orchestra_jax.tokenizer.Tokenizer`.
  `port=0` picks a free port (see `base_url`).
  """

  def __init__(self, config, params, tokenizer, *, model_name: str, max_len: int = DEFAULT_MAX_LEN,
               max_batch: int = DEFAULT_MAX_BATCH, host: str = "127.0.0.1", port: int = 0, chunk_steps: int = 8,
               log_requests: bool = False, model_path: str | None = None):
    if max_len < 2:
      raise ServeError(f"--max-len must be at least 2, got {max_len}")
    if max_batch < 1:
      raise ServeError(f"--max-batch must be at least 1, got {max_batch}")
    stop_ids = chat_stop_ids(tokenizer, config)

    def make_sampler():
      return Sampler(config, params, max_len=max_len, batch_size=max_batch, chunk_steps=chunk_steps,
                     stop_ids=stop_ids, tool_call_ids=())

    super().__init__(config, tokenizer, Engine(make_sampler), model_name=model_name, stop_ids=stop_ids,
                     model_path=model_path)
    self.log_requests = log_requests
    try:
      self._httpd = _HTTPServer((host, port), _Handler)
    except OSError as e:
      raise ServeError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    self._httpd.owner = self
    self._thread: threading.Thread | None = None
    self._connections: set[socket.socket] = set()
    self._conn_lock = threading.Lock()

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

  def warmup(self) -> float:
    """Compiles the greedy prefill and decode by generating two tokens; returns the seconds it took."""
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


def open_server(model: str | Path, *, port: int = 8000, host: str = "127.0.0.1", max_batch: int = DEFAULT_MAX_BATCH,
                max_len: int | None = None, served_model_name: str | None = None, tokenizer_dir: str | None = None,
                log_requests: bool = False) -> ModelServer:
  """A `ModelServer` for the checkpoint, HF directory or training run at `model` (loaded, socket bound, nothing
  running yet). `max_len` None: the smaller of DEFAULT_MAX_LEN and the model's max_position_embeddings;
  `served_model_name` None: the directory's name, or '<workdir name>-step<N>' for a training run; `tokenizer_dir`
  None: the model directory's tokenizer files, else the bundled Qwen3 tokenizer."""
  model_dir = Path(model)
  checkpoint.find_train_checkpoint(model_dir)  # a run's missing step: one line naming the finished ones
  if not model_dir.is_dir():
    raise checkpoint.CheckpointError(f"model directory {model} does not exist")
  if not 0 <= port <= 65535:
    raise ServeError(f"--port must be in [0, 65535], got {port}")
  if tokenizer_dir is None and any((model_dir / f).is_file() for f in checkpoint.TOKENIZER_FILES):
    tokenizer_dir = str(model_dir)
  tok = load_tokenizer(tokenizer_dir)
  config = checkpoint.read_model_config(model_dir)
  if max_len is None:
    max_len = min(DEFAULT_MAX_LEN, config.max_position_embeddings or DEFAULT_MAX_LEN)
  elif config.max_position_embeddings and max_len > config.max_position_embeddings:
    print(f"orchestra serve: warning: --max-len {max_len} is over the model's max_position_embeddings "
          f"{config.max_position_embeddings}", file=sys.stderr)
  run = checkpoint.find_train_checkpoint(model_dir)  # a training run: "<workdir name>-step<N>", not "<N>"
  name = served_model_name or (f"{run.workdir.name}-step{run.step}" if run else model_dir.resolve().name)
  print(f"orchestra serve: loading {model_dir} ...", file=sys.stderr, flush=True)
  config, params = checkpoint.load_model(model_dir)
  return ModelServer(config, params, tok, model_name=name, max_len=max_len, max_batch=max_batch, host=host,
                     port=port, model_path=str(model_dir), log_requests=log_requests)
