"""Logits parity with transformers' Qwen3ForCausalLM (float32, highest precision, weights std 0.2)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from conftest import max_rel_err
from hf_reference import SMALL_CONFIGS
from orchestra_jax import checkpoint
from orchestra_jax.model import qwen3

pytestmark = pytest.mark.usefixtures("highest_precision")


def _hf_logits(model, tokens):
  with torch.no_grad():
    return model(torch.tensor(np.asarray(tokens))).logits.numpy()


@pytest.mark.parametrize("name", sorted(SMALL_CONFIGS))
def test_logits_match_transformers(hf_dirs, name):
  model, path = hf_dirs[name]
  config, params = checkpoint.load_model(path)
  tokens = np.random.RandomState(1).randint(0, config.vocab_size, (3, 11))
  ref = _hf_logits(model, tokens)
  ours, _ = jax.jit(lambda p, t: qwen3.forward(config, p, t))(params, jnp.asarray(tokens))
  assert np.abs(ref).max() > 1.0, "reference logits too small for a meaningful comparison"
  assert max_rel_err(ours, ref) < 1e-5


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batch_matches_unpadded_rows(hf_dirs, side):
  model, path = hf_dirs["untied_gqa2"]
  config, params = checkpoint.load_model(path)
  rng = np.random.RandomState(2)
  lengths = [9, 4, 6]
  width = max(lengths)
  tokens = np.zeros((3, width), np.int32)
  segments = np.zeros((3, width), np.int32)
  rows = [rng.randint(0, config.vocab_size, n) for n in lengths]
  for i, row in enumerate(rows):
    sl = slice(0, len(row)) if side == "right" else slice(width - len(row), width)
    tokens[i, sl], segments[i, sl] = row, 1
  ours, _ = qwen3.forward(config, params, jnp.asarray(tokens), segment_ids=jnp.asarray(segments))
  ours = np.asarray(ours)
  for i, row in enumerate(rows):
    ref = _hf_logits(model, row[None])[0]
    real = segments[i] == 1
    assert max_rel_err(ours[i][real], ref) < 1e-5
    assert np.isfinite(ours[i]).all(), "padding positions must not produce NaN"


def test_packed_segments_match_separate_sequences(hf_dirs):
  model, path = hf_dirs["tied_mha"]
  config, params = checkpoint.load_model(path)
  rng = np.random.RandomState(3)
  a, b = rng.randint(0, config.vocab_size, 5), rng.randint(0, config.vocab_size, 7)
  tokens = np.concatenate([a, b])[None]
  segments = np.array([[1] * 5 + [2] * 7])
  positions = np.array([list(range(5)) + list(range(7))])
  ours, _ = qwen3.forward(config, params, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(segments))
  ours = np.asarray(ours)[0]
  assert max_rel_err(ours[:5], _hf_logits(model, a[None])[0]) < 1e-5
  assert max_rel_err(ours[5:], _hf_logits(model, b[None])[0]) < 1e-5


@pytest.mark.parametrize("chunks", [(4, 1, 1, 3, 2), (11,), (1,) * 11])
def test_kv_cache_chunks_match_full_forward(hf_dirs, chunks):
  _, path = hf_dirs["untied_gqa4_wide_heads"]
  config, params = checkpoint.load_model(path)
  tokens = np.random.RandomState(4).randint(0, config.vocab_size, (2, sum(chunks)))
  full, _ = qwen3.forward(config, params, jnp.asarray(tokens))
  cache = qwen3.init_cache(config, batch=2, max_len=16)
  step = jax.jit(lambda p, t, pos, c: qwen3.forward(config, p, t, positions=pos, cache=c))
  pieces, start = [], 0
  for n in chunks:
    pos = jnp.broadcast_to(jnp.arange(start, start + n), (2, n))
    logits, cache = step(params, jnp.asarray(tokens[:, start:start + n]), pos, cache)
    pieces.append(np.asarray(logits))
    start += n
  assert max_rel_err(np.concatenate(pieces, axis=1), full) < 1e-5
  assert np.asarray(cache.filled)[:, :start].all() and not np.asarray(cache.filled)[:, start:].any()


def test_kv_cache_rows_at_different_offsets(hf_dirs):
  """Per-row positions: row 0 has 6 cached tokens, row 1 has 3; one more token each matches the full forward."""
  model, path = hf_dirs["untied_gqa2"]
  config, params = checkpoint.load_model(path)
  rng = np.random.RandomState(5)
  seqs = [rng.randint(0, config.vocab_size, 7), rng.randint(0, config.vocab_size, 4)]
  # Left-aligned prefill with padding (segment 0) for the shorter row.
  prefill = np.zeros((2, 6), np.int32)
  seg = np.zeros((2, 6), np.int32)
  prefill[0], seg[0] = seqs[0][:6], 1
  prefill[1, :3], seg[1, :3] = seqs[1][:3], 1
  cache = qwen3.init_cache(config, batch=2, max_len=12)
  _, cache = qwen3.forward(config, params, jnp.asarray(prefill), jnp.asarray(np.tile(np.arange(6), (2, 1))),
                           jnp.asarray(seg), cache)
  nxt = np.array([[seqs[0][6]], [seqs[1][3]]])
  logits, cache = qwen3.forward(config, params, jnp.asarray(nxt), jnp.asarray([[6], [3]]), cache=cache)
  for i, seq in enumerate(seqs):
    assert max_rel_err(np.asarray(logits)[i, 0], _hf_logits(model, seq[None])[0, -1]) < 1e-5


def test_reset_rows_starts_a_fresh_sequence(hf_dirs):
  _, path = hf_dirs["tied_mha"]
  config, params = checkpoint.load_model(path)
  rng = np.random.RandomState(6)
  first, second = rng.randint(0, config.vocab_size, (1, 5)), rng.randint(0, config.vocab_size, (1, 3))
  cache = qwen3.init_cache(config, batch=1, max_len=8)
  _, cache = qwen3.forward(config, params, jnp.asarray(first), cache=cache)
  cache = cache.reset_rows(jnp.array([True]))
  logits, _ = qwen3.forward(config, params, jnp.asarray(second), cache=cache)
  fresh, _ = qwen3.forward(config, params, jnp.asarray(second))
  assert max_rel_err(logits, fresh) < 1e-5


@pytest.mark.parametrize("remat", ["full", "dots"])
def test_remat_gives_same_logits_and_grads(hf_dirs, remat):
  _, path = hf_dirs["untied_gqa2"]
  config, params = checkpoint.load_model(path)
  tokens = jnp.asarray(np.random.RandomState(7).randint(0, config.vocab_size, (2, 6)))

  def loss(cfg, p):
    logits, _ = qwen3.forward(cfg, p, tokens)
    return jax.nn.log_softmax(logits)[..., 0].mean()

  base_val, base_grad = jax.value_and_grad(lambda p: loss(config, p))(params)
  val, grad = jax.value_and_grad(lambda p: loss(config.replace(remat=remat), p))(params)
  assert abs(float(val - base_val)) <= 1e-6 * abs(float(base_val))
  for g, bg in zip(jax.tree.leaves(grad), jax.tree.leaves(base_grad)):
    assert max_rel_err(g, bg) < 1e-5


def test_bfloat16_params_stay_close_to_float32(hf_dirs):
  model, path = hf_dirs["untied_gqa2"]
  config, params = checkpoint.load_model(path, param_dtype="bfloat16", dtype="bfloat16")
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(params))
  tokens = np.random.RandomState(8).randint(0, config.vocab_size, (1, 8))
  ours, _ = qwen3.forward(config, params, jnp.asarray(tokens))
  assert ours.dtype == jnp.float32
  # bf16 has ~3 significant digits; after 2 layers the logits agree to a few percent.
  assert max_rel_err(ours, _hf_logits(model, tokens)) < 0.05


def test_qwen3_8b_preset_has_8_19b_params():
  from orchestra_jax.model.config import qwen3_8b
  config = qwen3_8b()
  shapes = qwen3.abstract_params(config)
  total = sum(int(np.prod(s.shape)) for s in jax.tree.leaves(shapes))
  assert abs(total - 8.19e9) / 8.19e9 < 0.005
  assert total == config.num_params()
  assert all(s.dtype == jnp.bfloat16 for s in jax.tree.leaves(shapes))
