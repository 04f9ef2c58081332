"""The typed training config: one frozen dataclass per section of an `orchestra train` config, each checking itself.

`TrainingConfig.from_config(cfg)` is the one validation of a loaded config (overrides applied): it imports the
config's `imports`, builds every section (an unknown or missing key is one line naming it), and each dataclass's
`__post_init__` refuses a bad value in one `ConfigFileError` line naming `section.field` (in the manner of Tunix's
`GRPOConfig.__post_init__`); `TrainingConfig.__post_init__` checks what spans sections. The trainer then reads
typed fields only, and the task family gets its typed `env` section (`task_families.ENV_SECTIONS`).

The dataclass defaults are THE defaults: the paper's values (configs/orchestrator_8b.py, docs/design.md). A config
file states only what differs, through `section(RolloutSection, max_turns=2)`, which still writes every field into
the ConfigDict, so each stays overridable on the command line (`--config.rollout.top_p=0.9`). The translation to
the library dataclasses (`RolloutConfig`, `TrainConfig`, `RewardConfig`) are methods of the sections.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import ml_collections

from orchestra_jax import configs as config_lib
from orchestra_jax import registry
from orchestra_jax.configs import ConfigFileError
from orchestra_jax.model.config import ModelConfig
from orchestra_jax.reward.advantages import AdvantageConfig
from orchestra_jax.reward.pipeline import RewardConfig
from orchestra_jax.rl.loss import LossConfig
from orchestra_jax.rl.optimizer import OptimizerConfig, precision_problem
from orchestra_jax.rl.train import TrainConfig
from orchestra_jax.rollout.agent_loop import RolloutConfig
from orchestra_jax.task_families import ENV_SECTIONS, ENVIRONMENTS

__all__ = ["RolloutSection", "RewardSection", "TrainSection", "SftSection", "MeshSection", "DebugSection",
           "TrainingConfig", "TRAINING_SECTIONS", "section", "build_section", "import_user_modules"]

# Top-level keys every training config has; a config without them (e.g. tiny: a model only) cannot train.
TRAINING_SECTIONS = ("env", "steps", "prompts_per_step", "group_size", "rollout", "reward", "train", "sft", "workdir")
# Sections of a training config that other commands read (`orchestra eval` / `generate`: evaluate/tasks.py
# EvalSettings), so training leaves them to those commands.
OTHER_COMMANDS_SECTIONS = ("generate", "eval")


def _bad(key: str, why: str) -> ConfigFileError:
  return ConfigFileError(f"bad value for config key '{key}': {why}")


def _at_least(obj, names: tuple[str, ...], bound: int) -> None:
  for name in names:
    value = getattr(obj, name)
    if value < bound:
      raise _bad(f"{obj.KEY}.{name}", f"must be >= {bound}, got {value}")


def _registered(obj, name: str, category: str) -> None:
  """A name a forgotten `imports` would register fails here, not mid-run."""
  value = getattr(obj, name)
  if value not in registry.Registry(category):
    raise _bad(f"{obj.KEY}.{name}", f"{value!r} (known: {', '.join(registry.names(category))})")


# --- config file <-> section ---------------------------------------------------------------------------

def section(cls, **changes: Any) -> ml_collections.ConfigDict:
  """The ConfigDict of section dataclass `cls` with its defaults and `changes` (unknown keys refused): what a
  config file writes (`cfg.rollout = section(RolloutSection, max_turns=2)`). Checked only once the run validates
  its config, after the command-line overrides, which may fix what a file leaves unfinished."""
  defaults = {f.name: f.default for f in dataclasses.fields(cls)}
  unknown = sorted(set(changes) - set(defaults))
  if unknown:
    raise ConfigFileError(f"unknown config key '{cls.KEY}.{unknown[0]}' (known: {', '.join(defaults)})")
  return ml_collections.ConfigDict({**defaults, **changes})


def build_section(cls, node: Any):
  """Section dataclass `cls` from its ConfigDict: every field present, no other key, then its own checks."""
  if not isinstance(node, ml_collections.ConfigDict):
    raise ConfigFileError(f"config key '{cls.KEY}' must be a group of fields, got {node!r}")
  names = [f.name for f in dataclasses.fields(cls)]
  # Missing first: a section written for another env.name lacks this one's keys, and the hint says how to build it.
  missing = [k for k in names if k not in node]
  if missing:
    how = getattr(cls, "BUILT_WITH", f"; build it with orchestra_jax.training_config.section({cls.__name__}, ...)")
    raise ConfigFileError(f"config section '{cls.KEY}' lacks {', '.join(repr(k) for k in missing)}{how}")
  unknown = [k for k in node if k not in names]
  if unknown:
    raise ConfigFileError(f"unknown config key '{cls.KEY}.{unknown[0]}' (known: {', '.join(names)})")
  return cls(**{k: node[k] for k in names})


def import_user_modules(cfg: ml_collections.ConfigDict) -> None:
  """Imports the modules of the config's top-level `imports` (module names or .py paths), so what they register
  (`@register_reward("mine")`, ...) is there before a registry is read. Configs saved before the key: none."""
  try:
    registry.import_modules(cfg.get("imports", ()))
  except registry.UserModuleError as e:
    raise ConfigFileError(f"bad value for config key 'imports': {e}") from None


# --- sections ------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class RolloutSection:
  """`rollout`: the agent loop and the sampler that produce the training rollouts."""

  KEY: ClassVar[str] = "rollout"
  max_turns: int = 30  # paper: 30 in training (50 at evaluation, `eval.max_turns`)
  max_new_tokens: int = 8768  # paper: response up to 8768 tokens per turn
  temperature: float = 1.0  # paper: 1.0
  top_p: float = 1.0
  top_k: int = 0
  mode: str = "rebuild"  # the reference rebuilds one user message from state each turn (docs/design.md section 3)
  tool_workers: int = 64  # tool calls in flight at once (experts answer in 9-96 s)
  max_len: int = 32768  # cache positions per row: prompt up to 24000 + response 8768 (paper)
  batch_size: int = 128  # sampler slots = prompts_per_step x group_size: one step's rollouts decode together
  chunk_steps: int = 16  # decode steps per jitted chunk
  enable_thinking: bool = True
  # Limits on hostile model output: past them a call is a tool error in the row's transcript, not an exception.
  max_tool_calls_per_turn: int = 8  # later calls in the turn are refused, not executed
  max_tool_argument_chars: int = 16_384  # one tool call's JSON text
  max_tool_argument_depth: int = 32  # nesting depth of a call's arguments

  def __post_init__(self):
    _at_least(self, ("max_turns", "max_new_tokens", "tool_workers", "max_len", "batch_size", "chunk_steps",
                     "max_tool_calls_per_turn", "max_tool_argument_chars", "max_tool_argument_depth"), 1)
    _at_least(self, ("top_k",), 0)
    if self.temperature < 0:
      raise _bad("rollout.temperature", f"must be >= 0, got {self.temperature}")
    if not 0 < self.top_p <= 1:
      raise _bad("rollout.top_p", f"must be in (0, 1], got {self.top_p}")
    if self.mode not in ("extend", "rebuild"):
      raise _bad("rollout.mode", f"{self.mode!r} (extend | rebuild)")
    if self.max_new_tokens >= self.max_len:
      raise _bad("rollout.max_new_tokens", f"{self.max_new_tokens} leaves no room for the prompt in "
                 f"rollout.max_len={self.max_len}")

  def rollout_config(self, temperature: float | None = None) -> RolloutConfig:
    """The agent loop's config; `temperature` replaces the sampling temperature (evaluation decodes greedily)."""
    return RolloutConfig(max_turns=self.max_turns, max_new_tokens=self.max_new_tokens,
                         temperature=self.temperature if temperature is None else temperature, top_p=self.top_p,
                         top_k=self.top_k, mode=self.mode, tool_workers=self.tool_workers,
                         enable_thinking=self.enable_thinking, max_tool_calls_per_turn=self.max_tool_calls_per_turn,
                         max_tool_argument_chars=self.max_tool_argument_chars,
                         max_tool_argument_depth=self.max_tool_argument_depth)


