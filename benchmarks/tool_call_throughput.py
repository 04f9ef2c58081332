"""Tool-call throughput of `ChatClient.chat_many` against the local scripted OpenAI-compatible server.

What it measures: the client-side cost of a tool call (JSON encode, pooled HTTP/1.1 round trip, parse,
cost accounting) and how well concurrent calls overlap. With a fixed server delay d, c concurrent callers
cannot beat c / d calls/s; the table shows that bound ("ideal") next to what was achieved. With d = 0 the
number is the raw per-call overhead of client plus server on this machine.

The server runs in a separate process by default (`python -m orchestra_jax.tools.scripted_server`), so
that client and server do not share one GIL, as they would not against a real endpoint.

    .venv/bin/python benchmarks/tool_call_throughput.py [--concurrency 1,8,64] [--delays-ms 0,20]
        [--calls 200] [--in-process]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from orchestra_jax.tools.llm_client import ChatClient
from orchestra_jax.tools.scripted_server import ScriptedServer

MESSAGES = [{"role": "system", "content": "You answer in one short sentence."},
            {"role": "user", "content": "Which tool should be called to look up the capital of France?"}]


def _ints(text: str) -> list[int]:
  return [int(x) for x in text.split(",") if x.strip()]


def _script(delays_ms: list[int]) -> dict:
  return {f"d{d}": {"default": {"answer": "Call search-3 with the query 'capital of France'."}, "delay_s": d / 1000}
          for d in delays_ms}


def _start_subprocess_server(script: dict) -> tuple[subprocess.Popen, str, str]:
  fd, path = tempfile.mkstemp(suffix=".json", prefix="scripted_")
  with os.fdopen(fd, "w") as f:
    json.dump(script, f)
  proc = subprocess.Popen([sys.executable, "-m", "orchestra_jax.tools.scripted_server", "--port", "0", "--script",
                           path], stdout=subprocess.PIPE, text=True)
  base_url = proc.stdout.readline().strip()
  if not base_url.startswith("http://"):
    proc.kill()
    raise SystemExit(f"scripted server did not start (printed {base_url!r})")
  return proc, base_url, path


def run_cell(base_url: str, delay_ms: int, concurrency: int, calls: int) -> dict:
  client = ChatClient(base_url, f"d{delay_ms}", read_timeout=30, max_retries=0, pool_size=max(concurrency, 1),
                      price_in_per_m=0.8, price_out_per_m=0.8)
  with client:
    client.chat_many([MESSAGES] * concurrency, max_workers=concurrency)  # warm-up: open the pooled connections
    n = max(calls, 8 * concurrency)
    start = time.perf_counter()
    results = client.chat_many([MESSAGES] * n, max_workers=concurrency)
    wall = time.perf_counter() - start
  lat = np.array([r.latency_s for r in results]) * 1000
  return {
      "delay_ms": delay_ms,
      "concurrency": concurrency,
      "calls": n,
      "failed": sum(not r.ok for r in results),
      "calls_per_s": n / wall,
      "ideal": concurrency / (delay_ms / 1000) if delay_ms else float("inf"),
      "p50_ms": float(np.percentile(lat, 50)),
      "p95_ms": float(np.percentile(lat, 95)),
  }


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                   epilog="Each cell first runs one warm-up batch (opens the connections), then "
                                   "max(--calls, 8 x concurrency) calls through chat_many.")
  parser.add_argument("--concurrency", default="1,8,64", help="comma-separated worker counts (default 1,8,64)")
  parser.add_argument("--delays-ms", default="0,20", help="comma-separated server delays per call in ms (default 0,20)")
  parser.add_argument("--calls", type=int, default=200, help="calls per cell, at least 8 x concurrency (default 200)")
  parser.add_argument("--in-process", action="store_true",
                      help="run the server on a thread of this process (shares the GIL; lower numbers)")
  args = parser.parse_args(argv)
  delays, levels = _ints(args.delays_ms), _ints(args.concurrency)

  script = _script(delays)
  proc = path = server = None
  if args.in_process:
    server = ScriptedServer(script).start()
    base_url = server.base_url
  else:
    proc, base_url, path = _start_subprocess_server(script)
  try:
    rows = [run_cell(base_url, d, c, args.calls) for d in delays for c in levels]
  finally:
    if server is not None:
      server.close()
    if proc is not None:
      proc.terminate()
      proc.wait(10)
      proc.stdout.close()
      os.unlink(path)

  where = "in-process" if args.in_process else "separate process"
  print(f"ChatClient.chat_many -> ScriptedServer ({where}) on 127.0.0.1, {os.cpu_count()} CPUs")
  header = (f"{'delay ms':>8} {'conc':>5} {'calls':>6} {'failed':>6} {'calls/s':>9} {'ideal':>8} {'p50 ms':>8} "
            f"{'p95 ms':>8}")
  print(header)
  print("-" * len(header))
  for r in rows:
    ideal = "-" if r["ideal"] == float("inf") else f"{r['ideal']:.0f}"
    print(f"{r['delay_ms']:>8} {r['concurrency']:>5} {r['calls']:>6} {r['failed']:>6} {r['calls_per_s']:>9.1f} "
          f"{ideal:>8} {r['p50_ms']:>8.1f} {r['p95_ms']:>8.1f}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
