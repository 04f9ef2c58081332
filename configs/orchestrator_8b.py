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

from orchestra_jax.environments import data_env_config
from orchestra_jax.model.config import qwen3_8b


def get_config() -> ml_collections.ConfigDict:
  cfg = ml_collections.ConfigDict()
  # Every ModelConfig field, so any of them can be overridden from the command line. Full per-layer remat:
  # without it no 32-chip mesh fits more than ~5k tokens per row (benchmarks/memory_plan.py). f32 master weights
  # with bf16 matmuls: at the paper's learning rate (1e-6) AdamW's steps are far below bf16's resolution, so bf16
  # weights would never change; the bf16 checkpoint is cast up on load and `orchestra convert jax-to-hf
  # --dtype bfloat16` casts back for serving.
  cfg.model = qwen3_8b(remat="full", param_dtype="float32", dtype="bfloat16").to_dict()
  # (data, fsdp, tensor): weights, grads and Adam state sharded over fsdp; tensor=4 splits the 32 query / 8 KV
  # heads, which is what makes 32k-token rows fit (memory plan: (1, 32, 1) needs ~240 GB per chip, (1, 8, 4) ~80 GB
  # on a v5p-64). -1 = the rest of the chips.
  cfg.mesh = ml_collections.ConfigDict({"shape": (1, -1, 4)})
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

  cfg.rollout = ml_collections.ConfigDict({
      "max_turns": 30,  # paper: 30 in training (50 at evaluation, see `eval`)
      "max_new_tokens": 8768,  # paper: response up to 8768 tokens per turn
      "temperature": 1.0,  # paper: 1.0
      "top_p": 1.0,
      "top_k": 0,
      "mode": "rebuild",  # the reference rebuilds one user message from state each turn (docs/design.md section 3)
      "tool_workers": 64,  # tool calls in flight at once (experts answer in 9-96 s)
      "max_len": 32768,  # prompt up to 24000 + response 8768 (paper)
      "batch_size": 128,  # sampler slots = prompts_per_step x group_size: one step's rollouts decode together
      "chunk_steps": 16,
      "enable_thinking": True,
  })

  cfg.reward = ml_collections.ConfigDict({
      "name": "preference",  # R = 0 if wrong else P . normalised [tool counts, outcome, -cost, -latency]
      "estimator": "grpo",
      "clip": 3.0,  # advantages clipped to [-3, 3]
      "boost": 0.1,  # the reference's +0.1 where A >= 1
      "std_threshold": 0.1,  # drop groups whose reward std <= 0.1
      "drop_no_final_answer": True,  # paper: drop rollouts that never produced a final answer
      "require_tool_call": True,  # paper: drop turns without a parseable tool call
  })

  cfg.train = ml_collections.ConfigDict({
      "learning_rate": 1e-6,  # AdamW, constant (paper)
      "b1": 0.9,
      "b2": 0.999,
      "weight_decay": 0.01,
      "grad_clip_norm": 1.0,
      "mini_batch_size": 16,  # turn samples per optimizer step (paper: 16)
      "ppo_epochs": 1,
      # 16 rows of up to 32k tokens: two micro-batches of 8, one row per fsdp shard of a (1, 8, 4) mesh.
      "grad_accum_steps": 2,
      "clip_low": 0.2,  # ratio clipped to [1 - 0.2, 1 + 0.28] (clip-higher)
      "clip_high": 0.28,
      "dual_clip": 10.0,
      "aggregation": "token_mean",
      "kl_type": "mse",  # 0.5 (logp - logp_ref)^2
      "kl_coef": 1e-4,
      "old_logprobs": "recompute",  # the sampler's log-probs are not the policy's at top-p < 1 or after updates
      "logprob_window": 8768,  # responses are right-aligned: score only their last max_new_tokens positions
      "seq_bucket": 2048,  # pad training sequences to a multiple of this (few compiled shapes)
  })

  cfg.sft = ml_collections.ConfigDict({"steps": 0, "learning_rate": 1e-5, "batch_size": 16})  # no warm-up

  cfg.eval_every = 25  # RL steps between evaluations (also at the start and the end)
  cfg.checkpoint_every = 10
  cfg.keep_checkpoints = 3
  cfg.debug = ml_collections.ConfigDict({"nan_at_step": -1})

  # `orchestra generate` / `orchestra eval`: Qwen3's recommended 0.6 for thinking mode (greedy repeats itself).
  cfg.generate = ml_collections.ConfigDict({"max_new_tokens": 8768, "temperature": 0.6})
  cfg.eval = ml_collections.ConfigDict({"max_turns": 50, "max_new_tokens": 8768, "batch_size": 64})  # paper: 50
  return cfg
