"""HF -> orbax -> HF round trips, and the exported layout transformers and vLLM read."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from safetensors import safe_open

from conftest import max_rel_err
from orchestra_jax import checkpoint, convert
from orchestra_jax.model import hf_weights, qwen3

pytestmark = pytest.mark.usefixtures("highest_precision")


@pytest.mark.parametrize("name", ["untied_gqa2", "tied_mha"])
def test_round_trip_loads_in_transformers_with_equal_logits(hf_dirs, tmp_path, name):
  model, hf_dir = hf_dirs[name]
  convert.hf_to_jax(hf_dir, tmp_path / "ckpt")
  assert checkpoint.is_orchestra_checkpoint(tmp_path / "ckpt")
  out = convert.jax_to_hf(tmp_path / "ckpt", tmp_path / "hf")
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32).eval()
  assert type(reloaded).__name__ == "Qwen3ForCausalLM"
  tokens = torch.tensor(np.random.RandomState(0).randint(0, model.config.vocab_size, (2, 10)))
  with torch.no_grad():
    ref, got = model(tokens).logits.numpy(), reloaded(tokens).logits.numpy()
  assert max_rel_err(got, ref) < 1e-6
  # Our model on the orbax checkpoint agrees too.
  config, params = checkpoint.load_model(tmp_path / "ckpt")
  ours, _ = qwen3.forward(config, params, jnp.asarray(tokens.numpy()))
  assert max_rel_err(ours, ref) < 1e-5
  # Tensor names are exactly the ones transformers itself writes (what vLLM's loader expects).
  original = set(json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())["weight_map"])
  with safe_open(f"{hf_dir}/model.safetensors", "numpy") as f:
    assert original == set(f.keys())
  assert out == tmp_path / "hf"


def test_export_shards_index_and_metadata(hf_dirs, tmp_path):
  _, hf_dir = hf_dirs["untied_gqa2"]
  convert.hf_to_jax(hf_dir, tmp_path / "ckpt")
  config = checkpoint.read_model_config(tmp_path / "ckpt")
  max_bytes = 60_000
  convert.jax_to_hf(tmp_path / "ckpt", tmp_path / "hf", max_shard_size=max_bytes)
  index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
  files = sorted(set(index["weight_map"].values()))
  assert len(files) > 2
  assert files[0] == f"model-00001-of-{len(files):05d}.safetensors"
  total = 0
  for name in files:
    path = tmp_path / "hf" / name
    with safe_open(str(path), "numpy") as f:
      assert f.metadata() == {"format": "pt"}
      sizes = [f.get_tensor(k).nbytes for k in f.keys()]
      assert sum(sizes) <= max_bytes or len(sizes) == 1  # a tensor larger than the limit goes alone
      assert all(index["weight_map"][k] == name for k in f.keys())
      total += sum(sizes)
  assert index["metadata"]["total_size"] == total
  hf_config = json.loads((tmp_path / "hf" / "config.json").read_text())
  assert hf_config["architectures"] == ["Qwen3ForCausalLM"] and hf_config["model_type"] == "qwen3"
  assert hf_config["head_dim"] == config.head_dim and hf_config["num_key_value_heads"] == config.num_kv_heads
  gen = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
  assert config.eos_token_id is None or config.eos_token_id in gen["eos_token_id"]


def test_tokenizer_files_are_copied_through(tmp_path):
  from orchestra_jax import tokenizer
  from orchestra_jax.model.config import tiny
  import jax
  config = tiny(num_layers=1)
  params = qwen3.init_params(config, jax.random.key(0))
  checkpoint.save_model(tmp_path / "ckpt", config, params, tokenizer_dir=str(tokenizer.qwen3_tokenizer_dir()))
  convert.jax_to_hf(tmp_path / "ckpt", tmp_path / "hf")
  for name in ("tokenizer.json", "tokenizer_config.json"):
    assert (tmp_path / "hf" / name).read_bytes() == (tokenizer.qwen3_tokenizer_dir() / name).read_bytes()
  tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
  assert tok.convert_tokens_to_ids("<|im_end|>") == 151645


def test_served_files_are_world_readable_whatever_the_umask(tmp_path):
  """vLLM in a container, or a colleague's account, reads what we write: 0644 files, 0755 folders."""
  import os
  import stat
  from orchestra_jax import tokenizer
  from orchestra_jax.model.config import tiny
  import jax
  config = tiny(num_layers=1)
  params = qwen3.init_params(config, jax.random.key(0))
  old = os.umask(0o077)
  try:
    checkpoint.save_model(tmp_path / "ckpt", config, params, tokenizer_dir=str(tokenizer.qwen3_tokenizer_dir()))
    convert.jax_to_hf(tmp_path / "ckpt", tmp_path / "hf", max_shard_size="10MB")
  finally:
    os.umask(old)
  served = sorted((tmp_path / "hf").iterdir())
  assert len([p for p in served if p.suffix == ".safetensors"]) > 1
  assert {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in served} == {p.name: "0o644" for p in served}
  assert stat.S_IMODE((tmp_path / "hf").stat().st_mode) == 0o755
  for name in ("model_config.json", "tokenizer.json"):
    assert stat.S_IMODE((tmp_path / "ckpt" / name).stat().st_mode) == 0o644


def test_bf16_export_keeps_bf16(hf_dirs, tmp_path):
  _, hf_dir = hf_dirs["tied_mha"]
  convert.hf_to_jax(hf_dir, tmp_path / "ckpt", param_dtype="bfloat16")
  convert.jax_to_hf(tmp_path / "ckpt", tmp_path / "hf")
  hf_config = json.loads((tmp_path / "hf" / "config.json").read_text())
  assert hf_config["dtype"] == "bfloat16"
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"))
  assert reloaded.model.embed_tokens.weight.dtype == torch.bfloat16


def test_parse_size():
  assert convert.parse_size("5GB") == 5 * 10**9
  assert convert.parse_size("500MiB") == 500 * 2**20
  assert convert.parse_size("1234") == 1234
  with pytest.raises(convert.ConversionError, match="max-shard-size"):
    convert.parse_size("five gigs")


def test_plan_shards_respects_limit():
  from orchestra_jax.model.config import qwen3_8b
  config = qwen3_8b()
  shards = convert.plan_shards(config, 5 * 10**9)
  shapes = hf_weights.hf_tensor_shapes(config)
  sizes = [sum(int(np.prod(shapes[n])) * 2 for n in shard) for shard in shards]
  assert all(s <= 5 * 10**9 for s in sizes)
  assert sum(sizes) == config.num_params() * 2
  assert len(shards) == 4  # 16.4 GB of bf16 in <= 5 GB shards
