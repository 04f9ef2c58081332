"""The task families `orchestra train` trains on (`config.env.name`), each as an `EnvSetup`.

* `demo`: the CPU demo's arithmetic/capital/element questions and three scripted priced tools
  (`orchestra_jax/demo/world.py`); served locally, no network, with a supervised warm-up.
* `data`: the paper's setting. Records of the training-data format (`orchestra_jax/data/format.py`) from
  `env.train_data`, of any mix of kinds, each routed to its environment by `RecordEnvironment`:
    - "qa": `tools.qa_env.QAEnvironment` with the catalog's search / enhance_reasoning / answer tools (experts behind
      the catalog's OpenAI-compatible endpoints, retrieval from `env.corpus` BM25 or `env.retriever_url`, code in
      the sandbox). Outcome: exact match, else numeric match, else (with `env.judge_endpoint`) the LLM judge.
    - "tau2": a built-in tau2 domain (`tools.tau2_env.Tau2Environment`; mock, airline, retail) with the customer
      played by the LLM user simulator at `env.user_endpoint`. Outcome: tau2's grade (gold-action replay, DB
      hash, communicated info) is 1.
    - "toolscale": a synthesised domain (`metadata.domain_dir`, relative to its data file; see `orchestra synth`),
      otherwise as "tau2".
  Each record's `tools` restricts the aliases (and domain tools) its episodes offer, `alias_map` remaps the
  catalog for them (models, prices), `preference_text` goes into the prompt and
  `preference` (over `[aliases..., "outcome", "-cost", "-latency"]`) weights the reward; a record without one
  gets `env.default_preference`. Evaluation uses `env.eval_data`, or holds out `env.num_eval_tasks` records of
  the training data (seeded), reported per group: "qa", "tau2-airline", "toolscale-bank", ...

An `EnvSetup.grade(task, trajectory, episode)` is called the moment a rollout ends (`AgentLoop.run(on_done=)`):
tau2 grading needs the episode's database, which only lives until then.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import random
import threading
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping, Sequence

import ml_collections
import numpy as np

from orchestra_jax import configs as config_lib
from orchestra_jax.errors import UserError
from orchestra_jax.grading import JUDGE_PROMPTS, JudgeUnavailable, LLMJudge, grade_answer
from orchestra_jax.registry import Registry
from orchestra_jax.rollout.environment import Episode, ToolEnvironment

__all__ = ["EnvSetup", "GradingUnavailable", "ENVIRONMENTS", "ENV_SECTIONS", "DATA_ENV_DEFAULTS", "DataEnvSection",
           "DemoEnvSection", "RecordEnvironment", "demo_environment", "data_environment", "data_env_config",
           "load_task_records", "eval_group", "parse_preference", "register_task_family"]


class GradingUnavailable(UserError):
  """A grader (the LLM judge) failed after its retries; the message names the endpoint and the record."""


@dataclasses.dataclass
class EnvSetup:
  """Everything the loop needs from a task family: tools, tasks, grading, preferences, warm-up data."""

  env: ToolEnvironment
  aliases: list[str]  # tool features of the reward, counted by alias
  train_tasks: list[dict[str, Any]]
  eval_tasks: dict[str, list[dict[str, Any]]]  # group name (a preference, a benchmark) -> tasks
  grade: Callable[[dict, Any, Episode], float]  # (task, Trajectory, its Episode) -> outcome in {0, 1}
  preference_vector: Callable[[dict], np.ndarray]  # task -> [len(aliases) + 3] weights
  sft_examples: Callable[[Any, list[dict], int], list[tuple[list[int], list[int]]]] | None = None


def _bad(key: str, why: str) -> config_lib.ConfigFileError:
  return config_lib.ConfigFileError(f"bad value for config key '{key}': {why}")


def _typed(cls, env):
  """The family's typed `env` section: a TrainingConfig carries it built and checked; a plain ConfigDict (tests,
  notebooks) is built here, so every family body reads typed fields either way."""
  return env if isinstance(env, cls) else cls(**env.to_dict())


# --- demo ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class DemoEnvSection:
  """The `env` section for `env.name="demo"` (configs/demo.py)."""

  KEY: ClassVar[str] = "env"
  name: str = "demo"
  num_train_tasks: int = 480
  num_eval_tasks: int = 60  # per preference
  # Presets mixed in training, each evaluated separately. One preference per run: a 10M-parameter policy
  # trained on a mix collapses onto the always-right expert before it learns to read the preference.
  preferences: tuple[str, ...] = ("cheap",)

  def __post_init__(self):
    for key in ("num_train_tasks", "num_eval_tasks"):
      if getattr(self, key) < 1:
        raise _bad(f"env.{key}", f"must be >= 1, got {getattr(self, key)}")
    if not self.preferences:
      raise _bad("env.preferences", "name at least one preference preset")


@contextlib.contextmanager
def demo_environment(cfg):
  """`cfg`: a TrainingConfig, or a training ConfigDict."""
  from orchestra_jax.demo import world as demo

  e = _typed(DemoEnvSection, cfg.env)
  prefs = list(e.preferences)
  with demo.DemoWorld(seed=cfg.seed) as w:
    yield EnvSetup(
        env=w.env(), aliases=list(w.aliases),
        train_tasks=demo.make_tasks(e.num_train_tasks, seed=cfg.seed, preference=prefs),
        eval_tasks={p: demo.make_tasks(e.num_eval_tasks, seed=cfg.seed + 10_000, preference=p) for p in prefs},
        grade=lambda task, traj, episode: w.grade(task, traj.final_answer),
        preference_vector=w.preference_vector, sft_examples=demo.sft_examples)


# --- records of the data format --------------------------------------------------------------------------

def _paths(value: Any) -> list[str]:
  if isinstance(value, str):
    return [value] if value else []
  return [str(v) for v in value if v]


def load_task_records(paths: Sequence[str]) -> list[dict[str, Any]]:
  """Records of the data format -> task dicts (JSON-able: they go to the rollout logs as they are).

  Environment records keep their task JSON under "tau2_task"; a toolscale record's `metadata.domain_dir` is made
  absolute against its file's directory."""
  from orchestra_jax.data import format as data_format

  tasks, seen = [], set()
  for path in paths:
    for s in data_format.read_jsonl(path):
      if s.id in seen:
        raise data_format.DataFormatError(f"{path}: record id {s.id!r} appears in more than one training file")
      seen.add(s.id)
      task: dict[str, Any] = {"id": s.id, "kind": s.kind, "question": s.question}
      if s.kind == "qa":
        task["answer"] = s.answer
      else:
        task["domain"] = s.domain
        task["tau2_task"] = s.task
      if s.kind == "toolscale":
        domain_dir = (s.metadata or {}).get("domain_dir")
        if not isinstance(domain_dir, str) or not domain_dir:
          raise data_format.DataFormatError(
              f"{path}: record {s.id!r}: field 'metadata.domain_dir': a toolscale record needs the directory of its "
              "synthesised domain (as `orchestra synth` writes it)")
        task["domain_dir"] = str((Path(path).parent / domain_dir).resolve())
      for key in ("tools", "alias_map", "preference", "preference_text"):
        value = getattr(s, key)
        if value:
          task[key] = value
      tasks.append(task)
  return tasks


