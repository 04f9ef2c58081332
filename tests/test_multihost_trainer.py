"""`orchestra train` as 2 real JAX processes (CPU, 4 devices each, one (2, 2, 2) mesh) against one process with 8
devices on the same mesh shape: process 0 runs the agent loop while process 1 replays its sampler calls
(`rollout.lockstep`), both train on global batches, and the metrics process 0 writes must equal the single-process
run's. The two runs go side by side (~1.5-2.5 min on 2 cores).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from test_multihost import _free_port, _tail

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
GLOBAL_DEVICES = 8
TIMEOUT_S = 400
FLAGS = ["--config", "configs/demo.py", "--config.steps=2", "--config.checkpoint_every=1",
         "--config.prompts_per_step=2", "--config.group_size=4", "--config.sft.steps=4", "--config.eval_every=100",
         "--config.env.num_eval_tasks=3", "--config.env.num_train_tasks=32", "--config.rollout.batch_size=8",
         "--config.reward.std_threshold=-1", "--config.reward.require_tool_call=False", "--quiet",
         "--config.mesh.shape=(2,2,2)"]
# the numeric metrics to compare: wall-clock ones differ run to run by nature
NUMERIC = lambda k: k != "kind" and not (k.startswith("time_") or k == "tokens_per_s")


def _launch(num_processes: int, workdir: Path) -> list[tuple[subprocess.Popen, Path]]:
  workdir.mkdir(parents=True, exist_ok=True)
  base = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRA_")}
  base.update(JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1",
              XLA_FLAGS=f"--xla_force_host_platform_device_count={GLOBAL_DEVICES // num_processes}")
  if num_processes > 1:
    base.update(ORCHESTRA_COORDINATOR=f"127.0.0.1:{_free_port()}", ORCHESTRA_NUM_PROCESSES=str(num_processes),
                ORCHESTRA_INIT_TIMEOUT="120")
  cmd = [sys.executable, "-m", "orchestra_jax.cli", "train", *FLAGS, f"--config.workdir={workdir}"]
  procs = []
  for pid in range(num_processes):
    env = dict(base, ORCHESTRA_PROCESS_ID=str(pid)) if num_processes > 1 else base
    log = workdir.parent / f"{workdir.name}_log_{pid}.txt"
    with open(log, "w") as f:
      procs.append((subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT), log))
  return procs


def _wait_all(groups: dict[str, list[tuple[subprocess.Popen, Path]]]) -> None:
  """Wait for every process; on a failure or the timeout kill the rest (peers would hang on collectives)."""
  everything = [(name, i, p, log) for name, procs in groups.items() for i, (p, log) in enumerate(procs)]
  deadline = time.monotonic() + TIMEOUT_S
  try:
    while True:
      for name, i, p, log in everything:
        if p.poll() not in (None, 0):
          pytest.fail(f"{name}: process {i} exited with {p.returncode}:\n{_tail(log)}")
      if all(p.poll() == 0 for _, _, p, _ in everything):
        return
      if time.monotonic() > deadline:
        logs = "\n".join(f"--- {name} process {i}\n{_tail(log, 10)}" for name, i, _, log in everything)
        pytest.fail(f"not done after {TIMEOUT_S} s\n{logs}")
      time.sleep(0.2)
  finally:
    for _, _, p, _ in everything:
      if p.poll() is None:
        p.kill()
        p.wait()


def _records(workdir: Path) -> list[dict]:
  return [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines() if l.strip()]


def test_two_process_train_matches_single_process(tmp_path):
  single, multi = tmp_path / "single", tmp_path / "multi"
  _wait_all({"2-process run": _launch(2, multi), "single-process run": _launch(1, single)})

  want, got = _records(single), _records(multi)
  assert [(r["step"], r["kind"]) for r in got] == [(r["step"], r["kind"]) for r in want]
  assert [r["kind"] for r in want] == ["warmup", "eval_cheap", "train", "train", "eval_cheap"]
  for g, w in zip(got, want):
    assert g.keys() == w.keys(), (g["kind"], g["step"])
    for k in filter(NUMERIC, w):
      # Cross-process reductions sum in another order: float noise only (grad norms here are ~1e-11).
      np.testing.assert_allclose(g[k], w[k], rtol=1e-4, atol=1e-6, err_msg=f"{w['kind']} step {w['step']} {k}")
  assert all(r["turn_samples"] > 0 and "loss" in r for r in got if r["kind"] == "train")

  # Process 0 alone wrote the per-step rollouts. Those of step 1 (sampled before any RL update) have the same
  # prompts, lengths and masks; sampled ids may differ by a neighbouring id where float noise from the other
  # reduction order moves an inverse-CDF draw across a boundary of the random model's near-uniform distribution.
  for step in (1, 2):
    lines = (multi / "rollouts" / f"step_{step:06d}.jsonl").read_text().splitlines()
    assert len(lines) == 2 * 4
  trajs = lambda d: [json.loads(l)["trajectory"] for l in (d / "rollouts" / "step_000001.jsonl").open()]
  for g, w in zip(trajs(multi), trajs(single), strict=True):
    assert g["generated_mask"] == w["generated_mask"]
    prompt = w["generated_mask"].index(1)
    assert g["tokens"][:prompt] == w["tokens"][:prompt]
    assert max(abs(a - b) for a, b in zip(g["tokens"], w["tokens"])) <= 4
  # every process took part in the checkpoints (orbax saves are collective)
  assert sorted(int(p.name) for p in (multi / "checkpoints").iterdir() if p.name.isdigit()) == [0, 1, 2]
