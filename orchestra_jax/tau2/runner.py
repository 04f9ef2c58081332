"""A simple episode loop (agent <-> environment tools <-> user), for tests and offline evaluation.

`run_episode(env, agent_step, user, max_turns)`: `agent_step(messages)` is called with the conversation so far
and returns one of

* a tool call: `ToolCallRequest(name, arguments)` or a dict `{"name": ..., "arguments": ...}` (or a list of
  them, run in order); each runs on `env` and its result is appended as a `tool` message;
* a message to the user: a `str` or `AgentMessage(content)`; the user then replies
  (`AgentMessage(content, stop=True)` ends the episode after the message instead);
* `None`: the agent ends the episode.

Conversation format (OpenAI-style dicts): `{"role": "user", "content"}`, `{"role": "assistant", "content",
"tool_calls"?: [{"id", "name", "arguments"}]}`, `{"role": "tool", "tool_call_id", "name", "content"}`. The
conversation starts from the task's `initial_state.message_history` if any, else with the agent's greeting
(`greeting`, tau2's "Hi! How can I help you today?"; None for none) followed by the user's first message.

Termination reasons: "user_stop" (the user said a stop token: ###STOP###, ###TRANSFER### or ###OUT-OF-SCOPE###,
see `EpisodeResult.stop_token`), "agent_stop", "max_turns" (`max_turns` agent steps without an end),
"agent_error" / "user_error" (the callable raised; the message is in `EpisodeResult.error`). As in tau2, only
the first two count as a clean end for grading (`evaluation.evaluate(..., termination_reason=...)`).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from orchestra_jax.tau2.domain import Environment, Task
from orchestra_jax.tau2.evaluation import evaluate
from orchestra_jax.tau2.user import UserSimulator, stop_token

__all__ = ["ToolCallRequest", "AgentMessage", "EpisodeResult", "run_episode", "gold_agent", "evaluate_episode",
           "DEFAULT_GREETING"]

DEFAULT_GREETING = "Hi! How can I help you today?"


@dataclasses.dataclass(frozen=True)
class ToolCallRequest:
  name: str
  arguments: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  id: str | None = None


@dataclasses.dataclass(frozen=True)
class AgentMessage:
  content: str
  stop: bool = False


@dataclasses.dataclass
class EpisodeResult:
  messages: list[dict[str, Any]]
  termination_reason: str
  num_agent_steps: int
  stop_token: str | None = None
  error: str | None = None

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


AgentStep = Callable[[list[dict[str, Any]]], Any]


def _as_calls(out: Any) -> list[ToolCallRequest] | None:
  if isinstance(out, ToolCallRequest):
    return [out]
  if isinstance(out, Mapping) and "name" in out:
    return [ToolCallRequest(out["name"], out.get("arguments") or {}, out.get("id"))]
  if isinstance(out, (list, tuple)) and out and all(_as_calls(x) for x in out):
    return [c for x in out for c in _as_calls(x)]
  return None


def run_episode(env: Environment, agent_step: AgentStep, user: UserSimulator, max_turns: int = 30,
                greeting: str | None = DEFAULT_GREETING) -> EpisodeResult:
  """Run one conversation; see the module docstring."""
  messages: list[dict[str, Any]] = [dict(m) for m in env.initial_messages]
  steps = 0

  def user_turn() -> EpisodeResult | None:
    try:
      text = user.respond(messages)
    except Exception as e:
      return EpisodeResult(messages, "user_error", steps, error=f"{type(e).__name__}: {e}")
    messages.append({"role": "user", "content": text})
    token = stop_token(text)
    if token is not None:
      return EpisodeResult(messages, "user_stop", steps, stop_token=token)
    return None

  if not messages:
    if greeting:
      messages.append({"role": "assistant", "content": greeting})
    end = user_turn()
    if end is not None:
      return end
  elif messages[-1].get("role") == "assistant" and not messages[-1].get("tool_calls"):
    end = user_turn()
    if end is not None:
      return end

  while steps < max_turns:
    try:
      out = agent_step(messages)
    except Exception as e:
      return EpisodeResult(messages, "agent_error", steps, error=f"{type(e).__name__}: {e}")
    steps += 1
    if out is None:
      return EpisodeResult(messages, "agent_stop", steps)
    calls = _as_calls(out)
    if calls is not None:
      entries = []
      for i, call in enumerate(calls):
        entries.append({"id": call.id or f"call_{steps}_{i}", "name": call.name, "arguments": call.arguments})
      messages.append({"role": "assistant", "content": None, "tool_calls": entries})
      for entry in entries:
        result = env.call(entry["name"], entry["arguments"])
        messages.append({"role": "tool", "tool_call_id": entry["id"], "name": entry["name"], "content": result})
      continue
    if isinstance(out, str):
      out = AgentMessage(out)
    if not isinstance(out, AgentMessage):
      return EpisodeResult(messages, "agent_error", steps,
                           error=f"agent_step returned {type(out).__name__}, expected a tool call, a message or None")
    messages.append({"role": "assistant", "content": out.content})
    if out.stop:
      return EpisodeResult(messages, "agent_stop", steps)
    end = user_turn()
    if end is not None:
      return end
  return EpisodeResult(messages, "max_turns", steps)


def gold_agent(task: Task, final_message: str | None = None) -> AgentStep:
  """An agent that performs the task's gold actions in order, then tells the user every communicate_info
  string (or `final_message`), then ends."""
  actions = [a for a in task.gold_actions if a.requestor == "assistant"]
  infos = list(task.evaluation_criteria.communicate_info)
  if final_message is None:
    final_message = "Done." + (" " + " ".join(infos) if infos else "")
  state = {"next": 0, "said": False}

  def step(messages):
    if state["next"] < len(actions):
      action = actions[state["next"]]
      state["next"] += 1
      return ToolCallRequest(action.name, copy.deepcopy(dict(action.arguments)))
    if not state["said"]:
      state["said"] = True
      return AgentMessage(final_message)
    return None

  return step


def evaluate_episode(env: Environment, result: EpisodeResult, **kwargs):
  """`evaluation.evaluate` on an episode's messages and termination reason."""
  return evaluate(env, result.messages, termination_reason=result.termination_reason, **kwargs)
