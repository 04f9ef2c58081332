"""Group-relative advantages (docs/design.md section 5): pure jnp, one group [G] or a batch of groups [..., G].

    A(τ) = clip((R(τ) − mean_G R) / (std_G R + 1e-6), −3, 3)      (sample std, ddof = 1)
    A(τ) += 0.1 where A(τ) ≥ 1                                      (the reference's extra; boost=0 turns it off)

An estimator is one function plus one name, `fn(rewards [G], mask [G] bool, config) -> raw advantages [G]`;
`compute_advantages` applies the shared post-processing (clip, boost, 0 on masked rollouts) and batches it.

Registered estimators:
- `grpo` (default): (R − mean) / (sample std + eps).
- `grpo_no_std`: R − mean (Dr. GRPO: no division by the std).
- `rloo`: leave-one-out baseline, R_i − mean_{j≠i} R_j = n/(n−1) · (R_i − mean).

Masked rollouts (False) take no part in the mean / std and get advantage 0. A group with fewer than two rollouts
taking part gets advantage 0 (no baseline exists).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp

from orchestra_jax.registry import Registry


@dataclasses.dataclass(frozen=True)
class AdvantageConfig:
  estimator: str = "grpo"
  eps: float = 1e-6  # added to the std
  clip: float | None = 3.0  # |A| ≤ clip; None: no clipping
  boost: float = 0.1  # added where A ≥ boost_threshold (after clipping); 0 turns the reference's extra off
  boost_threshold: float = 1.0


AdvantageFn = Callable[[jax.Array, jax.Array, AdvantageConfig], jax.Array]
ADVANTAGES: Registry[AdvantageFn] = Registry("advantage")  # the "advantage" category of orchestra_jax/registry.py
register_advantage = ADVANTAGES.register
get_advantage = ADVANTAGES.get


def _moments(rewards, mask):
  """(n, mean, sample std) over the masked rollouts; std uses ddof = 1 (0 when n < 2)."""
  w = mask.astype(jnp.float32)
  n = jnp.sum(w)
  mean = jnp.sum(w * rewards) / jnp.maximum(n, 1.0)
  var = jnp.sum(w * (rewards - mean) ** 2) / jnp.maximum(n - 1.0, 1.0)
  return n, mean, jnp.sqrt(var)


@register_advantage("grpo")
def grpo_advantage(rewards, mask, config: AdvantageConfig) -> jax.Array:
  n, mean, std = _moments(rewards, mask)
  return jnp.where(n >= 2, (rewards - mean) / (std + config.eps), 0.0)


@register_advantage("grpo_no_std")
def grpo_no_std_advantage(rewards, mask, config: AdvantageConfig) -> jax.Array:
  del config
  n, mean, _ = _moments(rewards, mask)
  return jnp.where(n >= 2, rewards - mean, 0.0)


@register_advantage("rloo")
def rloo_advantage(rewards, mask, config: AdvantageConfig) -> jax.Array:
  del config
  n, mean, _ = _moments(rewards, mask)
  return jnp.where(n >= 2, n / jnp.maximum(n - 1.0, 1.0) * (rewards - mean), 0.0)


def group_std(rewards, mask=None, ddof: int = 1) -> jax.Array:
  """Std of the rewards over the last axis [..., G] -> [...], over masked rollouts only; ddof = 1 by default."""
  rewards = jnp.asarray(rewards, jnp.float32)
  w = jnp.ones(rewards.shape, jnp.float32) if mask is None else jnp.asarray(mask, jnp.float32)
  n = jnp.sum(w, axis=-1)
  mean = jnp.sum(w * rewards, axis=-1) / jnp.maximum(n, 1.0)
  var = jnp.sum(w * (rewards - mean[..., None]) ** 2, axis=-1) / jnp.maximum(n - ddof, 1.0)
  return jnp.where(n > ddof, jnp.sqrt(var), 0.0)


def _one_group(rewards, mask, config: AdvantageConfig, estimator: AdvantageFn):
  a = estimator(rewards, mask, config)
  if config.clip is not None:
    a = jnp.clip(a, -config.clip, config.clip)
  if config.boost:
    a = jnp.where(a >= config.boost_threshold, a + config.boost, a)
  return jnp.where(mask, a, 0.0).astype(jnp.float32)


def compute_advantages(rewards, mask=None, config: AdvantageConfig = AdvantageConfig()) -> jax.Array:
  """Advantages of rewards [..., G] (groups on the last axis) -> [..., G] float32. Jitted, `config` static."""
  # The estimator is looked up out here: the jit cache is keyed on the function, not on its name, so an estimator
  # registered again under the same name is used, not the first one's compiled code.
  return _compute_advantages(rewards, mask, config, get_advantage(config.estimator))


@functools.partial(jax.jit, static_argnums=(2, 3))
def _compute_advantages(rewards, mask, config: AdvantageConfig, estimator: AdvantageFn) -> jax.Array:
  rewards = jnp.asarray(rewards, jnp.float32)
  mask = jnp.ones(rewards.shape, bool) if mask is None else jnp.broadcast_to(jnp.asarray(mask, bool), rewards.shape)
  lead, g = rewards.shape[:-1], rewards.shape[-1]
  flat = jax.vmap(lambda r, m: _one_group(r, m, config, estimator))(rewards.reshape(-1, g), mask.reshape(-1, g))
  return flat.reshape(*lead, g)