def eval_group(task: Mapping[str, Any]) -> str:
  """The name a task's evaluation metrics are reported under: "qa", "tau2-airline", "toolscale-bank"."""
  return "qa" if task["kind"] == "qa" else f"{task['kind']}-{task['domain']}"


class RecordEnvironment(ToolEnvironment):
  """Routes each task to the environment of its kind: QA, a built-in tau2 domain or a synthesised domain.

  Domain environments are built on first use and cached (one per domain or domain directory), so a data file
  that never mentions tau2 needs no user simulator."""

  def __init__(self, qa_env: Callable[[], ToolEnvironment], domain_env: Callable[[str | Any], Any]):
    self._make_qa, self._make_domain = qa_env, domain_env
    self._qa: ToolEnvironment | None = None
    self._domains: dict[str, Any] = {}
    self._lock = threading.Lock()

  def _domain(self, task: Mapping[str, Any]):
    key = task.get("domain_dir") or task["domain"]
    with self._lock:
      if key not in self._domains:
        if task.get("domain_dir"):
          from orchestra_jax.envs.synth_domain import load_domain_dir
          self._domains[key] = self._make_domain(load_domain_dir(task["domain_dir"]))
        else:
          self._domains[key] = self._make_domain(task["domain"])
      return self._domains[key]

  def new_episode(self, task: dict[str, Any], rollout_id: str) -> Episode:
    if task.get("kind", "qa") == "qa":
      with self._lock:
        if self._qa is None:
          self._qa = self._make_qa()
      return self._qa.new_episode(task, rollout_id)
    env = self._domain(task)
    episode_task = {k: v for k, v in task.items() if k != "tau2_task"}
    episode_task["task"] = env.resolve_task(task["tau2_task"])
    return env.new_episode(episode_task, rollout_id)

  def close(self) -> None:
    for env in [self._qa, *self._domains.values()]:
      if env is not None and hasattr(env, "close"):
        env.close()


