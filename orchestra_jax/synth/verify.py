"""Verification of generated tasks: the step the reference pipeline lacks.

A generated task is kept only if, replayed on a fresh copy of the generated database:

1. it parses as a tau2 task and has at least one gold action, each calling a tool the domain has (on the
   assistant side);
2. its initial state applies and every gold action executes without an error (no missing row, no bad
   argument, no unknown tool);
3. when the task requires a write (it says so, or it calls a write tool) the database hash changes;
4. every `communicate_info` string occurs (case-insensitively, commas ignored, as tau2 grades it) in the result
   of some gold action, so the agent can actually learn what it must say.

`verify_task` returns a `Verdict` saying why a task fails; the pipeline drops failing tasks and counts them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from orchestra_jax.tau2.domain import Domain, Task
from orchestra_jax.tau2.records import canonical_json

__all__ = ["Verdict", "verify_task", "action_signature"]


@dataclasses.dataclass
class Verdict:
  ok: bool
  reason: str | None = None
  db_changed: bool = False
  calls_write_tool: bool = False
  results: list[str] = dataclasses.field(default_factory=list)
  initial_hash: str | None = None
  final_hash: str | None = None


def _norm(text: str) -> str:
  return text.lower().replace(",", "")


def action_signature(task_json: Mapping[str, Any]) -> str:
  """A canonical string of a task's gold actions (for spotting duplicate tasks)."""
  actions = (task_json.get("evaluation_criteria") or {}).get("actions") or []
  return canonical_json([[a.get("name"), a.get("arguments") or {}] for a in actions if isinstance(a, Mapping)])


def verify_task(domain: Domain, task_json: Mapping[str, Any], *, requires_write: bool | None = None,
                check_communicate: bool = True) -> Verdict:
  """Replay the task's gold actions on a fresh environment of `domain`; see the module docstring.
  `requires_write`: whether the task claims to change the database (None: only if it calls a write tool)."""
  try:
    task = Task.from_json(dict(task_json), domain.name)
  except (KeyError, TypeError, ValueError, AttributeError) as e:
    return Verdict(False, f"malformed task: {type(e).__name__}: {e}")
  actions = task.gold_actions
  if not actions:
    return Verdict(False, "the task has no gold actions")
  tools = set(domain.tool_names)
  writes = domain.write_tools()
  for i, a in enumerate(actions):
    if a.requestor != "assistant":
      return Verdict(False, f"gold action {i} ({a.name}) is requested by {a.requestor!r}; only assistant actions "
                     "are supported")
    if a.name not in tools:
      return Verdict(False, f"gold action {i} calls unknown tool {a.name!r}")
  calls_write = any(a.name in writes for a in actions)
  try:
    env = domain.new_episode(task)
  except Exception as e:  # a bad initial_state: merge errors, failing initialization actions
    return Verdict(False, f"initial_state does not apply: {type(e).__name__}: {e}", calls_write_tool=calls_write)
  initial = env.db_hash()
  results = []
  for i, a in enumerate(actions):
    record = env.execute(a.name, dict(a.arguments), source="gold")
    results.append(record.result)
    if record.error:
      return Verdict(False, f"gold action {i} ({a.name}) failed: {record.result}", calls_write_tool=calls_write,
                     results=results, initial_hash=initial)
  final = env.db_hash()
  verdict = Verdict(True, None, db_changed=final != initial, calls_write_tool=calls_write, results=results,
                    initial_hash=initial, final_hash=final)
  needs_write = calls_write if requires_write is None else (requires_write or calls_write)
  if needs_write and not verdict.db_changed:
    verdict.ok = False
    verdict.reason = ("the task requires a write but its gold actions leave the database unchanged"
                      if requires_write else "its write actions leave the database unchanged")
    return verdict
  if check_communicate:
    texts = [_norm(r) for r in results]
    for info in task.evaluation_criteria.communicate_info:
      if not any(_norm(info) in t for t in texts):
        verdict.ok = False
        verdict.reason = f"communicate_info {info!r} does not occur in any gold action's result"
        return verdict
  return verdict
