"""The cost ledger: every tool call of a rollout with its tokens, dollars, seconds and outcome.

Cost of a rollout (docs/design.md section 4) = sum over tool calls of
    p_in * prompt_tokens / 1e6 + p_out * completion_tokens / 1e6     (the LLM behind the alias)
  + 8.3e-6 $/s * code execution seconds                            (enhance_reasoning's sandbox run)
  + extra_cost_usd                                                 (e.g. a paid search API)
plus the orchestrator's own tokens at its price (0.2 $/M by default, `record_orchestrator`).
Latency of a rollout = summed wall time of its tool calls (orchestrator generation is not a tool call).

One `Ledger` may serve a whole batch: calls of different rows run on a thread pool, so recording is
locked, and each record may carry a `rollout` key that `totals(rollout)` / `totals_by_rollout()` group on.
`totals()` is the dict the reward reads: cost_usd, latency_s, calls_per_tool, calls_per_alias, ...
"""

from __future__ import annotations

import collections
import dataclasses
import json
import threading
from typing import Any, Hashable, Iterable

from orchestra_jax.tools.catalog import Backend, llm_cost
from orchestra_jax.tools.sandbox import CODE_EXEC_USD_PER_S

ORCHESTRATOR_USD_PER_M = 0.2  # Qwen3-8B orchestrator tokens, input and output


@dataclasses.dataclass(frozen=True)
class CallRecord:
  """One orchestrator tool call. `cost_usd` = llm_cost_usd + exec_cost_usd + extra_cost_usd."""

  tool: str  # orchestrator-facing function (search, enhance_reasoning, answer, call_expert, a domain tool)
  alias: str | None = None
  model: str | None = None
  prompt_tokens: int = 0
  completion_tokens: int = 0
  price_in: float = 0.0  # USD per million input tokens used for this call
  price_out: float = 0.0
  llm_cost_usd: float = 0.0
  exec_s: float = 0.0  # code execution wall seconds
  exec_cost_usd: float = 0.0
  extra_cost_usd: float = 0.0
  cost_usd: float = 0.0
  latency_s: float = 0.0  # wall time of the whole call
  ok: bool = True
  error: str | None = None
  rollout: Hashable | None = None

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


