"""Converters from the source datasets to `Sample`s.

* `convert_frames`: FRAMES JSONL (`{id, question, answer}` per line; the packaged `frames/frames_824.jsonl.gz`).
* `convert_hle`: Humanity's Last Exam from the user's own copy (JSONL, JSON or parquet with `question` and
  `answer`; rows with an image are skipped unless asked). HLE is gated and carries a canary string: it is never
  shipped with this project and must not be trained on, so its records are marked `metadata.eval_only`.
* `convert_tau2`: the tasks of a built-in tau2 domain (`tau2.Domain.load(name)`).
* `convert_toolscale`: rows in the ToolScale layout (docs/design.md section 7): `id`, `description`,
  `user_scenario{persona, instructions{task_instructions, reason_for_call, known_info, unknown_info, domain}}`,
  `initial_state`, `evaluation_criteria{actions[{action_id, name, arguments}], communicate_info, ...}`. The
  published parquet stores `arguments` as one struct holding every argument name of the whole dataset, so
  null arguments are dropped; timestamps become ISO dates; nested fields may also be JSON strings.

Parquet needs `pyarrow`, which is not a dependency of this package: without it `read_rows` raises
`MissingDependencyError` saying to `pip install pyarrow` (or to convert the file to JSONL).
"""

from __future__ import annotations

import datetime
import decimal
import gzip
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestra_jax.data.format import DataFormatError, Sample, decode_lines, scenario_text
from orchestra_jax.tau2.domain import Domain
from orchestra_jax.tau2.synth_domain import load_domain_dir
from orchestra_jax.errors import UserError
from orchestra_jax.resources import DataNotFoundError, data_dir, find_data_file

__all__ = ["MissingDependencyError", "read_rows", "convert_frames", "convert_hle", "convert_tau2",
           "convert_toolscale", "default_frames_path"]

log = logging.getLogger(__name__)


class MissingDependencyError(UserError, ImportError):
  """An optional package is needed for this input (e.g. pyarrow for parquet)."""


# --- reading rows -------------------------------------------------------------------------------------------
def _jsonable(value: Any) -> Any:
  """Plain JSON values from what parquet readers return (timestamps, decimals, bytes)."""
  if isinstance(value, dict):
    return {str(k): _jsonable(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_jsonable(v) for v in value]
  if isinstance(value, datetime.datetime):
    if value.time() == datetime.time(0) and value.tzinfo is None:
      return value.date().isoformat()
    return value.isoformat()
  if isinstance(value, (datetime.date, datetime.time)):
    return value.isoformat()
  if isinstance(value, decimal.Decimal):
    return float(value)
  if isinstance(value, (bytes, bytearray)):
    return None  # binary payloads (images) are not part of the training format
  return value


def _located_rows(path: str | os.PathLike) -> list[tuple[str, Any]]:
  """(where, row) for every row of a .jsonl / .json / .parquet file (.jsonl and .json may be gzipped, `.gz`);
  `where` is "file:line" or "file: row i"."""
  path = Path(path)
  if not path.is_file():
    raise DataFormatError(f"input file not found: {path}")
  suffixes = [x.lower() for x in path.suffixes[-2:]]
  suffix = suffixes[-2] if suffixes[-1:] == [".gz"] and len(suffixes) == 2 else path.suffix.lower()
  if suffix == ".parquet":
    try:
      import pyarrow.parquet as pq  # noqa: PLC0415  late: optional dependency (parquet only)
    except ImportError:
      raise MissingDependencyError(f"{path}: reading parquet needs pyarrow, which orchestra-jax does not install; "
                                   "run `pip install pyarrow` (or convert the file to JSONL first)") from None
    try:
      rows = pq.read_table(path).to_pylist()
    except Exception as e:  # pyarrow raises its own error types for corrupt files
      raise DataFormatError(f"{path}: cannot read parquet: {e}") from None
    return [(f"{path}: row {i}", _jsonable(r)) for i, r in enumerate(rows)]
  # Read as bytes and decoded here, so a binary file is a DataFormatError naming it (and its line), not a
  # UnicodeDecodeError traceback.
  opener = gzip.open if path.suffix.lower() == ".gz" else open
  if suffix == ".json":
    with opener(path, "rb") as f:
      text = "".join(line for _, line in decode_lines(f, path))
    try:
      data = json.loads(text)
    except json.JSONDecodeError as e:
      raise DataFormatError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    if isinstance(data, Mapping) and isinstance(data.get("data"), list):
      data = data["data"]
    if not isinstance(data, list):
      raise DataFormatError(f"{path}: a .json input must hold a list of records")
    return [(f"{path}: row {i}", r) for i, r in enumerate(data)]
  out = []
  with opener(path, "rb") as f:
    for lineno, line in decode_lines(f, path):
      if not line.strip():
        continue
      try:
        out.append((f"{path}:{lineno}", json.loads(line)))
      except json.JSONDecodeError as e:
        raise DataFormatError(f"{path}:{lineno}: not valid JSON (column {e.colno}: {e.msg})") from None
  return out


def read_rows(path: str | os.PathLike) -> list[dict[str, Any]]:
  """The rows of a .jsonl, .json (a list) or .parquet file as JSON objects."""
  rows = []
  for where, row in _located_rows(path):
    if not isinstance(row, dict):
      raise DataFormatError(f"{where}: a row must be a JSON object, got {type(row).__name__}")
    rows.append(row)
  return rows


def _text_field(row: Mapping[str, Any], key: str, where: str, *, allow_number: bool = False) -> str:
  value = row.get(key)
  if allow_number and isinstance(value, (int, float)) and not isinstance(value, bool):
    value = str(value)
  if not isinstance(value, str) or not value.strip():
    got = "missing" if key not in row else f"got {json.dumps(value)[:60]}"
    raise DataFormatError(f"{where}: field '{key}': must be a non-empty string ({got})")
  return value


def _row_id(row: Mapping[str, Any], where: str, index: int) -> str:
  value = row.get("id")
  if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value).strip():
    return str(value)
  if value is None:
    return str(index)
  raise DataFormatError(f"{where}: field 'id': must be a string or an integer, got {json.dumps(value)[:60]}")


