"""`run_eval`: one eval from an `EvalRequest` (what the command line asked for) and config overrides: check the
request, load config, tasks and catalog, claim the output directory, run the orchestrator on the items not yet
there, grade and write each, then summarise, plot and print the table."""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import re
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from orchestra_jax import configs as config_lib
from orchestra_jax.checkpoint import find_train_checkpoint
from orchestra_jax.data.preferences import alias_map_to_remap
from orchestra_jax.evaluate.orchestrators import run_checkpoint, run_endpoint
from orchestra_jax.evaluate.report import format_table, load_compare, plot_accuracy_cost, summarize
from orchestra_jax.evaluate.results import (PLOT_FILE, RESULTS_FILE, RUN_CONFIG_FILE, SUMMARY_FILE, Grader,
                                            ResultsFile, claim_out_dir, item_record, write_json)
from orchestra_jax.evaluate.tasks import BENCHMARKS, environment, load_tasks, settings_from_config, tau2_domain
from orchestra_jax.grading import JUDGE_PROMPTS, EvalError, JudgeUnavailable, LLMJudge
from orchestra_jax.tools.catalog import Catalog


@dataclasses.dataclass(frozen=True)
class EvalRequest:
  """What to evaluate, as `orchestra eval`'s flags say it (field = flag without dashes); `check_request` says what
  goes together."""

  config: str  # packaged config name or config file
  benchmark: str  # one of BENCHMARKS
  model: str | None = None  # orchestrator checkpoint directory, or
  orchestrator_endpoint: str | None = None  # an OpenAI-compatible endpoint serving orchestrator_model
  orchestrator_model: str | None = None
  orchestrator_api_key_env: str | None = None
  limit: int | None = None  # the first N items only
  out: str | None = None  # default runs/eval/BENCHMARK-ORCHESTRATOR
  judge_endpoint: str | None = None
  judge_model: str | None = None
  judge_api_key_env: str | None = None
  judge_prompt: str | None = None  # one of JUDGE_PROMPTS; default hle for hle, reference otherwise
  hle_path: str | None = None
  tasks: str | None = None  # training-data JSONL replacing the benchmark's items
  catalog: str | None = None  # default: the packaged catalog
  corpus: str | None = None
  retriever_url: str | None = None
  user_endpoint: str | None = None  # tau2: the user simulator
  user_model: str | None = None
  user_api_key_env: str | None = None
  compare: tuple[str, ...] = ()  # other runs' output directories or summary.json files
  quiet: bool = False  # no progress bar


def check_request(r: EvalRequest) -> None:
  """Every request problem as one line, before anything is loaded."""
  if r.benchmark not in BENCHMARKS:
    raise EvalError(f"unknown benchmark {r.benchmark!r}; choose one of {', '.join(BENCHMARKS)}")
  endpoint = r.orchestrator_endpoint or r.orchestrator_model
  if bool(r.model) == bool(endpoint):
    raise EvalError("give the orchestrator as --model DIR, or as --orchestrator-endpoint URL --orchestrator-model "
                    "NAME (exactly one of the two)")
  if endpoint and not (r.orchestrator_endpoint and r.orchestrator_model):
    raise EvalError("--orchestrator-endpoint and --orchestrator-model go together")
  if bool(r.judge_endpoint) != bool(r.judge_model):
    raise EvalError("--judge-endpoint and --judge-model go together")
  if r.judge_prompt is not None and r.judge_prompt not in JUDGE_PROMPTS:
    raise EvalError(f"unknown --judge-prompt {r.judge_prompt!r}; choose one of {', '.join(JUDGE_PROMPTS)}")
  if r.limit is not None and r.limit < 1:
    raise EvalError(f"--limit must be >= 1, got {r.limit}")
  if tau2_domain(r.benchmark) and not (r.user_endpoint and r.user_model):
    raise EvalError(f"benchmark {r.benchmark} needs an LLM user simulator: pass --user-endpoint URL "
                    "--user-model NAME")
  if bool(r.user_endpoint) != bool(r.user_model):
    raise EvalError("--user-endpoint and --user-model go together")
  if r.corpus and r.retriever_url:
    raise EvalError("give --corpus or --retriever-url, not both")
  if r.hle_path and r.benchmark != "hle":
    raise EvalError(f"--hle-path is for --benchmark hle, not {r.benchmark}")
  for flag, value in (("--hle-path", r.hle_path), ("--tasks", r.tasks), ("--corpus", r.corpus),
                      ("--catalog", r.catalog)):
    if value and not Path(value).is_file():
      raise EvalError(f"{flag} {value}: file not found")
  if r.model:
    find_train_checkpoint(r.model)  # a run's missing step: one line naming the finished ones
  if r.model and not Path(r.model).is_dir():
    raise EvalError(f"--model {r.model}: model directory not found")


def _label(r: EvalRequest) -> str:
  return Path(r.model).name if r.model else r.orchestrator_model