def _check_records(tasks: list[dict[str, Any]], catalog, aliases: list[str], default_preference: Mapping[str, float],
                   source: str) -> None:
  """Data errors (an alias map the catalog refuses, a preference over unknown features) before any rollout."""
  from orchestra_jax.data.format import DataFormatError
  from orchestra_jax.data.preferences import preference_array

  from orchestra_jax.tools.qa_env import offer_tools

  for task in tasks:
    try:
      remapped = catalog.remap(task["alias_map"]) if task.get("alias_map") else catalog
      if task.get("tools") and task["kind"] == "qa":
        offered, _ = offer_tools(remapped, task["tools"], task["id"])
        if "answer" not in offered.tools:
          raise ValueError("'tools' offers no `answer` alias, so no episode of it could ever end")
      preference_array(task.get("preference") or default_preference, aliases)
    except (ValueError, UserError) as e:
      raise DataFormatError(f"{source}: record {task['id']!r}: {e}") from None


def parse_preference(text: str, key: str = "env.default_preference") -> dict[str, float]:
  """"outcome=1, -cost=0.5, expert-1=-0.5" -> {"outcome": 1.0, "-cost": 0.5, "expert-1": -0.5}."""
  out: dict[str, float] = {}
  for item in (p.strip() for p in text.split(",")):
    if not item:
      continue
    name, sep, weight = item.rpartition("=")
    try:
      if not sep or not name.strip():
        raise ValueError
      out[name.strip()] = float(weight)
    except ValueError:
      raise config_lib.ConfigFileError(f"bad value for config key '{key}': {item!r} is not FEATURE=WEIGHT "
                                       "(e.g. 'outcome=1, -cost=0.5')") from None
  return out


@dataclasses.dataclass(frozen=True)
class DataEnvSection:
  """The `env` section for `env.name="data"`; `data_env_config(...)` writes one into a config file."""

  KEY: ClassVar[str] = "env"
  BUILT_WITH: ClassVar[str] = " for env.name='data'; build it with orchestra_jax.environments.data_env_config(...)"
  name: str = "data"
  train_data: tuple[str, ...] | str = ()  # JSONL files of the training-data format (orchestra_jax/data/format.py)
  eval_data: tuple[str, ...] | str = ()  # () = hold out num_eval_tasks training records
  num_eval_tasks: int = 64  # held out, or the first N of eval_data (0 = all of eval_data)
  catalog: str = ""  # tool catalog JSON ('' = configs/tools/default_catalog.json)
  default_preference: str = "outcome=1"  # FEATURE=WEIGHT, ... for records without `preference`
  corpus: str = ""  # BM25 over a {id, contents} JSONL for `search`
  retriever_url: str = ""  # or a remote retriever (tools/search.py RemoteRetriever)
  topk: int = 10  # documents per search
  judge_endpoint: str = ""
  judge_model: str = ""
  judge_api_key_env: str = ""
  judge_prompt: str = "reference"
  user_endpoint: str = ""
  user_model: str = ""
  user_api_key_env: str = ""
  user_temperature: float = 0.0
  expert_mode: str = "delegate"  # tau2 call_expert: the expert acts ("delegate") or only advises ("advice")
  read_timeout: float = 300.0  # seconds, every endpoint
  max_retries: int = 3

  def __post_init__(self):
    parse_preference(self.default_preference)
    if self.expert_mode not in ("delegate", "advice"):
      raise _bad("env.expert_mode", f"{self.expert_mode!r} (delegate | advice)")
    if self.judge_prompt not in JUDGE_PROMPTS:
      raise _bad("env.judge_prompt", f"{self.judge_prompt!r} (known: {', '.join(JUDGE_PROMPTS)})")
    if bool(self.judge_endpoint) != bool(self.judge_model):
      raise config_lib.ConfigFileError("config keys 'env.judge_endpoint' and 'env.judge_model' go together: set "
                                       "both or neither")
    if self.corpus and self.retriever_url:
      raise config_lib.ConfigFileError("config keys 'env.corpus' and 'env.retriever_url' exclude each other")
    if self.num_eval_tasks < 0 or self.topk < 1 or self.read_timeout <= 0 or self.max_retries < 0:
      raise config_lib.ConfigFileError("bad value in config section 'env': num_eval_tasks and max_retries must be "
                                       ">= 0, topk >= 1, read_timeout > 0")