@dataclasses.dataclass(frozen=True)
class RewardSection:
  """`reward`: rewards, group advantages and which rollouts and turns train."""

  KEY: ClassVar[str] = "reward"
  name: str = "preference"  # registry name; R = 0 if wrong else P . normalised [tool counts, outcome, -cost, -latency]
  estimator: str = "grpo"  # registry name (the "advantage" category)
  clip: float = 3.0  # advantages clipped to [-3, 3]
  boost: float = 0.1  # the reference's +0.1 where A >= 1
  std_threshold: float = 0.1  # drop groups whose reward std <= this (< 0 keeps every group)
  drop_no_final_answer: bool = True  # paper: drop rollouts that never produced a final answer
  require_tool_call: bool = True  # paper: drop turns without a parseable tool call

  def __post_init__(self):
    _registered(self, "name", "reward")
    _registered(self, "estimator", "advantage")
    if self.clip <= 0:
      raise _bad("reward.clip", f"must be > 0, got {self.clip}")

  def reward_config(self) -> RewardConfig:
    return RewardConfig(reward=self.name, advantage=AdvantageConfig(estimator=self.estimator, clip=self.clip,
                                                                    boost=self.boost),
                        std_threshold=self.std_threshold, drop_no_final_answer=self.drop_no_final_answer)


