"""A synthesised domain on disk, loaded as an `tau2.Domain` (same environments, grading and gold replay).

Directory layout (what `orchestra synth` writes):

* `db.json`: `{table: {key: row}}` (rows are JSON objects; the key is the row's primary key as a string).
* `tools.json`: `{"format": "orchestra-synth/1", "domain": NAME, "description": ..., "data_model": {...},
  "tools": [declarative tool, ...]}` (see `tau2.datamodel` and `tau2.declarative_tools`).
* `policy.md`: the agent policy.
* `tasks.json`: tau2-format tasks (may be empty).
* optional `split_tasks.json`: `{split: [task ids]}`.

`load_domain_dir(path)` validates everything (rows against the data model, foreign keys, tools against the
data model) and returns a `SynthDomain`, cached per directory and file modification times.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestra_jax.tau2.db import Database
from orchestra_jax.tau2.domain import Domain, Task
from orchestra_jax.errors import UserError
from orchestra_jax.tau2.datamodel import DataModel, InvalidSpec
from orchestra_jax.tau2.declarative_tools import ToolDef, compile_tools, make_toolkit

__all__ = ["FORMAT", "DOMAIN_FILES", "SynthDomainError", "SynthDomain", "load_domain_dir", "write_domain_dir",
           "build_domain"]

FORMAT = "orchestra-synth/1"
DOMAIN_FILES = ("db.json", "tools.json", "policy.md", "tasks.json")


class SynthDomainError(UserError, ValueError):
  """A synthesised domain directory that cannot be loaded; the message names the file and the problem."""


class SynthDomain(Domain):
  """An `tau2.Domain` over a declarative toolkit; also carries its data model and tool definitions."""

  def __init__(self, name: str, root: Path | None, model: DataModel, tools: Sequence[ToolDef],
               db: Mapping[str, Mapping[str, Any]], policy: str, tasks: Sequence[Task] = (),
               splits: Mapping[str, Sequence[str]] | None = None, description: str = ""):
    self.data_model = model
    self.tool_defs = tuple(tools)
    self.description = description
    database = Database.from_json({t: dict for t in model.tables}, db)
    super().__init__(name, root or Path("."), database, make_toolkit(name, model, tools), policy, tasks, splits or {})

  def with_tasks(self, tasks: Sequence[Task | Mapping[str, Any]]) -> "SynthDomain":
    """The same domain with other tasks (JSON tasks are parsed)."""
    parsed = [t if isinstance(t, Task) else Task.from_json(t, self.name) for t in tasks]
    return SynthDomain(self.name, self.root, self.data_model, self.tool_defs, self.db.to_json(), self.policy,
                       parsed, {}, self.description)

  def tools_json(self) -> dict[str, Any]:
    return {"format": FORMAT, "domain": self.name, "description": self.description,
            "data_model": self.data_model.to_json(), "tools": [t.to_json() for t in self.tool_defs]}


def build_domain(name: str, model: DataModel, tools: Sequence[ToolDef], db: Mapping[str, Any], policy: str,
                 tasks: Sequence[Mapping[str, Any]] = (), description: str = "") -> SynthDomain:
  """An in-memory domain (the database is validated against the data model first)."""
  clean = model.validate_db(db)
  return SynthDomain(name, None, model, tools, clean, policy, [Task.from_json(t, name) for t in tasks],
                     description=description)


def _read_json(path: Path) -> Any:
  try:
    return json.loads(path.read_text(encoding="utf-8"))
  except FileNotFoundError:
    raise SynthDomainError(f"missing file {path}") from None
  except json.JSONDecodeError as e:
    raise SynthDomainError(f"{path}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None


def load_domain_dir(path: str | os.PathLike) -> SynthDomain:
  """The synthesised domain in `path` (cached until one of its files changes)."""
  root = Path(path).expanduser().resolve()
  if not root.is_dir():
    raise SynthDomainError(f"synthesised domain directory not found: {root}")
  stamps = []
  for name in (*DOMAIN_FILES, "split_tasks.json"):
    p = root / name
    stamps.append(p.stat().st_mtime_ns if p.is_file() else None)
  return _load(str(root), tuple(stamps))


@functools.lru_cache(maxsize=64)
def _load(root_str: str, _stamps: tuple) -> SynthDomain:
  root = Path(root_str)
  spec = _read_json(root / "tools.json")
  if not isinstance(spec, Mapping) or spec.get("format") != FORMAT:
    raise SynthDomainError(f"{root / 'tools.json'}: not an orchestra synthesised-domain file "
                           f"(expected \"format\": \"{FORMAT}\")")
  name = spec.get("domain")
  if not isinstance(name, str) or not name:
    raise SynthDomainError(f"{root / 'tools.json'}: field 'domain' must be the domain name")
  try:
    model = DataModel.from_json(spec.get("data_model"))
  except InvalidSpec as e:
    raise SynthDomainError(f"{root / 'tools.json'}: data_model: {e}") from None
  try:
    tools = compile_tools(spec.get("tools"), model)
  except InvalidSpec as e:
    raise SynthDomainError(f"{root / 'tools.json'}: {e}") from None
  try:
    db = model.validate_db(_read_json(root / "db.json"))
  except InvalidSpec as e:
    raise SynthDomainError(f"{root / 'db.json'}: {e}") from None
  policy_path = root / "policy.md"
  if not policy_path.is_file():
    raise SynthDomainError(f"missing file {policy_path}")
  policy = policy_path.read_text(encoding="utf-8")
  tasks_json = _read_json(root / "tasks.json") if (root / "tasks.json").is_file() else []
  if not isinstance(tasks_json, list):
    raise SynthDomainError(f"{root / 'tasks.json'}: must be a list of tasks")
  tasks = []
  for i, t in enumerate(tasks_json):
    if not isinstance(t, Mapping) or "id" not in t:
      raise SynthDomainError(f"{root / 'tasks.json'}: task {i} must be an object with an 'id'")
    tasks.append(Task.from_json(t, name))
  splits = _read_json(root / "split_tasks.json") if (root / "split_tasks.json").is_file() else {}
  try:
    return SynthDomain(name, root, model, tools, db, policy, tasks, splits, str(spec.get("description") or ""))
  except ValueError as e:  # duplicate task ids and the like
    raise SynthDomainError(f"{root}: {e}") from None


def _write_json(path: Path, data: Any) -> None:
  tmp = path.with_name(path.name + ".tmp")
  tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
  os.replace(tmp, path)


def write_domain_dir(path: str | os.PathLike, domain: SynthDomain,
                     tasks: Sequence[Mapping[str, Any]] | None = None) -> Path:
  """Write db.json, tools.json, policy.md and tasks.json (`tasks`, else the domain's own) into `path`."""
  root = Path(path)
  root.mkdir(parents=True, exist_ok=True)
  _write_json(root / "db.json", domain.db.to_json())
  _write_json(root / "tools.json", domain.tools_json())
  policy = domain.policy if domain.policy.endswith("\n") else domain.policy + "\n"
  (root / "policy.md").write_text(policy, encoding="utf-8")
  if tasks is None:
    tasks = [dict(t.raw) for t in domain.tasks]
  _write_json(root / "tasks.json", list(tasks))
  return root
