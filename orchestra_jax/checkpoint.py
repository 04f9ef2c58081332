"""Model checkpoints on disk: our orbax layout, HF directories, `orchestra train` runs, and loading any onto a mesh.

Our model checkpoint directory:
    model_config.json   the ModelConfig as JSON
    params/             orbax checkpoint of the params pytree (written atomically by orbax: tmp dir + rename)
    tokenizer files     copied through (tokenizer.json, tokenizer_config.json, ...) when known

An `orchestra train` workdir (orchestra_jax/trainer.py) holds a trained policy too:
    reference/              the frozen starting model, a model checkpoint as above (its model_config.json is the
                            run's model config)
    checkpoints/<step>/     orbax CheckpointManager steps, items `state` (TrainState: step, params, opt_state)
                            and `data` (iterator state); a step is written under `<step>.orbax-checkpoint-tmp-*`
                            and renamed when complete, so only finished steps carry a plain number
Everything that loads a model (`load_model`, `read_model_config`, `restore_params`) also takes a step directory
`WORKDIR/checkpoints/<step>` or the workdir itself (its latest finished step); only the params are read from the
`state` item, never the optimizer moments (twice the params' size with Adam).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import types
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from orchestra_jax.errors import UserError
from orchestra_jax.model import hf_weights, qwen3
from orchestra_jax.model.config import ModelConfig
from orchestra_jax.sharding import ShardingConfig

MODEL_CONFIG_FILE = "model_config.json"
PARAMS_DIR = "params"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json",
                   "added_tokens.json", "tokenizer.model", "chat_template.jinja", "chat_template.json")
# The layout `orchestra train` writes in its workdir (orchestra_jax/trainer.py: Trainer._manager, Trainer.run).
TRAIN_CHECKPOINTS_DIR = "checkpoints"
TRAIN_REFERENCE_DIR = "reference"
TRAIN_STATE_ITEM = "state"


class CheckpointError(UserError, RuntimeError):
  """A checkpoint directory that is missing, incomplete or does not match its config."""


def is_orchestra_checkpoint(path: str | os.PathLike) -> bool:
  p = Path(path)
  return (p / MODEL_CONFIG_FILE).is_file() and (p / PARAMS_DIR).is_dir()


def is_hf_dir(path: str | os.PathLike) -> bool:
  p = Path(path)
  return (p / "config.json").is_file()


# --- `orchestra train` workdirs --------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class TrainCheckpoint:
  """One finished step of an `orchestra train` run: params in `path/state`, config in the workdir's reference."""
  workdir: Path
  step: int
  path: Path  # WORKDIR/checkpoints/<step>

  @property
  def reference_dir(self) -> Path:
    return self.workdir / TRAIN_REFERENCE_DIR


def train_checkpoint_steps(workdir: str | os.PathLike) -> dict[int, Path]:
  """step -> directory of every finished checkpoint in WORKDIR/checkpoints, oldest first.

  Steps are found exactly as the trainer's CheckpointManager finds them (orbax's standard step-name format with
  its finalization check), so in-progress `<step>.orbax-checkpoint-tmp-*` directories and stray folders are not
  steps.
  """
  root = Path(workdir) / TRAIN_CHECKPOINTS_DIR
  if not root.is_dir():
    return {}
  found = ocp.path.step.standard_name_format().find_all(root)
  return {m.step: Path(m.path) for m in sorted(found, key=lambda m: m.step)}


def _is_train_workdir(path: Path) -> bool:
  return (path / TRAIN_CHECKPOINTS_DIR).is_dir() or (path / TRAIN_REFERENCE_DIR).is_dir()


