"""The training-data format: one JSON object per line, the same for QA and tool-environment tasks.

Fields of a record (`Sample`):

* `id` (string, unique in a file), `kind`: "qa" | "tau2" | "toolscale".
* `question`: the problem for QA; for environment tasks the user's scenario as text (`scenario_text`).
* `answer`: the reference answer (required for "qa", null otherwise).
* `domain`, `task`: environment tasks only (both required there): the domain name and the task's tau2 JSON
  (`id`, `user_scenario`, `evaluation_criteria`, optional `initial_state`, ...).
* `tools`: what this sample offers the orchestrator: catalog aliases (`search-2`, `expert-1`, ...) and, for
  environment tasks, the domain's own tool names. Empty means "everything the rollout has".
* `alias_map`: alias -> `{model?, price_in?, price_out?, latency?}` (USD per million tokens, seconds): the
  per-sample remapping of aliases (`tools.catalog.Catalog.remap` accepts it; see
  `preferences.alias_map_to_remap` for the endpoint of a remapped model).
* `preference`: feature name -> weight over the reward's features `[tool aliases..., "outcome", "-cost",
  "-latency"]` (docs/design.md section 5; positive "-cost" = prefer cheap). Missing features weigh 0.
* `preference_text`: the preference in words (`preferences.preference_text`), shown to the orchestrator.
* `metadata`: free-form JSON (source, split, `domain_dir` of a synthesised domain, ...).

`read_jsonl` validates every line and raises `DataFormatError` naming the file, the line and the field.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from orchestra_jax.tau2.domain import DOMAINS, Domain
from orchestra_jax.tau2.synth_domain import load_domain_dir
from orchestra_jax.errors import UserError

__all__ = ["KINDS", "ENV_KINDS", "ALIAS_FIELDS", "DataFormatError", "Sample", "read_jsonl", "read_samples",
           "write_jsonl", "scenario_text", "sample_domain"]

KINDS = ("qa", "tau2", "toolscale")
ENV_KINDS = ("tau2", "toolscale")
ALIAS_FIELDS = ("model", "price_in", "price_out", "latency")
_FIELDS = ("id", "kind", "question", "answer", "domain", "task", "tools", "alias_map", "preference",
           "preference_text", "metadata")


class DataFormatError(UserError, ValueError):
  """A training record that does not follow the format; the message names the file, line and field."""


def _fail(where: str, field: str, message: str) -> DataFormatError:
  prefix = f"{where}: " if where else ""
  return DataFormatError(f"{prefix}field '{field}': {message}")


def _kind_of(value: Any) -> str:
  if value is None:
    return "null"
  if isinstance(value, bool):
    return "a boolean"
  if isinstance(value, (int, float)):
    return "a number"
  if isinstance(value, str):
    return "a string"
  if isinstance(value, list):
    return "an array"
  if isinstance(value, dict):
    return "an object"
  return type(value).__name__


def _number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclasses.dataclass
class Sample:
  """One training record; see the module docstring for the fields."""

  id: str
  kind: str
  question: str
  answer: str | None = None
  domain: str | None = None
  task: dict[str, Any] | None = None
  tools: list[str] = dataclasses.field(default_factory=list)
  alias_map: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
  preference: dict[str, float] = dataclasses.field(default_factory=dict)
  preference_text: str = ""
  metadata: dict[str, Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    self.validate()

  @property
  def is_env(self) -> bool:
    return self.kind in ENV_KINDS

  def validate(self, where: str = "") -> "Sample":
    """Raise DataFormatError (prefixed with `where`, e.g. "file.jsonl:12") if a field is wrong."""
    if not isinstance(self.id, str) or not self.id.strip():
      raise _fail(where, "id", f"must be a non-empty string, got {_kind_of(self.id)} {self.id!r}")
    if self.kind not in KINDS:
      raise _fail(where, "kind", f"must be one of {', '.join(KINDS)}, got {self.kind!r}")
    if not isinstance(self.question, str) or not self.question.strip():
      raise _fail(where, "question", f"must be a non-empty string, got {_kind_of(self.question)}")
    if self.kind == "qa":
      if not isinstance(self.answer, str):
        raise _fail(where, "answer", f"a 'qa' record needs a string answer, got {_kind_of(self.answer)}")
    elif self.answer is not None and not isinstance(self.answer, str):
      raise _fail(where, "answer", f"must be a string or null, got {_kind_of(self.answer)}")
    if self.kind in ENV_KINDS:
      if not isinstance(self.domain, str) or not self.domain.strip():
        raise _fail(where, "domain", f"a '{self.kind}' record needs the domain name, got {_kind_of(self.domain)}")
      if not isinstance(self.task, dict):
        raise _fail(where, "task", f"a '{self.kind}' record needs the task JSON object, got {_kind_of(self.task)}")
      if not isinstance(self.task.get("id"), (str, int)) or isinstance(self.task.get("id"), bool):
        raise _fail(where, "task.id", f"must be a string, got {_kind_of(self.task.get('id'))}")
      for key in ("user_scenario", "evaluation_criteria"):
        if key in self.task and self.task[key] is not None and not isinstance(self.task[key], dict):
          raise _fail(where, f"task.{key}", f"must be an object, got {_kind_of(self.task[key])}")
      crit = self.task.get("evaluation_criteria") or {}
      actions = crit.get("actions")
      if actions is not None:
        if not isinstance(actions, list):
          raise _fail(where, "task.evaluation_criteria.actions", f"must be an array, got {_kind_of(actions)}")
        for i, a in enumerate(actions):
          if not isinstance(a, dict) or not isinstance(a.get("name"), str):
            raise _fail(where, f"task.evaluation_criteria.actions[{i}]", "must be an object with a string 'name'")
          if a.get("arguments") is not None and not isinstance(a["arguments"], dict):
            raise _fail(where, f"task.evaluation_criteria.actions[{i}].arguments", "must be an object")
    else:
      for key in ("domain", "task"):
        if getattr(self, key) is not None:
          raise _fail(where, key, "only environment records (tau2, toolscale) carry it; use null for 'qa'")
    if not isinstance(self.tools, list) or not all(isinstance(t, str) and t for t in self.tools):
      raise _fail(where, "tools", "must be an array of non-empty strings")
    if len(set(self.tools)) != len(self.tools):
      dup = next(t for t in self.tools if self.tools.count(t) > 1)
      raise _fail(where, "tools", f"lists {dup!r} twice")
    if not isinstance(self.alias_map, dict):
      raise _fail(where, "alias_map", f"must be an object of alias -> fields, got {_kind_of(self.alias_map)}")
    for alias, spec in self.alias_map.items():
      if not isinstance(spec, dict):
        raise _fail(where, f"alias_map.{alias}", f"must be an object, got {_kind_of(spec)}")
      unknown = sorted(set(spec) - set(ALIAS_FIELDS))
      if unknown:
        raise _fail(where, f"alias_map.{alias}.{unknown[0]}", f"unknown field; allowed: {', '.join(ALIAS_FIELDS)}")
      if "model" in spec and (not isinstance(spec["model"], str) or not spec["model"]):
        raise _fail(where, f"alias_map.{alias}.model", f"must be a non-empty string, got {_kind_of(spec['model'])}")
      for key in ("price_in", "price_out", "latency"):
        if key in spec and not (_number(spec[key]) and spec[key] >= 0):
          raise _fail(where, f"alias_map.{alias}.{key}", f"must be a non-negative number, got {spec[key]!r}")
    if not isinstance(self.preference, dict):
      raise _fail(where, "preference", f"must be an object of feature -> weight, got {_kind_of(self.preference)}")
    for name, weight in self.preference.items():
      if not _number(weight):
        raise _fail(where, f"preference.{name}", f"must be a finite number, got {weight!r}")
    if not isinstance(self.preference_text, str):
      raise _fail(where, "preference_text", f"must be a string, got {_kind_of(self.preference_text)}")
    if not isinstance(self.metadata, dict):
      raise _fail(where, "metadata", f"must be an object, got {_kind_of(self.metadata)}")
    return self

  # --- JSON -------------------------------------------------------------------------------------------
  def to_json(self) -> dict[str, Any]:
    """The record as a JSON object (every field present; a fresh copy)."""
    return json.loads(json.dumps({f: getattr(self, f) for f in _FIELDS}))

  def to_line(self) -> str:
    return json.dumps(self.to_json(), ensure_ascii=False, sort_keys=False)

  @classmethod
  def from_json(cls, data: Any, where: str = "") -> "Sample":
    """Build and validate a record from parsed JSON; errors name `where` (e.g. "train.jsonl:12") and the field."""
    if not isinstance(data, Mapping):
      raise DataFormatError(f"{where + ': ' if where else ''}a record must be a JSON object, got {_kind_of(data)}")
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:
      raise _fail(where, unknown[0], f"unknown field; allowed: {', '.join(_FIELDS)}")
    for key in ("id", "kind", "question"):
      if key not in data:
        raise _fail(where, key, "missing (required)")
    try:
      values = json.loads(json.dumps({f: data.get(f) for f in _FIELDS}))  # a private copy
    except (TypeError, ValueError) as e:
      raise DataFormatError(f"{where + ': ' if where else ''}a record must hold JSON values only: {e}") from None
    for key, empty in (("tools", list), ("alias_map", dict), ("preference", dict), ("metadata", dict),
                       ("preference_text", str)):
      if values[key] is None:
        values[key] = empty()
    obj = cls.__new__(cls)  # validated below with `where`, not by __post_init__
    obj.__dict__.update(values)
    return obj.validate(where)

  @classmethod
  def from_line(cls, line: str, where: str = "") -> "Sample":
    try:
      data = json.loads(line)
    except json.JSONDecodeError as e:
      raise DataFormatError(f"{where + ': ' if where else ''}not valid JSON (column {e.colno}: {e.msg})") from None
    return cls.from_json(data, where)

  def replace(self, **changes: Any) -> "Sample":
    """A validated copy with some fields changed."""
    data = self.to_json()
    data.update(json.loads(json.dumps(changes)))
    return Sample.from_json(data)


# --- files --------------------------------------------------------------------------------------------------
def decode_lines(f: Iterable[bytes], path: str | os.PathLike) -> Iterator[tuple[int, str]]:
  """(line number, text) of each line of a file opened in binary mode (plain or `gzip.open`ed). Lines are decoded
  one at a time, so a binary file (a picture, a model, a wrong path) fails as DataFormatError naming file:line,
  not as a UnicodeDecodeError from deep in a text reader's buffer."""
  try:
    for lineno, raw in enumerate(f, 1):
      try:
        text = raw.decode("utf-8")
      except UnicodeDecodeError as e:
        raise DataFormatError(f"{path}:{lineno}: not UTF-8 text (byte {e.start + 1} of the line is "
                              f"{raw[e.start:e.start + 1]!r}); is this a binary file?") from None
      yield lineno, text
  except gzip.BadGzipFile:
    raise DataFormatError(f"{path}: not a gzip file, though its name ends in .gz") from None
  except EOFError:
    raise DataFormatError(f"{path}: the gzip stream ends early (a truncated file?)") from None


