"""The decode side of the sampler: per-row device state, recording a sampled token, and the chunked decode loop.

While a row decodes, its last sampled token is *pending*: sampled but not yet in the cache. Each decode step
writes every live row's pending token into its cache slot and samples the one after, so a turn that finishes
leaves every conversation token but the last in the cache (`Sampler.extend` writes that one with the next
prefill). A row finishes on a stop id (reason "stop" or "tool_call", by the id's code in `RowSettings`) or when
it may not sample any more ("length": max_new reached, or no cache slot left for the pending token).
"""

from __future__ import annotations

import flax
import jax
import jax.numpy as jnp
import numpy as np

from orchestra_jax.model import qwen3
from orchestra_jax.model.config import ModelConfig
from orchestra_jax.rollout.sampling import MAX_STOP_IDS, sample_logits
from orchestra_jax.sharding import ShardingConfig

REASON_NONE, REASON_STOP, REASON_TOOL_CALL, REASON_LENGTH = 0, 1, 2, 3
REASON_NAMES = {REASON_STOP: "stop", REASON_TOOL_CALL: "tool_call", REASON_LENGTH: "length"}


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


def host_settings(batch: int) -> RowSettings:
  """Host (numpy) settings for `batch` rows, every row off: the copy `Sampler` edits and puts on the devices."""
  return RowSettings(seed=np.zeros((batch,), np.uint32), temperature=np.zeros((batch,), np.float32),
                     top_p=np.ones((batch,), np.float32), top_k=np.zeros((batch,), np.int32),
                     max_new=np.ones((batch,), np.int32), stop_ids=np.full((batch, MAX_STOP_IDS), -1, np.int32),
                     stop_codes=np.zeros((batch, MAX_STOP_IDS), np.int32))


# --- the decode loop -----------------------------------------------------------------------------------

def advance(state: DecodeState, settings: RowSettings, rows: jax.Array, token: jax.Array, position: jax.Array,
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
    st = advance(st, settings, emitted, tok, new_pos, st.num_new + 1, cache.max_len)
    out_tok = out_tok.at[:, i].set(jnp.where(emitted, tok, -1))
    out_lp = out_lp.at[:, i].set(jnp.where(emitted, lp, 0.0))
    return i + 1, cache, st, out_tok, out_lp

  _, cache, state, out_tok, out_lp = jax.lax.while_loop(cond, body, (0, cache, state, out_tok, out_lp))
  return cache, state, out_tok, out_lp
