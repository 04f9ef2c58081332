"""ToolScale-style synthesis of tool-use environments with an LLM, verified by replay (docs/design.md section 7).

* `pipeline`: `synthesize(client, SynthConfig(...), out_dir)`: the stages, verification and outputs.
* What a synthesised domain is at run time lives with the other domains, in `orchestra_jax.tau2` (training and
  data conversion load domains without importing the generator): `tau2.datamodel` (the typed data model: tables,
  columns, primary / foreign keys, row validation), `tau2.declarative_tools` (get / list / update / create /
  delete / calculate / transfer over tables: no model-written code is ever executed) and `tau2.synth_domain` (a
  synthesised domain directory loaded as an `tau2.Domain`, `load_domain_dir`), so environments, gold replay and
  grading work as for the built-in tau2 domains. Their names are re-exported here.
* `verify`: `verify_task`, the replay check every generated task must pass.
* `llm`: tolerant JSON parsing and stages with bounded retries; `prompts`: the prompt templates.
* `cli`: `add_synth_parser` / `run_synth` for `orchestra synth`.

Names are imported lazily, so importing this package costs nothing until one is used.
"""

from orchestra_jax.lazy import lazy_exports

_EXPORTS = {
  "SynthConfig": "pipeline", "SynthResult": "pipeline", "synthesize": "pipeline", "validate_task_json": "pipeline",
  **{name: "orchestra_jax.tau2.datamodel" for name in ("DataModel", "Table", "Column", "InvalidSpec")},
  **{name: "orchestra_jax.tau2.declarative_tools" for name in ("ToolDef", "compile_tools", "make_toolkit",
                                                              "DeclarativeToolkit")},
  **{name: "orchestra_jax.tau2.synth_domain" for name in ("SynthDomain", "SynthDomainError", "load_domain_dir",
                                                          "write_domain_dir", "build_domain")},
  "Verdict": "verify", "verify_task": "verify",
  "SynthError": "llm", "StageFailed": "llm", "StageRunner": "llm", "parse_json_reply": "llm",
  "add_synth_parser": "cli", "run_synth": "cli",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