def read_jsonl(path: str | os.PathLike) -> list[Sample]:
  """Every record of a JSONL file (blank lines skipped); DataFormatError names the line of the first bad one,
  including a repeated id."""
  path = Path(path)
  try:
    f = open(path, "rb")  # decoded line by line: see decode_lines
  except FileNotFoundError:
    raise DataFormatError(f"training data file not found: {path}") from None
  except OSError as e:
    raise DataFormatError(f"cannot read training data file {path}: {e.strerror or e}") from None
  out: list[Sample] = []
  seen: dict[str, int] = {}
  with f:
    for lineno, line in decode_lines(f, path):
      if not line.strip():
        continue
      sample = Sample.from_line(line, f"{path}:{lineno}")
      if sample.id in seen:
        raise DataFormatError(f"{path}:{lineno}: field 'id': {sample.id!r} repeats the record on line "
                              f"{seen[sample.id]}")
      seen[sample.id] = lineno
      out.append(sample)
  return out


def read_samples(paths: str | os.PathLike | Iterable[str | os.PathLike]) -> list[Sample]:
  """The records of one or more JSONL files, in order; ids must be unique across them."""
  if isinstance(paths, (str, os.PathLike)):
    paths = [paths]
  out: list[Sample] = []
  seen: dict[str, str] = {}
  for p in paths:
    for s in read_jsonl(p):
      if s.id in seen:
        raise DataFormatError(f"{p}: field 'id': {s.id!r} also appears in {seen[s.id]}")
      seen[s.id] = str(p)
      out.append(s)
  if not out:
    raise DataFormatError(f"no records in {', '.join(map(str, paths))}")
  return out


