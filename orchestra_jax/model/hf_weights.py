"""The Hugging Face weight table of our Qwen3: HF tensor names <-> our param paths, read tensor by tensor.

`_LAYER_WEIGHTS` is the one name map: HF name suffix, our param path, and how the HF [out, in] matrix becomes our
[in, heads, head_dim]-style kernel (and back). `read_hf_params` streams HF safetensors (memory-mapped) into one
preallocated array per param; `iter_hf_tensors` yields our params as HF tensors for the export
(`orchestra_jax.convert`). It sits beside the model so that loading an HF directory (`checkpoint.load_model`)
needs no command module.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Callable, Iterator

import jax
import numpy as np
from safetensors import safe_open

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
