"""`orchestra eval`: run an orchestrator on a benchmark, grade it, report accuracy, cost, latency and tool use.

    orchestra eval --config orchestrator_8b --benchmark frames --model runs/ckpt --limit 100 \\
        --judge-endpoint http://127.0.0.1:8200 --judge-model Qwen/Qwen3-32B --out runs/eval/frames-ckpt

Benchmarks (`BENCHMARKS`):

* `frames`: FRAMES (`data.converters.convert_frames`, the shipped 824 questions), QA tools of the catalog
  (`tools.qa_env.QAEnvironment`). `search` needs `--corpus FILE` (BM25 over `{id, contents}` JSONL) or
  `--retriever-url URL`; without either, search answers with an error and the orchestrator must do without.
* `hle`: Humanity's Last Exam, ONLY from the user's own copy (`--hle-path FILE`; never shipped, never trained on).
* `tau2-airline`, `tau2-retail`, `tau2-mock`: tau2 domains (`tools.tau2_env.Tau2Environment`); the customer is an
  LLM user simulator behind `--user-endpoint URL --user-model NAME`. Split: `eval.tau2_split` (default "base",
  every task). NL assertions (no shipped airline/retail task has them) are skipped.
* `--tasks FILE` replaces the benchmark's items with records of the training-data format (`data.format`), e.g. with
  `alias_map`, `preference_text` and `preference` per item.

Orchestrators:

* `--model DIR`: our checkpoint (or an HF Qwen3 directory) through the continuous-batching `Sampler` and the
  multi-turn `AgentLoop`, as `orchestra train` evaluates (greedy unless `eval.temperature` says otherwise). Items
  stream: each is graded and written the moment its row ends, while other rows keep decoding.
* `--orchestrator-endpoint URL --orchestrator-model NAME`: any OpenAI-compatible model as the orchestrator
  (baselines): the episode's messages and tool schemas go out, the reply's `tool_calls` are checked against the
  schemas (`chat_format.validate_tool_calls`) and run with `Episode.call`, results go back as `tool` messages,
  until a call ends the episode, the reply has no tool call, or `eval.max_turns`. Items run `eval.workers` at a time.

Grading (QA): exact match after SQuAD normalisation (`reward.outcome.exact_match`), then numeric equality
(`numeric_match`), then, with `--judge-endpoint/--judge-model`, an LLM judge through `ChatClient` with one of two
prompts (`--judge-prompt`; default `hle` for hle, `reference` otherwise):

* `hle`: the HLE judge: extract the response's final answer, reason, then `correct: yes|no`;
* `reference`: "is the response equivalent to the gold answer? yes or no".

An item without a final answer is wrong ("no_answer"); an unparseable judge reply is wrong ("judge_unparsed").
A judge call that FAILS (endpoint down) writes nothing for that item, so a rerun retries it. tau2 items are graded
by `Tau2Episode.grade_info` (tau2's reward; correct = reward 1).

Per item, `OUT/results.jsonl` gets one line: id, prediction, gold, correct, score, judged_by (exact | numeric |
judge | judge_unparsed | no_answer | none | tau2), the judge's reply, cost_usd (tools + the orchestrator's own
tokens, priced by the catalog's `orchestrator` prices, or for an endpoint orchestrator by the catalog alias serving
that model if any), tool_cost_usd, orchestrator_cost_usd, latency_s (tool latency + the endpoint orchestrator's
call latency; for `--model` the shared batched decode has no per-item latency, so tools only), wall_s, tool_counts
(by alias), tool_calls, turns, finish_reason, the calls made, and the item's preference when it has one.

Resumable: each line is written with one write, flushed and fsynced; a rerun with the same --out skips items
already there (a torn last line from a crash is cut off first); `run.json` pins the benchmark and orchestrator of
the directory, so results of different runs never mix.

Report: accuracy, mean cost, mean latency, tool-call shares, and where items carry a preference the mean
preference reward (`reward.rewards.preference_reward`, over the group of evaluated items sharing that preference:
the min-max normalisation is relative to this run), as a markdown table on stdout, `OUT/summary.json` and
`OUT/accuracy_vs_cost.png` (one point per run; `--compare DIR ...` adds other runs' summaries to table and plot).

Settings come from the config file: an optional `eval` section (keys of `EvalSettings`), else `rollout` (sampler
and loop sizes; not temperature or max_turns) and `generate.max_new_tokens`, else the defaults below. `mesh` and
`tokenizer_dir` are used as in training.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import dataclasses
import functools
import json
import math
import os
import re
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Callable

from orchestra_jax.errors import UserError

__all__ = ["BENCHMARKS", "JUDGE_PROMPTS", "EvalError", "EvalSettings", "settings_from_config", "load_tasks",
           "LLMJudge", "JudgeVerdict", "judge_messages", "parse_judge_reply", "grade_answer", "ResultsFile",
           "summarize", "preference_reward_mean", "format_table", "plot_accuracy_cost", "add_eval_parser",
           "run_eval", "main", "HLE_JUDGE_PROMPT", "REFERENCE_JUDGE_PROMPT"]

BENCHMARKS = ("frames", "hle", "tau2-airline", "tau2-retail", "tau2-mock")
JUDGE_PROMPTS = ("hle", "reference")
RESULTS_FILE = "results.jsonl"
SUMMARY_FILE = "summary.json"
RUN_CONFIG_FILE = "run_config.json"
RUN_FILE = "run.json"
PLOT_FILE = "accuracy_vs_cost.png"
_TEXT_CHARS = 2000  # replies kept per record (judge reply, last orchestrator text, tool results)


class EvalError(UserError, ValueError):
  """A bad eval argument, setting or output directory; the message is one line naming it."""


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

def _tau2_domain(benchmark: str) -> str | None:
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
  from orchestra_jax.data import converters, format as data_format

  domain = _tau2_domain(benchmark)
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


# --- the judge ------------------------------------------------------------------------------------------------

# After the HLE judge prompt (github.com/centerforaisafety/hle, MIT), with the verdict asked for as text.
HLE_JUDGE_PROMPT = """Judge whether the following [response] to [question] is correct or not based on the precise \
and unambiguous [correct_answer] below.

