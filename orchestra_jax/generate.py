"""A simple jitted greedy / temperature decode loop for `orchestra generate` (one prompt at a time).

The rollout sampler (orchestra_jax.rollout) is the batched, continuous-batching engine; this is the
smallest thing that turns a checkpoint and a prompt into text.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from orchestra_jax.model import qwen3
from orchestra_jax.model.config import ModelConfig


def _bucket(n: int, minimum: int = 16) -> int:
  return max(minimum, 1 << (n - 1).bit_length())


@functools.partial(jax.jit, static_argnames=("config", "max_new_tokens", "max_len"))
def _decode(config: ModelConfig, params, prompt, prompt_len, rng, temperature, stop_ids, *, max_new_tokens: int,
            max_len: int):
  """prompt: [1, P] right-padded; returns (tokens [max_new_tokens], number generated)."""
  p = prompt.shape[1]
  segment = (jnp.arange(p) < prompt_len)[None].astype(jnp.int32)
  cache = qwen3.init_cache(config, 1, max_len)
  logits, cache = qwen3.forward(config, params, prompt, jnp.arange(p)[None], segment, cache)
  last = logits[0, prompt_len - 1]  # [V]

  def pick(logits_v, key):
    sampled = jax.random.categorical(key, logits_v / jnp.maximum(temperature, 1e-6))
    return jnp.where(temperature > 0, sampled, jnp.argmax(logits_v)).astype(jnp.int32)

  def step(carry, i):
    last, cache, done, count = carry
    token = pick(last, jax.random.fold_in(rng, i))
    emitted = jnp.where(done, -1, token)
    count = count + (~done).astype(jnp.int32)
    done = done | jnp.isin(token, stop_ids)
    logits, cache = qwen3.forward(config, params, token[None, None], (prompt_len + i)[None, None], None, cache)
    return (logits[0, 0], cache, done, count), emitted

  init = (last, cache, jnp.array(False), jnp.array(0, jnp.int32))
  (_, _, _, count), tokens = jax.lax.scan(step, init, jnp.arange(max_new_tokens))
  return tokens, count


def generate(config: ModelConfig, params, prompt_ids: list[int], max_new_tokens: int = 64, temperature: float = 0.0,
             stop_ids: tuple[int, ...] = (), seed: int = 0) -> list[int]:
  """Token ids generated after `prompt_ids` (the stop token included when one was hit). Greedy at temperature 0."""
  if not prompt_ids:
    raise ValueError("the prompt is empty")
  p = _bucket(len(prompt_ids))
  max_len = _bucket(p + max_new_tokens)
  if max_len > config.max_position_embeddings:
    raise ValueError(f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the model's "
                     f"max_position_embeddings ({config.max_position_embeddings})")
  prompt = jnp.zeros((1, p), jnp.int32).at[0, :len(prompt_ids)].set(jnp.asarray(prompt_ids, jnp.int32))
  tokens, count = _decode(config, params, prompt, jnp.int32(len(prompt_ids)), jax.random.key(seed),
                          jnp.float32(temperature), jnp.asarray(list(stop_ids) or [-1], jnp.int32),
                          max_new_tokens=max_new_tokens, max_len=max_len)
  return [int(t) for t in tokens[: int(count)]]
