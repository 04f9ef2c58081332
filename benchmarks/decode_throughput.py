"""Decode throughput: our jitted sampler vs transformers `generate` (PyTorch CPU), same random Qwen3.

Both sides get the same float32 weights (a random transformers Qwen3ForCausalLM, saved and loaded with
`checkpoint.load_model`), the same prompts, greedy decoding, no stop tokens (every row makes exactly
--new-tokens tokens). Decode tokens/s isolates decoding from prefill:

    decode tok/s = batch * (new_tokens - 1) / (time(new_tokens) - time(1))

where time(n) is the best of --repeats wall-clock runs that generate n tokens per row (prefill included in
both, so it cancels). The end-to-end column is batch * new_tokens / time(new_tokens). JAX compile time is
excluded (a first, untimed run) and printed separately (that first run's wall time, compile included).

    python benchmarks/decode_throughput.py                 # hidden 256, 4 layers, vocab 151936; batch 1 8 32
    python benchmarks/decode_throughput.py --batch-sizes 1 4 --vocab 32768 --new-tokens 32
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32], help="batch sizes to compare")
  p.add_argument("--prompt-len", type=int, default=32, help="prompt tokens per row")
  p.add_argument("--new-tokens", type=int, default=32, help="tokens generated per row")
  p.add_argument("--hidden", type=int, default=256, help="hidden size (embed dim)")
  p.add_argument("--layers", type=int, default=4, help="decoder layers")
  p.add_argument("--heads", type=int, default=4, help="query heads (kv heads = heads // 2)")
  p.add_argument("--head-dim", type=int, default=64, help="head dim")
  p.add_argument("--vocab", type=int, default=151936, help="vocabulary size")
  p.add_argument("--chunk-steps", type=int, default=16, help="sampler decode steps per host round trip")
  p.add_argument("--repeats", type=int, default=2, help="timed runs per measurement (best is kept)")
  p.add_argument("--torch-threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
  return p.parse_args(argv)


def make_models(args, tmp):
  import torch
  import transformers

  from orchestra_jax import checkpoint

  hf_config = transformers.Qwen3Config(
      vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=3 * args.hidden,
      num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=max(1, args.heads // 2),
      head_dim=args.head_dim, tie_word_embeddings=True, max_position_embeddings=4096,
      rope_parameters={"rope_theta": 1e6, "rope_type": "default"})
  torch.manual_seed(0)
  model = transformers.Qwen3ForCausalLM(hf_config).float().eval()
  model.generation_config.eos_token_id = None
  model.save_pretrained(tmp, safe_serialization=True)
  config, params = checkpoint.load_model(tmp)
  return model, config, params


def best_time(fn, repeats):
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return min(times)


def bench_ours(config, params, prompts, new_tokens, chunk_steps, repeats):
  from orchestra_jax.rollout.sampler import Sampler, SamplingParams

  batch = len(prompts)
  max_len = len(prompts[0]) + new_tokens
  sampler = Sampler(config, params, max_len=max_len, batch_size=batch, chunk_steps=chunk_steps, stop_ids=())
  run = lambda n: sampler.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=n))
  t0 = time.perf_counter()
  out = run(new_tokens)  # compiles prefill and decode (first run, not timed)
  compile_s = time.perf_counter() - t0
  assert all(len(r.tokens) == new_tokens for r in out)
  return best_time(lambda: run(1), repeats), best_time(lambda: run(new_tokens), repeats), compile_s, out


def bench_hf(model, prompts, new_tokens, repeats):
  import torch

  ids = torch.tensor(prompts)
  mask = torch.ones_like(ids)

  def run(n):
    with torch.no_grad():
      return model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=n, min_new_tokens=n,
                            pad_token_id=0)

  run(2)  # warm-up
  outs = []
  tn = best_time(lambda: outs.append(run(new_tokens)), repeats)
  return best_time(lambda: run(1), repeats), tn, outs[0]


def main(argv=None):
  args = parse_args(argv)
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  import jax
  import numpy as np
  import torch

  if args.torch_threads:
    torch.set_num_threads(args.torch_threads)
  with tempfile.TemporaryDirectory() as tmp:
    model, config, params = make_models(args, tmp)
  n_params = config.num_params()
  print(f"model: hidden {args.hidden}, {args.layers} layers, {args.heads} heads x {args.head_dim}, vocab {args.vocab}"
        f" ({n_params / 1e6:.1f}M params, float32); prompt {args.prompt_len}, new tokens {args.new_tokens}; "
        f"jax {jax.__version__} on {jax.devices()[0].platform}, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads)")
  header = (f"{'batch':>5} | {'ours decode tok/s':>17} | {'HF decode tok/s':>15} | {'speed-up':>8} | "
            f"{'ours e2e tok/s':>14} | {'HF e2e tok/s':>12} | {'compile s':>9} | {'same tokens':>11}")
  print(header)
  print("-" * len(header))
  rng = np.random.RandomState(0)
  for batch in args.batch_sizes:
    prompts = rng.randint(0, args.vocab, (batch, args.prompt_len)).tolist()
    o1, on, compile_s, ours = bench_ours(config, params, prompts, args.new_tokens, args.chunk_steps, args.repeats)
    h1, hn, hf = bench_hf(model, prompts, args.new_tokens, args.repeats)
    decode = lambda t1, tn: batch * (args.new_tokens - 1) / max(tn - t1, 1e-9)
    ours_tps, hf_tps = decode(o1, on), decode(h1, hn)
    same = sum(r.tokens == row[args.prompt_len:] for r, row in zip(ours, hf.tolist()))
    print(f"{batch:>5} | {ours_tps:>17.1f} | {hf_tps:>15.1f} | {ours_tps / hf_tps:>7.2f}x | "
          f"{batch * args.new_tokens / on:>14.1f} | {batch * args.new_tokens / hn:>12.1f} | {compile_s:>9.1f} | "
          f"{same:>5}/{batch:<5}")


if __name__ == "__main__":
  main()
