"""`orchestra train`: the RL loop. data -> rollouts -> reward -> advantages -> update, with eval and checkpoints.

One RL step (docs/design.md sections 5-6):
  1. the grain iterator yields `prompts_per_step` tasks; each is repeated `group_size` times;
  2. the agent loop samples multi-turn trajectories with the current policy (sampler + the task family's tool
     environment, `task_families.ENVIRONMENTS[config.env.name]`), grading each one the moment it ends;
  3. the reward registry turns [tool counts, outcome, -cost, -latency] into rewards, and
     group advantages with the configured filters (homogeneous groups, no final answer, unparseable turns);
  4. every kept turn becomes a training sample (prompt + that turn's response, the rollout's advantage);
     old and reference log-probs are recomputed sharded; mini-batches of `mini_batch_size` give one optimizer
     step each (jitted over the mesh, state donated);
  5. metrics go to JSONL, TensorBoard and the progress bar; rollouts to `rollouts/step_*.jsonl`.

Variants are looked up by name in orchestra_jax/registry.py (`env.name`, `reward.name`, `reward.estimator`,
`train.aggregation`, `train.kl_type`); a user's own come from the modules of the config's `imports`
(`--config.imports=my_rewards.py --config.reward.name=mine`), imported first by `validate`.

Reliability: orbax checkpoints (params, optimizer, step, data-iterator state) every `checkpoint_every` steps,
written asynchronously and atomically; a restart of the same command resumes from the latest one and rewinds the
metrics log to it, so a killed run continues exactly as an uninterrupted one (same seed). Per-step randomness
comes from (seed, step), never from wall-clock state. A non-finite loss stops the run with a clear message; the
last good checkpoint stays the latest.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import functools
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import grain
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils
from tqdm import tqdm

from orchestra_jax import checkpoint as model_ckpt
from orchestra_jax import configs as config_lib
from orchestra_jax import plots
from orchestra_jax import sharding as sharding_lib
from orchestra_jax import tokenizer as tokenizer_lib
from orchestra_jax.errors import UserError
from orchestra_jax.model import qwen3
from orchestra_jax.model.config import ModelConfig
from orchestra_jax.reward.features import group_arrays
from orchestra_jax.reward.pipeline import RewardConfig, score_groups
from orchestra_jax.rl.logprobs import token_logprobs
from orchestra_jax.rl.train import (init_train_state, is_finite, make_compute_logprobs, make_train_step, shard_batch,
                                   train_state_shardings)
from orchestra_jax.rollout import lockstep
from orchestra_jax.rollout.agent_loop import AgentLoop, RolloutStats
from orchestra_jax.rollout.sampler import Sampler, compute_params
from orchestra_jax.rollout.trajectory import Trajectory
from orchestra_jax.task_families import ENVIRONMENTS, EnvSetup
from orchestra_jax.training_config import (RewardSection, TrainingConfig, build_section,  # noqa: F401 (re-exported)
                                           import_user_modules)


GRADE_WORKERS = 8  # rollouts graded at once (QA with a remote LLM judge waits on HTTP)


class TrainingDiverged(UserError):
  """A non-finite loss or gradient; the message names the step and the last good checkpoint."""


def _to_host(x) -> np.ndarray:
  """A (possibly multi-process, batch-sharded) array's global value as host numpy, on every process."""
  if getattr(x, "is_fully_addressable", True):
    return np.asarray(jax.device_get(x))
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


# --- config ---------------------------------------------------------------------------------------------

def validate(cfg: ml_collections.ConfigDict) -> TrainingConfig:
  """The typed config, or one clear ConfigFileError line, before any work starts (`TrainingConfig.from_config`:
  imports the config's `imports` first)."""
  return TrainingConfig.from_config(cfg)


def _reward_config(cfg: ml_collections.ConfigDict) -> RewardConfig:
  """The RewardConfig of a config's `reward` section, for callers holding only the ConfigDict."""
  return build_section(RewardSection, cfg.reward).reward_config()