def find_train_checkpoint(path: str | os.PathLike) -> TrainCheckpoint | None:
  """The trainer step `path` names: WORKDIR/checkpoints/<step>, or WORKDIR (or WORKDIR/checkpoints) for its latest.

  None when `path` is no part of a trainer workdir (a model checkpoint, an HF directory, anything else).
  Raises CheckpointError, one line, for a trainer path that cannot be loaded: a step that is missing or unfinished
  (naming the available ones), a workdir without a finished checkpoint, or no reference/model_config.json.
  """
  p = Path(path).absolute()
  if is_orchestra_checkpoint(p) or is_hf_dir(p):
    return None
  if p.name == TRAIN_CHECKPOINTS_DIR and (p.parent / TRAIN_REFERENCE_DIR).is_dir():
    p = p.parent  # WORKDIR/checkpoints means the run, as WORKDIR does
  # A step dir by its place; the state item or the run's reference tell it from any folder named `checkpoints`.
  workdir = p.parent.parent
  step_like = (p / TRAIN_STATE_ITEM).is_dir() or (workdir / TRAIN_REFERENCE_DIR).is_dir()
  if p.parent.name == TRAIN_CHECKPOINTS_DIR and step_like:
    steps = train_checkpoint_steps(workdir)
    chosen = [s for s, d in steps.items() if d.name == p.name]
    if not chosen:
      available = ", ".join(map(str, steps)) or "none"
      what = "is not a finished checkpoint step" if p.exists() else "does not exist"
      raise CheckpointError(f"{p} {what}; finished steps in {workdir / TRAIN_CHECKPOINTS_DIR}: {available}")
    found = TrainCheckpoint(workdir, chosen[0], steps[chosen[0]])
  elif p.is_dir() and _is_train_workdir(p):
    steps = train_checkpoint_steps(p)
    if not steps:
      raise CheckpointError(f"{p} is an orchestra train workdir without a finished checkpoint in "
                            f"{p / TRAIN_CHECKPOINTS_DIR}; train until one is saved (config key checkpoint_every)")
    latest = max(steps)
    found = TrainCheckpoint(p, latest, steps[latest])
  else:
    return None
  if not (found.reference_dir / MODEL_CONFIG_FILE).is_file():
    raise CheckpointError(f"{found.reference_dir / MODEL_CONFIG_FILE} is missing: the trainer writes the run's model "
                          f"config there, and {found.path} cannot be read without it")
  return found


# --- save and load -------------------------------------------------------------------------------------

def make_world_readable(paths) -> None:
  """Files 0644, folders 0755, whatever the umask or the writer chose (safetensors writes 0600): a model is
  served by another user more often than not (a vLLM container, a shared cluster account)."""
  for path in paths:
    path = Path(path)
    os.chmod(path, 0o755 if path.is_dir() else 0o644)


def copy_tokenizer_files(src: str | os.PathLike, dst: str | os.PathLike) -> list[str]:
  """Copies the tokenizer files found in `src` to `dst`; returns their names."""
  copied = []
  for name in TOKENIZER_FILES:
    if (Path(src) / name).is_file():
      shutil.copyfile(Path(src) / name, Path(dst) / name)
      copied.append(name)
  return copied


def save_model(path: str | os.PathLike, config: ModelConfig, params: Any, tokenizer_dir: str | None = None) -> Path:
  """Writes a model checkpoint. Params may be numpy or (sharded) jax arrays; each host writes its shards."""
  path = Path(path).absolute()
  if (path / PARAMS_DIR).exists():
    raise CheckpointError(f"{path / PARAMS_DIR} already exists; refusing to overwrite a checkpoint")
  path.mkdir(parents=True, exist_ok=True)
  with ocp.StandardCheckpointer() as ckptr:
    ckptr.save(path / PARAMS_DIR, params)
    ckptr.wait_until_finished()
  # The small host-side files come from process 0 alone: processes sharing a filesystem would race on the
  # same temporary file. The others wait for them, so a read right after this returns finds them everywhere.
  if jax.process_index() == 0:
    tmp = path / (MODEL_CONFIG_FILE + ".tmp")
    tmp.write_text(config.to_json())
    os.replace(tmp, path / MODEL_CONFIG_FILE)
    copied = copy_tokenizer_files(tokenizer_dir, path) if tokenizer_dir else []
    make_world_readable([path, path / MODEL_CONFIG_FILE, *(path / name for name in copied)])
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(f"save_model {path}")
  return path