def _unique(samples: list[Sample], source: str) -> list[Sample]:
  seen: set[str] = set()
  for s in samples:
    if s.id in seen:
      raise DataFormatError(f"{source}: field 'id': {s.id!r} appears twice")
    seen.add(s.id)
  return samples


# --- QA -----------------------------------------------------------------------------------------------------
def default_frames_path() -> Path:
  """The 824 FRAMES questions: `frames/frames_824.jsonl` (or `.jsonl.gz`) under the data dir (packaged copy,
  or `$ORCHESTRA_DATA_DIR`)."""
  path = data_dir() / "frames" / "frames_824.jsonl"
  try:
    return find_data_file(path)
  except DataNotFoundError:
    return path  # reading it names the missing file


def convert_frames(path: str | os.PathLike | None = None, *, id_prefix: str = "frames/") -> list[Sample]:
  """FRAMES rows -> "qa" samples (id = id_prefix + the row's id; other fields go to metadata)."""
  path = Path(path) if path is not None else default_frames_path()
  samples = []
  for i, (where, row) in enumerate(_located_rows(path)):
    if not isinstance(row, dict):
      raise DataFormatError(f"{where}: a row must be a JSON object")
    extra = {k: v for k, v in row.items() if k not in ("id", "question", "answer")}
    samples.append(Sample(id=id_prefix + _row_id(row, where, i), kind="qa",
                          question=_text_field(row, "question", where),
                          answer=_text_field(row, "answer", where, allow_number=True),
                          metadata={"source": "frames", **extra}))
  return _unique(samples, str(path))


_HLE_METADATA = ("answer_type", "category", "raw_subject")


def convert_hle(path: str | os.PathLike, *, include_images: bool = False, id_prefix: str = "hle/") -> list[Sample]:
  """HLE rows (the user's own copy) -> "qa" samples marked `metadata.eval_only` (never train on HLE).
  Rows whose `image` is non-empty are skipped (logged) unless `include_images`; then the image is dropped and
  `metadata.had_image` is set. Only answer_type, category and raw_subject are kept as metadata (no canary)."""
  path = Path(path)
  samples, skipped = [], 0
  for i, (where, row) in enumerate(_located_rows(path)):
    if not isinstance(row, dict):
      raise DataFormatError(f"{where}: a row must be a JSON object")
    had_image = bool(row.get("image"))
    if had_image and not include_images:
      skipped += 1
      continue
    meta: dict[str, Any] = {"source": "hle", "eval_only": True}
    meta.update({k: row[k] for k in _HLE_METADATA if isinstance(row.get(k), str)})
    if had_image:
      meta["had_image"] = True
    samples.append(Sample(id=id_prefix + _row_id(row, where, i), kind="qa",
                          question=_text_field(row, "question", where),
                          answer=_text_field(row, "answer", where, allow_number=True), metadata=meta))
  if skipped:
    log.info("%s: skipped %d rows with an image (include_images=True keeps them without the image)", path, skipped)
  return _unique(samples, str(path))


# --- environments -------------------------------------------------------------------------------------------
def _env_question(task: Mapping[str, Any], fallback: str) -> str:
  text = scenario_text(task.get("user_scenario"))
  if not text and isinstance(task.get("ticket"), str):
    text = task["ticket"].strip()
  return text or fallback