[question]: {question}

[response]: {response}

Your judgement must be in the format and criteria specified below:

extracted_final_answer: The final exact answer extracted from the [response]. Put the extracted answer as 'None' if \
there is no exact, final answer to extract from the response.

[correct_answer]: {correct_answer}

reasoning: Explain why the extracted_final_answer is correct or incorrect based on [correct_answer], focusing only \
on if there are meaningful differences between [correct_answer] and the extracted_final_answer. Do not comment on \
any background to the problem, do not attempt to solve the problem, do not argue for any answer different than \
[correct_answer], focus only on whether the answers match.

correct: Answer 'yes' if extracted_final_answer matches the [correct_answer] given above, or is within a small margin \
of error for numerical problems. Answer 'no' otherwise, i.e. if there is any inconsistency, ambiguity, \
non-equivalency, or if the extracted answer is incorrect.

confidence: The extracted confidence score between 0% and 100% from [response]. Put 100 if there is no confidence \
score available."""

REFERENCE_JUDGE_PROMPT = """Question: {question}

Gold answer: {correct_answer}

Response: {response}

Is the response equivalent to the gold answer (the same final answer; wording, formatting and a small margin of \
error for numbers do not matter)? Answer with one word: yes or no."""

_PROMPTS = {"hle": HLE_JUDGE_PROMPT, "reference": REFERENCE_JUDGE_PROMPT}
_CORRECT_LINE = re.compile(r"correct\s*[:=]\s*[*_'\"`\s]*(yes|no)\b", re.IGNORECASE)
_EXTRACTED_LINE = re.compile(r"extracted_final_answer\s*[:=]\s*(.*)", re.IGNORECASE)
_YES_NO = re.compile(r"\b(yes|no)\b", re.IGNORECASE)


def judge_messages(style: str, question: str, prediction: str, gold: str) -> list[dict[str, str]]:
  """The judge's chat: one user message in the chosen prompt style."""
  if style not in _PROMPTS:
    raise EvalError(f"unknown judge prompt {style!r}; choose one of {', '.join(JUDGE_PROMPTS)}")
  return [{"role": "user", "content": _PROMPTS[style].format(question=question, response=prediction,
                                                              correct_answer=gold)}]


def parse_judge_reply(style: str, text: str) -> tuple[bool | None, str | None]:
  """(verdict, extracted answer) from a judge reply; verdict None when the reply says neither yes nor no.

  hle: the last `correct: yes|no` line (a bare yes/no reply is accepted too); reference: the first yes/no word.
  Any `<think>…</think>` block is ignored."""
  body = text.split("</think>")[-1] if "</think>" in text else text
  extracted = None
  if style == "hle":
    m = _EXTRACTED_LINE.search(body)
    if m:
      extracted = m.group(1).strip().strip("*").strip() or None
    found = _CORRECT_LINE.findall(body)
    if found:
      return found[-1].lower() == "yes", extracted
    bare = body.strip().strip(".*!").strip().lower()
    return ({"yes": True, "no": False}.get(bare), extracted)
  m = _YES_NO.search(body)
  return (m.group(1).lower() == "yes" if m else None), None


@dataclasses.dataclass(frozen=True)
class JudgeVerdict:
  correct: bool | None  # None: the reply could not be read
  reply: str
  extracted: str | None
  cost_usd: float
  latency_s: float


class JudgeUnavailable(RuntimeError):
  """The judge endpoint failed; the item is left ungraded (not written) so a rerun retries it."""


class LLMJudge:
  """An LLM judge behind an OpenAI-compatible endpoint (`tools.llm_client.ChatClient`)."""

  def __init__(self, endpoint: str, model: str, style: str, *, api_key_env: str | None = None,
               max_tokens: int = 1024, read_timeout: float = 300.0, max_retries: int = 3):
    from orchestra_jax.tools.llm_client import ChatClient
    if style not in JUDGE_PROMPTS:
      raise EvalError(f"unknown --judge-prompt {style!r}; choose one of {', '.join(JUDGE_PROMPTS)}")
    self.style, self.model, self.endpoint, self.max_tokens = style, model, endpoint, max_tokens
    self.client = ChatClient(endpoint, model, api_key_env, read_timeout=read_timeout, max_retries=max_retries)

  def __call__(self, question: str, prediction: str, gold: str) -> JudgeVerdict:
    result = self.client.chat(judge_messages(self.style, question, prediction, gold), max_tokens=self.max_tokens,
                              temperature=0.0)
    if not result.ok:
      raise JudgeUnavailable(result.error or "the judge call failed")
    correct, extracted = parse_judge_reply(self.style, result.text)
    return JudgeVerdict(correct, result.text, extracted, result.cost_usd, result.latency_s)

  def close(self) -> None:
    self.client.close()


def grade_answer(question: str, prediction: str | None, gold: str, judge: LLMJudge | None) -> dict[str, Any]:
  """Grading fields of a QA record: correct, score, judged_by (+ judge reply, extracted answer, judge cost)."""
  from orchestra_jax.reward.outcome import exact_match, numeric_match

  if prediction is None:
    return {"correct": False, "score": 0.0, "judged_by": "no_answer"}
  if exact_match(prediction, gold):
    return {"correct": True, "score": 1.0, "judged_by": "exact"}
  if numeric_match(prediction, gold):
    return {"correct": True, "score": 1.0, "judged_by": "numeric"}
  if judge is None:
    return {"correct": False, "score": 0.0, "judged_by": "none"}
  verdict = judge(question, prediction, gold)
  out = {"correct": bool(verdict.correct), "score": float(bool(verdict.correct)),
         "judged_by": "judge" if verdict.correct is not None else "judge_unparsed",
         "judge_reply": verdict.reply[:_TEXT_CHARS], "judge_cost_usd": verdict.cost_usd}
  if verdict.extracted is not None:
    out["judge_extracted"] = verdict.extracted
  return out


