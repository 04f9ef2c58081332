"""Multi-process rollouts: one controller for the host logic, every process in the sampler's collectives.

In a multi-process run (`orchestra_jax.distributed`) the sampler's jitted steps are SPMD programs over the global
mesh: every process must call them in the same order with the same inputs. The agent loop around them must not run
everywhere, though: it calls tools (HTTP experts, sandboxes: N x the bill, replies that may differ) and schedules
rows by when tool futures complete, so loops on different processes would drift apart and deadlock in a collective.

So process 0 runs the agent loop (tools, grading) against a `Leader`, a proxy of its `Sampler` that records each
slot command (`start`, `extend`, `truncate`, `release`) and, at each `step`, broadcasts the commands since the last
step before running the real one. The other processes run `follow(sampler)`: they replay the same commands on their
own `Sampler` and step at the same points, so every process's host mirror (rows, staged prefills, settings) and
every jitted call agree. `run_on_main` wraps the whole exchange and broadcasts process 0's result to everyone.

Messages are JSON: its length is broadcast first, then the bytes padded to a power of two (few distinct shapes, so
few compiled broadcasts). A failure on process 0 is broadcast too, so the followers raise instead of hanging.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable

import jax
import numpy as np
from jax.experimental import multihost_utils

from orchestra_jax.rollout.sampler import Sampler, SamplingParams, TurnResult

THEN_STEP, THEN_END, THEN_ABORT = "step", "end", "abort"


class LockstepError(RuntimeError):
  """Process 0 failed while the other processes were following it; raised on those processes."""


# --- transport -------------------------------------------------------------------------------------------

def _broadcast_bytes(data: bytes | None) -> bytes:
  """Process 0's `data` on every process (`data` is ignored elsewhere)."""
  is_main = jax.process_index() == 0
  n = np.array([len(data) if is_main else 0], np.int32)  # int32: JAX without x64 would narrow int64 anyway
  n = int(np.asarray(multihost_utils.broadcast_one_to_all(n))[0])
  size = 1 << max(n - 1, 0).bit_length()
  buf = np.zeros((size,), np.uint8)
  if is_main:
    buf[:n] = np.frombuffer(data, np.uint8)
  buf = np.asarray(multihost_utils.broadcast_one_to_all(buf))
  return buf[:n].tobytes()


def broadcast_json(value: Any = None) -> Any:
  """Process 0's JSON-able `value` on every process."""
  data = json.dumps(value, separators=(",", ":")).encode() if jax.process_index() == 0 else None
  return json.loads(_broadcast_bytes(data).decode())


# --- commands --------------------------------------------------------------------------------------------

def _sampling_to_json(sampling: SamplingParams | None):
  return None if sampling is None else dataclasses.asdict(sampling)


def _sampling_from_json(d) -> SamplingParams | None:
  if d is None:
    return None
  if d.get("stop_ids") is not None:
    d = dict(d, stop_ids=tuple(d["stop_ids"]))
  return SamplingParams(**d)


def _apply(sampler: Sampler, op: list) -> None:
  kind, args = op[0], op[1:]
  if kind == "start":
    slot, prompt, sampling, seed = args
    sampler.start(slot, prompt, _sampling_from_json(sampling), seed)  # tags are process 0's business
  elif kind == "extend":
    slot, tokens, sampling, seed = args
    sampler.extend(slot, tokens, _sampling_from_json(sampling), seed)
  elif kind == "truncate":
    sampler.truncate(*args)
  elif kind == "release":
    sampler.release(*args)
  else:
    raise LockstepError(f"unknown lockstep command {kind!r}")


class Leader:
  """Process 0's stand-in for a `Sampler` (what `AgentLoop` needs): slot commands are applied locally at once
  (so errors surface here, where the caller can see them) and recorded; `step` ships them, then steps."""

  def __init__(self, sampler: Sampler):
    self._sampler = sampler
    self._pending: list[list] = []
    self.closed = False

  def __getattr__(self, name):  # read-only queries (free_slots, has_work, conversation, max_len, ...)
    return getattr(self._sampler, name)

  def start(self, slot: int, prompt, sampling: SamplingParams | None = None, seed: int = 0, tag: Any = None) -> None:
    self._sampler.start(slot, prompt, sampling, seed, tag)
    self._pending.append(["start", int(slot), [int(t) for t in prompt], _sampling_to_json(sampling), int(seed)])

  def extend(self, slot: int, tokens, sampling: SamplingParams | None = None, seed: int | None = None) -> None:
    self._sampler.extend(slot, tokens, sampling, seed)
    self._pending.append(["extend", int(slot), [int(t) for t in tokens], _sampling_to_json(sampling),
                          None if seed is None else int(seed)])

  def truncate(self, slot: int, length: int) -> None:
    self._sampler.truncate(slot, length)
    self._pending.append(["truncate", int(slot), int(length)])

  def release(self, slot: int) -> None:
    self._sampler.release(slot)
    self._pending.append(["release", int(slot)])

  def step(self) -> list[TurnResult]:
    self._send(THEN_STEP)
    return self._sampler.step()

  def end(self) -> None:
    """Lets the followers return (after replaying any trailing commands, e.g. the last releases)."""
    self._send(THEN_END)
    self.closed = True

  def abort(self, message: str) -> None:
    self._pending = []
    self._send(THEN_ABORT, message)
    self.closed = True

  def _send(self, then: str, error: str | None = None) -> None:
    if self.closed:
      raise LockstepError("the lockstep session has ended")
    msg = {"ops": self._pending, "then": then}
    if error is not None:
      msg["error"] = error
    self._pending = []
    broadcast_json(msg)


def follow(sampler: Sampler) -> None:
  """On a process other than 0: replay process 0's commands and steps until it ends the session."""
  while True:
    msg = broadcast_json()
    for op in msg["ops"]:
      _apply(sampler, op)
    if msg["then"] == THEN_END:
      return
    if msg["then"] == THEN_ABORT:
      raise LockstepError(f"process 0 failed during rollouts: {msg.get('error')}")
    sampler.step()


def run_on_main(sampler: Sampler, fn: Callable[[Leader], Any]) -> Any:
  """Runs `fn(leader)` on process 0 while the other processes follow its sampler calls; returns fn's JSON-able
  result on every process. An exception in `fn` is re-raised on process 0 and raised as `LockstepError` elsewhere."""
  if jax.process_index() != 0:
    follow(sampler)
    reply = broadcast_json()
    if "error" in reply:
      raise LockstepError(f"process 0 failed after rollouts: {reply['error']}")
    return reply["result"]
  leader = Leader(sampler)
  try:
    result = fn(leader)
  except BaseException as e:
    message = f"{type(e).__name__}: {e}"
    if not leader.closed:
      leader.abort(message)
    else:
      broadcast_json({"error": message})
    raise
  if not leader.closed:
    leader.end()
  broadcast_json({"result": result})
  return result
