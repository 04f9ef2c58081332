"""The prefill side of the sampler: write tokens into selected cache rows and sample each finished row's next one.

A prefill of a subset of rows runs the full batch with segment id 0 (padding, which writes nowhere) for the
other rows, so their caches and state are untouched. Rows are right-padded to one length (the host picks it
from a few buckets) and positions are per row, so a row may start fresh (start 0) or continue its conversation.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from orchestra_jax.model import qwen3
from orchestra_jax.model.config import ModelConfig
from orchestra_jax.rollout.decode import DecodeState, RowSettings, advance
from orchestra_jax.rollout.sampling import sample_logits
from orchestra_jax.sharding import ShardingConfig


def _lm_head(config: ModelConfig, params, hidden: jax.Array) -> jax.Array:
  """Final-norm hidden [B, D] -> logits [B, V] f32, exactly as `Qwen3.__call__` computes them."""
  head = params["embedding"].T if config.tie_word_embeddings else params["lm_head"]  # [D, V]
  return (hidden @ head.astype(config.jnp_dtype)).astype(jnp.float32)


def prefill_step(config: ModelConfig, sharding: ShardingConfig | None, params, cache: qwen3.KVCache,
                 state: DecodeState, settings: RowSettings, tokens: jax.Array, starts: jax.Array,
                 lengths: jax.Array, rows: jax.Array, final: jax.Array, *, sort_size: int = 0,
                 do_sample: bool = True):
  """Writes `tokens` [B, T] (right-padded; `lengths` [B] real tokens) at positions starts[b] + t of the
  `rows` [B], and for the `final` [B] rows (those whose whole prefill is now written) samples the next token.

  Cache slots >= starts[b] of the written rows are emptied first (a new sequence has start 0: `reset_rows`;
  an extension after `truncate` drops the tail). Other rows: segment id 0, nothing written, state unchanged.
  Returns (cache, state, tokens [B], logprobs [B]); the samples of non-final rows are meaningless.
  """
  b, t = tokens.shape
  max_len = cache.max_len
  stale = rows[:, None] & (jnp.arange(max_len)[None, :] >= starts[:, None])  # [B, S]
  cache = cache.replace(filled=cache.filled & ~stale)
  idx = jnp.arange(t)[None, :]
  segment_ids = (rows[:, None] & (idx < lengths[:, None])).astype(jnp.int32)  # [B, T]
  positions = (starts[:, None] + idx).astype(jnp.int32)  # [B, T]
  hidden, cache = qwen3.forward(config, params, tokens, positions, segment_ids, cache, sharding,
                                return_hidden=True)  # [B, T, D]
  last = hidden[jnp.arange(b), jnp.maximum(lengths - 1, 0)]  # [B, D]
  logits = _lm_head(config, params, last)  # [B, V]
  if sharding is not None:
    logits = sharding.constrain(logits, ("batch", "act_vocab"))
  new_pos = starts + lengths
  tok, lp = sample_logits(logits, settings.seed, new_pos, settings.temperature, settings.top_p, settings.top_k,
                          sort_size=sort_size, do_sample=do_sample)
  state = advance(state, settings, rows & final, tok, new_pos, jnp.ones_like(new_pos), max_len)
  return cache, state, tok, lp
