"""What every task family shares: the `EnvSetup` it yields, the "task_family" registry, and `ENV_SECTIONS`.

A family is a context manager `fn(config)` that yields an `EnvSetup`; its module registers it under its
`env.name` with `register_task_family` and, for a typed `env` section, adds the dataclass to `ENV_SECTIONS`.

An `EnvSetup.grade(task, trajectory, episode)` is called the moment a rollout ends (`AgentLoop.run(on_done=)`):
tau2 grading needs the episode's database, which only lives until then.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from orchestra_jax import configs as config_lib
from orchestra_jax.errors import UserError
from orchestra_jax.registry import Registry
from orchestra_jax.rollout.environment import Episode, ToolEnvironment

__all__ = ["EnvSetup", "GradingUnavailable", "ENVIRONMENTS", "ENV_SECTIONS", "register_task_family"]


class GradingUnavailable(UserError):
  """A grader (the LLM judge) failed after its retries; the message names the endpoint and the record."""


@dataclasses.dataclass
class EnvSetup:
  """Everything the loop needs from a task family: tools, tasks, grading, preferences, warm-up data."""

  env: ToolEnvironment
  aliases: list[str]  # tool features of the reward, counted by alias
  train_tasks: list[dict[str, Any]]
  eval_tasks: dict[str, list[dict[str, Any]]]  # group name (a preference, a benchmark) -> tasks
  grade: Callable[[dict, Any, Episode], float]  # (task, Trajectory, its Episode) -> outcome in {0, 1}
  preference_vector: Callable[[dict], np.ndarray]  # task -> [len(aliases) + 3] weights
  sft_examples: Callable[[Any, list[dict], int], list[tuple[list[int], list[int]]]] | None = None


def bad_value(key: str, why: str) -> config_lib.ConfigFileError:
  return config_lib.ConfigFileError(f"bad value for config key '{key}': {why}")


def typed_section(cls, env):
  """The family's typed `env` section: a TrainingConfig carries it built and checked; a plain ConfigDict (tests,
  notebooks) is built here, so every family body reads typed fields either way."""
  return env if isinstance(env, cls) else cls(**env.to_dict())


# The "task_family" category of orchestra_jax/registry.py: `env.name` -> a context manager `fn(config)` that yields
# an EnvSetup; `config` is the run's `training_config.TrainingConfig`, whose `env` is the family's section of
# ENV_SECTIONS, or the plain ConfigDict for a family without one. A user's module (config key `imports`) adds a
# family with `@register_task_family("mine")` (and, for a typed `env`, its dataclass in ENV_SECTIONS).
ENVIRONMENTS: Registry[Callable[[Any], Any]] = Registry("task_family")
register_task_family = ENVIRONMENTS.register

# env.name -> the dataclass its `env` section is built into (`training_config.TrainingConfig.from_config`); each
# family's module adds its own.
ENV_SECTIONS: dict[str, type] = {}
