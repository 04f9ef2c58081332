"""Forward-pass throughput of the Qwen3 model on this machine, against its measured f32 matmul ceiling.

Prints a table: config, parameters, batch x length, tokens/s, achieved TFLOP/s and the fraction of the
ceiling (model FLOP utilisation). Model FLOPs per token follow the PaLM convention for a forward pass:
2 x (matmul parameters, LM head included) + 4 x layers x length x heads x head_dim (full attention).

    .venv/bin/python benchmarks/forward_throughput.py [--batch 8] [--length 256] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from orchestra_jax.model import qwen3
from orchestra_jax.model.config import ModelConfig, qwen3_100m, tiny


def matmul_ceiling(n: int = 2048, repeats: int = 5) -> float:
  """Best f32 FLOP/s of an n^3 matmul on the default device."""
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
  f = jax.jit(lambda a, b: a @ b)
  f(a, b).block_until_ready()
  best = min(_timed(lambda: f(a, b).block_until_ready()) for _ in range(repeats))
  return 2 * n**3 / best


def _timed(fn) -> float:
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


def forward_flops_per_token(c: ModelConfig, length: int) -> float:
  matmul_params = c.num_params() - c.vocab_size * c.embed_dim * (0 if c.tie_word_embeddings else 1)
  matmul_params -= c.num_layers * (2 * c.embed_dim + 2 * c.head_dim) + c.embed_dim  # norms are not matmuls
  return 2 * matmul_params + 4 * c.num_layers * length * c.num_heads * c.head_dim


def bench(name: str, config: ModelConfig, batch: int, length: int, repeats: int, ceiling: float) -> dict:
  params = qwen3.init_params(config, jax.random.key(0))
  tokens = jnp.asarray(np.random.RandomState(0).randint(0, config.vocab_size, (batch, length)))
  f = jax.jit(lambda p, t: qwen3.forward(config, p, t)[0])
  f(params, tokens).block_until_ready()
  best = min(_timed(lambda: f(params, tokens).block_until_ready()) for _ in range(repeats))
  tokens_per_s = batch * length / best
  flops = forward_flops_per_token(config, length) * tokens_per_s
  return dict(name=name, params=config.num_params(), shape=f"{batch}x{length}", tok_s=tokens_per_s,
              tflops=flops / 1e12, mfu=flops / ceiling)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--batch", type=int, default=8, help="sequences per forward pass (default 8)")
  parser.add_argument("--length", type=int, default=256, help="tokens per sequence (default 256)")
  parser.add_argument("--repeats", type=int, default=3, help="timed repeats; the best is reported (default 3)")
  args = parser.parse_args()

  ceiling = matmul_ceiling()
  rows = [bench(name, cfg, args.batch, args.length, args.repeats, ceiling)
          for name, cfg in (("tiny", tiny()), ("qwen3_100m", qwen3_100m()))]
  print(f"device: {jax.devices()[0].device_kind} x{len(jax.devices())}, "
        f"measured f32 matmul ceiling (2048^3): {ceiling / 1e12:.3f} TFLOP/s")
  print("| config | params | batch x length | tokens/s | TFLOP/s | fraction of ceiling |")
  print("|---|---|---|---|---|---|")
  for r in rows:
    print(f"| {r['name']} | {r['params'] / 1e6:.1f}M | {r['shape']} | {r['tok_s']:,.0f} | {r['tflops']:.3f} "
          f"| {r['mfu']:.1%} |")


if __name__ == "__main__":
  main()
