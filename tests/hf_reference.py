"""Random transformers Qwen3 models: the reference every parity test compares against."""

from __future__ import annotations

import torch
import transformers

SMALL_CONFIGS = {
    # name: Qwen3Config kwargs. Cover tied/untied, head_dim != hidden/heads, GQA group 1 and > 1.
    "untied_gqa2": dict(vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=24, tie_word_embeddings=False),
    "tied_mha": dict(vocab_size=256, hidden_size=48, intermediate_size=80, num_hidden_layers=3,
                     num_attention_heads=4, num_key_value_heads=4, head_dim=12, tie_word_embeddings=True),
    "untied_gqa4_wide_heads": dict(vocab_size=288, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=8, num_key_value_heads=2, head_dim=16,
                                   tie_word_embeddings=False),
}


def random_hf_model(name_or_kwargs, seed: int = 0, std: float = 0.2, rope_theta: float = 10000.0
                    ) -> transformers.Qwen3ForCausalLM:
  """A float32 Qwen3ForCausalLM with weights ~ N(0, std) and norm scales ~ 1 + N(0, std)."""
  kwargs = SMALL_CONFIGS[name_or_kwargs] if isinstance(name_or_kwargs, str) else dict(name_or_kwargs)
  config = transformers.Qwen3Config(rope_parameters={"rope_theta": rope_theta, "rope_type": "default"},
                                    max_position_embeddings=512, **kwargs)
  torch.manual_seed(seed)
  model = transformers.Qwen3ForCausalLM(config).float().eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        p.copy_(1.0 + std * torch.randn_like(p))
      else:
        p.normal_(0.0, std)
  return model


def save_hf(model, path) -> str:
  model.save_pretrained(str(path), safe_serialization=True)
  return str(path)
