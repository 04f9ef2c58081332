"""orchestra_jax/registry.py: one registry by category; re-registering replaces with a warning; unknown names list
the known ones; a config's `imports` brings a user's module in before the trainer reads a registry."""

import warnings
from pathlib import Path

import numpy as np
import pytest

from orchestra_jax import registry, trainer
from orchestra_jax.configs import ConfigFileError, load_config
from orchestra_jax.errors import UserError
from orchestra_jax.task_families import ENVIRONMENTS, demo_environment
from orchestra_jax.reward import (REWARDS, AdvantageConfig, compute_advantages, compute_rewards, register_reward,
                                  score_groups)
from orchestra_jax.reward.advantages import ADVANTAGES, grpo_advantage
from orchestra_jax.rl.loss import AGGREGATIONS, KL_ESTIMATORS, kl_k3, token_mean

DEMO = str(Path(__file__).resolve().parents[1] / "configs" / "demo.py")


@pytest.fixture
def scratch():
  """Names registered by a test, removed afterwards (the tables are process-wide)."""
  made: list[tuple[str, str]] = []
  yield made
  for category, name in made:
    registry.unregister(category, name)


def _fn(value):
  def fn(*args, **kwargs):
    return value
  return fn


def test_every_registry_is_a_category():
  assert set(registry.categories()) == {"reward", "advantage", "aggregation", "kl", "task_family"}
  assert registry.get("advantage", "grpo") is ADVANTAGES["grpo"] is grpo_advantage
  assert registry.get("aggregation", "token_mean") is AGGREGATIONS.get("token_mean") is token_mean
  assert registry.get("kl", "k3") is KL_ESTIMATORS["k3"] is kl_k3
  assert registry.get("task_family", "demo") is ENVIRONMENTS["demo"] is demo_environment
  assert {"preference", "efficiency", "outcome"} <= set(registry.names("reward")) == set(REWARDS)
  with pytest.raises(ValueError, match="categories: reward, advantage"):
    registry.register("rewards", "x")


def test_reregistering_warns_and_replaces(scratch):
  scratch.append(("reward", "test_registry_twice"))
  first, second = _fn(1), _fn(2)
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # a first registration, and the same function again, say nothing
    registry.register("reward", "test_registry_twice")(first)
    registry.register("reward", "test_registry_twice")(first)
  with pytest.warns(UserWarning, match=r"reward 'test_registry_twice' was already registered .*replaces it") as w:
    assert register_reward("test_registry_twice")(second) is second  # the old decorator is a thin wrapper
  assert w[0].filename == __file__  # points at the registering line, not at the registry
  assert REWARDS.get("test_registry_twice") is second


def test_a_replaced_variant_is_used_under_jit(scratch):
  """The jitted reward / advantage code is cached per function, not per name: a re-registered name takes effect."""
  scratch += [("reward", "test_registry_jit"), ("advantage", "test_registry_jit")]
  outcome = np.array([1.0, 0.0, 1.0, 1.0], np.float32)
  args = (np.zeros((4, 0), np.float32), outcome, np.zeros(4), np.zeros(4))
  no_post = AdvantageConfig(estimator="test_registry_jit", clip=None, boost=0.0)
  for scale in (1.0, 2.0):
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")  # the second round replaces
      register_reward("test_registry_jit")(lambda tool_counts, outcome, *_, scale=scale, **__: scale * outcome)
      registry.register("advantage", "test_registry_jit")(lambda rewards, mask, config, scale=scale: scale * rewards)
    np.testing.assert_allclose(compute_rewards("test_registry_jit", *args), scale * outcome)
    np.testing.assert_allclose(compute_advantages(outcome, config=no_post), scale * outcome)


def test_unknown_name_lists_the_known_ones():
  with pytest.raises(registry.UnknownNameError) as info:
    registry.get("kl", "k2")
  assert str(info.value) == "unknown KL estimator 'k2'; known: k1, k3, mse"
  assert isinstance(info.value, KeyError) and isinstance(info.value, UserError)
  with pytest.raises(KeyError, match="known: data, demo"):
    ENVIRONMENTS["nope"]


