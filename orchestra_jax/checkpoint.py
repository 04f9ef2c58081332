"""Model checkpoints on disk: our orbax layout, HF directories, and loading either onto a mesh.

Our model checkpoint directory:
    model_config.json   the ModelConfig as JSON
    params/             orbax checkpoint of the params pytree (written atomically by orbax: tmp dir + rename)
    tokenizer files     copied through (tokenizer.json, tokenizer_config.json, ...) when known
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import jax
import numpy as np

from orchestra_jax.errors import UserError
from orchestra_jax.model import qwen3
from orchestra_jax.model.config import ModelConfig
from orchestra_jax.sharding import ShardingConfig

MODEL_CONFIG_FILE = "model_config.json"
PARAMS_DIR = "params"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json",
                   "added_tokens.json", "tokenizer.model", "chat_template.jinja", "chat_template.json")


class CheckpointError(UserError, RuntimeError):
  """A checkpoint directory that is missing, incomplete or does not match its config."""


def is_orchestra_checkpoint(path: str | os.PathLike) -> bool:
  p = Path(path)
  return (p / MODEL_CONFIG_FILE).is_file() and (p / PARAMS_DIR).is_dir()


def is_hf_dir(path: str | os.PathLike) -> bool:
  p = Path(path)
  return (p / "config.json").is_file()


def copy_tokenizer_files(src: str | os.PathLike, dst: str | os.PathLike) -> list[str]:
  """Copies the tokenizer files found in `src` to `dst`; returns their names."""
  copied = []
  for name in TOKENIZER_FILES:
    if (Path(src) / name).is_file():
      shutil.copyfile(Path(src) / name, Path(dst) / name)
      copied.append(name)
  return copied


def save_model(path: str | os.PathLike, config: ModelConfig, params: Any, tokenizer_dir: str | None = None) -> Path:
  """Writes a model checkpoint. Params may be numpy or (sharded) jax arrays; each host writes its shards."""
  import orbax.checkpoint as ocp

  path = Path(path).absolute()
  if (path / PARAMS_DIR).exists():
    raise CheckpointError(f"{path / PARAMS_DIR} already exists; refusing to overwrite a checkpoint")
  path.mkdir(parents=True, exist_ok=True)
  with ocp.StandardCheckpointer() as ckptr:
    ckptr.save(path / PARAMS_DIR, params)
    ckptr.wait_until_finished()
  tmp = path / (MODEL_CONFIG_FILE + ".tmp")
  tmp.write_text(config.to_json())
  os.replace(tmp, path / MODEL_CONFIG_FILE)
  if tokenizer_dir:
    copy_tokenizer_files(tokenizer_dir, path)
  return path


def read_model_config(path: str | os.PathLike) -> ModelConfig:
  p = Path(path)
  if not p.exists():
    raise CheckpointError(f"model directory {p} does not exist")
  if (p / MODEL_CONFIG_FILE).is_file():
    return ModelConfig.from_dict(json.loads((p / MODEL_CONFIG_FILE).read_text()))
  if (p / "config.json").is_file():
    try:
      hf = json.loads((p / "config.json").read_text())
    except json.JSONDecodeError as e:
      raise CheckpointError(f"{p / 'config.json'} is not valid JSON: {e}") from None
    return ModelConfig.from_hf_config(hf)
  raise CheckpointError(f"{p} holds neither {MODEL_CONFIG_FILE} (orchestra checkpoint) nor config.json (HF model)")


def restore_params(path: str | os.PathLike, config: ModelConfig, sharding: ShardingConfig | None = None):
  """Restores our orbax params; with `sharding`, each array is placed on the mesh as it loads."""
  import orbax.checkpoint as ocp

  params_dir = Path(path).absolute() / PARAMS_DIR
  if not params_dir.is_dir():
    raise CheckpointError(f"no params checkpoint at {params_dir}")
  if sharding is None:
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=device),
                          qwen3.abstract_params(config))
  else:
    target = qwen3.abstract_params(config, sharding)
  with ocp.StandardCheckpointer() as ckptr:
    try:
      return ckptr.restore(params_dir, target)
    except (ValueError, KeyError) as e:
      raise CheckpointError(f"checkpoint {params_dir} does not match {path}/{MODEL_CONFIG_FILE}: {e}") from None


def load_model(path: str | os.PathLike, sharding: ShardingConfig | None = None, **config_overrides):
  """(config, params) from our checkpoint or an HF directory, optionally sharded onto a mesh."""
  from orchestra_jax import convert  # convert imports this module

  config = read_model_config(path)
  if config_overrides:
    config = config.replace(**config_overrides)
  if is_orchestra_checkpoint(path):
    return config, restore_params(path, config, sharding)
  host_params = convert.read_hf_params(path, config)
  if sharding is None:
    return config, jax.tree.map(jax.numpy.asarray, host_params)
  shardings = qwen3.param_shardings(config, sharding)
  return config, jax.tree.map(lambda a, s: jax.device_put(a, s), host_params, shardings)


def tree_nbytes(tree: Any) -> int:
  return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))
