"""One rollout as tokens plus bookkeeping, and its split into per-turn training samples.

A `Trajectory` grows one token sequence the way the sampler saw it: `append_prompt`, then alternately
`append_generated` (one assistant turn) and `append_tool_response` (or any other non-generated ids).
`generated_mask` marks the model's own tokens and `logprobs` holds their sampling log-probs, so the trainer
needs nothing else to form PPO ratios.

Every assistant turn becomes its own training sample (docs/design.md section 5): its prompt is everything before
the turn, its response the turn's tokens. The reference QA loop does not grow a chat but rebuilds one prompt
from state each turn; for that mode pass `prompt_tokens=` to `append_generated`. The turn then keeps its own
prompt, only its generated ids go onto the running sequence, and `to_turn_samples` uses the recorded prompt.
Both modes may be mixed turn by turn.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from orchestra_jax.rollout.chat_format import safe_text
from orchestra_jax.rollout.tool_calls import ParsedTurn, ToolCall, ToolCallError

FORMAT_VERSION = 1


@dataclasses.dataclass
class ToolCallRecord:
  """An executed tool call: what was asked, what came back, what it cost."""

  name: str
  arguments: dict[str, Any]
  alias: str | None = None  # e.g. "search-1": the choice the orchestrator made
  model: str | None = None  # what the alias mapped to for this sample, e.g. "gpt-5"
  result: str = ""  # text returned to the orchestrator
  error: str | None = None  # why the call failed (the result then usually carries the same message)
  cost_usd: float = 0.0
  latency_s: float = 0.0
  tokens_in: int = 0  # prompt tokens of the expert model, if any
  tokens_out: int = 0  # completion tokens of the expert model, if any
  turn_index: int | None = None  # the assistant turn that made the call

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: Mapping[str, Any]) -> "ToolCallRecord":
    return cls(**d)


@dataclasses.dataclass
class Turn:
  """One assistant turn: `tokens[start:end]` of its trajectory, plus what it asked for."""

  start: int
  end: int  # exclusive
  finish_reason: str  # as the sampler reports it: "stop", "length", "tool_call", ...
  tool_calls: list[ToolCall] = dataclasses.field(default_factory=list)
  errors: list[ToolCallError] = dataclasses.field(default_factory=list)
  # Rebuild mode: the prompt this turn was sampled from, when it is not `tokens[:start]`.
  prompt_tokens: list[int] | None = None
  text: str | None = None  # decoded turn text, for inspection

  @property
  def num_tokens(self) -> int:
    return self.end - self.start

  @property
  def has_tool_call(self) -> bool:
    return bool(self.tool_calls)

  def to_dict(self) -> dict[str, Any]:
    return {"start": self.start, "end": self.end, "finish_reason": self.finish_reason,
            "tool_calls": [c.to_dict() for c in self.tool_calls], "errors": [e.to_dict() for e in self.errors],
            "prompt_tokens": self.prompt_tokens, "text": self.text}

  @classmethod
  def from_dict(cls, d: Mapping[str, Any]) -> "Turn":
    return cls(start=d["start"], end=d["end"], finish_reason=d["finish_reason"],
               tool_calls=[ToolCall.from_dict(c) for c in d.get("tool_calls", ())],
               errors=[ToolCallError.from_dict(e) for e in d.get("errors", ())],
               prompt_tokens=d.get("prompt_tokens"), text=d.get("text"))


@dataclasses.dataclass
class TurnSample:
  """One training sample: a turn's response with the context it was sampled from."""

  prompt_tokens: list[int]
  response_tokens: list[int]
  response_mask: list[int]  # 1 where the loss applies (tokens the policy sampled)
  old_logprobs: list[float]  # sampling log-probs, aligned with response_tokens (0.0 where the mask is 0)
  turn_index: int


def _ints(xs: Sequence[int]) -> list[int]:
  return [int(x) for x in xs]