def test_categories_are_separate(scratch):
  scratch += [("reward", "test_registry_shared"), ("advantage", "test_registry_shared")]
  as_reward, as_advantage = _fn("r"), _fn("a")
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # the same name in another category replaces nothing
    registry.register("reward", "test_registry_shared")(as_reward)
    registry.register("advantage", "test_registry_shared")(as_advantage)
  assert registry.get("reward", "test_registry_shared") is as_reward
  assert registry.get("advantage", "test_registry_shared") is as_advantage
  assert "test_registry_shared" not in AGGREGATIONS and "test_registry_shared" not in ENVIRONMENTS
  with pytest.raises(registry.UnknownNameError):
    registry.get("kl", "test_registry_shared")


USER_MODULE = '''
import jax.numpy as jnp
from orchestra_jax.reward.rewards import register_reward

@register_reward("test_registry_mine")
def mine(tool_counts, outcome, cost, latency, preference=None, mask=None):
  return 7.0 * jnp.asarray(outcome, jnp.float32)
'''


def test_config_imports_a_user_module_the_trainer_then_finds(tmp_path, monkeypatch, scratch):
  scratch.append(("reward", "test_registry_mine"))
  (tmp_path / "my_rewards.py").write_text(USER_MODULE)
  monkeypatch.chdir(tmp_path)  # a relative path, as typed on the command line
  cfg = load_config(DEMO, ["--config.imports=my_rewards.py", "--config.reward.name=test_registry_mine"])
  assert cfg.imports == ("my_rewards.py",)
  assert "test_registry_mine" not in REWARDS
  trainer.validate(cfg)  # what Trainer(cfg) and `orchestra train --check` run first
  # The trainer's lookup: its RewardConfig through score_groups, as Trainer._score calls it.
  outcome = np.array([[1, 0, 1, 0]], np.float32)
  scored = score_groups(trainer._reward_config(cfg), np.zeros((1, 4, 3), np.float32), outcome, np.zeros((1, 4)),
                        np.zeros((1, 4)), np.ones((1, 6), np.float32))
  np.testing.assert_allclose(scored["rewards"], 7.0 * outcome)
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # validating again imports nothing again (no re-registration)
    trainer.validate(cfg)


def test_without_the_import_the_name_fails_validation_in_one_line():
  cfg = load_config(DEMO, ["--config.reward.name=test_registry_never"])
  with pytest.raises(ConfigFileError) as info:
    trainer.validate(cfg)
  message = str(info.value)
  assert "'reward.name'" in message and "known: efficiency, outcome, preference" in message and "\n" not in message


@pytest.mark.parametrize("imports, expected", [
    ("no_such_module_xyz", "no module named 'no_such_module_xyz'"),
    ("missing/rewards.py", "no file 'missing/rewards.py'"),
    ("broken.py", "importing 'broken.py' failed: ZeroDivisionError: division by zero"),
    ("needs_dep.py", "importing 'needs_dep.py' failed: ModuleNotFoundError: No module named 'no_such_dep_xyz'"),
])
def test_bad_imports_are_one_config_error_naming_the_module(tmp_path, monkeypatch, imports, expected):
  (tmp_path / "broken.py").write_text("x = 1 / 0\n")
  (tmp_path / "needs_dep.py").write_text("import no_such_dep_xyz\n")
  monkeypatch.chdir(tmp_path)
  cfg = load_config(DEMO, [f"--config.imports={imports}"])
  with pytest.raises(ConfigFileError) as info:
    trainer.validate(cfg)
  message = str(info.value)
  assert message.startswith("bad value for config key 'imports': ") and expected in message and "\n" not in message


def test_module_names_and_saved_configs_without_the_key(tmp_path):
  assert [m.__name__ for m in registry.import_modules(["json", "orchestra_jax.errors"])] == ["json",
                                                                                           "orchestra_jax.errors"]
  assert registry.import_modules("json")[0].__name__ == "json"  # one name, not its characters
  cfg = load_config(DEMO)
  with cfg.unlocked():
    del cfg["imports"]  # a run_config.json written before the key existed
  trainer.import_user_modules(cfg)