def _read_json_object(path: Path) -> dict[str, Any]:
  """A config file's JSON object; a truncated, binary or non-object file is a CheckpointError naming it."""
  try:
    data = json.loads(path.read_bytes().decode("utf-8"))
  except UnicodeDecodeError:
    raise CheckpointError(f"{path} is not UTF-8 text (a damaged checkpoint?)") from None
  except json.JSONDecodeError as e:
    raise CheckpointError(f"{path} is not valid JSON (truncated or damaged?): {e}") from None
  if not isinstance(data, dict):
    raise CheckpointError(f"{path} must hold a JSON object, got {type(data).__name__}")
  return data


def read_failure(e: Exception) -> str:
  """The gist of an orbax / tensorstore read error: theirs run to hundreds of lines of tensorstore spec."""
  first = (str(e).strip().splitlines() or [type(e).__name__])[0]
  return first.split(" See full TensorStore details")[0][:200]


def quiet_abandoned_reads() -> None:
  """After one read of a damaged checkpoint fails, orbax abandons its other reads as coroutines never awaited; when
  they are collected (at exit, often) each prints its own copy of the failure as 'Exception ignored in ...' with a
  traceback, after the caller's one-line report of the damage. Drop those, pass anything else on."""
  previous = sys.unraisablehook
  if getattr(previous, "_orchestra_quiet", False):
    return

  def hook(unraisable):
    obj = unraisable.object
    if isinstance(obj, types.CoroutineType) and "orbax" in obj.cr_code.co_filename:
      return
    previous(unraisable)

  hook._orchestra_quiet = True
  sys.unraisablehook = hook


def _damaged(path: Path, e: Exception) -> CheckpointError:
  """An orbax / tensorstore read that failed on the files themselves (truncated, missing, corrupt)."""
  quiet_abandoned_reads()
  return CheckpointError(f"checkpoint {path} is damaged or incomplete (a truncated or corrupt file?); reading it "
                         f"failed: {read_failure(e)}")


def read_model_config(path: str | os.PathLike) -> ModelConfig:
  """The ModelConfig of a model checkpoint, an HF directory or a trainer workdir / step (its reference's)."""
  p = Path(path)
  found = find_train_checkpoint(p)
  if found:
    p = found.reference_dir
  if not p.exists():
    raise CheckpointError(f"model directory {p} does not exist")
  if (p / MODEL_CONFIG_FILE).is_file():
    return ModelConfig.from_dict(_read_json_object(p / MODEL_CONFIG_FILE))
  if (p / "config.json").is_file():
    return ModelConfig.from_hf_config(_read_json_object(p / "config.json"))
  raise CheckpointError(f"{p} holds neither {MODEL_CONFIG_FILE} (orchestra checkpoint), config.json (HF model) nor "
                        f"{TRAIN_CHECKPOINTS_DIR}/ (orchestra train workdir)")


def _params_target(config: ModelConfig, sharding: ShardingConfig | None):
  """Abstract params to restore onto: with the mesh's shardings, else on the first device."""
  if sharding is None:
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=device),
                        qwen3.abstract_params(config))
  return qwen3.abstract_params(config, sharding)


