"""User simulators: the customer side of a tau2 conversation.

`UserSimulator.respond(conversation) -> str` gives the user's next message. The conversation is the
agent-side message list (OpenAI-style dicts; see `runner.py`). A reply containing one of the stop tokens of the
simulation guidelines ends the episode:

* `###STOP###`: the user's goal is satisfied;
* `###TRANSFER###`: the user was transferred to a human agent;
* `###OUT-OF-SCOPE###`: the scenario does not say how to go on.

`ScriptedUser` replays fixed utterances and then says `###STOP###` (for tests). `LLMUserSimulator` asks any chat
callable `(messages) -> text` (a `ChatClient.chat`-like function works too: results with `.text` / `.ok` /
`.error` are understood), with the guidelines (`tau2/simulation_guidelines.md`) and the task's user scenario as
the system prompt. Roles are flipped for the simulator's model: the agent's messages are its "user" turns and
its own earlier messages are its "assistant" turns; tool calls and tool results are not shown to it.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestra_jax.tau2.domain import Task, tau2_dir
from orchestra_jax.resources import read_text

__all__ = ["STOP_TOKEN", "TRANSFER_TOKEN", "OUT_OF_SCOPE_TOKEN", "STOP_TOKENS", "stop_token", "UserSimulator",
           "ScriptedUser", "LLMUserSimulator", "UserSimulatorError", "render_scenario", "load_guidelines"]

STOP_TOKEN = "###STOP###"
TRANSFER_TOKEN = "###TRANSFER###"
OUT_OF_SCOPE_TOKEN = "###OUT-OF-SCOPE###"
STOP_TOKENS = (STOP_TOKEN, TRANSFER_TOKEN, OUT_OF_SCOPE_TOKEN)


def stop_token(text: str | None) -> str | None:
  """The stop token in a user message, if any."""
  if not text:
    return None
  for token in STOP_TOKENS:
    if token in text:
      return token
  return None


class UserSimulatorError(RuntimeError):
  """The simulator's model call failed."""


class UserSimulator(abc.ABC):
  """The user side of a conversation."""

  @abc.abstractmethod
  def respond(self, conversation: Sequence[Mapping[str, Any]]) -> str:
    """The user's next message, given the conversation so far (agent-side view)."""


class ScriptedUser(UserSimulator):
  """Says `utterances` in order, one per turn, then `###STOP###` (or `final`)."""

  def __init__(self, utterances: Sequence[str], final: str = STOP_TOKEN):
    self.utterances = list(utterances)
    self.final = final
    self._next = 0

  def respond(self, conversation: Sequence[Mapping[str, Any]]) -> str:
    if self._next < len(self.utterances):
      self._next += 1
      return self.utterances[self._next - 1]
    return self.final


def load_guidelines(with_tools: bool = False, root: str | Path | None = None) -> str:
  """`simulation_guidelines.md` (or the `_tools` variant, for domains where the user has tools)."""
  name = "simulation_guidelines_tools.md" if with_tools else "simulation_guidelines.md"
  return read_text(tau2_dir(root) / name)


_INSTRUCTION_FIELDS = (("domain", "Domain"), ("reason_for_call", "Reason for call"), ("known_info", "Known info"),
                       ("unknown_info", "Unknown info"), ("task_instructions", "Task instructions"))


def render_scenario(user_scenario: Mapping[str, Any] | str) -> str:
  """The user scenario as text for the simulator's system prompt."""
  if isinstance(user_scenario, str):
    return user_scenario
  lines = []
  persona = user_scenario.get("persona")
  if persona:
    lines += ["Persona:", f"\t{persona}"]
  instructions = user_scenario.get("instructions")
  lines.append("Instructions:")
  if isinstance(instructions, Mapping):
    known = {k for k, _ in _INSTRUCTION_FIELDS}
    for key, label in _INSTRUCTION_FIELDS:
      value = instructions.get(key)
      if value:
        lines.append(f"\t{label}: " + str(value).strip().replace("\n", "\n\t"))
    for key, value in instructions.items():
      if key not in known and value:
        lines.append(f"\t{key}: {value}")
  elif instructions:
    lines.append("\t" + str(instructions).strip().replace("\n", "\n\t"))
  return "\n".join(lines)


def _text_of(result: Any) -> str:
  if isinstance(result, str):
    return result
  if getattr(result, "ok", True) is False:
    raise UserSimulatorError(f"user simulator model call failed: {getattr(result, 'error', None)}")
  for attr in ("text", "content"):
    value = getattr(result, attr, None)
    if isinstance(value, str):
      return value
  if isinstance(result, Mapping):
    if "content" in result and isinstance(result["content"], str):
      return result["content"]
    try:  # an OpenAI response body
      return result["choices"][0]["message"]["content"] or ""
    except (KeyError, IndexError, TypeError):
      pass
  raise UserSimulatorError(f"cannot read a message from the chat callable's result {type(result).__name__}")


class LLMUserSimulator(UserSimulator):
  """A user played by a chat model. `chat(messages) -> text`; `scenario`: a Task, a user_scenario mapping or
  text; `guidelines`: the simulation guidelines text (default: tau2/simulation_guidelines.md)."""

  def __init__(self, chat: Callable[[list[dict[str, Any]]], Any], scenario: Task | Mapping[str, Any] | str,
               guidelines: str | None = None):
    self.chat = chat
    if isinstance(scenario, Task):
      scenario = scenario.user_scenario
    self.scenario = scenario
    self.guidelines = guidelines if guidelines is not None else load_guidelines()
    self.system_prompt = f"{self.guidelines.strip()}\n\n<scenario>\n{render_scenario(scenario)}\n</scenario>"
    self.last_result: Any = None

  def simulator_messages(self, conversation: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The chat the simulator's model sees: system prompt, then the conversation with roles flipped."""
    out: list[dict[str, Any]] = [{"role": "system", "content": self.system_prompt}]
    for m in conversation:
      role, content = m.get("role"), m.get("content")
      if not isinstance(content, str) or not content.strip():
        continue  # tool-call-only assistant turns, tool results
      if role == "assistant":
        out.append({"role": "user", "content": content})
      elif role == "user":
        out.append({"role": "assistant", "content": content})
    return out

  def respond(self, conversation: Sequence[Mapping[str, Any]]) -> str:
    messages = self.simulator_messages(conversation)
    if len(messages) == 1:  # nobody spoke yet: let the agent's usual greeting open
      messages.append({"role": "user", "content": "Hi! How can I help you today?"})
    result = self.chat(messages)
    self.last_result = result
    return _text_of(result).strip()

  def __repr__(self) -> str:
    return f"LLMUserSimulator(scenario={json.dumps(self.scenario, default=str)[:60]}...)"