def write_jsonl(path: str | os.PathLike, samples: Iterable[Sample | Mapping[str, Any]]) -> Path:
  """Write records (validated) as JSONL, atomically (a temporary file renamed into place). Returns the path."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(path.name + ".tmp")
  seen: set[str] = set()
  with open(tmp, "w", encoding="utf-8") as f:
    for i, s in enumerate(samples):
      if not isinstance(s, Sample):
        s = Sample.from_json(s, f"record {i}")
      if s.id in seen:
        tmp.unlink()
        raise DataFormatError(f"record {i}: field 'id': {s.id!r} appears twice")
      seen.add(s.id)
      f.write(s.to_line() + "\n")
  os.replace(tmp, path)
  return path


# --- environment records ------------------------------------------------------------------------------------
def scenario_text(user_scenario: Any) -> str:
  """The user's scenario of a tau2 task as text (the `question` of an environment record)."""
  if isinstance(user_scenario, str):
    return user_scenario.strip()
  if not isinstance(user_scenario, Mapping):
    return ""
  parts = []
  persona = user_scenario.get("persona")
  if isinstance(persona, str) and persona.strip():
    parts.append(f"Persona: {persona.strip()}")
  instructions = user_scenario.get("instructions")
  if isinstance(instructions, str):
    parts.append(instructions.strip())
  elif isinstance(instructions, Mapping):
    for key, label in (("reason_for_call", "Reason for call"), ("known_info", "Known info"),
                       ("unknown_info", "Unknown info"), ("task_instructions", "Task instructions")):
      value = instructions.get(key)
      if isinstance(value, str) and value.strip():
        parts.append(f"{label}: {value.strip()}")
  return "\n".join(parts)


def sample_domain(sample: Sample, base_dir: str | os.PathLike | None = None):
  """The environment domain of an environment record: `tau2.Domain.load(domain)` for tau2 records, or the
  synthesised domain at `metadata.domain_dir` (relative to `base_dir`, e.g. the JSONL's folder) for toolscale
  records that carry one."""
  if not sample.is_env:
    raise DataFormatError(f"record {sample.id!r} is a '{sample.kind}' record; it has no environment domain")
  domain_dir = sample.metadata.get("domain_dir")
  if domain_dir:
    path = Path(domain_dir)
    if not path.is_absolute() and base_dir is not None:
      path = Path(base_dir) / path
    return load_domain_dir(path)
  if sample.domain not in DOMAINS:
    raise DataFormatError(f"record {sample.id!r}: domain {sample.domain!r} is not a built-in tau2 domain "
                          f"({', '.join(DOMAINS)}) and the record has no metadata.domain_dir")
  return Domain.load(sample.domain)
