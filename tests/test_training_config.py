"""The typed training config (orchestra_jax/training_config.py): each section checks itself in one line naming its
key, the dataclass defaults are the paper's (configs/orchestrator_8b.py), config files resolve to every field."""

import dataclasses
from pathlib import Path

import ml_collections
import pytest

from orchestra_jax import trainer
from orchestra_jax.configs import ConfigFileError, load_config
from orchestra_jax.task_families import DATA_ENV_DEFAULTS, DataEnvSection, DemoEnvSection
from orchestra_jax.rollout.agent_loop import RolloutConfig
from orchestra_jax.training_config import (DebugSection, MeshSection, RewardSection, RolloutSection, SftSection,
                                           TrainingConfig, TrainSection, build_section, section)

ROOT = Path(__file__).resolve().parent.parent
BIG = str(ROOT / "configs" / "orchestrator_8b.py")
DEMO = str(ROOT / "configs" / "demo.py")
SECTIONS = {"rollout": RolloutSection, "reward": RewardSection, "train": TrainSection, "sft": SftSection,
            "mesh": MeshSection, "debug": DebugSection}


def _one_line(fn, needle: str) -> None:
  with pytest.raises(ConfigFileError) as info:
    fn()
  assert needle in str(info.value) and "\n" not in str(info.value), str(info.value)


@pytest.mark.parametrize("cls, changes, needle", [
    (RolloutSection, {"max_turns": 0}, "'rollout.max_turns': must be >= 1, got 0"),
    (RolloutSection, {"batch_size": 0}, "'rollout.batch_size': must be >= 1, got 0"),
    (RolloutSection, {"mode": "append"}, "'rollout.mode': 'append' (extend | rebuild)"),
    (RolloutSection, {"top_p": 0.0}, "'rollout.top_p'"),
    (RolloutSection, {"temperature": -1.0}, "'rollout.temperature'"),
    (RolloutSection, {"max_new_tokens": 40000}, "'rollout.max_new_tokens'"),
    (RolloutSection, {"max_tool_calls_per_turn": 0}, "'rollout.max_tool_calls_per_turn': must be >= 1, got 0"),
    (RolloutSection, {"max_tool_argument_depth": 0}, "'rollout.max_tool_argument_depth'"),
    (RewardSection, {"name": "nope"}, "'reward.name': 'nope' (known: efficiency, outcome, preference"),
    (RewardSection, {"estimator": "nope"}, "'reward.estimator'"),
    (RewardSection, {"clip": 0.0}, "'reward.clip'"),
    (TrainSection, {"aggregation": "nope"}, "'train.aggregation'"),
    (TrainSection, {"kl_type": "nope"}, "'train.kl_type'"),
    (TrainSection, {"mini_batch_size": 0}, "'train.mini_batch_size': must be >= 1, got 0"),
    (TrainSection, {"old_logprobs": "cached"}, "'train.old_logprobs': 'cached' (recompute | sampler)"),
    (TrainSection, {"grad_accum_steps": 3}, "'train.grad_accum_steps': must divide train.mini_batch_size"),
    (TrainSection, {"learning_rate": 0.0}, "'train.learning_rate'"),
    (TrainSection, {"dual_clip": 1.0}, "'train.dual_clip'"),
    (SftSection, {"batch_size": 0}, "'sft.batch_size'"),
    (MeshSection, {"shape": (-1, -1, 1)}, "'mesh.shape'"),
    (DemoEnvSection, {"preferences": ()}, "'env.preferences'"),
    (DataEnvSection, {"expert_mode": "boss"}, "'env.expert_mode'"),
    (DataEnvSection, {"judge_endpoint": "http://x/v1"}, "go together"),
])
def test_each_section_refuses_a_bad_value_naming_its_key(cls, changes, needle):
  _one_line(lambda: cls(**changes), needle)
  _one_line(lambda: build_section(cls, section(cls, **changes)), needle)  # the same, from a config file


