"""Batched autoregressive sampling over a static-shape KV cache, with continuous batching.

Two layers:

* Pure jitted math. `sample_logits` (greedy / temperature / top-k / top-p, per-row settings), `prefill_step`
  (write tokens into selected cache rows at per-row offsets and sample each finished row's next token) and
  `decode_chunk` (up to k decode steps in one `lax.while_loop`). Their compiled variants are cached per
  (model, mesh, batch, cache length, static sampling mode) and shared by every `Sampler` with those shapes.
* `Sampler`, the host state. It owns the cache, the per-row device state and a host mirror of every row's
  conversation, and offers a slot API (`start`, `extend`, `truncate`, `step`, `release`) with `generate` built
  on top of it.

Rows and conversations. The cache has `batch_size` rows ("slots"). A slot holds one conversation: the prompt,
the tokens sampled in each turn, and any tokens the caller appended between turns (tool responses, the next
chat-template header). Slot s of a cache row holds the key/value of conversation position s. While a row
decodes, its last sampled token is *pending*: sampled but not yet written (the next decode step writes it
while sampling the one after). So after a turn finishes, the cache holds every conversation token but the
last, and `extend` writes [pending token] + new tokens in one prefill before sampling again; the caller never
has to know about the pending token.

Prefill of a subset of rows runs the full batch with segment id 0 (padding, which writes nowhere) for the
other rows, so their caches and state are untouched. Prefills are right-padded to a few bucketed lengths; one
longer than the largest bucket is written in pieces of that size. Positions are per row.

PRNG. Each sequence has a 32-bit seed; the token sampled at conversation position p uses
`fold_in(key(seed), p)`. A row's samples therefore depend only on its seed and its tokens: not on the slot, the
batch, the other rows, or whether the conversation was prefilled at once or built turn by turn with `extend`.

Log-probabilities. Each sampled token comes with its log-probability under the distribution it was drawn from:
`log_softmax(filtered logits / temperature)`, where filtering is top-k then top-p (HF's order). For greedy rows
(temperature 0) it is `log_softmax(raw logits)` at the argmax token (temperature 1, no filtering).

Finish reasons: "stop" (sampled a stop id, e.g. `<|im_end|>`), "tool_call" (sampled a tool-call id,
`</tool_call>`), "length" (max_new_tokens reached, or the cache row is full). The stop token is included in
the returned tokens.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Any, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np

from orchestra_jax import sharding as sharding_lib
from orchestra_jax.model import qwen3
from orchestra_jax.model.config import ModelConfig
from orchestra_jax.sharding import ShardingConfig

IM_END = 151645  # <|im_end|>
TOOL_CALL_END = 151658  # </tool_call>
MAX_STOP_IDS = 8  # stop ids per row (padded with -1); a fixed size so changing them never recompiles

REASON_NONE, REASON_STOP, REASON_TOOL_CALL, REASON_LENGTH = 0, 1, 2, 3
REASON_NAMES = {REASON_STOP: "stop", REASON_TOOL_CALL: "tool_call", REASON_LENGTH: "length"}


# --- host-side value types ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """How one sequence (or one turn of it) is sampled.

  temperature 0 is greedy. top_k 0 and top_p 1 disable those filters. stop_ids None uses the sampler's
  defaults; ids that are also in the sampler's `tool_call_ids` finish with "tool_call", others with "stop".
  """

  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  max_new_tokens: int = 256
  stop_ids: tuple[int, ...] | None = None

  def __post_init__(self):
    if not self.temperature >= 0:
      raise ValueError(f"temperature must be >= 0, got {self.temperature}")
    if not 0 < self.top_p <= 1:
      raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
    if self.top_k < 0:
      raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
    if self.max_new_tokens < 1:
      raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
    if self.stop_ids is not None and len(self.stop_ids) > MAX_STOP_IDS:
      raise ValueError(f"at most {MAX_STOP_IDS} stop ids, got {len(self.stop_ids)}")


@dataclasses.dataclass
class SampleResult:
  """One generated completion: the sampled ids (stop token included), their log-probs, and why it ended."""

  tokens: list[int]
  logprobs: list[float]
  finish_reason: str  # "stop" | "tool_call" | "length"


@dataclasses.dataclass
class TurnResult(SampleResult):
  """A finished turn from `Sampler.step`: a `SampleResult` plus the slot it ran in and the caller's tag."""

  slot: int = -1
  tag: Any = None


