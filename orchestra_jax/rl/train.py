"""One jitted RL update over a (data, fsdp, tensor) mesh, with gradient accumulation, and sharded log-probs.

Batch format: a dict of arrays, one row per turn-sample (docs/design.md section 5: every turn is its own sample, the
rollout's advantage broadcast over its response tokens). B rows, T tokens:

    tokens         [B, T] int32   prompt followed by response, right-padded
    positions      [B, T] int32   position ids (0.. per segment); optional (default: count of real tokens)
    segment_ids    [B, T] int32   0 = padding, ≥ 1 = the sequence a token belongs to; optional (default all 1)
    response_mask  [B, T]         1 on tokens the loss applies to (the policy's own sampled tokens), else 0
    advantages     [B] or [B, T]  float32; [B] is broadcast over the row's tokens
    old_logprobs   [B, T] float32 log-probs of `tokens` under the sampling policy (0 where response_mask is 0)
    ref_logprobs   [B, T] float32 same under the frozen reference; needed only when kl_coef > 0

Shift: the log-prob at t scores tokens[t] given tokens[<t] (it comes from the hidden state at t − 1), so
old_logprobs / ref_logprobs / response_mask all sit on the scored token. response_mask must be 0 at t = 0, at the
first token of each packed segment and on padding (no prediction exists there). `compute_logprobs` returns exactly
this layout, so `batch["old_logprobs"] = compute_logprobs(params, batch)` is valid.

Sharding: every batch array is sharded on its first axis over `batch` -> (data, fsdp); params follow the model's
logical rules; optimizer moments follow their params; scalars are replicated.

Gradient accumulation: with `grad_accum_steps = n`, the B rows are split into n micro-batches (micro-batch i takes
rows i, i + n, i + 2n, …, so each device keeps its rows) and scanned; every micro-batch's loss is normalised by the
totals of the whole mini-batch (token count, sequence count), so the summed gradient equals the one-batch gradient
for every aggregation. B must be a multiple of n.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from orchestra_jax.model import qwen3
from orchestra_jax.model.config import ModelConfig
from orchestra_jax.rl.logprobs import DEFAULT_CHUNK_SIZE, token_logprobs
from orchestra_jax.rl.loss import LossConfig, Totals, batch_totals, rl_loss
from orchestra_jax.rl.optimizer import OptimizerConfig, learning_rate_schedule, make_optimizer
from orchestra_jax.sharding import ShardingConfig

Batch = dict[str, jax.Array]
BATCH_KEYS = ("tokens", "positions", "segment_ids", "response_mask", "advantages", "old_logprobs", "ref_logprobs")
REQUIRED_KEYS = ("tokens", "response_mask", "advantages", "old_logprobs")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  loss: LossConfig = LossConfig()
  optimizer: OptimizerConfig = OptimizerConfig()
  grad_accum_steps: int = 1  # micro-batches per optimizer step
  logprob_chunk_size: int = DEFAULT_CHUNK_SIZE  # positions per LM-head chunk
  logprob_window: int | None = None  # score only the last N tokens (responses right-aligned); None = all
  skip_nonfinite: bool = True  # a step whose loss or gradient norm is not finite leaves params and moments as they were


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # int32 scalar: train_step calls so far
  params: Any
  opt_state: Any


# --- sharding ----------------------------------------------------------------------------------------

def _replicated(sharding: ShardingConfig) -> NamedSharding:
  return NamedSharding(sharding.mesh, PartitionSpec())


def _batch_names(x) -> tuple[str | None, ...]:
  return ("batch",) + ("length",) * (jnp.ndim(x) - 1)


def batch_shardings(batch: Batch, sharding: ShardingConfig) -> dict[str, NamedSharding]:
  return {k: sharding.sharding(np.shape(v), _batch_names(v)) for k, v in batch.items()}


def shard_batch(batch: Batch, sharding: ShardingConfig | None) -> Batch:
  """Places host arrays on the mesh, sharded on the batch axis (a no-op copy to device without sharding)."""
  if sharding is None:
    return {k: jnp.asarray(v) for k, v in batch.items()}
  return jax.device_put({k: jnp.asarray(v) for k, v in batch.items()}, batch_shardings(batch, sharding))


def make_global_batch(rows_fn: Callable[[np.ndarray], dict[str, np.ndarray]], num_rows: int,
                      sharding: ShardingConfig | None) -> Batch:
  """A `num_rows`-row global batch on the mesh, each process supplying only the rows its own devices hold.

  For multi-process runs (`orchestra_jax.distributed`), where no process holds the whole batch.
  `rows_fn(rows)` gets the sorted global row indices this process's devices address and returns the batch arrays
  (host numpy) for exactly those rows, in that order. With a batch axis the mesh splits, a process gets its own
  slice (e.g. rows 0-3 of 8 on process 0 of 2 for a (2, 2, 2) mesh); where the mesh cannot split `num_rows` the
  batch is replicated and every process gets all rows (their values must then agree across processes). In a
  single process (or without `sharding`) `rows_fn` gets every row and this equals `shard_batch`.
  """
  if sharding is None:
    return shard_batch(rows_fn(np.arange(num_rows)), None)
  index_map = sharding.sharding((num_rows,), ("batch",)).addressable_devices_indices_map((num_rows,))
  rows = np.array(sorted({r for index in index_map.values() for r in range(num_rows)[index[0]]}), np.int64)
  local = {k: np.asarray(v) for k, v in rows_fn(rows).items()}
  out = {}
  for k, v in local.items():
    if v.shape[:1] != (len(rows),):
      raise ValueError(f"rows_fn returned {k} with {v.shape[0] if v.ndim else 0} rows; this process holds "
                       f"{len(rows)} rows of the {num_rows}-row batch")
    shape = (num_rows,) + v.shape[1:]
    out[k] = jax.make_array_from_process_local_data(sharding.sharding(shape, _batch_names(v)), v, shape)
  return out


def train_state_shardings(model_config: ModelConfig, train_config: TrainConfig, sharding: ShardingConfig) -> TrainState:
  """NamedShardings of a TrainState: params by the model's rules, optimizer moments like their params."""
  param_sh = qwen3.param_shardings(model_config, sharding)
  tx = make_optimizer(train_config.optimizer)
  opt_shapes = jax.eval_shape(tx.init, qwen3.abstract_params(model_config))
  rep = _replicated(sharding)
  opt_sh = optax.tree_map_params(tx, lambda _, s: s, opt_shapes, param_sh, transform_non_params=lambda _: rep)
  return TrainState(step=rep, params=param_sh, opt_state=opt_sh)


