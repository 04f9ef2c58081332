"""The interface between the agent loop and tools: `ToolEnvironment` makes one `Episode` per rollout row.

The agent loop renders `Episode.messages()` with `Episode.tools()`, samples an assistant turn, parses its tool
calls and hands each valid call to `Episode.call` on a worker thread (rows run their tools concurrently while
other rows keep decoding). Malformed calls never reach the episode: the loop answers them with the parser's
error text. An episode ends when a call returns `done=True` (an answer / finish tool), or at the loop's turn and
token limits.

`FunctionEnvironment` is the smallest implementation: plain Python functions as tools, for tests and demos.
Real environments (priced LLM tools, the sandbox, tau2 domains) live in `orchestra_jax.tools` and
`orchestra_jax.tau2`.
"""

from __future__ import annotations

import abc
import dataclasses
import time
from typing import Any, Callable

from orchestra_jax.rollout.tool_calls import ToolCall
from orchestra_jax.rollout.trajectory import ToolCallRecord


@dataclasses.dataclass
class ToolResult:
  """What one tool call returns to the loop."""

  content: str  # shown to the model inside <tool_response>
  done: bool = False  # the episode ends after this call (answer / finish)
  final_answer: str | None = None
  record: ToolCallRecord | None = None  # cost, latency, tokens, alias, error: for the ledger and the reward


class Episode(abc.ABC):
  """One task's tool state for one rollout row. `call` may block on I/O; it runs on a worker thread."""

  @abc.abstractmethod
  def messages(self) -> list[dict[str, Any]]:
    """The opening chat messages (system + user)."""

  @abc.abstractmethod
  def tools(self) -> list[dict[str, Any]]:
    """OpenAI-style tool schemas shown to the model."""

  @abc.abstractmethod
  def call(self, call: ToolCall) -> ToolResult:
    """Runs one parsed tool call. Must not raise for bad arguments: return an error message as content."""

  def rebuild_messages(self) -> list[dict[str, Any]]:
    """The reference's 'rebuild the prompt from state each turn' mode (docs/design.md section 3).

    Environments that support it return one fresh prompt summarising everything so far; the default keeps the
    opening messages (so the mode still runs, with the history dropped).
    """
    return self.messages()

  def close(self) -> None:
    """Releases resources (sandbox dirs, sessions)."""


class ToolEnvironment(abc.ABC):
  @abc.abstractmethod
  def new_episode(self, task: dict[str, Any], rollout_id: str) -> Episode:
    """A fresh episode for `task`; rollouts of the same task never share mutable state."""


# --- in-process tools ----------------------------------------------------------------------------------

def function_schema(name: str, description: str, params: dict[str, str], required: list[str] | None = None):
  """An OpenAI function-tool schema with string-typed (or given JSON type) parameters."""
  return {"type": "function", "function": {
      "name": name, "description": description,
      "parameters": {"type": "object", "properties": {k: {"type": t} for k, t in params.items()},
                     "required": list(params) if required is None else required}}}


class FunctionEpisode(Episode):
  def __init__(self, env: "FunctionEnvironment", task: dict[str, Any]):
    self._env, self._task = env, task
    self.history: list[tuple[str, dict, str]] = []

  def messages(self):
    msgs = [{"role": "system", "content": self._env.system_prompt}] if self._env.system_prompt else []
    return msgs + [{"role": "user", "content": self._task["question"]}]

  def tools(self):
    return list(self._env.schemas)

  def call(self, call: ToolCall) -> ToolResult:
    fn = self._env.functions.get(call.name)
    start = time.perf_counter()
    error, done, answer = None, call.name in self._env.finish_tools, None
    if fn is None:
      content, error = f"Error: unknown tool {call.name!r}", "unknown_tool"
    else:
      try:
        content = str(fn(**call.arguments))
      except Exception as e:  # a tool's own failure is the model's feedback, not a crash
        content, error = f"Error: {type(e).__name__}: {e}", str(e)
    if done and error is None:
      answer = content
    self.history.append((call.name, call.arguments, content))
    record = ToolCallRecord(name=call.name, arguments=call.arguments, result=content, error=error,
                            cost_usd=self._env.costs.get(call.name, 0.0), latency_s=time.perf_counter() - start)
    return ToolResult(content=content, done=done, final_answer=answer, record=record)

  def rebuild_messages(self):
    lines = [f"Problem: {self._task['question']}"]
    lines += [f"Called {name}({args}) -> {out}" for name, args, out in self.history]
    msgs = [{"role": "system", "content": self._env.system_prompt}] if self._env.system_prompt else []
    return msgs + [{"role": "user", "content": "\n".join(lines)}]


class FunctionEnvironment(ToolEnvironment):
  """Tools as Python callables: `functions[name](**arguments) -> str`. Calls to `finish_tools` end the episode."""

  def __init__(self, functions: dict[str, Callable[..., Any]], schemas: list[dict], finish_tools=("answer",),
               system_prompt: str = "", costs: dict[str, float] | None = None):
    self.functions, self.schemas, self.finish_tools = functions, schemas, tuple(finish_tools)
    self.system_prompt, self.costs = system_prompt, dict(costs or {})

  def new_episode(self, task, rollout_id):
    return FunctionEpisode(self, task)
