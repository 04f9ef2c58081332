"""`ScriptedServer`: a deterministic OpenAI-compatible chat server on 127.0.0.1, for tests, benchmarks and demos.

It stands in for the expert LLM endpoints (vLLM, vendor APIs) so that the tool-calling path, its cost and
latency accounting and its fault handling can be exercised offline and reproducibly. It implements
`POST /v1/chat/completions` and `GET /v1/models` with OpenAI-shaped bodies, over HTTP/1.1 keep-alive (so a
pooled client reuses connections as it would against vLLM).

The script maps a model name (or "*" for any other name) to a spec, one of:

* a callable `f(messages, body) -> Reply | str`, for tests that compute answers;
* a rule table (a dict, also the JSON form used by the CLI):

    {"rules": [{"contains": "capital of France", "answer": "Paris", "delay_s": 0.1},
               {"regex": "^\\\\d+ \\\\+ \\\\d+$", "answer": "42", "completion_tokens": 1},
               {"contains": "weather", "tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]}],
     "default": {"answer": "I don't know."},
     "delay_s": 0.0,            # added to every reply of this model
     "fault": "status:429:2",   # optional fault mode, see below
     "retry_after": 0}          # optional Retry-After header on 429/5xx faults

  Rules match the content of the last user message, first match wins (`contains` is a case-insensitive
  substring, `regex` a Python regex searched in it, a rule with neither always matches). With no match and no
  `default`, the answer is "echo: <last user message>". A rule may carry `prompt_tokens`,
  `completion_tokens`, `delay_s`, `tool_calls`, `finish_reason` and its own `fault`.

Defaults are deterministic functions of the request: prompt_tokens = whitespace-separated words in all
message contents, completion_tokens = words in the answer (the answer is cut to `max_tokens` words, with
finish_reason "length", when the request sets a smaller `max_tokens`).

Fault modes (per model, or per rule):
  refuse            read the request, then close the connection without a response
  status:CODE[:N]   answer HTTP CODE (with an OpenAI error body) N times, then normally; no N = always
  malformed_json    HTTP 200 with a truncated JSON body
  no_usage          a normal completion without the `usage` field
  missing_choices   HTTP 200 JSON without `choices`
  hang[:SECONDS]    wait SECONDS (default 3600, i.e. longer than any sane read timeout) before answering;
                    closing the server ends the wait and drops the request, so tests never wait on it

Every request is recorded in `server.received` (path, headers, parsed body) for tests to inspect.

CLI (for demos): `python -m orchestra_jax.tools.scripted_server --port 8000 --script rules.json`, where the
JSON file is the script (`{"model-name": spec, ...}`, optionally wrapped as `{"models": {...}}`).
"""

from __future__ import annotations

import argparse
import dataclasses
import http.server
import itertools
import json
import re
import socket
import sys
import threading
import time
from typing import Any, Callable

from orchestra_jax.errors import UserError

_DEFAULT_HANG_S = 3600.0


class ScriptError(UserError, ValueError):
  """A script that the server cannot follow; the message names the model and the field."""


@dataclasses.dataclass
class Reply:
  """What a model answers to one request. None token counts are computed deterministically from the text."""

  text: str = ""
  prompt_tokens: int | None = None
  completion_tokens: int | None = None
  delay_s: float = 0.0
  tool_calls: list[dict[str, Any]] | None = None  # [{"name": ..., "arguments": {...} or "json string"}]
  finish_reason: str | None = None
  fault: str | None = None


Spec = dict[str, Any] | Callable[[list[dict[str, Any]], dict[str, Any]], "Reply | str"]


def _content_text(content: Any) -> str:
  if content is None:
    return ""
  if isinstance(content, str):
    return content
  if isinstance(content, list):
    return " ".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
  return str(content)


def count_words(messages: list[dict[str, Any]]) -> int:
  """Default prompt token count: whitespace words over all message contents."""
  return sum(len(_content_text(m.get("content")).split()) for m in messages if isinstance(m, dict))


def last_user_message(messages: list[dict[str, Any]]) -> str:
  for m in reversed(messages):
    if isinstance(m, dict) and m.get("role") == "user":
      return _content_text(m.get("content"))
  return ""


_FAULT_RE = re.compile(r"^(refuse|malformed_json|no_usage|missing_choices|hang(:\d+(\.\d*)?)?|status:\d{3}(:\d+)?)$")


def _check_fault(fault: Any, where: str) -> None:
  if fault is not None and (not isinstance(fault, str) or not _FAULT_RE.match(fault)):
    raise ScriptError(f"{where}: unknown fault {fault!r}; expected refuse, status:CODE[:N], malformed_json, "
                      "no_usage, missing_choices or hang[:SECONDS]")