@dataclasses.dataclass(frozen=True)
class TrainSection:
  """`train`: the PPO/GRPO update (loss, AdamW, mini-batches, log-probs)."""

  KEY: ClassVar[str] = "train"
  learning_rate: float = 1e-6  # AdamW, constant (paper)
  b1: float = 0.9
  b2: float = 0.999
  weight_decay: float = 0.01
  grad_clip_norm: float = 1.0
  mini_batch_size: int = 16  # turn samples per optimizer step (paper: 16)
  ppo_epochs: int = 1
  # 16 rows of up to 32k tokens: two micro-batches of 8, one row per fsdp shard of a (1, 8, 4) mesh.
  grad_accum_steps: int = 2
  clip_low: float = 0.2  # ratio clipped to [1 - 0.2, 1 + 0.28] (clip-higher)
  clip_high: float = 0.28
  dual_clip: float = 10.0
  aggregation: str = "token_mean"  # registry name
  kl_type: str = "mse"  # registry name; mse: 0.5 (logp - logp_ref)^2
  kl_coef: float = 1e-4  # 0 turns the KL term off
  old_logprobs: str = "recompute"  # the sampler's log-probs are not the policy's at top-p < 1 or after updates
  logprob_window: int = 8768  # responses are right-aligned: score only their last N positions (0 = all)
  seq_bucket: int = 2048  # pad training sequences to a multiple of this (few compiled shapes)

  def __post_init__(self):
    _registered(self, "aggregation", "aggregation")
    _registered(self, "kl_type", "kl")
    _at_least(self, ("mini_batch_size", "ppo_epochs", "grad_accum_steps", "seq_bucket"), 1)
    _at_least(self, ("logprob_window",), 0)
    if self.old_logprobs not in ("recompute", "sampler"):
      raise _bad("train.old_logprobs", f"{self.old_logprobs!r} (recompute | sampler)")
    if self.mini_batch_size % self.grad_accum_steps:
      raise _bad("train.grad_accum_steps", "must divide train.mini_batch_size")
    if self.learning_rate <= 0:
      raise _bad("train.learning_rate", f"must be > 0, got {self.learning_rate}")
    for name in ("b1", "b2"):
      if not 0 <= getattr(self, name) < 1:
        raise _bad(f"train.{name}", f"must be in [0, 1), got {getattr(self, name)}")
    for name in ("weight_decay", "kl_coef", "clip_low", "clip_high"):
      if getattr(self, name) < 0:
        raise _bad(f"train.{name}", f"must be >= 0, got {getattr(self, name)}")
    if self.grad_clip_norm <= 0:
      raise _bad("train.grad_clip_norm", f"must be > 0, got {self.grad_clip_norm}")
    if self.dual_clip <= 1:  # the dual clip bounds the ratio of A < 0 samples by c > 1
      raise _bad("train.dual_clip", f"must be > 1, got {self.dual_clip}")

  def train_config(self) -> TrainConfig:
    loss = LossConfig(clip_low=self.clip_low, clip_high=self.clip_high, dual_clip=self.dual_clip,
                      aggregation=self.aggregation, kl_type=self.kl_type, kl_coef=self.kl_coef)
    optimizer = OptimizerConfig(learning_rate=self.learning_rate, b1=self.b1, b2=self.b2,
                                weight_decay=self.weight_decay, grad_clip_norm=self.grad_clip_norm)
    return TrainConfig(loss=loss, optimizer=optimizer, grad_accum_steps=self.grad_accum_steps,
                       logprob_window=self.logprob_window or None)


@dataclasses.dataclass(frozen=True)
class SftSection:
  """`sft`: the supervised warm-up on the task family's format examples (the demo's random-tool trajectories)."""

  KEY: ClassVar[str] = "sft"
  steps: int = 0  # 0 = no warm-up (the paper starts from Qwen3-8B, which knows the format)
  learning_rate: float = 1e-5
  batch_size: int = 16

  def __post_init__(self):
    _at_least(self, ("steps",), 0)
    _at_least(self, ("batch_size",), 1)
    if self.learning_rate <= 0:
      raise _bad("sft.learning_rate", f"must be > 0, got {self.learning_rate}")


@dataclasses.dataclass(frozen=True)
class MeshSection:
  """`mesh`: the device mesh (data, fsdp, tensor)."""

  KEY: ClassVar[str] = "mesh"
  # Weights, grads and Adam state sharded over fsdp; tensor=4 splits the 32 query / 8 KV heads, which is what
  # makes 32k-token rows fit (memory plan: (1, 32, 1) needs ~240 GB per chip, (1, 8, 4) ~80 GB on a v5p-64).
  # -1 = the rest of the chips.
  shape: tuple[int, ...] = (1, -1, 4)

  def __post_init__(self):
    shape = tuple(self.shape)
    if len(shape) != 3 or any(not isinstance(n, int) or (n < 1 and n != -1) for n in shape) or shape.count(-1) > 1:
      raise _bad("mesh.shape", f"(data, fsdp, tensor) sizes >= 1, at most one -1 (the rest), got {self.shape!r}")