# --- results.jsonl --------------------------------------------------------------------------------------------

class ResultsFile:
  """Append-only JSONL of per-item results: one write per line, flushed and fsynced; thread-safe."""

  def __init__(self, path: str | os.PathLike):
    self.path = Path(path)
    self._lock = threading.Lock()

  def load(self) -> list[dict[str, Any]]:
    """Every complete line. A torn last line (a crash mid-write) is cut off the file; a bad complete line is an
    error naming it."""
    if not self.path.exists():
      return []
    data = self.path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):
      print(f"orchestra eval: dropping an incomplete last line of {self.path} (a crash mid-write); "
            "that item runs again", file=sys.stderr)
      with open(self.path, "r+b") as f:
        f.truncate(end)
        f.flush()
        os.fsync(f.fileno())
    records = []
    for number, line in enumerate(data[:end].decode("utf-8").splitlines(), 1):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise EvalError(f"{self.path}:{number}: not valid JSON ({e.msg}); fix or remove that line") from None
      if not isinstance(record, dict) or not isinstance(record.get("id"), str):
        raise EvalError(f"{self.path}:{number}: a result line must be a JSON object with a string 'id'")
      records.append(record)
    return records

  def append(self, record: Mapping[str, Any]) -> None:
    line = json.dumps(record, ensure_ascii=False, sort_keys=True, allow_nan=False) + "\n"
    with self._lock:
      new = not self.path.exists()
      with open(self.path, "a", encoding="utf-8") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())
      if new:
        _fsync_dir(self.path.parent)


def _fsync_dir(path: Path) -> None:
  try:
    fd = os.open(path, os.O_RDONLY)
  except OSError:
    return
  try:
    os.fsync(fd)
  except OSError:
    pass
  finally:
    os.close(fd)


def _write_json(path: Path, obj: Any) -> None:
  tmp = path.with_name(path.name + ".tmp")
  tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
  os.replace(tmp, path)


# --- per-item records -----------------------------------------------------------------------------------------

def _calls(traj) -> list[dict[str, Any]]:
  return [{"name": c.name, "alias": c.alias, "model": c.model, "cost_usd": c.cost_usd, "latency_s": c.latency_s,
           "error": c.error, "turn": c.turn_index} for c in traj.tool_calls]


def _finite(x: float) -> float:
  return float(x) if math.isfinite(x) else 0.0


def _item_record(benchmark: str, task: Mapping[str, Any], traj, grading: Mapping[str, Any], *, turns: int,
                 orchestrator_cost: float, orchestrator_latency: float | None, orchestrator_tokens: tuple[int, int],
                 wall_s: float, last_text: str | None, error: str | None = None) -> dict[str, Any]:
  tool_cost = sum(c.cost_usd for c in traj.tool_calls)
  tool_latency = traj.latency_s
  record = {
      "id": task["id"], "benchmark": benchmark, "question": task.get("question"),
      "prediction": traj.final_answer, "gold": task.get("answer"),
      **grading,
      "cost_usd": _finite(tool_cost + orchestrator_cost), "tool_cost_usd": _finite(tool_cost),
      "orchestrator_cost_usd": _finite(orchestrator_cost),
      "orchestrator_tokens": {"prompt": orchestrator_tokens[0], "completion": orchestrator_tokens[1]},
      "latency_s": _finite(tool_latency + (orchestrator_latency or 0.0)), "tool_latency_s": _finite(tool_latency),
      "orchestrator_latency_s": None if orchestrator_latency is None else _finite(orchestrator_latency),
      "wall_s": _finite(wall_s), "tool_counts": traj.tool_counts("alias"), "tool_calls": len(traj.tool_calls),
      "turns": turns, "finish_reason": traj.finish_reason, "calls": _calls(traj),
      "last_text": None if last_text is None else last_text[:_TEXT_CHARS],
  }
  if task.get("preference"):
    record["preference"] = dict(task["preference"])
  if error:
    record["error"] = error
  return record


class _Grader:
  """Grades one finished episode (QA: exact / numeric / judge; tau2: the episode's reward)."""

  def __init__(self, benchmark: str, judge: LLMJudge | None):
    self.benchmark, self.judge = benchmark, judge
    self.is_tau2 = _tau2_domain(benchmark) is not None

  def __call__(self, task: Mapping[str, Any], traj, episode) -> dict[str, Any]:
    if not self.is_tau2:
      return grade_answer(task["question"], traj.final_answer, task["answer"], self.judge)
    info = episode.grade_info(on_missing_judge="skip")
    out = {"correct": bool(info.success), "score": float(info.reward), "judged_by": "tau2",
           "tau2": {"components": info.components, "skipped": list(info.skipped), "note": info.note,
                    "termination": episode.termination_reason}}
    return out


# --- environments ---------------------------------------------------------------------------------------------

def _env_task(task: Mapping[str, Any], env) -> dict[str, Any]:
  """What `new_episode` gets: QA tasks as they are; tau2 tasks with the parsed `envs.Task` under "task"."""
  if "tau2_task" not in task:
    return dict(task)
  out = {k: v for k, v in task.items() if k != "tau2_task"}
  out["task"] = env.resolve_task(task["tau2_task"])
  return out


