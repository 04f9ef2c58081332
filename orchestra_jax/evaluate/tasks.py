"""What an eval runs on: the benchmarks, their items as task dicts, the eval settings, and the environment
(QA tools or a tau2 domain) the orchestrator acts in."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterator, Mapping
from typing import Any

from orchestra_jax.data import converters, format as data_format
from orchestra_jax.tau2.user import LLMUserSimulator
from orchestra_jax.grading import EvalError
from orchestra_jax.tools.llm_client import ChatClient
from orchestra_jax.tools.qa_env import QAEnvironment
from orchestra_jax.tools.search import BM25Retriever, RemoteRetriever
from orchestra_jax.tools.tau2_env import Tau2Environment

BENCHMARKS = ("frames", "hle", "tau2-airline", "tau2-retail", "tau2-mock")


# --- settings -------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class EvalSettings:
  """Eval knobs; set them in the config file's optional `eval` section (`--config.eval.max_turns=20`)."""

  max_turns: int = 50  # docs/design.md section 6: 50 turns at evaluation
  max_new_tokens: int = 2048  # per orchestrator turn (default: the config's generate.max_new_tokens if any)
  max_len: int = 0  # sampler cache positions per row; 0 = min(16384, the model's max_position_embeddings)
  batch_size: int = 8  # sampler slots (items decoded together)
  chunk_steps: int = 8
  temperature: float = 0.0  # greedy
  top_p: float = 1.0
  top_k: int = 0
  mode: str = "extend"
  enable_thinking: bool = True
  tool_workers: int = 16
  workers: int = 8  # endpoint orchestrator: items run concurrently
  judge_workers: int = 8  # --model: items graded concurrently while decoding goes on
  judge_max_tokens: int = 1024
  orchestrator_max_tokens: int = 4096  # endpoint orchestrator: max_tokens per call (0 = not sent)
  topk: int = 10  # documents per search
  tau2_split: str = "base"
  read_timeout: float = 300.0  # seconds, every endpoint (judge, orchestrator, user, tools)
  max_retries: int = 3


_FROM_ROLLOUT = ("max_new_tokens", "max_len", "batch_size", "chunk_steps", "top_p", "top_k", "mode",
                 "enable_thinking", "tool_workers")


def settings_from_config(cfg) -> EvalSettings:
  """EvalSettings from a loaded config: defaults <- generate.max_new_tokens <- rollout.* <- eval.*."""
  values = dataclasses.asdict(EvalSettings())
  if "generate" in cfg and "max_new_tokens" in cfg.generate:
    values["max_new_tokens"] = cfg.generate.max_new_tokens
  if "rollout" in cfg:
    for key in _FROM_ROLLOUT:
      if key in cfg.rollout:
        values[key] = cfg.rollout[key]
  if "eval" in cfg:
    for key, value in cfg.eval.items():
      if key not in values:
        raise EvalError(f"unknown config key 'eval.{key}'; known: {', '.join(sorted(values))}")
      values[key] = value
  for key, value in values.items():
    kind = type(getattr(EvalSettings, key))
    if kind is bool:
      ok = isinstance(value, bool)
    elif kind is int:
      ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind is float:
      ok = isinstance(value, (int, float)) and not isinstance(value, bool)
      value = float(value) if ok else value
    else:
      ok = isinstance(value, str)
    if not ok:
      raise EvalError(f"bad value for config key 'eval.{key}': expected {kind.__name__}, got {value!r}")
    values[key] = value
  s = EvalSettings(**values)
  for key in ("max_turns", "max_new_tokens", "batch_size", "chunk_steps", "tool_workers", "workers",
              "judge_workers", "judge_max_tokens", "topk"):
    if getattr(s, key) < 1:
      raise EvalError(f"bad value for config key 'eval.{key}': must be >= 1, got {getattr(s, key)}")
  if s.mode not in ("extend", "rebuild"):
    raise EvalError(f"bad value for config key 'eval.mode': 'extend' or 'rebuild', got {s.mode!r}")
  if s.temperature < 0 or s.read_timeout <= 0 or s.max_retries < 0 or s.max_len < 0:
    raise EvalError("bad value in config section 'eval': temperature, max_len and max_retries must be >= 0, "
                    "read_timeout > 0")
  return s


# --- tasks ----------------------------------------------------------------------------------------------------

