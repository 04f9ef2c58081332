"""HF safetensors <-> orchestra params, tensor by tensor.

The name map is one table (`_LAYER_WEIGHTS`): HF name suffix, our param path, and how the HF
[out, in] matrix becomes our [in, heads, head_dim]-style kernel. Both directions stream: HF tensors are read
lazily from memory-mapped safetensors files and written into one preallocated array per param, and the export
plans shards from shapes and writes one shard at a time.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Callable, Iterator

import jax
import numpy as np

from orchestra_jax import checkpoint
from orchestra_jax.errors import UserError
from orchestra_jax.model import qwen3
from orchestra_jax.model.config import ModelConfig


class ConversionError(UserError, RuntimeError):
  """An HF directory or checkpoint that cannot be converted; the message names the file or tensor."""


# (HF suffix under model.layers.{i}., our path under params["layers"], to_ours(hf [out, in], config), from_ours)
def _to_heads(heads_attr: str) -> Callable:
  return lambda w, c: w.T.reshape(c.embed_dim, getattr(c, heads_attr), c.head_dim)  # [D, heads, H]


def _from_heads(w: np.ndarray, c: ModelConfig) -> np.ndarray:
  return w.reshape(c.embed_dim, -1).T  # [heads*H, D]


def _same(w, c):
  return w


def _transpose(w, c):
  return w.T


_LAYER_WEIGHTS = (
    ("self_attn.q_proj.weight", ("attn", "q_proj"), _to_heads("num_heads"), _from_heads),
    ("self_attn.k_proj.weight", ("attn", "k_proj"), _to_heads("num_kv_heads"), _from_heads),
    ("self_attn.v_proj.weight", ("attn", "v_proj"), _to_heads("num_kv_heads"), _from_heads),
    ("self_attn.o_proj.weight", ("attn", "o_proj"),
     lambda w, c: w.T.reshape(c.num_heads, c.head_dim, c.embed_dim),  # [N, H, D]
     lambda w, c: w.reshape(-1, c.embed_dim).T),  # [D, N*H]
    ("self_attn.q_norm.weight", ("attn", "q_norm", "scale"), _same, _same),
    ("self_attn.k_norm.weight", ("attn", "k_norm", "scale"), _same, _same),
    ("mlp.gate_proj.weight", ("mlp", "gate_proj"), _transpose, _transpose),
    ("mlp.up_proj.weight", ("mlp", "up_proj"), _transpose, _transpose),
    ("mlp.down_proj.weight", ("mlp", "down_proj"), _transpose, _transpose),
    ("input_layernorm.weight", ("input_norm", "scale"), _same, _same),
    ("post_attention_layernorm.weight", ("post_attn_norm", "scale"), _same, _same),
)


def hf_tensor_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
  """Every HF tensor name of this config with its [out, in] shape, in file order."""
  c = config
  d, h = c.embed_dim, c.head_dim
  per_layer = {
      "self_attn.q_proj.weight": (c.num_heads * h, d),
      "self_attn.k_proj.weight": (c.num_kv_heads * h, d),
      "self_attn.v_proj.weight": (c.num_kv_heads * h, d),
      "self_attn.o_proj.weight": (d, c.num_heads * h),
      "self_attn.q_norm.weight": (h,),
      "self_attn.k_norm.weight": (h,),
      "mlp.gate_proj.weight": (c.mlp_dim, d),
      "mlp.up_proj.weight": (c.mlp_dim, d),
      "mlp.down_proj.weight": (d, c.mlp_dim),
      "input_layernorm.weight": (d,),
      "post_attention_layernorm.weight": (d,),
  }
  shapes = {"model.embed_tokens.weight": (c.vocab_size, d)}
  for i in range(c.num_layers):
    for suffix, _, _, _ in _LAYER_WEIGHTS:
      shapes[f"model.layers.{i}.{suffix}"] = per_layer[suffix]
  shapes["model.norm.weight"] = (d,)
  if not c.tie_word_embeddings:
    shapes["lm_head.weight"] = (c.vocab_size, d)
  return shapes


# --- HF -> ours ------------------------------------------------------------------------------------------

class _SafetensorsReader:
  """Lazy, memory-mapped access to the tensors of an HF directory (single file or index + shards)."""

  def __init__(self, hf_dir: Path):
    from safetensors import safe_open

    index = hf_dir / "model.safetensors.index.json"
    if index.is_file():
      weight_map = json.loads(index.read_text())["weight_map"]
      files = sorted(set(weight_map.values()))
    else:
      files = sorted(p.name for p in hf_dir.glob("*.safetensors"))
      if not files:
        raise ConversionError(f"{hf_dir} has config.json but no *.safetensors weights")
      weight_map = None
    self._handles = {}
    for name in files:
      if not (hf_dir / name).is_file():
        raise ConversionError(f"{hf_dir / name} is listed in the index but missing")
      self._handles[name] = safe_open(str(hf_dir / name), framework="numpy")
    if weight_map is None:
      weight_map = {k: f for f, h in self._handles.items() for k in h.keys()}
    self.weight_map = weight_map
    self.hf_dir = hf_dir

  def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
    if name not in self.weight_map:
      raise ConversionError(f"tensor {name} is missing from {self.hf_dir}")
    tensor = self._handles[self.weight_map[name]].get_tensor(name)
    if tuple(tensor.shape) != tuple(shape):
      raise ConversionError(
          f"tensor {name} has shape {tuple(tensor.shape)}, but config.json implies {tuple(shape)}")
    return tensor


def read_hf_params(hf_dir: str | os.PathLike, config: ModelConfig) -> dict[str, Any]:
  """Our params pytree as host numpy arrays (param_dtype), read tensor by tensor.

  Peak host memory: one copy of the params plus one HF tensor (the files are memory-mapped).
  """
  hf_dir = Path(hf_dir)
  reader = _SafetensorsReader(hf_dir)
  shapes = hf_tensor_shapes(config)
  dtype = np.dtype(config.jnp_param_dtype)
  ours = jax.tree.map(lambda s: np.empty(s.shape, dtype), qwen3.abstract_params(config))

  ours["embedding"][...] = reader.get("model.embed_tokens.weight", shapes["model.embed_tokens.weight"])
  ours["final_norm"]["scale"][...] = reader.get("model.norm.weight", shapes["model.norm.weight"])
  if not config.tie_word_embeddings:
    ours["lm_head"][...] = reader.get("lm_head.weight", shapes["lm_head.weight"]).T
  for i in range(config.num_layers):
    for suffix, path, to_ours, _ in _LAYER_WEIGHTS:
      name = f"model.layers.{i}.{suffix}"
      target = ours["layers"]
      for key in path:
        target = target[key]
      target[i] = to_ours(reader.get(name, shapes[name]), config)
  unused = sorted(set(reader.weight_map) - set(shapes) - {"lm_head.weight"})
  unused = [n for n in unused if not re.search(r"rotary_emb\.inv_freq$", n)]
  if unused:
    raise ConversionError(f"{hf_dir} has tensors a Qwen3 model does not use: {', '.join(unused[:5])}")
  return ours


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

def iter_hf_tensors(params: Any, config: ModelConfig) -> Iterator[tuple[str, np.ndarray]]:
  """(HF name, [out, in] numpy tensor) one at a time, in HF file order."""
  host = lambda x: np.asarray(jax.device_get(x))
  yield "model.embed_tokens.weight", host(params["embedding"])
  for i in range(config.num_layers):
    for suffix, path, _, from_ours in _LAYER_WEIGHTS:
      leaf = params["layers"]
      for key in path:
        leaf = leaf[key]
      yield f"model.layers.{i}.{suffix}", np.ascontiguousarray(from_ours(host(leaf[i]), config))
  yield "model.norm.weight", host(params["final_norm"]["scale"])
  if not config.tie_word_embeddings:
    yield "lm_head.weight", np.ascontiguousarray(host(params["lm_head"]).T)


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
  import transformers
  return {"bos_token_id": config.bos_token_id, "eos_token_id": sorted(set(eos), key=eos.index),
          "pad_token_id": config.pad_token_id, "transformers_version": transformers.__version__}


EXPORT_DTYPES = ("float32", "bfloat16", "float16")


def export_hf(params: Any, config: ModelConfig, out_dir: str | os.PathLike, max_shard_size: str | int = "5GB",
              tokenizer_dir: str | None = None, dtype: str | None = None) -> Path:
  """Writes an HF/vLLM-loadable directory. Peak extra memory: one shard.

  `dtype` (default: config.param_dtype) is the dtype of the written tensors and of config.json's dtype /
  torch_dtype, e.g. bfloat16 for a run trained with float32 master weights. Each tensor is cast as it is written
  (round to nearest even, as `jnp.astype` does), so the full params are never held twice.
  """
  from safetensors.numpy import save_file

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
