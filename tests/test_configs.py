"""configs/*.py load, overrides parse by field type, and every mistake is one ConfigFileError line naming the key."""

from pathlib import Path

import ml_collections
import pytest

from orchestra_jax.configs import ConfigFileError, load_config, model_config, split_config_overrides
from orchestra_jax.model.config import ModelConfig, qwen3_8b, tiny

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "configs" / "tiny.py")
BIG = str(ROOT / "configs" / "orchestrator_8b.py")


def _error(overrides, path=TINY) -> str:
  with pytest.raises(ConfigFileError) as info:
    load_config(path, overrides)
  message = str(info.value)
  assert "\n" not in message
  return message


@pytest.mark.parametrize("path, preset", [(TINY, tiny), (BIG, lambda: qwen3_8b(remat="full", param_dtype="float32", dtype="bfloat16"))])
def test_config_files_load(path, preset):
  cfg = load_config(path, [])
  assert isinstance(cfg, ml_collections.ConfigDict)
  assert model_config(cfg) == preset()
  assert set(cfg.model.keys()) == set(ModelConfig.__dataclass_fields__)
  assert isinstance(cfg.mesh.shape, tuple) and len(cfg.mesh.shape) == 3 and cfg.mesh.shape.count(-1) == 1
  assert isinstance(cfg.seed, int) and isinstance(cfg.tokenizer_dir, str)
  assert isinstance(cfg.generate.max_new_tokens, int) and isinstance(cfg.generate.temperature, float)


def test_tiny_model_config_equals_preset():
  assert model_config(load_config(TINY)) == tiny()


def test_overrides_of_each_type_apply():
  cfg = load_config(TINY, [
      "--config.model.num_layers=4",  # int
      "config.generate.temperature=1",  # float given as an int
      "--config.model.tie_word_embeddings", "false",  # bool, two-token form
      "--config.mesh.shape=(2,2,2)",  # tuple as a python literal
      "--config.tokenizer_dir=/tmp/tok",  # str
      "--config.model.rms_norm_eps=1e-5",
  ])
  assert cfg.model.num_layers == 4
  assert cfg.generate.temperature == 1.0 and isinstance(cfg.generate.temperature, float)
  assert cfg.model.tie_word_embeddings is False
  assert cfg.mesh.shape == (2, 2, 2)
  assert cfg.tokenizer_dir == "/tmp/tok"
  m = model_config(cfg)
  assert m == tiny(num_layers=4, tie_word_embeddings=False, rms_norm_eps=1e-5)


@pytest.mark.parametrize("text, expected", [("1,-1,1", (1, -1, 1)), ("[4, 1, 2]", (4, 1, 2)), (" 8 ", (8,))])
def test_tuple_overrides(text, expected):
  assert load_config(TINY, [f"--config.mesh.shape={text}"]).mesh.shape == expected


@pytest.mark.parametrize("text, expected", [("yes", True), ("0", False), ("TRUE", True), ("no", False)])
def test_bool_spellings(text, expected):
  assert load_config(TINY, [f"--config.model.tie_word_embeddings={text}"]).model.tie_word_embeddings is expected


def test_none_field_accepts_none_and_literals(tmp_path):
  path = tmp_path / "with_none.py"
  path.write_text("import ml_collections\n"
                  "def get_config():\n"
                  "  return ml_collections.ConfigDict({'limit': None, 'name': None, 'other': None})\n")
  cfg = load_config(str(path), ["--config.limit=3", "--config.name=abc", "--config.other=none"])
  assert cfg.limit == 3 and cfg.name == "abc" and cfg.other is None


def test_config_is_locked():
  cfg = load_config(TINY)
  with pytest.raises(AttributeError):
    cfg.model.num_layerz = 3


def test_unknown_key_suggests_close_match():
  message = _error(["--config.model.num_layerz=3"])
  assert "'model.num_layerz'" in message and "did you mean 'model.num_layers'" in message
  assert "'modle.num_layers'" in _error(["--config.modle.num_layers=3"])


def test_bad_type_names_key():
  message = _error(["--config.model.num_layers=four"])
  assert message == "bad value for config key 'model.num_layers': expected int, got 'four'"
  assert "'model.rope_theta'" in _error(["--config.model.rope_theta=big"])
  assert "'model.tie_word_embeddings'" in _error(["--config.model.tie_word_embeddings=maybe"])
  assert "'mesh.shape'" in _error(["--config.mesh.shape=(1,"])


def test_bad_nested_path_names_key():
  assert "'model.num_layers.x'" in _error(["--config.model.num_layers.x=1"])
  assert "'model'" in _error(["--config.model=1"])


def test_missing_value_and_bad_prefix():
  assert "'seed'" in _error(["--config.seed"])
  assert "seed=1" in _error(["--seed=1"])


def test_missing_file_and_no_get_config(tmp_path):
  missing = _error([], path="configs/nope.py")
  assert missing.startswith("config file configs/nope.py does not exist (packaged configs, by name: demo, ")
  empty = tmp_path / "empty.py"
  empty.write_text("x = 1\n")
  assert _error([], path=str(empty)) == f"config file {empty} defines no get_config()"
  broken = tmp_path / "broken.py"
  broken.write_text("def get_config(:\n")
  assert str(broken) in _error([], path=str(broken))


def test_invalid_model_config_names_field():
  cfg = load_config(TINY, ["--config.model.num_heads=3"])  # not a multiple of num_kv_heads=2
  with pytest.raises(ConfigFileError, match=r"model\.num_heads") as info:
    model_config(cfg)
  assert "\n" not in str(info.value)
  with pytest.raises(ConfigFileError, match=r"model\.dtype"):
    model_config(load_config(TINY, ["--config.model.dtype=float8"]))


def test_split_config_overrides():
  argv = ["train", "--config", "configs/tiny.py", "--config.seed", "3", "--steps=2", "--config.model.dtype=bfloat16"]
  overrides, rest = split_config_overrides(argv)
  assert overrides == ["--config.seed=3", "--config.model.dtype=bfloat16"]
  assert rest == ["train", "--config", "configs/tiny.py", "--steps=2"]
  cfg = load_config(TINY, overrides)
  assert cfg.seed == 3 and cfg.model.dtype == "bfloat16"
  with pytest.raises(ConfigFileError, match="'seed'"):
    split_config_overrides(["--config.seed"])
