"""The ToolScale-style synthesis pipeline (docs/design.md section 7), driven by any OpenAI-compatible LLM.

Stages, each one prompt (`synth.prompts`), a JSON parse tolerant of code fences, validation and bounded
retries (`synth.llm.StageRunner`):

  tables -> schema (JSON schema per table) -> data_model (primary / foreign keys; compiled into a typed
  `DataModel`) -> rows (per table, in foreign-key order, in batches) -> tools (declarative, see `tau2.declarative_tools`,
  plus the policy) -> intents -> task (one per intent, tau2 format with gold actions) -> evolve (a harder
  version of each kept task, `evolve_rounds` times).

Rows that do not validate (types, enums, unknown columns, duplicate keys, dangling foreign keys) are dropped
and counted; a batch with no valid row is retried. A task or evolved task is kept only if `verify.verify_task`
passes on the generated database (gold actions execute without error, a required write changes the database,
communicate_info occurs in the tool results) and it is not a duplicate of a kept task; every dropped task is
listed with its reason in the report.

`synthesize(client, config, out_dir)` returns a `SynthResult` and, with `out_dir`, writes the domain directory
(db.json, tools.json, policy.md, tasks.json; loadable with `tau2.synth_domain.load_domain_dir`), `train.jsonl`
(training records of `orchestra_jax.data`, kind "toolscale", `metadata.domain_dir` = ".") and
`synth_report.json` (stage counts, usage, dropped rows and tasks with reasons, rejected replies).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestra_jax.data.format import Sample, scenario_text, write_jsonl
from orchestra_jax.data.preferences import randomize_samples
from orchestra_jax.errors import UserError
from orchestra_jax.synth import prompts
from orchestra_jax.tau2.datamodel import IDENT, Column, DataModel, InvalidSpec, Table
from orchestra_jax.tau2.synth_domain import DOMAIN_FILES, SynthDomain, build_domain, write_domain_dir
from orchestra_jax.synth.llm import StageFailed, StageRunner, SynthError
from orchestra_jax.tau2.declarative_tools import ToolDef, compile_tools
from orchestra_jax.synth.verify import action_signature, verify_task

__all__ = ["SynthConfig", "SynthResult", "synthesize", "validate_task_json", "REPORT_FILE", "TRAIN_FILE"]

REPORT_FILE = "synth_report.json"
TRAIN_FILE = "train.jsonl"
_DOMAIN_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")
_REWARD_BASIS = ("DB", "COMMUNICATE", "ACTION", "ENV_ASSERTION")


class SynthConfigError(UserError, ValueError):
  """A synthesis option that cannot work; the message names it."""


@dataclasses.dataclass
class SynthConfig:
  """Options of one synthesis run (the CLI flags map onto these)."""

  domain: str
  num_tasks: int = 10  # intents asked for, i.e. base tasks before verification
  seed: int = 0
  rows_per_table: int = 20
  rows_batch: int = 25  # rows asked for per request
  max_tables: int = 8
  min_tools: int = 4
  max_tools: int = 24
  evolve_rounds: int = 1
  max_retries: int = 2
  temperature: float | None = 0.7
  max_tokens: int | None = 4096
  rows_in_prompt: int = 5  # rows per table shown in intent / task prompts
  check_communicate: bool = True
  randomize: bool = True  # random tools / alias_map / preference in train.jsonl
  overwrite: bool = False

  def __post_init__(self):
    if not isinstance(self.domain, str) or not _DOMAIN_NAME.match(self.domain):
      raise SynthConfigError(f"domain must be a lowercase name (letters, digits, _ or -, starting with a letter), "
                             f"got {self.domain!r}")
    for name in ("num_tasks", "rows_per_table", "rows_batch", "max_tables", "min_tools", "max_tools", "rows_in_prompt"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise SynthConfigError(f"{name} must be a positive integer, got {value!r}")
    for name in ("evolve_rounds", "max_retries"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise SynthConfigError(f"{name} must be an integer >= 0, got {value!r}")
    if self.temperature is not None and not self.temperature >= 0:
      raise SynthConfigError(f"temperature must be >= 0, got {self.temperature!r}")


@dataclasses.dataclass
class SynthResult:
  domain: SynthDomain  # with the kept tasks
  tasks: list[dict[str, Any]]
  samples: list[Sample]
  report: dict[str, Any]
  out_dir: Path | None = None


# --- stage validators (raise InvalidSpec: the message goes back to the LLM) ----------------------------------
def _obj(data: Any, key: str, what: str) -> Any:
  if isinstance(data, Mapping) and key in data:
    return data[key]
  raise InvalidSpec(f"expected a JSON object with {what} under \"{key}\"")


def _validate_tables(data: Any, max_tables: int) -> tuple[str, list[dict[str, str]]]:
  tables = _obj(data, "tables", "a list of tables")
  if not isinstance(tables, list) or not tables:
    raise InvalidSpec("\"tables\" must be a non-empty list of {\"name\", \"description\"}")
  out, seen = [], set()
  for i, t in enumerate(tables[:max_tables]):
    name = t.get("name") if isinstance(t, Mapping) else t
    if not isinstance(name, str) or not IDENT.match(name):
      raise InvalidSpec(f"tables[{i}].name must be a snake_case identifier, got {json.dumps(name)}")
    if name in seen:
      raise InvalidSpec(f"table {name!r} is listed twice")
    seen.add(name)
    desc = t.get("description", "") if isinstance(t, Mapping) else ""
    out.append({"name": name, "description": desc if isinstance(desc, str) else ""})
  description = data.get("description", "")
  return (description.strip() if isinstance(description, str) else ""), out


def _validate_schemas(data: Any, names: Sequence[str]) -> dict[str, Any]:
  schemas = data.get("tables") if isinstance(data, Mapping) and isinstance(data.get("tables"), Mapping) else data
  if not isinstance(schemas, Mapping):
    raise InvalidSpec("expected {\"tables\": {table name: JSON schema}}")
  missing = [n for n in names if n not in schemas]
  if missing:
    raise InvalidSpec(f"no schema for table{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
  out = {}
  for n in names:
    schema = schemas[n]
    if not isinstance(schema, Mapping) or not isinstance(schema.get("properties"), Mapping) or not schema["properties"]:
      raise InvalidSpec(f"{n}: the schema needs a non-empty \"properties\" object")
    required = schema.get("required", [])
    for cname, prop in schema["properties"].items():
      Column.from_schema(cname, prop, isinstance(required, list) and cname in required, n)
    out[n] = dict(schema)
  return out


def _validate_model(data: Any, schemas: Mapping[str, Any], descriptions: Mapping[str, str]) -> DataModel:
  relations = data.get("tables") if isinstance(data, Mapping) and isinstance(data.get("tables"), Mapping) else data
  if not isinstance(relations, Mapping):
    raise InvalidSpec("expected {\"tables\": {table: {\"primary_key\": ..., \"foreign_keys\": {...}}}}")
  relations = {k: v for k, v in relations.items() if k in schemas}
  return DataModel.compile(schemas, relations, descriptions)


def _validate_tools(data: Any, model: DataModel, min_tools: int) -> tuple[list[ToolDef], str]:
  tools = compile_tools(_obj(data, "tools", "the list of tools"), model)
  if len(tools) < min_tools:
    raise InvalidSpec(f"design at least {min_tools} tools (got {len(tools)})")
  if not any(t.operation in ("get", "list") for t in tools):
    raise InvalidSpec("include at least one read tool (operation get or list)")
  policy = data.get("policy")
  if not isinstance(policy, str) or not policy.strip():
    raise InvalidSpec("\"policy\" must be the agent policy as a non-empty markdown string")
  return tools, policy.strip() + "\n"


def _validate_intents(data: Any, count: int) -> list[dict[str, Any]]:
  intents = data.get("intents") if isinstance(data, Mapping) else data
  if not isinstance(intents, list) or not intents:
    raise InvalidSpec("expected {\"intents\": [{\"intent\": ..., \"requires_write\": true|false}, ...]}")
  out = []
  for i, it in enumerate(intents[:count]):
    if isinstance(it, str):
      it = {"intent": it}
    if not isinstance(it, Mapping) or not isinstance(it.get("intent"), str) or not it["intent"].strip():
      raise InvalidSpec(f"intents[{i}] must be an object with a non-empty \"intent\" string")
    rw = it.get("requires_write")
    if rw is not None and not isinstance(rw, bool):
      raise InvalidSpec(f"intents[{i}].requires_write must be true or false")
    out.append({"intent": it["intent"].strip(), "requires_write": rw})
  return out


def _str_field(obj: Mapping[str, Any], key: str, where: str, *, nullable: bool = False) -> str | None:
  value = obj.get(key)
  if value is None and nullable:
    return None
  if not isinstance(value, str) or not value.strip():
    raise InvalidSpec(f"{where}.{key} must be a non-empty string{' or null' if nullable else ''}")
  return value.strip()


def validate_task_json(data: Any, domain: str) -> tuple[dict[str, Any], bool | None]:
  """A generated task normalised to the tau2 format (without id), and its requires_write claim.
  Raises InvalidSpec for a task that does not have the shape (not for one that does not replay)."""
  if not isinstance(data, Mapping):
    raise InvalidSpec("the task must be a JSON object")
  scenario = data.get("user_scenario")
  if not isinstance(scenario, Mapping) or not isinstance(scenario.get("instructions"), Mapping):
    raise InvalidSpec("user_scenario.instructions must be an object")
  ins = scenario["instructions"]
  instructions = {
      "task_instructions": _str_field(ins, "task_instructions", "user_scenario.instructions"),
      "reason_for_call": _str_field(ins, "reason_for_call", "user_scenario.instructions"),
      "known_info": _str_field(ins, "known_info", "user_scenario.instructions"),
      "unknown_info": _str_field(ins, "unknown_info", "user_scenario.instructions", nullable=True),
      "domain": domain,
  }
  persona = scenario.get("persona")
  if persona is not None and not isinstance(persona, str):
    raise InvalidSpec("user_scenario.persona must be a string or null")
  crit = data.get("evaluation_criteria")
  if not isinstance(crit, Mapping):
    raise InvalidSpec("evaluation_criteria must be an object")
  actions = crit.get("actions")
  if not isinstance(actions, list) or not actions:
    raise InvalidSpec("evaluation_criteria.actions must be a non-empty list of {\"name\", \"arguments\"}")
  clean_actions = []
  for i, a in enumerate(actions):
    where = f"evaluation_criteria.actions[{i}]"
    if not isinstance(a, Mapping) or not isinstance(a.get("name"), str) or not a["name"]:
      raise InvalidSpec(f"{where} must be an object with a tool \"name\"")
    args = a.get("arguments", {})
    if isinstance(args, str):
      try:
        args = json.loads(args) if args.strip() else {}
      except json.JSONDecodeError:
        raise InvalidSpec(f"{where}.arguments must be a JSON object") from None
    if args is None:
      args = {}
    if not isinstance(args, Mapping):
      raise InvalidSpec(f"{where}.arguments must be an object")
    if a.get("requestor", "assistant") not in ("assistant", None):
      raise InvalidSpec(f"{where}.requestor: only assistant actions are supported")
    action = {"name": a["name"], "arguments": dict(args), "requestor": "assistant"}
    if isinstance(a.get("info"), str):
      action["info"] = a["info"]
    if isinstance(a.get("compare_args"), list):
      action["compare_args"] = [str(x) for x in a["compare_args"]]
    clean_actions.append(action)
  communicate = crit.get("communicate_info") or []
  if not isinstance(communicate, list) or not all(isinstance(c, (str, int, float)) and not isinstance(c, bool)
                                                  for c in communicate):
    raise InvalidSpec("evaluation_criteria.communicate_info must be a list of strings")
  communicate = [str(c) for c in communicate if str(c).strip()]
  basis = crit.get("reward_basis") or ["DB", "COMMUNICATE"]
  if not isinstance(basis, list) or not basis or any(b not in _REWARD_BASIS for b in basis):
    raise InvalidSpec(f"evaluation_criteria.reward_basis must be a non-empty list drawn from "
                      f"{', '.join(_REWARD_BASIS)} (NL_ASSERTION needs a judge and is not generated)")
  nl = crit.get("nl_assertions") or []
  if not isinstance(nl, list) or not all(isinstance(x, str) for x in nl):
    raise InvalidSpec("evaluation_criteria.nl_assertions must be a list of strings")
  env_assertions = crit.get("env_assertions") or []
  if not isinstance(env_assertions, list):
    raise InvalidSpec("evaluation_criteria.env_assertions must be a list")
  initial_state = data.get("initial_state")
  if initial_state is not None and not isinstance(initial_state, Mapping):
    raise InvalidSpec("initial_state must be an object or null")
  rw = data.get("requires_write")
  if rw is not None and not isinstance(rw, bool):
    raise InvalidSpec("requires_write must be true or false")
  task = {
      "user_scenario": {"persona": persona, "instructions": instructions},
      "initial_state": dict(initial_state) if initial_state else None,
      "evaluation_criteria": {"actions": clean_actions, "communicate_info": communicate, "nl_assertions": list(nl),
                              "env_assertions": list(env_assertions), "reward_basis": list(basis)},
  }
  return task, rw


def _with_id(task: Mapping[str, Any], task_id: str, purpose: str, notes: str | None) -> dict[str, Any]:
  out = {"id": task_id, "description": {"purpose": purpose, "relevant_policies": None, "notes": notes}}
  out.update(json.loads(json.dumps(task)))
  for i, a in enumerate(out["evaluation_criteria"]["actions"]):
    a["action_id"] = f"{task_id}_{i}"
  return out


# --- the pipeline ------------------------------------------------------------------------------------------
class _Run:
  def __init__(self, client, config: SynthConfig):
    self.config = config
    self.llm = StageRunner(client, max_retries=config.max_retries, temperature=config.temperature,
                           max_tokens=config.max_tokens, seed=config.seed)
    self.dropped_rows: list[dict[str, Any]] = []
    self.dropped_tasks: list[dict[str, Any]] = []
    self.counts: dict[str, Any] = {}

  # --- database -------------------------------------------------------------------------------------
  def _rows_for_table(self, model: DataModel, table: Table, db: dict[str, dict[str, Any]]) -> dict[str, Any]:
    cfg = self.config
    rows: dict[str, Any] = {}
    batches = math.ceil(cfg.rows_per_table / cfg.rows_batch)
    for b in range(1, batches + 1):
      count = min(cfg.rows_batch, cfg.rows_per_table - (b - 1) * cfg.rows_batch)
      refs = {}
      for c in table.columns.values():
        if c.ref and c.ref in db and c.ref != table.name:
          refs[c.ref] = sorted(db[c.ref])[:50]
      header, prompt = prompts.rows_prompt(cfg.domain, table.json_schema(), table.name, b, count,
                                           sorted(rows)[:100], refs)
      dropped: list[dict[str, Any]] = []

      def validate(data: Any) -> dict[str, Any]:
        dropped.clear()
        items = data.get("rows") if isinstance(data, Mapping) else data
        if not isinstance(items, list) or not items:
          raise InvalidSpec("expected {\"rows\": [row, ...]} with at least one row")
        good: dict[str, Any] = {}
        for i, raw in enumerate(items):
          try:
            row = table.validate_row(raw, f"rows[{i}]")
            key = table.key_of(row)
            if key in rows or key in good:
              raise InvalidSpec(f"rows[{i}]: duplicate {table.primary_key} {key!r}")
            model.check_references(table.name, row, lambda t, k: t not in db or k in db[t], f"rows[{i}]")
            good[key] = row
          except InvalidSpec as e:
            dropped.append({"table": table.name, "batch": b, "reason": str(e)})
        if not good:
          raise InvalidSpec("no valid row: " + "; ".join(d["reason"] for d in dropped[:3]))
        return good

      rows.update(self.llm.ask("rows", header, prompt, validate))
      self.dropped_rows.extend(dropped)
    return rows

  def _database(self, model: DataModel) -> dict[str, dict[str, Any]]:
    db: dict[str, dict[str, Any]] = {}
    for name in model.dependency_order():
      db[name] = self._rows_for_table(model, model.tables[name], db)
    # references that could not be checked while generating (cycles, self-references), until nothing changes
    changed = True
    while changed:
      changed = False
      for name, table in model.tables.items():
        for key in list(db[name]):
          try:
            model.check_references(name, db[name][key], lambda t, k: k in db[t], f"{name}.{key}")
          except InvalidSpec as e:
            del db[name][key]
            self.dropped_rows.append({"table": name, "batch": None, "reason": str(e)})
            changed = True
    empty = [n for n in model.tables if not db[n]]
    if empty:
      raise SynthError(f"synthesis stage rows: no valid rows left for table{'s' if len(empty) > 1 else ''} "
                       f"{', '.join(empty)}")
    return db

  # --- helpers --------------------------------------------------------------------------------------
  def _rows_shown(self, domain: SynthDomain, tag: str, text: str = "",
                  base: Mapping[str, Sequence[Mapping[str, Any]]] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Rows for a prompt: those whose key `text` mentions (and the rows they reference), those of `base` (e.g.
    the rows the intents were written from), then a seeded sample up to `rows_in_prompt` per table."""
    cap = 3 * self.config.rows_in_prompt
    rng = random.Random(f"orchestra-synth/{self.config.seed}/{tag}")
    data = domain.db.to_json()
    model = domain.data_model
    chosen: dict[str, list[str]] = {t: [] for t in data}

    def add(table: str, key: str) -> None:
      if key in data[table] and key not in chosen[table] and len(chosen[table]) < cap:
        chosen[table].append(key)

    if text:
      for table, rows in data.items():
        for key in sorted(rows):
          if len(key) >= 2 and re.search(r"(?<![A-Za-z0-9_])" + re.escape(key) + r"(?![A-Za-z0-9_])", text):
            add(table, key)
    for table, rows in (base or {}).items():
      for row in rows:
        if table in model.tables:
          add(table, model.tables[table].key_of(row))
    for table in list(chosen):  # one hop along foreign keys, so a mentioned row comes with its owner
      for key in list(chosen[table]):
        for _, target, value in model.references(table, data[table][key]):
          add(target, str(value))
    out = {}
    for table, rows in data.items():
      keys = chosen[table]
      pool = [k for k in sorted(rows) if k not in keys]
      need = max(0, self.config.rows_in_prompt - len(keys))
      keys = keys + sorted(rng.sample(pool, min(need, len(pool))))
      out[table] = [rows[k] for k in keys]
    return out

  def _drop(self, task_id: str, stage: str, reason: str, **extra: Any) -> None:
    self.dropped_tasks.append({"id": task_id, "stage": stage, "reason": reason, **extra})

  def _accept(self, domain: SynthDomain, task: dict[str, Any], requires_write: bool | None, stage: str,
              kept: list[dict[str, Any]], signatures: dict[str, str], **extra: Any) -> bool:
    verdict = verify_task(domain, task, requires_write=requires_write,
                          check_communicate=self.config.check_communicate)
    if not verdict.ok:
      self._drop(task["id"], stage, verdict.reason, **extra)
      return False
    sig = action_signature(task)
    if sig in signatures:
      self._drop(task["id"], stage, f"duplicate of {signatures[sig]} (same gold actions)", **extra)
      return False
    signatures[sig] = task["id"]
    kept.append(task)
    return True

  # --- the run --------------------------------------------------------------------------------------
  def run(self) -> tuple[SynthDomain, list[dict[str, Any]], dict[str, Any]]:
    cfg = self.config
    name = cfg.domain
    header, prompt = prompts.tables_prompt(name, cfg.max_tables)
    description, tables = self.llm.ask("tables", header, prompt, lambda d: _validate_tables(d, cfg.max_tables))
    names = [t["name"] for t in tables]
    descriptions = {t["name"]: t["description"] for t in tables}
    header, prompt = prompts.schema_prompt(name, description, tables)
    schemas = self.llm.ask("schema", header, prompt, lambda d: _validate_schemas(d, names))
    header, prompt = prompts.data_model_prompt(name, schemas)
    model = self.llm.ask("data_model", header, prompt, lambda d: _validate_model(d, schemas, descriptions))
    db = self._database(model)
    header, prompt = prompts.tools_prompt(name, description, model.to_json(), cfg.min_tools, cfg.max_tools)
    tools, policy = self.llm.ask("tools", header, prompt, lambda d: _validate_tools(d, model, cfg.min_tools))
    domain = build_domain(name, model, tools, db, policy, description=description)
    schemas_shown = domain.tool_schemas()
    write_tools = domain.write_tools()

    intent_rows = self._rows_shown(domain, "intents")
    header, prompt = prompts.intents_prompt(name, description, schemas_shown, intent_rows, cfg.num_tasks)
    intents = self.llm.ask("intents", header, prompt, lambda d: _validate_intents(d, cfg.num_tasks))

    kept: list[dict[str, Any]] = []
    signatures: dict[str, str] = {}
    claims: dict[str, bool] = {}
    base: list[dict[str, Any]] = []
    for n, intent in enumerate(intents, 1):
      task_id = f"task_{n}"
      header, prompt = prompts.task_prompt(name, n, intent["intent"], bool(intent["requires_write"]), policy,
                                           schemas_shown,
                                           self._rows_shown(domain, task_id, intent["intent"], intent_rows))
      try:
        body, rw = self.llm.ask("task", header, prompt, lambda d: validate_task_json(d, name))
      except StageFailed as e:
        self._drop(task_id, "task", f"generation failed: {e.error}", intent=intent["intent"])
        continue
      requires_write = bool(rw) or bool(intent["requires_write"])
      task = _with_id(body, task_id, intent["intent"], None)
      claims[task_id] = requires_write
      if self._accept(domain, task, requires_write, "task", base, signatures, intent=intent["intent"]):
        kept.append(task)
    base_count = len(base)

    evolved_total = 0
    parents = list(base)
    for r in range(1, cfg.evolve_rounds + 1):
      children: list[dict[str, Any]] = []
      for parent in parents:
        root = parent["id"].split("_evolved")[0]
        task_id = f"{root}_evolved{r}"
        header, prompt = prompts.evolve_prompt(name, parent["id"], parent, policy, schemas_shown,
                                               self._rows_shown(domain, task_id, json.dumps(parent)))
        evolved_total += 1
        try:
          body, rw = self.llm.ask("evolve", header, prompt, lambda d: validate_task_json(d, name))
        except StageFailed as e:
          self._drop(task_id, "evolve", f"generation failed: {e.error}", parent=parent["id"])
          continue
        requires_write = bool(rw) or claims.get(parent["id"], False)
        task = _with_id(body, task_id, parent["description"]["purpose"], f"evolved from {parent['id']}")
        claims[task_id] = requires_write
        if self._accept(domain, task, requires_write, "evolve", children, signatures, parent=parent["id"]):
          kept.append(task)
      parents = children

    kept_ids = [t["id"] for t in kept]
    n_writes = sum(1 for t in kept if any(a["name"] in write_tools for a in t["evaluation_criteria"]["actions"]))
    report = {
        "domain": name,
        "description": description,
        "config": dataclasses.asdict(cfg),
        "stages": {stage: s.to_dict() for stage, s in self.llm.stats.items()},
        "counts": {
            "tables": len(model.tables),
            "rows": {t: len(rows) for t, rows in db.items()},
            "rows_dropped": len(self.dropped_rows),
            "tools": len(tools),
            "write_tools": sorted(write_tools),
            "intents": len(intents),
            "tasks_generated": len(intents),
            "tasks_verified": base_count,
            "tasks_dropped": sum(1 for d in self.dropped_tasks if d["stage"] == "task"),
            "evolved_generated": evolved_total,
            "evolved_verified": len(kept) - base_count,
            "evolved_dropped": sum(1 for d in self.dropped_tasks if d["stage"] == "evolve"),
            "tasks_written": len(kept),
            "tasks_with_writes": n_writes,
        },
        "usage": {
            "requests": sum(s.attempts for s in self.llm.stats.values()),
            "prompt_tokens": sum(s.prompt_tokens for s in self.llm.stats.values()),
            "completion_tokens": sum(s.completion_tokens for s in self.llm.stats.values()),
            "cost_usd": sum(s.cost_usd for s in self.llm.stats.values()),
            "latency_s": round(sum(s.latency_s for s in self.llm.stats.values()), 3),
        },
        "task_ids": kept_ids,
        "dropped_tasks": self.dropped_tasks,
        "dropped_rows": self.dropped_rows,
        "rejected_replies": self.llm.log,
    }
    return domain.with_tasks(kept), kept, report