def init_train_state(model_config: ModelConfig, params, train_config: TrainConfig = TrainConfig(),
                     sharding: ShardingConfig | None = None) -> TrainState:
  """A fresh TrainState around `params` (placed on the mesh when `sharding` is given)."""
  tx = make_optimizer(train_config.optimizer)

  def init(p):
    return TrainState(step=jnp.zeros((), jnp.int32), params=p, opt_state=tx.init(p))

  if sharding is None:
    return jax.jit(init)(params)
  shardings = train_state_shardings(model_config, train_config, sharding)
  params = jax.device_put(params, shardings.params)
  return jax.jit(init, out_shardings=shardings)(params)


# --- loss and gradients ------------------------------------------------------------------------------

def _check_batch(batch: Batch, train_config: TrainConfig) -> None:
  missing = [k for k in REQUIRED_KEYS if k not in batch]
  if train_config.loss.kl_coef and "ref_logprobs" not in batch:
    missing.append("ref_logprobs (kl_coef > 0)")
  if missing:
    raise KeyError(f"RL batch lacks {', '.join(missing)}; see orchestra_jax.rl.train for the batch format")
  unknown = sorted(set(batch) - set(BATCH_KEYS))
  if unknown:
    raise KeyError(f"RL batch has unknown keys {unknown}; known: {', '.join(BATCH_KEYS)}")
  b = batch["tokens"].shape[0]
  n = train_config.grad_accum_steps
  if n < 1 or b % n:
    raise ValueError(f"batch of {b} rows cannot be split into grad_accum_steps={n} equal micro-batches")


def make_loss_fn(model_config: ModelConfig, train_config: TrainConfig, sharding: ShardingConfig | None = None
                 ) -> Callable[[Any, Batch, Totals], tuple[jax.Array, dict[str, jax.Array]]]:
  """loss_fn(params, batch, totals) -> (loss share, metric shares); `totals` normalise (see rl.loss)."""
  def loss_fn(params, batch, totals):
    logp, entropy = token_logprobs(model_config, params, batch["tokens"], batch.get("positions"),
                                   batch.get("segment_ids"), train_config.logprob_chunk_size, sharding,
                                   train_config.logprob_window)
    return rl_loss(logp, batch["old_logprobs"], batch["advantages"], batch["response_mask"], train_config.loss,
                   ref_logp=batch.get("ref_logprobs"), entropy=entropy, totals=totals)
  return loss_fn


