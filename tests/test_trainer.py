"""`orchestra train` as a user runs it: real subprocesses, SIGKILL and resume, the NaN guard, bad configs."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

SMALL = ["--config", "configs/demo.py", "--config.steps=4", "--config.checkpoint_every=2", "--config.prompts_per_step=2",
         "--config.group_size=4", "--config.sft.steps=4", "--config.eval_every=100", "--config.env.num_eval_tasks=3",
         "--config.env.num_train_tasks=32", "--config.rollout.batch_size=8", "--quiet",
         # Too few warm-up steps to learn the call format, so keep every group and turn: each step then updates.
         "--config.reward.std_threshold=-1", "--config.reward.require_tool_call=False"]


def train_cmd(workdir, *extra):
  return [sys.executable, "-m", "orchestra_jax.cli", "train", *SMALL, f"--config.workdir={workdir}", *extra]


def run(workdir, *extra, timeout=600):
  return subprocess.run(train_cmd(workdir, *extra), capture_output=True, text=True, timeout=timeout)


def train_records(workdir):
  lines = (Path(workdir) / "metrics.jsonl").read_text().splitlines()
  return {r["step"]: r for r in map(json.loads, lines) if r["kind"] == "train"}


def checkpoint_steps(workdir):
  ckpt = Path(workdir) / "checkpoints"
  return sorted(int(p.name) for p in ckpt.iterdir() if p.name.isdigit()) if ckpt.exists() else []


@pytest.mark.slow
def test_sigkill_mid_run_resumes_with_identical_metrics(tmp_path):
  straight = tmp_path / "straight"
  proc = run(straight)
  assert proc.returncode == 0, proc.stderr[-3000:]
  expected = train_records(straight)
  assert sorted(expected) == [1, 2, 3, 4]
  assert all("loss" in r and r["turn_samples"] > 0 for r in expected.values())
  assert (straight / "plots" / "accuracy.png").stat().st_size > 0
  assert list((straight / "tensorboard").iterdir())
  assert len((straight / "rollouts" / "step_000001.jsonl").read_text().splitlines()) == 2 * 4

  killed = tmp_path / "killed"
  child = subprocess.Popen(train_cmd(killed), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 600
  while 2 not in checkpoint_steps(killed) and time.time() < deadline and child.poll() is None:
    time.sleep(0.2)
  assert 2 in checkpoint_steps(killed), "the run never wrote checkpoint 2"
  child.send_signal(signal.SIGKILL)
  child.wait()
  assert checkpoint_steps(killed)[-1] < 4
  proc = run(killed)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "resuming from checkpoint step" in proc.stderr
  resumed = train_records(killed)
  assert sorted(resumed) == [1, 2, 3, 4]
  for step in (3, 4):
    for key in ("reward", "accuracy", "cost_per_task", "loss", "pg_loss", "kept", "share_calc", "share_expert"):
      np.testing.assert_allclose(resumed[step][key], expected[step][key], rtol=1e-5, atol=1e-7,
                                 err_msg=f"step {step} {key}")


def test_nan_loss_stops_with_clear_message_and_keeps_last_good_checkpoint(tmp_path):
  proc = run(tmp_path, "--config.debug.nan_at_step=2", "--config.checkpoint_every=1", "--config.steps=3")
  assert proc.returncode == 2
  last = [l for l in proc.stderr.splitlines() if l.strip()][-1]
  assert "non-finite loss" in last and "RL step 2" in last and "Traceback" not in proc.stderr
  assert checkpoint_steps(tmp_path)[-1] == 1
  assert sorted(train_records(tmp_path)) == [1]


@pytest.mark.parametrize("override,needle", [
    ("--config.trian.learning_rate=1", "trian"),
    ("--config.env.name=nope", "env.name"),
    ("--config.group_size=1", "group_size"),
])
def test_bad_config_is_one_line(tmp_path, override, needle):
  proc = run(tmp_path, override, timeout=120)
  assert proc.returncode == 2
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and needle in lines[0] and "Traceback" not in proc.stderr


def test_bf16_checkpoint_starts_an_f32_master_weights_run(tmp_path):
  """A bf16 checkpoint (as Qwen3-8B ships) initialises a run configured with f32 params: cast up, values kept;
  a checkpoint of another architecture is refused naming the fields that differ."""
  import jax
  import jax.numpy as jnp
  from orchestra_jax import checkpoint, trainer
  from orchestra_jax.configs import ConfigFileError, load_config
  from orchestra_jax.model import qwen3
  from orchestra_jax.model.config import tiny

  bf16 = tiny(num_layers=1, embed_dim=32, mlp_dim=64, num_heads=2, num_kv_heads=1, head_dim=16,
              param_dtype="bfloat16", dtype="bfloat16")
  params = qwen3.init_params(bf16, jax.random.key(1))
  checkpoint.save_model(tmp_path / "ckpt", bf16, params)
  fields = [f"--config.model.{k}={v}" for k, v in bf16.to_dict().items() if k not in ("param_dtype", "dtype")]
  cfg = load_config("configs/demo.py", [*fields, "--config.model.param_dtype=float32", "--config.model.dtype=bfloat16",
                                        f"--config.init_checkpoint={tmp_path / 'ckpt'}",
                                        f"--config.workdir={tmp_path / 'run'}"])
  loaded = trainer.Trainer(cfg, quiet=True)._initial_params()
  for got, want in zip(jax.tree.leaves(loaded), jax.tree.leaves(params)):
    assert got.dtype == jnp.float32 and bool((got == want.astype(jnp.float32)).all())
  cfg = load_config("configs/demo.py", [*fields, "--config.model.mlp_dim=128", f"--config.workdir={tmp_path / 'x'}",
                                        f"--config.init_checkpoint={tmp_path / 'ckpt'}"])
  with pytest.raises(ConfigFileError, match=r"differs in mlp_dim\)"):
    trainer.Trainer(cfg, quiet=True)._initial_params()
