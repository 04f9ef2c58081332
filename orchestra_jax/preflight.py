"""`orchestra train --check`: what a long run needs, checked in seconds before it holds a pod.

Checks, in order, each a row of a markdown table:
  * the config (`trainer.validate`: every key, value and combination the trainer checks);
  * the starting checkpoint (`init_checkpoint`): its model config is read (never its weights) and must describe the
    configured architecture;
  * the workdir is a writable directory, or can be created (its nearest existing ancestor is one); nothing is
    created or written;
  * the task family's data loads and passes its checks (for `data`: every record file, alias maps, preferences,
    offered tools, the user simulator's settings);
  * (`data`) every tau2/toolscale record resolves as its first rollout will: its domain loads (tau2: the data
    under $ORCHESTRA_DATA_DIR; toolscale: `metadata.domain_dir`), its task is found, and its `tools` are aliases
    of its (remapped) catalog or tools of its domain;
  * every endpoint the run will call answers `GET /v1/models` (one try, connect timeout): each catalog backend,
    also as remapped by the records' `alias_map`s, the tau2 user simulator and the LLM judge. API keys are read
    from the named environment variables; a missing variable is a failure.
Nothing is compiled and no rollout runs. `run_checks` returns the rows; the CLI exits 2 when any row failed.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Callable

import ml_collections

from orchestra_jax import checkpoint, trainer
from orchestra_jax import configs as config_lib
from orchestra_jax.data.format import DataFormatError
from orchestra_jax.tau2.domain import Domain, Task
from orchestra_jax.tau2.synth_domain import SynthDomain, load_domain_dir
from orchestra_jax.errors import UserError
from orchestra_jax.task_families import ENVIRONMENTS, eval_group
from orchestra_jax.tools.catalog import Catalog
from orchestra_jax.tools.llm_client import ChatClient
from orchestra_jax.tools.qa_env import offer_tools
from orchestra_jax.tools.tau2_env import CALL_EXPERT_TOOL, SEND_MESSAGE_TOOL


@dataclasses.dataclass
class Check:
  what: str
  ok: bool
  detail: str


def _step(rows: list[Check], what: str, fn: Callable[[], str]) -> bool:
  """Runs one check; a UserError (or OSError) is its failure, with the message as the detail."""
  try:
    rows.append(Check(what, True, fn()))
    return True
  except (UserError, OSError, ValueError) as e:
    rows.append(Check(what, False, str(e).splitlines()[0] if str(e) else type(e).__name__))
    return False


def _checkpoint(cfg) -> str:
  if not cfg.init_checkpoint:
    return "none: random initialisation"
  found = checkpoint.read_model_config(cfg.init_checkpoint)
  diff = trainer.architecture_mismatch(found, config_lib.model_config(cfg))
  if diff:
    raise config_lib.ConfigFileError(f"{cfg.init_checkpoint} is a different model (differs in {', '.join(diff)})")
  return f"{cfg.init_checkpoint}: {found.num_params() / 1e9:.2f}B parameters, architecture matches"


def _workdir(cfg) -> str:
  """Whether the trainer can use (or create) the workdir, without creating or writing anything: a check that
  mkdirs leaves empty run folders behind (inside the repository, for a relative workdir) even when the run is
  never started."""
  path = Path(cfg.workdir).absolute()  # as the trainer resolves it
  if path.exists():
    if not path.is_dir():
      raise config_lib.ConfigFileError(f"config key 'workdir': {path} exists and is not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
      raise config_lib.ConfigFileError(f"config key 'workdir': {path} is not writable by this user")
    return f"{path} exists and is writable"
  if path.is_symlink():
    raise config_lib.ConfigFileError(f"config key 'workdir': {path} is a broken symbolic link")
  ancestor = path.parent
  while not ancestor.exists():  # ends at the root at the latest
    ancestor = ancestor.parent
  if not ancestor.is_dir():
    raise config_lib.ConfigFileError(f"config key 'workdir': {path} cannot be created: {ancestor} is not a directory")
  if not os.access(ancestor, os.W_OK | os.X_OK):
    raise config_lib.ConfigFileError(f"config key 'workdir': {path} cannot be created: {ancestor} is not writable "
                                     "by this user")
  return f"{path} does not exist yet; it can be created in {ancestor}"


def _catalog(cfg):
  return Catalog.load(cfg.env.catalog) if cfg.env.catalog else Catalog.default()


def _one_line(e: BaseException) -> str:
  text = e.args[0] if isinstance(e, KeyError) and e.args else str(e)  # str(KeyError) would add quotes
  return str(text).splitlines()[0] if str(text) else type(e).__name__


def _resolve_task(domain, task: dict[str, Any]) -> None:
  """The record's task as `Tau2Environment.resolve_task` reads it: a full task JSON (with `user_scenario`) is
  parsed as it is; an id alone must name a task of the domain."""
  if "user_scenario" in task:
    try:
      Task.from_json(task, domain.name)
    except (KeyError, TypeError, AttributeError) as e:
      raise ValueError(f"task {task.get('id')!r} does not parse as a tau2 task ({type(e).__name__}: {e})") from None
    return
  try:
    domain.task(task["id"])
  except KeyError:
    where = domain.root / "tasks.json" if isinstance(domain, SynthDomain) else domain.root / domain.name / "tasks.json"
    raise ValueError(f"domain {domain.name} has no task {str(task['id'])!r} ({len(domain.tasks)} tasks in {where}) "
                     "and the record carries only its id") from None


def _domains(cfg, tasks: list[dict[str, Any]]) -> str:
  """Every tau2/toolscale record resolved as `RecordEnvironment.new_episode` will resolve it, minus the user
  simulator and the rollout: the data row's checks stop at the record format, so a missing domain directory or
  task id used to surface only at the first rollout of that domain, with the pod already training."""
  catalog = _catalog(cfg)
  loaded: dict[str, Any] = {}  # domain name, or toolscale domain directory -> its Domain, or why it did not load
  domain_failures: dict[str, list[str]] = {}  # why a domain did not load -> the ids of its records
  record_failures: list[str] = []
  counts: dict[str, int] = {}
  for task in tasks:
    if task["kind"] == "qa":  # the data row checked their tools; nothing else of theirs can fail to resolve
      continue
    group = eval_group(task)
    counts[group] = counts.get(group, 0) + 1
    key = task.get("domain_dir") or task["domain"]
    if key not in loaded:  # each domain once (both loaders cache too)
      try:
        domain = load_domain_dir(key) if task.get("domain_dir") else Domain.load(task["domain"])
        clash = sorted({SEND_MESSAGE_TOOL, CALL_EXPERT_TOOL} & set(domain.tool_names))
        if clash:
          raise ValueError(f"domain {domain.name} defines tools named {clash}, which the orchestrator needs")
        loaded[key] = domain
      except (UserError, OSError, ValueError) as e:
        loaded[key] = f"{group}: {_one_line(e)}"
    domain = loaded[key]
    if isinstance(domain, str):
      domain_failures.setdefault(domain, []).append(task["id"])
      continue
    try:
      _resolve_task(domain, task["tau2_task"])
      if task.get("tools"):  # remapped first, as the rollout does
        remapped = catalog.remap(task["alias_map"]) if task.get("alias_map") else catalog
        offer_tools(remapped, task["tools"], task["id"], own_tools=domain.tool_names,
                    own_label=f"tools of domain {domain.name}")
    except (UserError, ValueError) as e:
      record_failures.append(f"record {task['id']!r}: {_one_line(e)}")
  problems = [f"{why} ({len(ids)} record{'s' if len(ids) > 1 else ''}, e.g. {ids[0]!r})"
              for why, ids in domain_failures.items()] + record_failures
  if problems:
    failed = sum(len(ids) for ids in domain_failures.values()) + len(record_failures)
    shown = "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
    raise DataFormatError(f"{failed} of {sum(counts.values())} tau2/toolscale records do not resolve: {shown}")
  if not counts:
    return "no tau2/toolscale records"
  return ", ".join(f"{g} {n} records" for g, n in sorted(counts.items())) + \
      ": every domain loads, every task and offered tool resolves"


def endpoints(cfg, tasks: list[dict[str, Any]]) -> list[tuple[str, str, str, str | None]]:
  """(role, base_url, model, api_key_env) of every endpoint a `data` run calls, deduplicated."""
  e = cfg.env
  catalog = _catalog(cfg)
  found: dict[tuple[str, str, str | None], str] = {}
  catalogs = [catalog] + [catalog.remap(t["alias_map"]) for t in tasks if t.get("alias_map")]
  for c in catalogs:
    for alias, backend in c.backends.items():
      found.setdefault((backend.base_url, backend.model, backend.api_key_env), f"tool {alias}")
  if e.user_endpoint and any(t["kind"] != "qa" for t in tasks):
    found.setdefault((e.user_endpoint, e.user_model, e.user_api_key_env or None), "tau2 user simulator")
  if e.judge_endpoint:
    found.setdefault((e.judge_endpoint, e.judge_model, e.judge_api_key_env or None), "judge")
  return [(role, url, model, key) for (url, model, key), role in found.items()]


def _probe(url: str, model: str, key_env: str | None) -> tuple[bool, str]:
  try:
    client = ChatClient(url, model, key_env, connect_timeout=5.0, max_retries=0)
  except ValueError as e:  # a malformed base_url
    return False, str(e)
  with client:
    return client.probe()


def run_checks(cfg: ml_collections.ConfigDict) -> list[Check]:
  rows: list[Check] = []
  typed = []  # the TrainingConfig, for the task family, as the trainer hands it over
  if not _step(rows, "config", lambda: (typed.append(trainer.validate(cfg)), "valid")[1]):
    return rows
  _step(rows, "init_checkpoint", lambda: _checkpoint(cfg))
  _step(rows, "workdir", lambda: _workdir(cfg))
  tasks: list[dict[str, Any]] = []

  def data() -> str:
    with ENVIRONMENTS[cfg.env.name](typed[0]) as setup:
      tasks.extend(setup.train_tasks)
      groups = ", ".join(f"{k} {len(v)}" for k, v in setup.eval_tasks.items())
      tasks.extend(t for g in setup.eval_tasks.values() for t in g)
      return f"{len(setup.train_tasks)} training tasks; evaluation: {groups}"

  if _step(rows, f"data (env.name={cfg.env.name})", data) and cfg.env.name == "data":
    _step(rows, "domains", lambda: _domains(cfg, tasks))
    for role, url, model, key_env in endpoints(cfg, tasks):
      ok, detail = _probe(url, model, key_env)
      rows.append(Check(f"{role}: {url}", ok, detail))
  return rows


def format_checks(rows: list[Check]) -> str:
  lines = ["| check | ok | detail |", "|---|---|---|"]
  lines += [f"| {r.what} | {'yes' if r.ok else 'NO'} | {r.detail.replace('|', '/')} |" for r in rows]
  return "\n".join(lines)


class PreflightFailed(UserError):
  """Some checks of `orchestra train --check` failed; the table above the message says which."""


def check_or_raise(cfg: ml_collections.ConfigDict) -> str:
  """The table, printed by the CLI; raises PreflightFailed (after printing) when any row failed."""
  rows = run_checks(cfg)
  table = format_checks(rows)
  failed = [r.what for r in rows if not r.ok]
  if failed:
    print(table)
    raise PreflightFailed(f"{len(failed)} of {len(rows)} checks failed: {', '.join(failed)}")
  return table
