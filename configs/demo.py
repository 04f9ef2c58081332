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

from orchestra_jax.task_families import DemoEnvSection
from orchestra_jax.model.config import tiny
from orchestra_jax.training_config import (DebugSection, MeshSection, RewardSection, RolloutSection, SftSection,
                                           TrainSection, section)


# Each section states only what differs from the paper's values, its dataclass's defaults
# (orchestra_jax/training_config.py); every field still lands in the config, so each can be overridden.
def get_config() -> ml_collections.ConfigDict:
  cfg = ml_collections.ConfigDict()
  cfg.model = tiny().to_dict()  # 2 layers, hidden 64, real 151936-token vocabulary
  cfg.mesh = section(MeshSection, shape=(-1, 1, 1))  # pure data parallel: the model is a few MB
  cfg.seed = 0
  # Modules imported before the registries are read (module names, or .py paths relative to the working dir), so
  # the variants they register can be named below: `--config.imports=my_rewards.py --config.reward.name=mine`.
  cfg.imports = ()
  cfg.tokenizer_dir = ""  # the bundled real Qwen3 tokenizer
  cfg.init_checkpoint = ""  # '' = random init (then the warm-up); else an orchestra or HF checkpoint dir
  cfg.workdir = "runs/demo"

  # The task family and tools (orchestra_jax/task_families/demo.py): 480 training tasks, 60 evaluation
  # tasks per preference, one preference ("cheap").
  cfg.env = section(DemoEnvSection)

  cfg.steps = 20  # RL steps
  cfg.prompts_per_step = 8  # tasks per step (the paper: 16)
  cfg.group_size = 8  # rollouts per task (the paper: 8)

  cfg.rollout = section(
      RolloutSection,
      max_turns=2,
      max_new_tokens=24,  # the answer call is 18 tokens
      mode="extend",
      tool_workers=16,
      max_len=320,  # cache positions per row (prompt ~251 tokens)
      batch_size=64,  # sampler slots
      chunk_steps=8,
  )

  cfg.reward = section(
      RewardSection,
      # The paper drops rollouts without a final answer; a 10M-parameter model then drifts out of the call
      # format unpunished, so the demo keeps them as wrong (reward 0).
      drop_no_final_answer=False,
  )

  cfg.train = section(
      TrainSection,
      learning_rate=3e-4,  # the paper's 1e-6 is for 8B; a 10M-parameter model needs far more
      grad_accum_steps=1,
      # The sampler's log-probs are the policy's at temperature 1 without filtering (the logged
      # logprob_mismatch is ~1e-6 when recomputed), so the demo skips recomputing them; 8B runs recompute.
      old_logprobs="sampler",
      logprob_window=32,  # responses are right-aligned; score only their last 32 positions
      seq_bucket=64,
  )

  cfg.sft = section(
      SftSection,
      steps=80,  # supervised warm-up on random-tool trajectories (format only); 0 = none
      learning_rate=1e-2,
  )

  cfg.eval_every = 5  # RL steps between evaluations (also at the start and the end)
  cfg.checkpoint_every = 5
  cfg.keep_checkpoints = 3
  cfg.debug = section(DebugSection)  # debug.nan_at_step: fault injection for the NaN guard's test
  return cfg