@contextlib.contextmanager
def data_environment(cfg):
  """`cfg`: a TrainingConfig, or a training ConfigDict."""
  from orchestra_jax.data.preferences import alias_map_to_remap, preference_array
  from orchestra_jax.tools.catalog import Catalog

  e = _typed(DataEnvSection, cfg.env)
  train_paths = _paths(e.train_data)
  if not train_paths:
    raise config_lib.ConfigFileError("config key 'env.train_data' is empty: give one or more JSONL files of the "
                                     "training-data format (orchestra_jax/data/format.py)")
  catalog = Catalog.load(e.catalog) if e.catalog else Catalog.default()
  aliases = list(catalog.aliases)
  default_preference = parse_preference(e.default_preference)
  tasks = load_task_records(train_paths)
  if e.eval_data:
    eval_tasks = load_task_records(_paths(e.eval_data))
    if e.num_eval_tasks:
      eval_tasks = eval_tasks[:e.num_eval_tasks]
  else:  # hold out a seeded sample of the training records
    order = list(range(len(tasks)))
    random.Random(f"orchestra-eval/{cfg.seed}").shuffle(order)
    held = set(order[:e.num_eval_tasks])
    eval_tasks = [t for i, t in enumerate(tasks) if i in held]
    tasks = [t for i, t in enumerate(tasks) if i not in held]
  for t in tasks + eval_tasks:
    if t.get("alias_map"):  # a record names models; each must be called at the endpoint serving it
      t["alias_map"] = alias_map_to_remap(t["alias_map"], catalog)
  if len(tasks) < cfg.prompts_per_step:
    raise config_lib.ConfigFileError(
        f"config key 'env.train_data': {len(tasks)} training records (after holding out {len(eval_tasks)} for "
        f"evaluation) are fewer than prompts_per_step={cfg.prompts_per_step}")
  _check_records(tasks, catalog, aliases, default_preference, ", ".join(train_paths))
  _check_records(eval_tasks, catalog, aliases, default_preference, "evaluation records")
  needs_user = any(t["kind"] != "qa" for t in tasks + eval_tasks)
  if needs_user and not (e.user_endpoint and e.user_model):
    raise config_lib.ConfigFileError(
        "config keys 'env.user_endpoint' and 'env.user_model' are empty, but the data has tau2/toolscale records: "
        "their customer is an LLM user simulator behind an OpenAI-compatible endpoint")
  client_options = {"read_timeout": e.read_timeout, "max_retries": e.max_retries}

  with contextlib.ExitStack() as stack:
    def make_qa():
      from orchestra_jax.tools.qa_env import QAEnvironment
      retriever = None
      if e.corpus:
        from orchestra_jax.tools.search import BM25Retriever
        retriever = BM25Retriever.from_jsonl(e.corpus)
      elif e.retriever_url:
        from orchestra_jax.tools.search import RemoteRetriever
        retriever = RemoteRetriever(e.retriever_url)
      return QAEnvironment(catalog, retriever, topk=e.topk, client_options=client_options)

    user_chat = None
    if needs_user:
      from orchestra_jax.tools.llm_client import ChatClient
      user_client = ChatClient(e.user_endpoint, e.user_model, e.user_api_key_env or None,
                               read_timeout=e.read_timeout, max_retries=e.max_retries)
      stack.callback(user_client.close)
      user_chat = functools.partial(user_client.chat, temperature=e.user_temperature)

    def make_domain(domain):
      from orchestra_jax.envs.user import LLMUserSimulator
      from orchestra_jax.tools.tau2_env import Tau2Environment
      return Tau2Environment(domain, catalog, lambda task: LLMUserSimulator(user_chat, task),
                             client_options=client_options, expert_mode=e.expert_mode, on_missing_judge="skip")

    judge = None
    if e.judge_endpoint:
      judge = LLMJudge(e.judge_endpoint, e.judge_model, e.judge_prompt, api_key_env=e.judge_api_key_env or None,
                       read_timeout=e.read_timeout, max_retries=e.max_retries)
      stack.callback(judge.close)

    def grade(task: Mapping[str, Any], traj, episode) -> float:
      if task["kind"] == "qa":
        try:
          return float(grade_answer(task["question"], traj.final_answer, task["answer"], judge)["correct"])
        except JudgeUnavailable as err:  # after the client's retries: grading it wrong would bias the reward
          raise GradingUnavailable(
              f"the judge at {e.judge_endpoint} failed on record {task['id']!r}: {err}; the run stops before "
              "saving this step; rerun the same command to resume from the last checkpoint") from None
      # NL assertions need an LLM judge; no shipped airline/retail task has them, so they are skipped.
      return float(episode.grade_info(on_missing_judge="skip").success)

    def preference_vector(task: Mapping[str, Any]) -> np.ndarray:
      return preference_array(task.get("preference") or default_preference, aliases)

    groups: dict[str, list[dict[str, Any]]] = {}
    for t in eval_tasks:
      groups.setdefault(eval_group(t), []).append(t)
    env = stack.enter_context(contextlib.closing(RecordEnvironment(make_qa, make_domain)))
    yield EnvSetup(env=env, aliases=aliases, train_tasks=tasks, eval_tasks=groups, grade=grade,
                   preference_vector=preference_vector)


