"""The `data` task family: the paper's setting.

Records of the training-data format (`orchestra_jax/data/format.py`) from `env.train_data`, of any mix of kinds,
each routed to its environment by `RecordEnvironment`:
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
from orchestra_jax.data import format as data_format
from orchestra_jax.data.preferences import alias_map_to_remap, preference_array
from orchestra_jax.tau2.synth_domain import load_domain_dir
from orchestra_jax.tau2.user import LLMUserSimulator
from orchestra_jax.errors import UserError
from orchestra_jax.grading import JUDGE_PROMPTS, JudgeUnavailable, LLMJudge, grade_answer
from orchestra_jax.rollout.environment import Episode, ToolEnvironment
from orchestra_jax.task_families.base import (ENV_SECTIONS, EnvSetup, GradingUnavailable, bad_value,
                                              register_task_family, typed_section)
from orchestra_jax.tools.catalog import Catalog
from orchestra_jax.tools.llm_client import ChatClient
from orchestra_jax.tools.qa_env import QAEnvironment, offer_tools
from orchestra_jax.tools.search import BM25Retriever, RemoteRetriever
from orchestra_jax.tools.tau2_env import Tau2Environment

__all__ = ["DATA_ENV_DEFAULTS", "DataEnvSection", "RecordEnvironment", "data_environment", "data_env_config",
           "load_task_records", "eval_group", "parse_preference"]


# --- records of the data format --------------------------------------------------------------------------

def _paths(value: Any) -> list[str]:
  if isinstance(value, str):
    return [value] if value else []
  return [str(v) for v in value if v]


def load_task_records(paths: Sequence[str]) -> list[dict[str, Any]]:
  """Records of the data format -> task dicts (JSON-able: they go to the rollout logs as they are).

  Environment records keep their task JSON under "tau2_task"; a toolscale record's `metadata.domain_dir` is made
  absolute against its file's directory."""
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
  for task in tasks:
    try:
      remapped = catalog.remap(task["alias_map"]) if task.get("alias_map") else catalog
      if task.get("tools") and task["kind"] == "qa":
        offered, _ = offer_tools(remapped, task["tools"], task["id"])
        if "answer" not in offered.tools:
          raise ValueError("'tools' offers no `answer` alias, so no episode of it could ever end")
      preference_array(task.get("preference") or default_preference, aliases)
    except (ValueError, UserError) as e:
      raise data_format.DataFormatError(f"{source}: record {task['id']!r}: {e}") from None


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
  BUILT_WITH: ClassVar[str] = " for env.name='data'; build it with orchestra_jax.task_families.data_env_config(...)"
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
      raise bad_value("env.expert_mode", f"{self.expert_mode!r} (delegate | advice)")
    if self.judge_prompt not in JUDGE_PROMPTS:
      raise bad_value("env.judge_prompt", f"{self.judge_prompt!r} (known: {', '.join(JUDGE_PROMPTS)})")
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
  e = typed_section(DataEnvSection, cfg.env)
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
      retriever = None
      if e.corpus:
        retriever = BM25Retriever.from_jsonl(e.corpus)
      elif e.retriever_url:
        retriever = RemoteRetriever(e.retriever_url)
      return QAEnvironment(catalog, retriever, topk=e.topk, client_options=client_options)

    user_chat = None
    if needs_user:
      user_client = ChatClient(e.user_endpoint, e.user_model, e.user_api_key_env or None,
                               read_timeout=e.read_timeout, max_retries=e.max_retries)
      stack.callback(user_client.close)
      user_chat = functools.partial(user_client.chat, temperature=e.user_temperature)

    def make_domain(domain):
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


register_task_family("data")(data_environment)
ENV_SECTIONS["data"] = DataEnvSection

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
