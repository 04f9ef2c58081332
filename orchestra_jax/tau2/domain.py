"""Domains, tasks and environments.

`Domain.load(name)` parses a tau2 domain once per process (database, policy, tasks, splits; cached with
`functools.lru_cache`), and `domain.new_episode(task)` gives an `Environment`: a private copy of the database
(copy-on-write, see `db.py`) with the task's initial state applied, and the domain's tools over it.

Data lives in `<data dir>/tau2/<domain>/`: `db.json`, `policy.md`, `tasks.json`, `split_tasks.json` (each may be
gzipped, `db.json.gz`). The data dir is `$ORCHESTRA_DATA_DIR` when set, else the copy shipped in the package
(`orchestra_jax/resources/data`, see `resources.data_dir`).

Task format (tau2 v0.2): `{id, description, user_scenario{persona, instructions}, ticket?, initial_state?,
evaluation_criteria{actions[{action_id, name, arguments, requestor?, compare_args?, info}], communicate_info,
nl_assertions, env_assertions, reward_basis}}`. `initial_state` may hold `initialization_data.agent_data` (a
partial database deep-merged into the copy), `initialization_actions` (tool calls run before the episode) and
`message_history` (an earlier part of the conversation: its assistant tool calls are executed again on the new
database, in order, and the messages become `Environment.initial_messages`).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestra_jax.tau2.db import Database
from orchestra_jax.tau2.records import ValidationError
from orchestra_jax.tau2.tools import CALL_EXPERT_SCHEMA, ToolError, Toolkit, format_result
from orchestra_jax.resources import DATA_ENV_VAR, DataNotFoundError, data_dir, read_json, read_text

__all__ = ["DATA_ENV_VAR", "DOMAINS", "DataNotFoundError", "data_dir", "tau2_dir", "Action", "EnvAssertion",
           "EvaluationCriteria", "Task", "ToolCallRecord", "Domain", "Environment", "DEFAULT_REWARD_BASIS"]

# name -> (module, toolkit class, policy file); the module defines TABLES (table -> record type)
DOMAINS: dict[str, tuple[str, str, str]] = {
  "mock": ("orchestra_jax.tau2.mock", "MockTools", "policy.md"),
  "airline": ("orchestra_jax.tau2.airline", "AirlineTools", "policy.md"),
  "retail": ("orchestra_jax.tau2.retail", "RetailTools", "policy.md"),
}
DEFAULT_REWARD_BASIS = ("DB", "COMMUNICATE")


def tau2_dir(root: str | os.PathLike | None = None) -> Path:
  return Path(root).expanduser().resolve() / "tau2" if root is not None else data_dir() / "tau2"


# --- tasks --------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, eq=False)
class Action:
  """A gold tool call. `compare_args`: the argument names the ACTION check compares (None: all)."""

  name: str
  arguments: Mapping[str, Any]
  action_id: str | None = None
  requestor: str = "assistant"
  compare_args: tuple[str, ...] | None = None
  info: str | None = None

  @classmethod
  def from_json(cls, d: Mapping[str, Any]) -> "Action":
    compare = d.get("compare_args")
    return cls(name=d["name"], arguments=dict(d.get("arguments") or {}), action_id=d.get("action_id"),
               requestor=d.get("requestor") or "assistant",
               compare_args=None if compare is None else tuple(compare), info=d.get("info"))

  def to_json(self) -> dict[str, Any]:
    return {"action_id": self.action_id, "name": self.name, "arguments": dict(self.arguments),
            "requestor": self.requestor, "compare_args": None if self.compare_args is None else list(self.compare_args),
            "info": self.info}


@dataclasses.dataclass(frozen=True, eq=False)
class EnvAssertion:
  """A check of the final database: `func_name(**arguments)` must return `assert_value`."""

  func_name: str
  arguments: Mapping[str, Any]
  env_type: str = "assistant"
  assert_value: bool = True
  message: str | None = None

  @classmethod
  def from_json(cls, d: Mapping[str, Any]) -> "EnvAssertion":
    return cls(func_name=d["func_name"], arguments=dict(d.get("arguments") or {}),
               env_type=d.get("env_type") or "assistant", assert_value=bool(d.get("assert_value", True)),
               message=d.get("message"))


@dataclasses.dataclass(frozen=True, eq=False)
class EvaluationCriteria:
  actions: tuple[Action, ...] = ()
  communicate_info: tuple[str, ...] = ()
  nl_assertions: tuple[str, ...] = ()
  env_assertions: tuple[EnvAssertion, ...] = ()
  reward_basis: tuple[str, ...] = DEFAULT_REWARD_BASIS

  @classmethod
  def from_json(cls, d: Mapping[str, Any] | None) -> "EvaluationCriteria":
    d = d or {}
    return cls(actions=tuple(Action.from_json(a) for a in d.get("actions") or ()),
               communicate_info=tuple(str(x) for x in d.get("communicate_info") or ()),
               nl_assertions=tuple(d.get("nl_assertions") or ()),
               env_assertions=tuple(EnvAssertion.from_json(a) for a in d.get("env_assertions") or ()),
               reward_basis=tuple(d.get("reward_basis") or DEFAULT_REWARD_BASIS))


@dataclasses.dataclass(frozen=True, eq=False)
class Task:
  """One tau2 task. `raw` is the task's JSON as shipped."""

  id: str
  domain: str
  user_scenario: Mapping[str, Any]
  evaluation_criteria: EvaluationCriteria
  initial_state: Mapping[str, Any] | None = None
  description: Mapping[str, Any] | None = None
  ticket: str | None = None
  raw: Mapping[str, Any] = dataclasses.field(default_factory=dict, repr=False)

  @classmethod
  def from_json(cls, d: Mapping[str, Any], domain: str) -> "Task":
    return cls(id=str(d["id"]), domain=domain, user_scenario=d.get("user_scenario") or {},
               evaluation_criteria=EvaluationCriteria.from_json(d.get("evaluation_criteria")),
               initial_state=d.get("initial_state") or None, description=d.get("description"),
               ticket=d.get("ticket"), raw=d)

  @property
  def gold_actions(self) -> tuple[Action, ...]:
    return self.evaluation_criteria.actions


