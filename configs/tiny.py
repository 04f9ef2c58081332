"""Tiny random Qwen3 for tests, demos and CPU runs: every code path, seconds per step."""

import ml_collections

from orchestra_jax.model.config import tiny


def get_config() -> ml_collections.ConfigDict:
  cfg = ml_collections.ConfigDict()
  # Every ModelConfig field, so any of them can be overridden from the command line.
  cfg.model = tiny().to_dict()
  # (data, fsdp, tensor): pure data parallel over whatever devices exist; the model is a few MB, so
  # replicating it is cheapest and the same config runs on 1 CPU or 8 chips.
  cfg.mesh = ml_collections.ConfigDict({"shape": (-1, 1, 1)})
  cfg.seed = 0
  # '' = the bundled real Qwen3 tokenizer: tiny keeps the real vocabulary so prompts and tool calls are real.
  cfg.tokenizer_dir = ""
  # Short greedy generations: random weights say nothing useful, and greedy makes runs reproducible.
  cfg.generate = ml_collections.ConfigDict({"max_new_tokens": 32, "temperature": 0.0})
  return cfg