# The "task_family" category of orchestra_jax/registry.py: `env.name` -> a context manager `fn(config)` that yields
# an EnvSetup; `config` is the run's `training_config.TrainingConfig`, whose `env` is the family's section of
# ENV_SECTIONS, or the plain ConfigDict for a family without one. A user's module (config key `imports`) adds a
# family with `@register_task_family("mine")` (and, for a typed `env`, its dataclass in ENV_SECTIONS).
ENVIRONMENTS: Registry[Callable[[Any], Any]] = Registry("task_family")
register_task_family = ENVIRONMENTS.register
register_task_family("demo")(demo_environment)
register_task_family("data")(data_environment)

# env.name -> the dataclass its `env` section is built into (`training_config.TrainingConfig.from_config`).
ENV_SECTIONS: dict[str, type] = {"demo": DemoEnvSection, "data": DataEnvSection}

# The `env` section of a `data` config, every key with its default (DataEnvSection's).
DATA_ENV_DEFAULTS = {f.name: f.default for f in dataclasses.fields(DataEnvSection)}


def data_env_config(**changes: Any) -> ml_collections.ConfigDict:
  """The `env` section for `env.name="data"`: `DATA_ENV_DEFAULTS` with `changes` (unknown keys refused), so a
  config file lists every key and each can be overridden on the command line. Checked when the run validates
  its config, after the overrides."""
  unknown = sorted(set(changes) - set(DATA_ENV_DEFAULTS))
  if unknown:
    raise config_lib.ConfigFileError(f"unknown config key 'env.{unknown[0]}' (known: {', '.join(DATA_ENV_DEFAULTS)})")
  return ml_collections.ConfigDict({**DATA_ENV_DEFAULTS, **changes})