@dataclasses.dataclass
class ToolCallRecord:
  """One executed tool call. `source`: 'agent', 'history' (replayed from initial_state.message_history) or
  'init' (initialization_actions). `internal`: the tool itself failed (a bug, not the caller's fault)."""

  name: str
  arguments: Any
  result: str
  error: bool = False
  internal: bool = False
  source: str = "agent"

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


# --- domain -------------------------------------------------------------------------------------------------
class Domain:
  """A tau2 domain: database (frozen root), tools, policy, tasks. Use `Domain.load(name)`."""

  def __init__(self, name: str, root: Path, db: Database, toolkit: type[Toolkit], policy: str,
               tasks: Sequence[Task], splits: Mapping[str, Sequence[str]]):
    self.name = name
    self.root = root
    self.db = db  # frozen; episodes fork it
    self.toolkit = toolkit
    self.policy = policy
    self.tasks = tuple(tasks)
    self._tasks_by_id = {t.id: t for t in self.tasks}
    if len(self._tasks_by_id) != len(self.tasks):
      raise ValidationError(f"{name}: duplicate task ids in tasks.json")
    self.splits = {k: tuple(str(i) for i in v) for k, v in splits.items()}
    self._gold: dict[str, tuple[str, tuple[str, ...]]] = {}
    self._gold_lock = threading.Lock()

  def __repr__(self) -> str:
    return f"Domain({self.name!r}, {len(self.tasks)} tasks, {len(self.toolkit.TOOLS)} tools)"

  @classmethod
  def load(cls, name: str, data_dir: str | os.PathLike | None = None) -> "Domain":
    """The domain `name` (cached per data directory: parsed once per process)."""
    if name not in DOMAINS:
      raise ValueError(f"unknown domain {name!r}; available: {', '.join(DOMAINS)}")
    return _load_domain(name, str(tau2_dir(data_dir)))

  def task(self, task_id: str | int) -> Task:
    try:
      return self._tasks_by_id[str(task_id)]
    except KeyError:
      raise KeyError(f"{self.name}: no task {task_id!r}") from None

  def split(self, split: str) -> tuple[Task, ...]:
    """Tasks of a split from split_tasks.json ('train', 'test', 'base'); all tasks when there is no split file
    and `split` is 'base'."""
    if split not in self.splits:
      if split == "base" and not self.splits:
        return self.tasks
      raise KeyError(f"{self.name}: no split {split!r}; available: {', '.join(self.splits) or 'none'}")
    return tuple(self._tasks_by_id[i] for i in self.splits[split])

  def tool_schemas(self, include_call_expert: bool = False) -> list[dict[str, Any]]:
    """The tools in OpenAI form (`{"type": "function", "function": {name, description, parameters}}`),
    plus `call_expert` for the orchestrator when asked."""
    schemas = [json.loads(json.dumps(s)) for s in self.toolkit.tool_schemas()]
    if include_call_expert:
      schemas.append(json.loads(json.dumps(CALL_EXPERT_SCHEMA)))
    return schemas

  @property
  def tool_names(self) -> list[str]:
    return list(self.toolkit.TOOLS)

  def write_tools(self) -> set[str]:
    return {name for name, spec in self.toolkit.TOOLS.items() if spec.writes}

  def new_episode(self, task: Task | str | int | None = None) -> "Environment":
    """A fresh environment (own database copy) with the task's initial state applied."""
    if task is not None and not isinstance(task, Task):
      task = self.task(task)
    env = Environment(self, task, self.db.fork())
    if task is not None and task.initial_state:
      env._apply_initial_state(task.initial_state)
    return env

  def initial_db_hash(self) -> str:
    return self.db.hash()

  def gold_replay(self, task: Task | str | int) -> "Environment":
    """A fresh environment after running the task's gold actions (assistant-side) in order."""
    task = task if isinstance(task, Task) else self.task(task)
    env = self.new_episode(task)
    for action in task.gold_actions:
      if action.requestor != "assistant":
        raise NotImplementedError(f"{self.name} task {task.id}: gold action by {action.requestor!r} "
                                  "(user-side tools are not implemented)")
      env.call(action.name, action.arguments, source="gold")
    return env

  def gold_db_hash(self, task: Task | str | int) -> str:
    """DB hash after the gold actions (cached per task)."""
    return self.gold_info(task)[0]

  def gold_errors(self, task: Task | str | int) -> tuple[str, ...]:
    """Error results of the gold actions (should be empty for well-formed tasks)."""
    return self.gold_info(task)[1]

  def gold_info(self, task: Task | str | int) -> tuple[str, tuple[str, ...]]:
    task = task if isinstance(task, Task) else self.task(task)
    with self._gold_lock:
      cached = self._gold.get(task.id)
    if cached is None:
      env = self.gold_replay(task)
      cached = (env.db_hash(), tuple(f"{r.name}: {r.result}" for r in env.tool_log if r.error))
      with self._gold_lock:
        self._gold[task.id] = cached
    return cached


