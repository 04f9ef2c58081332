"""Rewards, advantages and filters of ToolOrchestra (docs/design.md section 5).

- `outcome`: grading an answer (exact match, numeric tolerance, LLM-judge hook); host side.
- `rewards`: the reward registry (`preference` default, `efficiency`, `outcome`, `reference_buggy`); jnp.
- `advantages`: the advantage-estimator registry (`grpo` default, `grpo_no_std`, `rloo`), clip and boost; jnp.
- `filters`: keep-masks for groups (reward std), rollouts (final answer) and turns (tool call).
- `features`: trajectories -> arrays; the feature / preference layout.
- `pipeline`: `score_groups`, rewards -> filters -> advantages in one call.

The reward and advantage registries are categories of `orchestra_jax.registry` (`Registry`, `UnknownNameError`
re-exported here).
"""

from orchestra_jax.registry import Registry, UnknownNameError
from orchestra_jax.reward.advantages import (ADVANTAGES, AdvantageConfig, compute_advantages, get_advantage,
                                             group_std, register_advantage)
from orchestra_jax.reward.features import feature_names, group_arrays, preference_vector
from orchestra_jax.reward.filters import (final_answer_mask, group_std_mask, keep_mask, tool_call_turn_mask)
from orchestra_jax.reward.outcome import Judge, exact_match, grade, normalize_answer, numeric_match, parse_number
from orchestra_jax.reward.pipeline import RewardConfig, score_groups
from orchestra_jax.reward.rewards import (REWARDS, compute_rewards, efficiency_reward, feature_matrix, get_reward,
                                          normalize_features, preference_reward, reference_buggy_reward,
                                          register_reward, reward_names)

__all__ = [
    "ADVANTAGES", "AdvantageConfig", "Judge", "REWARDS", "Registry", "RewardConfig", "UnknownNameError",
    "compute_advantages", "compute_rewards", "efficiency_reward", "exact_match", "feature_matrix", "feature_names",
    "final_answer_mask", "get_advantage", "get_reward", "grade", "group_arrays", "group_std", "group_std_mask",
    "keep_mask", "normalize_answer", "normalize_features", "numeric_match", "parse_number", "preference_reward",
    "preference_vector", "reference_buggy_reward", "register_advantage", "register_reward", "reward_names",
    "score_groups", "tool_call_turn_mask",
]
