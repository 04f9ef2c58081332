"""The ToolOrchestra orchestrator: Qwen3-8B (DESIGN.md section 2)."""

import ml_collections

from orchestra_jax.model.config import qwen3_8b


def get_config() -> ml_collections.ConfigDict:
  cfg = ml_collections.ConfigDict()
  # Every ModelConfig field, so any of them can be overridden from the command line.
  # Full per-layer remat: without it no v5p-64 or v4-64 mesh fits more than ~5k tokens per row
  # (benchmarks/memory_plan.py).
  cfg.model = qwen3_8b(remat="full").to_dict()
  # (data, fsdp, tensor): FSDP over all chips. 8.2B bf16 weights are 16 GB before optimizer state, too
  # much to replicate per chip for training; FSDP shards weights, grads and Adam state alike and needs no
  # extra model code. Use e.g. (1, -1, 4) to add tensor parallelism for long-context inference.
  cfg.mesh = ml_collections.ConfigDict({"shape": (1, -1, 1)})
  cfg.seed = 0
  # '' = the bundled real Qwen3 tokenizer, which is the orchestrator's tokenizer; point this at a
  # checkpoint's directory to use the one it ships.
  cfg.tokenizer_dir = ""
  # Up to 8768 new tokens per turn as in the paper's training; 0.6 is Qwen3's recommended temperature
  # for thinking mode (greedy decoding makes it repeat itself).
  cfg.generate = ml_collections.ConfigDict({"max_new_tokens": 8768, "temperature": 0.6})
  return cfg
