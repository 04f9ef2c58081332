"""`Tau2Environment`: tau2-bench-style customer-service tasks behind the `ToolEnvironment` API.

The orchestrator sees the domain's own tools (`orchestra_jax.tau2`), `call_expert(expert)` from the catalog
(aliases with prices; omitted when the catalog has no `call_expert` tool) and `send_message_to_user(content)`.

Talking to the user. The agent loop only knows tool calls (a turn without one ends the row), so the user is a
tool: `send_message_to_user(content)` appends the message to the conversation as the agent's reply, asks the
user simulator for its answer and returns that answer as the tool result. The episode ends (`done=True`) when
the user's reply carries a stop token (`###STOP###`, `###TRANSFER###`, `###OUT-OF-SCOPE###`: termination
"user_stop") or when the orchestrator's own message does (termination "agent_stop"); `final_answer` is then
the last message the agent sent to the user ("" when none), so that reward filters keep the rollout.

The conversation. Each episode keeps the tau2-side conversation (`Tau2Episode.conversation`, the format of
`tau2.runner`): the opening (the task's `message_history`, else the greeting "Hi! How can I help you today?"
and the user's first message), each domain tool call as an assistant tool-call message plus its tool result,
and each message to or from the user. The user simulator reads it, `call_expert` sends it to the expert, and
`grade()` scores it with `tau2.evaluate` (DB hash vs. the gold replay, COMMUNICATE on the agent's messages,
...). A conversation that did not end cleanly (still open when graded: the loop hit max turns or a turn had
no tool call; or the user simulator failed) scores 0, as in tau2.

`call_expert(expert)`, as in the reference: the expert LLM gets the domain policy, the conversation so far and
the domain tools, and takes the next step itself (`expert_mode="delegate"`, default): its tool calls (at most
`max_expert_tool_calls`) run on the episode's database, or, when it calls none, its text goes to the user and
the user's reply comes back. The tool result tells the orchestrator what the expert did and what came back.
With `expert_mode="advice"` nothing is executed: the result is the expert's reply and proposed calls. The
call is priced by the catalog backend of the chosen alias (per-sample `alias_map` remapping as in
`QAEnvironment`); endpoint faults, unknown aliases and bad arguments give an "Error: ..." result, a record
with `error` set and a ledger entry with `ok=False` (see `experts` for the missing-usage policy).

Ledger and records. Every call, including domain tools and messages to the user, is recorded in the ledger
(rollout key = the rollout id) and returned as a `ToolCallRecord`; only `call_expert` costs money. The user's
thinking time is not a tool's latency: `send_message_to_user` records 0 s unless `count_user_latency=True`.

Task argument of `new_episode`: a `{"id": <tau2 task id>, "alias_map"?, "tools"?, "preference_text"?}` dict (the
id may also be given as "task_id"), a full tau2 task JSON dict (with "user_scenario"), an `tau2.Task`, or a task id.

Offered tools. A non-empty `tools` (the training record's field) lists catalog aliases and domain tool names.
The aliases restrict the catalog (`Catalog.offer`, after the `alias_map` remap): `call_expert`'s enum shows only
the listed experts. The domain tools listed are the ones the orchestrator sees and that run, for it and for a
delegated expert alike. Each half restricts only when present: a list that names no alias keeps every expert
(`data.converters.convert_tau2` lists only the domain's tools), and one that names no domain tool keeps all of
them (an aliases-only list must not leave a task unsolvable). `send_message_to_user` is always offered. Unknown names
raise `UnknownAliasError` from `new_episode`; calls to tools not offered get an "Error: ..." result.
The user simulator comes from `user_simulator_factory(task)`, called once per episode (simulators keep state).

Threads. Calls of one episode are serialised by a lock (the database and the conversation are sequential).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from orchestra_jax.tau2.domain import Domain, Task
from orchestra_jax.tau2.evaluation import RewardInfo, evaluate
from orchestra_jax.tau2.runner import DEFAULT_GREETING
from orchestra_jax.tau2.user import UserSimulator, stop_token
from orchestra_jax.rollout.environment import Episode, ToolEnvironment, ToolResult
from orchestra_jax.rollout.tool_calls import ToolCall
from orchestra_jax.tools.catalog import Catalog, InvalidToolCall
from orchestra_jax.tools.experts import (ExpertClients, ExpertReply, QAEnvError, as_arguments, record_call, shorten,
                                         strip_thinking)
from orchestra_jax.tools.ledger import Ledger
from orchestra_jax.tools.qa_env import offer_tools

log = logging.getLogger(__name__)

__all__ = ["Tau2Environment", "Tau2Episode", "SEND_MESSAGE_TOOL", "SEND_MESSAGE_SCHEMA", "EXPERT_MODES",
           "AGENT_INSTRUCTION", "EXPERT_INSTRUCTION"]

SEND_MESSAGE_TOOL = "send_message_to_user"
CALL_EXPERT_TOOL = "call_expert"
EXPERT_MODES = ("delegate", "advice")

SEND_MESSAGE_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": SEND_MESSAGE_TOOL,
        "description": ("Send a message to the user (the customer) and receive the user's reply as the result. "
                        "This is the only way to talk to the user. The conversation ends when the user is done."),
        "parameters": {
            "type": "object",
            "properties": {"content": {"type": "string", "description": "The message to the user."}},
            "required": ["content"],
        },
    },
}

AGENT_INSTRUCTION = """You are a customer service agent that helps the user according to the <policy> provided below.
In each turn you can either:
- Send a message to the user with send_message_to_user (its result is the user's reply).
- Make a tool call.
- Call an expert with call_expert: the expert reads the conversation and takes the next step for you.
Try to be helpful and always follow the policy.
You should call an expert if you are not confident about how to reply or which tool to use. Choose the expert by \
the task difficulty, i.e. a strong expert on a tricky task and a weaker expert on a simpler task, weighing both \
expert cost and performance."""

EXPERT_INSTRUCTION = """You are a customer service agent that helps the user according to the <policy> provided below.
In each turn you can either:
- Send a message to the user (reply with the message text only).
- Make a tool call.
You cannot do both at the same time.
Try to be helpful and always follow the policy."""


def _system_prompt(instruction: str, policy: str, preference: str | None = None) -> str:
  text = f"<instructions>\n{instruction}\n</instructions>\n<policy>\n{policy.strip()}\n</policy>"
  if preference:
    text += f"\n<preference>\n{preference.strip()}\n</preference>"
  return text


def _openai_messages(conversation: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
  """The conversation in OpenAI chat form (tool calls with `function.arguments` as JSON text)."""
  out: list[dict[str, Any]] = []
  for m in conversation:
    role = m.get("role")
    if role == "assistant":
      msg: dict[str, Any] = {"role": "assistant", "content": m.get("content") or ""}
      if m.get("tool_calls"):
        msg["tool_calls"] = [{"id": c.get("id"), "type": "function",
                              "function": {"name": c.get("name"),
                                           "arguments": json.dumps(c.get("arguments") or {}, ensure_ascii=False)}}
                             for c in m["tool_calls"]]
      out.append(msg)
    elif role == "tool":
      out.append({"role": "tool", "tool_call_id": m.get("tool_call_id"), "content": str(m.get("content") or "")})
    elif role in ("user", "system"):
      out.append({"role": role, "content": str(m.get("content") or "")})
  return out


def _message_chars(m: Mapping[str, Any]) -> int:
  return len(str(m.get("content") or "")) + len(json.dumps(m.get("tool_calls") or [], default=str))


class Tau2Environment(ToolEnvironment):
  """One tau2 domain with a user simulator and the catalog's experts; see the module docstring.

  Args:
    domain_name: "mock", "airline" or "retail" (`tau2.Domain.load`), or a loaded `tau2.Domain`.
    catalog: the tool catalog (its `call_expert` tool and expert aliases).
    user_simulator_factory: `task -> UserSimulator` (e.g. `lambda t: ScriptedUser([...])`).
    ledger: where every call is recorded (default: a new `Ledger.for_catalog(catalog)`).
    data_dir: the data root holding tau2/ (default: `tau2.data_dir()`).
    greeting: the agent's opening line when the task has no message history (None: the user opens).
    expert_mode: "delegate" (the expert acts) or "advice" (the expert only advises).
    max_expert_tool_calls: at most this many of one expert reply's tool calls are executed.
    client_options / chat_options / missing_usage: see `experts.ExpertClients`.
    judge / on_missing_judge: defaults for `grade()` (NL_ASSERTION tasks).
    context_chars: budget of `rebuild_messages()`: the oldest actions are dropped first.
    count_user_latency: record the user simulator's wall time as the latency of send_message_to_user.
  """

  def __init__(self, domain_name: "str | Domain", catalog: Catalog, user_simulator_factory: Callable[[Task], UserSimulator],
               *, ledger: Ledger | None = None, data_dir: str | None = None, greeting: str | None = DEFAULT_GREETING,
               expert_mode: str = "delegate", max_expert_tool_calls: int = 5,
               client_options: Mapping[str, Any] | None = None, chat_options: Mapping[str, Any] | None = None,
               missing_usage: str = "error", judge: Callable | None = None, on_missing_judge: str = "error",
               context_chars: int = 100_000, count_user_latency: bool = False):
    if not isinstance(catalog, Catalog):
      raise QAEnvError(f"catalog must be a Catalog, got {type(catalog).__name__}")
    if not callable(user_simulator_factory):
      raise QAEnvError("user_simulator_factory must be a callable task -> UserSimulator")
    if expert_mode not in EXPERT_MODES:
      raise QAEnvError(f"expert_mode must be one of {', '.join(EXPERT_MODES)}, got {expert_mode!r}")
    if isinstance(max_expert_tool_calls, bool) or not isinstance(max_expert_tool_calls, int) \
        or max_expert_tool_calls < 1:
      raise QAEnvError(f"max_expert_tool_calls must be a positive integer, got {max_expert_tool_calls!r}")
    if isinstance(context_chars, bool) or not isinstance(context_chars, int) or context_chars < 1:
      raise QAEnvError(f"context_chars must be a positive integer, got {context_chars!r}")
    if on_missing_judge not in ("error", "skip", "zero"):
      raise QAEnvError(f"on_missing_judge must be 'error', 'skip' or 'zero', got {on_missing_judge!r}")
    # A loaded Domain (e.g. a synthesised ToolScale domain, `synth.load_domain_dir`) is used as it is.
    self.domain = domain_name if isinstance(domain_name, Domain) else Domain.load(domain_name, data_dir)
    clash = {SEND_MESSAGE_TOOL, CALL_EXPERT_TOOL} & set(self.domain.tool_names)
    if clash:
      raise QAEnvError(f"domain {self.domain.name} defines tools named {sorted(clash)}, which the orchestrator needs")
    self.catalog = catalog
    self.user_simulator_factory = user_simulator_factory
    self.ledger = ledger if ledger is not None else Ledger.for_catalog(catalog)
    self.greeting = greeting
    self.expert_mode = expert_mode
    self.max_expert_tool_calls = max_expert_tool_calls
    self.judge = judge
    self.on_missing_judge = on_missing_judge
    self.context_chars = context_chars
    self.count_user_latency = bool(count_user_latency)
    self.clients = ExpertClients(client_options, chat_options, missing_usage)

  def resolve_task(self, task: Any) -> Task:
    """The `tau2.Task` a task argument names (see the module docstring)."""
    if isinstance(task, Task):
      return task
    if isinstance(task, Mapping):
      if isinstance(task.get("task"), Task):
        return task["task"]
      if "user_scenario" in task:
        return Task.from_json(task, self.domain.name)
      task_id = task.get("task_id", task.get("id"))
      if task_id is None:
        raise QAEnvError("a tau2 task dict needs 'id' (or 'task_id') naming a task of the domain")
      return self.domain.task(task_id)
    if isinstance(task, (str, int)):
      return self.domain.task(task)
    raise QAEnvError(f"cannot read a tau2 task from {type(task).__name__}")

  def new_episode(self, task: Any, rollout_id: str) -> "Tau2Episode":
    tau2_task = self.resolve_task(task)
    options = task if isinstance(task, Mapping) else {}
    catalog = self.catalog.remap(options["alias_map"]) if options.get("alias_map") else self.catalog
    domain_tools = None
    if options.get("tools"):  # remap first: the map may name aliases this sample does not offer
      offered, listed = offer_tools(catalog, options["tools"], options.get("id", options.get("task_id")),
                                    own_tools=self.domain.tool_names, own_label=f"tools of domain {self.domain.name}")
      if any(t in catalog for t in options["tools"]):  # no alias listed: every expert (see the module docstring)
        catalog = offered
      domain_tools = listed or None  # no domain tool listed: all of them
    preference = options.get("preference_text") if isinstance(options.get("preference_text"), str) else None
    return Tau2Episode(self, tau2_task, catalog, rollout_id, self.user_simulator_factory(tau2_task), preference,
                       domain_tools=domain_tools)

  def close(self) -> None:
    self.clients.close()


class Tau2Episode(Episode):
  """One tau2 conversation: a private database, the user simulator and the conversation so far."""

  def __init__(self, env: Tau2Environment, task: Task, catalog: Catalog, rollout_id: str, user: UserSimulator,
               preference_text: str | None = None, *, domain_tools: Sequence[str] | None = None):
    self.env = env
    self.task = task
    self.catalog = catalog
    # the domain tools this episode offers (None: all), in the domain's order so schemas keep a stable layout
    offered = set(env.domain.tool_names if domain_tools is None else domain_tools)
    self.domain_tools: tuple[str, ...] = tuple(n for n in env.domain.tool_names if n in offered)
    self.rollout_id = rollout_id
    self.user = user
    self.preference_text = preference_text
    self.domain_env = env.domain.new_episode(task)
    self.conversation: list[dict[str, Any]] = [dict(m) for m in self.domain_env.initial_messages]
    self.termination_reason: str | None = None  # user_stop | agent_stop | user_error; None while open
    self.stop_token: str | None = None
    self.error: str | None = None
    self.last_agent_message: str | None = None
    self._actions: list[dict[str, Any]] = []  # the orchestrator's calls and their results (rebuild view)
    self._lock = threading.Lock()
    self._ids = 0
    if not self.conversation:
      if env.greeting:
        self.conversation.append({"role": "assistant", "content": env.greeting})
      self._user_turn()
    elif self.conversation[-1].get("role") == "assistant" and not self.conversation[-1].get("tool_calls"):
      self._user_turn()
    self._opening = _openai_like(self.conversation)

  # --- state -----------------------------------------------------------------------------------------
  @property
  def done(self) -> bool:
    return self.termination_reason is not None

  @property
  def final_answer(self) -> str | None:
    if self.termination_reason in ("user_stop", "agent_stop"):
      return self.last_agent_message or ""
    return None

  def _next_id(self) -> str:
    self._ids += 1
    return f"orch_call_{self._ids}"

  def _user_turn(self) -> str | None:
    """Asks the user simulator for its next message; sets the termination reason on stop or failure."""
    try:
      text = self.user.respond(self.conversation)
      if not isinstance(text, str):
        raise TypeError(f"user simulator returned {type(text).__name__}, not str")
    except Exception as e:
      self.termination_reason, self.error = "user_error", f"{type(e).__name__}: {e}"
      return None
    self.conversation.append({"role": "user", "content": text})
    token = stop_token(text)
    if token is not None:
      self.termination_reason, self.stop_token = "user_stop", token
    return text

  def _say(self, text: str) -> str | None:
    """The agent says `text` to the user; returns the user's reply (None when the conversation ends without one)."""
    self.conversation.append({"role": "assistant", "content": text})
    self.last_agent_message = text
    token = stop_token(text)
    if token is not None:
      self.termination_reason, self.stop_token = "agent_stop", token
      return None
    return self._user_turn()

  def _available(self) -> str:
    names = list(self.domain_tools) + ([CALL_EXPERT_TOOL] if CALL_EXPERT_TOOL in self.catalog.tools else [])
    return ", ".join(names + [SEND_MESSAGE_TOOL])

  def _domain_schemas(self) -> list[dict[str, Any]]:
    return [s for s in self.env.domain.tool_schemas() if s["function"]["name"] in self.domain_tools]

  def _execute(self, name: str, arguments: Any) -> tuple[str, bool]:
    """Runs one domain tool call on the database and logs it in the conversation: (result text, is_error).
    Only offered domain tools run, whoever calls (the orchestrator or a delegated expert)."""
    if name not in self.domain_tools:
      return f"unknown tool {name!r}; available: {self._available()}", True
    record = self.domain_env.execute(name, arguments)
    call_id = self._next_id()
    self.conversation.append({"role": "assistant", "content": None,
                              "tool_calls": [{"id": call_id, "name": name, "arguments": record.arguments}]})
    self.conversation.append({"role": "tool", "tool_call_id": call_id, "name": name, "content": record.result})
    return record.result, record.error

  # --- prompts ---------------------------------------------------------------------------------------
  def system_prompt(self) -> str:
    return _system_prompt(AGENT_INSTRUCTION, self.domain_env.policy, self.preference_text)

  def messages(self) -> list[dict[str, Any]]:
    return [{"role": "system", "content": self.system_prompt()}] + [dict(m) for m in self._opening]

  def tools(self) -> list[dict[str, Any]]:
    schemas = self._domain_schemas()
    if CALL_EXPERT_TOOL in self.catalog.tools:
      schemas.append(self.catalog.tool_schema(CALL_EXPERT_TOOL))
    schemas.append(json.loads(json.dumps(SEND_MESSAGE_SCHEMA)))
    return schemas

  def rebuild_messages(self) -> list[dict[str, Any]]:
    """The opening plus the orchestrator's calls and their results, oldest dropped first past `context_chars`."""
    head = self.messages()
    with self._lock:
      actions = list(self._actions)
    budget = self.env.context_chars - sum(_message_chars(m) for m in head)
    kept: list[dict[str, Any]] = []
    for i in range(len(actions) - 2, -1, -2):  # (call, result) pairs, newest first
      pair = actions[i:i + 2]
      size = sum(_message_chars(m) for m in pair)
      if kept and size > budget:
        break
      budget -= size
      kept = pair + kept
    return head + kept

  def expert_messages(self) -> list[dict[str, Any]]:
    system = _system_prompt(EXPERT_INSTRUCTION, self.domain_env.policy)
    return [{"role": "system", "content": system}] + _openai_messages(self.conversation)

  # --- calls -----------------------------------------------------------------------------------------
  def call(self, call: ToolCall) -> ToolResult:
    start = time.perf_counter()
    with self._lock:
      try:
        result = self._dispatch(call, start)
      except Exception as e:  # a bug: report it, keep the rollout alive
        log.exception("tau2 tool %s failed", call.name)
        message = f"internal error in {call.name} ({type(e).__name__}: {e})"
        result = self._finish(call, start, content=f"Error: {message}", error=message)
      self._actions.append({"role": "assistant", "content": "",
                            "tool_calls": [{"name": call.name, "arguments": as_arguments(call.arguments)}]})
      self._actions.append({"role": "tool", "content": result.content})
      return result

  def _finish(self, call: ToolCall, start: float, *, content: str, error: str | None = None,
              reply: ExpertReply | None = None, backend=None, alias: str | None = None,
              latency_s: float | None = None) -> ToolResult:
    done = self.done
    record = record_call(self.env.ledger, self.rollout_id, call.name, call.arguments, content=content, error=error,
                         latency_s=time.perf_counter() - start if latency_s is None else latency_s,
                         backend=backend, alias=alias, reply=reply)
    return ToolResult(content=content, done=done, final_answer=self.final_answer if done else None, record=record)

  def _dispatch(self, call: ToolCall, start: float) -> ToolResult:
    if self.done:
      message = f"the conversation has ended ({self.termination_reason}); no more tool calls are accepted"
      if self.error:
        message += f": {self.error}"
      return self._finish(call, start, content=f"Error: {message}", error=message)
    if call.name == SEND_MESSAGE_TOOL:
      return self._send_message(call, start)
    if call.name == CALL_EXPERT_TOOL and CALL_EXPERT_TOOL in self.catalog.tools:
      return self._call_expert(call, start)  # not offered: falls through to _execute's "unknown tool"
    arguments = call.arguments
    if not isinstance(arguments, (Mapping, str)) and arguments is not None:
      message = f"arguments of {call.name} must be a JSON object, got {type(arguments).__name__}"
      return self._finish(call, start, content=f"Error: {message}", error=message)
    result, is_error = self._execute(call.name, arguments)
    if is_error:
      text = result[len("Error: "):] if result.startswith("Error: ") else result
      return self._finish(call, start, content=f"Error: {text}", error=text)
    return self._finish(call, start, content=result)

  def _send_message(self, call: ToolCall, start: float) -> ToolResult:
    args = call.arguments
    content = args.get("content") if isinstance(args, Mapping) else None
    if not isinstance(content, str) or not content.strip():
      message = f"{SEND_MESSAGE_TOOL} requires a non-empty string argument 'content'"
      return self._finish(call, start, content=f"Error: {message}", error=message)
    user_start = time.perf_counter()
    reply = self._say(content)
    latency = None if self.env.count_user_latency else max(0.0, (user_start - start))
    if self.termination_reason == "user_error":
      message = f"the user simulator failed: {self.error}"
      return self._finish(call, start, content=f"Error: {message}", error=message, latency_s=latency)
    if reply is None:  # the agent itself ended the conversation
      return self._finish(call, start, content="The conversation has ended.", latency_s=latency)
    return self._finish(call, start, content=reply, latency_s=latency)

  def _call_expert(self, call: ToolCall, start: float) -> ToolResult:
    try:
      resolved = self.catalog.parse_call(CALL_EXPERT_TOOL, call.arguments, allowed_tools=[CALL_EXPERT_TOOL])
    except InvalidToolCall as e:
      alias = call.arguments.get("expert") if isinstance(call.arguments, Mapping) else None
      alias = alias if isinstance(alias, str) else None
      return self._finish(call, start, content=f"Error: {e}", error=str(e), alias=alias)
    alias, backend = resolved.alias, resolved.backend
    reply = self.env.clients.chat(backend, self.expert_messages(), tools=self._domain_schemas())
    fields = dict(reply=reply, backend=backend, alias=alias)
    if reply.error:
      message = f"{CALL_EXPERT_TOOL} with {alias} failed: {reply.error}"
      return self._finish(call, start, content=f"Error: {message}", error=reply.error, **fields)
    text = strip_thinking(reply.text).strip()
    if "<message>" in text and "</message>" in text:  # the reference's expert output format
      text = text.split("<message>")[-1].split("</message>")[0].strip()
    calls = []
    for c in reply.result.tool_calls:
      fn = c.get("function") if isinstance(c, Mapping) else None
      if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
        calls.append((fn["name"], fn.get("arguments")))
    if not calls and not text:
      message = f"{alias} returned neither a message nor a tool call"
      return self._finish(call, start, content=f"Error: {message}", error=message, **fields)

    if self.env.expert_mode == "advice":
      lines = [f"Advice from {alias}: {text}" if text else f"Advice from {alias}:"]
      lines += [f"Suggested tool call: {name}({_args_text(args)})" for name, args in calls]
      return self._finish(call, start, content="\n".join(lines), **fields)

    if calls:
      lines = [f"{alias} made {len(calls)} tool call(s):" if len(calls) <= self.env.max_expert_tool_calls else
               f"{alias} proposed {len(calls)} tool calls; the first {self.env.max_expert_tool_calls} were run:"]
      for name, args in calls[:self.env.max_expert_tool_calls]:
        if name in (CALL_EXPERT_TOOL, SEND_MESSAGE_TOOL):
          result = f"Error: {name} is not available to the expert"
        else:
          result, _ = self._execute(name, args)
        lines.append(f"{name}({_args_text(args)}) -> {result}")
      return self._finish(call, start, content="\n".join(lines), **fields)

    user_reply = self._say(text)
    lines = [f"{alias} said to the user: {text}"]
    if self.termination_reason == "user_error":
      lines.append(f"Error: the user simulator failed: {self.error}")
      return self._finish(call, start, content="\n".join(lines), error=f"the user simulator failed: {self.error}",
                          **fields)
    if user_reply is not None:
      lines.append(f"User: {user_reply}")
    return self._finish(call, start, content="\n".join(lines), **fields)

  # --- grading ---------------------------------------------------------------------------------------
  def grade_info(self, *, judge: Callable | None = None, on_missing_judge: str | None = None,
                 termination_reason: str | None = None) -> RewardInfo:
    """`tau2.evaluate` on this conversation. A conversation still open counts as not ended cleanly (reward 0)."""
    with self._lock:
      reason = termination_reason or self.termination_reason or "incomplete"
      return evaluate(self.domain_env, list(self.conversation), task=self.task, termination_reason=reason,
                      judge=judge if judge is not None else self.env.judge,
                      on_missing_judge=on_missing_judge or self.env.on_missing_judge)

  def grade(self, **kwargs: Any) -> float:
    """The tau2 reward in [0, 1] (see `grade_info`)."""
    return self.grade_info(**kwargs).reward


def _openai_like(conversation: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
  """The opening conversation as the orchestrator's chat (tool calls as {name, arguments} objects)."""
  out = []
  for m in conversation:
    msg = {"role": m.get("role"), "content": m.get("content") or ""}
    if m.get("tool_calls"):
      msg["tool_calls"] = [{"name": c.get("name"), "arguments": c.get("arguments") or {}} for c in m["tool_calls"]]
    out.append(msg)
  return out


def _args_text(args: Any) -> str:
  if isinstance(args, str):
    return shorten(args, 300)
  return shorten(json.dumps(args, ensure_ascii=False, default=str), 300)
