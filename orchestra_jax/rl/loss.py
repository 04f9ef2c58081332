"""The RL loss of docs/design.md section 6: PPO surrogate with clip-higher and dual clip, KL to a frozen reference.

Per token, with ratio r = exp(logp − logp_old) and advantage A:

    ℓ = max(−A·r, −A·clip(r, 1 − 0.2, 1 + 0.28))
    ℓ = min(ℓ, −A·10)            for A < 0 (dual clip: bounds the loss when r is huge and A negative)

KL penalty per token (registry, coefficient 1e-4), with d = logp − logp_ref:
`mse` 0.5·d² (default, docs/design.md section 6), `k1` d, `k3` exp(−d) + d − 1 (Schulman's unbiased, non-negative estimator).

Aggregation (registry) turns per-token values [B, T] and the mask into a scalar. To make gradient accumulation
exact, an aggregation returns a micro-batch's *share* of the mini-batch value: it divides by normalisers of the
whole mini-batch (`Totals`), so the shares of the micro-batches sum to the value on the whole mini-batch:
- `token_mean` (default): Σ_{b,t} m·ℓ / num_tokens (tokens with mask 1 in the mini-batch).
- `seq_mean_token_sum`: Σ_b (Σ_t m·ℓ) / num_seqs (rows with at least one mask-1 token in the mini-batch).
- `seq_mean_token_mean`: Σ_b (Σ_t m·ℓ / Σ_t m) / num_seqs.
Without `totals`, the normalisers come from the given mask (the plain, single-batch value).

Metrics are token means over the mask (shares as well, so they also sum over micro-batches).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from orchestra_jax.registry import Registry


@dataclasses.dataclass(frozen=True)
class LossConfig:
  clip_low: float = 0.2  # r ≥ 1 − clip_low
  clip_high: float = 0.28  # r ≤ 1 + clip_high ("clip-higher")
  dual_clip: float | None = 10.0  # c of the dual clip for A < 0; None turns it off
  aggregation: str = "token_mean"
  kl_type: str = "mse"
  kl_coef: float = 1e-4  # 0 turns the KL term off (then ref_logprobs are not needed)
  entropy_coef: float = 0.0  # no entropy bonus by default; > 0 adds −coef·entropy to the loss


class Totals(NamedTuple):
  """Normalisers of a whole mini-batch (float32 scalars)."""

  num_tokens: jax.Array  # Σ mask
  num_seqs: jax.Array  # rows with Σ_t mask > 0


def batch_totals(mask) -> Totals:
  mask = jnp.asarray(mask, jnp.float32)
  return Totals(num_tokens=jnp.sum(mask), num_seqs=jnp.sum(jnp.sum(mask, axis=-1) > 0).astype(jnp.float32))


# --- aggregation registry ----------------------------------------------------------------------------

AggregationFn = Callable[[jax.Array, jax.Array, Totals], jax.Array]
AGGREGATIONS: Registry[AggregationFn] = Registry("aggregation")  # categories of orchestra_jax/registry.py
register_aggregation = AGGREGATIONS.register


def _safe(x):
  return jnp.maximum(x, 1.0)


@register_aggregation("token_mean")
def token_mean(values, mask, totals: Totals) -> jax.Array:
  return jnp.sum(jnp.where(mask, values, 0.0)) / _safe(totals.num_tokens)


@register_aggregation("seq_mean_token_sum")
def seq_mean_token_sum(values, mask, totals: Totals) -> jax.Array:
  return jnp.sum(jnp.where(mask, values, 0.0)) / _safe(totals.num_seqs)


@register_aggregation("seq_mean_token_mean")
def seq_mean_token_mean(values, mask, totals: Totals) -> jax.Array:
  per_seq = jnp.sum(jnp.where(mask, values, 0.0), axis=-1) / _safe(jnp.sum(mask, axis=-1))  # [B]
  return jnp.sum(per_seq) / _safe(totals.num_seqs)


def aggregate(name: str, values, mask, totals: Totals | None = None) -> jax.Array:
  """Scalar from per-token `values` [B, T] over `mask` [B, T] by the registered aggregation `name`."""
  mask = jnp.asarray(mask, bool)
  return AGGREGATIONS.get(name)(values, mask, batch_totals(mask) if totals is None else totals)


# --- KL registry -------------------------------------------------------------------------------------

KLFn = Callable[[jax.Array, jax.Array], jax.Array]
KL_ESTIMATORS: Registry[KLFn] = Registry("kl")
register_kl = KL_ESTIMATORS.register


@register_kl("mse")
def kl_mse(logp, ref_logp):
  return 0.5 * (logp - ref_logp) ** 2


@register_kl("k1")
def kl_k1(logp, ref_logp):
  return logp - ref_logp


@register_kl("k3")
def kl_k3(logp, ref_logp):
  d = ref_logp - logp
  return jnp.exp(d) - d - 1.0


def kl_penalty(name: str, logp, ref_logp) -> jax.Array:
  return KL_ESTIMATORS.get(name)(logp, ref_logp)


# --- PPO ---------------------------------------------------------------------------------------------

def ppo_token_loss(logp, old_logp, advantages, clip_low: float = 0.2, clip_high: float = 0.28,
                   dual_clip: float | None = 10.0) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Per-token PPO loss [B, T] and per-token indicators (float32 [B, T]) of which clip is active.

  Indicators: `clip_low` (A < 0, r < 1 − clip_low: the clipped term wins, no gradient), `clip_high` (A > 0,
  r > 1 + clip_high), `clip_dual` (A < 0, dual clip active: −A·r > −A·c, i.e. r > c), `ratio` r.
  """
  ratio = jnp.exp(logp - old_logp)
  clipped = jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
  loss = jnp.maximum(-advantages * ratio, -advantages * clipped)
  neg = advantages < 0
  dual = jnp.zeros_like(loss, bool)
  if dual_clip is not None:
    bound = -advantages * dual_clip
    dual = neg & (loss > bound)
    loss = jnp.where(neg, jnp.minimum(loss, bound), loss)
  info = {
      "clip_low": (neg & (ratio < 1.0 - clip_low)).astype(jnp.float32),
      "clip_high": ((advantages > 0) & (ratio > 1.0 + clip_high)).astype(jnp.float32),
      "clip_dual": dual.astype(jnp.float32),
      "ratio": ratio,
  }
  return loss, info


