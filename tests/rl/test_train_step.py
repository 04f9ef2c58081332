"""The jitted RL train step: gradient accumulation, sharding, learning on a fixed batch, NaN detection."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from orchestra_jax import rl, sharding
from orchestra_jax.model import qwen3
from orchestra_jax.model.config import tiny

pytestmark = pytest.mark.usefixtures("highest_precision")

CONFIG = tiny(vocab_size=512)
B, T = 8, 16
# a larger lr than the design's 1e-6 so one step moves the params visibly; KL on so its gradient is exercised
TRAIN = rl.TrainConfig(loss=rl.LossConfig(kl_coef=0.05), optimizer=rl.OptimizerConfig(learning_rate=1e-3))


@functools.cache
def params():
  return qwen3.init_params(CONFIG, jax.random.key(0))


@functools.cache
def logprob_fn():
  return rl.make_compute_logprobs(CONFIG, chunk_size=6)


def make_batch(seed=0, noise=0.3):
  """Rows of different prompt / response lengths (so micro-batches hold different token counts)."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, CONFIG.vocab_size, (B, T)).astype(np.int32)
  seg = np.zeros((B, T), np.int32)
  mask = np.zeros((B, T), np.int32)
  for b in range(B):
    prompt = int(rng.integers(2, 7))
    end = int(rng.integers(prompt + 1, T + 1)) if b % 4 else T
    seg[b, :end] = 1
    mask[b, prompt:end] = 1
  batch = {"tokens": tokens, "positions": np.tile(np.arange(T, dtype=np.int32), (B, 1)), "segment_ids": seg,
           "response_mask": mask, "advantages": rng.normal(0, 1.5, B).astype(np.float32)}
  logp = np.asarray(logprob_fn()(params(), batch))
  batch["old_logprobs"] = np.where(mask, logp + rng.normal(0, noise, (B, T)), 0).astype(np.float32)
  batch["ref_logprobs"] = np.where(mask, logp + rng.normal(0, noise, (B, T)), 0).astype(np.float32)
  return batch


@functools.cache
def grad_fn(n, aggregation="token_mean"):
  cfg = dataclasses.replace(TRAIN, grad_accum_steps=n, loss=dataclasses.replace(TRAIN.loss, aggregation=aggregation))
  return rl.make_grad_fn(CONFIG, cfg)


@functools.cache
def step_fn(n, mesh_shape=None):
  shard = None if mesh_shape is None else sharding.ShardingConfig(sharding.make_mesh(mesh_shape))
  cfg = dataclasses.replace(TRAIN, grad_accum_steps=n)
  return rl.make_train_step(CONFIG, cfg, shard), cfg, shard


def run_step(n, batch, mesh_shape=None, steps=1):
  step, cfg, shard = step_fn(n, mesh_shape)
  state = rl.init_train_state(CONFIG, params(), cfg, shard)
  batch = rl.shard_batch(batch, shard)
  history = []
  for _ in range(steps):
    state, metrics = step(state, batch)
    history.append(jax.device_get(metrics))
  return state, history


def assert_trees_close(a, b, rtol, atol):
  """Leafwise allclose; `rtol` also scales an absolute slack by the leaf's largest entry (summation-order noise on
  entries that cancel to near zero)."""
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    x, y = np.asarray(x), np.asarray(y)
    np.testing.assert_allclose(x, y, rtol=rtol, atol=atol + rtol * np.abs(y).max())


def test_grad_accumulation_gives_the_one_batch_gradient():
  batch = make_batch()
  ref_grads, ref_m = grad_fn(1)(params(), batch)
  assert float(ref_m["num_tokens"]) == batch["response_mask"].sum()
  for n in (2, 4):
    grads, m = grad_fn(n)(params(), batch)
    assert_trees_close(grads, ref_grads, rtol=1e-5, atol=1e-9)
    for k in ("loss", "pg_loss", "kl_loss", "entropy", "ratio_mean", "clip_frac"):
      np.testing.assert_allclose(m[k], ref_m[k], rtol=1e-5, atol=1e-7, err_msg=k)


def test_grad_accumulation_with_sequence_mean():
  batch = make_batch(1)
  assert_trees_close(grad_fn(4, "seq_mean_token_mean")(params(), batch)[0],
                     grad_fn(1, "seq_mean_token_mean")(params(), batch)[0], rtol=1e-5, atol=1e-9)


