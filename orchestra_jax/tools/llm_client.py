"""`ChatClient`: a priced, fault-tolerant client for one OpenAI-compatible `/v1/chat/completions` endpoint.

Every expert LLM the orchestrator can call (docs/design.md section 4) sits behind such an endpoint (vLLM for open
models, a vendor API for closed ones). A rollout must survive whatever the endpoint does, so `chat` never
raises for a fault of the endpoint or the network: it returns a `ChatResult` with `ok=False` and an `error`
sentence that can be shown to the orchestrator verbatim as the tool's response. The same record carries what
the reward needs (token counts, cost in USD, wall-clock latency including retries), so a ledger can store it
as is (`ChatResult.to_dict`).

Behaviour, in the order a call meets it:

* URL. Requests go to `{base_url}/v1/chat/completions`; a `base_url` that already ends in `/v1` (the form the
  OpenAI SDK uses) is accepted too, so both spellings of one endpoint work.
* API key. `api_key_env` names an environment variable; it is read at every call (so a rotated key is picked
  up and the key is never stored on the client) and sent as `Authorization: Bearer ...`. The key never
  appears in a log line, an error string or a repr: error strings are scrubbed of it as a last line of
  defence, in case an endpoint echoes the header back. A named but unset variable gives `ok=False` without
  a request, since an unauthenticated call would only fail later with a less clear message.
* Retries. `max_retries` counts retries after the first attempt (at most `1 + max_retries` attempts).
  Retried: HTTP 429, HTTP 5xx, connection errors (refused, reset, closed without a response) and timeouts.
  Not retried: other 4xx (the request itself is wrong; repeating it cannot help) and bodies that are not a
  chat completion (a deterministic server bug). The wait before retry k (k = 1, 2, ...) is
  `backoff_s * 2**(k-1)` scaled by a random factor in [0.5, 1] (jitter, so many rollouts throttled at once
  do not retry in lock-step), or the server's `Retry-After` (seconds or HTTP date) when present, capped at
  `retry_after_cap_s` so a server cannot stall a rollout for minutes.
* Timeouts. `connect_timeout` bounds the TCP connect; `read_timeout` bounds each wait for bytes from the
  server (requests' semantics), which is what catches a hung endpoint.
* Missing `usage`. Some servers omit it. Recording 0 tokens would make such an endpoint look free to the
  cost term of the reward, which RL would learn to exploit, so the call stays `ok=True` with the token counts
  *estimated* and a `warning` saying so (`usage_estimated=True`): with `count_tokens` (a `str -> int`
  function, e.g. a real tokenizer's) when given, else with the rule of thumb of 4 characters per token.
* Cost = prompt_tokens * price_in_per_m / 1e6 + completion_tokens * price_out_per_m / 1e6 (USD); failed
  calls record 0 tokens and 0 cost (nothing usable came back), but their latency is still measured.

Threads. One `requests.Session` with a connection pool of `pool_size` connections is shared by all threads.
The client never mutates the session after construction (headers go per request) and the session keeps no
cookies, so the only shared state is urllib3's pool, which is thread-safe. `chat_many` and the module-level
`chat_many` run many calls on a thread pool; the calls spend their time waiting on sockets, so threads (not
processes) are the right tool despite the GIL.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import email.utils
import http.client
import http.cookiejar
import json
import logging
import math
import os
import random
import time
import urllib.parse
from typing import Any, Callable, Sequence

import requests
import requests.adapters
import requests.auth

from orchestra_jax.errors import UserError

log = logging.getLogger(__name__)

_EXCERPT_CHARS = 200


class ClientConfigError(UserError, ValueError):
  """A `ChatClient` argument that cannot work (bad URL, negative timeout); the message names the argument."""


@dataclasses.dataclass(frozen=True)
class ChatResult:
  """The outcome of one chat call, successful or not; everything a cost/latency ledger stores.

  `text` is the assistant message content ("" when the model only called tools or the call failed);
  `tool_calls` the OpenAI-shaped tool calls of the message (`[{id, type, function: {name, arguments}}]`).
  `model` is the model name that was requested (the key prices are looked up by), not whatever name the
  server echoes. `error` is set exactly when `ok` is False; `warning` flags a usable but imperfect answer
  (today: token counts estimated because the server sent no `usage`).
  """

  text: str
  tool_calls: list[dict[str, Any]]
  prompt_tokens: int
  completion_tokens: int
  cost_usd: float
  latency_s: float
  model: str
  ok: bool
  error: str | None
  attempts: int
  warning: str | None = None
  finish_reason: str | None = None
  status_code: int | None = None  # HTTP status of the last response, None if none came back
  usage_estimated: bool = False

  @property
  def total_tokens(self) -> int:
    return self.prompt_tokens + self.completion_tokens

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


class _NoCookies(http.cookiejar.DefaultCookiePolicy):
  """Rejects every cookie: an API client has no use for them, and an empty jar is state threads cannot race on."""

  def set_ok(self, cookie, request):
    return False


class _BearerAuth(requests.auth.AuthBase):
  """Sets `Authorization: Bearer KEY`. Passed as `auth=` (not as a header) so that requests does not replace it
  with credentials from ~/.netrc, which it consults whenever `auth` is None."""

  def __init__(self, key: str):
    self._key = key

  def __call__(self, request):
    request.headers["Authorization"] = f"Bearer {self._key}"
    return request

  def __repr__(self) -> str:
    return "_BearerAuth(***)"


def approx_token_count(text: str) -> int:
  """Rough token count (4 characters per token, OpenAI's rule of thumb); used only when `usage` is missing."""
  return math.ceil(len(text) / 4) if text else 0


def _message_text(content: Any) -> str:
  """Text of an OpenAI message `content`: a string, None, or a list of parts (`{"type": "text", "text": ...}`)."""
  if content is None:
    return ""
  if isinstance(content, str):
    return content
  if isinstance(content, list):
    return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
  return str(content)


def _excerpt(text: str) -> str:
  text = " ".join(text.split())
  return text if len(text) <= _EXCERPT_CHARS else text[:_EXCERPT_CHARS] + "..."


def _scrub(text: str, key: str | None) -> str:
  """`text` with the API key masked; applied before any excerpting, so no truncated piece of the key survives."""
  return text.replace(key, "***") if key else text


def _plural(n: int, word: str) -> str:
  return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _retry_after_seconds(value: str | None) -> float | None:
  """Seconds to wait from a `Retry-After` header (delta-seconds or an HTTP date); None if absent or unreadable."""
  if not value:
    return None
  value = value.strip()
  try:
    return max(0.0, float(value))
  except ValueError:
    pass
  try:
    when = email.utils.parsedate_to_datetime(value)
  except (TypeError, ValueError):
    return None
  if when is None:
    return None
  return max(0.0, when.timestamp() - time.time())


def _exception_chain(exc: BaseException):
  """`exc`, its causes/contexts and exceptions nested in args (urllib3 wraps the socket error several levels deep)."""
  seen, stack = set(), [exc]
  while stack:
    e = stack.pop()
    if id(e) in seen:
      continue
    seen.add(id(e))
    yield e
    for nxt in (e.__cause__, e.__context__, getattr(e, "reason", None), *getattr(e, "args", ())):
      if isinstance(nxt, BaseException):
        stack.append(nxt)


class ChatClient:
  """A client for one model on one OpenAI-compatible endpoint, with its prices; safe to share across threads.

  Args:
    base_url: scheme://host:port of the server, optionally ending in `/v1`.
    model: the `model` field sent with each request (and recorded in each `ChatResult`).
    api_key_env: name of the environment variable that holds the API key; None for no `Authorization` header.
    connect_timeout, read_timeout: seconds, see the module docstring.
    max_retries: retries after the first attempt for retryable faults.
    backoff_s: base of the exponential backoff between retries.
    price_in_per_m, price_out_per_m: USD per million prompt / completion tokens.
    retry_after_cap_s: the longest `Retry-After` the client will honour.
    pool_size: connections kept open to the endpoint; size it to the expected concurrency.
    count_tokens: `str -> int` used to estimate token counts when a response has no `usage`.
  """

  def __init__(self,
               base_url: str,
               model: str,
               api_key_env: str | None = None,
               connect_timeout: float = 5.0,
               read_timeout: float = 120.0,
               max_retries: int = 3,
               backoff_s: float = 0.5,
               price_in_per_m: float = 0.0,
               price_out_per_m: float = 0.0,
               *,
               retry_after_cap_s: float = 20.0,
               pool_size: int = 64,
               count_tokens: Callable[[str], int] | None = None):
    parsed = urllib.parse.urlsplit(str(base_url).strip())
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
      raise ClientConfigError(f"base_url must look like http://host:port, got {base_url!r}")
    # Drop any user:password@ so that credentials in a URL never reach an error string or a log line.
    netloc = parsed.hostname if parsed.port is None else f"{parsed.hostname}:{parsed.port}"
    if ":" in parsed.hostname:  # IPv6 literal
      netloc = f"[{parsed.hostname}]" + ("" if parsed.port is None else f":{parsed.port}")
    path = parsed.path.rstrip("/")
    if path.endswith("/v1"):
      path = path[:-3]
    self.base_url = urllib.parse.urlunsplit((parsed.scheme, netloc, path, "", ""))
    self.url = self.base_url + "/v1/chat/completions"
    self._auth = (parsed.username, parsed.password) if parsed.username else None
    if not model or not isinstance(model, str):
      raise ClientConfigError(f"model must be a non-empty string, got {model!r}")
    self.model = model
    self.api_key_env = api_key_env or None
    for name, value in (("connect_timeout", connect_timeout), ("read_timeout", read_timeout)):
      if not value > 0:
        raise ClientConfigError(f"{name} must be positive, got {value!r}")
    for name, value in (("backoff_s", backoff_s), ("price_in_per_m", price_in_per_m),
                        ("price_out_per_m", price_out_per_m), ("retry_after_cap_s", retry_after_cap_s)):
      if not value >= 0:
        raise ClientConfigError(f"{name} must be >= 0, got {value!r}")
    if not isinstance(max_retries, int) or max_retries < 0:
      raise ClientConfigError(f"max_retries must be an integer >= 0, got {max_retries!r}")
    if not isinstance(pool_size, int) or pool_size < 1:
      raise ClientConfigError(f"pool_size must be a positive integer, got {pool_size!r}")
    self.connect_timeout = float(connect_timeout)
    self.read_timeout = float(read_timeout)
    self.max_retries = max_retries
    self.backoff_s = float(backoff_s)
    self.price_in_per_m = float(price_in_per_m)
    self.price_out_per_m = float(price_out_per_m)
    self.retry_after_cap_s = float(retry_after_cap_s)
    self.pool_size = pool_size
    self.count_tokens = count_tokens

    session = requests.Session()
    # max_retries=0: urllib3 must not retry on its own; this class decides (and counts attempts).
    adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=pool_size, max_retries=0)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    session.cookies.set_policy(_NoCookies())
    self._session = session

  def __repr__(self) -> str:
    return (f"ChatClient(base_url={self.base_url!r}, model={self.model!r}, api_key_env={self.api_key_env!r}, "
            f"price_in_per_m={self.price_in_per_m}, price_out_per_m={self.price_out_per_m})")

  # --- lifecycle -------------------------------------------------------------------------------------
  def close(self) -> None:
    self._session.close()

  def __enter__(self) -> "ChatClient":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  # --- the call --------------------------------------------------------------------------------------
  def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
    """USD for one call at this client's prices."""
    return prompt_tokens * self.price_in_per_m / 1e6 + completion_tokens * self.price_out_per_m / 1e6

  def chat(self,
           messages: Sequence[dict[str, Any]],
           max_tokens: int | None = None,
           temperature: float | None = None,
           tools: Sequence[dict[str, Any]] | None = None,
           stop: str | Sequence[str] | None = None,
           extra: dict[str, Any] | None = None) -> ChatResult:
    """One chat completion. Never raises for endpoint or network faults; see the module docstring.

    `extra` is merged into the request body last (e.g. `{"top_p": 0.9, "seed": 0}` or vLLM's
    `chat_template_kwargs`), so it can override anything but `model` and `messages`.
    """
    start = time.perf_counter()
    key = None
    try:
      body: dict[str, Any] = {}
      if max_tokens is not None:
        body["max_tokens"] = int(max_tokens)
      if temperature is not None:
        body["temperature"] = float(temperature)
      if tools:
        body["tools"] = list(tools)
      if stop is not None:
        body["stop"] = [stop] if isinstance(stop, str) else list(stop)
      if extra:
        body.update(extra)
      body["model"] = self.model
      body["messages"] = list(messages)
      headers = {"Content-Type": "application/json", "Accept": "application/json"}
      if self.api_key_env:
        key = os.environ.get(self.api_key_env) or None
        if key is None:
          return self._failure(
              start, 0, None,
              f"tool endpoint {self.base_url} cannot be called: the API key variable {self.api_key_env} is not set")
      payload = json.dumps(body).encode("utf-8")
    except (TypeError, ValueError) as e:  # messages/tools/extra that are not JSON-serialisable
      return self._failure(start, 0, None, f"request for {self.base_url} could not be encoded as JSON: {e}")
    try:
      auth = _BearerAuth(key) if key else self._auth
      return self._call(start, payload, headers, auth, messages, key)
    except Exception as e:  # a bug here must not kill a rollout; say so loudly in the log instead
      log.exception("unexpected error in ChatClient.chat for %s", self.base_url)
      return self._failure(start, 0, None, f"tool endpoint {self.base_url} call failed: internal error "
                           f"({type(e).__name__})", key=key)

  def probe(self) -> tuple[bool, str]:
    """GET /v1/models once (no retries): (True, detail) when the endpoint answers, else (False, why).

    Cheap enough to run before a long job. The detail says whether `model` is among the served models (vendors
    may list only some, so a missing name is reported, not failed)."""
    headers = {"Accept": "application/json"}
    key = os.environ.get(self.api_key_env) if self.api_key_env else None
    if self.api_key_env and not key:
      return False, f"the API key variable {self.api_key_env} is not set"
    auth = _BearerAuth(key) if key else self._auth
    try:
      resp = self._session.get(self.base_url + "/v1/models", headers=headers, auth=auth,
                               timeout=(self.connect_timeout, self.connect_timeout))
    except requests.exceptions.RequestException as e:
      return False, self._describe_exception(e)[0]
    if resp.status_code in (401, 403):
      return False, f"refused the API key (HTTP {resp.status_code})"
    if resp.status_code != 200:
      return False, f"answered HTTP {resp.status_code}{self._error_detail(resp, key)}"
    try:
      served = [m.get("id") for m in resp.json().get("data", []) if isinstance(m, dict)]
    except (ValueError, AttributeError):
      return True, "answers, but /v1/models is not OpenAI-shaped"
    if self.model in served:
      return True, f"serves {self.model}"
    return True, f"answers; {self.model} is not among its {len(served)} listed models"

  def _call(self, start: float, payload: bytes, headers: dict[str, str], auth, messages, key: str | None) -> ChatResult:
    attempts, status = 0, None
    while True:
      attempts += 1
      retry_after, detail = None, ""
      try:
        resp = self._session.post(self.url, data=payload, headers=headers, auth=auth,
                                  timeout=(self.connect_timeout, self.read_timeout))
      except requests.exceptions.RequestException as e:
        status = None
        problem, retryable = self._describe_exception(e)
      else:
        status = resp.status_code
        if 200 <= status < 300:
          return self._parse(start, attempts, resp, messages, key)
        detail = self._error_detail(resp, key)
        if status == 429:
          problem, retryable = "is rate limiting requests (HTTP 429)", True
          retry_after = _retry_after_seconds(resp.headers.get("Retry-After"))
        elif status >= 500:
          problem, retryable = f"failed with HTTP {status}", True
          retry_after = _retry_after_seconds(resp.headers.get("Retry-After"))
        else:
          problem, retryable = f"rejected the request with HTTP {status}", False
        resp.close()
      if not retryable or attempts > self.max_retries:
        return self._failure(start, attempts, status, f"tool endpoint {self.base_url} {problem} "
                             f"after {_plural(attempts, 'attempt')}{detail}", key=key)
      wait = self.backoff_s * 2**(attempts - 1) * random.uniform(0.5, 1.0)
      if retry_after is not None:
        wait = min(retry_after, self.retry_after_cap_s)
      log.debug("%s attempt %d: %s; retrying in %.2f s", self.base_url, attempts, problem, wait)
      if wait > 0:
        time.sleep(wait)

  def _describe_exception(self, exc: requests.exceptions.RequestException) -> tuple[str, bool]:
    """(what went wrong, as a phrase after "tool endpoint URL", and whether to retry)."""
    chain = list(_exception_chain(exc))
    if isinstance(exc, requests.exceptions.ConnectTimeout):
      return f"did not accept a connection within the {self.connect_timeout:g} s connect timeout", True
    if isinstance(exc, requests.exceptions.ReadTimeout) or any(
        type(e).__name__ in ("ReadTimeoutError", "TimeoutError", "timeout") for e in chain):
      return f"did not answer within the {self.read_timeout:g} s read timeout", True
    if any(isinstance(e, ConnectionRefusedError) for e in chain):
      return "refused the connection", True
    if any(isinstance(e, (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError,
                          http.client.IncompleteRead)) for e in chain):
      return "closed the connection without a complete response", True
    if isinstance(exc, requests.exceptions.SSLError):
      return "failed the TLS handshake", True
    if isinstance(exc, requests.exceptions.ConnectionError):
      if any("Name or service not known" in str(e) or "nodename nor servname" in str(e) for e in chain):
        return "could not be resolved (unknown host name)", True
      return f"could not be reached ({type(exc).__name__})", True
    return f"request failed ({type(exc).__name__})", False

  @staticmethod
  def _error_detail(resp: requests.Response, key: str | None) -> str:
    """": message" from an error response (OpenAI's `{"error": {"message": ...}}` or the raw text), or ""."""
    try:
      text = _scrub(resp.text, key)
    except Exception:
      return ""
    message = text
    try:
      obj = json.loads(text)
      if isinstance(obj, dict):
        err = obj.get("error", obj.get("detail", obj.get("message")))
        if isinstance(err, dict):
          err = err.get("message", err)
        if err is not None:
          message = err if isinstance(err, str) else json.dumps(err)
    except ValueError:
      pass
    message = _excerpt(message)
    return f": {message}" if message else ""

  def _parse(self, start: float, attempts: int, resp: requests.Response, messages, key: str | None) -> ChatResult:
    status = resp.status_code
    where = f"tool endpoint {self.base_url}"
    try:
      body = resp.json()
    except ValueError:
      return self._failure(start, attempts, status, f"{where} returned a body that is not valid JSON "
                           f"(HTTP {status}, {len(resp.content)} bytes): {_excerpt(_scrub(resp.text, key))!r}", key=key)
    if not isinstance(body, dict):
      return self._failure(start, attempts, status,
                           f"{where} returned JSON that is not an object: {_excerpt(json.dumps(body))}", key=key)
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict) or not isinstance(
        choices[0].get("message"), dict):
      if body.get("error") is not None:
        err = body["error"]
        err = err.get("message", err) if isinstance(err, dict) else err
        reason = f"an error instead of a completion: {_excerpt(_scrub(str(err), key))}"
      elif not isinstance(choices, list) or not choices:
        reason = "a response without choices"
      else:
        reason = "a response whose first choice has no message"
      return self._failure(start, attempts, status, f"{where} returned {reason}", key=key)
    choice = choices[0]
    message = choice["message"]
    text = _message_text(message.get("content"))
    tool_calls = message.get("tool_calls") or []
    if not isinstance(tool_calls, list):
      tool_calls = []
    finish_reason = choice.get("finish_reason")

    warning, estimated = None, False
    usage = body.get("usage")
    prompt_tokens = completion_tokens = None
    if isinstance(usage, dict):
      p, c = usage.get("prompt_tokens"), usage.get("completion_tokens")
      if isinstance(p, (int, float)) and isinstance(c, (int, float)) and p >= 0 and c >= 0:
        prompt_tokens, completion_tokens = int(p), int(c)
    if prompt_tokens is None:
      count = self.count_tokens or approx_token_count
      prompt_text = "\n".join(_message_text(m.get("content")) for m in messages if isinstance(m, dict))
      completion_text = text + "".join(json.dumps(t) for t in tool_calls)
      prompt_tokens, completion_tokens = int(count(prompt_text)), int(count(completion_text))
      how = "with count_tokens" if self.count_tokens else "at 4 characters per token"
      warning = f"{where} returned no usage; token counts estimated {how}"
      estimated = True
    return ChatResult(
        text=text,
        tool_calls=tool_calls,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cost_usd=self.cost(prompt_tokens, completion_tokens),
        latency_s=time.perf_counter() - start,
        model=self.model,
        ok=True,
        error=None,
        attempts=attempts,
        warning=warning,
        finish_reason=finish_reason if isinstance(finish_reason, str) else None,
        status_code=status,
        usage_estimated=estimated,
    )

  def _failure(self, start: float, attempts: int, status: int | None, error: str, key: str | None = None) -> ChatResult:
    error = _scrub(error, key)
    log.info("%s", error)  # the caller decides how loud a failed tool call is; the record carries it
    return ChatResult(text="", tool_calls=[], prompt_tokens=0, completion_tokens=0, cost_usd=0.0,
                      latency_s=time.perf_counter() - start, model=self.model, ok=False, error=error,
                      attempts=attempts, status_code=status)

  # --- many calls ------------------------------------------------------------------------------------
  def chat_many(self, calls: Sequence[dict[str, Any] | Sequence[dict[str, Any]]],
                max_workers: int = 16) -> list[ChatResult]:
    """Runs `chat` for each item concurrently; results in input order.

    An item is either the keyword arguments of `chat` (a dict with at least "messages") or a message list.
    """
    return chat_many([(self, c) for c in calls], max_workers=max_workers)


def chat_many(calls: Sequence[tuple[ChatClient, dict[str, Any] | Sequence[dict[str, Any]]]],
              max_workers: int = 16) -> list[ChatResult]:
  """Runs `(client, chat kwargs or message list)` pairs concurrently on a thread pool; results in input order.

  Clients may differ (one rollout step fans out to several experts). `max_workers` bounds the concurrency;
  keep it at or below each client's `pool_size`, or connections beyond the pool are opened and dropped.
  """
  if not calls:
    return []
  if not isinstance(max_workers, int) or max_workers < 1:
    raise ClientConfigError(f"max_workers must be a positive integer, got {max_workers!r}")

  def run(item):
    client, spec = item
    kwargs = dict(spec) if isinstance(spec, dict) else {"messages": spec}
    return client.chat(**kwargs)

  workers = min(max_workers, len(calls))
  if workers == 1:
    return [run(item) for item in calls]
  with concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="chat") as pool:
    return list(pool.map(run, calls))