def rl_loss(logp, old_logp, advantages, response_mask, config: LossConfig = LossConfig(), ref_logp=None,
            entropy=None, totals: Totals | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
  """The scalar loss (a micro-batch's share when `totals` are the mini-batch's) and metrics.

  logp, old_logp, ref_logp, entropy: [B, T] float32; advantages: [B] (broadcast over tokens) or [B, T];
  response_mask: [B, T] (1 where the loss applies). Values at mask-0 tokens are replaced before any arithmetic, so
  -inf / NaN there (e.g. padding log-probs) never reach the loss or its gradient.
  Metrics: pg_loss, kl_loss, entropy, loss, ratio_mean, approx_kl (k3 of old vs new), clip_frac_{low,high,dual},
  clip_frac (low + high), all masked token means except the losses (aggregated as the loss is).
  """
  mask = jnp.asarray(response_mask) > 0
  totals = batch_totals(mask) if totals is None else totals
  advantages = jnp.asarray(advantages, jnp.float32)
  if advantages.ndim == 1:
    advantages = advantages[:, None]
  advantages = jnp.where(mask, jnp.broadcast_to(advantages, mask.shape), 0.0)
  logp_m = jnp.where(mask, logp, 0.0)
  old_m = jnp.where(mask, old_logp, 0.0)

  per_token, info = ppo_token_loss(logp_m, old_m, advantages, config.clip_low, config.clip_high, config.dual_clip)
  agg = lambda v: aggregate(config.aggregation, v, mask, totals)
  tok = lambda v: jnp.sum(jnp.where(mask, v, 0.0)) / jnp.maximum(totals.num_tokens, 1.0)

  pg_loss = agg(per_token)
  loss = pg_loss
  metrics = {"pg_loss": pg_loss}
  if config.kl_coef:
    if ref_logp is None:
      raise ValueError("kl_coef > 0 needs ref_logprobs; set kl_coef=0 to train without a reference")
    kl = agg(kl_penalty(config.kl_type, logp_m, jnp.where(mask, ref_logp, 0.0)))
    loss = loss + config.kl_coef * kl
    metrics["kl_loss"] = kl
  if entropy is not None:
    metrics["entropy"] = tok(jax.lax.stop_gradient(entropy))
    if config.entropy_coef:
      loss = loss - config.entropy_coef * agg(entropy)
  ratio = jax.lax.stop_gradient(info["ratio"])
  log_ratio = jax.lax.stop_gradient(logp_m - old_m)
  metrics.update(
      loss=loss,
      ratio_mean=tok(ratio),
      approx_kl=tok(jnp.exp(log_ratio) - 1.0 - log_ratio),
      clip_frac_low=tok(info["clip_low"]),
      clip_frac_high=tok(info["clip_high"]),
      clip_frac_dual=tok(info["clip_dual"]),
      clip_frac=tok(info["clip_low"] + info["clip_high"]),
  )
  return loss, metrics
