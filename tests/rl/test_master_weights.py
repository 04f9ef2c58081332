"""float32 master weights with bfloat16 compute: why (bfloat16 params lose AdamW's 1e-6 updates), the precision
check, the sampler's compute-dtype copy, and exporting bfloat16 weights with `convert jax-to-hf --dtype`."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from safetensors import safe_open

from conftest import max_rel_err
from orchestra_jax import checkpoint, cli, convert, rl
from orchestra_jax.model import qwen3
from orchestra_jax.model.config import tiny
from orchestra_jax.rl.optimizer import precision_problem
from orchestra_jax.rollout.compiled import compute_params
from orchestra_jax.rollout.sampler import Sampler, SamplingParams
from orchestra_jax.sharding import ShardingConfig, make_mesh

LR = 1e-6  # the design's learning rate
V, B, T = 256, 2, 8
# Master weights in float32, matmuls in bfloat16.
MASTER = tiny(vocab_size=V, num_layers=1, param_dtype="float32", dtype="bfloat16")


# --- (a) one real train step at lr 1e-6 ---------------------------------------------------------------

def _batch():
  rng = np.random.default_rng(0)
  mask = np.zeros((B, T), np.float32)
  mask[:, 3:] = 1  # the first 3 tokens are the prompt
  # Random weights give near-uniform logits, so old log-probs of log(1/V) keep the ratio inside the clip range;
  # positive advantages give every response token a gradient.
  return {"tokens": rng.integers(0, V, (B, T)).astype(np.int32), "response_mask": mask,
          "advantages": np.array([1.0, 0.5], np.float32),
          "old_logprobs": np.where(mask > 0, -np.log(V), 0).astype(np.float32)}


def _one_step(config, params):
  train = rl.TrainConfig(loss=rl.LossConfig(kl_coef=0.0), optimizer=rl.OptimizerConfig(learning_rate=LR))
  state = rl.init_train_state(config, params, train)
  state, metrics = rl.make_train_step(config, train)(state, rl.shard_batch(_batch(), None))
  assert rl.is_finite(metrics) and float(metrics["grad_norm"]) > 0
  return jax.device_get(state.params)


def test_bf16_params_lose_lr_1e6_updates_and_f32_master_weights_keep_them():
  bf16 = MASTER.replace(param_dtype="bfloat16")
  start = jax.device_get(qwen3.init_params(bf16, jax.random.key(0)))  # bfloat16 values: both runs start equal
  start32 = jax.tree.map(lambda x: np.asarray(x, np.float32), start)

  after = _one_step(bf16, start)
  for (path, before), now in zip(jax.tree_util.tree_leaves_with_path(start), jax.tree.leaves(after), strict=True):
    assert now.dtype == jnp.bfloat16
    b, a = np.asarray(before, np.float32), np.asarray(now, np.float32)
    # AdamW's first step moves each weight by lr (m/sqrt(v) = sign(g)). In bfloat16 that is lost wherever half the
    # spacing between representable values exceeds 1e-6, i.e. |w| >= 2**-11: every weight of a typical size.
    typical = np.abs(b) >= 2.0 ** -11
    np.testing.assert_array_equal(a[typical], b[typical], err_msg=jax.tree_util.keystr(path))
  changed = sum(int((np.asarray(a, np.float32) != np.asarray(b, np.float32)).sum())
                for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(start)))
  assert changed < 0.03 * sum(x.size for x in jax.tree.leaves(start))  # only near-zero weights moved

  after32 = _one_step(MASTER, start32)
  for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
    delta = np.abs(after32["layers"]["attn"][name] - start32["layers"]["attn"][name])
    assert (delta > 0).mean() > 0.9 and np.isclose(delta.max(), LR, rtol=0.05), name  # every weight moved by ~lr
  for name in ("gate_proj", "up_proj", "down_proj"):
    assert (after32["layers"]["mlp"][name] != start32["layers"]["mlp"][name]).mean() > 0.9, name


# --- (b) the precision check --------------------------------------------------------------------------

def test_precision_problem_flags_half_precision_at_small_learning_rates():
  msg = precision_problem("bfloat16", 1e-6)
  assert msg and "\n" not in msg
  for needle in ("model.param_dtype", "train.learning_rate", "model.param_dtype=float32", "model.dtype"):
    assert needle in msg
  assert precision_problem("float16", 1e-6)  # 10 mantissa bits: ulp(0.02) = 1.5e-5, still too coarse
  assert precision_problem("bfloat16", 1e-3) is None
  assert precision_problem("float32", 1e-6) is None
  assert precision_problem("bfloat16", 5e-5) and precision_problem("bfloat16", 1e-4) is None  # edge: 6.1e-5


# --- (c) the sampler's compute-dtype copy ---------------------------------------------------------------

def _sampler_params(config, seed=0):
  """Random params at std 0.2 (so greedy decoding does not just repeat a token) with norm scales that are not
  bfloat16 values, unless `config` stores bfloat16."""
  params = qwen3.init_params(config.replace(param_dtype="float32"), jax.random.key(seed))

  def spread(path, x):
    key = jax.random.fold_in(jax.random.key(seed + 1), hash(jax.tree_util.keystr(path)) % 2**31)
    if path[-1].key == "scale":
      return x + 0.1 * jax.random.normal(key, x.shape)
    return 10.0 * x

  return jax.tree_util.tree_map_with_path(spread, params)


PROMPTS = [[5, 17, 99, 3], [200, 1, 42], [7, 7, 130, 64, 9, 250]]
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8, stop_ids=())
KW = dict(max_len=32, batch_size=2, chunk_steps=4)


def _run(sampler):
  return [(r.tokens, r.logprobs) for r in sampler.generate(PROMPTS, GREEDY)]


def test_sampler_holds_compute_dtype_weights_and_decodes_bit_identically():
  params = _sampler_params(MASTER)
  sampler = Sampler(MASTER, params, **KW)
  held = sampler.params
  for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
    assert held["layers"]["attn"][name].dtype == jnp.bfloat16
  assert held["embedding"].dtype == held["layers"]["mlp"]["down_proj"].dtype == jnp.bfloat16
  # Norm scales stay float32: RMSNorm multiplies by them in float32, so rounding them would change the outputs.
  assert held["final_norm"]["scale"].dtype == held["layers"]["attn"]["q_norm"]["scale"].dtype == jnp.float32
  out = _run(sampler)
  assert len({tuple(t) for t, _ in out}) == 3 and all(len(set(t)) > 2 for t, _ in out)  # not a degenerate test

  # Bit-identical to decoding with the float32 params themselves (the model casts them at use).
  reference = Sampler(MASTER, params, **KW)
  reference.params = params  # bypass the copy
  assert _run(reference) == out

  # Equal to a Sampler built on bfloat16 params (norm scales at their init value 1, which bfloat16 holds exactly).
  params = jax.tree_util.tree_map_with_path(lambda p, x: jnp.ones_like(x) if p[-1].key == "scale" else x, params)
  bf16 = MASTER.replace(param_dtype="bfloat16")
  pre_cast = Sampler(bf16, jax.tree.map(lambda x: x.astype(jnp.bfloat16), params), **KW)
  assert _run(pre_cast) == _run(Sampler(MASTER, params, **KW))


def test_sampler_copy_is_sharded_like_the_params_and_refreshed_by_set_params():
  if len(jax.devices()) < 8:
    pytest.skip("needs 8 devices: run with XLA_FLAGS=--xla_force_host_platform_device_count=8")
  sharding = ShardingConfig(make_mesh((2, 2, 2)))
  params, new = _sampler_params(MASTER), _sampler_params(MASTER, seed=3)
  sampler = Sampler(MASTER, params, sharding=sharding, **KW)
  expected = qwen3.param_shardings(MASTER, sharding)
  for leaf, sh in zip(jax.tree.leaves(sampler.params), jax.tree.leaves(expected)):
    assert leaf.sharding.is_equivalent_to(sh, leaf.ndim)
  sampler.set_params(new)
  assert sampler.params["layers"]["mlp"]["up_proj"].dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(sampler.params["embedding"], np.float32),
                                np.asarray(new["embedding"].astype(jnp.bfloat16), np.float32))
  out = _run(sampler)
  reference = Sampler(MASTER, new, sharding=sharding, **KW)
  reference.params = jax.device_put(new, expected)  # the float32 params themselves, sharded
  assert _run(reference) == out


def test_sampler_keeps_params_as_given_when_dtypes_match_and_casts_only_floats():
  config = MASTER.replace(dtype="float32")
  params = qwen3.init_params(config, jax.random.key(0))
  assert Sampler(config, params, **KW).params is params  # no copy
  tree = {"w": jnp.ones((2, 2), jnp.float32), "ids": jnp.arange(3), "mask": jnp.ones(2, bool),
          "norm": {"scale": jnp.ones(2, jnp.float32)}}
  cast = compute_params(MASTER, tree)
  assert cast["w"].dtype == jnp.bfloat16 and cast["ids"].dtype == tree["ids"].dtype
  assert cast["mask"].dtype == jnp.bool_ and cast["norm"]["scale"].dtype == jnp.float32


# --- (d) convert jax-to-hf --dtype ------------------------------------------------------------------------

def test_convert_dtype_bfloat16_exports_bf16_that_transformers_loads(hf_dirs, tmp_path, capsys):
  model, hf_dir = hf_dirs["untied_gqa2"]  # float32 weights
  convert.hf_to_jax(hf_dir, tmp_path / "ckpt")
  assert checkpoint.read_model_config(tmp_path / "ckpt").param_dtype == "float32"
  assert cli.main(["convert", "jax-to-hf", str(tmp_path / "ckpt"), str(tmp_path / "hf"), "--dtype", "bfloat16"]) == 0

  hf_config = json.loads((tmp_path / "hf" / "config.json").read_text())
  assert hf_config["dtype"] == hf_config["torch_dtype"] == "bfloat16"
  index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
  original, total = dict(model.named_parameters()), 0
  for name in sorted(set(index["weight_map"].values())):
    with safe_open(str(tmp_path / "hf" / name), "pt") as f:
      for key in f.keys():
        tensor = f.get_tensor(key)
        assert tensor.dtype == torch.bfloat16, key
        assert torch.equal(tensor, original[key].detach().to(torch.bfloat16)), key  # round to nearest even
        total += tensor.numel() * 2
  assert index["metadata"]["total_size"] == total

  reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
  assert reloaded.model.embed_tokens.weight.dtype == torch.bfloat16
  tokens = torch.tensor(np.random.RandomState(0).randint(0, model.config.vocab_size, (2, 10)))
  with torch.no_grad():
    got, ref = reloaded(tokens).logits.float().numpy(), model(tokens).logits.numpy()
  assert max_rel_err(got, ref) < 0.05  # bfloat16 weights and compute against the float32 model

  with pytest.raises(SystemExit):
    cli.build_parser().parse_args(["convert", "jax-to-hf", "--help"])
  assert "--dtype" in capsys.readouterr().out


def test_convert_float16_refuses_weights_out_of_range(tmp_path):
  config = tiny(vocab_size=V, num_layers=1)
  params = jax.tree.map(np.array, jax.device_get(qwen3.init_params(config, jax.random.key(0))))  # writable
  params["embedding"][0, 0] = 1e5
  with pytest.raises(convert.ConversionError, match="float16"):
    convert.export_hf(params, config, tmp_path / "hf", dtype="float16")
