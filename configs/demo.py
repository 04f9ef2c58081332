"""The CPU demo: a tiny random Qwen3 (real Qwen3 tokenizer) learns to route questions to priced tools.

Three tools answer questions (orchestra_jax/demo/world.py): `calc` (cheap coder + real sandbox; right on
arithmetic), `small` (cheap LLM; right on arithmetic and capitals), `expert` (43x the price; always right), all
served by the scripted OpenAI-compatible server on 127.0.0.1. A short supervised warm-up on random-tool
trajectories teaches the call format; GRPO with the paper's preference reward then teaches which tool to call.
Tasks carry one of two preferences, stated in the prompt: "Prefer cheap tools." or "Prefer the expert.".

Sized to finish in well under 15 minutes on 2 CPU cores. Every field can be overridden:
`orchestra train --config configs/demo.py --config.steps=10 --config.workdir=runs/short`.
"""

import ml_collections

from orchestra_jax.model.config import tiny


def get_config() -> ml_collections.ConfigDict:
  cfg = ml_collections.ConfigDict()
  cfg.model = tiny().to_dict()  # 2 layers, hidden 64, real 151936-token vocabulary
  cfg.mesh = ml_collections.ConfigDict({"shape": (-1, 1, 1)})
  cfg.seed = 0
  # Modules imported before the registries are read (module names, or .py paths relative to the working dir), so
  # the variants they register can be named below: `--config.imports=my_rewards.py --config.reward.name=mine`.
  cfg.imports = ()
  cfg.tokenizer_dir = ""  # the bundled real Qwen3 tokenizer
  cfg.init_checkpoint = ""  # '' = random init (then the warm-up); else an orchestra or HF checkpoint dir
  cfg.workdir = "runs/demo"

  cfg.env = ml_collections.ConfigDict({
      "name": "demo",  # the task family and tools (orchestra_jax/environments.py ENVIRONMENTS)
      "num_train_tasks": 480,
      "num_eval_tasks": 60,  # per preference
      # Presets mixed in training, each evaluated separately. One preference per run: a 10M-parameter policy
      # trained on a mix collapses onto the always-right expert before it learns to read the preference.
      "preferences": ("cheap",),
  })

  cfg.steps = 20  # RL steps
  cfg.prompts_per_step = 8  # tasks per step (the paper: 16)
  cfg.group_size = 8  # rollouts per task (the paper: 8)

  cfg.rollout = ml_collections.ConfigDict({
      "max_turns": 2,
      "max_new_tokens": 24,  # the answer call is 18 tokens
      "temperature": 1.0,  # the paper samples at 1.0
      "top_p": 1.0,
      "top_k": 0,
      "mode": "extend",
      "tool_workers": 16,
      "max_len": 320,  # cache positions per row (prompt ~251 tokens)
      "batch_size": 64,  # sampler slots
      "chunk_steps": 8,
      "enable_thinking": True,
  })

  cfg.reward = ml_collections.ConfigDict({
      "name": "preference",  # registry name (orchestra_jax/reward/rewards.py; yours via `imports`)
      "estimator": "grpo",
      "clip": 3.0,
      "boost": 0.1,  # the reference's +0.1 where A >= 1
      "std_threshold": 0.1,  # drop groups whose reward std <= this
      # The paper drops rollouts without a final answer; a 10M-parameter model then drifts out of the call
      # format unpunished, so the demo keeps them as wrong (reward 0).
      "drop_no_final_answer": False,
      "require_tool_call": True,  # drop turns without a parseable tool call
  })

  cfg.train = ml_collections.ConfigDict({
      "learning_rate": 3e-4,  # the paper's 1e-6 is for 8B; a 10M-parameter model needs far more
      "b1": 0.9,
      "b2": 0.999,
      "weight_decay": 0.01,
      "grad_clip_norm": 1.0,
      "mini_batch_size": 16,  # turn samples per optimizer step (the paper: 16)
      "ppo_epochs": 1,
      "grad_accum_steps": 1,
      "clip_low": 0.2,
      "clip_high": 0.28,
      "dual_clip": 10.0,
      "aggregation": "token_mean",
      "kl_type": "mse",
      "kl_coef": 1e-4,
      # The sampler's log-probs are the policy's at temperature 1 without filtering (the logged
      # logprob_mismatch is ~1e-6 when recomputed), so the demo skips recomputing them; 8B runs recompute.
      "old_logprobs": "sampler",
      "logprob_window": 32,  # responses are right-aligned; score only their last 32 positions
      "seq_bucket": 64,  # pad training sequences to a multiple of this (few compiled shapes)
  })

  cfg.sft = ml_collections.ConfigDict({
      "steps": 80,  # supervised warm-up on random-tool trajectories (format only); 0 = none
      "learning_rate": 1e-2,
      "batch_size": 16,
  })

  cfg.eval_every = 5  # RL steps between evaluations (also at the start and the end)
  cfg.checkpoint_every = 5
  cfg.keep_checkpoints = 3
  cfg.debug = ml_collections.ConfigDict({"nan_at_step": -1})  # fault injection for the NaN guard's test
  return cfg