_RULE_KEYS = {"contains", "regex", "answer", "prompt_tokens", "completion_tokens", "delay_s", "tool_calls",
              "finish_reason", "fault"}
_SPEC_KEYS = {"rules", "default", "delay_s", "fault", "retry_after"}


def validate_script(script: dict[str, Spec]) -> None:
  """Raises ScriptError for anything the server could not follow (so a bad JSON file fails at start-up)."""
  if not isinstance(script, dict):
    raise ScriptError(f"a script maps model names to specs; got {type(script).__name__}")
  for model, spec in script.items():
    if callable(spec):
      continue
    if not isinstance(spec, dict):
      raise ScriptError(f"model {model!r}: spec must be a rule table (dict) or a callable, got {type(spec).__name__}")
    unknown = sorted(set(spec) - _SPEC_KEYS)
    if unknown:
      raise ScriptError(f"model {model!r}: unknown key(s) {unknown}; allowed {sorted(_SPEC_KEYS)}")
    _check_fault(spec.get("fault"), f"model {model!r}")
    rules = spec.get("rules", [])
    if not isinstance(rules, list):
      raise ScriptError(f"model {model!r}: rules must be a list")
    for i, rule in enumerate(rules + ([spec["default"]] if "default" in spec else [])):
      where = f"model {model!r} rule {i}" if i < len(rules) else f"model {model!r} default"
      if not isinstance(rule, dict):
        raise ScriptError(f"{where}: must be a dict")
      unknown = sorted(set(rule) - _RULE_KEYS)
      if unknown:
        raise ScriptError(f"{where}: unknown key(s) {unknown}; allowed {sorted(_RULE_KEYS)}")
      _check_fault(rule.get("fault"), where)
      if "regex" in rule:
        try:
          re.compile(rule["regex"])
        except re.error as e:
          raise ScriptError(f"{where}: bad regex {rule['regex']!r}: {e}") from None
    for key in ("delay_s", "retry_after"):
      if key in spec and not (isinstance(spec[key], (int, float)) and spec[key] >= 0):
        raise ScriptError(f"model {model!r}: {key} must be a number >= 0")


def _rule_reply(spec: dict[str, Any], messages: list[dict[str, Any]]) -> Reply:
  last = last_user_message(messages)
  chosen = None
  for rule in spec.get("rules", []):
    if "contains" in rule and str(rule["contains"]).lower() not in last.lower():
      continue
    if "regex" in rule and not re.search(rule["regex"], last):
      continue
    chosen = rule
    break
  if chosen is None:
    chosen = spec.get("default", {"answer": f"echo: {last}"})
  return Reply(text=str(chosen.get("answer", "")), prompt_tokens=chosen.get("prompt_tokens"),
               completion_tokens=chosen.get("completion_tokens"), delay_s=float(chosen.get("delay_s", 0.0)),
               tool_calls=chosen.get("tool_calls"), finish_reason=chosen.get("finish_reason"),
               fault=chosen.get("fault"))