def tau2_domain(benchmark: str) -> str | None:
  """The tau2 domain of a `tau2-DOMAIN` benchmark; None for a QA benchmark."""
  return benchmark.split("-", 1)[1] if benchmark.startswith("tau2-") else None


def _task(sample) -> dict[str, Any]:
  """A benchmark item as a task dict: QA items carry `answer`, tau2 items their task JSON under `tau2_task`."""
  task = {"id": sample.id, "question": sample.question}
  if sample.kind == "qa":
    task["answer"] = sample.answer
  else:
    task["tau2_task"] = sample.task
  if sample.tools:
    task["tools"] = list(sample.tools)
  if sample.alias_map:
    task["alias_map"] = sample.alias_map
  if sample.preference_text:
    task["preference_text"] = sample.preference_text
  if sample.preference:
    task["preference"] = dict(sample.preference)
  return task


def load_tasks(benchmark: str, *, hle_path: str | None = None, tasks_path: str | None = None,
               tau2_split: str = "base") -> list[dict[str, Any]]:
  """The benchmark's items as task dicts, in file order (`{id, question, answer, ...}` for QA; tau2 items carry
  the task JSON under `tau2_task`)."""
  domain = tau2_domain(benchmark)
  if tasks_path:
    samples = data_format.read_jsonl(tasks_path)
    want = "qa" if domain is None else "tau2"
    for s in samples:
      if (s.kind == "qa") != (want == "qa"):
        raise EvalError(f"--tasks {tasks_path}: item {s.id!r} is a {s.kind!r} record; benchmark {benchmark} "
                        f"needs {'qa' if want == 'qa' else 'tau2/toolscale'} records")
      if domain is not None and s.domain != domain:
        raise EvalError(f"--tasks {tasks_path}: item {s.id!r} is of domain {s.domain!r}, not {domain!r}")
  elif benchmark == "frames":
    samples = converters.convert_frames()
  elif benchmark == "hle":
    if not hle_path:
      raise EvalError("benchmark hle needs your own copy of Humanity's Last Exam: pass --hle-path FILE "
                      "(JSONL, JSON or parquet with question and answer); HLE is never shipped with orchestra-jax")
    samples = converters.convert_hle(hle_path)
  else:
    try:
      samples = converters.convert_tau2(domain, tau2_split)
    except KeyError as e:
      raise EvalError(f"config key 'eval.tau2_split': {e.args[0]}") from None
  if not samples:
    raise EvalError(f"benchmark {benchmark} has no items")
  return [_task(s) for s in samples]


# --- environments ---------------------------------------------------------------------------------------------

def env_task(task: Mapping[str, Any], env) -> dict[str, Any]:
  """What `new_episode` gets: QA tasks as they are; tau2 tasks with the parsed `tau2.Task` under "task"."""
  if "tau2_task" not in task:
    return dict(task)
  out = {k: v for k, v in task.items() if k != "tau2_task"}
  out["task"] = env.resolve_task(task["tau2_task"])
  return out


@contextlib.contextmanager
def environment(benchmark: str, settings: EvalSettings, catalog, *, corpus: str | None = None,
                retriever_url: str | None = None, user_endpoint: str | None = None, user_model: str | None = None,
                user_api_key_env: str | None = None) -> Iterator[Any]:
  """The benchmark's environment, closed on exit: QA tools (search over `corpus` or at `retriever_url`, else none)
  or a tau2 domain whose customer is the LLM user simulator at `user_endpoint`."""
  client_options = {"read_timeout": settings.read_timeout, "max_retries": settings.max_retries}
  domain = tau2_domain(benchmark)
  if domain is None:
    retriever = None
    if corpus:
      retriever = BM25Retriever.from_jsonl(corpus)
    elif retriever_url:
      retriever = RemoteRetriever(retriever_url)
    env = QAEnvironment(catalog, retriever, topk=settings.topk, client_options=client_options)
    try:
      yield env
    finally:
      env.close()
    return
  user_client = ChatClient(user_endpoint, user_model, user_api_key_env, read_timeout=settings.read_timeout,
                           max_retries=settings.max_retries)
  chat = functools.partial(user_client.chat, temperature=0.0)
  env = Tau2Environment(domain, catalog, lambda task: LLMUserSimulator(chat, task), client_options=client_options,
                        on_missing_judge="skip")
  try:
    yield env
  finally:
    env.close()
    user_client.close()