@dataclasses.dataclass(frozen=True)
class DebugSection:
  """`debug`: fault injection for tests."""

  KEY: ClassVar[str] = "debug"
  nan_at_step: int = -1  # poison the advantages of this RL step (the NaN guard's test); -1 = never


# Top-level section key -> its dataclass; `env` depends on env.name (task_families.ENV_SECTIONS).
SECTIONS = {"mesh": MeshSection, "rollout": RolloutSection, "reward": RewardSection, "train": TrainSection,
            "sft": SftSection, "debug": DebugSection}


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
  """A whole training config, typed and checked (`from_config`). Top-level scalars have no defaults: the config
  file states them (they describe the run, not the method)."""

  model: ModelConfig
  mesh: MeshSection
  env: Any  # the family's section (task_families.ENV_SECTIONS), or the ConfigDict of a family without one
  rollout: RolloutSection
  reward: RewardSection
  train: TrainSection
  sft: SftSection
  debug: DebugSection
  steps: int  # RL steps
  prompts_per_step: int  # tasks per step (paper: 16)
  group_size: int  # rollouts per task (paper: 8)
  seed: int
  workdir: str
  init_checkpoint: str  # orchestra or HF checkpoint directory; '' = random init
  tokenizer_dir: str  # '' = the bundled Qwen3 tokenizer
  eval_every: int  # RL steps between evaluations (also at the start and the end)
  checkpoint_every: int
  keep_checkpoints: int
  imports: tuple[str, ...] = ()  # modules imported before the registries are read (configs saved before: none)

  KEY: ClassVar[str] = ""

  def __post_init__(self):
    for name in ("steps", "prompts_per_step", "group_size", "eval_every", "checkpoint_every", "keep_checkpoints"):
      value = getattr(self, name)
      if value < 1:
        raise _bad(name, f"must be >= 1, got {value}")
    if self.group_size < 2:
      raise _bad("group_size", "GRPO needs at least 2 rollouts per task")
    r = self.rollout
    if self.train.old_logprobs == "sampler" and (r.temperature != 1.0 or r.top_p < 1.0 or r.top_k > 0):
      raise _bad("train.old_logprobs", "'sampler' log-probs equal the policy's only at rollout.temperature=1 "
                 "without top-p/top-k; use 'recompute'")
    if 0 < self.train.logprob_window < r.max_new_tokens:  # the trainer would stop at the first long response
      raise _bad("train.logprob_window", f"{self.train.logprob_window} is below rollout.max_new_tokens="
                 f"{r.max_new_tokens}, so a long response could not be scored; raise it (0 = every position)")
    problem = precision_problem(self.model.param_dtype, self.train.learning_rate)
    if problem:
      raise ConfigFileError(problem)

  @classmethod
  def from_config(cls, cfg: ml_collections.ConfigDict) -> TrainingConfig:
    """The one validation of a training config: one `ConfigFileError` line per problem, before any work starts.
    Imports the config's `imports` first, so the names they register are known."""
    import_user_modules(cfg)
    missing = [k for k in TRAINING_SECTIONS if k not in cfg]
    if missing:  # e.g. a model-only config (tiny) given to `orchestra train`
      raise ConfigFileError(f"config lacks {', '.join(repr(k) for k in missing)}: not a training config "
                            "(training configs: demo, orchestrator_8b)")
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in cfg if k not in names and k not in OTHER_COMMANDS_SECTIONS]
    if unknown:
      raise ConfigFileError(f"unknown config key '{unknown[0]}' (known: {', '.join(names)})")
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in cfg and f.default is dataclasses.MISSING]
    if missing:
      raise ConfigFileError(f"config lacks {', '.join(repr(k) for k in missing)}")
    values: dict[str, Any] = {k: cfg[k] for k in names if k in cfg and k not in SECTIONS and k != "env"}
    values["model"] = config_lib.model_config(cfg)
    values["env"] = _env_section(cfg.env)
    values.update({k: build_section(section_cls, cfg[k]) for k, section_cls in SECTIONS.items()})
    imports = values.get("imports", ())
    values["imports"] = (imports,) if isinstance(imports, str) else tuple(imports)
    return cls(**values)


def _env_section(node: Any):
  if not isinstance(node, ml_collections.ConfigDict) or "name" not in node:
    raise ConfigFileError("config section 'env' needs a 'name' (the task family: "
                          f"{', '.join(sorted(ENVIRONMENTS))})")
  if node.name not in ENVIRONMENTS:
    raise _bad("env.name", f"{node.name!r} (known: {', '.join(sorted(ENVIRONMENTS))})")
  section_cls = ENV_SECTIONS.get(node.name)
  return build_section(section_cls, node) if section_cls else node