def convert_tau2(domain: str, split: str | None = None, *, data_dir: str | os.PathLike | None = None,
                 id_prefix: str | None = None) -> list[Sample]:
  """The tasks of a built-in tau2 domain (all, or those of `split`) -> "tau2" samples. `tools` lists the
  domain's tool names (randomisation adds call_expert aliases)."""
  dom = Domain.load(domain, data_dir)
  tasks = dom.split(split) if split is not None else dom.tasks
  prefix = f"tau2/{domain}/" if id_prefix is None else id_prefix
  samples = []
  for task in tasks:
    meta: dict[str, Any] = {"source": "tau2"}
    if split is not None:
      meta["split"] = split
    samples.append(Sample(id=prefix + task.id, kind="tau2", domain=domain,
                          question=_env_question(task.raw, f"tau2 {domain} task {task.id}"),
                          task=json.loads(json.dumps(task.raw)), tools=list(dom.tool_names), metadata=meta))
  return _unique(samples, f"tau2 domain {domain}")


_TASK_KEYS = ("id", "description", "user_scenario", "initial_state", "evaluation_criteria", "ticket", "annotations")


def _maybe_json(value: Any, where: str, field: str) -> Any:
  if isinstance(value, str) and value.strip()[:1] in ("{", "["):
    try:
      return json.loads(value)
    except json.JSONDecodeError as e:
      raise DataFormatError(f"{where}: field '{field}': a JSON string that does not parse ({e.msg})") from None
  return value


def _toolscale_task(row: Mapping[str, Any], where: str, task_id: str) -> dict[str, Any]:
  task: dict[str, Any] = {"id": task_id}
  for key in _TASK_KEYS[1:]:
    if key in row:
      task[key] = _maybe_json(row[key], where, key)
  scenario = task.get("user_scenario")
  if not isinstance(scenario, dict):
    raise DataFormatError(f"{where}: field 'user_scenario': must be an object, got {json.dumps(scenario)[:60]}")
  if isinstance(scenario.get("instructions"), str):
    scenario["instructions"] = _maybe_json(scenario["instructions"], where, "user_scenario.instructions")
  crit = task.get("evaluation_criteria")
  if not isinstance(crit, dict):
    raise DataFormatError(f"{where}: field 'evaluation_criteria': must be an object, got {json.dumps(crit)[:60]}")
  actions = crit.get("actions") or []
  if not isinstance(actions, list):
    raise DataFormatError(f"{where}: field 'evaluation_criteria.actions': must be an array")
  clean = []
  for i, a in enumerate(actions):
    if not isinstance(a, dict) or not isinstance(a.get("name"), str) or not a["name"]:
      raise DataFormatError(f"{where}: field 'evaluation_criteria.actions[{i}].name': must be a non-empty string")
    a = dict(a)
    args = _maybe_json(a.get("arguments"), where, f"evaluation_criteria.actions[{i}].arguments") or {}
    if not isinstance(args, dict):
      raise DataFormatError(f"{where}: field 'evaluation_criteria.actions[{i}].arguments': must be an object")
    a["arguments"] = {k: v for k, v in args.items() if v is not None}  # parquet's union struct: drop absent ones
    a = {k: v for k, v in a.items() if v is not None or k == "arguments"}
    clean.append(a)
  crit = {k: v for k, v in crit.items() if v is not None}
  crit["actions"] = clean
  task["evaluation_criteria"] = crit
  return task


def convert_toolscale(path: str | os.PathLike, *, domain: str | None = None,
                      domain_dir: str | os.PathLike | None = None, id_prefix: str = "toolscale/") -> list[Sample]:
  """ToolScale-layout rows -> "toolscale" samples. The domain is `domain`, else the row's `domain`, else
  `user_scenario.instructions.domain`. `domain_dir`: a synthesised domain directory (db.json, tools.json, ...)
  the tasks run in; it is stored as `metadata.domain_dir` and its tool names fill `tools`."""
  path = Path(path)
  tool_names: list[str] = []
  if domain_dir is not None:
    tool_names = list(load_domain_dir(domain_dir).tool_names)
  samples = []
  for i, (where, row) in enumerate(_located_rows(path)):
    if not isinstance(row, dict):
      raise DataFormatError(f"{where}: a row must be a JSON object")
    task_id = _row_id(row, where, i)
    task = _toolscale_task(row, where, task_id)
    instructions = task["user_scenario"].get("instructions")
    name = domain or row.get("domain") or (instructions.get("domain") if isinstance(instructions, dict) else None)
    if not isinstance(name, str) or not name.strip():
      raise DataFormatError(f"{where}: field 'user_scenario.instructions.domain': missing; pass domain= to say "
                            "which domain the rows belong to")
    meta: dict[str, Any] = {"source": "toolscale"}
    if domain_dir is not None:
      meta["domain_dir"] = str(domain_dir)
    samples.append(Sample(id=f"{id_prefix}{name}/{task_id}", kind="toolscale", domain=name,
                          question=_env_question(task, f"{name} task {task_id}"), task=task,
                          tools=list(tool_names), metadata=meta))
  return _unique(samples, str(path))
