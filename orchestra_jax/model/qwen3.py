"""Qwen3 decoder in Flax Linen, faithful to transformers' `Qwen3ForCausalLM`.

Read top to bottom: RMSNorm -> rotary embedding -> attention (GQA, q/k norm before RoPE) -> SwiGLU MLP ->
decoder layer -> the stack (scanned over layers) -> embedding and LM head.

Why Linen: parameters are a plain pytree and `apply` is a pure function of (params, inputs), which is what
jit with donated state, orbax and the RL update want; no object graph to split and merge.

Shapes: B batch, T tokens in this call, S cache length, D embed, N query heads, K kv heads, G = N // K,
H head dim, F mlp dim, V vocab, L layers.

Positions and masks. Every token has a position (per row, so left padding and per-row cache offsets work)
and a segment id (0 = padding; distinct ids pack several sequences in one row). A query attends to keys of
its own segment at positions <= its own. With a KV cache, slot s of a row holds the key at position s, and
`KVCache.filled` marks written slots; a forward writes the new tokens' keys at their positions and attends
over the whole cache.
"""

from __future__ import annotations

from typing import Callable

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from orchestra_jax.model.config import ModelConfig
from orchestra_jax.sharding import LogicalNames, ShardingConfig

_MASKED = -1e30  # finite, so fully-padded query rows give no NaN (and no NaN gradients)


@flax.struct.dataclass
class KVCache:
  """Static-shape KV cache. k, v: [L, B, S, K, H]; filled: [B, S] bool (slot s holds position s)."""

  k: jax.Array
  v: jax.Array
  filled: jax.Array

  @property
  def max_len(self) -> int:
    return self.k.shape[2]

  def reset_rows(self, rows: jax.Array) -> "KVCache":
    """Empties the rows where `rows` [B] is True, so a new sequence can start there."""
    return self.replace(filled=jnp.where(rows[:, None], False, self.filled))


KV_CACHE_NAMES = KVCache(k=("layers", "batch", "cache_length", "act_kv_heads", "head_dim"),
                         v=("layers", "batch", "cache_length", "act_kv_heads", "head_dim"),
                         filled=("batch", "cache_length"))


def init_cache(config: ModelConfig, batch: int, max_len: int, dtype=None,
               sharding: ShardingConfig | None = None) -> KVCache:
  """An empty cache; with `sharding`, created directly sharded (no host copy)."""
  shape = (config.num_layers, batch, max_len, config.num_kv_heads, config.head_dim)
  dtype = dtype or config.jnp_dtype

  def make():
    return KVCache(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype), filled=jnp.zeros((batch, max_len), bool))

  if sharding is None:
    return make()
  abstract = jax.eval_shape(make)
  shardings = jax.tree.map(lambda n, a: sharding.sharding(a.shape, n), KV_CACHE_NAMES, abstract,
                           is_leaf=lambda x: isinstance(x, tuple))
  return jax.jit(make, out_shardings=shardings)()


def _remat_policy(name: str):
  return {"full": None, "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}[name]


class RMSNorm(nn.Module):
  """RMSNorm in float32, scaled in the input dtype: HF's order of operations."""

  eps: float
  param_dtype: jnp.dtype
  names: LogicalNames = ("norm",)

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, self.names),
                       (x.shape[-1],), self.param_dtype)
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return (scale * normed.astype(x.dtype)).astype(x.dtype)


def rotary(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
  """Rotary embedding, HF's rotate-half layout. x: [B, T, heads, H]; positions: [B, T]."""
  half = x.shape[-1] // 2
  inv_freq = 1.0 / (theta ** (jnp.arange(0, 2 * half, 2, dtype=jnp.float32) / (2 * half)))  # [H/2]
  angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, H/2]
  angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]  # [B, T, 1, H]
  cos, sin = jnp.cos(angles).astype(x.dtype), jnp.sin(angles).astype(x.dtype)
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  return x * cos + rotated * sin


