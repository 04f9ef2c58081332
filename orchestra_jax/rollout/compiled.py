"""The sampler's jitted steps, compiled once per shape and shared, and the compute-dtype copy of the weights.

`compiled_prefill` / `compiled_decode` are cached per (model, mesh, batch, cache length, static sampling mode), so
every `Sampler` with those shapes reuses one compilation. With a mesh, params, cache and per-row state keep the
layout `sampler_shardings` gives them, and the cache and state are donated, so a step updates them in place.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from orchestra_jax import sharding as sharding_lib
from orchestra_jax.model import qwen3
from orchestra_jax.model.config import ModelConfig
from orchestra_jax.rollout.decode import decode_chunk, host_settings, init_state
from orchestra_jax.rollout.prefill import prefill_step
from orchestra_jax.sharding import ShardingConfig


# --- compute-dtype weights -----------------------------------------------------------------------------

def _cast_at_use(path) -> bool:
  """Whether the model casts this param to `config.dtype` before using it: every weight but RMSNorm scales.

  qwen3.RMSNorm computes `scale * normed` in the promoted dtype (float32 for a float32 scale), so a scale rounded
  to bfloat16 would change the result; the other weights (embedding, projections, LM head) enter only through
  `.astype(config.dtype)`, so rounding them beforehand is the same rounding done earlier. Norm scales are
  (2L + 1) * D + 2L * H values, nothing next to the matrices.
  """
  last = path[-1]
  return getattr(last, "key", None) != "scale"


def compute_params(config: ModelConfig, params):
  """`params` with every float weight the model casts at use converted to `config.dtype` (traceable).

  Integer or bool leaves (none today) and RMSNorm scales keep their dtype; see `_cast_at_use`. With float32
  master weights and bfloat16 compute this halves the bytes decoding reads per step, with bit-identical outputs.
  """
  dt = config.jnp_dtype

  def cast(path, x):
    if jnp.issubdtype(x.dtype, jnp.floating) and _cast_at_use(path):
      return x.astype(dt)
    return x

  return jax.tree_util.tree_map_with_path(cast, params)


@functools.lru_cache(maxsize=16)
def compiled_cast(config: ModelConfig, sharding: ShardingConfig | None):
  fn = functools.partial(compute_params, config)
  if sharding is None:
    return jax.jit(fn)
  # Each cast shard stays on the device of its source shard: no gather, same layout the compiled steps expect.
  shardings = qwen3.param_shardings(config, sharding)
  return jax.jit(fn, in_shardings=(shardings,), out_shardings=shardings)


# --- compiled variants ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class SamplerShardings:
  """Where each of the sampler's arrays lives on the mesh (the in/out shardings of the compiled steps)."""

  params: Any
  cache: Any
  state: Any
  settings: Any
  rows: Any  # [B] and [B, T] arrays: batch over (data, fsdp)
  replicated: Any  # the per-row outputs the host reads: every process must be able to fetch them


@functools.lru_cache(maxsize=16)
def sampler_shardings(config: ModelConfig, sharding: ShardingConfig, batch: int, max_len: int) -> SamplerShardings:
  batch_first = lambda x: sharding.sharding(x.shape, ("batch",) + (None,) * (x.ndim - 1))
  cache_shapes = jax.eval_shape(lambda: qwen3.init_cache(config, batch, max_len))
  state = jax.tree.map(batch_first, init_state(batch))
  settings = jax.tree.map(batch_first, host_settings(batch))
  rows = sharding.sharding((batch,), ("batch",))
  return SamplerShardings(params=qwen3.param_shardings(config, sharding),
                          cache=sharding_lib.tree_shardings(cache_shapes, qwen3.KV_CACHE_NAMES, sharding),
                          state=state, settings=settings, rows=rows,
                          replicated=jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec()))


def _with_flags(fn):
  """fn -> (cache, state, tok, lp) + (state.live, state.reason): the flags as separate outputs, so they can be
  replicated for the host while the state itself stays sharded (and donated) on the batch axis."""
  def wrapped(*args):
    cache, state, tok, lp = fn(*args)
    return cache, state, tok, lp, state.live, state.reason
  return wrapped


@functools.lru_cache(maxsize=64)
def compiled_prefill(config, sharding, batch, max_len, sort_size, do_sample):
  fn = _with_flags(functools.partial(prefill_step, config, sharding, sort_size=sort_size, do_sample=do_sample))
  if sharding is None:
    return jax.jit(fn, donate_argnums=(1, 2))
  s = sampler_shardings(config, sharding, batch, max_len)
  # The [B] outputs the host reads are replicated: in a multi-process run a batch-sharded array is not fully
  # addressable, so no process could device_get it (they are a few bytes per row).
  return jax.jit(fn, donate_argnums=(1, 2),
                 in_shardings=(s.params, s.cache, s.state, s.settings) + (s.rows,) * 5,
                 out_shardings=(s.cache, s.state) + (s.replicated,) * 4)


@functools.lru_cache(maxsize=64)
def compiled_decode(config, sharding, batch, max_len, steps, sort_size, do_sample):
  fn = _with_flags(functools.partial(decode_chunk, config, sharding, steps=steps, sort_size=sort_size,
                                     do_sample=do_sample))
  if sharding is None:
    return jax.jit(fn, donate_argnums=(1, 2))
  s = sampler_shardings(config, sharding, batch, max_len)
  return jax.jit(fn, donate_argnums=(1, 2), in_shardings=(s.params, s.cache, s.state, s.settings),
                 out_shardings=(s.cache, s.state) + (s.replicated,) * 4)