def _split_micro(x, n: int, sharding: ShardingConfig | None):
  """[B, ...] -> [n, B/n, ...]; micro-batch i holds rows i, i + n, … (rows stay on their devices)."""
  y = x.reshape(x.shape[0] // n, n, *x.shape[1:]).swapaxes(0, 1)
  if sharding is not None:
    y = sharding.constrain(y, (None,) + _batch_names(x))
  return y


def _constrain_batch(batch: Batch, sharding: ShardingConfig | None) -> Batch:
  if sharding is None:
    return batch
  return {k: sharding.constrain(v, _batch_names(v)) for k, v in batch.items()}


def accumulated_grads(model_config: ModelConfig, train_config: TrainConfig, params, batch: Batch,
                      sharding: ShardingConfig | None = None) -> tuple[Any, dict[str, jax.Array]]:
  """(gradient, metrics) of the mini-batch loss, summed over `grad_accum_steps` micro-batches (traceable)."""
  _check_batch(batch, train_config)
  batch = _constrain_batch(batch, sharding)
  totals = batch_totals(jnp.asarray(batch["response_mask"]) > 0)
  n = train_config.grad_accum_steps
  micro = {k: _split_micro(v, n, sharding) for k, v in batch.items()}
  grad_fn = jax.grad(make_loss_fn(model_config, train_config, sharding), has_aux=True)

  def body(acc, mb):
    grads, metrics = grad_fn(params, mb, totals)
    acc_g, acc_m = acc
    acc_g = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), acc_g, grads)
    acc_m = jax.tree.map(jnp.add, acc_m, metrics)
    return (acc_g, acc_m), None

  zeros_g = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
  if sharding is not None:
    zeros_g = jax.lax.with_sharding_constraint(zeros_g, qwen3.param_shardings(model_config, sharding))
  mb0 = jax.tree.map(lambda v: v[0], micro)
  metric_shapes = jax.eval_shape(lambda: grad_fn(params, mb0, totals)[1])
  zeros_m = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), metric_shapes)
  (grads, metrics), _ = jax.lax.scan(body, (zeros_g, zeros_m), micro)
  grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
  metrics = dict(metrics, num_tokens=totals.num_tokens, num_seqs=totals.num_seqs)
  return grads, metrics


def make_grad_fn(model_config: ModelConfig, train_config: TrainConfig = TrainConfig(),
                 sharding: ShardingConfig | None = None) -> Callable[[Any, Batch], tuple[Any, dict]]:
  """Jitted grad_fn(params, batch) -> (gradient, metrics); for tests and diagnostics."""
  return jax.jit(lambda params, batch: accumulated_grads(model_config, train_config, params, batch, sharding))


def make_train_step(model_config: ModelConfig, train_config: TrainConfig = TrainConfig(),
                    sharding: ShardingConfig | None = None) -> Callable[[TrainState, Batch], tuple[TrainState, dict]]:
  """train_step(state, batch) -> (state, metrics), jitted; `state` is donated (do not reuse the one passed in).

  Metrics (float32 scalars): loss, pg_loss, kl_loss, entropy, ratio_mean, approx_kl, clip_frac{,_low,_high,_dual},
  grad_norm (before clipping), learning_rate, num_tokens, num_seqs, skipped (1.0 when a non-finite step was not
  applied). `is_finite(metrics)` tells whether the step was sound.
  """
  tx = make_optimizer(train_config.optimizer)
  schedule = learning_rate_schedule(train_config.optimizer)

  def step_fn(state: TrainState, batch: Batch):
    grads, metrics = accumulated_grads(model_config, train_config, state.params, batch, sharding)
    grad_norm = optax.tree.norm(grads)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(grad_norm)
    if train_config.skip_nonfinite:
      keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)
      params, opt_state = keep(params, state.params), keep(opt_state, state.opt_state)
      skipped = 1.0 - finite.astype(jnp.float32)
    else:
      skipped = jnp.zeros((), jnp.float32)
    metrics = dict(metrics, grad_norm=grad_norm, learning_rate=jnp.asarray(schedule(state.step), jnp.float32),
                   skipped=skipped)
    metrics = {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics

  if sharding is None:
    return jax.jit(step_fn, donate_argnums=0)
  state_sh = train_state_shardings(model_config, train_config, sharding)
  return jax.jit(step_fn, donate_argnums=0, out_shardings=(state_sh, _replicated(sharding)))


def make_compute_logprobs(model_config: ModelConfig, chunk_size: int = DEFAULT_CHUNK_SIZE,
                          sharding: ShardingConfig | None = None, with_entropy: bool = False,
                          window: int | None = None) -> Callable:
  """Jitted compute_logprobs(params, batch) -> logprobs [B, T] float32 (and entropy [B, T] if `with_entropy`).

  Uses batch["tokens"] and the optional batch["positions"], batch["segment_ids"]; output sharded like the batch.
  For old log-probs (current params before the update) and reference log-probs (frozen params).
  """
  def fn(params, batch):
    batch = _constrain_batch({k: batch[k] for k in ("tokens", "positions", "segment_ids") if k in batch}, sharding)
    logp, ent = token_logprobs(model_config, params, batch["tokens"], batch.get("positions"), batch.get("segment_ids"),
                               chunk_size, sharding, window)
    if sharding is not None:
      logp, ent = (sharding.constrain(x, ("batch", "length")) for x in (logp, ent))
    return (logp, ent) if with_entropy else logp

  return jax.jit(fn)


def is_finite(metrics: dict[str, Any]) -> bool:
  """True when every metric is finite and no step was skipped for a non-finite loss or gradient (host side)."""
  values = {k: np.asarray(jax.device_get(v), np.float64) for k, v in metrics.items()}
  if "skipped" in values and values["skipped"].any():
    return False
  return all(np.isfinite(v).all() for v in values.values())
