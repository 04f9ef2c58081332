"""The generation engine behind `orchestra serve`: one background thread that owns a continuous-batching `Sampler`.

Handler threads call `Engine.submit(prompt ids, sampling params, seed)` and wait on the Future it returns. The
engine thread starts queued requests in free cache slots, calls `Sampler.step()` (prefills + one decode chunk),
resolves the futures of finished turns and releases their slots. Requests that arrive while others are decoding
join the batch at the next step. A request's greedy output does not depend on which other requests share the
batch (see `rollout/sampler.py` on per-row independence).

The engine knows nothing of HTTP or OpenAI and takes the sampler from a factory, so it imports no JAX itself.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import threading
from typing import Any, Callable, Sequence

log = logging.getLogger(__name__)

# Defaults of the server's cache shape (`orchestra serve --max-batch / --max-len`).
DEFAULT_MAX_BATCH = 8
DEFAULT_MAX_LEN = 4096


class EngineClosed(RuntimeError):
  """The server is shutting down (or its engine stopped): the request was not served. HTTP 503."""


@dataclasses.dataclass
class Generation:
  """What the engine returns for one request."""

  tokens: list[int]  # sampled ids, the final stop token included
  logprobs: list[float]
  finish_reason: str  # "stop" | "length" (the sampler's names; "tool_call" cannot happen, see Engine)


@dataclasses.dataclass
class _Request:
  prompt: list[int]
  sampling: Any  # SamplingParams
  seed: int
  future: concurrent.futures.Future


class Engine:
  """One background thread that owns a `Sampler` and runs its continuous-batching loop for many callers.

  `submit` may be called from any thread; it returns a Future that resolves to a `Generation` (or raises what
  went wrong for that request). A request the sampler rejects fails alone; an exception inside `step` fails
  the requests that were in the batch, after which a fresh sampler takes over, so the loop never dies.
  """

  def __init__(self, make_sampler: Callable[[], Any]):
    self._make_sampler = make_sampler
    self.sampler = make_sampler()
    self._cond = threading.Condition()
    self._queue: collections.deque[_Request] = collections.deque()
    self._running: dict[int, _Request] = {}  # slot -> request; engine thread only
    self._stopping = False
    self._thread: threading.Thread | None = None
    self.completed = 0  # requests finished (any outcome)
    self.generated_tokens = 0
    self.peak_batch = 0  # most requests decoding together so far

  @property
  def max_len(self) -> int:
    return self.sampler.max_len

  @property
  def batch_size(self) -> int:
    return self.sampler.batch_size

  def start(self) -> "Engine":
    if self._thread is None:
      self._thread = threading.Thread(target=self._loop, name="orchestra-serve-engine", daemon=True)
      self._thread.start()
    return self

  def alive(self) -> bool:
    return self._thread is not None and self._thread.is_alive()

  def queued(self) -> int:
    with self._cond:
      return len(self._queue)

  def submit(self, prompt: Sequence[int], sampling, seed: int = 0) -> concurrent.futures.Future:
    future: concurrent.futures.Future = concurrent.futures.Future()
    req = _Request([int(t) for t in prompt], sampling, int(seed), future)
    with self._cond:
      if self._stopping:
        future.set_exception(EngineClosed("the server is shutting down"))
        return future
      self._queue.append(req)
      self._cond.notify()
    return future

  def close(self, timeout: float = 30.0) -> None:
    """Stops the loop after the current step; queued and running requests fail with EngineClosed."""
    with self._cond:
      self._stopping = True
      self._cond.notify_all()
    if self._thread is not None:
      self._thread.join(timeout)
    with self._cond:
      leftover = list(self._queue) + list(self._running.values())
      self._queue.clear()
      self._running.clear()
    for req in leftover:
      _fail(req, EngineClosed("the server is shutting down"))

  def _loop(self) -> None:
    while True:
      with self._cond:
        while not self._stopping and not self._queue and not self.sampler.has_work():
          self._cond.wait()
        if self._stopping:
          return
        admit = []
        free = self.sampler.free_slots()
        while free and self._queue:
          admit.append((free.pop(0), self._queue.popleft()))
      for slot, req in admit:
        if not req.future.set_running_or_notify_cancel():
          continue  # cancelled while queued
        try:
          self.sampler.start(slot, req.prompt, req.sampling, req.seed)
        except Exception as e:  # a prompt the sampler rejects fails alone; the slot stays free
          self._finish(req, exc=e)
          continue
        self._running[slot] = req
      self.peak_batch = max(self.peak_batch, len(self._running))
      if not self.sampler.has_work():
        continue
      try:
        done = self.sampler.step()
      except Exception as e:  # a device failure: fail this batch, start over with a fresh cache
        log.exception("sampler step failed; failing %d requests and resetting the sampler", len(self._running))
        failed, self._running = list(self._running.values()), {}
        for req in failed:
          self._finish(req, exc=RuntimeError(f"generation failed: {type(e).__name__}: {e}"))
        try:
          self.sampler = self._make_sampler()
        except Exception:
          log.exception("could not rebuild the sampler; the engine stops")
          with self._cond:
            self._stopping = True
            queued = list(self._queue)
            self._queue.clear()
          for req in queued:
            _fail(req, EngineClosed("the engine stopped: the sampler could not be rebuilt after a failure"))
          return
        continue
      for turn in done:
        req = self._running.pop(turn.slot)
        self.sampler.release(turn.slot)
        self.generated_tokens += len(turn.tokens)
        self._finish(req, Generation(turn.tokens, turn.logprobs, turn.finish_reason))

  def _finish(self, req: _Request, result: Generation | None = None, exc: BaseException | None = None) -> None:
    self.completed += 1
    if exc is not None:
      _fail(req, exc)
    elif not req.future.done():
      req.future.set_result(result)


def _fail(req: _Request, exc: BaseException) -> None:
  if req.future.done():
    return
  if not req.future.running():
    req.future.set_running_or_notify_cancel()
  if not req.future.done():
    req.future.set_exception(exc)