def _training_samples(domain: SynthDomain, tasks: Sequence[Mapping[str, Any]], config: SynthConfig) -> list[Sample]:
  write_tools = domain.write_tools()
  samples = []
  for t in tasks:
    samples.append(Sample(
        id=f"synth/{domain.name}/{t['id']}", kind="toolscale", domain=domain.name,
        question=scenario_text(t["user_scenario"]) or f"{domain.name} task {t['id']}",
        task=json.loads(json.dumps(t)), tools=list(domain.tool_names),
        metadata={"source": "synth", "domain_dir": ".", "evolved": "_evolved" in t["id"],
                  "writes": any(a["name"] in write_tools for a in t["evaluation_criteria"]["actions"])}))
  if config.randomize and samples:
    samples = randomize_samples(samples, config.seed)
  return samples


def _check_out_dir(out_dir: Path, overwrite: bool) -> None:
  if out_dir.exists() and not out_dir.is_dir():
    raise SynthConfigError(f"--out {out_dir} exists and is not a directory")
  if out_dir.is_dir() and not overwrite:
    present = [f for f in (*DOMAIN_FILES, REPORT_FILE, TRAIN_FILE) if (out_dir / f).exists()]
    if present:
      raise SynthConfigError(f"--out {out_dir} already holds a synthesised domain ({', '.join(present)}); "
                             "choose another directory or pass --force to overwrite it")


def synthesize(client, config: SynthConfig, out_dir: str | os.PathLike | None = None) -> SynthResult:
  """Run the pipeline with `client` (a `tools.llm_client.ChatClient` or anything with its `chat`); write the
  outputs into `out_dir` when given. Raises SynthError when a required stage fails."""
  out = Path(out_dir) if out_dir is not None else None
  if out is not None:
    _check_out_dir(out, config.overwrite)
  domain, tasks, report = _Run(client, config).run()
  samples = _training_samples(domain, tasks, config)
  report["model"] = getattr(client, "model", None)
  report["endpoint"] = getattr(client, "base_url", None)
  if out is not None:
    write_domain_dir(out, domain, tasks)
    write_jsonl(out / TRAIN_FILE, samples)
    tmp = out / (REPORT_FILE + ".tmp")
    tmp.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, out / REPORT_FILE)
  return SynthResult(domain=domain, tasks=tasks, samples=samples, report=report, out_dir=out)
