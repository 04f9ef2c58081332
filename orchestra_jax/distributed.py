"""Multi-host start-up: `jax.distributed.initialize()` driven by environment variables.

Call `maybe_initialize()` at the very start of a process, **before any other JAX use** (before `jax.devices()`,
creating arrays, jitting, building a mesh, loading a checkpoint): JAX refuses to join a distributed run once its
backend is up. `orchestra train` calls it first thing; the launch scripts in `launch/` set the variables.

Environment (all optional; without them this is a single-process run and nothing is initialised):

- `ORCHESTRA_DISTRIBUTED`: `1` (or `true`/`yes`/`on`) joins a multi-process run. Alone, JAX auto-detects the
  cluster (TPU pod slices, SLURM, Open MPI); this is what `launch/tpu_pod.sh` sets. `0`/`false`/`no`/`off`/empty:
  off (unless `ORCHESTRA_COORDINATOR` is set).
- `ORCHESTRA_COORDINATOR`: `HOST:PORT` of process 0's coordinator service; setting it turns distributed mode on.
- `ORCHESTRA_NUM_PROCESSES`: total number of processes, an integer >= 1.
- `ORCHESTRA_PROCESS_ID`: this process's index, an integer in `[0, ORCHESTRA_NUM_PROCESSES)`.
- `ORCHESTRA_LOCAL_DEVICE_IDS`: optional comma-separated device ids this process owns, e.g. `0,1`
  (for one process per GPU).
- `ORCHESTRA_INIT_TIMEOUT`: optional seconds to wait for all processes to connect (JAX's default: 300).

Either set all of `ORCHESTRA_COORDINATOR`, `ORCHESTRA_NUM_PROCESSES`, `ORCHESTRA_PROCESS_ID` (explicit; what
`launch/gpu.sh` sets) or none of them (auto-detection). A missing or malformed variable raises
`DistributedConfigError` naming it, before JAX is touched.

`is_coordinator()` is True on process 0 only: gate logging, metric writing and other once-per-job side effects on it.
(Checkpoint saves with orbax must still be called on every process; orbax coordinates the writes itself.)
"""

from __future__ import annotations

import os
import threading
from typing import Any, Mapping

from orchestra_jax.errors import UserError

ENV_DISTRIBUTED = "ORCHESTRA_DISTRIBUTED"
ENV_COORDINATOR = "ORCHESTRA_COORDINATOR"
ENV_NUM_PROCESSES = "ORCHESTRA_NUM_PROCESSES"
ENV_PROCESS_ID = "ORCHESTRA_PROCESS_ID"
ENV_LOCAL_DEVICE_IDS = "ORCHESTRA_LOCAL_DEVICE_IDS"
ENV_INIT_TIMEOUT = "ORCHESTRA_INIT_TIMEOUT"

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}

_lock = threading.Lock()
_info: dict[str, Any] | None = None


class DistributedConfigError(UserError):
  """An ORCHESTRA_* distributed environment variable is missing or malformed (the message names it)."""


def _get(env: Mapping[str, str], name: str) -> str | None:
  value = env.get(name)
  if value is None:
    return None
  value = value.strip()
  return value or None


def _parse_int(env: Mapping[str, str], name: str, minimum: int) -> int | None:
  raw = _get(env, name)
  if raw is None:
    return None
  try:
    value = int(raw)
  except ValueError:
    raise DistributedConfigError(f"{name}={env[name]!r} is not an integer") from None
  if value < minimum:
    raise DistributedConfigError(f"{name}={value} must be >= {minimum}")
  return value


def _parse_coordinator(raw: str) -> str:
  host, sep, port = raw.rpartition(":")
  if not sep or not host or host in ("[", "[]"):
    raise DistributedConfigError(f"{ENV_COORDINATOR}={raw!r} must be HOST:PORT, e.g. node0:12355")
  if not port.isdigit() or not 1 <= int(port) <= 65535:
    raise DistributedConfigError(f"{ENV_COORDINATOR}={raw!r} has an invalid port {port!r} (want 1..65535)")
  return raw