def test_grad_accumulation_gives_the_same_update():
  batch = make_batch(2)
  one, m1 = run_step(1, batch)
  four, m4 = run_step(4, batch)
  np.testing.assert_allclose(m4[0]["grad_norm"], m1[0]["grad_norm"], rtol=1e-5)
  # Adam's moments after one step are linear / quadratic in the clipped gradient: they must agree closely
  assert_trees_close(four.opt_state, one.opt_state, rtol=1e-5, atol=0)
  # the update itself is ≈ lr·g/(|g| + eps), which magnifies summation noise where |g| ~ eps: compare at lr/10
  assert_trees_close(four.params, one.params, rtol=0, atol=TRAIN.optimizer.learning_rate / 10)
  assert int(one.step) == int(four.step) == 1


@pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 devices: XLA_FLAGS=--xla_force_host_platform_device_count=8")
def test_sharded_step_equals_single_device_step():
  batch = make_batch(3)
  single, m_single = run_step(2, batch)
  sharded, m_sharded = run_step(2, batch, mesh_shape=(2, 2, 2))
  assert_trees_close(sharded.opt_state, single.opt_state, rtol=1e-5, atol=0)
  assert_trees_close(sharded.params, single.params, rtol=0, atol=TRAIN.optimizer.learning_rate / 10)
  for k, v in m_single[0].items():
    np.testing.assert_allclose(m_sharded[0][k], v, rtol=1e-5, atol=1e-7, err_msg=k)
  # the state lives on the mesh as the model's rules say: q heads over `tensor`, moments like their params
  q = sharded.params["layers"]["attn"]["q_proj"]
  assert tuple(q.sharding.spec) == (None, "fsdp", "tensor", None)  # [layers, embed, q_heads, head_dim]
  mu = sharded.opt_state[1][0].mu["layers"]["attn"]["q_proj"]
  assert mu.sharding.is_equivalent_to(q.sharding, q.ndim)
  # sharded log-probs equal single-device ones
  shard = sharding.ShardingConfig(sharding.make_mesh((2, 2, 2)))
  lp_sharded = rl.make_compute_logprobs(CONFIG, 6, shard)(jax.device_put(params(), qwen3.param_shardings(CONFIG, shard)),
                                                          rl.shard_batch(batch, shard))
  np.testing.assert_allclose(lp_sharded, logprob_fn()(params(), batch), rtol=1e-5, atol=1e-6)


def test_loss_decreases_on_a_fixed_batch_with_positive_advantage():
  batch = make_batch(4, noise=0.0)
  batch["advantages"] = np.ones(B, np.float32)
  _, history = run_step(1, batch, steps=4)
  losses = [float(m["loss"]) for m in history]
  assert abs(losses[0] - (-1.0)) < 1e-4  # r = 1 everywhere on the first step: loss = −A
  # at lr 1e-3 the ratio reaches the clip (1.28) within a step or two; from there the loss stays near −1.28
  assert max(losses[1:]) < losses[0] - 0.1, losses
  assert losses[-1] < -1.2, losses
  assert all(rl.is_finite(m) for m in history)


def test_nan_is_visible_in_metrics_and_the_step_is_skipped():
  batch = make_batch(5)
  b, t = np.argwhere(batch["response_mask"])[0]
  batch["old_logprobs"][b, t] = np.nan
  state, history = run_step(1, batch)
  m = history[0]
  assert np.isnan(m["loss"]) and m["skipped"] == 1.0
  assert not rl.is_finite(m)
  assert_trees_close(state.params, params(), rtol=0, atol=0)  # skip_nonfinite kept the old params


def test_bad_batches_are_refused():
  batch = make_batch(6)
  with pytest.raises(ValueError, match="grad_accum_steps=3"):
    rl.accumulated_grads(CONFIG, dataclasses.replace(TRAIN, grad_accum_steps=3), params(), batch)
  with pytest.raises(KeyError, match="ref_logprobs"):
    rl.accumulated_grads(CONFIG, TRAIN, params(), {k: v for k, v in batch.items() if k != "ref_logprobs"})
  with pytest.raises(KeyError, match="unknown keys"):
    rl.accumulated_grads(CONFIG, TRAIN, params(), dict(batch, rewards=np.zeros(B)))


def test_default_optimizer_matches_design():
  cfg = rl.OptimizerConfig()
  assert (cfg.learning_rate, cfg.b1, cfg.b2, cfg.weight_decay, cfg.grad_clip_norm) == (1e-6, 0.9, 0.999, 0.01, 1.0)
  assert float(rl.learning_rate_schedule(cfg)(12345)) == pytest.approx(1e-6)
  # clipping to global norm 1 then AdamW: the first step moves each weight by lr·(sign(g) + wd·w) for large g
  tx = rl.make_optimizer(cfg)
  p = {"w": jnp.array([1.0, -2.0])}
  updates, _ = tx.update({"w": jnp.array([300.0, -400.0])}, tx.init(p), p)
  np.testing.assert_allclose(updates["w"], -1e-6 * (np.array([1.0, -1.0]) + 0.01 * np.array([1.0, -2.0])), rtol=1e-4)