class Ledger:
  """Thread-safe record of tool calls and orchestrator tokens, for one rollout or a batch of them."""

  def __init__(self, orchestrator_price_in: float = ORCHESTRATOR_USD_PER_M,
               orchestrator_price_out: float = ORCHESTRATOR_USD_PER_M, code_usd_per_s: float = CODE_EXEC_USD_PER_S):
    self.orchestrator_price_in = float(orchestrator_price_in)
    self.orchestrator_price_out = float(orchestrator_price_out)
    self.code_usd_per_s = float(code_usd_per_s)
    self._lock = threading.Lock()
    self._calls: list[CallRecord] = []
    self._orch: dict[Hashable | None, list[int]] = collections.defaultdict(lambda: [0, 0])  # [prompt, completion]

  @classmethod
  def for_catalog(cls, catalog) -> "Ledger":
    """A ledger with the orchestrator and code-execution prices of a `Catalog`."""
    return cls(catalog.orchestrator_price_in, catalog.orchestrator_price_out, catalog.code_execution_usd_per_s)

  # --- recording --------------------------------------------------------------------------------
  def record_call(self, tool: str, backend: Backend | None = None, *, prompt_tokens: int = 0,
                  completion_tokens: int = 0, latency_s: float = 0.0, exec_s: float = 0.0,
                  extra_cost_usd: float = 0.0, ok: bool = True, error: str | None = None,
                  rollout: Hashable | None = None, alias: str | None = None, model: str | None = None,
                  price_in: float | None = None, price_out: float | None = None) -> CallRecord:
    """Record one tool call. Prices come from `backend` unless given; alias/model likewise."""
    for name, value in (("prompt_tokens", prompt_tokens), ("completion_tokens", completion_tokens)):
      if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    for name, value in (("latency_s", latency_s), ("exec_s", exec_s), ("extra_cost_usd", extra_cost_usd)):
      if not value >= 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    if backend is not None:
      alias = backend.alias if alias is None else alias
      model = backend.model if model is None else model
      price_in = backend.price_in if price_in is None else price_in
      price_out = backend.price_out if price_out is None else price_out
    price_in, price_out = float(price_in or 0.0), float(price_out or 0.0)
    llm = llm_cost(price_in, price_out, prompt_tokens, completion_tokens)
    exec_cost = self.code_usd_per_s * float(exec_s)
    rec = CallRecord(tool=tool, alias=alias, model=model, prompt_tokens=prompt_tokens,
                     completion_tokens=completion_tokens, price_in=price_in, price_out=price_out, llm_cost_usd=llm,
                     exec_s=float(exec_s), exec_cost_usd=exec_cost, extra_cost_usd=float(extra_cost_usd),
                     cost_usd=llm + exec_cost + float(extra_cost_usd), latency_s=float(latency_s), ok=bool(ok),
                     error=None if error is None else str(error), rollout=rollout)
    with self._lock:
      self._calls.append(rec)
    return rec

  def record_orchestrator(self, prompt_tokens: int, completion_tokens: int, rollout: Hashable | None = None) -> float:
    """Add the orchestrator's own tokens of one turn; returns their cost in USD."""
    for name, value in (("prompt_tokens", prompt_tokens), ("completion_tokens", completion_tokens)):
      if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    with self._lock:
      counts = self._orch[rollout]
      counts[0] += prompt_tokens
      counts[1] += completion_tokens
    return llm_cost(self.orchestrator_price_in, self.orchestrator_price_out, prompt_tokens, completion_tokens)

  # --- reading ----------------------------------------------------------------------------------
  @property
  def calls(self) -> list[CallRecord]:
    with self._lock:
      return list(self._calls)

  def rollouts(self) -> list[Hashable | None]:
    """Rollout keys in first-seen order."""
    with self._lock:
      keys = [c.rollout for c in self._calls] + list(self._orch)
    return list(dict.fromkeys(keys))

  def totals(self, rollout: Any = ...) -> dict[str, Any]:
    """Totals over every record (default) or over one rollout key (None is a key too)."""
    with self._lock:
      if rollout is ...:
        calls = list(self._calls)
        orch = [sum(v[0] for v in self._orch.values()), sum(v[1] for v in self._orch.values())]
      else:
        calls = [c for c in self._calls if c.rollout == rollout]
        orch = list(self._orch.get(rollout, [0, 0]))
    return self._summarise(calls, orch)

  def totals_by_rollout(self) -> dict[Hashable | None, dict[str, Any]]:
    return {key: self.totals(key) for key in self.rollouts()}

  def _summarise(self, calls: Iterable[CallRecord], orch: list[int]) -> dict[str, Any]:
    calls = list(calls)
    orch_cost = llm_cost(self.orchestrator_price_in, self.orchestrator_price_out, orch[0], orch[1])
    tool_cost = sum(c.cost_usd for c in calls)
    per_tool: dict[str, int] = collections.Counter(c.tool for c in calls)
    per_alias: dict[str, int] = collections.Counter(c.alias for c in calls if c.alias is not None)
    per_model: dict[str, int] = collections.Counter(c.model for c in calls if c.model is not None)
    return {
        "cost_usd": tool_cost + orch_cost,
        "tool_cost_usd": tool_cost,
        "llm_cost_usd": sum(c.llm_cost_usd for c in calls),
        "exec_cost_usd": sum(c.exec_cost_usd for c in calls),
        "extra_cost_usd": sum(c.extra_cost_usd for c in calls),
        "orchestrator_cost_usd": orch_cost,
        "latency_s": sum(c.latency_s for c in calls),
        "exec_s": sum(c.exec_s for c in calls),
        "num_calls": len(calls),
        "num_errors": sum(not c.ok for c in calls),
        "calls_per_tool": dict(per_tool),
        "calls_per_alias": dict(per_alias),
        "calls_per_model": dict(per_model),
        "prompt_tokens": sum(c.prompt_tokens for c in calls),
        "completion_tokens": sum(c.completion_tokens for c in calls),
        "orchestrator_prompt_tokens": orch[0],
        "orchestrator_completion_tokens": orch[1],
    }

  # --- (de)serialisation ------------------------------------------------------------------------
  def to_dict(self) -> dict[str, Any]:
    """JSON-serialisable form; rollout keys must be JSON-able (str / int / None) for `to_json`."""
    with self._lock:
      return {
          "orchestrator_price_in": self.orchestrator_price_in,
          "orchestrator_price_out": self.orchestrator_price_out,
          "code_usd_per_s": self.code_usd_per_s,
          "calls": [c.to_dict() for c in self._calls],
          "orchestrator_tokens": [{"rollout": k, "prompt_tokens": v[0], "completion_tokens": v[1]}
                                  for k, v in self._orch.items()],
      }

  def to_json(self, **kwargs: Any) -> str:
    return json.dumps(self.to_dict(), **kwargs)

  @classmethod
  def from_dict(cls, data: dict[str, Any]) -> "Ledger":
    ledger = cls(data["orchestrator_price_in"], data["orchestrator_price_out"], data["code_usd_per_s"])
    ledger._calls = [CallRecord(**c) for c in data["calls"]]
    for entry in data.get("orchestrator_tokens", []):
      ledger._orch[entry["rollout"]] = [entry["prompt_tokens"], entry["completion_tokens"]]
    return ledger

  @classmethod
  def from_json(cls, text: str) -> "Ledger":
    return cls.from_dict(json.loads(text))

  def __len__(self) -> int:
    with self._lock:
      return len(self._calls)
