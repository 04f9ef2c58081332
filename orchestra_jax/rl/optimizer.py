"""The optimizer of docs/design.md section 6: AdamW (lr 1e-6 constant, betas 0.9 / 0.999, weight decay 0.01) after a
global-norm gradient clip of 1.0. Weight decay applies to every parameter, as torch's AdamW does in the reference."""

from __future__ import annotations

import dataclasses
import math

import optax


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  learning_rate: float = 1e-6
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-8
  weight_decay: float = 0.01
  grad_clip_norm: float | None = 1.0  # None: no clipping
  warmup_steps: int = 0  # linear warmup from 0, then constant (docs/design.md: constant, no warmup)


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


# --- precision check ---------------------------------------------------------------------------------

# Explicit mantissa bits of the half-precision storage dtypes (bfloat16: 8 exponent / 7 mantissa bits, float16:
# 5 / 10). float32 (23 bits) resolves updates down to ~1e-9 relative, far below any useful learning rate.
_MANTISSA_BITS = {"bfloat16": 7, "float16": 10}
# A typical weight magnitude: the init std of Qwen3's matrices (HF's initializer_range, and ours). Larger weights
# (norm scales ~1) have a coarser grid and lose even bigger updates; smaller ones keep more.
TYPICAL_WEIGHT = 0.02


def precision_problem(param_dtype: str, learning_rate: float) -> str | None:
  """A one-line message when params stored in `param_dtype` cannot absorb AdamW steps of `learning_rate`, else None.

  Why this threshold: AdamW moves each weight by about learning_rate per step (m / sqrt(v) is ~1 for a consistent
  gradient, smaller for a noisy one; weight decay adds only lr * 0.01 * |w|). `apply_updates` adds the update in
  the param dtype and rounds to nearest, so an update smaller than half the spacing (ulp) between representable
  values next to the weight rounds back to the weight itself: the step is silently lost. For bfloat16 at
  |w| = 0.02 the ulp is 2**-13 = 1.2e-4, so any learning rate under 6.1e-5 leaves typical weights unchanged
  (the design's 1e-6 is 60x under). Weights smaller than TYPICAL_WEIGHT still move, which is why it is easy to miss.
  """
  bits = _MANTISSA_BITS.get(param_dtype)
  if bits is None or not learning_rate > 0:
    return None
  ulp = 2.0 ** (math.floor(math.log2(TYPICAL_WEIGHT)) - bits)  # spacing of param_dtype values around 0.02
  if learning_rate >= ulp / 2:
    return None
  return (f"model.param_dtype={param_dtype} cannot hold AdamW updates of train.learning_rate={learning_rate:g}: "
          f"a {param_dtype} weight of magnitude {TYPICAL_WEIGHT} only moves in steps of {ulp:.1e}, so updates "
          f"under {ulp / 2:.1e} round away and most weights never change; set model.param_dtype=float32, which "
          "keeps float32 master weights while matmuls stay in model.dtype")
