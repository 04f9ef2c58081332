"""The ToolOrchestra orchestrator: Qwen3-8B trained with GRPO on the paper's hyperparameters (docs/design.md sections 2, 5, 6).

A complete `orchestra train` config for a pod (launch/tpu_pod.sh, launch/gpu.sh), and the settings `orchestra eval`
and `orchestra generate` read. Before a run:

  1. `orchestra convert hf-to-jax ~/models/Qwen3-8B runs/qwen3-8b` (the starting point, `init_checkpoint`);
  2. training records in data/train.jsonl and data/eval.jsonl (`orchestra data convert ...`, README "Training data");
  3. the expert endpoints of configs/tools/default_catalog.json up (vLLM / vendor APIs; README "Serving the
     experts"), the tau2 user simulator at `env.user_endpoint` and, for QA beyond exact match, a judge.

Every field can be overridden: `--config.env.train_data=a.jsonl,b.jsonl --config.steps=200`. README "Config fields
and the paper's hyperparameters" maps each field to the paper.
"""

import ml_collections

from orchestra_jax.task_families import data_env_config
from orchestra_jax.model.config import qwen3_8b
from orchestra_jax.training_config import (DebugSection, MeshSection, RewardSection, RolloutSection, SftSection,
                                           TrainSection, section)


# The sections' dataclass defaults are the paper's hyperparameters (orchestra_jax/training_config.py, with the
# reasons for each); every field still lands in the config, so each can be overridden from the command line.
def get_config() -> ml_collections.ConfigDict:
  cfg = ml_collections.ConfigDict()
  # Every ModelConfig field, so any of them can be overridden from the command line. Full per-layer remat:
  # without it no 32-chip mesh fits more than ~5k tokens per row (benchmarks/memory_plan.py). f32 master weights
  # with bf16 matmuls: at the paper's learning rate (1e-6) AdamW's steps are far below bf16's resolution, so bf16
  # weights would never change; the bf16 checkpoint is cast up on load and `orchestra convert jax-to-hf
  # --dtype bfloat16` casts back for serving.
  cfg.model = qwen3_8b(remat="full", param_dtype="float32", dtype="bfloat16").to_dict()
  cfg.mesh = section(MeshSection)  # (data, fsdp, tensor) = (1, -1, 4)
  cfg.seed = 0
  # Modules imported before the registries are read (module names, or .py paths relative to the working dir), so
  # the variants they register can be named below: `--config.imports=my_rewards.py --config.reward.name=mine`.
  cfg.imports = ()
  # '' = the bundled real Qwen3 tokenizer, which is the orchestrator's tokenizer; point this at a
  # checkpoint's directory to use the one it ships.
  cfg.tokenizer_dir = ""
  cfg.init_checkpoint = "runs/qwen3-8b"  # orchestra or HF checkpoint directory; '' = random init (tests only)
  cfg.workdir = "runs/orchestrator_8b"

  # The paper's data: ToolScale / tau2 environment tasks and QA, randomised per record (offered tools, alias
  # prices, preference). Records without a preference get outcome-only rewards.
  cfg.env = data_env_config(
      train_data=("data/train.jsonl",),
      eval_data=("data/eval.jsonl",),
      num_eval_tasks=128,
      # The tau2 customer is an LLM (the reference uses a frontier model); any OpenAI-compatible endpoint.
      user_endpoint="http://127.0.0.1:8300/v1", user_model="Qwen/Qwen3-32B",
      judge_endpoint="http://127.0.0.1:8200/v1", judge_model="Qwen/Qwen3-32B",
  )

  cfg.steps = 500  # RL steps (the reference trained for over a week on 16 H100; set to your budget)
  cfg.prompts_per_step = 16  # tasks per step (paper: 16)
  cfg.group_size = 8  # rollouts per task (paper: 8)

  cfg.rollout = section(RolloutSection)  # 30 turns of up to 8768 new tokens in 32768 positions, temperature 1
  cfg.reward = section(RewardSection)  # the preference reward, GRPO advantages clipped to [-3, 3]
  cfg.train = section(TrainSection)  # AdamW at 1e-6, clip-higher [0.2, 0.28], 16 samples per step, recomputed
  cfg.sft = section(SftSection)  # no warm-up

  cfg.eval_every = 25  # RL steps between evaluations (also at the start and the end)
  cfg.checkpoint_every = 10
  cfg.keep_checkpoints = 3
  cfg.debug = section(DebugSection)

  # `orchestra generate` / `orchestra eval`: Qwen3's recommended 0.6 for thinking mode (greedy repeats itself).
  cfg.generate = ml_collections.ConfigDict({"max_new_tokens": 8768, "temperature": 0.6})
  cfg.eval = ml_collections.ConfigDict({"max_turns": 50, "max_new_tokens": 8768, "batch_size": 64})  # paper: 50
  return cfg