class Attention(nn.Module):
  config: ModelConfig
  sharding: ShardingConfig | None = None

  def _constrain(self, x, names):
    return x if self.sharding is None else self.sharding.constrain(x, names)

  @nn.compact
  def __call__(self, x: jax.Array, positions: jax.Array, mask: jax.Array,
               layer_cache: tuple[jax.Array, jax.Array] | None, write_slots: jax.Array | None):
    """x: [B, T, D]; mask: [B, T, S] (S = T without cache); layer_cache: (k, v) each [B, S, K, H]."""
    c = self.config
    n, k, h = c.num_heads, c.num_kv_heads, c.head_dim
    init = nn.initializers.normal(0.02)
    dt, pdt = c.jnp_dtype, c.jnp_param_dtype
    wq = self.param("q_proj", nn.with_logical_partitioning(init, ("embed", "q_heads", "head_dim")), (x.shape[-1], n, h), pdt)
    wk = self.param("k_proj", nn.with_logical_partitioning(init, ("embed", "kv_heads", "head_dim")), (x.shape[-1], k, h), pdt)
    wv = self.param("v_proj", nn.with_logical_partitioning(init, ("embed", "kv_heads", "head_dim")), (x.shape[-1], k, h), pdt)
    wo = self.param("o_proj", nn.with_logical_partitioning(init, ("q_heads", "head_dim", "embed")), (n, h, x.shape[-1]), pdt)

    q = jnp.einsum("btd,dnh->btnh", x, wq.astype(dt))  # [B, T, N, H]
    kk = jnp.einsum("btd,dkh->btkh", x, wk.astype(dt))  # [B, T, K, H]
    vv = jnp.einsum("btd,dkh->btkh", x, wv.astype(dt))  # [B, T, K, H]
    q = RMSNorm(c.rms_norm_eps, pdt, ("head_dim",), name="q_norm")(q)
    kk = RMSNorm(c.rms_norm_eps, pdt, ("head_dim",), name="k_norm")(kk)
    q = rotary(q, positions, c.rope_theta)
    kk = rotary(kk, positions, c.rope_theta)
    q = self._constrain(q, ("batch", "length", "act_q_heads", "head_dim"))
    kk = self._constrain(kk, ("batch", "length", "act_kv_heads", "head_dim"))

    new_cache = None
    if layer_cache is not None:
      cache_k, cache_v = layer_cache  # [B, S, K, H]
      rows = jnp.broadcast_to(jnp.arange(x.shape[0])[:, None], write_slots.shape)
      cache_k = cache_k.at[rows, write_slots].set(kk.astype(cache_k.dtype), mode="drop")
      cache_v = cache_v.at[rows, write_slots].set(vv.astype(cache_v.dtype), mode="drop")
      new_cache = (cache_k, cache_v)
      kk, vv = cache_k.astype(dt), cache_v.astype(dt)

    b, t = q.shape[:2]
    q = q.reshape(b, t, k, n // k, h)  # [B, T, K, G, H]
    scores = jnp.einsum("btkgh,bskh->bkgts", q, kk) * (h ** -0.5)  # [B, K, G, T, S]
    scores = jnp.where(mask[:, None, None, :, :], scores.astype(jnp.float32), _MASKED)
    probs = jax.nn.softmax(scores, axis=-1).astype(dt)
    out = jnp.einsum("bkgts,bskh->btkgh", probs, vv).reshape(b, t, n, h)  # [B, T, N, H]
    out = self._constrain(out, ("batch", "length", "act_q_heads", "head_dim"))
    return jnp.einsum("btnh,nhd->btd", out, wo.astype(dt)), new_cache


class MLP(nn.Module):
  """SwiGLU: down(silu(gate(x)) * up(x))."""

  config: ModelConfig
  sharding: ShardingConfig | None = None

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    c = self.config
    init = nn.initializers.normal(0.02)
    dt, pdt = c.jnp_dtype, c.jnp_param_dtype
    d, f = x.shape[-1], c.mlp_dim
    w_gate = self.param("gate_proj", nn.with_logical_partitioning(init, ("embed", "mlp")), (d, f), pdt)
    w_up = self.param("up_proj", nn.with_logical_partitioning(init, ("embed", "mlp")), (d, f), pdt)
    w_down = self.param("down_proj", nn.with_logical_partitioning(init, ("mlp", "embed")), (f, d), pdt)
    hidden = jax.nn.silu(x @ w_gate.astype(dt)) * (x @ w_up.astype(dt))  # [B, T, F]
    if self.sharding is not None:
      hidden = self.sharding.constrain(hidden, ("batch", "length", "act_mlp"))
    return hidden @ w_down.astype(dt)


class DecoderLayer(nn.Module):
  config: ModelConfig
  sharding: ShardingConfig | None = None

  @nn.compact
  def __call__(self, x, positions, mask, write_slots, layer_cache):
    c = self.config
    attn_out, new_cache = Attention(c, self.sharding, name="attn")(
        RMSNorm(c.rms_norm_eps, c.jnp_param_dtype, name="input_norm")(x), positions, mask, layer_cache, write_slots)
    x = x + attn_out
    x = x + MLP(c, self.sharding, name="mlp")(RMSNorm(c.rms_norm_eps, c.jnp_param_dtype, name="post_attn_norm")(x))
    if self.sharding is not None:
      x = self.sharding.constrain(x, ("batch", "length", "act_embed"))
    return x, new_cache


class Qwen3(nn.Module):
  """The causal LM. `__call__` returns (logits [B, T, V] float32, new cache or None)."""

  config: ModelConfig
  sharding: ShardingConfig | None = None

  def _constrain(self, x, names):
    return x if self.sharding is None else self.sharding.constrain(x, names)

  @nn.compact
  def __call__(self, tokens: jax.Array, positions: jax.Array | None = None, segment_ids: jax.Array | None = None,
               cache: KVCache | None = None, return_hidden: bool = False):
    """tokens, positions, segment_ids: [B, T] int32.

    positions default to 0..T-1 (or, with segment_ids, count real tokens per row); segment_ids default to all 1
    (0 marks padding). With `cache`, `positions` are where the tokens go in the cache.
    If `return_hidden`, returns the final-norm hidden states [B, T, D] instead of logits (for chunked losses).
    """
    c = self.config
    b, t = tokens.shape
    if segment_ids is None:
      segment_ids = jnp.ones((b, t), jnp.int32)
    valid = segment_ids != 0  # [B, T]
    if positions is None:
      positions = jnp.maximum(jnp.cumsum(valid, axis=1) - 1, 0).astype(jnp.int32)

    if cache is None:
      same_segment = segment_ids[:, :, None] == segment_ids[:, None, :]
      causal = positions[:, None, :] <= positions[:, :, None]
      mask = same_segment & causal & valid[:, None, :]  # [B, T, T]
      write_slots = None
      layer_caches = None
    else:
      s = cache.max_len
      write_slots = jnp.where(valid, positions, s)  # padding writes nowhere (dropped)
      filled = cache.filled.at[jnp.arange(b)[:, None], write_slots].set(True, mode="drop")
      mask = filled[:, None, :] & (jnp.arange(s)[None, None, :] <= positions[:, :, None])  # [B, T, S]
      layer_caches = (cache.k, cache.v)

    embedding = self.param("embedding", nn.with_logical_partitioning(nn.initializers.normal(0.02), ("vocab", "embed")),
                           (c.vocab_size, c.embed_dim), c.jnp_param_dtype)
    x = jnp.take(embedding, tokens, axis=0).astype(c.jnp_dtype)  # [B, T, D]
    x = self._constrain(x, ("batch", "length", "act_embed"))

    layer_cls = DecoderLayer
    if c.remat != "none":
      layer_cls = nn.remat(DecoderLayer, prevent_cse=False, policy=_remat_policy(c.remat))
    stack = nn.scan(layer_cls, variable_axes={"params": 0}, split_rngs={"params": True},
                    in_axes=(nn.broadcast, nn.broadcast, nn.broadcast, 0), length=c.num_layers,
                    metadata_params={nn.PARTITION_NAME: "layers"})
    x, new_layer_caches = stack(c, self.sharding, name="layers")(x, positions, mask, write_slots, layer_caches)
    x = RMSNorm(c.rms_norm_eps, c.jnp_param_dtype, name="final_norm")(x)

    new_cache = None
    if cache is not None:
      new_cache = KVCache(k=new_layer_caches[0], v=new_layer_caches[1], filled=filled)
    if c.tie_word_embeddings:
      head = embedding.T  # [D, V]
    else:
      head = self.param("lm_head", nn.with_logical_partitioning(nn.initializers.normal(0.02), ("embed", "vocab")),
                        (c.embed_dim, c.vocab_size), c.jnp_param_dtype)
    if return_hidden:
      return x, new_cache
    logits = (x @ head.astype(c.jnp_dtype)).astype(jnp.float32)  # [B, T, V]
    return self._constrain(logits, ("batch", "length", "act_vocab")), new_cache


# --- functional entry points --------------------------------------------------------------------------

def _dummy_tokens():
  return jnp.zeros((1, 1), jnp.int32)


def param_logical_names(config: ModelConfig):
  """Pytree (same structure as params) of logical axis-name tuples."""
  boxed = jax.eval_shape(lambda: Qwen3(config).init(jax.random.key(0), _dummy_tokens())["params"])
  return nn.get_partition_spec(boxed)  # PartitionSpec of logical names per leaf


def abstract_params(config: ModelConfig, sharding: ShardingConfig | None = None):
  """ShapeDtypeStructs of the params (with target shardings when `sharding` is given). No memory used."""
  shapes = jax.eval_shape(lambda: nn.unbox(Qwen3(config).init(jax.random.key(0), _dummy_tokens())["params"]))
  if sharding is None:
    return shapes
  shardings = param_shardings(config, sharding, shapes)
  return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings)


def param_shardings(config: ModelConfig, sharding: ShardingConfig, shapes=None):
  shapes = shapes if shapes is not None else abstract_params(config)
  names = param_logical_names(config)
  return jax.tree.map(lambda n, s: sharding.sharding(s.shape, tuple(n)), names, shapes,
                      is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))


def init_params(config: ModelConfig, rng: jax.Array, sharding: ShardingConfig | None = None):
  """Random params (HF's init: normal(0.02), norms at 1); created sharded when `sharding` is given."""
  def init(key):
    return nn.unbox(Qwen3(config).init(key, _dummy_tokens())["params"])
  if sharding is None:
    return jax.jit(init)(rng)
  return jax.jit(init, out_shardings=param_shardings(config, sharding))(rng)


def forward(config: ModelConfig, params, tokens, positions=None, segment_ids=None, cache=None,
            sharding: ShardingConfig | None = None, return_hidden: bool = False):
  """Pure forward: (logits [B, T, V] float32, new cache or None)."""
  return Qwen3(config, sharding).apply({"params": params}, tokens, positions, segment_ids, cache, return_hidden)


ForwardFn = Callable[..., tuple[jax.Array, KVCache | None]]