class _Handler(http.server.BaseHTTPRequestHandler):
  protocol_version = "HTTP/1.1"  # keep-alive, as real inference servers do
  # Headers and body go out in two writes; with Nagle on, the body waits for the client's delayed ACK (~40 ms).
  disable_nagle_algorithm = True
  server: "_HTTPServer"

  def log_message(self, format, *args):  # noqa: A002 - signature fixed by the base class
    if self.server.owner.verbose:
      sys.stderr.write("scripted_server: " + (format % args) + "\n")

  def setup(self):
    super().setup()
    self.server.owner._track(self.connection, True)

  def finish(self):
    try:
      super().finish()
    finally:
      self.server.owner._track(self.connection, False)

  # --- plumbing --------------------------------------------------------------------------------------
  def _send_json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
    self._send_raw(status, json.dumps(obj).encode("utf-8"), headers)

  def _send_raw(self, status: int, data: bytes, headers: dict[str, str] | None = None) -> None:
    self.send_response(status)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(data)))
    for k, v in (headers or {}).items():
      self.send_header(k, v)
    self.end_headers()
    self.wfile.write(data)

  def _error(self, status: int, message: str, kind: str = "invalid_request_error", headers=None) -> None:
    self._send_json(status, {"error": {"message": message, "type": kind, "code": status}}, headers)

  # --- routes ----------------------------------------------------------------------------------------
  def do_GET(self):
    owner = self.server.owner
    owner._record(self.path, self.headers, None)
    if self.path.rstrip("/") in ("/v1/models", "/models"):
      data = [{"id": m, "object": "model", "created": 0, "owned_by": "scripted"} for m in owner.script if m != "*"]
      self._send_json(200, {"object": "list", "data": data})
    else:
      self._error(404, f"no route GET {self.path}")

  def do_POST(self):
    owner = self.server.owner
    length = int(self.headers.get("Content-Length") or 0)
    raw = self.rfile.read(length) if length else b""
    try:
      body = json.loads(raw or b"null")
    except ValueError:
      body = None
    owner._record(self.path, self.headers, body)
    if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
      return self._error(404, f"no route POST {self.path}")
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
      return self._error(400, "body must be a JSON object with a 'messages' list")
    model = body.get("model")
    spec = owner.script.get(model, owner.script.get("*"))
    if spec is None:
      return self._error(404, f"The model `{model}` does not exist.", "NotFoundError")
    messages = body["messages"]
    if callable(spec):
      reply = spec(messages, body)
      reply = Reply(text=reply) if isinstance(reply, str) else reply
      spec = {}
    else:
      reply = _rule_reply(spec, messages)
    fault = reply.fault or spec.get("fault")
    delay = float(spec.get("delay_s", 0.0)) + reply.delay_s

    if fault:
      retry_headers = {"Retry-After": str(spec["retry_after"])} if "retry_after" in spec else None
      if fault == "refuse":
        self.close_connection = True
        try:
          self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
          pass
        return
      if fault.startswith("hang"):
        if owner._stop.wait(float(fault.split(":")[1]) if ":" in fault else _DEFAULT_HANG_S):
          self.close_connection = True  # the server is closing: drop the request
          return
        fault = None  # waited it out: answer normally
      if fault.startswith("status:"):
        parts = fault.split(":")
        code, times = int(parts[1]), (int(parts[2]) if len(parts) > 2 else None)
        if times is None or owner._count_fault(model, fault) <= times:
          kind = {429: "rate_limit_error"}.get(code, "server_error" if code >= 500 else "invalid_request_error")
          return self._error(code, f"scripted fault {fault}", kind, retry_headers)
        fault = None  # the scripted failures are used up: answer normally

    if delay > 0:
      owner._stop.wait(delay)
    if fault == "malformed_json":
      return self._send_raw(200, b'{"id": "chatcmpl-broken", "object": "chat.completion", "choices": [{"in')
    completion = owner._completion(model, messages, body, reply)
    if fault == "missing_choices":
      completion.pop("choices")
    if fault == "no_usage":
      completion.pop("usage")
    self._send_json(200, completion)


class _HTTPServer(http.server.ThreadingHTTPServer):
  daemon_threads = True
  allow_reuse_address = True
  request_queue_size = 512  # the default 5 drops SYNs when 64 clients connect at once
  owner: "ScriptedServer"


