"""Training data: one JSONL format for QA and tool-environment tasks, converters, randomisation, grain input.

* `format`: `Sample` (one training record) with strict validation, `read_jsonl` / `write_jsonl`.
* `preferences`: seeded random preference vectors, their natural-language text, per-sample alias remapping.
* `converters`: FRAMES, HLE (a user's own copy), tau2 domains and the ToolScale layout -> `Sample`s.
* `pipeline`: `make_dataset` (a `grain.MapDataset` of samples or batches) and a checkpointable iterator.

Quick start::

  from orchestra_jax.data import convert_frames, randomize_samples, write_jsonl, make_dataset, make_iterator
  samples = randomize_samples(convert_frames(), seed=0)  # the packaged FRAMES questions
  write_jsonl("runs/data/frames.jsonl", samples)
  it = make_iterator(make_dataset("runs/data/frames.jsonl", seed=0, batch_size=16, num_epochs=None))
  batch = next(it)            # list of 16 Sample
  state = it.get_state()      # JSON-able; it.set_state(state) resumes exactly there

Names are imported lazily, so importing this package costs nothing until one is used (grain is only
imported by `pipeline`).
"""

from orchestra_jax.lazy import lazy_exports

_EXPORTS = {
  # format.py
  "Sample": "format", "KINDS": "format", "DataFormatError": "format", "read_jsonl": "format",
  "write_jsonl": "format", "read_samples": "format", "sample_domain": "format", "scenario_text": "format",
  # preferences.py
  "OUTCOME": "preferences", "NEG_COST": "preferences", "NEG_LATENCY": "preferences",
  "feature_names": "preferences", "preference_array": "preferences", "preference_text": "preferences",
  "random_preference": "preferences", "random_alias_map": "preferences", "random_tool_subset": "preferences",
  "randomize_sample": "preferences", "randomize_samples": "preferences", "alias_map_to_remap": "preferences",
  "sample_rng": "preferences",
  # converters.py
  "convert_frames": "converters", "convert_hle": "converters", "convert_tau2": "converters",
  "convert_toolscale": "converters", "read_rows": "converters", "MissingDependencyError": "converters",
  # pipeline.py
  "make_dataset": "pipeline", "make_iterator": "pipeline", "load_records": "pipeline",
  "save_iterator_state": "pipeline", "load_iterator_state": "pipeline",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