def architecture_mismatch(checkpoint_config: ModelConfig, model_config: ModelConfig) -> list[str]:
  """The ModelConfig fields in which a checkpoint differs from the configured model, ignoring how it is run
  (remat, param and compute dtypes: a bf16 checkpoint starts an f32-master-weights run)."""
  same = dict(remat=model_config.remat, param_dtype=model_config.param_dtype, dtype=model_config.dtype)
  theirs = dataclasses.asdict(checkpoint_config.replace(**same))
  return sorted(k for k, v in theirs.items() if getattr(model_config, k) != v)


# --- batches -------------------------------------------------------------------------------------------

def build_batch(rows: list[tuple[list[int], int, list[float], float]], seq_bucket: int, rows_multiple: int
                ) -> dict[str, np.ndarray]:
  """Turn samples -> a right-aligned (left-padded) train batch, so responses sit in the last columns.

  rows: (prompt + response tokens, response length, response old log-probs, advantage). Rows are padded up to a
  multiple of `rows_multiple` with empty rows (segment 0, mask 0) and T up to a multiple of `seq_bucket`, so
  the jitted step sees few shapes.
  """
  longest = max(len(r[0]) for r in rows)
  t = -(-longest // seq_bucket) * seq_bucket
  b = -(-len(rows) // rows_multiple) * rows_multiple
  batch = {"tokens": np.zeros((b, t), np.int32), "positions": np.zeros((b, t), np.int32),
           "segment_ids": np.zeros((b, t), np.int32), "response_mask": np.zeros((b, t), np.float32),
           "old_logprobs": np.zeros((b, t), np.float32), "advantages": np.zeros((b,), np.float32)}
  for i, (tokens, resp_len, logprobs, adv) in enumerate(rows):
    n = len(tokens)
    batch["tokens"][i, t - n:] = tokens
    batch["positions"][i, t - n:] = np.arange(n)
    batch["segment_ids"][i, t - n:] = 1
    batch["response_mask"][i, t - resp_len:] = 1.0
    batch["old_logprobs"][i, t - resp_len:] = logprobs
    batch["advantages"][i] = adv
  return batch


def _tool_shares(trajs: list[Trajectory], aliases: list[str]) -> dict[str, float]:
  counts = {a: 0 for a in aliases}
  for t in trajs:
    for alias, n in t.tool_counts("alias").items():
      if alias in counts:
        counts[alias] += n
  total = sum(counts.values())
  return {a: (c / total if total else 0.0) for a, c in counts.items()}


# --- metrics sinks -------------------------------------------------------------------------------------

class MetricsFileError(UserError):
  """WORKDIR/metrics.jsonl holds a damaged record before its last line."""


class MetricsLog:
  """JSONL (flushed and fsynced per record) + TensorBoard. `rewind(step)` drops records after a checkpoint."""

  def __init__(self, workdir: Path, enabled: bool = True):
    self.path = workdir / "metrics.jsonl"
    self.enabled = enabled
    self._tb = None
    if enabled:
      # Late: importing tensorboardX takes ~1 s, half of `orchestra train --check`, which never writes metrics.
      from tensorboardX import SummaryWriter  # noqa: PLC0415  ~1 s import, not needed by --check
      self._tb = SummaryWriter(str(workdir / "tensorboard"))

  def rewind(self, step: int) -> None:
    if not self.enabled or not self.path.exists():
      return
    keep = [r for r in self._records() if r["step"] <= step]  # a torn last line goes here too
    tmp = self.path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in keep))
    os.replace(tmp, self.path)

  def write(self, step: int, kind: str, values: dict[str, float]) -> None:
    if not self.enabled:
      return
    record = {"step": step, "kind": kind, **{k: float(v) for k, v in values.items()}}
    with open(self.path, "a") as f:
      f.write(json.dumps(record, sort_keys=True) + "\n")
      f.flush()
      os.fsync(f.fileno())
    for k, v in values.items():
      self._tb.add_scalar(f"{kind}/{k}", float(v), step)
    self._tb.flush()

  def read(self) -> list[dict[str, Any]]:
    if not self.path.exists():
      return []
    return self._records()

  def _records(self) -> list[dict[str, Any]]:
    """Every record. A torn last line (a kill or a full disk in the middle of `write`) is dropped with one warning:
    the run resumes from its checkpoint and rewrites the file without it. A bad line before the last cannot come
    from an interrupted append, so it is an error naming file:line."""
    # bytes decoded leniently: a torn multi-byte character must not hide which line is bad
    lines = self.path.read_bytes().decode("utf-8", errors="replace").splitlines()
    numbered = [(i, l) for i, l in enumerate(lines, 1) if l.strip()]
    out = []
    for k, (lineno, line) in enumerate(numbered):
      try:
        record = json.loads(line)
        ok = isinstance(record, dict) and isinstance(record.get("step"), int)
      except json.JSONDecodeError:
        ok = False
      if ok:
        out.append(record)
      elif k == len(numbered) - 1:
        print(f"warning: {self.path}:{lineno}: dropping a torn last line (the run was stopped while writing it)",
              file=sys.stderr)
      else:
        raise MetricsFileError(f"{self.path}:{lineno}: not a metrics record (a JSON object with an integer step): "
                               f"{line[:60]!r}; delete the line (or the file) to go on")
    return out

  def close(self):
    if self._tb is not None:
      self._tb.close()


