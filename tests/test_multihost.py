"""Multi-process training on CPU: N local processes joined by `jax.distributed.initialize` (coordinator on
127.0.0.1, gloo CPU collectives) train the tiny model over one global (data, fsdp, tensor) = (2, 2, 2) mesh, each
process supplying only its own rows of the batch, and save an orbax checkpoint together. The metrics must equal a
single-process run on the same mesh shape, and the checkpoint must restore in this (single) process onto a
different mesh with the single-process run's final TrainState.

The workers are `tests/multihost_worker.py`. The 4-process variant (2 devices each) takes ~1.5 min on 2 busy
cores, so it runs only with ORCHESTRA_TEST_4_PROCESSES=1.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

import multihost_worker as worker
from orchestra_jax import rl
from orchestra_jax import sharding as sharding_lib
from orchestra_jax.model import qwen3

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("multihost_worker.py")
GLOBAL_DEVICES = 8  # = prod(worker.MESH_SHAPE)
TIMEOUT_S = 300
RTOL = 1e-5


def _free_port() -> int:
  try:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
      s.bind(("127.0.0.1", 0))
      return s.getsockname()[1]
  except OSError as e:
    pytest.skip(f"cannot open a TCP socket on 127.0.0.1 for the coordinator: {e}")


def _launch(num_processes: int, out_dir: Path) -> list[tuple[subprocess.Popen, Path]]:
  """Start the worker as `num_processes` processes of GLOBAL_DEVICES / num_processes CPU devices each."""
  out_dir.mkdir(parents=True, exist_ok=True)
  base = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRA_")}
  base.update(JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1",
              XLA_FLAGS=f"--xla_force_host_platform_device_count={GLOBAL_DEVICES // num_processes}")
  if num_processes > 1:
    base.update(ORCHESTRA_COORDINATOR=f"127.0.0.1:{_free_port()}", ORCHESTRA_NUM_PROCESSES=str(num_processes),
                ORCHESTRA_INIT_TIMEOUT="120")
  procs = []
  for pid in range(num_processes):
    env = dict(base, ORCHESTRA_PROCESS_ID=str(pid)) if num_processes > 1 else base
    log = out_dir / f"log_{pid}.txt"
    with open(log, "w") as f:
      procs.append((subprocess.Popen([sys.executable, str(WORKER), str(out_dir)], env=env, stdout=f,
                                     stderr=subprocess.STDOUT), log))
  return procs


def _tail(log: Path, lines: int = 25) -> str:
  text = [line for line in log.read_text(errors="replace").splitlines()
          if "[SPMD] Involuntary" not in line and "[Gloo]" not in line]  # XLA / gloo chatter
  return "\n".join(text[-lines:])


def _wait(procs: list[tuple[subprocess.Popen, Path]], what: str) -> None:
  """Wait for all; on the first failure (or the timeout) stop the others, so peers do not hang on collectives."""
  deadline = time.monotonic() + TIMEOUT_S
  try:
    while True:
      codes = [p.poll() for p, _ in procs]
      bad = [i for i, c in enumerate(codes) if c not in (None, 0)]
      if bad:
        i = bad[0]
        pytest.fail(f"{what}: process {i} exited with {codes[i]}:\n{_tail(procs[i][1])}")
      if all(c == 0 for c in codes):
        return
      if time.monotonic() > deadline:
        logs = "\n".join(f"--- process {i}\n{_tail(log, 10)}" for i, (_, log) in enumerate(procs))
        pytest.fail(f"{what}: not done after {TIMEOUT_S} s\n{logs}")
      time.sleep(0.2)
  finally:
    for p, _ in procs:
      if p.poll() is None:
        p.kill()
        p.wait()


class _Reference:
  """The single-process run (one process, 8 devices): started once, waited for when first needed."""

  def __init__(self, out_dir: Path):
    self.out_dir = out_dir
    self.procs = _launch(1, out_dir)
    self.done = False

  def result(self) -> tuple[list[dict], dict[str, np.ndarray]]:
    if not self.done:
      _wait(self.procs, "single-process reference run")
      self.done = True
    metrics = json.loads((self.out_dir / "metrics.json").read_text())
    with np.load(self.out_dir / "state.npz") as z:
      state = {k: z[k] for k in z.files}
    return metrics, state


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  ref = _Reference(tmp_path_factory.mktemp("multihost_single"))
  yield ref
  for p, _ in ref.procs:
    if p.poll() is None:
      p.kill()
      p.wait()


def _assert_close(name: str, got, want) -> None:
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
  # rtol, plus the same relative slack on the leaf's scale (entries that cancel to ~0 carry summation-order noise)
  atol = RTOL * float(np.abs(want).max(initial=0.0))
  np.testing.assert_allclose(got, want, rtol=RTOL, atol=atol, err_msg=name)


def _restore_single_process(ckpt_dir: Path, step: int):
  """Restore the multi-process checkpoint here (one process) onto a (1, 2, 4) mesh: a different layout."""
  import orbax.checkpoint as ocp

  n = GLOBAL_DEVICES if jax.device_count() >= GLOBAL_DEVICES else 1
  mesh_shape = (1, 2, 4) if n == GLOBAL_DEVICES else (1, 1, 1)
  shard = sharding_lib.ShardingConfig(sharding_lib.make_mesh(mesh_shape, devices=jax.devices()[:n]))
  shapes = jax.eval_shape(lambda: rl.init_train_state(worker.CONFIG, qwen3.init_params(worker.CONFIG, jax.random.key(0)),
                                                      worker.TRAIN))
  shardings = rl.train_state_shardings(worker.CONFIG, worker.TRAIN, shard)
  abstract = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings)
  with ocp.CheckpointManager(ckpt_dir) as manager:
    assert manager.latest_step() == step
    restored = manager.restore(step, args=ocp.args.StandardRestore(abstract))
  for leaf, sh in zip(jax.tree.leaves(restored), jax.tree.leaves(shardings), strict=True):
    assert leaf.sharding.is_equivalent_to(sh, leaf.ndim), (leaf.sharding, sh)
  return restored


@pytest.mark.parametrize("num_processes", [
    2,
    pytest.param(4, marks=pytest.mark.skipif(os.environ.get("ORCHESTRA_TEST_4_PROCESSES") != "1",
                                             reason="~1.5 min on 2 cores; set ORCHESTRA_TEST_4_PROCESSES=1")),
])
def test_multiprocess_training_matches_single_process(num_processes, reference, tmp_path):
  out = tmp_path / f"multi_{num_processes}"
  procs = _launch(num_processes, out)
  _wait(procs, f"{num_processes}-process run")  # the reference runs meanwhile

  # every process joined the one run, saw all 8 devices, and was handed only its own rows of the batch
  infos = [json.loads((out / f"process_{i}.json").read_text()) for i in range(num_processes)]
  rows_per_process = worker.B // num_processes
  for i, info in enumerate(infos):
    assert info["distributed"] and info["platform"] == "cpu", info
    assert (info["process_index"], info["process_count"]) == (i, num_processes), info
    assert (info["local_device_count"], info["global_device_count"]) == (GLOBAL_DEVICES // num_processes,
                                                                          GLOBAL_DEVICES), info
    assert len(info["rows"]) == rows_per_process and info["batch_global_shape"] == [worker.B, worker.T], info
  assert sorted(r for info in infos for r in info["rows"]) == list(range(worker.B))

  ref_metrics, ref_state = reference.result()
  metrics = json.loads((out / "metrics.json").read_text())
  assert len(metrics) == len(ref_metrics) == worker.STEPS
  assert all(m["skipped"] == 0.0 for m in ref_metrics) and ref_metrics[0]["loss"] != ref_metrics[-1]["loss"]
  for step, (got, want) in enumerate(zip(metrics, ref_metrics)):
    assert got.keys() == want.keys()
    for k in want:
      _assert_close(f"step {step} metric {k}", got[k], want[k])

  restored = _restore_single_process(out / "ckpt", worker.STEPS)
  got_state = worker.flatten_state(restored)
  assert got_state.keys() == ref_state.keys()
  assert int(got_state[".step"]) == worker.STEPS
  for k in ref_state:
    _assert_close(f"restored {k}", got_state[k], ref_state[k])