def _identity(r: EvalRequest) -> dict[str, Any]:
  """What pins an output directory to one run (an endpoint may move; its model name may not)."""
  orch = ({"kind": "checkpoint", "model": str(Path(r.model).absolute())} if r.model else
          {"kind": "endpoint", "model": r.orchestrator_model})
  return {"benchmark": r.benchmark, "orchestrator": orch,
          "tasks": str(Path(r.tasks).absolute()) if r.tasks else None,
          "hle_path": str(Path(r.hle_path).absolute()) if r.hle_path else None}


def run_eval(request: EvalRequest, config_overrides: Sequence[str] = ()) -> dict[str, Any]:
  """Runs one eval; prints the table and returns the summary. Raises UserError subclasses (one line)."""
  r = request
  check_request(r)
  cfg = config_lib.load_config(r.config, list(config_overrides))
  settings = settings_from_config(cfg)
  catalog = Catalog.load(r.catalog) if r.catalog else Catalog.default()
  tasks = load_tasks(r.benchmark, hle_path=r.hle_path, tasks_path=r.tasks, tau2_split=settings.tau2_split)
  if r.limit is not None:
    tasks = tasks[:r.limit]
  for t in tasks:
    if t.get("alias_map"):  # an item names models; each must be called at the endpoint serving it
      t["alias_map"] = alias_map_to_remap(t["alias_map"], catalog)
  label = _label(r)
  out = Path(r.out) if r.out else Path("runs") / "eval" / re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{r.benchmark}-{label}")
  identity = _identity(r)
  claim_out_dir(out, identity)
  config_lib.save_config(cfg, out / RUN_CONFIG_FILE)  # the settings this eval ran with, overrides applied
  results = ResultsFile(out / RESULTS_FILE)
  done_ids = {rec["id"] for rec in results.load()}
  items = [(pos, t) for pos, t in enumerate(tasks) if t["id"] not in done_ids]
  if done_ids and not r.quiet:
    print(f"orchestra eval: {len(tasks) - len(items)} of {len(tasks)} items already in {results.path}; "
          f"running {len(items)}", file=sys.stderr)

  style = r.judge_prompt or ("hle" if r.benchmark == "hle" else "reference")
  judge = None
  if r.judge_endpoint:
    if tau2_domain(r.benchmark):
      print("orchestra eval: tau2 items are graded by the tau2 reward; the judge is not used", file=sys.stderr)
    else:
      judge = LLMJudge(r.judge_endpoint, r.judge_model, style, api_key_env=r.judge_api_key_env,
                       max_tokens=settings.judge_max_tokens, read_timeout=settings.read_timeout,
                       max_retries=settings.max_retries)
  errors: list[str] = []
  if items:
    grader = Grader(r.benchmark, judge)
    bar = None
    if not r.quiet:
      bar = tqdm(total=len(tasks), initial=len(tasks) - len(items), desc=f"eval {r.benchmark}",
                 dynamic_ncols=True, file=sys.stderr)
    bar_lock = threading.Lock()

    def finish(task, traj, episode, **info) -> None:
      try:
        grading = grader(task, traj, episode)
      except JudgeUnavailable as e:
        errors.append(f"{task['id']}: judge failed: {e}")
        return
      results.append(item_record(r.benchmark, task, traj, grading, **info))
      if bar is not None:
        with bar_lock:
          bar.update(1)

    try:
      with environment(r.benchmark, settings, catalog, corpus=r.corpus, retriever_url=r.retriever_url,
                       user_endpoint=r.user_endpoint, user_model=r.user_model,
                       user_api_key_env=r.user_api_key_env) as env:
        if r.model:
          failures: list[str] = []
          with cf.ThreadPoolExecutor(max_workers=settings.judge_workers, thread_name_prefix="grade") as pool:
            futures: list[cf.Future] = []

            def submit(task, traj, episode, **info):
              futures.append(pool.submit(finish, task, traj, episode, **info))

            run_checkpoint(r.model, cfg, settings, env, catalog, items, submit)
            for f in futures:
              if f.exception() is not None:
                failures.append(f"{type(f.exception()).__name__}: {f.exception()}")
          errors.extend(failures)
        else:
          errors.extend(run_endpoint(r.orchestrator_endpoint, r.orchestrator_model, r.orchestrator_api_key_env,
                                     settings, env, catalog, items, finish))
    finally:
      if bar is not None:
        bar.close()
      if judge is not None:
        judge.close()

  selected = {t["id"] for t in tasks}
  records = [rec for rec in results.load() if rec["id"] in selected]
  orchestrator = dict(identity["orchestrator"])
  if r.orchestrator_endpoint:
    orchestrator["endpoint"] = r.orchestrator_endpoint
  meta = {"out": str(out), "orchestrator": orchestrator, "judge_prompt": style,
          "judge": {"endpoint": r.judge_endpoint, "model": r.judge_model} if judge is not None else None,
          "items_selected": len(tasks), "settings": dataclasses.asdict(settings)}
  summary = summarize(records, label=label, benchmark=r.benchmark, meta=meta)
  write_json(out / SUMMARY_FILE, summary)
  everything = [summary] + load_compare(r.compare)
  plot_accuracy_cost(everything, out / PLOT_FILE)
  print(format_table(everything))
  if errors:
    raise EvalError(f"{len(errors)} item(s) not graded and not written (rerun the same command to retry them); "
                    f"first: {' '.join(errors[0].split())}")
  return summary
