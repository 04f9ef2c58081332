"""`orchestra train --check`: what a long run needs, checked in seconds before it holds a pod.

Checks, in order, each a row of a markdown table:
  * the config (`trainer.validate`: every key, value and combination the trainer checks);
  * the starting checkpoint (`init_checkpoint`): its model config is read (never its weights) and must describe the
    configured architecture;
  * the workdir can be created and written;
  * the task family's data loads and passes its checks (for `data`: every record file, alias maps, preferences,
    offered tools, the user simulator's settings);
  * every endpoint the run will call answers `GET /v1/models` (one try, connect timeout): each catalog backend,
    also as remapped by the records' `alias_map`s, the tau2 user simulator and the LLM judge. API keys are read
    from the named environment variables; a missing variable is a failure.
Nothing is compiled and no rollout runs. `run_checks` returns the rows; the CLI exits 2 when any row failed.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any, Callable

import ml_collections

from orchestra_jax.errors import UserError


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
  from orchestra_jax import checkpoint, configs as config_lib
  from orchestra_jax.trainer import architecture_mismatch

  if not cfg.init_checkpoint:
    return "none: random initialisation"
  found = checkpoint.read_model_config(cfg.init_checkpoint)
  diff = architecture_mismatch(found, config_lib.model_config(cfg))
  if diff:
    raise config_lib.ConfigFileError(f"{cfg.init_checkpoint} is a different model (differs in {', '.join(diff)})")
  return f"{cfg.init_checkpoint}: {found.num_params() / 1e9:.2f}B parameters, architecture matches"


def _workdir(cfg) -> str:
  path = Path(cfg.workdir).absolute()
  path.mkdir(parents=True, exist_ok=True)
  with tempfile.NamedTemporaryFile(dir=path, prefix=".check-"):
    pass
  return f"{path} is writable"


def endpoints(cfg, tasks: list[dict[str, Any]]) -> list[tuple[str, str, str, str | None]]:
  """(role, base_url, model, api_key_env) of every endpoint a `data` run calls, deduplicated."""
  from orchestra_jax.tools.catalog import Catalog

  e = cfg.env
  catalog = Catalog.load(e.catalog) if e.catalog else Catalog.default()
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
  from orchestra_jax.tools.llm_client import ChatClient

  try:
    client = ChatClient(url, model, key_env, connect_timeout=5.0, max_retries=0)
  except ValueError as e:  # a malformed base_url
    return False, str(e)
  with client:
    return client.probe()


def run_checks(cfg: ml_collections.ConfigDict) -> list[Check]:
  from orchestra_jax import trainer
  from orchestra_jax.environments import ENVIRONMENTS

  rows: list[Check] = []
  if not _step(rows, "config", lambda: (trainer.validate(cfg), "valid")[1]):
    return rows
  _step(rows, "init_checkpoint", lambda: _checkpoint(cfg))
  _step(rows, "workdir", lambda: _workdir(cfg))
  tasks: list[dict[str, Any]] = []

  def data() -> str:
    with ENVIRONMENTS[cfg.env.name](cfg) as setup:
      tasks.extend(setup.train_tasks)
      groups = ", ".join(f"{k} {len(v)}" for k, v in setup.eval_tasks.items())
      tasks.extend(t for g in setup.eval_tasks.values() for t in g)
      return f"{len(setup.train_tasks)} training tasks; evaluation: {groups}"

  if _step(rows, f"data (env.name={cfg.env.name})", data) and cfg.env.name == "data":
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
