"""One process of the multi-process CPU test (tests/test_multihost.py runs it as N subprocesses, or alone).

    python tests/multihost_worker.py OUT_DIR

Distributed when ORCHESTRA_COORDINATOR / ORCHESTRA_NUM_PROCESSES / ORCHESTRA_PROCESS_ID are set (see
orchestra_jax.distributed); the caller sets XLA_FLAGS=--xla_force_host_platform_device_count=K and JAX_PLATFORMS=cpu.
Every process builds the same (data, fsdp, tensor) = MESH_SHAPE mesh over all global devices, the same params
(seed 0), supplies its own rows of a deterministic global batch, runs STEPS train steps and saves the TrainState
with orbax to OUT_DIR/ckpt (every process takes part). Process 0 writes OUT_DIR/metrics.json; every process
writes OUT_DIR/process_<i>.json (what it saw); a single-process run also writes OUT_DIR/state.npz (the final
TrainState, flattened) for comparison.
"""

from __future__ import annotations

import json
import os
import sys
import time

if __name__ == "__main__":  # run as a script; the test also imports it for its constants (then: no set-up)
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  from orchestra_jax.distributed import maybe_initialize  # (does not import jax)
  INFO = maybe_initialize()  # before any other JAX use

import jax  # noqa: E402
import numpy as np  # noqa: E402

from orchestra_jax import rl  # noqa: E402
from orchestra_jax import sharding as sharding_lib  # noqa: E402
from orchestra_jax.model import qwen3  # noqa: E402
from orchestra_jax.model.config import tiny  # noqa: E402
from orchestra_jax.rl.train import make_global_batch  # noqa: E402

CONFIG = tiny(vocab_size=512)
MESH_SHAPE = (2, 2, 2)  # data, fsdp, tensor: 8 devices in all
B, T = 8, 16
STEPS = 3
SEED = 0
# KL on (so ref_logprobs' gradient path runs) and 2 micro-batches (so the scan runs); lr large enough to move params
TRAIN = rl.TrainConfig(loss=rl.LossConfig(kl_coef=0.05), optimizer=rl.OptimizerConfig(learning_rate=1e-3),
                       grad_accum_steps=2, logprob_chunk_size=8)


def global_batch_numpy(seed: int = SEED) -> dict[str, np.ndarray]:
  """The whole deterministic batch (host numpy, no model call): rows of different prompt / response lengths."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, CONFIG.vocab_size, (B, T)).astype(np.int32)
  seg = np.zeros((B, T), np.int32)
  mask = np.zeros((B, T), np.int32)
  for b in range(B):
    prompt = int(rng.integers(2, 7))
    end = int(rng.integers(prompt + 1, T + 1)) if b % 4 else T
    seg[b, :end] = 1
    mask[b, prompt:end] = 1
  base = -np.log(CONFIG.vocab_size)  # a random model's log-probs sit near -log V
  old = np.where(mask, base + rng.normal(0, 0.3, (B, T)), 0).astype(np.float32)
  ref = np.where(mask, base + rng.normal(0, 0.3, (B, T)), 0).astype(np.float32)
  return {"tokens": tokens, "positions": np.tile(np.arange(T, dtype=np.int32), (B, 1)), "segment_ids": seg,
          "response_mask": mask, "advantages": rng.normal(0, 1.5, B).astype(np.float32), "old_logprobs": old,
          "ref_logprobs": ref}


def flatten_state(state) -> dict[str, np.ndarray]:
  """{keypath: host array} of a (fully addressable) pytree."""
  flat, _ = jax.tree_util.tree_flatten_with_path(state)
  return {jax.tree_util.keystr(path): np.asarray(jax.device_get(leaf)) for path, leaf in flat}


def main(out_dir: str) -> None:
  import orbax.checkpoint as ocp

  os.makedirs(out_dir, exist_ok=True)
  pid = jax.process_index()
  mesh = sharding_lib.make_mesh(MESH_SHAPE, devices=jax.devices())
  shard = sharding_lib.ShardingConfig(mesh)

  params = qwen3.init_params(CONFIG, jax.random.key(SEED), shard)
  state = rl.init_train_state(CONFIG, params, TRAIN, shard)
  step_fn = rl.make_train_step(CONFIG, TRAIN, shard)

  full = global_batch_numpy()
  seen_rows: list[int] = []

  def rows_fn(rows):  # this process loads only its own rows (here: sliced from the deterministic whole)
    seen_rows.extend(int(r) for r in rows)
    return {k: v[rows] for k, v in full.items()}

  batch = make_global_batch(rows_fn, B, shard)

  t0 = time.perf_counter()
  history = []
  for _ in range(STEPS):
    state, metrics = step_fn(state, batch)
    # metrics are replicated over the mesh, so every process can read them
    history.append({k: float(np.asarray(v)) for k, v in metrics.items()})
  train_s = time.perf_counter() - t0

  manager = ocp.CheckpointManager(os.path.join(out_dir, "ckpt"),
                                  options=ocp.CheckpointManagerOptions(create=True, max_to_keep=1))
  manager.save(STEPS, args=ocp.args.StandardSave(state), force=True)
  manager.wait_until_finished()
  manager.close()

  with open(os.path.join(out_dir, f"process_{pid}.json"), "w") as f:
    json.dump(dict(INFO, rows=seen_rows, train_s=train_s, batch_global_shape=list(batch["tokens"].shape)), f)
  if pid == 0:
    with open(os.path.join(out_dir, "metrics.json"), "w") as f:
      json.dump(history, f)
  if jax.process_count() == 1:
    np.savez(os.path.join(out_dir, "state.npz"), **flatten_state(state))
  if INFO["distributed"]:
    # leave together: a process that exits early would tear the coordinator down under the others
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices("multihost_worker_done")


if __name__ == "__main__":
  main(sys.argv[1])
