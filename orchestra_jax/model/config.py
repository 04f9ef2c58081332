"""`ModelConfig`: the one description of a Qwen3 decoder, with named presets and HF conversion."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import jax.numpy as jnp

from orchestra_jax.errors import UserError

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


class ConfigError(UserError, ValueError):
  """A model configuration that cannot describe a Qwen3 decoder; the message names the field."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shapes and numerics of a Qwen3 decoder (transformers' `Qwen3ForCausalLM`)."""

  vocab_size: int
  embed_dim: int  # D, HF hidden_size
  mlp_dim: int  # F, HF intermediate_size
  num_layers: int  # L
  num_heads: int  # N query heads
  num_kv_heads: int  # K key/value heads; N % K == 0 (GQA group N // K)
  head_dim: int  # H; need not equal D // N
  rope_theta: float = 1_000_000.0
  rms_norm_eps: float = 1e-6
  max_position_embeddings: int = 40960
  tie_word_embeddings: bool = False
  param_dtype: str = "bfloat16"  # storage dtype of the weights
  dtype: str = "bfloat16"  # activation / matmul dtype
  remat: str = "none"  # per-layer rematerialisation: none | full | dots
  bos_token_id: int | None = 151643
  eos_token_id: int | None = 151645
  pad_token_id: int | None = 151643

  def __post_init__(self):
    for name in ("vocab_size", "embed_dim", "mlp_dim", "num_layers", "num_heads", "num_kv_heads", "head_dim"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"model.{name} must be a positive integer, got {value!r}")
    if self.num_heads % self.num_kv_heads:
      raise ConfigError(
          f"model.num_heads ({self.num_heads}) must be a multiple of model.num_kv_heads ({self.num_kv_heads})")
    if self.head_dim % 2:
      raise ConfigError(f"model.head_dim must be even for rotary embeddings, got {self.head_dim}")
    for name in ("param_dtype", "dtype"):
      if getattr(self, name) not in _DTYPES:
        raise ConfigError(f"model.{name} must be one of {sorted(_DTYPES)}, got {getattr(self, name)!r}")
    if self.remat not in ("none", "full", "dots"):
      raise ConfigError(f"model.remat must be one of none, full, dots; got {self.remat!r}")
    if not self.rope_theta > 0:
      raise ConfigError(f"model.rope_theta must be positive, got {self.rope_theta!r}")

  # --- derived -------------------------------------------------------------------------------------
  @property
  def jnp_dtype(self):
    return _DTYPES[self.dtype]

  @property
  def jnp_param_dtype(self):
    return _DTYPES[self.param_dtype]

  def replace(self, **changes) -> "ModelConfig":
    return dataclasses.replace(self, **changes)

  def num_params(self) -> int:
    """Parameter count from the shapes alone (tests check it against `jax.eval_shape`)."""
    d, h = self.embed_dim, self.head_dim
    attn = d * h * (2 * self.num_heads + 2 * self.num_kv_heads) + 2 * h
    per_layer = attn + 3 * d * self.mlp_dim + 2 * d
    head = 0 if self.tie_word_embeddings else self.vocab_size * d
    return self.vocab_size * d + self.num_layers * per_layer + d + head

  # --- (de)serialisation ---------------------------------------------------------------------------
  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, data: dict[str, Any]) -> "ModelConfig":
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
      raise ConfigError(f"unknown model config key(s): {', '.join('model.' + k for k in unknown)}")
    return cls(**data)

  def to_json(self) -> str:
    return json.dumps(self.to_dict(), indent=2, sort_keys=True)

  @classmethod
  def from_hf_config(cls, hf: dict[str, Any] | Any, **overrides) -> "ModelConfig":
    """Builds a config from a transformers `Qwen3Config` or its `config.json` dict."""
    if not isinstance(hf, dict):
      hf = hf.to_dict()
    model_type = hf.get("model_type")
    archs = hf.get("architectures") or []
    if model_type != "qwen3" or (archs and "Qwen3ForCausalLM" not in archs):
      raise ConfigError(
          f"config.json describes model_type={model_type!r} architectures={archs!r}; "
          "orchestra-jax reads only Qwen3 (model_type 'qwen3', Qwen3ForCausalLM)")
    if hf.get("attention_bias"):
      raise ConfigError("config.json has attention_bias=true; Qwen3 checkpoints have no attention biases")
    if hf.get("use_sliding_window"):
      raise ConfigError("config.json has use_sliding_window=true; sliding-window attention is not supported")
    if hf.get("hidden_act", "silu") != "silu":
      raise ConfigError(f"config.json hidden_act={hf.get('hidden_act')!r}; Qwen3 uses 'silu'")
    rope = hf.get("rope_parameters") or {}
    rope_type = rope.get("rope_type", "default")
    if rope_type != "default":
      raise ConfigError(f"config.json rope_type={rope_type!r}; only 'default' RoPE is supported")
    theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
    heads = hf["num_attention_heads"]
    dtype = str(hf.get("dtype") or hf.get("torch_dtype") or "bfloat16").replace("torch.", "")
    dtype = dtype if dtype in _DTYPES else "bfloat16"
    eos = hf.get("eos_token_id")
    kwargs = dict(
        vocab_size=hf["vocab_size"],
        embed_dim=hf["hidden_size"],
        mlp_dim=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        rope_theta=float(theta),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=hf.get("max_position_embeddings", 40960),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        param_dtype=dtype,
        dtype=dtype,
        bos_token_id=hf.get("bos_token_id"),
        eos_token_id=eos[0] if isinstance(eos, list) else eos,
        pad_token_id=hf.get("pad_token_id"),
    )
    kwargs.update(overrides)
    return cls(**kwargs)

  def to_hf_config(self) -> dict[str, Any]:
    """The `config.json` dict transformers and vLLM read for this model."""
    import transformers  # noqa: PLC0415  late: ~0.5 s to import; only the HF export needs it

    hf = transformers.Qwen3Config(
        vocab_size=self.vocab_size,
        hidden_size=self.embed_dim,
        intermediate_size=self.mlp_dim,
        num_hidden_layers=self.num_layers,
        num_attention_heads=self.num_heads,
        num_key_value_heads=self.num_kv_heads,
        head_dim=self.head_dim,
        hidden_act="silu",
        max_position_embeddings=self.max_position_embeddings,
        rms_norm_eps=self.rms_norm_eps,
        tie_word_embeddings=self.tie_word_embeddings,
        rope_parameters={"rope_theta": self.rope_theta, "rope_type": "default"},
        attention_bias=False,
        bos_token_id=self.bos_token_id,
        eos_token_id=self.eos_token_id,
        pad_token_id=self.pad_token_id,
    ).to_dict()
    hf["architectures"] = ["Qwen3ForCausalLM"]
    hf["dtype"] = self.param_dtype
    hf["torch_dtype"] = self.param_dtype  # older readers (vLLM < 0.11, transformers 4.x)
    hf["rope_theta"] = self.rope_theta  # older readers look for it at top level
    return hf