@dataclasses.dataclass
class Trajectory:
  """One rollout row: the token sequence with masks, the turns, the tool calls and the outcome."""

  tokens: list[int] = dataclasses.field(default_factory=list)
  generated_mask: list[int] = dataclasses.field(default_factory=list)  # 1 = sampled by the policy
  logprobs: list[float] = dataclasses.field(default_factory=list)  # sampling log-prob; 0.0 where mask is 0
  turns: list[Turn] = dataclasses.field(default_factory=list)
  tool_calls: list[ToolCallRecord] = dataclasses.field(default_factory=list)
  final_answer: str | None = None  # None: the rollout never produced one (the reward filters drop it)
  finish_reason: str | None = None  # why the episode ended: "answer", "max_turns", "length", "error", ...
  extra_cost_usd: float = 0.0  # cost not tied to a recorded call: the orchestrator's own tokens, etc.
  extra_latency_s: float = 0.0
  metadata: dict[str, Any] = dataclasses.field(default_factory=dict)  # task id, preference vector, ...

  # --- building ----------------------------------------------------------------------------------------
  def _append(self, tokens: Sequence[int], mask: int, logprobs: Sequence[float] | None) -> tuple[int, int]:
    start = len(self.tokens)
    self.tokens.extend(_ints(tokens))
    self.generated_mask.extend([mask] * len(tokens))
    self.logprobs.extend([float(x) for x in logprobs] if logprobs is not None else [0.0] * len(tokens))
    return start, len(self.tokens)

  def append_prompt(self, tokens: Sequence[int]) -> None:
    """Context the policy did not sample (the initial prompt, or any other inserted ids)."""
    self._append(tokens, 0, None)

  def append_tool_response(self, tokens: Sequence[int]) -> None:
    """Ids between two assistant turns (see chat_format.tool_response_ids); never trained on."""
    self._append(tokens, 0, None)

  def append_generated(self, tokens: Sequence[int], logprobs: Sequence[float], finish_reason: str, *,
                       prompt_tokens: Sequence[int] | None = None, parsed: ParsedTurn | None = None,
                       text: str | None = None) -> Turn:
    """One assistant turn as sampled. `prompt_tokens`: the prompt it was sampled from, in rebuild mode.

    Returns the new Turn, so the caller can add validation errors to it.
    """
    if len(logprobs) != len(tokens):
      raise ValueError(f"{len(tokens)} generated tokens but {len(logprobs)} logprobs")
    lp = [float(x) for x in logprobs]
    if any(math.isnan(x) for x in lp):
      raise ValueError("NaN in sampling logprobs")
    start, end = self._append(tokens, 1, lp)
    turn = Turn(start=start, end=end, finish_reason=finish_reason,
                tool_calls=list(parsed.tool_calls) if parsed else [],
                errors=list(parsed.errors) if parsed else [],
                prompt_tokens=_ints(prompt_tokens) if prompt_tokens is not None else None, text=text)
    self.turns.append(turn)
    return turn

  def add_tool_call(self, record: ToolCallRecord) -> None:
    if record.turn_index is None and self.turns:
      record.turn_index = len(self.turns) - 1
    self.tool_calls.append(record)

  # --- totals ------------------------------------------------------------------------------------------
  @property
  def cost_usd(self) -> float:
    return sum(c.cost_usd for c in self.tool_calls) + self.extra_cost_usd

  @property
  def latency_s(self) -> float:
    return sum(c.latency_s for c in self.tool_calls) + self.extra_latency_s

  @property
  def num_generated_tokens(self) -> int:
    return sum(self.generated_mask)

  def tool_counts(self, by: str = "name") -> dict[str, int]:
    """Number of calls per tool name, or per alias with by="alias" (the n_t features of the reward)."""
    counts: dict[str, int] = {}
    for c in self.tool_calls:
      key = c.name if by == "name" else (c.alias if c.alias is not None else c.name)
      counts[key] = counts.get(key, 0) + 1
    return counts

  def check(self) -> None:
    """Raise if the parallel lists or the turn boundaries are inconsistent (e.g. after hand-editing JSON)."""
    n = len(self.tokens)
    if len(self.generated_mask) != n or len(self.logprobs) != n:
      raise ValueError(f"tokens/generated_mask/logprobs lengths differ: {n}, {len(self.generated_mask)}, "
                       f"{len(self.logprobs)}")
    prev = 0
    for i, t in enumerate(self.turns):
      if not prev <= t.start <= t.end <= n:
        raise ValueError(f"turn {i} spans [{t.start}, {t.end}) out of order or past {n} tokens")
      prev = t.end

  # --- training samples --------------------------------------------------------------------------------
  def to_turn_samples(self, require_tool_call: bool = False) -> list[TurnSample]:
    """One sample per assistant turn: prompt = the turn's context, response = its tokens.

    Turns with no tokens are skipped; `require_tool_call` also skips turns without a parsed tool call
    (the docs/design.md filter). `turn_index` is the turn's position in `turns`.
    """
    samples = []
    for i, t in enumerate(self.turns):
      if t.start == t.end or (require_tool_call and not t.tool_calls):
        continue
      prompt = list(t.prompt_tokens) if t.prompt_tokens is not None else self.tokens[:t.start]
      mask = self.generated_mask[t.start:t.end]
      lp = [x if m else 0.0 for x, m in zip(self.logprobs[t.start:t.end], mask)]
      samples.append(TurnSample(prompt_tokens=prompt, response_tokens=self.tokens[t.start:t.end],
                                response_mask=list(mask), old_logprobs=lp, turn_index=i))
    return samples

  # --- serialisation -----------------------------------------------------------------------------------
  def to_dict(self) -> dict[str, Any]:
    return {"format_version": FORMAT_VERSION, "tokens": list(self.tokens),
            "generated_mask": list(self.generated_mask), "logprobs": list(self.logprobs),
            "turns": [t.to_dict() for t in self.turns], "tool_calls": [c.to_dict() for c in self.tool_calls],
            "final_answer": self.final_answer, "finish_reason": self.finish_reason,
            "extra_cost_usd": self.extra_cost_usd, "extra_latency_s": self.extra_latency_s,
            "metadata": self.metadata}

  @classmethod
  def from_dict(cls, d: Mapping[str, Any]) -> "Trajectory":
    version = d.get("format_version", FORMAT_VERSION)
    if version != FORMAT_VERSION:
      raise ValueError(f"trajectory format_version {version} is not {FORMAT_VERSION}")
    traj = cls(tokens=_ints(d["tokens"]), generated_mask=_ints(d["generated_mask"]),
               logprobs=[float(x) for x in d["logprobs"]], turns=[Turn.from_dict(t) for t in d.get("turns", ())],
               tool_calls=[ToolCallRecord.from_dict(c) for c in d.get("tool_calls", ())],
               final_answer=d.get("final_answer"), finish_reason=d.get("finish_reason"),
               extra_cost_usd=float(d.get("extra_cost_usd", 0.0)),
               extra_latency_s=float(d.get("extra_latency_s", 0.0)), metadata=dict(d.get("metadata", {})))
    traj.check()
    return traj

  def to_json(self) -> str:
    """One line of JSON (floats written with repr, so the round trip is exact; -inf log-probs survive).

    Lone surrogates (from tool arguments or replies) become U+FFFD, so the line always encodes as UTF-8."""
    return safe_text(json.dumps(self.to_dict(), ensure_ascii=False, separators=(",", ":")))

  @classmethod
  def from_json(cls, s: str) -> "Trajectory":
    return cls.from_dict(json.loads(s))
