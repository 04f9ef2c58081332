"""Tool latency vs decoding in the multi-turn agent loop (`AgentLoop`): how much of the tool time is hidden.

A tiny Qwen3 is first overfit (supervised, a minute or two on CPU) to emit the scripted tool-calling turns of
`tests/scripted_policy.py`: turn 1 calls `add` (which sleeps `--sleeps` seconds), turn 2 calls `answer`. Then,
for every (tool sleep, batch size) cell, greedy rollouts run through the real sampler, tokenizer, parser and
tool thread pool, with the tasks repeated to fill the batch (one task per row; `--staggered`: see `_fill`), and
the loop's `RolloutStats` are printed:

* wall s: the whole `AgentLoop.run`;
* decode s: time inside `Sampler.step()` (prefills + decode chunks);
* blocked s: time the loop sat waiting on tool futures because no row had anything to decode;
* tool sum s: the summed wall time of every tool call;
* overlap = 1 - blocked / tool sum: the share of tool time that did not stall the loop (it ran while other
  rows decoded or while other tools ran). One row cannot hide anything, so expect ~0 there;
* serial s = decode + tool sum: what a loop that ran tools one at a time, never alongside decoding, would
  take; speedup = serial / wall.

Each batch size is compiled first by one untimed warm-up rollout (with tools that do not sleep), so no cell
pays for XLA compilation.

`scripted_policy` lives in the repository's `tests/` directory, not in the package: this script puts that
directory on `sys.path` (from its own location) before importing it, so run it from a repository checkout:

    .venv/bin/python benchmarks/rollout_overlap.py [--sleeps 0,0.2,0.5] [--batches 1,4,8] [--train-steps 400]
        [--staggered]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

TESTS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
sys.path.insert(0, TESTS_DIR)

import scripted_policy  # noqa: E402  (tests/scripted_policy.py, via TESTS_DIR above)
from orchestra_jax import tokenizer as tokenizer_lib  # noqa: E402
from orchestra_jax.rollout.agent_loop import AgentLoop, RolloutConfig  # noqa: E402
from orchestra_jax.rollout.sampler import Sampler  # noqa: E402

MAX_LEN = 512
MAX_NEW_TOKENS = 48


def _floats(text: str) -> list[float]:
  return [float(x) for x in text.split(",") if x.strip()]


def _ints(text: str) -> list[int]:
  return [int(x) for x in text.split(",") if x.strip()]


def _fill(batch: int, staggered: bool = False) -> list[dict]:
  """The tasks for `batch` rows.

  Default: one task per row, the well-formed scripts (each: one sleeping `add` call, then `answer`) repeated.
  Greedy rows with the same prompt lengths reach their tool calls in the same decode step, so the tools of all
  rows run at once and the loop then has nothing to decode: the hidden tool time is tools overlapping *other
  tools*. `staggered`: 3 tasks per row, including the malformed script (its row gets the parser's error at once
  and never sleeps), so rows finish at different steps, freed slots take pending tasks, and rows decode while
  others wait on their tools: tools overlapping *decoding*.
  """
  base = scripted_policy.tasks()
  if not staggered:
    base = [t for t in base if scripted_policy.SCRIPTS[t["question"]][1] is not None]
  n = 3 * batch if staggered else batch
  return [dict(base[i % len(base)], id=f"{base[i % len(base)]['id']}-{i}") for i in range(n)]


def run_cell(policy, tok, sampler: Sampler, batch: int, sleep_s: float, staggered: bool = False) -> dict:
  config = RolloutConfig(temperature=0.0, max_new_tokens=MAX_NEW_TOKENS, mode="extend",
                         tool_workers=max(16, batch))
  loop = AgentLoop(sampler, tok, scripted_policy.make_env(sleep_s), config)
  tasks = _fill(batch, staggered)
  trajs = loop.run(tasks)
  s = loop.stats
  serial = s.decode_s + s.tool_busy_s
  return {
      "rows": batch, "tasks": len(tasks), "sleep_s": sleep_s, "calls": s.tool_calls, "turns": s.turns,
      "answered": sum(t.finish_reason == "answer" for t in trajs),
      "wall_s": s.wall_s, "decode_s": s.decode_s, "blocked_s": s.tool_wait_s, "tool_sum_s": s.tool_busy_s,
      # undefined ("-") when the tools take next to no time (under 50 ms in all): a ratio of milliseconds is noise
      "overlap": 1 - s.tool_wait_s / s.tool_busy_s if s.tool_busy_s > 0.05 else None,
      "serial_s": serial, "speedup": serial / s.wall_s if s.wall_s else None,
  }


def _print_table(rows: list[dict]) -> None:
  head = (f"{'rows':>4} {'sleep s':>7} {'calls':>5} {'ok':>7} {'wall s':>7} {'decode s':>8} {'blocked s':>9} "
          f"{'tool sum s':>10} {'overlap':>7} {'serial s':>8} {'speedup':>7}")
  print(head)
  print("-" * len(head))
  for r in rows:
    overlap = f"{round(r['overlap'], 2) + 0.0:7.0%}" if r["overlap"] is not None else f"{'-':>7}"
    print(f"{r['rows']:>4} {r['sleep_s']:>7.2f} {r['calls']:>5} {r['answered']:>3}/{r['tasks']:<3} "
          f"{r['wall_s']:>7.2f} {r['decode_s']:>8.2f} {r['blocked_s']:>9.2f} {r['tool_sum_s']:>10.2f} {overlap} "
          f"{r['serial_s']:>8.2f} {r['speedup']:>6.2f}x")


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
      description=__doc__.split("\n\n")[0],
      epilog="Columns: blocked s = loop waiting on tools with nothing to decode; tool sum s = summed tool-call time; "
             "overlap = 1 - blocked / tool sum; serial s = decode s + tool sum s (no overlap at all); "
             "speedup = serial / wall. 'ok' = tasks that reached the answer tool / tasks. scripted_policy is imported "
             f"from {TESTS_DIR} (added to sys.path).",
      formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--sleeps", type=_floats, default=[0.0, 0.2, 0.5],
                      help="comma-separated seconds each `add` tool call sleeps (default: 0,0.2,0.5)")
  parser.add_argument("--batches", type=_ints, default=[1, 4, 8],
                      help="comma-separated batch sizes = sampler rows; tasks are repeated to fill them (default: 1,4,8)")
  parser.add_argument("--train-steps", type=int, default=400,
                      help="max supervised steps to overfit the scripted policy (stops early at loss < 2e-3; default 400)")
  parser.add_argument("--staggered", action="store_true",
                      help="3 tasks per row, including the malformed script, so rows fall out of step and decode "
                           "while other rows wait on tools (default: one well-formed task per row, all rows in step)")
  args = parser.parse_args(argv)

  start = time.perf_counter()
  tok = tokenizer_lib.load_tokenizer(None)
  t0 = time.perf_counter()
  policy = scripted_policy.train_policy(tok, steps=args.train_steps)
  print(f"trained scripted policy in {time.perf_counter() - t0:.1f}s (final loss {policy.final_loss:.2e})")
  if policy.final_loss > 0.05:
    print("warning: the policy did not learn its scripts; rows may not call tools (see the 'ok' column)")

  results = []
  for batch in args.batches:
    sampler = Sampler(policy.config, policy.params, max_len=MAX_LEN, batch_size=batch, chunk_steps=8)
    t0 = time.perf_counter()
    run_cell(policy, tok, sampler, batch, 0.0, args.staggered)  # warm-up: compile this batch size's prefill/decode variants
    print(f"batch {batch}: warm-up (compile) {time.perf_counter() - t0:.1f}s", flush=True)
    for sleep_s in args.sleeps:
      results.append(run_cell(policy, tok, sampler, batch, sleep_s, args.staggered))

  print()
  _print_table(results)
  print(f"\ntotal runtime {time.perf_counter() - start:.1f}s")
  return 0


if __name__ == "__main__":
  sys.exit(main())