# --- the trainer ---------------------------------------------------------------------------------------

class Trainer:
  def __init__(self, cfg: ml_collections.ConfigDict, quiet: bool = False):
    self.config: TrainingConfig = validate(cfg)
    self.cfg = cfg  # as loaded, for run_config.json: the typed config is read everywhere else
    self.quiet = quiet
    self.model_config: ModelConfig = self.config.model
    self.sharding = sharding_lib.ShardingConfig(sharding_lib.make_mesh(tuple(self.config.mesh.shape)))
    self.workdir = Path(self.config.workdir).absolute()
    self.is_main = jax.process_index() == 0
    self.workdir.mkdir(parents=True, exist_ok=True)
    if self.is_main:  # the resolved config (overrides applied): `--config WORKDIR/run_config.json` repeats the run
      config_lib.save_config(cfg, self.workdir / "run_config.json")
    self.train_config = self.config.train.train_config()
    self.reward_config = self.config.reward.reward_config()
    self.tokenizer = tokenizer_lib.load_tokenizer(self.config.tokenizer_dir or None)
    self.train_step = make_train_step(self.model_config, self.train_config, self.sharding)
    window = self.train_config.logprob_window
    self.compute_logprobs = make_compute_logprobs(self.model_config, self.train_config.logprob_chunk_size,
                                                  self.sharding, window=window)
    self.metrics = MetricsLog(self.workdir, enabled=self.is_main)

  # --- checkpoints ---------------------------------------------------------------------------------
  def _manager(self):
    options = ocp.CheckpointManagerOptions(max_to_keep=self.config.keep_checkpoints, create=True,
                                           enable_async_checkpointing=True)
    return ocp.CheckpointManager(self.workdir / "checkpoints", options=options, item_names=("state", "data"))

  def _save(self, manager, step: int, state, iterator) -> None:
    manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                               data=ocp.args.JsonSave(iterator.get_state())), force=True)

  def _restore(self, manager, abstract_state, iterator) -> tuple[Any, int]:
    """(state, step) of the newest step that restores. A step whose files are damaged (a truncated file: a full
    disk, a filesystem that lost a write) is moved aside to `<step>.damaged-<time>`, kept for a person to look at,
    with one line saying so, and the next older step is tried: the run redoes those steps as it would after a kill.
    """
    root = self.workdir / "checkpoints"
    steps = sorted(manager.all_steps(), reverse=True)
    for i, step in enumerate(steps):
      try:
        restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state),
                                                                 data=ocp.args.JsonRestore()))
      except Exception as e:  # noqa: BLE001  orbax / tensorstore raise plain Exception, ValueError, OSError
        model_ckpt.quiet_abandoned_reads()
        why = model_ckpt.read_failure(e)
        if i == len(steps) - 1:
          raise model_ckpt.CheckpointError(f"no checkpoint in {root} can be restored; the oldest, step {step}, "
                                           f"fails with: {why}") from None
        aside = root / f"{step}.damaged-{int(time.time())}"
        if self.is_main:
          print(f"checkpoint step {step} in {root} cannot be restored ({why}); moved to {aside.name}, falling back "
                f"to step {steps[i + 1]}", file=sys.stderr)
          os.replace(root / str(step), aside)  # renamed, never deleted: orbax no longer counts it as a step
        if jax.process_count() > 1:
          multihost_utils.sync_global_devices(f"checkpoint {step} moved aside")
        continue
      if i:
        manager.reload()  # forget the steps moved aside, so training can save those step numbers again
      iterator.set_state(restored["data"])
      return restored["state"], step
    raise AssertionError("unreachable: called with a latest step")

  # --- data ----------------------------------------------------------------------------------------
  def _iterator(self, tasks: list[dict]) -> Iterator[list[dict]]:
    ds = grain.MapDataset.source(tasks).shuffle(seed=self.config.seed).repeat(None)
    ds = ds.batch(self.config.prompts_per_step, drop_remainder=True, batch_fn=list)
    return ds.__iter__()

  # --- pieces of a step ----------------------------------------------------------------------------
  def _initial_params(self):
    if self.config.init_checkpoint:
      config, params = model_ckpt.load_model(self.config.init_checkpoint, self.sharding)
      # Remat and dtypes are how we run the architecture, not the architecture: a bf16 Qwen3-8B checkpoint
      # starts an f32-master-weights run (cast up here).
      mine = self.model_config
      diff = architecture_mismatch(config, mine)
      if diff:
        raise config_lib.ConfigFileError(
            f"config key 'model' does not match the checkpoint {self.config.init_checkpoint} (differs in "
            f"{', '.join(diff)}); copy its model_config.json")
      dtype = mine.jnp_param_dtype
      return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, params)
    return qwen3.init_params(self.model_config, jax.random.key(self.config.seed), self.sharding)

  def _warmup(self, state, setup: EnvSetup):
    """Supervised warm-up on random-tool trajectories (format only): cross-entropy on the assistant tokens."""
    sft = self.config.sft
    if not sft.steps or setup.sft_examples is None:
      return state
    examples = setup.sft_examples(self.tokenizer, setup.train_tasks, self.config.seed)
    rows = [(tokens, sum(mask), [0.0] * sum(mask), 1.0) for tokens, mask in examples]
    config = self.model_config
    window = self.train_config.logprob_window
    tx = optax.adam(sft.learning_rate)
    opt_state = tx.init(state.params)

    @jax.jit
    def step(params, opt_state, batch):
      def loss_fn(p):
        logp, _ = token_logprobs(config, p, batch["tokens"], batch["positions"], batch["segment_ids"],
                                 sharding=self.sharding, window=window)
        return -(logp * batch["response_mask"]).sum() / batch["response_mask"].sum()
      loss, grads = jax.value_and_grad(loss_fn)(params)
      updates, opt_state = tx.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), opt_state, loss

    if len(rows) < sft.batch_size:
      raise config_lib.ConfigFileError(f"config key 'sft.batch_size' ({sft.batch_size}) exceeds the {len(rows)} "
                                       "warm-up examples the training tasks give; lower it or add tasks")
    rng = np.random.default_rng(self.config.seed)
    params = state.params
    bar = self._bar(range(sft.steps), "warm-up")
    for i in bar:
      pick = rng.choice(len(rows), size=sft.batch_size, replace=False)
      batch = build_batch([rows[j] for j in pick], self.config.train.seq_bucket, sft.batch_size)
      # Global arrays (the same host batch on every process) so a multi-process jit accepts them.
      params, opt_state, loss = step(params, opt_state, shard_batch(batch, self.sharding))
      if hasattr(bar, "set_postfix"):
        bar.set_postfix(loss=f"{float(loss):.3f}")
    self.metrics.write(0, "warmup", {"loss": float(loss)})
    return init_train_state(self.model_config, params, self.train_config, self.sharding)

  def _bar(self, iterable, desc: str, initial: int = 0, total: int | None = None):
    if self.quiet or not self.is_main:
      return iterable
    return tqdm(iterable, desc=desc, initial=initial, total=total, dynamic_ncols=True, file=sys.stderr)

  def _rollouts(self, sampler, setup: EnvSetup, tasks: list[dict], seeds: list[int], temperature=None):
    """(trajectories, outcomes, stats). Each rollout is graded the moment it ends (tau2 grading needs the live
    episode), on a small pool so a remote judge does not stall decoding.

    With several processes only process 0 runs the agent loop (tools and grading happen once); the others replay
    its sampler calls (`lockstep`) so the SPMD decode steps line up, then everyone gets process 0's results."""
    def run(sampler_like):
      loop = AgentLoop(sampler_like, self.tokenizer, setup.env, self.config.rollout.rollout_config(temperature))
      with cf.ThreadPoolExecutor(max_workers=GRADE_WORKERS, thread_name_prefix="grade") as pool:
        graded: dict[int, cf.Future] = {}
        trajs = loop.run(tasks, seeds=seeds, on_done=lambda i, traj, episode, wall: graded.__setitem__(
            i, pool.submit(setup.grade, tasks[i], traj, episode)))
        outcomes = [float(graded[i].result()) for i in range(len(tasks))]
      return trajs, outcomes, loop.stats

    if jax.process_count() == 1:
      return run(sampler)

    def on_main(leader):
      trajs, outcomes, stats = run(leader)
      return {"trajs": [t.to_dict() for t in trajs], "outcomes": outcomes, "stats": stats.to_dict()}

    # Process 0 uses the round-tripped copies too, so every process trains on identical objects.
    result = lockstep.run_on_main(sampler, on_main)
    return ([Trajectory.from_dict(d) for d in result["trajs"]], [float(o) for o in result["outcomes"]],
            RolloutStats(**result["stats"]))

  def _score(self, setup: EnvSetup, tasks, trajs, outcomes, groups: int, group_size: int):
    arrays = [group_arrays(trajs[g * group_size:(g + 1) * group_size], setup.aliases,
                           outcomes[g * group_size:(g + 1) * group_size], by="alias") for g in range(groups)]
    stacked = {k: np.stack([a[k] for a in arrays]) for k in arrays[0]}
    preference = np.stack([setup.preference_vector(tasks[g * group_size]) for g in range(groups)])
    scored = score_groups(self.reward_config, stacked["tool_counts"], stacked["outcome"], stacked["cost"],
                          stacked["latency"], preference, stacked["has_final_answer"])
    return stacked, {k: np.asarray(v) for k, v in scored.items()}

  def _evaluate(self, sampler, setup: EnvSetup, step: int) -> dict[str, dict[str, float]]:
    results = {}
    for pref, tasks in setup.eval_tasks.items():
      trajs, outcomes, _ = self._rollouts(sampler, setup, tasks, seeds=list(range(len(tasks))), temperature=0.0)
      values = {"accuracy": float(np.mean(outcomes)), "cost_per_task": float(np.mean([t.cost_usd for t in trajs])),
                "latency_per_task": float(np.mean([t.latency_s for t in trajs])),
                "no_answer": float(np.mean([t.final_answer is None for t in trajs]))}
      values.update({f"share_{a}": s for a, s in _tool_shares(trajs, setup.aliases).items()})
      self.metrics.write(step, f"eval_{pref}", values)
      results[pref] = values
    return results

  def _update(self, state, ref_params, rows, step: int):
    """One PPO epoch over the turn samples in mini-batches; returns (state, mean metrics)."""
    cfg = self.config
    if cfg.train.logprob_window and max(r[1] for r in rows) > cfg.train.logprob_window:
      raise UserError(f"a response of {max(r[1] for r in rows)} tokens exceeds train.logprob_window="
                      f"{cfg.train.logprob_window}; raise it to at least rollout.max_new_tokens")
    rng = np.random.default_rng([cfg.seed, step, 7])
    m = cfg.train.mini_batch_size
    batches = []
    for _ in range(cfg.train.ppo_epochs):
      order = rng.permutation(len(rows))
      batches += [build_batch([rows[i] for i in order[s:s + m]], cfg.train.seq_bucket, m)
                  for s in range(0, len(order), m)]
    # Old and reference log-probs of every mini-batch come from the params that sampled the rollouts, before
    # any update of this step; otherwise the PPO ratio of later mini-batches would be 1 by construction.
    mismatch = 0.0
    device_batches = []
    for batch in batches:
      # Global arrays on the batch sharding, built from the same host batch on every process.
      device_batch = shard_batch(batch, self.sharding)
      mask = batch["response_mask"] > 0
      if cfg.train.old_logprobs == "recompute":
        old = _to_host(self.compute_logprobs(state.params, device_batch))
        if mask.any():
          mismatch = max(mismatch, float(np.abs(old - batch["old_logprobs"])[mask].max()))
        device_batch["old_logprobs"] = shard_batch({"old_logprobs": (old * mask).astype(np.float32)},
                                                   self.sharding)["old_logprobs"]
      if self.train_config.loss.kl_coef:
        device_batch["ref_logprobs"] = self.compute_logprobs(ref_params, device_batch) * device_batch["response_mask"]
      if cfg.debug.nan_at_step == step:
        device_batch["advantages"] = device_batch["advantages"] * jnp.nan
      device_batches.append(device_batch)
    sums, count = {}, 0
    for device_batch in device_batches:
      state, metrics = self.train_step(state, device_batch)
      if not is_finite(metrics):
        raise TrainingDiverged(f"non-finite loss or gradient at RL step {step}; stopped without saving it "
                               f"(the latest checkpoint in {self.workdir / 'checkpoints'} is the last good one)")
      for k, v in metrics.items():
        sums[k] = sums.get(k, 0.0) + float(v)
      count += 1
    sums["logprob_mismatch"] = mismatch
    means = {k: (v / count if k != "logprob_mismatch" else v) for k, v in sums.items()}
    return state, means

  # --- the loop ------------------------------------------------------------------------------------
  def run(self) -> dict[str, Any]:
    cfg = self.config
    with ENVIRONMENTS[cfg.env.name](cfg) as setup:
      iterator = self._iterator(setup.train_tasks)
      manager = self._manager()
      ref_dir = self.workdir / "reference"
      latest = manager.latest_step()
      if latest is None:
        if ref_dir.exists():  # a crash between saving the reference and the first checkpoint
          shutil.rmtree(ref_dir)
        self.metrics.rewind(-1)
        state = init_train_state(self.model_config, self._initial_params(), self.train_config, self.sharding)
        state = self._warmup(state, setup)
        # With the tokenizer files, so an export of any step of this run (`convert jax-to-hf WORKDIR`) ships them.
        model_ckpt.save_model(ref_dir, self.model_config, state.params,
                              tokenizer_dir=self.config.tokenizer_dir or str(tokenizer_lib.qwen3_tokenizer_dir()))
        self._save(manager, 0, state, iterator)
        start = 0
      else:
        abstract = jax.eval_shape(lambda: init_train_state(self.model_config, qwen3.abstract_params(self.model_config),
                                                           self.train_config))
        shardings = train_state_shardings(self.model_config, self.train_config, self.sharding)
        abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)
        state, start = self._restore(manager, abstract, iterator)
        self.metrics.rewind(start)
        if self.is_main:
          print(f"resuming from checkpoint step {start} in {self.workdir / 'checkpoints'}", file=sys.stderr)
      # The frozen reference only runs forward passes, which cast weights to model.dtype anyway: keep it in that
      # dtype (half the memory with f32 master weights; bit-identical log-probs).
      ref_params = jax.jit(functools.partial(compute_params, self.model_config))(
          model_ckpt.restore_params(ref_dir, self.model_config, self.sharding))
      sampler = Sampler(self.model_config, state.params, max_len=cfg.rollout.max_len,
                        batch_size=cfg.rollout.batch_size, sharding=self.sharding, chunk_steps=cfg.rollout.chunk_steps)
      if start == 0:
        self._evaluate(sampler, setup, 0)

      rollout_dir = self.workdir / "rollouts"
      rollout_dir.mkdir(exist_ok=True)
      g = cfg.group_size
      for step in self._bar(range(start + 1, cfg.steps + 1), "RL", initial=start, total=cfg.steps):
        t0 = time.perf_counter()
        tasks = next(iterator)
        rep = [t for t in tasks for _ in range(g)]
        seeds = [int(s) for s in np.random.default_rng([cfg.seed, step]).integers(0, 2**31 - 1, len(rep))]
        trajs, outcomes, stats = self._rollouts(sampler, setup, rep, seeds)
        t1 = time.perf_counter()
        arrays, scored = self._score(setup, rep, trajs, outcomes, len(tasks), g)
        rows = []
        for i, traj in enumerate(trajs):
          if not scored["keep"].reshape(-1)[i]:
            continue
          adv = float(scored["advantages"].reshape(-1)[i])
          for s in traj.to_turn_samples(require_tool_call=cfg.reward.require_tool_call):
            rows.append((list(s.prompt_tokens) + list(s.response_tokens), len(s.response_tokens), list(s.old_logprobs),
                         adv))
        t2 = time.perf_counter()
        train_metrics = {}
        if rows:
          state, train_metrics = self._update(state, ref_params, rows, step)
          sampler.set_params(state.params)
        t3 = time.perf_counter()
        values = {"reward": float(scored["rewards"].mean()), "accuracy": float(np.mean(outcomes)),
                  "cost_per_task": float(arrays["cost"].mean()), "latency_per_task": float(arrays["latency"].mean()),
                  "no_answer": float(1 - arrays["has_final_answer"].mean()), "kept": float(scored["keep"].mean()),
                  "turn_samples": float(len(rows)), "tokens_per_s": stats.generated_tokens / max(t1 - t0, 1e-9),
                  "time_rollout_s": t1 - t0, "time_reward_s": t2 - t1, "time_update_s": t3 - t2,
                  "time_tool_wait_s": stats.tool_wait_s, "time_decode_s": stats.decode_s}
        values.update({f"share_{a}": s for a, s in _tool_shares(trajs, setup.aliases).items()})
        values.update(train_metrics)
        self.metrics.write(step, "train", values)
        if self.is_main:
          with open(rollout_dir / f"step_{step:06d}.jsonl", "w") as f:
            for task, traj, r, a in zip(rep, trajs, scored["rewards"].reshape(-1), scored["advantages"].reshape(-1)):
              record = {"task": task, "reward": float(r), "advantage": float(a), "trajectory": json.loads(traj.to_json())}
              f.write(json.dumps(record) + "\n")
        if step % cfg.eval_every == 0 or step == cfg.steps:
          self._evaluate(sampler, setup, step)
        if step % cfg.checkpoint_every == 0 or step == cfg.steps:
          self._save(manager, step, state, iterator)
      manager.wait_until_finished()
      manager.close()
    self.metrics.close()
    records = self.metrics.read()
    if self.is_main:
      plots.write_plots(records, self.workdir / "plots")
    return summarize(records)


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
  """First vs last evaluation per preference."""
  evals: dict[str, list[dict]] = {}
  for r in records:
    if r["kind"].startswith("eval_"):
      evals.setdefault(r["kind"][5:], []).append(r)
  return {pref: {"first": rs[0], "last": rs[-1]} for pref, rs in evals.items()}


def format_summary(summary: dict[str, Any]) -> str:
  lines = ["| preference | eval | step | accuracy | cost/task (USD) | tool shares |", "|---|---|---|---|---|---|"]
  for pref, both in summary.items():
    for which in ("first", "last"):
      r = both[which]
      shares = ", ".join(f"{k[6:]} {v:.0%}" for k, v in sorted(r.items()) if k.startswith("share_"))
      lines.append(f"| {pref} | {which} | {r['step']} | {r['accuracy']:.1%} | {r['cost_per_task']:.2e} | {shares} |")
  return "\n".join(lines)
