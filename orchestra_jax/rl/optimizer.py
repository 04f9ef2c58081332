"""The optimizer of DESIGN.md section 6: AdamW (lr 1e-6 constant, betas 0.9 / 0.999, weight decay 0.01) after a
global-norm gradient clip of 1.0. Weight decay applies to every parameter, as torch's AdamW does in the reference."""

from __future__ import annotations

import dataclasses

import optax


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  learning_rate: float = 1e-6
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-8
  weight_decay: float = 0.01
  grad_clip_norm: float | None = 1.0  # None: no clipping
  warmup_steps: int = 0  # linear warmup from 0, then constant (DESIGN: constant, no warmup)


def learning_rate_schedule(config: OptimizerConfig) -> optax.Schedule:
  if config.warmup_steps > 0:
    return optax.linear_schedule(0.0, config.learning_rate, config.warmup_steps)
  return optax.constant_schedule(config.learning_rate)


def make_optimizer(config: OptimizerConfig = OptimizerConfig()) -> optax.GradientTransformation:
  """clip_by_global_norm(grad_clip_norm) -> AdamW."""
  adamw = optax.adamw(learning_rate_schedule(config), b1=config.b1, b2=config.b2, eps=config.eps,
                      weight_decay=config.weight_decay)
  if config.grad_clip_norm is None:
    return adamw
  return optax.chain(optax.clip_by_global_norm(config.grad_clip_norm), adamw)
