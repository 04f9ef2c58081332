"""Rewards of a group of G rollouts of one task (docs/design.md section 5): pure jnp, jittable, vmappable.

Every reward function has one signature, so a variant is one function plus one name:

    fn(tool_counts [G, T_tools], outcome [G], cost [G], latency [G], preference [T_tools + 3] | None,
       mask [G] bool | None = None, **options) -> rewards [G] float32

- tool_counts: n_t(τ), calls of each tool t (the caller fixes the tool order; `features.feature_names` names it).
- outcome: o(τ) ∈ {0, 1} (a rollout counts as correct when o > 0).
- cost: C(τ) in USD; latency: L(τ) in seconds (summed wall time of tool calls).
- preference: P, one weight per feature of M(τ) = [n_t for each tool …, o, −C, −L] (so positive P on −C means
  "prefer cheap"); ignored by rewards that do not use it.
- mask: rollouts that take part (False: dropped by a filter, e.g. no final answer). Masked rollouts are left out of
  the group statistics and get reward 0. None = all take part.

Registered variants (`get_reward(name)`):
- `preference` (default; what the method means): M̂_k = (M_k − min_G M_k) / (max_G M_k − min_G M_k), 0 for a
  feature that is constant over the group; R = 0 if o = 0 else Σ_k P_k · M̂_k.
- `efficiency`: the plain efficiency reward r = o − min(0.8, 5·C + L/500) for correct rollouts. docs/design.md states it for
  correct rollouts only; a wrong rollout gets 0 here (as in `preference`), so a wrong rollout never outranks a
  correct one (a correct rollout scores ≥ 0.2).
- `outcome`: R = o (accuracy only, an ablation).
- `reference_buggy`: NOT the default; reproduces the reference code's slips for comparison runs. Cost and latency
  enter with the wrong sign relative to their min/max: M̂ = (−X − min X) / (max X − min X) for X ∈ {C, L} instead
  of normalising −X by the min/max of −X. That is the correct M̂ plus the group constant −(min X + max X) /
  (max X − min X) (≤ −1 for non-negative X), and since wrong rollouts are pinned at 0 the constant offset lands on
  correct rollouts only: with P on −C > 0 a correct rollout can score below a wrong one. Written from docs/design.md's
  description of the slips (the reference source is not vendored here); it is not a line-by-line port.

`compute_rewards` runs any of them on one group [G] or a batch of groups [num_groups, G] (vmap).
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp

from orchestra_jax.registry import Registry

RewardFn = Callable[..., jax.Array]

REWARDS: Registry[RewardFn] = Registry("reward")  # the "reward" category of orchestra_jax/registry.py
register_reward = REWARDS.register  # a taken name is replaced, with a warning
DEFAULT_REWARD = "preference"


def get_reward(name: str, **options) -> RewardFn:
  """The reward function called `name`, with keyword `options` bound (e.g. `cap=0.5` for `efficiency`)."""
  fn = REWARDS.get(name)
  return functools.partial(fn, **options) if options else fn


def reward_names() -> tuple[str, ...]:
  return REWARDS.names()


# --- building blocks ---------------------------------------------------------------------------------

def _mask(mask, g: int) -> jax.Array:
  return jnp.ones((g,), bool) if mask is None else jnp.asarray(mask, bool)


def feature_matrix(tool_counts, outcome, cost, latency) -> jax.Array:
  """M = [n_t for each tool …, o, −C, −L]: [G, T_tools + 3] float32."""
  tool_counts = jnp.asarray(tool_counts, jnp.float32)  # [G, T]
  cols = [jnp.asarray(x, jnp.float32)[:, None] for x in (outcome, -jnp.asarray(cost), -jnp.asarray(latency))]
  return jnp.concatenate([tool_counts] + cols, axis=-1)  # [G, T + 3]


def group_minmax(features, mask=None) -> tuple[jax.Array, jax.Array]:
  """Per-feature (min, max) over the rollouts in `mask`: each [K]. ±inf when no rollout takes part."""
  features = jnp.asarray(features, jnp.float32)  # [G, K]
  valid = _mask(mask, features.shape[0])[:, None]  # [G, 1]
  lo = jnp.min(jnp.where(valid, features, jnp.inf), axis=0)  # [K]
  hi = jnp.max(jnp.where(valid, features, -jnp.inf), axis=0)  # [K]
  return lo, hi


def _scaled(x, lo, hi, valid):
  """(x − lo) / (hi − lo) where hi > lo, else 0; 0 on rows outside `valid`. x: [G, K]; lo, hi: [K]; valid: [G, 1]."""
  spread = hi - lo
  varies = spread > 0  # False for a constant feature and for an empty group (−inf)
  out = (x - jnp.where(varies, lo, 0.0)) / jnp.where(varies, spread, 1.0)
  return jnp.where(varies & valid, out, 0.0)


def normalize_features(features, mask=None) -> jax.Array:
  """Group min-max normalisation M̂ [G, K] ∈ [0, 1]; a feature constant over the group is 0 everywhere."""
  features = jnp.asarray(features, jnp.float32)
  lo, hi = group_minmax(features, mask)
  return _scaled(features, lo, hi, _mask(mask, features.shape[0])[:, None])


def _check_preference(preference, num_features: int) -> jax.Array:
  if preference is None:
    raise ValueError("this reward needs a preference vector [T_tools + 3]")
  preference = jnp.asarray(preference, jnp.float32)
  if preference.shape != (num_features,):
    raise ValueError(f"preference has shape {preference.shape}; expected ({num_features},) = T_tools + 3 "
                     "weights for [n_t …, o, −C, −L]")
  return preference


def _only_correct(rewards, outcome, mask) -> jax.Array:
  keep = (jnp.asarray(outcome) > 0) & _mask(mask, rewards.shape[0])
  return jnp.where(keep, rewards, 0.0).astype(jnp.float32)


# --- the variants ------------------------------------------------------------------------------------

@register_reward("preference")
def preference_reward(tool_counts, outcome, cost, latency, preference, mask=None) -> jax.Array:
  """R = 0 if o = 0 else Σ_k P_k · M̂_k (docs/design.md section 5). Returns [G] float32."""
  m = feature_matrix(tool_counts, outcome, cost, latency)  # [G, K]
  p = _check_preference(preference, m.shape[-1])  # [K]
  r = normalize_features(m, mask) @ p  # [G]
  return _only_correct(r, outcome, mask)


@register_reward("efficiency")
def efficiency_reward(tool_counts, outcome, cost, latency, preference=None, mask=None, *, cost_weight: float = 5.0,
                      latency_scale: float = 500.0, cap: float = 0.8) -> jax.Array:
  """r = o − min(cap, cost_weight·C + L/latency_scale) for correct rollouts, 0 for wrong ones. [G] float32."""
  del tool_counts, preference
  outcome = jnp.asarray(outcome, jnp.float32)
  penalty = jnp.minimum(cap, cost_weight * jnp.asarray(cost, jnp.float32)
                        + jnp.asarray(latency, jnp.float32) / latency_scale)
  return _only_correct(outcome - penalty, outcome, mask)


@register_reward("outcome")
def outcome_reward(tool_counts, outcome, cost, latency, preference=None, mask=None) -> jax.Array:
  """R = o: correctness only."""
  del tool_counts, cost, latency, preference
  outcome = jnp.asarray(outcome, jnp.float32)
  return _only_correct(outcome, outcome, mask)


@register_reward("reference_buggy")
def reference_buggy_reward(tool_counts, outcome, cost, latency, preference, mask=None) -> jax.Array:
  """NOT the default: `preference` with the reference's sign slip on cost and latency (see the module doc).

  Tool counts and outcome are normalised as in `preference`; cost and latency use (−X − min X) / (max X − min X),
  i.e. the wrong sign relative to their min/max, which adds a negative group constant to correct rollouts only.
  """
  m = feature_matrix(tool_counts, outcome, cost, latency)  # [G, K]; last two columns −C, −L
  p = _check_preference(preference, m.shape[-1])
  valid = _mask(mask, m.shape[0])
  right = normalize_features(m[:, :-2], valid)  # [G, T + 1]
  raw = -m[:, -2:]  # [G, 2]: C, L (positive)
  lo, hi = group_minmax(raw, valid)  # min / max of C and L, not of −C and −L
  slipped = _scaled(m[:, -2:], lo, hi, valid[:, None])  # (−X − min X) / (max X − min X)
  r = jnp.concatenate([right, slipped], axis=-1) @ p
  return _only_correct(r, outcome, mask)


# --- one group or many -------------------------------------------------------------------------------

def compute_rewards(reward: str | RewardFn, tool_counts, outcome, cost, latency, preference=None, mask=None,
                    **options) -> jax.Array:
  """Rewards of one group ([G] inputs -> [G]) or of a batch of groups ([N, G] inputs -> [N, G], via vmap).

  Shapes for a batch: tool_counts [N, G, T_tools], outcome / cost / latency / mask [N, G], preference [T_tools + 3]
  (shared) or [N, T_tools + 3] (one per group, e.g. per-sample preferences). Jitted (the reward and the option
  values must be hashable); inside an outer jit it is inlined.
  """
  # A name is looked up out here: the jit cache is keyed on the function, not on its name, so a reward registered
  # again under the same name (a re-run notebook cell, a user module) is used, not the first one's compiled code.
  fn = get_reward(reward) if isinstance(reward, str) else reward
  return _compute_rewards(fn, tuple(sorted(options.items())), tool_counts, outcome, cost, latency, preference, mask)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _compute_rewards(fn, options, tool_counts, outcome, cost, latency, preference, mask):
  fn = functools.partial(fn, **dict(options)) if options else fn
  outcome = jnp.asarray(outcome)
  if outcome.ndim == 1:
    return fn(tool_counts, outcome, cost, latency, preference, mask)
  if outcome.ndim != 2:
    raise ValueError(f"outcome must be [G] or [num_groups, G]; got shape {outcome.shape}")
  p_axis = None if preference is None or jnp.ndim(preference) == 1 else 0
  m_axis = None if mask is None else 0
  return jax.vmap(fn, in_axes=(0, 0, 0, 0, p_axis, m_axis))(tool_counts, outcome, cost, latency, preference, mask)
