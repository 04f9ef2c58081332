"""Rewards -> filters -> advantages for a batch of groups, in one jittable call.

Order: rollouts without a final answer are masked first (when `drop_no_final_answer`), so they take no part in the
group's min/max, mean and std; rewards are computed; groups whose reward std ≤ `std_threshold` are dropped;
advantages are computed over the remaining rollouts. Dropped rollouts and groups get advantage 0 and keep = False.
Turn-level filtering (no parseable tool call) happens when the turn samples are built
(`Trajectory.to_turn_samples(require_tool_call=True)`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from orchestra_jax.reward.advantages import AdvantageConfig, compute_advantages
from orchestra_jax.reward.filters import DEFAULT_STD_THRESHOLD, group_std_mask, keep_mask
from orchestra_jax.reward.rewards import DEFAULT_REWARD, compute_rewards


@dataclasses.dataclass(frozen=True)
class RewardConfig:
  reward: str = DEFAULT_REWARD  # a name in the reward registry
  reward_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # e.g. {"cap": 0.8} for efficiency
  advantage: AdvantageConfig = AdvantageConfig()
  std_threshold: float | None = DEFAULT_STD_THRESHOLD  # drop groups with reward std ≤ this; None keeps all
  drop_no_final_answer: bool = True


def score_groups(config: RewardConfig, tool_counts, outcome, cost, latency, preference=None,
                 has_final_answer=None) -> dict[str, jax.Array]:
  """Inputs [G] or [N, G] (tool_counts [..., G, T_tools], preference [T+3] or [N, T+3]).

  Returns rewards [..., G], advantages [..., G] (0 where not kept), keep [..., G] bool, group_keep [...] bool.
  """
  outcome = jnp.asarray(outcome, jnp.float32)
  rollout_mask = jnp.ones(outcome.shape, bool)
  if config.drop_no_final_answer and has_final_answer is not None:
    rollout_mask = jnp.asarray(has_final_answer, bool)
  rewards = compute_rewards(config.reward, tool_counts, outcome, cost, latency, preference, rollout_mask,
                            **dict(config.reward_options))
  if config.std_threshold is None:
    group_keep = jnp.ones(outcome.shape[:-1], bool)
  else:
    group_keep = group_std_mask(rewards, rollout_mask, config.std_threshold)
  keep = keep_mask(rollout_mask, group_keep)
  advantages = compute_advantages(rewards, rollout_mask, config.advantage)
  return {"rewards": rewards, "advantages": jnp.where(keep, advantages, 0.0), "keep": keep, "group_keep": group_keep}