@contextlib.contextmanager
def _environment(benchmark: str, settings: EvalSettings, catalog, args):
  client_options = {"read_timeout": settings.read_timeout, "max_retries": settings.max_retries}
  domain = _tau2_domain(benchmark)
  if domain is None:
    from orchestra_jax.tools.qa_env import QAEnvironment
    retriever = None
    if args.corpus:
      from orchestra_jax.tools.search import BM25Retriever
      retriever = BM25Retriever.from_jsonl(args.corpus)
    elif args.retriever_url:
      from orchestra_jax.tools.search import RemoteRetriever
      retriever = RemoteRetriever(args.retriever_url)
    env = QAEnvironment(catalog, retriever, topk=settings.topk, client_options=client_options)
    try:
      yield env
    finally:
      env.close()
    return
  from orchestra_jax.envs.user import LLMUserSimulator
  from orchestra_jax.tools.llm_client import ChatClient
  from orchestra_jax.tools.tau2_env import Tau2Environment
  user_client = ChatClient(args.user_endpoint, args.user_model, args.user_api_key_env,
                           read_timeout=settings.read_timeout, max_retries=settings.max_retries)
  chat = functools.partial(user_client.chat, temperature=0.0)
  env = Tau2Environment(domain, catalog, lambda task: LLMUserSimulator(chat, task), client_options=client_options,
                        on_missing_judge="skip")
  try:
    yield env
  finally:
    env.close()
    user_client.close()


# --- orchestrator: our checkpoint through the sampler ---------------------------------------------------------

def _turn_tokens(traj) -> tuple[int, int]:
  """(prompt, completion) tokens an API would bill for the orchestrator's turns (the whole context per turn)."""
  prompt = completion = 0
  for t in traj.turns:
    prompt += len(t.prompt_tokens) if t.prompt_tokens is not None else t.start
    completion += t.end - t.start
  return prompt, completion


def _run_checkpoint(model_dir: str, cfg, settings: EvalSettings, env, catalog, items: list[tuple[int, dict]],
                    finish: Callable[..., None]) -> None:
  from orchestra_jax import checkpoint, sharding as sharding_lib, tokenizer as tokenizer_lib
  from orchestra_jax.rollout.agent_loop import AgentLoop, RolloutConfig
  from orchestra_jax.rollout.sampler import Sampler
  from orchestra_jax.tools.catalog import llm_cost

  if not Path(model_dir).is_dir():
    raise checkpoint.CheckpointError(f"model directory {model_dir} does not exist")
  sharding = None
  if "mesh" in cfg:
    sharding = sharding_lib.ShardingConfig(sharding_lib.make_mesh(tuple(cfg.mesh.shape)))
  tok_dir = cfg.get("tokenizer_dir") or None
  if tok_dir is None and any((Path(model_dir) / f).is_file() for f in checkpoint.TOKENIZER_FILES):
    tok_dir = model_dir
  tok = tokenizer_lib.load_tokenizer(tok_dir)
  model_config, params = checkpoint.load_model(model_dir, sharding)
  max_len = settings.max_len or min(16384, model_config.max_position_embeddings)
  sampler = Sampler(model_config, params, max_len=max_len, batch_size=settings.batch_size, sharding=sharding,
                    chunk_steps=settings.chunk_steps)
  rollout = RolloutConfig(max_turns=settings.max_turns, max_new_tokens=settings.max_new_tokens,
                          temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k,
                          mode=settings.mode, tool_workers=settings.tool_workers,
                          enable_thinking=settings.enable_thinking)
  tasks = [task for _, task in items]

  def on_done(i: int, traj, episode, wall: float) -> None:
    tokens = _turn_tokens(traj)
    cost = llm_cost(catalog.orchestrator_price_in, catalog.orchestrator_price_out, *tokens)
    last = traj.turns[-1].text if traj.turns else None
    finish(tasks[i], traj, episode, turns=len(traj.turns), orchestrator_cost=cost, orchestrator_latency=None,
           orchestrator_tokens=tokens, wall_s=wall, last_text=last)

  loop = AgentLoop(sampler, tok, env, rollout)
  env_tasks = [_env_task(t, env) for t in tasks]
  loop.run(env_tasks, seeds=[pos for pos, _ in items], rollout_ids=[t["id"] for t in tasks], on_done=on_done)


# --- orchestrator: an OpenAI-compatible endpoint --------------------------------------------------------------

def _openai_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
  """Episode messages in OpenAI chat form: `{name, arguments}` tool calls get ids and JSON-text arguments, and
  tool messages the id of the call they answer."""
  out, pending, n = [], [], 0
  for m in messages:
    msg = {k: v for k, v in m.items() if k in ("role", "content", "tool_calls", "tool_call_id", "name")}
    if msg.get("tool_calls"):
      calls = []
      for c in msg["tool_calls"]:
        if isinstance(c, Mapping) and "function" in c:
          calls.append(dict(c))
        else:
          n += 1
          args = c.get("arguments") or {}
          calls.append({"id": c.get("id") or f"call_hist_{n}", "type": "function",
                        "function": {"name": c.get("name"),
                                     "arguments": args if isinstance(args, str) else json.dumps(args)}})
        pending.append(calls[-1]["id"])
      msg["tool_calls"] = calls
      msg["content"] = msg.get("content") or ""
    elif msg.get("role") == "tool":
      call_id = msg.get("tool_call_id")
      if call_id is None and pending:
        call_id = pending.pop(0)
      elif call_id in pending:
        pending.remove(call_id)
      msg["tool_call_id"] = call_id
      msg.pop("name", None)
    out.append(msg)
  return out


