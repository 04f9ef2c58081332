"""PPO loss, aggregations, KL estimators (against numpy written from docs/design.md section 6) and chunked log-probs."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from orchestra_jax import rl
from orchestra_jax.model import qwen3
from orchestra_jax.model.config import tiny

EPS_LOW, EPS_HIGH, DUAL = 0.2, 0.28, 10.0


def np_ppo(logp, old, adv):
  """docs/design.md: ℓ = max(−A·r, −A·clip(r, 1−0.2, 1+0.28)); for A < 0, ℓ = min(ℓ, −A·10)."""
  r = np.exp(logp - old)
  loss = np.maximum(-adv * r, -adv * np.clip(r, 1 - EPS_LOW, 1 + EPS_HIGH))
  return np.where(adv < 0, np.minimum(loss, -adv * DUAL), loss)


def np_ppo_grad(logp, old, adv):
  """dℓ/dlogp: −A·r where the unclipped term is the one in use, else 0."""
  r = np.exp(logp - old)
  pos_live = (adv > 0) & (r <= 1 + EPS_HIGH)
  neg_live = (adv < 0) & (r >= 1 - EPS_LOW) & (r <= DUAL)
  return np.where(pos_live | neg_live, -adv * r, 0.0)


def random_inputs(seed=0, shape=(6, 40)):
  rng = np.random.default_rng(seed)
  old = rng.uniform(-6, -0.1, shape)
  log_ratio = rng.uniform(-4, 4, shape)  # ratios from 0.02 to 55: far outside both clips and the dual clip
  log_ratio[0, :5] = np.log([0.5, 0.9, 1.1, 2.0, 20.0])
  adv = rng.normal(0, 2, shape)
  adv[1] = np.abs(adv[1])
  adv[2] = -np.abs(adv[2])
  mask = rng.uniform(size=shape) < 0.7
  mask[3] = False  # an empty row
  mask[4, :3] = True
  mask[4, 3:] = False  # a short row
  return (old + log_ratio).astype(np.float32), old.astype(np.float32), adv.astype(np.float32), mask


def test_ppo_token_loss_matches_numpy_in_every_clip_region():
  logp, old, adv, _ = random_inputs()
  r = np.exp(logp - old)
  regions = {"pos_hi": (adv > 0) & (r > 1.28), "pos_lo": (adv > 0) & (r < 0.8), "neg_lo": (adv < 0) & (r < 0.8),
             "neg_hi": (adv < 0) & (r > 1.28) & (r < 10), "neg_dual": (adv < 0) & (r > 10),
             "inside": (r > 0.8) & (r < 1.28)}
  assert all(m.sum() >= 3 for m in regions.values()), {k: int(m.sum()) for k, m in regions.items()}
  loss, info = rl.ppo_token_loss(jnp.asarray(logp), jnp.asarray(old), jnp.asarray(adv))
  np.testing.assert_allclose(loss, np_ppo(logp, old, adv), rtol=1e-5, atol=1e-6)
  grad = jax.grad(lambda lp: rl.ppo_token_loss(lp, old, adv)[0].sum())(jnp.asarray(logp))
  np.testing.assert_allclose(grad, np_ppo_grad(logp, old, adv), rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(info["clip_high"], regions["pos_hi"])
  np.testing.assert_array_equal(info["clip_low"], regions["neg_lo"])
  np.testing.assert_array_equal(info["clip_dual"], regions["neg_dual"])


def test_dual_clip_off_and_symmetric_clip():
  logp, old, adv, _ = random_inputs(1)
  loss, _ = rl.ppo_token_loss(logp, old, adv, clip_low=0.2, clip_high=0.2, dual_clip=None)
  r = np.exp(logp - old)
  np.testing.assert_allclose(loss, np.maximum(-adv * r, -adv * np.clip(r, 0.8, 1.2)), rtol=1e-5, atol=1e-6)


def np_aggregate(name, v, mask):
  rows = mask.sum(-1)
  nonempty = (rows > 0).sum()
  if name == "token_mean":
    return (v * mask).sum() / mask.sum()
  if name == "seq_mean_token_sum":
    return (v * mask).sum() / nonempty
  return ((v * mask).sum(-1) / np.maximum(rows, 1)).sum() / nonempty


@pytest.mark.parametrize("name", ["token_mean", "seq_mean_token_sum", "seq_mean_token_mean"])
def test_aggregations_and_their_shares(name):
  logp, old, adv, mask = random_inputs(2)
  v = np_ppo(logp, old, adv)
  full = rl.aggregate(name, v, mask)
  np.testing.assert_allclose(full, np_aggregate(name, v, mask), rtol=1e-5)
  # shares over row subsets, normalised by the whole batch's totals, add up to the whole-batch value
  totals = rl.batch_totals(mask)
  parts = [rl.aggregate(name, v[rows], mask[rows], totals) for rows in ([0, 3, 5], [1, 2, 4])]
  np.testing.assert_allclose(sum(parts), full, rtol=1e-5)


def test_unknown_aggregation_lists_the_known_ones():
  with pytest.raises(KeyError, match="seq_mean_token_mean"):
    rl.aggregate("nope", np.zeros((1, 1)), np.ones((1, 1)))


@pytest.mark.parametrize("kl_type", ["mse", "k1", "k3"])
def test_kl_estimators_and_total_loss(kl_type):
  logp, old, adv, mask = random_inputs(3)
  ref = old + np.random.default_rng(4).normal(0, 0.5, old.shape).astype(np.float32)
  d = logp - ref
  expect_kl = {"mse": 0.5 * d ** 2, "k1": d, "k3": np.exp(-d) + d - 1}[kl_type]
  np.testing.assert_allclose(rl.kl_penalty(kl_type, logp, ref), expect_kl, rtol=1e-5, atol=1e-6)
  config = rl.LossConfig(kl_type=kl_type, kl_coef=0.5)
  loss, m = rl.rl_loss(logp, old, adv, mask, config, ref_logp=ref)
  pg = np_aggregate("token_mean", np_ppo(logp, old, adv), mask)
  kl = np_aggregate("token_mean", expect_kl, mask)
  np.testing.assert_allclose([m["pg_loss"], m["kl_loss"], loss], [pg, kl, pg + 0.5 * kl], rtol=1e-5)


def test_rl_loss_metrics_and_defaults():
  logp, old, adv, mask = random_inputs(5)
  cfg = rl.LossConfig()
  assert (cfg.clip_low, cfg.clip_high, cfg.dual_clip, cfg.kl_type, cfg.kl_coef, cfg.entropy_coef,
          cfg.aggregation) == (0.2, 0.28, 10.0, "mse", 1e-4, 0.0, "token_mean")
  ent = np.random.default_rng(6).uniform(0, 3, old.shape).astype(np.float32)
  loss, m = rl.rl_loss(logp, old, adv, mask, cfg, ref_logp=old, entropy=ent)
  r = np.exp(logp - old)
  mean = lambda x: (x * mask).sum() / mask.sum()
  np.testing.assert_allclose(m["ratio_mean"], mean(r), rtol=1e-5)
  np.testing.assert_allclose(m["approx_kl"], mean(r - 1 - np.log(r)), rtol=1e-5)
  np.testing.assert_allclose(m["entropy"], mean(ent), rtol=1e-5)
  np.testing.assert_allclose(m["clip_frac_high"], mean((adv > 0) & (r > 1.28)), rtol=1e-6)
  np.testing.assert_allclose(m["clip_frac_low"], mean((adv < 0) & (r < 0.8)), rtol=1e-6)
  np.testing.assert_allclose(m["clip_frac_dual"], mean((adv < 0) & (r > 10)), rtol=1e-6)
  assert m["loss"] == loss
  # advantages [B] broadcast over tokens equal the [B, T] form
  row_adv = adv[:, 0]
  a, _ = rl.rl_loss(logp, old, row_adv, mask, cfg, ref_logp=old)
  b, _ = rl.rl_loss(logp, old, np.broadcast_to(row_adv[:, None], old.shape), mask, cfg, ref_logp=old)
  np.testing.assert_allclose(a, b, rtol=1e-6)
  with pytest.raises(ValueError, match="ref_logprobs"):
    rl.rl_loss(logp, old, adv, mask, cfg)


def test_masked_garbage_never_reaches_loss_or_gradient():
  logp, old, adv, mask = random_inputs(7)
  dirty_old = np.where(mask, old, -np.inf).astype(np.float32)
  dirty_ref = np.where(mask, old, np.nan).astype(np.float32)
  dirty_adv = np.where(mask, adv, np.nan).astype(np.float32)
  f = lambda lp, o, a, r: rl.rl_loss(lp, o, a, mask, rl.LossConfig(), ref_logp=r)[0]
  clean, g_clean = jax.value_and_grad(f)(jnp.asarray(logp), old, adv, old)
  dirty, g_dirty = jax.value_and_grad(f)(jnp.asarray(logp), dirty_old, dirty_adv, dirty_ref)
  assert np.isfinite(dirty) and np.isfinite(g_dirty).all()
  np.testing.assert_allclose(dirty, clean, rtol=1e-6)
  np.testing.assert_allclose(g_dirty, g_clean, rtol=1e-6)


# --- chunked log-probs -------------------------------------------------------------------------------

@functools.cache
def tiny_model(tied):
  config = tiny(vocab_size=512, tie_word_embeddings=tied)
  return config, qwen3.init_params(config, jax.random.key(0))


def _batch(config, b=3, t=13):
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, config.vocab_size, (b, t)).astype(np.int32)
  seg = np.ones((b, t), np.int32)
  seg[1, 9:] = 0  # right padding
  seg[2, 6:] = 2  # two packed sequences
  pos = np.where(seg[2] == 2, np.arange(t) - 6, np.arange(t))
  positions = np.stack([np.arange(t), np.arange(t), pos]).astype(np.int32)
  return tokens, positions, seg


@pytest.mark.usefixtures("highest_precision")
@pytest.mark.parametrize("tied,chunk,check_grad", [(True, 5, True), (False, 4, True), (True, 512, False)])
def test_chunked_logprobs_equal_full_log_softmax(tied, chunk, check_grad):
  config, params = tiny_model(tied)
  tokens, positions, seg = _batch(config)
  logits, _ = jax.jit(lambda p: qwen3.forward(config, p, tokens, positions, seg))(params)  # [B, T, V]
  logsm = jax.nn.log_softmax(logits, axis=-1)
  expect = np.zeros(tokens.shape, np.float32)
  expect[:, 1:] = np.take_along_axis(np.asarray(logsm[:, :-1]), tokens[:, 1:, None], -1)[..., 0]
  probs = np.exp(np.asarray(logsm))
  expect_ent = np.zeros(tokens.shape, np.float32)
  expect_ent[:, 1:] = -(probs * np.asarray(logsm)).sum(-1)[:, :-1]
  defined = np.zeros(tokens.shape, bool)
  defined[:, 1:] = (seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] != 0)
  expect, expect_ent = np.where(defined, expect, 0), np.where(defined, expect_ent, 0)

  logp, ent = jax.jit(lambda p: rl.token_logprobs(config, p, tokens, positions, seg, chunk_size=chunk))(params)
  np.testing.assert_allclose(logp, expect, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(ent, expect_ent, rtol=1e-5, atol=1e-5)
  assert logp[2, 6] == 0 and logp[1, 9:].tolist() == [0.0] * 4  # segment start, padding

  if not check_grad:
    return
  # gradients through the checkpointed chunks equal those through the full logits
  weights = np.random.default_rng(1).normal(size=tokens.shape).astype(np.float32) * defined
  g_chunk = jax.jit(jax.grad(lambda p: jnp.sum(weights * rl.token_logprobs(config, p, tokens, positions, seg,
                                                                      chunk_size=chunk)[0])))(params)

  def full(p):
    lsm = jax.nn.log_softmax(qwen3.forward(config, p, tokens, positions, seg)[0], axis=-1)
    picked = jnp.take_along_axis(lsm[:, :-1], tokens[:, 1:, None], -1)[..., 0]
    return jnp.sum(weights[:, 1:] * picked)

  g_full = jax.jit(jax.grad(full))(params)
  for a, b in zip(jax.tree.leaves(g_chunk), jax.tree.leaves(g_full)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_logprob_window_scores_only_the_last_tokens():
  import jax
  import jax.numpy as jnp
  import numpy as np
  from orchestra_jax.model import qwen3
  from orchestra_jax.model.config import tiny
  from orchestra_jax.rl.logprobs import token_logprobs
  config = tiny(vocab_size=512, num_layers=1)
  params = qwen3.init_params(config, jax.random.key(0))
  tokens = jnp.asarray(np.random.RandomState(0).randint(0, 512, (2, 12)))
  with jax.default_matmul_precision("highest"):
    full, full_ent = token_logprobs(config, params, tokens, chunk_size=4)
    win, win_ent = token_logprobs(config, params, tokens, chunk_size=4, window=5)
  np.testing.assert_allclose(np.asarray(win)[:, -5:], np.asarray(full)[:, -5:], rtol=1e-5)
  np.testing.assert_allclose(np.asarray(win_ent)[:, -5:], np.asarray(full_ent)[:, -5:], rtol=1e-5)
  assert not np.asarray(win)[:, :-5].any() and np.asarray(full)[:, 1:-5].all()