# --- device state --------------------------------------------------------------------------------------

@flax.struct.dataclass
class DecodeState:
  """Per-row decoding state, all [B]."""

  token: jax.Array  # int32: last sampled token (pending: not yet in the cache)
  position: jax.Array  # int32: the pending token's conversation position (= tokens in the cache)
  num_new: jax.Array  # int32: tokens sampled in this turn
  live: jax.Array  # bool: still decoding
  reason: jax.Array  # int32: REASON_* once finished


@flax.struct.dataclass
class RowSettings:
  """Per-row sampling settings: [B] except stop ids [B, MAX_STOP_IDS]."""

  seed: jax.Array  # uint32
  temperature: jax.Array  # float32; 0 = greedy
  top_p: jax.Array  # float32; 1 = off
  top_k: jax.Array  # int32; 0 = off
  max_new: jax.Array  # int32
  stop_ids: jax.Array  # int32, padded with -1
  stop_codes: jax.Array  # int32 REASON_STOP / REASON_TOOL_CALL per stop id


def init_state(batch: int) -> DecodeState:
  z = np.zeros((batch,), np.int32)
  return DecodeState(token=z, position=z, num_new=z, live=np.zeros((batch,), bool), reason=z)


# --- pure math -----------------------------------------------------------------------------------------

def _take(x: jax.Array, idx: jax.Array) -> jax.Array:
  """x [B, V], idx [B] -> x[b, idx[b]] [B]."""
  return jnp.take_along_axis(x, idx[:, None], axis=-1)[:, 0]


def filter_top_k_top_p(scaled: jax.Array, top_k: jax.Array, top_p: jax.Array, sort_size: int) -> jax.Array:
  """Sets logits outside each row's top-k, then top-p (of the top-k renormalised), to -inf.

  scaled [B, V] (already divided by temperature); top_k [B] (0 = off), top_p [B] (1 = off). `sort_size`
  (static) is how many of the largest logits are sorted: >= every row's top_k, or V when some row uses top-p
  without top-k. Ties with the last kept logit are kept (as in HF).
  """
  vals, _ = jax.lax.top_k(scaled, sort_size)  # [B, Ks] descending
  ranks = jnp.arange(sort_size)
  k_eff = jnp.where(top_k > 0, jnp.minimum(top_k, sort_size), sort_size)  # [B]
  keep = ranks[None, :] < k_eff[:, None]  # [B, Ks]
  probs = jax.nn.softmax(jnp.where(keep, vals, -jnp.inf), axis=-1)
  mass_before = jnp.cumsum(probs, axis=-1) - probs
  keep = keep & (mass_before < top_p[:, None])  # a prefix; always keeps the top token
  threshold = _take(vals, jnp.sum(keep, axis=-1) - 1)  # [B] smallest kept logit
  threshold = jnp.where((top_k > 0) | (top_p < 1), threshold, -jnp.inf)
  return jnp.where(scaled >= threshold[:, None], scaled, -jnp.inf)