class _EndpointOrchestrator:
  """A model behind an OpenAI-compatible endpoint driving one episode at a time (thread-safe)."""

  def __init__(self, endpoint: str, model: str, api_key_env: str | None, catalog, settings: EvalSettings):
    from orchestra_jax.tools.llm_client import ChatClient
    price_in, price_out = catalog.orchestrator_price_in, catalog.orchestrator_price_out
    for backend in catalog.backends.values():  # a catalog alias serving this model: its prices
      if backend.model == model:
        price_in, price_out = backend.price_in, backend.price_out
        break
    self.client = ChatClient(endpoint, model, api_key_env, read_timeout=settings.read_timeout,
                             max_retries=settings.max_retries, price_in_per_m=price_in, price_out_per_m=price_out,
                             pool_size=max(8, settings.workers))
    self.settings = settings

  def run(self, episode, task_id: str):
    from orchestra_jax.rollout import chat_format
    from orchestra_jax.rollout.agent_loop import _run_call
    from orchestra_jax.rollout.trajectory import Trajectory

    s = self.settings
    traj = Trajectory(metadata={"task_id": task_id, "rollout_id": task_id})
    tools = episode.tools()
    messages = _openai_messages(episode.messages())
    turns, cost, latency, tokens, last_text, error = 0, 0.0, 0.0, [0, 0], None, None
    while True:
      if turns >= s.max_turns:
        traj.finish_reason = "max_turns"
        break
      result = self.client.chat(messages, tools=tools, temperature=s.temperature,
                                max_tokens=s.orchestrator_max_tokens or None)
      turns += 1
      cost += result.cost_usd
      latency += result.latency_s
      tokens[0] += result.prompt_tokens
      tokens[1] += result.completion_tokens
      if not result.ok:
        traj.finish_reason, error = "orchestrator_error", result.error
        break
      last_text = result.text
      if not result.tool_calls:
        traj.finish_reason = "no_tool_call" if result.finish_reason != "length" else "length"
        break
      messages.append({"role": "assistant", "content": result.text or "", "tool_calls": result.tool_calls})
      calls = []
      for index, c in enumerate(result.tool_calls):
        fn = c.get("function") if isinstance(c, Mapping) else None
        name = fn.get("name") if isinstance(fn, Mapping) else None
        raw = fn.get("arguments") if isinstance(fn, Mapping) else None
        try:
          args = json.loads(raw) if isinstance(raw, str) and raw.strip() else (raw or {})
          if not isinstance(args, dict):
            raise ValueError("arguments must be a JSON object")
          bad = None
        except ValueError as e:
          args, bad = {}, f"Error: arguments of tool call #{index + 1} ({name}) are not valid JSON: {e}"
        call = chat_format.ToolCall(name=str(name), arguments=args, raw=json.dumps(c, default=str), index=index)
        calls.append((c, call, bad))
      invalid = {e.index: e for e in chat_format.validate_tool_calls([c for _, c, b in calls if b is None], tools)}
      done = False
      for c, call, bad in calls:
        if bad is None and call.index in invalid:
          bad = f"Error: {invalid[call.index].message}"
        if bad is None and done:  # an earlier call of this turn ended the episode: nothing more to pay for
          bad = "Error: the episode has ended; this call was not run"
        if bad is not None:
          content = bad
        else:
          res = _run_call(episode, call)
          res.record.turn_index = turns - 1
          traj.add_tool_call(res.record)
          content = res.content
          if res.done and not done:
            done = True
            traj.final_answer, traj.finish_reason = res.final_answer, "answer"
        messages.append({"role": "tool", "tool_call_id": c.get("id") if isinstance(c, Mapping) else None,
                         "content": content})
      if done:
        break
    return traj, dict(turns=turns, orchestrator_cost=cost, orchestrator_latency=latency,
                      orchestrator_tokens=tuple(tokens), last_text=last_text, error=error)

  def close(self) -> None:
    self.client.close()


def _run_endpoint(args, settings: EvalSettings, env, catalog, items: list[tuple[int, dict]],
                  finish: Callable[..., None]) -> list[str]:
  orch = _EndpointOrchestrator(args.orchestrator_endpoint, args.orchestrator_model, args.orchestrator_api_key_env,
                               catalog, settings)
  errors: list[str] = []

  def one(task: dict) -> None:
    start = time.perf_counter()
    episode = env.new_episode(_env_task(task, env), task["id"])
    try:
      traj, info = orch.run(episode, task["id"])
    finally:
      episode.close()
    finish(task, traj, episode, wall_s=time.perf_counter() - start, **info)

  pool = cf.ThreadPoolExecutor(max_workers=settings.workers, thread_name_prefix="eval")
  try:
    futures = {pool.submit(one, task): task["id"] for _, task in items}
    for f in cf.as_completed(futures):
      exc = f.exception()
      if isinstance(exc, UserError):
        raise exc
      if exc is not None:
        errors.append(f"{futures[f]}: {type(exc).__name__}: {exc}")
  finally:  # on an error or Ctrl-C, queued items are dropped; running ones finish and are written
    pool.shutdown(wait=True, cancel_futures=True)
    orch.close()
  return errors


# --- summary, table, plot -------------------------------------------------------------------------------------

def preference_reward_mean(records: Sequence[Mapping[str, Any]]) -> float | None:
  """Mean preference reward over the records that carry a `preference` (feature -> weight), each group of records
  with the same preference normalised together (`reward.rewards.preference_reward`); None when none has one."""
  groups: dict[str, list[Mapping[str, Any]]] = {}
  for r in records:
    if r.get("preference"):
      groups.setdefault(json.dumps(r["preference"], sort_keys=True), []).append(r)
  if not groups:
    return None
  import numpy as np

  from orchestra_jax.reward.features import NEG_COST, NEG_LATENCY, OUTCOME, preference_vector
  from orchestra_jax.reward.rewards import compute_rewards
  special = {OUTCOME, NEG_COST, NEG_LATENCY}
  total, count = 0.0, 0
  for key, rs in groups.items():
    pref = json.loads(key)
    tools = {k: float(v) for k, v in pref.items() if k not in special}
    names = sorted(set(tools) | {a for r in rs for a in (r.get("tool_counts") or {})})
    p = preference_vector(names, outcome=float(pref.get(OUTCOME, 0.0)), cost=float(pref.get(NEG_COST, 0.0)),
                          latency=float(pref.get(NEG_LATENCY, 0.0)), tools=tools)
    counts = np.array([[float((r.get("tool_counts") or {}).get(a, 0)) for a in names] for r in rs], np.float32)
    counts = counts.reshape(len(rs), len(names))
    outcome = np.array([1.0 if r.get("correct") else 0.0 for r in rs], np.float32)
    cost = np.array([r.get("cost_usd", 0.0) for r in rs], np.float32)
    latency = np.array([r.get("latency_s", 0.0) for r in rs], np.float32)
    rewards = np.asarray(compute_rewards("preference", counts, outcome, cost, latency, p))
    total += float(rewards.sum())
    count += len(rs)
  return total / count


