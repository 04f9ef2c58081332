"""The same model on different (data, fsdp, tensor) meshes of 8 simulated CPU devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import max_rel_err
from orchestra_jax import checkpoint, sharding
from orchestra_jax.model import qwen3

pytestmark = [pytest.mark.usefixtures("highest_precision"),
              pytest.mark.skipif(len(jax.devices()) < 8, reason="needs XLA_FLAGS=--xla_force_host_platform_device_count=8")]

MESHES = [(8, 1, 1), (2, 2, 2), (1, 2, 4)]


@pytest.fixture(scope="module")
def model_and_tokens(hf_dirs):
  _, path = hf_dirs["untied_gqa4_wide_heads"]  # 8 query heads, 2 kv heads: tensor=4 shards q, not kv
  config, params = checkpoint.load_model(path)
  tokens = np.random.RandomState(0).randint(0, config.vocab_size, (8, 12))
  return path, config, params, tokens


def _sharded_forward(config, params, tokens, mesh_shape):
  shard = sharding.ShardingConfig(sharding.make_mesh(mesh_shape))
  p = jax.device_put(params, qwen3.param_shardings(config, shard))
  t = jax.device_put(jnp.asarray(tokens), shard.sharding(tokens.shape, ("batch", "length")))
  logits, _ = jax.jit(lambda p, t: qwen3.forward(config, p, t, sharding=shard))(p, t)
  return logits, p


@pytest.mark.parametrize("mesh_shape", MESHES)
def test_same_logits_on_every_mesh(model_and_tokens, mesh_shape):
  _, config, params, tokens = model_and_tokens
  ref, _ = qwen3.forward(config, params, jnp.asarray(tokens))
  logits, placed = _sharded_forward(config, params, tokens, mesh_shape)
  assert max_rel_err(logits, ref) < 1e-5
  q_spec = placed["layers"]["attn"]["q_proj"].sharding.spec
  if mesh_shape == (1, 2, 4):
    assert q_spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor", None)
    assert len(placed["layers"]["attn"]["q_proj"].addressable_shards) == 8
  if mesh_shape == (8, 1, 1):
    assert logits.sharding.spec[0] == "data"


def test_kv_cache_forward_on_mesh(model_and_tokens):
  _, config, params, tokens = model_and_tokens
  shard = sharding.ShardingConfig(sharding.make_mesh((2, 2, 2)))
  p = jax.device_put(params, qwen3.param_shardings(config, shard))
  cache = qwen3.init_cache(config, batch=8, max_len=16, sharding=shard)
  step = jax.jit(lambda p, t, pos, c: qwen3.forward(config, p, t, pos, cache=c, sharding=shard))
  first, cache = step(p, jnp.asarray(tokens[:, :7]), jnp.tile(jnp.arange(7), (8, 1)), cache)
  second, cache = step(p, jnp.asarray(tokens[:, 7:]), jnp.tile(jnp.arange(7, 12), (8, 1)), cache)
  ref, _ = qwen3.forward(config, params, jnp.asarray(tokens))
  assert max_rel_err(jnp.concatenate([first, second], axis=1), ref) < 1e-5


def test_checkpoint_saved_on_one_mesh_restores_onto_another(model_and_tokens, tmp_path):
  _, config, params, tokens = model_and_tokens
  save_shard = sharding.ShardingConfig(sharding.make_mesh((2, 2, 2)))
  placed = jax.device_put(params, qwen3.param_shardings(config, save_shard))
  checkpoint.save_model(tmp_path / "ckpt", config, placed)
  load_shard = sharding.ShardingConfig(sharding.make_mesh((1, 2, 4)))
  restored = checkpoint.restore_params(tmp_path / "ckpt", config, load_shard)
  want = qwen3.param_shardings(config, load_shard)
  for got, expected, original in zip(jax.tree.leaves(restored), jax.tree.leaves(want), jax.tree.leaves(params)):
    assert got.sharding == expected
    np.testing.assert_array_equal(np.asarray(got), np.asarray(original))
  logits, _ = jax.jit(lambda p, t: qwen3.forward(config, p, t, sharding=load_shard))(restored, jnp.asarray(tokens))
  ref, _ = qwen3.forward(config, params, jnp.asarray(tokens))
  assert max_rel_err(logits, ref) < 1e-5


def test_load_hf_dir_onto_mesh(model_and_tokens):
  path, config, params, _ = model_and_tokens
  shard = sharding.ShardingConfig(sharding.make_mesh((1, 2, 4)))
  _, placed = checkpoint.load_model(path, sharding=shard)
  assert placed["embedding"].sharding.spec == jax.sharding.PartitionSpec("tensor", "fsdp")


def test_logical_to_spec_drops_axes_that_do_not_divide():
  mesh = sharding.make_mesh((1, 2, 4))
  assert sharding.logical_to_spec((6, 8), ("kv_heads", "embed"), mesh) == jax.sharding.PartitionSpec(None, "fsdp")
  assert sharding.logical_to_spec((8, 8), ("batch", "q_heads"), mesh) == jax.sharding.PartitionSpec("fsdp", "tensor")
  with pytest.raises(KeyError, match="no rule"):
    sharding.logical_to_spec((8,), ("nonsense",), mesh)


def test_make_mesh_errors_are_clear():
  with pytest.raises(ValueError, match="needs 16 devices"):
    sharding.make_mesh((4, 2, 2))
  with pytest.raises(ValueError, match="at most one -1"):
    sharding.make_mesh((-1, -1, 1))
