"""Multi-turn tool-calling rollouts: the sampler generates turns, a `ToolEnvironment` answers tool calls.

For a batch of tasks, each task becomes a row: an `Episode`, a `Trajectory` and (while it is active) a sampler
slot. The host loop alternates `Sampler.step()` (staged prefills + one decode chunk for every running row) with
bookkeeping:

* a row whose turn finished is parsed; its valid tool calls go to a thread pool and the row waits there while
  the other rows keep decoding (tool latency overlaps with decoding);
* a row whose tool calls all returned gets the `<tool_response>` turn appended to its cache (`extend`: the
  sampler's own token ids for earlier turns are kept, nothing is re-tokenised) and decodes again;
* a row ends on a finishing tool (`ToolResult.done`, e.g. `answer`), a turn with no tool call, `max_turns`, or
  when the next turn would not fit `max_total_tokens`; its slot goes to the next pending task.

`mode="rebuild"` is the reference's training mode (docs/design.md section 3): instead of growing the chat, each turn
starts from a fresh prompt built from the episode's state (`Episode.rebuild_messages`), recorded per turn in the
trajectory.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import dataclasses
import time
from typing import Any, Callable, Sequence

from orchestra_jax.rollout import chat_format
from orchestra_jax.rollout.environment import Episode, ToolEnvironment, ToolResult
from orchestra_jax.rollout.sampler import Sampler, SamplingParams, TurnResult
from orchestra_jax.rollout.tool_calls import (MAX_ARGUMENT_CHARS, MAX_ARGUMENT_DEPTH, ToolCall, ToolCallError,
                                              parse_assistant_turn, validate_tool_calls)
from orchestra_jax.rollout.trajectory import ToolCallRecord, Trajectory


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
  # Defaults are the paper's (docs/design.md section 6), the same as training_config.RolloutSection's (a test
  # keeps the two equal): one set of defaults whether a loop is built by hand or from a config.
  max_turns: int = 30  # 50 at evaluation
  max_new_tokens: int = 8768  # per turn
  max_total_tokens: int | None = None  # per row conversation; default: the sampler's max_len
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  mode: str = "rebuild"  # "extend" (grow the chat in the cache) | "rebuild" (fresh prompt per turn)
  tool_workers: int = 64
  enable_thinking: bool = True
  # Hostile-output limits: a turn past them gets tool errors in its transcript, never an exception or a runaway.
  max_tool_calls_per_turn: int = 8  # later calls of the turn are refused (a TOO_MANY_CALLS error), not executed
  max_tool_argument_chars: int = MAX_ARGUMENT_CHARS  # one call's JSON text
  max_tool_argument_depth: int = MAX_ARGUMENT_DEPTH  # nesting of its arguments (the object itself is level 1)

  def __post_init__(self):
    if self.mode not in ("extend", "rebuild"):
      raise ValueError(f"rollout mode must be 'extend' or 'rebuild', got {self.mode!r}")
    for name in ("max_turns", "max_tool_calls_per_turn", "max_tool_argument_chars", "max_tool_argument_depth"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

  def sampling(self) -> SamplingParams:
    return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                          max_new_tokens=self.max_new_tokens)


@dataclasses.dataclass
class RolloutStats:
  """Where the wall time went: decoding (sampler steps), blocked on tools (nothing to decode), total."""

  decode_s: float = 0.0
  tool_wait_s: float = 0.0
  tool_busy_s: float = 0.0  # summed wall time of all tool calls (overlaps with decoding)
  wall_s: float = 0.0
  turns: int = 0
  tool_calls: int = 0
  generated_tokens: int = 0

  def to_dict(self) -> dict[str, float]:
    return dataclasses.asdict(self)


@dataclasses.dataclass
class _Row:
  index: int
  task: dict[str, Any]
  episode: Episode
  trajectory: Trajectory
  seed: int
  tools: list[dict[str, Any]]
  slot: int = -1
  turns: int = 0
  prompt_ids: list[int] | None = None  # the current turn's prompt (recorded per turn in rebuild mode)
  futures: list[cf.Future] | None = None  # pending tool calls of the last turn
  replies: list[str | cf.Future] | None = None  # per call block: an error text or a pending future
  last_token: int | None = None
  done: bool = False
  opened_at: float = dataclasses.field(default_factory=time.perf_counter)


def _describe(e: BaseException) -> str:
  try:
    return f"{type(e).__name__}: {e}"
  except Exception:  # an exception whose __str__ itself fails
    return type(e).__name__


def run_call(episode: Episode, call: ToolCall) -> ToolResult:
  """`episode.call(call)` that never raises, with a record (and its latency) always filled in.

  Everything that can go wrong with the call, including an environment returning something that is not a
  `ToolResult`, becomes an error result for this row: it runs on a pool thread and the loop reads it back with
  `Future.result()`, so an exception here would leave `AgentLoop.run` and end every row of the batch."""
  start = time.perf_counter()
  try:
    result = episode.call(call)
    if not isinstance(result, ToolResult):
      raise TypeError(f"Episode.call returned {type(result).__name__}, not a ToolResult")
    if not isinstance(result.content, str):
      result.content = str(result.content)
    if result.record is None:
      result.record = ToolCallRecord(name=call.name, arguments=call.arguments, result=result.content)
    elif not isinstance(result.record, ToolCallRecord):
      raise TypeError(f"ToolResult.record is {type(result.record).__name__}, not a ToolCallRecord")
  except Exception as e:  # an environment bug must not kill the other rows
    detail = _describe(e)
    result = ToolResult(content=f"Error: tool {call.name} failed: {detail}",
                        record=ToolCallRecord(name=call.name, arguments=call.arguments, error=detail))
  if not result.record.latency_s:
    result.record.latency_s = time.perf_counter() - start
  return result


class AgentLoop:
  """Runs rollouts of `env` tasks with `sampler` (which owns the model and the KV cache)."""

  def __init__(self, sampler: Sampler, tokenizer, env: ToolEnvironment, config: RolloutConfig = RolloutConfig()):
    self.sampler, self.tokenizer, self.env, self.config = sampler, tokenizer, env, config
    self.max_total = min(config.max_total_tokens or sampler.max_len, sampler.max_len)
    self.stats = RolloutStats()

  # --- public ------------------------------------------------------------------------------------
  def run(self, tasks: Sequence[dict[str, Any]], seeds: Sequence[int] | None = None,
          rollout_ids: Sequence[str] | None = None,
          on_done: Callable[[int, Trajectory, Episode, float], None] | None = None) -> list[Trajectory]:
    """One trajectory per task, in task order. Repeat a task G times in `tasks` for a GRPO group.

    `on_done(index, trajectory, episode, wall_s)` is called (on this thread) the moment a row ends, after its
    episode is closed and its slot released, while other rows keep decoding: the place to grade an episode
    (tau2 grading needs the `Episode`, which `run` does not return) or stream results out. `wall_s` is the
    row's time from opening to its end."""
    if self.sampler.has_work():
      raise RuntimeError("the sampler is busy; AgentLoop needs an idle sampler")
    seeds = list(range(len(tasks))) if seeds is None else list(seeds)
    rollout_ids = [str(i) for i in range(len(tasks))] if rollout_ids is None else list(rollout_ids)
    start = time.perf_counter()
    pending = collections.deque(range(len(tasks)))
    rows: dict[int, _Row] = {}  # slot -> active row
    out: list[Trajectory | None] = [None] * len(tasks)
    with cf.ThreadPoolExecutor(max_workers=self.config.tool_workers, thread_name_prefix="tool") as pool:
      while pending or rows:
        for slot in self.sampler.free_slots():
          if not pending:
            break
          i = pending.popleft()
          row = self._open(i, tasks[i], seeds[i], rollout_ids[i])
          row.slot = slot
          rows[slot] = row
          if not self._start_turn(row, first=True):
            self._close(row, rows, out, on_done)
        if self.sampler.has_work():
          t0 = time.perf_counter()
          finished = self.sampler.step()
          self.stats.decode_s += time.perf_counter() - t0
          for turn in finished:
            self._on_turn(rows[turn.slot], turn, pool)
        else:
          waiting = [f for r in rows.values() for f in (r.futures or [])]
          if waiting:
            t0 = time.perf_counter()
            cf.wait(waiting, return_when=cf.FIRST_COMPLETED)
            self.stats.tool_wait_s += time.perf_counter() - t0
        for row in list(rows.values()):
          if row.futures is not None and all(f.done() for f in row.futures):
            self._on_tools_done(row)
          if row.done:
            self._close(row, rows, out, on_done)
    self.stats.wall_s += time.perf_counter() - start
    return out  # type: ignore[return-value]

  # --- per-row steps -----------------------------------------------------------------------------
  def _open(self, index: int, task: dict[str, Any], seed: int, rollout_id: str) -> _Row:
    episode = self.env.new_episode(task, rollout_id)
    traj = Trajectory(metadata={"task_id": task.get("id"), "rollout_id": rollout_id, "seed": seed,
                                "mode": self.config.mode})
    return _Row(index=index, task=task, episode=episode, trajectory=traj, seed=seed, tools=episode.tools())

  def _prompt_ids(self, messages, tools) -> list[int]:
    return chat_format.encode_prompt(self.tokenizer, messages, tools, add_generation_prompt=True,
                                     enable_thinking=self.config.enable_thinking)

  def _start_turn(self, row: _Row, first: bool) -> bool:
    """Stages the row's next turn in its slot; False when it would not fit the token budget."""
    messages = row.episode.messages() if first else row.episode.rebuild_messages()
    ids = self._prompt_ids(messages, row.tools)
    if len(ids) + self.config.max_new_tokens > self.max_total:
      row.trajectory.finish_reason = "max_tokens"
      return False
    if first:
      row.trajectory.append_prompt(ids)
    row.prompt_ids = ids  # rebuild mode records it with the generated turn
    self.sampler.start(row.slot, ids, self.config.sampling(), seed=row.seed + 1_000_003 * row.turns, tag=row.index)
    return True

  def _on_turn(self, row: _Row, turn: TurnResult, pool: cf.ThreadPoolExecutor) -> None:
    text = self.tokenizer.decode(turn.tokens, skip_special_tokens=False)
    parsed = parse_assistant_turn(text, max_argument_chars=self.config.max_tool_argument_chars,
                                  max_argument_depth=self.config.max_tool_argument_depth)
    prompt = row.prompt_ids if self.config.mode == "rebuild" else None
    recorded = row.trajectory.append_generated(turn.tokens, turn.logprobs, turn.finish_reason, prompt_tokens=prompt,
                                               parsed=parsed, text=text)
    row.turns += 1
    row.last_token = turn.tokens[-1] if turn.tokens else None
    self.stats.turns += 1
    self.stats.generated_tokens += len(turn.tokens)
    validation = validate_tool_calls(parsed, row.tools, max_calls=self.config.max_tool_calls_per_turn)
    recorded.errors = list(parsed.errors) + validation
    if not parsed.tool_calls and not parsed.errors:
      row.trajectory.finish_reason = "no_tool_call" if turn.finish_reason != "length" else "length"
      row.done = True
      return
    # One reply per <tool_call> block, in block order: the parser's or validator's error, or the tool's result.
    invalid = {e.index: e for e in validation}
    blocks = [(c.index, invalid.get(c.index, c)) for c in parsed.tool_calls]
    blocks += [(e.index if e.index is not None else len(text), e) for e in parsed.errors]
    row.replies, row.futures = [], []
    for _, item in sorted(blocks, key=lambda b: b[0]):
      if isinstance(item, ToolCallError):
        row.replies.append(f"Error: {item.message}")
      else:
        future = pool.submit(run_call, row.episode, item)
        row.replies.append(future)
        row.futures.append(future)
    self.stats.tool_calls += len(row.futures)

  def _on_tools_done(self, row: _Row) -> None:
    contents = []
    for reply in row.replies:
      if isinstance(reply, cf.Future):
        result: ToolResult = reply.result()
        result.record.turn_index = row.turns - 1
        row.trajectory.add_tool_call(result.record)
        self.stats.tool_busy_s += result.record.latency_s
        contents.append(result.content)
        if result.done:
          row.trajectory.final_answer = result.final_answer
          row.trajectory.finish_reason = "answer"
          row.done = True
      else:
        contents.append(reply)
    row.futures = row.replies = None
    if row.done:
      return
    if row.turns >= self.config.max_turns:
      row.trajectory.finish_reason = "max_turns"
      row.done = True
      return
    if self.config.mode == "rebuild":
      if not self._start_turn(row, first=False):
        row.done = True
      return
    ids = chat_format.tool_response_ids(self.tokenizer, contents, row.last_token,
                                        enable_thinking=self.config.enable_thinking)
    if len(self.sampler.conversation(row.slot)) + len(ids) + self.config.max_new_tokens > self.max_total:
      row.trajectory.finish_reason = "max_tokens"
      row.done = True
      return
    row.trajectory.append_tool_response(ids)
    self.sampler.extend(row.slot, ids)

  def _close(self, row: _Row, rows: dict[int, _Row], out: list, on_done=None) -> None:
    if row.futures:  # cannot happen (rows end only after their tools return); keep the invariant loud
      raise RuntimeError(f"row {row.index} closed with tool calls in flight")
    row.episode.close()
    self.sampler.release(row.slot)
    rows.pop(row.slot, None)
    out[row.index] = row.trajectory
    if on_done is not None:
      on_done(row.index, row.trajectory, row.episode, time.perf_counter() - row.opened_at)