def summarize(records: Sequence[Mapping[str, Any]], *, label: str, benchmark: str,
              meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
  """The run's numbers from its result records."""
  n = len(records)
  mean = lambda key: (sum(float(r.get(key) or 0.0) for r in records) / n) if n else 0.0
  counts: dict[str, int] = {}
  judged: dict[str, int] = {}
  for r in records:
    for alias, c in (r.get("tool_counts") or {}).items():
      counts[alias] = counts.get(alias, 0) + int(c)
    judged[r.get("judged_by", "?")] = judged.get(r.get("judged_by", "?"), 0) + 1
  total_calls = sum(counts.values())
  correct = sum(1 for r in records if r.get("correct"))
  return {
      "label": label, "benchmark": benchmark, "n": n, "correct": correct, "accuracy": correct / n if n else 0.0,
      "mean_cost_usd": mean("cost_usd"), "mean_tool_cost_usd": mean("tool_cost_usd"),
      "mean_orchestrator_cost_usd": mean("orchestrator_cost_usd"), "mean_latency_s": mean("latency_s"),
      "mean_turns": mean("turns"), "mean_tool_calls": mean("tool_calls"),
      "no_answer": (sum(1 for r in records if r.get("prediction") is None) / n) if n else 0.0,
      "tool_calls_total": total_calls,
      "tool_shares": {a: c / total_calls for a, c in sorted(counts.items())} if total_calls else {},
      "judged_by": dict(sorted(judged.items())),
      "judge_cost_usd": sum(float(r.get("judge_cost_usd") or 0.0) for r in records),
      "preference_reward": preference_reward_mean(records),
      **(dict(meta) if meta else {}),
  }


def format_table(summaries: Sequence[Mapping[str, Any]]) -> str:
  """A markdown table, one row per run."""
  lines = ["| run | benchmark | n | accuracy | mean cost (USD) | mean latency (s) | tool shares | pref. reward |",
           "|---|---|---|---|---|---|---|---|"]
  for s in summaries:
    shares = sorted((s.get("tool_shares") or {}).items(), key=lambda kv: -kv[1])
    share_text = ", ".join(f"{a} {v:.0%}" for a, v in shares[:6]) + (", ..." if len(shares) > 6 else "")
    pref = s.get("preference_reward")
    lines.append(f"| {s['label']} | {s['benchmark']} | {s['n']} | {s['accuracy']:.1%} | {s['mean_cost_usd']:.3g} | "
                 f"{s['mean_latency_s']:.3g} | {share_text or '-'} | {'-' if pref is None else f'{pref:.3f}'} |")
  return "\n".join(lines)


def plot_accuracy_cost(summaries: Sequence[Mapping[str, Any]], path: str | os.PathLike) -> Path:
  """Accuracy vs mean cost per task, one labelled point per run (matplotlib, headless)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(6, 4))
  for s in summaries:
    x, y = s["mean_cost_usd"], 100 * s["accuracy"]
    ax.scatter([x], [y], s=40)
    ax.annotate(f"{s['label']} ({s['benchmark']}, n={s['n']})", (x, y), textcoords="offset points", xytext=(5, 5),
                fontsize=8)
  ax.set_xlabel("mean cost per task (USD)"), ax.set_ylabel("accuracy (%)")
  ax.set_ylim(-5, 105)
  costs = [s["mean_cost_usd"] for s in summaries]
  hi = max(costs) if costs else 0.0
  ax.set_xlim(-0.05 * (hi or 1e-6), 1.35 * (hi or 1e-6))
  ax.grid(alpha=0.3)
  ax.set_title("accuracy vs cost")
  fig.tight_layout()
  out = Path(path)
  fig.savefig(out, dpi=110)
  plt.close(fig)
  return out


def _load_compare(paths: Sequence[str]) -> list[dict[str, Any]]:
  out = []
  for p in paths:
    path = Path(p)
    if path.is_dir():
      path = path / SUMMARY_FILE
    try:
      out.append(json.loads(path.read_text()))
    except FileNotFoundError:
      raise EvalError(f"--compare {p}: no {SUMMARY_FILE} there") from None
    except (OSError, json.JSONDecodeError) as e:
      raise EvalError(f"--compare {p}: cannot read {path}: {e}") from None
  return out


# --- the command ----------------------------------------------------------------------------------------------

def add_eval_parser(subparsers) -> argparse.ArgumentParser:
  """Adds `eval` to the `orchestra` sub-command parsers; returns its parser."""
  p = subparsers.add_parser(
      "eval", help="evaluate an orchestrator on FRAMES, HLE or tau2 (accuracy, cost, latency, tool use)",
      formatter_class=argparse.RawDescriptionHelpFormatter,
      description="Run an orchestrator (our checkpoint, or any OpenAI-compatible model) on a benchmark, grade it "
                  "(exact match, then an LLM judge) and report accuracy, cost, latency and tool-call shares. Results "
                  "go to OUT/results.jsonl item by item; a rerun with the same --out resumes.",
      epilog="examples:\n"
             "  orchestra eval --config orchestrator_8b --benchmark frames --model runs/ckpt --limit 50 \\\n"
             "      --judge-endpoint http://127.0.0.1:8200 --judge-model Qwen/Qwen3-32B\n"
             "  orchestra eval --config tiny --benchmark hle --hle-path ~/hle.parquet \\\n"
             "      --orchestrator-endpoint http://127.0.0.1:8101 --orchestrator-model gpt-5 --out runs/eval/hle-gpt5\n"
             "settings (config section 'eval', all optional): "
             + ", ".join(f.name for f in dataclasses.fields(EvalSettings)))
  p.add_argument("--config", required=True, metavar="NAME|FILE",
                 help="a packaged config by name (demo, tiny, orchestrator_8b) or a config file (configs/*.py); its "
                      "optional 'eval' section holds the settings below; any field can be overridden with "
                      "--config.FIELD.PATH=VALUE")
  p.add_argument("--benchmark", required=True, metavar="NAME", help=f"one of {', '.join(BENCHMARKS)}")
  p.add_argument("--model", metavar="DIR", help="orchestrator checkpoint (or HF Qwen3 directory, or orchestra train "
                                                 "WORKDIR[/checkpoints/STEP]), run by the sampler")
  p.add_argument("--orchestrator-endpoint", metavar="URL",
                 help="OpenAI-compatible endpoint of an orchestrator model (instead of --model), for baselines")
  p.add_argument("--orchestrator-model", metavar="NAME", help="model name to send to --orchestrator-endpoint")
  p.add_argument("--orchestrator-api-key-env", metavar="VAR",
                 help="NAME of the environment variable holding the orchestrator endpoint's API key")
  p.add_argument("--limit", type=int, metavar="N", help="evaluate the first N items only")
  p.add_argument("--out", metavar="DIR", help="output directory (default runs/eval/BENCHMARK-ORCHESTRATOR)")
  p.add_argument("--judge-endpoint", metavar="URL", help="OpenAI-compatible endpoint of the LLM judge")
  p.add_argument("--judge-model", metavar="NAME", help="judge model name")
  p.add_argument("--judge-api-key-env", metavar="VAR", help="NAME of the environment variable with the judge's key")
  p.add_argument("--judge-prompt", metavar="STYLE",
                 help="judge prompt: hle (extract the final answer, correct: yes/no) or reference (is the response "
                      "equivalent to the gold answer? yes/no); default hle for hle, reference otherwise")
  p.add_argument("--hle-path", metavar="FILE", help="your own copy of HLE (JSONL, JSON or parquet); never shipped")
  p.add_argument("--tasks", metavar="FILE",
                 help="evaluate these records (training-data JSONL, e.g. with alias_map / preference) instead of the "
                      "benchmark's own items")
  p.add_argument("--catalog", metavar="FILE", help="tool catalog JSON (default configs/tools/default_catalog.json)")
  p.add_argument("--corpus", metavar="FILE", help="JSONL corpus ({id, contents}) for search, indexed with BM25")
  p.add_argument("--retriever-url", metavar="URL", help="remote /retrieve endpoint for search (instead of --corpus)")
  p.add_argument("--user-endpoint", metavar="URL", help="tau2: OpenAI-compatible endpoint of the user simulator")
  p.add_argument("--user-model", metavar="NAME", help="tau2: user simulator model name")
  p.add_argument("--user-api-key-env", metavar="VAR", help="tau2: NAME of the variable with the user endpoint's key")
  p.add_argument("--compare", nargs="+", default=[], metavar="DIR",
                 help="other eval output directories (or summary.json files) to add to the table and the plot")
  p.add_argument("--quiet", action="store_true", help="no progress bar")
  return p


def _check_args(args) -> None:
  """Every argument problem as one line, before anything is loaded."""
  if args.benchmark not in BENCHMARKS:
    raise EvalError(f"unknown benchmark {args.benchmark!r}; choose one of {', '.join(BENCHMARKS)}")
  endpoint = args.orchestrator_endpoint or args.orchestrator_model
  if bool(args.model) == bool(endpoint):
    raise EvalError("give the orchestrator as --model DIR, or as --orchestrator-endpoint URL --orchestrator-model "
                    "NAME (exactly one of the two)")
  if endpoint and not (args.orchestrator_endpoint and args.orchestrator_model):
    raise EvalError("--orchestrator-endpoint and --orchestrator-model go together")
  if bool(args.judge_endpoint) != bool(args.judge_model):
    raise EvalError("--judge-endpoint and --judge-model go together")
  if args.judge_prompt is not None and args.judge_prompt not in JUDGE_PROMPTS:
    raise EvalError(f"unknown --judge-prompt {args.judge_prompt!r}; choose one of {', '.join(JUDGE_PROMPTS)}")
  if args.limit is not None and args.limit < 1:
    raise EvalError(f"--limit must be >= 1, got {args.limit}")
  if _tau2_domain(args.benchmark) and not (args.user_endpoint and args.user_model):
    raise EvalError(f"benchmark {args.benchmark} needs an LLM user simulator: pass --user-endpoint URL "
                    "--user-model NAME")
  if bool(args.user_endpoint) != bool(args.user_model):
    raise EvalError("--user-endpoint and --user-model go together")
  if args.corpus and args.retriever_url:
    raise EvalError("give --corpus or --retriever-url, not both")
  if args.hle_path and args.benchmark != "hle":
    raise EvalError(f"--hle-path is for --benchmark hle, not {args.benchmark}")
  for flag, value in (("--hle-path", args.hle_path), ("--tasks", args.tasks), ("--corpus", args.corpus),
                      ("--catalog", args.catalog)):
    if value and not Path(value).is_file():
      raise EvalError(f"{flag} {value}: file not found")
  if args.model:
    from orchestra_jax.checkpoint import find_train_checkpoint
    find_train_checkpoint(args.model)  # a run's missing step: one line naming the finished ones
  if args.model and not Path(args.model).is_dir():
    raise EvalError(f"--model {args.model}: model directory not found")


def _label(args) -> str:
  return Path(args.model).name if args.model else args.orchestrator_model


def _identity(args) -> dict[str, Any]:
  """What pins an output directory to one run (an endpoint may move; its model name may not)."""
  orch = ({"kind": "checkpoint", "model": str(Path(args.model).absolute())} if args.model else
          {"kind": "endpoint", "model": args.orchestrator_model})
  return {"benchmark": args.benchmark, "orchestrator": orch,
          "tasks": str(Path(args.tasks).absolute()) if args.tasks else None,
          "hle_path": str(Path(args.hle_path).absolute()) if args.hle_path else None}


def _claim_out_dir(out: Path, identity: Mapping[str, Any]) -> None:
  out.mkdir(parents=True, exist_ok=True)
  run_file = out / RUN_FILE
  if run_file.exists():
    try:
      old = json.loads(run_file.read_text())
    except (OSError, json.JSONDecodeError) as e:
      raise EvalError(f"{run_file} is unreadable ({e}); remove it or use another --out") from None
    for key in ("benchmark", "orchestrator", "tasks", "hle_path"):
      if old.get(key) != identity.get(key):
        raise EvalError(f"--out {out} holds results of another run ({key}: {json.dumps(old.get(key))} there, "
                        f"{json.dumps(identity.get(key))} now); use another --out")
  else:
    _write_json(run_file, dict(identity))


def run_eval(args, config_overrides: Sequence[str] = ()) -> dict[str, Any]:
  """Runs `orchestra eval`; prints the table and returns the summary. Raises UserError subclasses (one line)."""
  _check_args(args)
  from orchestra_jax import configs as config_lib
  from orchestra_jax.tools.catalog import Catalog

  cfg = config_lib.load_config(args.config, list(config_overrides))
  settings = settings_from_config(cfg)
  catalog = Catalog.load(args.catalog) if args.catalog else Catalog.default()
  tasks = load_tasks(args.benchmark, hle_path=args.hle_path, tasks_path=args.tasks, tau2_split=settings.tau2_split)
  if args.limit is not None:
    tasks = tasks[:args.limit]
  from orchestra_jax.data.preferences import alias_map_to_remap
  for t in tasks:
    if t.get("alias_map"):  # an item names models; each must be called at the endpoint serving it
      t["alias_map"] = alias_map_to_remap(t["alias_map"], catalog)
  label = _label(args)
  out = Path(args.out) if args.out else Path("runs") / "eval" / re.sub(r"[^A-Za-z0-9_.-]+", "_",
                                                                        f"{args.benchmark}-{label}")
  identity = _identity(args)
  _claim_out_dir(out, identity)
  config_lib.save_config(cfg, out / RUN_CONFIG_FILE)  # the settings this eval ran with, overrides applied
  results = ResultsFile(out / RESULTS_FILE)
  done_ids = {r["id"] for r in results.load()}
  items = [(pos, t) for pos, t in enumerate(tasks) if t["id"] not in done_ids]
  if done_ids and not args.quiet:
    print(f"orchestra eval: {len(tasks) - len(items)} of {len(tasks)} items already in {results.path}; "
          f"running {len(items)}", file=sys.stderr)

  style = args.judge_prompt or ("hle" if args.benchmark == "hle" else "reference")
  judge = None
  if args.judge_endpoint:
    if _tau2_domain(args.benchmark):
      print("orchestra eval: tau2 items are graded by the tau2 reward; the judge is not used", file=sys.stderr)
    else:
      judge = LLMJudge(args.judge_endpoint, args.judge_model, style, api_key_env=args.judge_api_key_env,
                       max_tokens=settings.judge_max_tokens, read_timeout=settings.read_timeout,
                       max_retries=settings.max_retries)
  errors: list[str] = []
  if items:
    grader = _Grader(args.benchmark, judge)
    bar = None
    if not args.quiet:
      from tqdm import tqdm
      bar = tqdm(total=len(tasks), initial=len(tasks) - len(items), desc=f"eval {args.benchmark}",
                 dynamic_ncols=True, file=sys.stderr)
    bar_lock = threading.Lock()

    def finish(task, traj, episode, **info) -> None:
      try:
        grading = grader(task, traj, episode)
      except JudgeUnavailable as e:
        errors.append(f"{task['id']}: judge failed: {e}")
        return
      results.append(_item_record(args.benchmark, task, traj, grading, **info))
      if bar is not None:
        with bar_lock:
          bar.update(1)

    try:
      with _environment(args.benchmark, settings, catalog, args) as env:
        if args.model:
          failures: list[str] = []
          with cf.ThreadPoolExecutor(max_workers=settings.judge_workers, thread_name_prefix="grade") as pool:
            futures: list[cf.Future] = []

            def submit(task, traj, episode, **info):
              futures.append(pool.submit(finish, task, traj, episode, **info))

            _run_checkpoint(args.model, cfg, settings, env, catalog, items, submit)
            for f in futures:
              if f.exception() is not None:
                failures.append(f"{type(f.exception()).__name__}: {f.exception()}")
          errors.extend(failures)
        else:
          errors.extend(_run_endpoint(args, settings, env, catalog, items, finish))
    finally:
      if bar is not None:
        bar.close()
      if judge is not None:
        judge.close()

  selected = {t["id"] for t in tasks}
  records = [r for r in results.load() if r["id"] in selected]
  orchestrator = dict(identity["orchestrator"])
  if args.orchestrator_endpoint:
    orchestrator["endpoint"] = args.orchestrator_endpoint
  meta = {"out": str(out), "orchestrator": orchestrator, "judge_prompt": style,
          "judge": {"endpoint": args.judge_endpoint, "model": args.judge_model} if judge is not None else None,
          "items_selected": len(tasks), "settings": dataclasses.asdict(settings)}
  summary = summarize(records, label=label, benchmark=args.benchmark, meta=meta)
  _write_json(out / SUMMARY_FILE, summary)
  everything = [summary] + _load_compare(args.compare)
  plot_accuracy_cost(everything, out / PLOT_FILE)
  print(format_table(everything))
  if errors:
    raise EvalError(f"{len(errors)} item(s) not graded and not written (rerun the same command to retry them); "
                    f"first: {' '.join(errors[0].split())}")
  return summary


def main(argv: list[str] | None = None) -> int:
  """`python -m orchestra_jax.evaluate ...` (the same as `orchestra eval ...`)."""
  from orchestra_jax import configs as config_lib
  argv = list(sys.argv[1:] if argv is None else argv)
  parser = argparse.ArgumentParser(prog="orchestra")
  add_eval_parser(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
  try:
    overrides, rest = config_lib.split_config_overrides(argv)
    args = parser.parse_args(["eval", *rest])
    run_eval(args, overrides)
  except UserError as e:
    print(f"orchestra: error: {' '.join(str(e).split())}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