# --- presets -----------------------------------------------------------------------------------------

def qwen3_8b(**overrides) -> ModelConfig:
  """Qwen3-8B, the orchestrator's architecture (8.19B parameters)."""
  return ModelConfig(vocab_size=151936, embed_dim=4096, mlp_dim=12288, num_layers=36, num_heads=32,
                     num_kv_heads=8, head_dim=128, rope_theta=1e6, max_position_embeddings=40960,
                     tie_word_embeddings=False).replace(**overrides)


def qwen3_0_6b(**overrides) -> ModelConfig:
  """Qwen3-0.6B (tied embeddings)."""
  return ModelConfig(vocab_size=151936, embed_dim=1024, mlp_dim=3072, num_layers=28, num_heads=16,
                     num_kv_heads=8, head_dim=128, rope_theta=1e6, max_position_embeddings=40960,
                     tie_word_embeddings=True).replace(**overrides)


def qwen3_100m(**overrides) -> ModelConfig:
  """A ~100M-parameter Qwen3 for CPU benchmarks and demos that want more than `tiny`."""
  return ModelConfig(vocab_size=151936, embed_dim=512, mlp_dim=1536, num_layers=8, num_heads=8,
                     num_kv_heads=4, head_dim=64, tie_word_embeddings=True, param_dtype="float32",
                     dtype="float32").replace(**overrides)


def tiny(**overrides) -> ModelConfig:
  """A few-MB random model with the real Qwen3 vocabulary: tests, demos, CPU runs."""
  return ModelConfig(vocab_size=151936, embed_dim=64, mlp_dim=128, num_layers=2, num_heads=4,
                     num_kv_heads=2, head_dim=32, rope_theta=1e6, max_position_embeddings=4096,
                     tie_word_embeddings=True, param_dtype="float32", dtype="float32").replace(**overrides)


PRESETS = {"qwen3_8b": qwen3_8b, "qwen3_0_6b": qwen3_0_6b, "qwen3_100m": qwen3_100m, "tiny": tiny}


def preset(name: str, **overrides) -> ModelConfig:
  if name not in PRESETS:
    raise ConfigError(f"unknown model preset {name!r}; known: {', '.join(sorted(PRESETS))}")
  return PRESETS[name](**overrides)