def test_the_defaults_are_the_8b_configs_values():
  cfg = load_config(BIG)
  for key, cls in SECTIONS.items():
    assert cfg[key].to_dict() == dataclasses.asdict(cls()), key
  typed = trainer.validate(cfg)
  for key, cls in SECTIONS.items():
    assert getattr(typed, key) == cls(), key
  assert isinstance(typed.env, DataEnvSection) and set(cfg.env.keys()) == set(DATA_ENV_DEFAULTS)


def test_library_configs_come_from_the_sections():
  typed = trainer.validate(load_config(BIG))
  r = typed.rollout.rollout_config()
  assert (r.max_turns, r.max_new_tokens, r.mode, r.tool_workers, r.temperature) == (30, 8768, "rebuild", 64, 1.0)
  assert typed.rollout.rollout_config(temperature=0.0).temperature == 0.0
  assert RolloutConfig() == RolloutSection().rollout_config()  # one set of defaults
  limits = RolloutSection(max_tool_calls_per_turn=2, max_tool_argument_chars=100, max_tool_argument_depth=3)
  r = limits.rollout_config()
  assert (r.max_tool_calls_per_turn, r.max_tool_argument_chars, r.max_tool_argument_depth) == (2, 100, 3)
  t = typed.train.train_config()
  assert (t.optimizer.learning_rate, t.loss.clip_high, t.grad_accum_steps, t.logprob_window) == (1e-6, 0.28, 2, 8768)
  assert TrainSection(logprob_window=0).train_config().logprob_window is None
  w = typed.reward.reward_config()
  assert (w.reward, w.advantage.clip, w.std_threshold, w.drop_no_final_answer) == ("preference", 3.0, 0.1, True)


def test_demo_states_only_what_differs_and_resolves_typed():
  typed = trainer.validate(load_config(DEMO))
  assert isinstance(typed.env, DemoEnvSection) and typed.env.preferences == ("cheap",)
  assert typed.rollout == RolloutSection(max_turns=2, max_new_tokens=24, mode="extend", tool_workers=16, max_len=320,
                                         batch_size=64, chunk_steps=8)
  assert typed.train.old_logprobs == "sampler" and typed.mesh.shape == (-1, 1, 1) and typed.sft.steps == 80
  assert (typed.steps, typed.prompts_per_step, typed.group_size, typed.workdir) == (20, 8, 8, "runs/demo")


def test_the_config_files_resolve_to_every_field_as_before():
  """What configs/demo.py and configs/orchestrator_8b.py wrote out in full before the sections had defaults."""
  demo = load_config(DEMO).to_dict()
  # Added later with defaults (limits on hostile tool calls); the files did not have to change.
  limits = {"max_tool_calls_per_turn": 8, "max_tool_argument_chars": 16_384, "max_tool_argument_depth": 32}
  assert demo["rollout"] == {**limits, "max_turns": 2, "max_new_tokens": 24, "temperature": 1.0, "top_p": 1.0, "top_k": 0,
                             "mode": "extend", "tool_workers": 16, "max_len": 320, "batch_size": 64,
                             "chunk_steps": 8, "enable_thinking": True}
  assert demo["train"] == {"learning_rate": 3e-4, "b1": 0.9, "b2": 0.999, "weight_decay": 0.01,
                           "grad_clip_norm": 1.0, "mini_batch_size": 16, "ppo_epochs": 1, "grad_accum_steps": 1,
                           "clip_low": 0.2, "clip_high": 0.28, "dual_clip": 10.0, "aggregation": "token_mean",
                           "kl_type": "mse", "kl_coef": 1e-4, "old_logprobs": "sampler", "logprob_window": 32,
                           "seq_bucket": 64}
  assert demo["reward"] == {"name": "preference", "estimator": "grpo", "clip": 3.0, "boost": 0.1,
                            "std_threshold": 0.1, "drop_no_final_answer": False, "require_tool_call": True}
  assert demo["sft"] == {"steps": 80, "learning_rate": 1e-2, "batch_size": 16}
  assert demo["env"] == {"name": "demo", "num_train_tasks": 480, "num_eval_tasks": 60, "preferences": ("cheap",)}
  assert demo["mesh"] == {"shape": (-1, 1, 1)} and demo["debug"] == {"nan_at_step": -1}
  big = load_config(BIG).to_dict()
  assert big["rollout"] == {**limits, "max_turns": 30, "max_new_tokens": 8768, "temperature": 1.0, "top_p": 1.0, "top_k": 0,
                            "mode": "rebuild", "tool_workers": 64, "max_len": 32768, "batch_size": 128,
                            "chunk_steps": 16, "enable_thinking": True}
  assert (big["train"]["grad_accum_steps"], big["train"]["old_logprobs"], big["train"]["logprob_window"],
          big["train"]["seq_bucket"]) == (2, "recompute", 8768, 2048)
  assert big["sft"] == {"steps": 0, "learning_rate": 1e-5, "batch_size": 16} and big["mesh"] == {"shape": (1, -1, 4)}
  # Every field is a key, so each can still be overridden on the command line.
  assert load_config(DEMO, ["--config.rollout.top_p=0.9"]).rollout.top_p == 0.9


