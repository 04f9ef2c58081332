"""Start-up cost of the code sandbox: wall time per execution of `print(1)`, per isolation mode.

Prints a table of mean / p50 / p95 milliseconds over N runs and the cost that wall time is charged at
(8.3e-6 $/s), for: a bare `python -I -c 'print(1)'` subprocess (no sandbox, the floor), the sandbox with
network allowed, with the weaker socket-patch network block, and with a network namespace (when this
machine allows one). Runs are sequential, after a few warm-up runs.

    .venv/bin/python benchmarks/sandbox_startup.py [--runs 30] [--warmup 3] [--modes bare,allow,patch,namespace]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from orchestra_jax.tools.sandbox import CODE_EXEC_USD_PER_S, SandboxConfig, isolation_report, run_python

MODES = ("bare", "allow", "patch", "namespace")


def _percentile(values: list[float], q: float) -> float:
  values = sorted(values)
  if len(values) == 1:
    return values[0]
  pos = q * (len(values) - 1)
  lo = int(pos)
  hi = min(lo + 1, len(values) - 1)
  return values[lo] + (values[hi] - values[lo]) * (pos - lo)


def _run_once(mode: str) -> tuple[float, bool]:
  if mode == "bare":
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-I", "-c", "print(1)"], capture_output=True, text=True, check=True)
    assert out.stdout == "1\n"
    return time.monotonic() - start, False
  network = "namespace" if mode == "namespace" else mode
  r = run_python("print(1)", SandboxConfig(network=network, timeout_s=30))
  if not r.ok or r.stdout != "1\n":
    raise RuntimeError(f"sandbox run failed in mode {mode}: {r.error}\n{r.stderr}")
  return r.wall_s, r.network_isolated


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--runs", type=int, default=30, help="timed runs per mode (default 30)")
  parser.add_argument("--warmup", type=int, default=3, help="untimed runs per mode first (default 3)")
  parser.add_argument("--modes", default=",".join(MODES),
                      help="comma-separated subset of: bare (plain subprocess, no sandbox), allow (sandbox, "
                           "network allowed), patch (sandbox, socket-patch network block), namespace (sandbox, "
                           "network namespace; skipped where unavailable). Default: all")
  args = parser.parse_args(argv)
  modes = [m.strip() for m in args.modes.split(",") if m.strip()]
  bad = [m for m in modes if m not in MODES]
  if bad:
    parser.error(f"unknown mode {bad[0]!r}; choose from {', '.join(MODES)}")
  if args.runs < 1 or args.warmup < 0:
    parser.error("--runs must be >= 1 and --warmup >= 0")

  report = isolation_report()
  print(f"python: {sys.executable}")
  print("isolation here: " + ", ".join(f"{k}={v}" for k, v in report.items() if k not in ("python", "notes")))
  if report.get("notes"):
    print("notes: " + "; ".join(report["notes"]))
  if "namespace" in modes and not report["netns"]:
    print("namespace: skipped (no network namespace on this machine)")
    modes.remove("namespace")
  print()
  header = f"{'mode':<10} {'net isolated':>12} {'mean ms':>9} {'p50 ms':>8} {'p95 ms':>8} {'$ / run':>10}"
  print(header)
  print("-" * len(header))
  for mode in modes:
    for _ in range(args.warmup):
      _run_once(mode)
    times, isolated = [], False
    for _ in range(args.runs):
      t, isolated = _run_once(mode)
      times.append(t)
    mean = statistics.fmean(times)
    print(f"{mode:<10} {str(isolated):>12} {1e3 * mean:>9.1f} {1e3 * _percentile(times, 0.5):>8.1f} "
          f"{1e3 * _percentile(times, 0.95):>8.1f} {CODE_EXEC_USD_PER_S * mean:>10.2e}")


if __name__ == "__main__":
  main()
