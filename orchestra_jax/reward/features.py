"""From trajectories to the reward's input arrays (host side), and the feature / preference layout.

Feature order (what a preference vector P weights): [n_t for t in tool_names …, "outcome", "-cost", "-latency"].
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

OUTCOME, NEG_COST, NEG_LATENCY = "outcome", "-cost", "-latency"


def feature_names(tool_names: Sequence[str]) -> list[str]:
  """Names of M(τ)'s entries: one per tool, then outcome, −cost, −latency."""
  return [*tool_names, OUTCOME, NEG_COST, NEG_LATENCY]


def preference_vector(tool_names: Sequence[str], *, outcome: float = 1.0, cost: float = 0.0, latency: float = 0.0,
                      tools: Mapping[str, float] | None = None) -> np.ndarray:
  """P [T_tools + 3] float32. `cost` / `latency` weight −C / −L (positive = prefer cheap / fast); `tools` weights
  the call counts of named tools (positive = prefer using that tool), others get 0."""
  tools = dict(tools or {})
  unknown = sorted(set(tools) - set(tool_names))
  if unknown:
    raise ValueError(f"preference names tools {unknown} not in tool_names {list(tool_names)}")
  return np.array([tools.get(t, 0.0) for t in tool_names] + [outcome, cost, latency], np.float32)


def group_arrays(trajectories: Sequence[Any], tool_names: Sequence[str], outcomes: Sequence[float],
                 by: str = "alias") -> dict[str, np.ndarray]:
  """The arrays `compute_rewards` takes for one group of rollouts.

  Uses `trajectory.tool_counts(by)`, `.cost_usd`, `.latency_s` and `.final_answer` (see rollout.trajectory).
  Calls of tools outside `tool_names` are not counted as features (their cost and latency still are).
  Returns tool_counts [G, T] float32, outcome [G], cost [G], latency [G] float32, has_final_answer [G] bool.
  """
  if len(outcomes) != len(trajectories):
    raise ValueError(f"{len(trajectories)} trajectories but {len(outcomes)} outcomes")
  index = {t: i for i, t in enumerate(tool_names)}
  counts = np.zeros((len(trajectories), len(tool_names)), np.float32)
  for g, traj in enumerate(trajectories):
    for name, n in traj.tool_counts(by).items():
      if name in index:
        counts[g, index[name]] += n
  return {
      "tool_counts": counts,
      "outcome": np.asarray(outcomes, np.float32),
      "cost": np.array([t.cost_usd for t in trajectories], np.float32),
      "latency": np.array([t.latency_s for t in trajectories], np.float32),
      "has_final_answer": np.array([t.final_answer is not None for t in trajectories], bool),
  }
