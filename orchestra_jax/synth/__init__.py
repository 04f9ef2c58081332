"""ToolScale-style synthesis of tool-use environments with an LLM, verified by replay (docs/design.md section 7).

* `pipeline`: `synthesize(client, SynthConfig(...), out_dir)`: the stages, verification and outputs.
* What a synthesised domain is at run time lives with the other domains, in `orchestra_jax.envs` (training and
  data conversion load domains without importing the generator): `envs.datamodel` (the typed data model: tables,
  columns, primary / foreign keys, row validation), `envs.declarative_tools` (get / list / update / create /
  delete / calculate / transfer over tables: no model-written code is ever executed) and `envs.synth_domain` (a
  synthesised domain directory loaded as an `envs.Domain`, `load_domain_dir`), so environments, gold replay and
  grading work as for the built-in tau2 domains. Their names are re-exported here.
* `verify`: `verify_task`, the replay check every generated task must pass.
* `llm`: tolerant JSON parsing and stages with bounded retries; `prompts`: the prompt templates.
* `cli`: `add_synth_parser` / `run_synth` for `orchestra synth`.

Names are imported lazily, so importing this package costs nothing until one is used.
"""

import importlib

_EXPORTS = {
  "SynthConfig": "pipeline", "SynthResult": "pipeline", "synthesize": "pipeline", "validate_task_json": "pipeline",
  "DataModel": "datamodel", "Table": "datamodel", "Column": "datamodel", "InvalidSpec": "datamodel",
  "ToolDef": "tools", "compile_tools": "tools", "make_toolkit": "tools", "DeclarativeToolkit": "tools",
  "SynthDomain": "domain", "SynthDomainError": "domain", "load_domain_dir": "domain", "write_domain_dir": "domain",
  "build_domain": "domain",
  "Verdict": "verify", "verify_task": "verify",
  "SynthError": "llm", "StageFailed": "llm", "StageRunner": "llm", "parse_json_reply": "llm",
  "add_synth_parser": "cli", "run_synth": "cli",
}

_ELSEWHERE = {"datamodel": "orchestra_jax.envs.datamodel", "tools": "orchestra_jax.envs.declarative_tools",
              "domain": "orchestra_jax.envs.synth_domain"}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
  module = _EXPORTS.get(name)
  if module is None:
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
  value = getattr(importlib.import_module(_ELSEWHERE.get(module, f"{__name__}.{module}")), name)
  globals()[name] = value
  return value


def __dir__():
  return sorted(set(globals()) | set(_EXPORTS))