def inverse_cdf_sample(probs: jax.Array, uniform: jax.Array, block: int = 1024) -> jax.Array:
  """Exact categorical sampling from probs [B, V] (need not be normalised) with one uniform per row [B] -> [B] int32.

  Why not `jax.random.categorical`: its Gumbel trick draws V random numbers per row, which on CPU costs ~0.4 s per
  step for 64 rows of Qwen3's 151936-token vocabulary (most of decoding). The inverse CDF needs one draw per row;
  the cumulative sum is done in two levels (over blocks, then inside the chosen block) to keep scans short.
  """
  b, v = probs.shape
  nb = -(-v // block)
  blocks = jnp.pad(probs, ((0, 0), (0, nb * block - v))).reshape(b, nb, block)  # [B, nb, block]
  block_cdf = jnp.cumsum(blocks.sum(-1), axis=-1)  # [B, nb]
  target = uniform * block_cdf[:, -1]  # [B]
  blk = jnp.minimum(jnp.sum(block_cdf < target[:, None], axis=-1), nb - 1)  # [B]
  before = jnp.where(blk > 0, _take(block_cdf, jnp.maximum(blk - 1, 0)), 0.0)  # [B] mass of earlier blocks
  inner = jnp.take_along_axis(blocks, blk[:, None, None], axis=1)[:, 0]  # [B, block]
  inner_cdf = before[:, None] + jnp.cumsum(inner, axis=-1)
  idx = jnp.minimum(jnp.sum(inner_cdf < target[:, None], axis=-1), block - 1)
  # Float rounding can land on a zero-probability slot at a block edge; fall back to the row's argmax then.
  token = jnp.minimum(blk * block + idx, v - 1).astype(jnp.int32)
  return jnp.where(_take(probs, token) > 0, token, jnp.argmax(probs, axis=-1).astype(jnp.int32))


def sample_logits(logits: jax.Array, seeds: jax.Array, token_pos: jax.Array, temperature: jax.Array,
                  top_p: jax.Array, top_k: jax.Array, *, sort_size: int = 0, do_sample: bool = True
                  ) -> tuple[jax.Array, jax.Array]:
  """logits [B, V] f32 -> (tokens [B] int32, logprobs [B] f32).

  Row b draws with key `fold_in(key(seeds[b]), token_pos[b])`; token_pos is the conversation position the new
  token will take. Greedy rows (temperature 0) take the argmax with log_softmax(raw logits) as log-prob;
  sampled rows get log_softmax of the filtered, temperature-scaled logits. With `do_sample` False (static)
  every row is greedy and no random numbers are drawn.
  """
  greedy_tok = jnp.argmax(logits, axis=-1).astype(jnp.int32)
  if not do_sample:
    return greedy_tok, _take(logits, greedy_tok) - jax.nn.logsumexp(logits, axis=-1)
  # Each pass over [B, V] costs tens of ms on CPU at Qwen3's vocabulary (exp above all), so exp runs once: the
  # unnormalised weights serve both the log-normaliser and the inverse-CDF draw.
  greedy = temperature <= 0
  scaled = logits / jnp.where(greedy, 1.0, temperature)[:, None]  # greedy rows: the raw logits
  if sort_size:
    scaled = filter_top_k_top_p(scaled, top_k, top_p, sort_size)
    scaled = jnp.where(greedy[:, None], logits, scaled)  # greedy log-probs are of the unfiltered logits
  peak = jnp.max(scaled, axis=-1, keepdims=True)  # [B, 1]
  weights = jnp.exp(scaled - peak)  # [B, V]
  lse = peak[:, 0] + jnp.log(jnp.sum(weights, axis=-1))  # [B]
  keys = jax.vmap(lambda s, p: jax.random.fold_in(jax.random.key(s), p))(seeds, token_pos)
  uniform = jax.vmap(lambda k: jax.random.uniform(k, minval=1e-7, maxval=1.0))(keys)  # [B]
  token = jnp.where(greedy, greedy_tok, inverse_cdf_sample(weights, uniform))
  return token, _take(scaled, token) - lse


def _lm_head(config: ModelConfig, params, hidden: jax.Array) -> jax.Array:
  """Final-norm hidden [B, D] -> logits [B, V] f32, exactly as `Qwen3.__call__` computes them."""
  head = params["embedding"].T if config.tie_word_embeddings else params["lm_head"]  # [D, V]
  return (hidden @ head.astype(config.jnp_dtype)).astype(jnp.float32)


def _advance(state: DecodeState, settings: RowSettings, rows: jax.Array, token: jax.Array, position: jax.Array,
             num_new: jax.Array, max_len: int) -> DecodeState:
  """Records a newly sampled `token` [B] at `position` [B] for `rows` [B] and decides whether each finished."""
  hit = token[:, None] == settings.stop_ids  # [B, M]
  stop_code = jnp.max(jnp.where(hit, settings.stop_codes, REASON_NONE), axis=-1)
  out_of_room = (num_new >= settings.max_new) | (position >= max_len)  # the pending token can't be written
  reason = jnp.where(stop_code > 0, stop_code, jnp.where(out_of_room, REASON_LENGTH, REASON_NONE))
  pick = lambda new, old: jnp.where(rows, new, old)
  return DecodeState(token=pick(token, state.token), position=pick(position, state.position),
                     num_new=pick(num_new, state.num_new), live=pick(reason == REASON_NONE, state.live),
                     reason=pick(reason, state.reason))


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
  state = _advance(state, settings, rows & final, tok, new_pos, jnp.ones_like(new_pos), max_len)
  return cache, state, tok, lp


def decode_chunk(config: ModelConfig, sharding: ShardingConfig | None, params, cache: qwen3.KVCache,
                 state: DecodeState, settings: RowSettings, *, steps: int, sort_size: int = 0,
                 do_sample: bool = True):
  """Up to `steps` decode steps for the live rows, stopping early once no row is live.

  Each step writes every live row's pending token into its cache slot and samples the next. Returns
  (cache, state, tokens [B, steps], logprobs [B, steps]); entries a row did not produce hold token -1.
  """
  b = state.token.shape[0]
  out_tok = jnp.full((b, steps), -1, jnp.int32)
  out_lp = jnp.zeros((b, steps), jnp.float32)

  def cond(carry):
    i, _, st, _, _ = carry
    return (i < steps) & jnp.any(st.live)

  def body(carry):
    i, cache, st, out_tok, out_lp = carry
    logits, cache = qwen3.forward(config, params, st.token[:, None], st.position[:, None],
                                  st.live[:, None].astype(jnp.int32), cache, sharding)  # [B, 1, V]
    new_pos = st.position + 1
    tok, lp = sample_logits(logits[:, 0], settings.seed, new_pos, settings.temperature, settings.top_p,
                            settings.top_k, sort_size=sort_size, do_sample=do_sample)
    emitted = st.live
    st = _advance(st, settings, emitted, tok, new_pos, st.num_new + 1, cache.max_len)
    out_tok = out_tok.at[:, i].set(jnp.where(emitted, tok, -1))
    out_lp = out_lp.at[:, i].set(jnp.where(emitted, lp, 0.0))
    return i + 1, cache, st, out_tok, out_lp

  _, cache, state, out_tok, out_lp = jax.lax.while_loop(cond, body, (0, cache, state, out_tok, out_lp))
  return cache, state, out_tok, out_lp


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
def _compiled_cast(config: ModelConfig, sharding: ShardingConfig | None):
  fn = functools.partial(compute_params, config)
  if sharding is None:
    return jax.jit(fn)
  # Each cast shard stays on the device of its source shard: no gather, same layout the compiled steps expect.
  shardings = qwen3.param_shardings(config, sharding)
  return jax.jit(fn, in_shardings=(shardings,), out_shardings=shardings)


# --- compiled variants ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Shardings:
  params: Any
  cache: Any
  state: Any
  settings: Any
  rows: Any  # [B] and [B, T] arrays: batch over (data, fsdp)
  replicated: Any  # the per-row outputs the host reads: every process must be able to fetch them


@functools.lru_cache(maxsize=16)
def _shardings(config: ModelConfig, sharding: ShardingConfig, batch: int, max_len: int) -> _Shardings:
  batch_first = lambda x: sharding.sharding(x.shape, ("batch",) + (None,) * (x.ndim - 1))
  cache_shapes = jax.eval_shape(lambda: qwen3.init_cache(config, batch, max_len))
  state = jax.tree.map(batch_first, init_state(batch))
  settings = jax.tree.map(batch_first, _host_settings(batch))
  rows = sharding.sharding((batch,), ("batch",))
  return _Shardings(params=qwen3.param_shardings(config, sharding),
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
def _compiled_prefill(config, sharding, batch, max_len, sort_size, do_sample):
  fn = _with_flags(functools.partial(prefill_step, config, sharding, sort_size=sort_size, do_sample=do_sample))
  if sharding is None:
    return jax.jit(fn, donate_argnums=(1, 2))
  s = _shardings(config, sharding, batch, max_len)
  # The [B] outputs the host reads are replicated: in a multi-process run a batch-sharded array is not fully
  # addressable, so no process could device_get it (they are a few bytes per row).
  return jax.jit(fn, donate_argnums=(1, 2),
                 in_shardings=(s.params, s.cache, s.state, s.settings) + (s.rows,) * 5,
                 out_shardings=(s.cache, s.state) + (s.replicated,) * 4)


@functools.lru_cache(maxsize=64)
def _compiled_decode(config, sharding, batch, max_len, steps, sort_size, do_sample):
  fn = _with_flags(functools.partial(decode_chunk, config, sharding, steps=steps, sort_size=sort_size,
                                     do_sample=do_sample))
  if sharding is None:
    return jax.jit(fn, donate_argnums=(1, 2))
  s = _shardings(config, sharding, batch, max_len)
  return jax.jit(fn, donate_argnums=(1, 2), in_shardings=(s.params, s.cache, s.state, s.settings),
                 out_shardings=(s.cache, s.state) + (s.replicated,) * 4)


def _host_settings(batch: int) -> RowSettings:
  return RowSettings(seed=np.zeros((batch,), np.uint32), temperature=np.zeros((batch,), np.float32),
                     top_p=np.ones((batch,), np.float32), top_k=np.zeros((batch,), np.int32),
                     max_new=np.ones((batch,), np.int32), stop_ids=np.full((batch, MAX_STOP_IDS), -1, np.int32),
                     stop_codes=np.zeros((batch, MAX_STOP_IDS), np.int32))


def default_buckets(max_len: int, minimum: int = 16, maximum: int = 1024) -> tuple[int, ...]:
  """Powers of two from `minimum` up to min(max_len, maximum), plus that cap if it is not a power of two."""
  cap = max(1, min(max_len, maximum))
  out, b = [], minimum
  while b < cap:
    out.append(b)
    b *= 2
  out.append(cap)
  return tuple(out)


# --- host state ----------------------------------------------------------------------------------------

FREE, STAGED, RUNNING, FINISHED = "free", "staged", "running", "finished"


@dataclasses.dataclass
class _Row:
  """Host mirror of one slot."""

  state: str = FREE
  tag: Any = None
  tokens: list[int] = dataclasses.field(default_factory=list)  # the whole conversation so far
  cached: int = 0  # leading conversation tokens whose K/V are in the cache
  sampling: SamplingParams | None = None
  turn_tokens: list[int] = dataclasses.field(default_factory=list)
  turn_logprobs: list[float] = dataclasses.field(default_factory=list)
  reason: int = REASON_NONE


class Sampler:
  """Continuous-batching sampler over `batch_size` cache rows of `max_len` positions.

  `generate` is the one-call API. The slot API is for callers that keep conversations alive across turns
  (the multi-turn agent loop):

      s = Sampler(config, params, max_len=4096, batch_size=16)
      s.start(slot, prompt_ids, SamplingParams(...), seed=7, tag=conv_id)   # stage a new conversation
      for turn in s.step(): ...        # run staged prefills + one decode chunk; returns finished turns
      s.extend(turn.slot, tool_response_ids)   # append tokens after the finished turn, decode again
      s.release(turn.slot)             # or free the slot for another conversation

  A slot goes free -> staged (`start`/`extend`) -> running (after its prefill in `step`) -> finished (its
  turn is returned by `step`) -> staged again (`extend`) or free (`release`). Only finished slots can be
  extended or truncated; `start` may replace any non-running slot.
  """

  def __init__(self, config: ModelConfig, params, max_len: int, batch_size: int,
               sharding: ShardingConfig | None = None, chunk_steps: int = 8,
               prompt_buckets: Sequence[int] | None = None, stop_ids: Sequence[int] | None = None,
               tool_call_ids: Sequence[int] = (TOOL_CALL_END,)):
    """`params` as from `checkpoint.load_model`; with `sharding` they are placed on the mesh (no-op if
    already there). `prompt_buckets`: the prefill lengths compiled (default `default_buckets(max_len)`);
    longer prefills go in pieces of the largest. `stop_ids` default: <|im_end|>, </tool_call> and the config's
    eos. Ids in `tool_call_ids` finish a turn with reason "tool_call"."""
    self.config = config
    self.max_len = int(max_len)
    self.batch_size = int(batch_size)
    self.sharding = sharding
    self.chunk_steps = int(chunk_steps)
    self.buckets = tuple(sorted(set(prompt_buckets or default_buckets(self.max_len))))
    if stop_ids is None:
      stop_ids = [IM_END, TOOL_CALL_END] + ([config.eos_token_id] if config.eos_token_id is not None else [])
    self.stop_ids = tuple(dict.fromkeys(int(i) for i in stop_ids))
    self.tool_call_ids = frozenset(int(i) for i in tool_call_ids)
    if len(self.stop_ids) > MAX_STOP_IDS:
      raise ValueError(f"at most {MAX_STOP_IDS} stop ids, got {len(self.stop_ids)}")
    self._shard = None if sharding is None else _shardings(config, sharding, self.batch_size, self.max_len)
    self.set_params(params)
    self._cache = qwen3.init_cache(config, self.batch_size, self.max_len, sharding=sharding)
    self._state = self._put(init_state(self.batch_size), "state")
    self._settings_np = _host_settings(self.batch_size)
    self._settings = None  # device copy, refreshed when the host copy changes
    self._rows = [_Row() for _ in range(self.batch_size)]
    self._staged: collections.OrderedDict[int, list[int]] = collections.OrderedDict()  # slot -> tokens to write

  # --- setup ---------------------------------------------------------------------------------------
  def set_params(self, params) -> None:
    """Swaps in new weights (e.g. after an RL update). Cache rows are kept as they are: keys/values already
    written were computed with the old weights (release or `start` the slots for fully on-policy samples).

    With float32 master weights (config.param_dtype != config.dtype) the sampler holds its own copy cast by
    `compute_params` (sharded like the params), so decoding reads half the bytes; its outputs are bit-identical
    to decoding with `params` themselves. Otherwise it holds `params` as given (no copy)."""
    if self._shard is not None:
      params = jax.device_put(params, self._shard.params)
    if self.config.param_dtype != self.config.dtype:
      params = _compiled_cast(self.config, self.sharding)(params)
    self.params = params

  def _put(self, tree, kind: str):
    if self._shard is None:
      return jax.tree.map(jnp.asarray, tree)
    return jax.device_put(tree, getattr(self._shard, kind))

  # --- slot API ------------------------------------------------------------------------------------
  def free_slots(self) -> list[int]:
    return [i for i, r in enumerate(self._rows) if r.state == FREE]

  def slot_state(self, slot: int) -> str:
    """One of "free", "staged", "running", "finished"."""
    return self._rows[slot].state

  def conversation(self, slot: int) -> list[int]:
    """Every token of the slot's conversation so far: prompt, sampled turns and extensions."""
    return list(self._rows[slot].tokens)

  def start(self, slot: int, prompt: Sequence[int], sampling: SamplingParams | None = None, seed: int = 0,
            tag: Any = None) -> None:
    """Stages a new conversation in `slot` (any state but running); its prefill runs in the next `step`.

    The slot's previous cache contents are dropped. The sequence's PRNG key is `key(seed)` (mod 2**32).
    """
    row = self._rows[slot]
    if row.state == RUNNING:
      raise RuntimeError(f"slot {slot} is running; wait for its turn to finish")
    prompt = self._check_tokens(prompt, start=0)
    self._rows[slot] = _Row(state=STAGED, tag=tag, tokens=list(prompt), cached=0)
    self._set_row_settings(slot, sampling or SamplingParams(), seed)
    self._staged[slot] = list(prompt)

  def extend(self, slot: int, tokens: Sequence[int], sampling: SamplingParams | None = None,
             seed: int | None = None) -> None:
    """Appends `tokens` to a finished slot's conversation and stages the next turn.

    The conversation becomes conversation(slot) + tokens (the last turn's final sampled token, e.g.
    </tool_call>, stays in it: it is written to the cache together with `tokens`). Only the new tokens are
    prefilled, then decoding continues with `sampling` (default: the previous turn's) for up to its
    max_new_tokens more tokens. The seed is kept unless given; since keys are folded with the conversation
    position, the result equals `start` on the whole concatenation with the same seed. `tokens` may be empty
    (continue decoding right after the last sampled token, e.g. after a "length" finish).
    """
    row = self._rows[slot]
    if row.state != FINISHED:
      raise RuntimeError(f"slot {slot} is {row.state}; only a finished slot can be extended")
    tokens = [int(t) for t in tokens]
    to_write = row.tokens[row.cached:] + tokens
    if not to_write:
      raise ValueError(f"slot {slot}: nothing to prefill (empty extension right after truncate)")
    self._check_tokens(to_write, start=row.cached)
    row.tokens.extend(tokens)
    row.state = STAGED
    row.turn_tokens, row.turn_logprobs, row.reason = [], [], REASON_NONE
    if sampling is not None:
      row.sampling = sampling
    self._set_row_settings(slot, row.sampling, int(self._settings_np.seed[slot]) if seed is None else seed)
    self._staged[slot] = to_write

  def truncate(self, slot: int, length: int) -> None:
    """Cuts a finished slot's conversation to its first `length` tokens (e.g. to drop a turn before
    re-sampling it); the next `extend` writes from there. Cache slots past the cut are dropped then."""
    row = self._rows[slot]
    if row.state != FINISHED:
      raise RuntimeError(f"slot {slot} is {row.state}; only a finished slot can be truncated")
    if not 1 <= length <= len(row.tokens):
      raise ValueError(f"slot {slot}: length must be in [1, {len(row.tokens)}], got {length}")
    del row.tokens[length:]
    row.cached = min(row.cached, length)

  def release(self, slot: int) -> None:
    """Frees a slot (any state but running); its cache row is reused by the next `start`."""
    if self._rows[slot].state == RUNNING:
      raise RuntimeError(f"slot {slot} is running; wait for its turn to finish")
    self._rows[slot] = _Row()
    self._staged.pop(slot, None)

  def step(self) -> list[TurnResult]:
    """Runs all staged prefills (batched, bucketed), then one decode chunk of `chunk_steps` steps if any row
    is running. Returns the turns that finished (their slots are then "finished")."""
    done = self._run_prefills()
    if any(r.state == RUNNING for r in self._rows):
      done += self._run_decode()
    return done

  def has_work(self) -> bool:
    return any(r.state in (STAGED, RUNNING) for r in self._rows)

  # --- one-call API --------------------------------------------------------------------------------
  def generate(self, prompts: Sequence[Sequence[int]],
               sampling: SamplingParams | Sequence[SamplingParams] | None = None,
               seeds: Sequence[int] | None = None) -> list[SampleResult]:
    """Completes every prompt, `batch_size` at a time with continuous batching (a slot whose sequence
    finished takes the next prompt at once). `sampling`: one for all or one per prompt; `seeds` default to
    0..n-1. Results are in prompt order; a prompt's result depends only on its prompt, sampling params and
    seed, not on its slot or the other prompts (up to float rounding when the compiled shapes differ, e.g.
    another prefill bucket). Needs an idle sampler: finished slots are released, staged or running ones
    raise."""
    if self.has_work():
      raise RuntimeError("generate needs an idle sampler; finish or release the slots in use")
    n = len(prompts)
    if sampling is None or isinstance(sampling, SamplingParams):
      sampling = [sampling or SamplingParams()] * n
    seeds = list(range(n)) if seeds is None else list(seeds)
    if len(sampling) != n or len(seeds) != n:
      raise ValueError(f"{n} prompts need as many sampling params and seeds")
    for i, prompt in enumerate(prompts):
      self._check_tokens(prompt, start=0, what=f"prompt {i}")
    pending = collections.deque(range(n))
    results: list[SampleResult | None] = [None] * n
    for slot in range(self.batch_size):
      if self._rows[slot].state == FINISHED:
        self.release(slot)
    while pending or self.has_work():
      for slot in self.free_slots():
        if not pending:
          break
        i = pending.popleft()
        self.start(slot, prompts[i], sampling[i], seeds[i], tag=i)
      for turn in self.step():
        results[turn.tag] = SampleResult(turn.tokens, turn.logprobs, turn.finish_reason)
        self.release(turn.slot)
    return results

  # --- internals -----------------------------------------------------------------------------------
  def _check_tokens(self, tokens, start: int, what: str = "tokens") -> list[int]:
    tokens = [int(t) for t in tokens]
    if not tokens and start == 0:
      raise ValueError(f"{what}: empty prompt")
    if start + len(tokens) > self.max_len:
      raise ValueError(f"{what}: {start + len(tokens)} tokens do not fit a cache row of {self.max_len}")
    if tokens and not 0 <= min(tokens) <= max(tokens) < self.config.vocab_size:
      raise ValueError(f"{what}: token ids must be in [0, {self.config.vocab_size})")
    return tokens

  def _set_row_settings(self, slot: int, sampling: SamplingParams, seed: int) -> None:
    self._rows[slot].sampling = sampling
    s = self._settings_np
    stops = self.stop_ids if sampling.stop_ids is None else tuple(sampling.stop_ids)
    s.seed[slot] = int(seed) % (1 << 32)
    s.temperature[slot] = sampling.temperature
    s.top_p[slot] = sampling.top_p
    s.top_k[slot] = sampling.top_k if sampling.top_k < self.config.vocab_size else 0  # k >= V keeps all
    s.max_new[slot] = sampling.max_new_tokens
    s.stop_ids[slot] = -1
    s.stop_codes[slot] = REASON_NONE
    for j, t in enumerate(stops):
      s.stop_ids[slot, j] = t
      s.stop_codes[slot, j] = REASON_TOOL_CALL if t in self.tool_call_ids else REASON_STOP
    self._settings = None

  def _device_settings(self) -> RowSettings:
    if self._settings is None:
      self._settings = self._put(jax.tree.map(np.copy, self._settings_np), "settings")
    return self._settings

  def _mode(self, slots) -> tuple[int, bool]:
    """Static (sort_size, do_sample) covering the rows `slots`: only what they need gets compiled in."""
    s, v = self._settings_np, self.config.vocab_size
    slots = [i for i in slots if s.temperature[i] > 0]
    if not slots:
      return 0, False
    ks = [int(s.top_k[i]) for i in slots if 0 < s.top_k[i] < v]
    if any(s.top_p[i] < 1 and not 0 < s.top_k[i] < v for i in slots):
      return v, True
    if not ks:
      return 0, True
    return min(v, 1 << (max(ks) - 1).bit_length()), True

  def _bucket(self, n: int) -> int:
    return next(b for b in self.buckets if b >= n)

  def _run_prefills(self) -> list[TurnResult]:
    done = []
    b, piece_max = self.batch_size, self.buckets[-1]
    while self._staged:
      pieces = {slot: toks[:piece_max] for slot, toks in self._staged.items()}
      t = self._bucket(max(len(p) for p in pieces.values()))
      tokens = np.zeros((b, t), np.int32)
      starts, lengths = np.zeros((b,), np.int32), np.zeros((b,), np.int32)
      rows, final = np.zeros((b,), bool), np.zeros((b,), bool)
      for slot, piece in pieces.items():
        tokens[slot, :len(piece)] = piece
        starts[slot], lengths[slot], rows[slot] = self._rows[slot].cached, len(piece), True
        final[slot] = len(piece) == len(self._staged[slot])
      sort_size, do_sample = self._mode([i for i in pieces if final[i]])
      fn = _compiled_prefill(self.config, self.sharding, b, self.max_len, sort_size, do_sample)
      host_rows = (tokens, starts, lengths, rows, final)
      if self._shard is not None:
        # Multi-process JAX refuses host numpy for sharded jit inputs; device_put of the same values on every
        # process builds the global array (each process keeps its own shards).
        host_rows = jax.device_put(host_rows, (self._shard.rows,) * 5)
      self._cache, self._state, tok, lp, live, reason = fn(self.params, self._cache, self._state,
                                                           self._device_settings(), *host_rows)
      if final.any():
        tok, lp, live, reason = jax.device_get((tok, lp, live, reason))
      for slot, piece in pieces.items():
        row = self._rows[slot]
        row.cached += len(piece)
        if not final[slot]:
          self._staged[slot] = self._staged[slot][len(piece):]
          continue
        del self._staged[slot]
        row.tokens.append(int(tok[slot]))
        row.turn_tokens, row.turn_logprobs = [int(tok[slot])], [float(lp[slot])]
        row.state = RUNNING
        if not live[slot]:
          done.append(self._finish(slot, int(reason[slot])))
    return done

  def _run_decode(self) -> list[TurnResult]:
    running = [i for i, r in enumerate(self._rows) if r.state == RUNNING]
    sort_size, do_sample = self._mode(running)
    fn = _compiled_decode(self.config, self.sharding, self.batch_size, self.max_len, self.chunk_steps,
                          sort_size, do_sample)
    self._cache, self._state, tok, lp, live, reason = fn(self.params, self._cache, self._state,
                                                         self._device_settings())
    tok, lp, live, reason = jax.device_get((tok, lp, live, reason))
    done = []
    for slot in running:
      row = self._rows[slot]
      got = tok[slot] >= 0
      new = tok[slot][got].tolist()
      row.tokens.extend(new)
      row.turn_tokens.extend(new)
      row.turn_logprobs.extend(lp[slot][got].tolist())
      row.cached = len(row.tokens) - 1
      if not live[slot]:
        done.append(self._finish(slot, int(reason[slot])))
    return done

  def _finish(self, slot: int, reason: int) -> TurnResult:
    row = self._rows[slot]
    row.state, row.reason = FINISHED, reason
    row.cached = len(row.tokens) - 1
    return TurnResult(tokens=list(row.turn_tokens), logprobs=list(row.turn_logprobs),
                      finish_reason=REASON_NAMES[reason], slot=slot, tag=row.tag)
