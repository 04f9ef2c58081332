"""Calling the expert LLMs behind the catalog's aliases, shared by the QA and tau2 environments.

`ExpertClients` keeps one `ChatClient` per backend (endpoint, model, key variable, prices) for every episode of an
environment and turns each call into an `ExpertReply` that never raises for endpoint faults; `record_call` prices
a call (the backend's token prices, sandbox seconds, extra fees) into the ledger and returns the matching
`ToolCallRecord`. The small helpers below are used by both environments' tool results.

Missing `usage`. `ChatClient` estimates token counts when a server leaves them out. With
`missing_usage="error"` (default) such a call is treated as failed (reply discarded, error shown), but it is
still charged at the estimated tokens, so a broken endpoint never looks free to the cost term of the reward.
With `missing_usage="estimate"` the reply is used and the warning goes to the ledger record's `error` field
(with `ok=True`).
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from orchestra_jax.errors import UserError
from orchestra_jax.rollout.trajectory import ToolCallRecord
from orchestra_jax.tools.catalog import Backend
from orchestra_jax.tools.ledger import Ledger
from orchestra_jax.tools.llm_client import ChatClient, ChatResult

__all__ = ["ExpertClients", "ExpertReply", "QAEnvError", "MISSING_USAGE_MODES", "record_call", "strip_thinking",
           "as_arguments", "shorten"]

MISSING_USAGE_MODES = ("error", "estimate")


class QAEnvError(UserError, ValueError):
  """A QAEnvironment setting or task that cannot work; the message names the field.

  Tau2Environment and `ExpertClients` raise it for their settings too (it lives here, below both environments).
  """


# --- helpers shared by the environments ----------------------------------------------------------------
def strip_thinking(text: str) -> str:
  """The part of a reply after its last `</think>` (the whole text when there is none)."""
  return text.split("</think>")[-1] if "</think>" in text else text


def as_arguments(arguments: Any) -> dict[str, Any]:
  """A call's arguments as a dict for its record: a mapping as is, JSON-object text decoded, else `{"_raw": ...}`."""
  if isinstance(arguments, Mapping):
    return dict(arguments)
  if isinstance(arguments, str):
    try:
      value = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError:
      return {"_raw": arguments}
    return dict(value) if isinstance(value, Mapping) else {"_raw": arguments}
  return {} if arguments is None else {"_raw": arguments}


def shorten(text: str, limit: int = 120) -> str:
  """`text` on one line (whitespace runs collapsed), cut after `limit` characters with "..."; for messages."""
  text = " ".join(str(text).split())
  return text if len(text) <= limit else text[:limit] + "..."


# --- expert LLM calls ----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ExpertReply:
  """One expert call: the client's result, and why it is unusable (None: usable)."""

  result: ChatResult
  error: str | None
  warning: str | None = None  # usable but imperfect (token counts estimated, with missing_usage="estimate")

  @property
  def text(self) -> str:
    return self.result.text if self.error is None else ""


class ExpertClients:
  """One `ChatClient` per (endpoint, model, key variable, prices), shared by every episode (thread-safe).

  `client_options`: keyword arguments of `ChatClient` (connect_timeout, read_timeout, max_retries, backoff_s,
  retry_after_cap_s, pool_size, count_tokens). `chat_options`: keyword arguments of `ChatClient.chat` used for
  every call (max_tokens, temperature, stop, extra).
  """

  def __init__(self, client_options: Mapping[str, Any] | None = None,
               chat_options: Mapping[str, Any] | None = None, missing_usage: str = "error"):
    if missing_usage not in MISSING_USAGE_MODES:
      raise QAEnvError(f"missing_usage must be one of {', '.join(MISSING_USAGE_MODES)}, got {missing_usage!r}")
    self.client_options = dict(client_options or {})
    for key in ("base_url", "model", "api_key_env", "price_in_per_m", "price_out_per_m"):
      if key in self.client_options:
        raise QAEnvError(f"client_options.{key} comes from the catalog's backend; remove it")
    self.chat_options = dict(chat_options or {})
    bad = sorted(set(self.chat_options) - {"max_tokens", "temperature", "stop", "extra"})
    if bad:
      raise QAEnvError(f"unknown chat_options {bad}; allowed: max_tokens, temperature, stop, extra")
    self.missing_usage = missing_usage
    ChatClient("http://127.0.0.1:9", "probe", **self.client_options).close()  # bad options fail here, early
    self._clients: dict[tuple, ChatClient] = {}
    self._lock = threading.Lock()

  def client(self, backend: Backend) -> ChatClient:
    key = (backend.base_url, backend.model, backend.api_key_env, backend.price_in, backend.price_out)
    with self._lock:
      client = self._clients.get(key)
      if client is None:
        client = ChatClient(backend.base_url, backend.model, backend.api_key_env,
                            price_in_per_m=backend.price_in, price_out_per_m=backend.price_out,
                            **self.client_options)
        self._clients[key] = client
    return client

  def chat(self, backend: Backend, messages: Sequence[Mapping[str, Any]],
           tools: Sequence[Mapping[str, Any]] | None = None) -> ExpertReply:
    """One call; never raises for endpoint faults (see the module docstring for missing usage)."""
    result = self.client(backend).chat(list(messages), tools=tools, **self.chat_options)
    if not result.ok:
      return ExpertReply(result, result.error or "the call failed")
    if result.usage_estimated:
      if self.missing_usage == "error":
        return ExpertReply(result, f"tool endpoint {backend.base_url} returned no usage (token counts) for model "
                           f"{backend.model}; the reply was discarded and the call charged at an estimated "
                           f"{result.prompt_tokens}+{result.completion_tokens} tokens")
      return ExpertReply(result, None, warning=result.warning)
    return ExpertReply(result, None)

  def close(self) -> None:
    with self._lock:
      clients, self._clients = list(self._clients.values()), {}
    for c in clients:
      c.close()


def record_call(ledger: Ledger, rollout: Any, name: str, arguments: Any, *, content: str, error: str | None,
                latency_s: float, backend: Backend | None = None, alias: str | None = None,
                reply: ExpertReply | None = None, exec_s: float = 0.0, extra_cost_usd: float = 0.0,
                model: str | None = None) -> ToolCallRecord:
  """Writes one call to the ledger and returns the matching `ToolCallRecord` (same cost, tokens, error)."""
  prompt_tokens = reply.result.prompt_tokens if reply is not None else 0
  completion_tokens = reply.result.completion_tokens if reply is not None else 0
  ledger_error = error if error is not None else (reply.warning if reply is not None else None)
  rec = ledger.record_call(name, backend, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                           latency_s=max(0.0, latency_s), exec_s=max(0.0, exec_s), extra_cost_usd=extra_cost_usd,
                           ok=error is None, error=ledger_error, rollout=rollout, alias=alias,
                           model=model)
  return ToolCallRecord(name=name, arguments=as_arguments(arguments), alias=rec.alias, model=rec.model,
                        result=content, error=error, cost_usd=rec.cost_usd, latency_s=rec.latency_s,
                        tokens_in=prompt_tokens, tokens_out=completion_tokens)
