"""Batched autoregressive sampling over a static-shape KV cache, with continuous batching.

Two layers:

* Pure jitted math, one module per seam: `sampling` (token selection: greedy / temperature / top-k / top-p per
  row, and the PRNG and log-prob conventions), `prefill` (write tokens into selected cache rows at per-row
  offsets and sample each finished row's next token), `decode` (the per-row state and up to k decode steps in one
  `lax.while_loop`), and `compiled` (their jitted, sharded variants, cached per model, mesh, batch, cache length
  and static sampling mode, and shared by every `Sampler` with those shapes).
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

Prefills are right-padded to a few bucketed lengths; one longer than the largest bucket is written in pieces of
that size. A row's samples depend only on its seed and its tokens (see `sampling`), not on its slot or the
other rows.

Finish reasons: "stop" (sampled a stop id, e.g. `<|im_end|>`), "tool_call" (sampled a tool-call id,
`</tool_call>`), "length" (max_new_tokens reached, or the cache row is full). The stop token is included in
the returned tokens.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from orchestra_jax.model import qwen3
from orchestra_jax.model.config import ModelConfig
# compute_params is re-exported: the trainer, benchmarks and tests import it from here.
from orchestra_jax.rollout.compiled import (compiled_cast, compiled_decode, compiled_prefill,  # noqa: F401
                                            compute_params, sampler_shardings)
from orchestra_jax.rollout.decode import (REASON_NAMES, REASON_NONE, REASON_STOP, REASON_TOOL_CALL, RowSettings,
                                          host_settings, init_state)
from orchestra_jax.rollout.sampling import MAX_STOP_IDS, SamplingParams
from orchestra_jax.sharding import ShardingConfig
from orchestra_jax.tokenizer import IM_END_ID, TOOL_CALL_CLOSE_ID


# --- results -------------------------------------------------------------------------------------------

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


# --- host state ----------------------------------------------------------------------------------------

FREE, STAGED, RUNNING, FINISHED = "free", "staged", "running", "finished"


def default_buckets(max_len: int, minimum: int = 16, maximum: int = 1024) -> tuple[int, ...]:
  """Powers of two from `minimum` up to min(max_len, maximum), plus that cap if it is not a power of two."""
  cap = max(1, min(max_len, maximum))
  out, b = [], minimum
  while b < cap:
    out.append(b)
    b *= 2
  out.append(cap)
  return tuple(out)


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
               tool_call_ids: Sequence[int] = (TOOL_CALL_CLOSE_ID,)):
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
      stop_ids = [IM_END_ID, TOOL_CALL_CLOSE_ID] + ([config.eos_token_id] if config.eos_token_id is not None else [])
    self.stop_ids = tuple(dict.fromkeys(int(i) for i in stop_ids))
    self.tool_call_ids = frozenset(int(i) for i in tool_call_ids)
    if len(self.stop_ids) > MAX_STOP_IDS:
      raise ValueError(f"at most {MAX_STOP_IDS} stop ids, got {len(self.stop_ids)}")
    self._shard = None if sharding is None else sampler_shardings(config, sharding, self.batch_size, self.max_len)
    self.set_params(params)
    self._cache = qwen3.init_cache(config, self.batch_size, self.max_len, sharding=sharding)
    self._state = self._put(init_state(self.batch_size), "state")
    self._settings_np = host_settings(self.batch_size)
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
      params = compiled_cast(self.config, self.sharding)(params)
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
      fn = compiled_prefill(self.config, self.sharding, b, self.max_len, sort_size, do_sample)
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
    fn = compiled_decode(self.config, self.sharding, self.batch_size, self.max_len, self.chunk_steps,
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
