"""The three filters of docs/design.md section 5, as keep-masks (True = keep).

- `group_std_mask`: drop a group whose reward std ≤ threshold (0.1): it teaches little (jnp, batched).
- `final_answer_mask`: drop rollouts that never produced a final answer (host side, from trajectories).
- `tool_call_turn_mask`: drop turns with no parseable tool call (host side, from a trajectory); the same rule as
  `Trajectory.to_turn_samples(require_tool_call=True)`, which is what builds the training samples.

The trajectory helpers use only `trajectory.final_answer` and `trajectory.turns[i].tool_calls`, so any object with
those attributes works.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from orchestra_jax.reward.advantages import group_std

DEFAULT_STD_THRESHOLD = 0.1


def group_std_mask(rewards, mask=None, threshold: float = DEFAULT_STD_THRESHOLD, ddof: int = 1) -> jax.Array:
  """[..., G] rewards -> [...] bool: True where the group's reward std (ddof=1, over `mask`) exceeds `threshold`."""
  return group_std(rewards, mask, ddof) > threshold


def final_answer_mask(trajectories: Sequence[Any]) -> np.ndarray:
  """[G] bool: True where the rollout produced a final answer (`final_answer is not None`)."""
  return np.array([t.final_answer is not None for t in trajectories], bool)


def tool_call_turn_mask(trajectory: Any) -> np.ndarray:
  """[num_turns] bool: True where the assistant turn holds at least one parseable tool call."""
  return np.array([bool(turn.tool_calls) for turn in trajectory.turns], bool)


def keep_mask(rollout_mask, group_mask) -> jax.Array:
  """Rollouts to train on: [..., G] rollout mask AND its group's [...] mask."""
  return jnp.asarray(rollout_mask, bool) & jnp.asarray(group_mask, bool)[..., None]
