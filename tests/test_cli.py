"""The `orchestra` command line as a user runs it: real subprocesses, real files."""

import json
import subprocess
import sys

import pytest

from hf_reference import random_hf_model, save_hf


def orchestra(*args, timeout=240):
  return subprocess.run([sys.executable, "-m", "orchestra_jax.cli", *map(str, args)], capture_output=True, text=True,
                        timeout=timeout)


def assert_one_line_error(proc, *needles):
  assert proc.returncode == 2, proc.stderr
  assert "Traceback" not in proc.stderr
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert len(lines) == 1, proc.stderr
  for needle in needles:
    assert needle in lines[0], lines[0]


def test_init_random_generate_and_convert_end_to_end(tmp_path):
  ckpt = tmp_path / "tiny"
  proc = orchestra("init-random", "--config", "configs/tiny.py", "--config.model.num_layers=1", "--out", ckpt)
  assert proc.returncode == 0, proc.stderr
  assert json.loads((ckpt / "model_config.json").read_text())["num_layers"] == 1
  proc = orchestra("generate", "--model", ckpt, "--prompt", "What is 17 * 23?", "--chat", "--max-new-tokens", "5")
  assert proc.returncode == 0, proc.stderr
  assert "generated" in proc.stderr and "prompt tokens" in proc.stderr
  proc = orchestra("convert", "jax-to-hf", ckpt, tmp_path / "hf", "--max-shard-size", "20MB")
  assert proc.returncode == 0, proc.stderr
  index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
  assert len(set(index["weight_map"].values())) >= 2  # 39 MB of f32 in <= 20 MB shards
  proc = orchestra("convert", "hf-to-jax", tmp_path / "hf", tmp_path / "back")
  assert proc.returncode == 0, proc.stderr
  # Greedy generation from the HF export equals generation from the original checkpoint.
  a = orchestra("generate", "--model", ckpt, "--prompt", "hello", "--max-new-tokens", "6")
  b = orchestra("generate", "--model", tmp_path / "hf", "--prompt", "hello", "--max-new-tokens", "6")
  assert a.returncode == b.returncode == 0 and a.stdout == b.stdout


def test_missing_model_dir():
  assert_one_line_error(orchestra("generate", "--model", "/no/such/dir", "--prompt", "hi"), "/no/such/dir")


def test_missing_checkpoint_for_export(tmp_path):
  assert_one_line_error(orchestra("convert", "jax-to-hf", tmp_path / "empty", tmp_path / "out"), "not an orchestra")


def test_non_qwen3_config_json(tmp_path):
  (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
  assert_one_line_error(orchestra("convert", "hf-to-jax", tmp_path, tmp_path / "out"), "llama", "Qwen3")


def test_wrong_shaped_tensor(tmp_path):
  path = save_hf(random_hf_model("untied_gqa2"), tmp_path / "hf")
  config = json.loads((tmp_path / "hf" / "config.json").read_text())
  config["intermediate_size"] += 4
  (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
  assert_one_line_error(orchestra("convert", "hf-to-jax", path, tmp_path / "out"),
                        "model.layers.0.mlp.gate_proj.weight", "(96, 64)", "(100, 64)")


@pytest.mark.parametrize("override,needles", [
    ("--config.model.num_layerz=3", ("model.num_layerz", "did you mean 'model.num_layers'")),
    ("--config.model.num_layers=four", ("model.num_layers", "four")),
    ("--config.model.num_heads=3", ("model.num_heads",)),
])
def test_bad_config_is_one_line_naming_the_key(tmp_path, override, needles):
  assert_one_line_error(orchestra("init-random", override, "--out", tmp_path / "x"), *needles)


def test_help_explains_every_option():
  for args in (["--help"], ["convert", "hf-to-jax", "--help"], ["convert", "jax-to-hf", "--help"],
               ["generate", "--help"], ["init-random", "--help"]):
    proc = orchestra(*args)
    assert proc.returncode == 0 and "usage: orchestra" in proc.stdout
  gen_help = orchestra("generate", "--help").stdout
  for option in ("--model", "--prompt", "--max-new-tokens", "--temperature", "--chat", "--seed", "--tokenizer"):
    assert option in gen_help