@functools.lru_cache(maxsize=None)
def _load_domain(name: str, root: str) -> Domain:
  module_name, toolkit_name, policy_file = DOMAINS[name]
  base = Path(root)
  folder = base / name
  if not folder.is_dir():
    raise DataNotFoundError(f"tau2 data for domain {name!r} not found at {folder} (${DATA_ENV_VAR} names a data "
                            "directory holding tau2/<domain>/; unset it to use the data shipped in the package)")
  module = importlib.import_module(module_name)
  toolkit = getattr(module, toolkit_name)
  try:
    db = Database.from_json(module.TABLES, read_json(folder / "db.json"))
  except ValidationError as e:
    raise ValidationError(f"{folder / 'db.json'}: {e}") from None
  policy = read_text(folder / policy_file)
  tasks = [Task.from_json(t, name) for t in read_json(folder / "tasks.json")]
  try:
    splits = read_json(folder / "split_tasks.json")
  except DataNotFoundError:  # optional: mock has no splits
    splits = {}
  return Domain(name, base, db, toolkit, policy, tasks, splits)


# --- environment --------------------------------------------------------------------------------------------
class Environment:
  """One episode: a private database copy and the domain's tools over it."""

  def __init__(self, domain: Domain, task: Task | None, db: Database):
    self.domain = domain
    self.task = task
    self.db = db
    self.tools = domain.toolkit(db)
    self.tool_log: list[ToolCallRecord] = []
    self.initial_messages: list[dict[str, Any]] = []
    self.init_warnings: list[str] = []

  def __repr__(self) -> str:
    return f"Environment({self.domain.name!r}, task={self.task.id if self.task else None!r})"

  @property
  def policy(self) -> str:
    return self.domain.policy

  def tool_schemas(self, include_call_expert: bool = False) -> list[dict[str, Any]]:
    return self.domain.tool_schemas(include_call_expert)

  def execute(self, tool_name: str, arguments: Any = None, *, source: str = "agent") -> ToolCallRecord:
    """Run one tool call and log it. Never raises: refusals and failures become the result text
    ("Error: ...")."""
    error = internal = False
    try:
      if isinstance(arguments, str):  # OpenAI puts arguments as a JSON string
        try:
          arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as e:
          raise ToolError(f"Arguments of {tool_name} are not valid JSON: {e}") from None
      if tool_name == "call_expert":
        raise ToolError("call_expert is answered by the orchestrator, not by the domain environment")
      result = format_result(self.tools.invoke(tool_name, arguments))
    except ToolError as e:
      result, error = f"Error: {e}", True
    except Exception as e:  # a bug in a tool: report it to the agent, flag it for the developer
      result, error, internal = f"Error: internal error in {tool_name}: {type(e).__name__}: {e}", True, True
    record = ToolCallRecord(tool_name, arguments, result, error, internal, source)
    self.tool_log.append(record)
    return record

  def call(self, tool_name: str, arguments: Any = None, *, source: str = "agent") -> str:
    """Run one tool call; the result text (JSON of the returned data, or the error message)."""
    return self.execute(tool_name, arguments, source=source).result

  def db_hash(self) -> str:
    """sha256 of the canonical JSON (sorted keys, no whitespace) of the whole database."""
    return self.db.hash()

  def db_json(self) -> dict[str, Any]:
    return self.db.to_json()

  def run_assertion(self, func_name: str, arguments: Mapping[str, Any] | None = None) -> bool:
    return self.tools.run_assertion(func_name, arguments)

  @property
  def agent_tool_calls(self) -> list[ToolCallRecord]:
    """Tool calls of the conversation (replayed history and the agent's own), not initialisation ones."""
    return [r for r in self.tool_log if r.source in ("agent", "history")]

  # initial state
  def _apply_initial_state(self, state: Mapping[str, Any]) -> None:
    data = state.get("initialization_data") or {}
    if data.get("user_data"):
      raise NotImplementedError(f"{self.domain.name}: user-side initialization_data is not supported")
    if data.get("agent_data"):
      self.db.merge(data["agent_data"])
    for action in state.get("initialization_actions") or ():
      if (action.get("env_type") or "assistant") != "assistant":
        raise NotImplementedError(f"{self.domain.name}: user-side initialization_actions are not supported")
      record = self.execute(action["func_name"], action.get("arguments") or {}, source="init")
      if record.error:
        raise ValueError(f"{self.domain.name} task {self.task.id if self.task else '?'}: initialization action "
                         f"{action['func_name']} failed: {record.result}")
    history = state.get("message_history") or ()
    results = {m.get("id") or m.get("tool_call_id"): m.get("content") for m in history if m.get("role") == "tool"}
    messages: list[dict[str, Any]] = []
    for m in history:
      role = m.get("role")
      if role == "assistant":
        out: dict[str, Any] = {"role": "assistant", "content": m.get("content")}
        calls = []
        for call in m.get("tool_calls") or ():
          if (call.get("requestor") or "assistant") != "assistant":
            raise NotImplementedError("user-side tool calls in message_history are not supported")
          record = self.execute(call["name"], call.get("arguments") or {}, source="history")
          expected = results.get(call.get("id"))
          if expected is not None and not _same_result(expected, record.result):
            self.init_warnings.append(f"message_history call {call.get('id')} ({call['name']}) gave "
                                      f"{record.result!r}, the history recorded {expected!r}")
          calls.append({"id": call.get("id"), "name": call["name"], "arguments": call.get("arguments") or {}})
        if calls:
          out["tool_calls"] = calls
        messages.append(out)
      elif role == "tool":
        messages.append({"role": "tool", "tool_call_id": m.get("id") or m.get("tool_call_id"),
                         "content": m.get("content")})
      elif role == "user":
        messages.append({"role": "user", "content": m.get("content")})
      else:
        raise ValueError(f"message_history: unsupported role {role!r}")
    self.initial_messages = messages


def _same_result(expected: str, got: str) -> bool:
  try:
    return json.loads(expected) == json.loads(got)
  except (json.JSONDecodeError, TypeError):
    return expected == got
