"""RL train-step throughput (`rl.train.make_train_step`) on this machine, against its measured f32 matmul ceiling.

Table 1, one row per model config (`tiny`, `qwen3_100m`, both float32): parameters, batch x length, the best
wall time of one jitted train step (forward + backward + AdamW update, compile excluded), tokens/s, achieved
TFLOP/s and the fraction of the ceiling (model FLOP utilisation, MFU).

* tokens/s counts every position of the [B, T] batch (padding included: the step computes over all of them);
  the "loss tok/s" column counts only the response tokens the loss applies to (response_mask = 1).
* Training FLOPs per token = 3 x forward FLOPs (PaLM convention: backward = 2 x forward; rematerialisation and
  the optimizer update are not counted). Forward FLOPs per token come from `forward_throughput.py`:
  2 x (matmul parameters, LM head included) + 4 x layers x length x heads x head_dim (full attention).
* The ceiling is the best f32 FLOP/s of a 2048^3 matmul measured in the same run (`forward_throughput.py`).

The batch looks like the trainer's (`trainer.build_batch`): rows right-aligned (left padding), each row a
prompt of random length followed by a response of random length; response_mask is 1 on the response tokens
only, old/ref log-probs are random negatives there, advantages are +-1 per row. The default TrainConfig is used
(PPO clip-higher + dual clip, token_mean, KL mse 1e-4 -> ref_logprobs are given, AdamW, grad clip 1.0).

Table 2 (only with --metrics): the time split of a real RL step from a trainer's metrics.jsonl, the mean of
time_rollout_s, time_reward_s and time_update_s (plus time_decode_s and time_tool_wait_s, parts of the rollout,
when present) over the "train" records, and each one's share of their sum.

    .venv/bin/python benchmarks/train_step.py [--batch 8] [--length 256] [--repeats 1]
        [--configs tiny,qwen3_100m] [--metrics runs/demo/metrics.jsonl]

The defaults (8 x 256 tokens, one timed step) keep a CPU run to a few minutes; on an accelerator use e.g.
--batch 16 --repeats 3. The first step (compile included) is reported separately and never timed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from forward_throughput import forward_flops_per_token, matmul_ceiling  # noqa: E402  (sibling benchmark)

from orchestra_jax.model import qwen3  # noqa: E402
from orchestra_jax.model.config import ModelConfig, preset  # noqa: E402
from orchestra_jax.rl.train import TrainConfig, init_train_state, make_train_step  # noqa: E402


def make_batch(config: ModelConfig, batch: int, length: int, seed: int = 0) -> dict[str, np.ndarray]:
  """A right-aligned RL batch: per row a prompt then a response, left padding; mask on the response only."""
  rng = np.random.RandomState(seed)
  b, t = batch, length
  out = {"tokens": np.zeros((b, t), np.int32), "positions": np.zeros((b, t), np.int32),
         "segment_ids": np.zeros((b, t), np.int32), "response_mask": np.zeros((b, t), np.float32),
         "old_logprobs": np.zeros((b, t), np.float32), "ref_logprobs": np.zeros((b, t), np.float32),
         "advantages": np.where(rng.rand(b) < 0.5, -1.0, 1.0).astype(np.float32)}
  for i in range(b):
    resp = rng.randint(max(1, t // 16), max(2, t // 3))  # response: 1/16 .. 1/3 of the row
    prompt = rng.randint(max(1, t // 3), t - resp + 1)  # prompt: the rest, leaving some left padding
    n = prompt + resp
    out["tokens"][i, t - n:] = rng.randint(0, config.vocab_size, n)
    out["positions"][i, t - n:] = np.arange(n)
    out["segment_ids"][i, t - n:] = 1
    out["response_mask"][i, t - resp:] = 1.0
    lp = -rng.exponential(1.0, resp).astype(np.float32)
    out["old_logprobs"][i, t - resp:] = lp
    out["ref_logprobs"][i, t - resp:] = lp + rng.normal(0, 0.05, resp).astype(np.float32)
  return out


def bench(name: str, batch: int, length: int, repeats: int, ceiling: float) -> dict:
  config = preset(name)
  train_config = TrainConfig()
  params = qwen3.init_params(config, jax.random.key(0))
  state = init_train_state(config, params, train_config)
  del params  # the state owns them now (the step donates the state)
  step = make_train_step(config, train_config)
  host = make_batch(config, batch, length)
  device_batch = {k: jnp.asarray(v) for k, v in host.items()}

  start = time.perf_counter()
  state, metrics = step(state, device_batch)  # compile + first step
  jax.block_until_ready((state, metrics))
  first = time.perf_counter() - start
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    state, metrics = step(state, device_batch)
    jax.block_until_ready((state, metrics))
    times.append(time.perf_counter() - start)
  if not np.isfinite(float(metrics["loss"])):
    raise RuntimeError(f"{name}: non-finite loss {float(metrics['loss'])}")
  best = min(times)
  tokens = batch * length
  loss_tokens = float(host["response_mask"].sum())
  train_flops = 3 * forward_flops_per_token(config, length) * tokens
  return dict(name=name, params=config.num_params(), shape=f"{batch}x{length}", step_s=best, first_s=first,
              tok_s=tokens / best, loss_tok_s=loss_tokens / best, loss_frac=loss_tokens / tokens,
              tflops=train_flops / best / 1e12, mfu=train_flops / best / ceiling)


def time_split(path: str) -> tuple[list[tuple[str, float, float, float | None, float | None]], int]:
  """Per key: (key, mean s, share, mean s without the first record, its share) over a metrics.jsonl's train records.

  The first train record of a run includes XLA compilation of the update (and of the sampler), so the split is
  also given without it. Shares are of time_rollout_s + time_reward_s + time_update_s.
  """
  records = []
  with open(path) as f:
    for line in f:
      if line.strip():
        r = json.loads(line)
        if r.get("kind") == "train":
          records.append(r)
  main_keys = ("time_rollout_s", "time_reward_s", "time_update_s")
  records = sorted((r for r in records if all(k in r for k in main_keys)), key=lambda r: r["step"])
  if not records:
    raise SystemExit(f"{path}: no 'train' records with {', '.join(main_keys)}")
  keys = list(main_keys) + [k for k in ("time_decode_s", "time_tool_wait_s") if all(k in r for r in records)]

  def means(recs):
    if not recs:
      return None
    m = {k: float(np.mean([r[k] for r in recs])) for k in keys}
    m["step total"] = sum(m[k] for k in main_keys)
    return m

  everything, later = means(records), means(records[1:])
  rows = []
  for k in keys + ["step total"]:
    rows.append((k, everything[k], everything[k] / everything["step total"],
                 later[k] if later else None, later[k] / later["step total"] if later else None))
  return rows, len(records)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--batch", type=int, default=8, help="rows (turn samples) per train step (default 8)")
  parser.add_argument("--length", type=int, default=256, help="tokens per row (default 256)")
  parser.add_argument("--repeats", type=int, default=1,
                      help="timed steps after the compile step; the best is reported (default 1)")
  parser.add_argument("--configs", default="tiny,qwen3_100m",
                      help="comma-separated model presets (default tiny,qwen3_100m)")
  parser.add_argument("--metrics", default=None,
                      help="a trainer's metrics.jsonl (e.g. runs/demo/metrics.jsonl): also print the mean time "
                           "split of its RL steps")
  args = parser.parse_args()

  wall = time.perf_counter()
  ceiling = matmul_ceiling()
  rows = [bench(name, args.batch, args.length, args.repeats, ceiling) for name in args.configs.split(",")]
  print(f"device: {jax.devices()[0].device_kind} x{len(jax.devices())}, "
        f"measured f32 matmul ceiling (2048^3): {ceiling / 1e12:.3f} TFLOP/s")
  print("train FLOPs/token = 3 x forward FLOPs (PaLM convention); tokens/s counts all B x T positions")
  print("| config | params | batch x length | step s (best) | first step s (compile) | tokens/s | loss tok/s "
        "| TFLOP/s | fraction of ceiling |")
  print("|---|---|---|---|---|---|---|---|---|")
  for r in rows:
    print(f"| {r['name']} | {r['params'] / 1e6:.1f}M | {r['shape']} | {r['step_s']:.3f} | {r['first_s']:.1f} "
          f"| {r['tok_s']:,.0f} | {r['loss_tok_s']:,.0f} ({r['loss_frac']:.0%}) | {r['tflops']:.3f} "
          f"| {r['mfu']:.1%} |")

  if args.metrics:
    split, n = time_split(args.metrics)
    print()
    print(f"RL step time split: mean over {n} train records of {args.metrics}")
    print("| phase | mean s | share of step | mean s without the first record (compile) | share |")
    print("|---|---|---|---|---|")
    for key, secs, share, later, later_share in split:
      label = f"({key}, part of rollout)" if key in ("time_decode_s", "time_tool_wait_s") else key
      rest = f"{later:.3f} | {later_share:.1%}" if later is not None else "- | -"
      print(f"| {label} | {secs:.3f} | {share:.1%} | {rest} |")
  print(f"\n(benchmark wall time {time.perf_counter() - wall:.0f} s)")


if __name__ == "__main__":
  main()
