"""Per-token log-probs (and entropies) of a sequence under the policy, without materialising [B, T, V] logits.

Shift convention: `logprobs[:, t] = log p(tokens[:, t] | tokens[:, <t])`, computed from the hidden state at t − 1.
So the value sits on the token it scores, aligned with `response_mask` and with the sampler's `old_logprobs`.
Position 0 of each row, and the first token of each packed segment (where segment_ids change) and padding
(segment 0) have no prediction: they get log-prob 0 and entropy 0, and `response_mask` must be 0 there.

The final hidden states [B, T, D] come from `qwen3.forward(..., return_hidden=True)`; the LM head (`embedding.T`
when tied, else `lm_head` [D, V]) is applied over chunks of `chunk_size` positions inside a `lax.scan`, each chunk
under `jax.checkpoint`, so forward and backward hold one [B, chunk, V] float32 block at a time.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from orchestra_jax.model import qwen3
from orchestra_jax.model.config import ModelConfig
from orchestra_jax.sharding import ShardingConfig

DEFAULT_CHUNK_SIZE = 512


def lm_head(config: ModelConfig, params) -> jax.Array:
  """The output projection [D, V]."""
  return params["embedding"].T if config.tie_word_embeddings else params["lm_head"]


def _chunk_stats(h, targets, head, compute_dtype, sharding):
  """h: [B, C, D]; targets: [B, C] -> (log p(target) [B, C], entropy [B, C]), both float32."""
  logits = (h @ head.astype(compute_dtype)).astype(jnp.float32)  # [B, C, V]
  if sharding is not None:
    logits = sharding.constrain(logits, ("batch", "length", "act_vocab"))
  lse = jax.nn.logsumexp(logits, axis=-1)  # [B, C]
  target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]  # [B, C]
  probs = jnp.exp(logits - lse[..., None])  # [B, C, V]
  entropy = lse - jnp.sum(probs * logits, axis=-1)  # [B, C]
  return target_logit - lse, entropy


def logprobs_from_hidden(config: ModelConfig, params, hidden, tokens, segment_ids=None,
                         chunk_size: int = DEFAULT_CHUNK_SIZE, sharding: ShardingConfig | None = None,
                         window: int | None = None) -> tuple[jax.Array, jax.Array]:
  """hidden: [B, T, D] final-norm states; tokens, segment_ids: [B, T] -> (logprobs [B, T], entropy [B, T]) f32.

  `window` (static): only the last `window` tokens are scored, the rest get 0. With responses right-aligned in
  the batch (left padding), the LM head then runs over the responses alone instead of every prompt position.
  """
  b, t, d = hidden.shape
  if segment_ids is None:
    segment_ids = jnp.ones((b, t), jnp.int32)
  if window is not None and window + 1 < t:
    start = t - window - 1  # hidden[:, start] predicts the first scored token
    lp, ent = logprobs_from_hidden(config, params, hidden[:, start:], tokens[:, start:], segment_ids[:, start:],
                                   chunk_size, sharding)
    zeros = jnp.zeros((b, start), jnp.float32)
    return jnp.concatenate([zeros, lp], axis=1), jnp.concatenate([zeros, ent], axis=1)
  head = lm_head(config, params)  # [D, V]
  h = hidden[:, :-1]  # [B, T-1, D]: the state at t-1 predicts token t
  targets = tokens[:, 1:].astype(jnp.int32)  # [B, T-1]
  n = t - 1
  c = max(1, min(chunk_size, n))
  num_chunks = -(-n // c)
  pad = num_chunks * c - n
  h = jnp.pad(h, ((0, 0), (0, pad), (0, 0)))
  targets = jnp.pad(targets, ((0, 0), (0, pad)))
  h = h.reshape(b, num_chunks, c, d).swapaxes(0, 1)  # [n_chunks, B, C, D]
  targets = targets.reshape(b, num_chunks, c).swapaxes(0, 1)  # [n_chunks, B, C]

  stats = jax.checkpoint(lambda hh, tt: _chunk_stats(hh, tt, head, config.jnp_dtype, sharding))

  def body(carry, xs):
    return carry, stats(*xs)

  _, (lp, ent) = jax.lax.scan(body, None, (h, targets))  # each [n_chunks, B, C]
  lp = lp.swapaxes(0, 1).reshape(b, num_chunks * c)[:, :n]  # [B, T-1]
  ent = ent.swapaxes(0, 1).reshape(b, num_chunks * c)[:, :n]
  # A prediction exists where token t continues the segment of token t-1 (and is not padding).
  defined = (segment_ids[:, 1:] == segment_ids[:, :-1]) & (segment_ids[:, 1:] != 0)  # [B, T-1]
  zero = jnp.zeros((b, 1), jnp.float32)
  lp = jnp.concatenate([zero, jnp.where(defined, lp, 0.0)], axis=1)  # [B, T]
  ent = jnp.concatenate([zero, jnp.where(defined, ent, 0.0)], axis=1)
  return lp, ent


def token_logprobs(config: ModelConfig, params, tokens, positions=None, segment_ids=None,
                   chunk_size: int = DEFAULT_CHUNK_SIZE, sharding: ShardingConfig | None = None,
                   window: int | None = None) -> tuple[jax.Array, jax.Array]:
  """Model forward + chunked head: (logprobs [B, T], entropy [B, T]) float32; see the module doc for the shift."""
  hidden, _ = qwen3.forward(config, params, tokens, positions, segment_ids, sharding=sharding, return_hidden=True)
  return logprobs_from_hidden(config, params, hidden, tokens, segment_ids, chunk_size, sharding, window)