def _leaf_shapes(tree) -> dict[str, tuple[int, ...]]:
  """Dotted leaf name (e.g. layers.attn.q_proj) -> shape, for arrays, ShapeDtypeStructs or orbax metadata."""
  return {".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path): tuple(leaf.shape)
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _restore_train_params(found: TrainCheckpoint, config: ModelConfig, sharding: ShardingConfig | None):
  """The params of a trainer step, read out of its TrainState without touching step or optimizer state."""
  state_dir = found.path / TRAIN_STATE_ITEM
  if not state_dir.is_dir():
    raise CheckpointError(f"trainer checkpoint {found.path} has no {TRAIN_STATE_ITEM}/ item")
  target = {"params": _params_target(config, sharding)}
  where = f"checkpoint {state_dir} does not match the model config ({found.reference_dir / MODEL_CONFIG_FILE})"
  with ocp.PyTreeCheckpointer() as ckptr:
    # partial_restore leaves keys the target lacks unread, and hands back the target's ShapeDtypeStruct for keys
    # the checkpoint lacks; a shape mismatch fails mid-restore with pending reads. So compare names and shapes
    # with the metadata first: a config that does not fit fails here, in one line, and any later failure is
    # damage to the files.
    try:
      stored = ckptr.metadata(state_dir).item_metadata.tree.get("params")
    except Exception as e:  # noqa: BLE001  orbax / tensorstore raise plain Exception, ValueError, OSError
      raise _damaged(found.path, e) from None
    if stored is None:
      raise CheckpointError(f"{where}: it holds no params")
    _check_shapes(target["params"], stored, where)
    try:
      restored = ckptr.restore(state_dir, args=ocp.args.PyTreeRestore(
          item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=True))
    except Exception as e:  # noqa: BLE001  as above
      raise _damaged(found.path, e) from None
  return restored["params"]


def _check_shapes(want_tree, have_tree, where: str) -> None:
  want, have = _leaf_shapes(want_tree), _leaf_shapes(have_tree)
  diff = {"missing": sorted(set(want) - set(have)), "unexpected": sorted(set(have) - set(want)),
          "of another shape": [f"{k} {have[k]} (config: {want[k]})" for k in sorted(set(want) & set(have))
                               if want[k] != have[k]]}
  if any(diff.values()):
    raise CheckpointError(f"{where}: params " + "; ".join(f"{what} {', '.join(names[:3])}"
                                                           for what, names in diff.items() if names))


def restore_params(path: str | os.PathLike, config: ModelConfig, sharding: ShardingConfig | None = None):
  """Restores our orbax params (a model checkpoint, or a trainer workdir / step); with `sharding`, each array is
  placed on the mesh as it loads."""
  found = find_train_checkpoint(path)
  if found:
    return _restore_train_params(found, config, sharding)
  params_dir = Path(path).absolute() / PARAMS_DIR
  if not params_dir.is_dir():
    raise CheckpointError(f"no params checkpoint at {params_dir}")
  target = _params_target(config, sharding)
  where = f"checkpoint {params_dir} does not match {path}/{MODEL_CONFIG_FILE}"
  with ocp.StandardCheckpointer() as ckptr:
    # Names and shapes from the metadata first (see _restore_train_params): what fails after that is damage.
    try:
      stored = ckptr.metadata(params_dir).item_metadata.tree
    except Exception as e:  # noqa: BLE001  orbax / tensorstore raise plain Exception, ValueError, OSError
      raise _damaged(params_dir, e) from None
    _check_shapes(target, stored, where)
    try:
      return ckptr.restore(params_dir, target)
    except Exception as e:  # noqa: BLE001  as above
      raise _damaged(params_dir, e) from None


def load_model(path: str | os.PathLike, sharding: ShardingConfig | None = None, **config_overrides):
  """(config, params) from our checkpoint, an HF directory, or an `orchestra train` run, optionally sharded.

  A run is its workdir (the latest finished step) or one step, WORKDIR/checkpoints/<step>: the config comes from
  WORKDIR/reference/model_config.json and only the params are read from the step's TrainState.
  """
  # Resolved once: a run still training may finish a newer step between reading the config and the params.
  found = find_train_checkpoint(path)
  config = read_model_config(found.reference_dir if found else path)
  if config_overrides:
    config = config.replace(**config_overrides)
  if found:
    return config, _restore_train_params(found, config, sharding)
  if is_orchestra_checkpoint(path):
    return config, restore_params(path, config, sharding)
  host_params = hf_weights.read_hf_params(path, config)
  if sharding is None:
    return config, jax.tree.map(jax.numpy.asarray, host_params)
  shardings = qwen3.param_shardings(config, sharding)
  return config, jax.tree.map(lambda a, s: jax.device_put(a, s), host_params, shardings)


def tree_nbytes(tree: Any) -> int:
  return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))
