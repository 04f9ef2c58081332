"""Grading a tau2 episode, and pass^k.

`evaluate(env, messages)` scores the components named in the task's `reward_basis` (tau2's default is
`("DB", "COMMUNICATE")`, which every shipped airline and retail task uses) and multiplies them:

* DB: the gold actions are replayed on a fresh copy of the database (same initial state); the component is 1.0
  when its canonical sha256 equals the agent environment's `db_hash()`, else 0.0. The gold hash is cached per
  task.
* COMMUNICATE: every `communicate_info` string must occur, case-insensitively and with commas ignored on both
  sides ("1,000" matches "1000"), in some assistant message content addressed to the user. No strings: 1.0.
* ACTION: every gold action must have been called by the agent with equal arguments (only `compare_args`
  when the action lists them; `[]` means the name alone).
* ENV_ASSERTION: every `env_assertions` check of the domain's toolkit, run on the agent's database, must
  return its `assert_value`.
* NL_ASSERTION: needs an LLM judge: `judge(messages, nl_assertions) -> list[bool] | float`. Without one,
  `on_missing_judge` decides: "error" (default) raises `MissingJudgeError`; "skip" leaves the component out
  of the product (reported in `RewardInfo.skipped`; the reward is then an upper bound); "zero" scores it 0.
  No shipped airline or retail task has NL_ASSERTION in its reward basis.

As in tau2, an episode that did not end cleanly (`termination_reason` given and not one of "user_stop",
"agent_stop") scores 0 whatever its components say.

Messages are OpenAI-style dicts: `{"role": "user"|"assistant"|"tool"|"system", "content": ...}`; assistant
messages may carry `tool_calls`. Only assistant `content` counts as said to the user.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from orchestra_jax.tau2.domain import Environment, Task

__all__ = ["RewardInfo", "MissingJudgeError", "evaluate", "communicated", "pass_hat_k", "pass_hat_k_tasks",
           "CLEAN_TERMINATIONS", "SUCCESS_THRESHOLD"]

CLEAN_TERMINATIONS = frozenset({"user_stop", "agent_stop"})
SUCCESS_THRESHOLD = 1.0 - 1e-6  # a trial counts as a success for pass^k when reward >= this

Judge = Callable[[Sequence[Mapping[str, Any]], Sequence[str]], Any]


class MissingJudgeError(ValueError):
  """NL_ASSERTION is in the reward basis but no judge was given (and on_missing_judge='error')."""


@dataclasses.dataclass
class RewardInfo:
  """The reward and how it was made. `components`: every component computed (in the basis or not), value
  in [0, 1] or None when it could not be computed; `skipped`: basis components left out of the product."""

  reward: float
  reward_basis: tuple[str, ...]
  components: dict[str, float | None]
  details: dict[str, Any]
  skipped: tuple[str, ...] = ()
  note: str | None = None

  @property
  def success(self) -> bool:
    return self.reward >= SUCCESS_THRESHOLD

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


def _norm(text: str) -> str:
  return text.lower().replace(",", "")


def _agent_texts(messages: Sequence[Mapping[str, Any]]) -> list[str]:
  out = []
  for m in messages:
    if m.get("role") == "assistant":
      content = m.get("content")
      if isinstance(content, list):  # OpenAI content parts
        content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
      if isinstance(content, str) and content:
        out.append(content)
  return out


def communicated(messages: Sequence[Mapping[str, Any]], infos: Sequence[str]) -> dict[str, bool]:
  """For each string, whether an assistant message contains it (case-insensitive, commas ignored)."""
  texts = [_norm(t) for t in _agent_texts(messages)]
  return {info: any(_norm(info) in t for t in texts) for info in infos}


def _action_matches(action, name: str, arguments: Any) -> bool:
  if name != action.name or not isinstance(arguments, Mapping):
    return False
  keys = action.compare_args if action.compare_args is not None else tuple(action.arguments)
  return all(k in arguments and arguments[k] == action.arguments.get(k) for k in keys)


def evaluate(env: Environment, messages: Sequence[Mapping[str, Any]] = (), *, task: Task | None = None,
             termination_reason: str | None = None, judge: Judge | None = None,
             on_missing_judge: str = "error") -> RewardInfo:
  """Score an episode: `env` is the agent's environment after the conversation `messages`. See the module
  docstring."""
  if on_missing_judge not in ("error", "skip", "zero"):
    raise ValueError(f"on_missing_judge must be 'error', 'skip' or 'zero', got {on_missing_judge!r}")
  task = task or env.task
  if task is None:
    raise ValueError("evaluate needs a task (the environment was created without one)")
  crit = task.evaluation_criteria
  basis = tuple(crit.reward_basis)
  unknown = set(basis) - {"DB", "COMMUNICATE", "ACTION", "ENV_ASSERTION", "NL_ASSERTION"}
  if unknown:
    raise ValueError(f"task {task.id}: unknown reward_basis entries {sorted(unknown)}")
  components: dict[str, float | None] = {}
  details: dict[str, Any] = {}
  skipped: list[str] = []

  # DB
  gold_hash, gold_errors = env.domain.gold_info(task)
  agent_hash = env.db_hash()
  components["DB"] = float(agent_hash == gold_hash)
  details["db"] = {"agent_hash": agent_hash, "gold_hash": gold_hash, "gold_errors": list(gold_errors)}

  # COMMUNICATE
  found = communicated(messages, crit.communicate_info)
  components["COMMUNICATE"] = float(all(found.values()))
  details["communicate"] = found

  # ACTION
  calls = env.agent_tool_calls
  matched = [any(_action_matches(a, c.name, c.arguments) for c in calls) for a in crit.actions]
  components["ACTION"] = float(all(matched))
  details["actions"] = [{"name": a.name, "action_id": a.action_id, "matched": m} for a, m in zip(crit.actions, matched)]

  # ENV_ASSERTION
  if crit.env_assertions or "ENV_ASSERTION" in basis:
    results = []
    for a in crit.env_assertions:
      if a.env_type != "assistant":
        raise NotImplementedError(f"task {task.id}: user-side env assertion {a.func_name}")
      ok = env.run_assertion(a.func_name, a.arguments) == a.assert_value
      results.append({"func_name": a.func_name, "arguments": dict(a.arguments), "ok": ok})
    components["ENV_ASSERTION"] = float(all(r["ok"] for r in results))
    details["env_assertions"] = results

  # NL_ASSERTION
  if "NL_ASSERTION" in basis:
    if judge is not None:
      verdict = judge(messages, list(crit.nl_assertions))
      if isinstance(verdict, (int, float)) and not isinstance(verdict, bool):
        score = float(verdict)
      else:
        verdict = [bool(v) for v in verdict]
        if len(verdict) != len(crit.nl_assertions):
          raise ValueError(f"judge returned {len(verdict)} verdicts for {len(crit.nl_assertions)} assertions")
        score = float(all(verdict))
      components["NL_ASSERTION"] = score
      details["nl_assertions"] = {"assertions": list(crit.nl_assertions), "verdict": verdict}
    elif on_missing_judge == "error":
      raise MissingJudgeError(f"task {task.id}: NL_ASSERTION is in the reward basis; pass judge= "
                              "(or on_missing_judge='skip' / 'zero')")
    elif on_missing_judge == "zero":
      components["NL_ASSERTION"] = 0.0
    else:
      components["NL_ASSERTION"] = None
      skipped.append("NL_ASSERTION")

  reward = 1.0
  for name in basis:
    value = components.get(name)
    if value is not None:
      reward *= value
  note = None
  if termination_reason is not None and termination_reason not in CLEAN_TERMINATIONS:
    reward = 0.0
    note = f"episode ended with {termination_reason!r}: reward 0"
  return RewardInfo(reward=reward, reward_basis=basis, components=components, details=details,
                    skipped=tuple(skipped), note=note)


# --- pass^k -------------------------------------------------------------------------------------------------
def pass_hat_k(num_trials: int, num_successes: int, k: int) -> float:
  """pass^k = C(c, k) / C(n, k): the chance that k trials drawn without replacement from n all succeeded."""
  if not 0 <= num_successes <= num_trials:
    raise ValueError(f"need 0 <= successes <= trials, got {num_successes} of {num_trials}")
  if not 1 <= k <= num_trials:
    raise ValueError(f"need 1 <= k <= trials ({num_trials}), got k={k}")
  return math.comb(num_successes, k) / math.comb(num_trials, k)


def pass_hat_k_tasks(rewards: Mapping[str, Sequence[float | bool]], k: int) -> float:
  """Mean pass^k over tasks; `rewards`: task id -> the rewards (or success flags) of its n >= k trials."""
  if not rewards:
    raise ValueError("no tasks")
  total = 0.0
  for task_id, trials in rewards.items():
    successes = sum(1 for r in trials if float(r) >= SUCCESS_THRESHOLD)
    try:
      total += pass_hat_k(len(trials), successes, k)
    except ValueError as e:
      raise ValueError(f"task {task_id}: {e}") from None
  return total / len(rewards)