class ScriptedServer:
  """A scripted OpenAI-compatible server on a background thread; use as `with ScriptedServer(script) as srv:`."""

  def __init__(self, script: dict[str, Spec], host: str = "127.0.0.1", port: int = 0, verbose: bool = False):
    if isinstance(script, dict) and set(script) == {"models"} and isinstance(script["models"], dict):
      script = script["models"]
    validate_script(script)
    self.script = script
    self.verbose = verbose
    self.received: list[dict[str, Any]] = []
    self._lock = threading.Lock()
    self._stop = threading.Event()
    self._fault_counts: dict[tuple[str, str], int] = {}
    self._connections: set[socket.socket] = set()
    self._ids = itertools.count(1)
    self._httpd = _HTTPServer((host, port), _Handler)
    self._httpd.owner = self
    self._thread: threading.Thread | None = None

  @property
  def port(self) -> int:
    return self._httpd.server_address[1]

  @property
  def base_url(self) -> str:
    return f"http://{self._httpd.server_address[0]}:{self.port}"

  # --- lifecycle -------------------------------------------------------------------------------------
  def start(self) -> "ScriptedServer":
    if self._thread is None:
      self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                      name=f"scripted-server-{self.port}", daemon=True)
      self._thread.start()
    return self

  def serve_forever(self) -> None:
    """Serves on the calling thread until interrupted (the CLI)."""
    self._httpd.serve_forever(poll_interval=0.2)

  def close(self) -> None:
    """Stops serving, releases hung and delayed handlers, and drops open keep-alive connections."""
    self._stop.set()
    if self._thread is not None:
      self._httpd.shutdown()
      self._thread.join(timeout=5)
      self._thread = None
    self._httpd.server_close()
    with self._lock:
      conns = list(self._connections)
    for conn in conns:
      try:
        conn.shutdown(socket.SHUT_RDWR)
      except OSError:
        pass

  def __enter__(self) -> "ScriptedServer":
    return self.start()

  def __exit__(self, *exc) -> None:
    self.close()

  def reset(self) -> None:
    """Forgets recorded requests and fault counters (so `status:429:2` fails twice again)."""
    with self._lock:
      self.received.clear()
      self._fault_counts.clear()

  # --- used by the handler ---------------------------------------------------------------------------
  def _track(self, conn: socket.socket, add: bool) -> None:
    with self._lock:
      (self._connections.add if add else self._connections.discard)(conn)

  def _record(self, path: str, headers, body: Any) -> None:
    with self._lock:
      self.received.append({"path": path, "headers": dict(headers.items()), "body": body})

  def _count_fault(self, model: str, fault: str) -> int:
    with self._lock:
      n = self._fault_counts.get((model, fault), 0) + 1
      self._fault_counts[(model, fault)] = n
      return n

  def _completion(self, model: str, messages: list[dict[str, Any]], body: dict[str, Any], reply: Reply) -> dict:
    text = reply.text
    finish = reply.finish_reason
    max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
    completion_tokens = reply.completion_tokens
    if completion_tokens is None:
      words = text.split()
      if isinstance(max_tokens, int) and 0 < max_tokens < len(words):
        text, finish = " ".join(words[:max_tokens]), finish or "length"
        words = words[:max_tokens]
      completion_tokens = len(words)
    prompt_tokens = reply.prompt_tokens if reply.prompt_tokens is not None else count_words(messages)
    n = next(self._ids)
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if reply.tool_calls:
      message["tool_calls"] = [{
          "id": f"call_{n}_{i}",
          "type": "function",
          "function": {
              "name": c["name"],
              "arguments": (c["arguments"] if isinstance(c.get("arguments"), str)
                            else json.dumps(c.get("arguments", {}))),
          },
      } for i, c in enumerate(reply.tool_calls)]
      finish = finish or "tool_calls"
    if message["content"] is None and not reply.tool_calls:
      message["content"] = ""
    return {
        "id": f"chatcmpl-scripted-{n}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish or "stop"}],
        "usage": {"prompt_tokens": int(prompt_tokens), "completion_tokens": int(completion_tokens),
                  "total_tokens": int(prompt_tokens) + int(completion_tokens)},
    }


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
      prog="python -m orchestra_jax.tools.scripted_server",
      description="Serve a deterministic, scripted OpenAI-compatible chat API (POST /v1/chat/completions, "
      "GET /v1/models) for tests and demos. Prints its base URL, then serves until Ctrl-C.",
      epilog="Script file: JSON {\"model-name\": spec, ...} (optionally under \"models\"); \"*\" matches any other "
      "model. spec: {\"rules\": [{\"contains\"|\"regex\": ..., \"answer\": ..., \"prompt_tokens\", "
      "\"completion_tokens\", \"delay_s\", \"tool_calls\": [{\"name\", \"arguments\"}], \"fault\"}], \"default\": "
      "{...}, \"delay_s\": s, \"fault\": F, \"retry_after\": s}. Faults: refuse, status:CODE[:N] (N times, then OK), "
      "malformed_json, no_usage, missing_choices, hang[:SECONDS]. Without --script every model echoes the last "
      "user message. Details: the module docstring of orchestra_jax/tools/scripted_server.py.",
      formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1, local only)")
  parser.add_argument("--port", type=int, default=0, help="port to listen on; 0 picks a free one (default 0)")
  parser.add_argument("--script", help="JSON rule table, see below (default: echo for every model)")
  parser.add_argument("--verbose", action="store_true", help="log every request to stderr")
  args = parser.parse_args(argv)
  try:
    if args.script:
      try:
        with open(args.script) as f:
          script = json.load(f)
      except OSError as e:
        raise ScriptError(f"cannot read --script {args.script}: {e.strerror}") from None
      except ValueError as e:
        raise ScriptError(f"--script {args.script} is not valid JSON: {e}") from None
    else:
      script = {"*": {}}
    server = ScriptedServer(script, host=args.host, port=args.port, verbose=args.verbose)
  except (UserError, OSError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(server.base_url, flush=True)
  try:
    server.serve_forever()
  except KeyboardInterrupt:
    pass
  finally:
    server.close()
  return 0


if __name__ == "__main__":
  sys.exit(main())