def parse_env(env: Mapping[str, str] | None = None) -> dict[str, Any] | None:
  """The `jax.distributed.initialize` keyword arguments the environment asks for, or None for a single-process run.

  Pure (does not touch JAX), so it can be tested and used to validate before launching. Raises
  `DistributedConfigError` naming the offending variable.
  """
  env = os.environ if env is None else env
  flag = (env.get(ENV_DISTRIBUTED) or "").strip().lower()
  if flag not in _TRUE | _FALSE:
    raise DistributedConfigError(
        f"{ENV_DISTRIBUTED}={env.get(ENV_DISTRIBUTED)!r} is not understood: use 1 (on) or 0 (off)")
  coordinator = _get(env, ENV_COORDINATOR)
  if flag not in _TRUE and coordinator is None:
    return None

  kwargs: dict[str, Any] = {}
  num = _parse_int(env, ENV_NUM_PROCESSES, minimum=1)
  pid = _parse_int(env, ENV_PROCESS_ID, minimum=0)
  if coordinator is not None:
    kwargs["coordinator_address"] = _parse_coordinator(coordinator)
    missing = [name for name, v in ((ENV_NUM_PROCESSES, num), (ENV_PROCESS_ID, pid)) if v is None]
    if missing:
      raise DistributedConfigError(
          f"{ENV_COORDINATOR} is set but {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not: "
          f"set {ENV_COORDINATOR}, {ENV_NUM_PROCESSES} and {ENV_PROCESS_ID} together (or none of them, "
          f"with {ENV_DISTRIBUTED}=1, to let JAX auto-detect the cluster)")
    if pid >= num:
      raise DistributedConfigError(
          f"{ENV_PROCESS_ID}={pid} is out of range for {ENV_NUM_PROCESSES}={num} (want 0..{num - 1})")
    kwargs["num_processes"] = num
    kwargs["process_id"] = pid
  else:
    given = [name for name, v in ((ENV_NUM_PROCESSES, num), (ENV_PROCESS_ID, pid)) if v is not None]
    if given:
      raise DistributedConfigError(
          f"{' and '.join(given)} {'is' if len(given) == 1 else 'are'} set but {ENV_COORDINATOR} is not: "
          f"set {ENV_COORDINATOR}=HOST:PORT too (or unset {' and '.join(given)} to let JAX auto-detect)")

  raw_ids = _get(env, ENV_LOCAL_DEVICE_IDS)
  if raw_ids is not None:
    try:
      ids = [int(x) for x in raw_ids.split(",")]
    except ValueError:
      raise DistributedConfigError(
          f"{ENV_LOCAL_DEVICE_IDS}={env[ENV_LOCAL_DEVICE_IDS]!r} must be comma-separated integers, e.g. 0,1") from None
    if any(i < 0 for i in ids) or len(set(ids)) != len(ids):
      raise DistributedConfigError(
          f"{ENV_LOCAL_DEVICE_IDS}={raw_ids!r} must list distinct non-negative device ids")
    kwargs["local_device_ids"] = ids

  timeout = _parse_int(env, ENV_INIT_TIMEOUT, minimum=1)
  if timeout is not None:
    kwargs["initialization_timeout"] = timeout
  return kwargs


def _describe(initialized: bool) -> dict[str, Any]:
  import jax  # noqa: PLC0415  late: config errors are reported before JAX is imported (see maybe_initialize)
  return {
      "distributed": initialized,
      "process_index": jax.process_index(),
      "process_count": jax.process_count(),
      "local_device_count": jax.local_device_count(),
      "global_device_count": jax.device_count(),
      "platform": jax.default_backend(),
  }


def maybe_initialize(env: Mapping[str, str] | None = None) -> dict[str, Any]:
  """Join the multi-process run the environment describes (see the module doc); a no-op for single-process runs.

  Must run before any other JAX use. Idempotent: later calls return the first call's result. Returns
  `{distributed, process_index, process_count, local_device_count, global_device_count, platform}`.
  Raises `DistributedConfigError` for a missing/malformed variable, and a `RuntimeError` explaining the fix if
  JAX was already used before this call.
  """
  global _info
  with _lock:
    if _info is not None:
      return dict(_info)
    kwargs = parse_env(env)  # validate everything before importing/touching jax
    import jax  # noqa: PLC0415  late: after the validation, so a config error costs no JAX import
    initialized = False
    if kwargs is not None:
      if jax.distributed.is_initialized():  # someone (e.g. a notebook) already did it: accept
        initialized = True
      else:
        try:
          jax.distributed.initialize(**kwargs)
        except RuntimeError as e:
          if "before any JAX" in str(e) or "must be called before" in str(e):
            raise RuntimeError(
                "orchestra_jax.distributed.maybe_initialize() must be called before any other JAX use (devices, "
                f"arrays, jit, meshes, checkpoints); JAX was already initialised in this process. ({e})") from e
          raise
        initialized = True
    _info = _describe(initialized)
    return dict(_info)


def is_coordinator() -> bool:
  """True on process 0 (and in single-process runs). Use it to gate logging and other once-per-job side effects.

  Calls `maybe_initialize()` first, so it is safe to use before JAX is otherwise touched.
  """
  return maybe_initialize()["process_index"] == 0
