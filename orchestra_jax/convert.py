"""`orchestra convert`: HF safetensors <-> orchestra checkpoints, tensor by tensor.

The name map lives beside the model (`model/hf_weights.py`). Both directions stream: HF tensors are read lazily
from memory-mapped safetensors files and written into one preallocated array per param, and the export plans
shards from shapes and writes one shard at a time.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

from orchestra_jax import checkpoint
from orchestra_jax.model.config import ModelConfig
from orchestra_jax.model.hf_weights import ConversionError, hf_tensor_shapes, iter_hf_tensors, read_hf_params



def hf_to_jax(hf_dir: str | os.PathLike, out_dir: str | os.PathLike, param_dtype: str | None = None) -> Path:
  """`orchestra convert hf-to-jax`: an HF Qwen3 directory -> our orbax checkpoint (+ tokenizer files)."""
  hf_dir = Path(hf_dir)
  if not hf_dir.is_dir():
    raise ConversionError(f"HF model directory {hf_dir} does not exist")
  config = checkpoint.read_model_config(hf_dir)
  if param_dtype:
    config = config.replace(param_dtype=param_dtype, dtype=param_dtype)
  params = read_hf_params(hf_dir, config)
  return checkpoint.save_model(out_dir, config, params, tokenizer_dir=str(hf_dir))


# --- ours -> HF ------------------------------------------------------------------------------------------

_SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
               "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_size(text: str | int) -> int:
  """'5GB' -> 5_000_000_000 (decimal units, as transformers uses), '500MiB', or plain bytes."""
  if isinstance(text, int):
    return text
  m = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]*)\s*", str(text))
  if not m or m.group(2).upper() not in _SIZE_UNITS:
    raise ConversionError(f"--max-shard-size {text!r} is not a size like 5GB, 500MB or 1000000")
  return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).upper()])


def plan_shards(config: ModelConfig, max_shard_bytes: int) -> list[list[str]]:
  """Groups HF tensor names, in order, into shards of at most `max_shard_bytes` (a bigger tensor goes alone)."""
  itemsize = np.dtype(config.jnp_param_dtype).itemsize
  shards, current, size = [], [], 0
  for name, shape in hf_tensor_shapes(config).items():
    nbytes = int(np.prod(shape)) * itemsize
    if current and size + nbytes > max_shard_bytes:
      shards.append(current)
      current, size = [], 0
    current.append(name)
    size += nbytes
  if current:
    shards.append(current)
  return shards


def generation_config(config: ModelConfig) -> dict[str, Any]:
  eos = [t for t in (config.eos_token_id, config.pad_token_id) if t is not None]
  return {"bos_token_id": config.bos_token_id, "eos_token_id": sorted(set(eos), key=eos.index),
          "pad_token_id": config.pad_token_id,
          # the installed version, read without importing transformers (~0.5 s)
          "transformers_version": importlib.metadata.version("transformers")}


EXPORT_DTYPES = ("float32", "bfloat16", "float16")


def export_hf(params: Any, config: ModelConfig, out_dir: str | os.PathLike, max_shard_size: str | int = "5GB",
              tokenizer_dir: str | None = None, dtype: str | None = None) -> Path:
  """Writes an HF/vLLM-loadable directory. Peak extra memory: one shard.

  `dtype` (default: config.param_dtype) is the dtype of the written tensors and of config.json's dtype /
  torch_dtype, e.g. bfloat16 for a run trained with float32 master weights. Each tensor is cast as it is written
  (round to nearest even, as `jnp.astype` does), so the full params are never held twice.
  """
  if dtype is not None:
    if dtype not in EXPORT_DTYPES:
      raise ConversionError(f"export dtype must be one of {', '.join(EXPORT_DTYPES)}, got {dtype!r}")
    config = config.replace(param_dtype=dtype)  # what config.json, the shard plan and the tensors follow
  out = Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  shards = plan_shards(config, parse_size(max_shard_size))
  wanted = {name: i for i, shard in enumerate(shards) for name in shard}
  file_names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
  weight_map, total, buffer, current = {}, 0, {}, 0
  for name, tensor in iter_hf_tensors(params, config):
    shard = wanted[name]
    if shard != current:
      save_file(buffer, str(out / file_names[current]), metadata={"format": "pt"})
      buffer, current = {}, shard
    with np.errstate(over="ignore"):  # float16 overflow is reported below, as one line
      cast = tensor.astype(config.jnp_param_dtype, copy=False)
    if cast.dtype == np.float16 and tensor.dtype != np.float16 and (~np.isfinite(cast) & np.isfinite(tensor)).any():
      raise ConversionError(f"tensor {name} has values beyond float16's range (65504); export float32 or bfloat16")
    buffer[name] = cast
    weight_map[name] = file_names[shard]
    total += cast.nbytes  # bytes as written, in the export dtype
  save_file(buffer, str(out / file_names[current]), metadata={"format": "pt"})
  index = {"metadata": {"total_size": total}, "weight_map": weight_map}
  (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
  (out / "config.json").write_text(json.dumps(config.to_hf_config(), indent=2))
  (out / "generation_config.json").write_text(json.dumps(generation_config(config), indent=2))
  copied = checkpoint.copy_tokenizer_files(tokenizer_dir, out) if tokenizer_dir else []
  written = [*file_names, "model.safetensors.index.json", "config.json", "generation_config.json", *copied]
  checkpoint.make_world_readable([out, *(out / name for name in written)])
  return out


def jax_to_hf(ckpt_dir: str | os.PathLike, out_dir: str | os.PathLike, max_shard_size: str | int = "5GB",
              dtype: str | None = None) -> Path:
  """`orchestra convert jax-to-hf`: our checkpoint -> safetensors shards + config for transformers / vLLM.

  `ckpt_dir`: a model checkpoint, or a trained policy: an `orchestra train` step dir WORKDIR/checkpoints/<step> or
  the WORKDIR (its latest step); see `checkpoint.load_model`. `dtype`: of the exported weights (default: the
  checkpoint's param_dtype); see `export_hf`."""
  ckpt_dir = Path(ckpt_dir)
  train = checkpoint.find_train_checkpoint(ckpt_dir)  # CheckpointError, one line, for a broken trainer path
  if train is None and not checkpoint.is_orchestra_checkpoint(ckpt_dir):
    raise ConversionError(
        f"{ckpt_dir} is not an orchestra checkpoint (needs {checkpoint.MODEL_CONFIG_FILE} and "
        f"{checkpoint.PARAMS_DIR}/) nor an orchestra train workdir or step (WORKDIR/checkpoints/<step>)")
  config, params = checkpoint.load_model(train.path if train else ckpt_dir)
  # A run's tokenizer files, if any, sit with its model config in the reference dir.
  tokenizer_dir = train.reference_dir if train else ckpt_dir
  return export_hf(params, config, out_dir, max_shard_size, tokenizer_dir=str(tokenizer_dir), dtype=dtype)