def test_unknown_and_missing_keys_are_one_line():
  _one_line(lambda: section(RolloutSection, max_turn=2), "unknown config key 'rollout.max_turn'")
  cfg = load_config(DEMO)
  cfg.unlock()
  cfg.rollout.max_turn = 2
  _one_line(lambda: trainer.validate(cfg), "unknown config key 'rollout.max_turn'")
  cfg = load_config(DEMO)
  cfg.unlock()
  del cfg.rollout["chunk_steps"]
  _one_line(lambda: trainer.validate(cfg), "config section 'rollout' lacks 'chunk_steps'")
  cfg = load_config(DEMO)
  cfg.unlock()
  cfg.extra = 1
  _one_line(lambda: trainer.validate(cfg), "unknown config key 'extra'")
  cfg = load_config(DEMO)
  cfg.unlock()
  del cfg["seed"]
  _one_line(lambda: trainer.validate(cfg), "config lacks 'seed'")
  _one_line(lambda: trainer.validate(load_config("tiny")), "not a training config")


@pytest.mark.parametrize("overrides, needle", [
    (["--config.rollout.temperature=0.7"], "'train.old_logprobs': 'sampler' log-probs"),
    (["--config.train.logprob_window=16"], "'train.logprob_window': 16 is below rollout.max_new_tokens=24"),
    (["--config.group_size=1"], "'group_size': GRPO needs at least 2"),
    (["--config.steps=0"], "'steps': must be >= 1, got 0"),
    (["--config.env.name=nope"], "'env.name': 'nope' (known: data, demo)"),
    (["--config.env.name=data"], "config section 'env' lacks 'train_data'"),
])
def test_cross_section_rules_are_one_line(overrides, needle):
  _one_line(lambda: trainer.validate(load_config(DEMO, overrides)), needle)


def test_saved_configs_without_imports_still_validate():
  cfg = load_config(DEMO)
  with cfg.unlocked():
    del cfg["imports"]
  assert TrainingConfig.from_config(cfg).imports == ()
  assert trainer.validate(load_config(DEMO, ["--config.imports=json"])).imports == ("json",)


def test_a_user_family_without_a_section_gets_its_config_dict(monkeypatch):
  from orchestra_jax import registry
  from orchestra_jax.task_families import register_task_family
  register_task_family("test_training_config_mine")(lambda cfg: None)
  try:
    cfg = load_config(DEMO)
    cfg.unlock()
    cfg.env = ml_collections.ConfigDict({"name": "test_training_config_mine", "size": 3})
    assert trainer.validate(cfg).env.size == 3
  finally:
    registry.unregister("task_family", "test_training_config_mine")
