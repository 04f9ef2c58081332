"""Talking to the generator LLM: JSON extraction tolerant of chatty replies, and stages with bounded retries.

`parse_json_reply(text)` finds the JSON value in a reply: `<think>...</think>` blocks are removed, then the
first ```json (or plain ```) fenced block that parses wins, else the whole text, else the first `{` or `[`
from which a JSON value decodes (trailing prose is ignored).

`StageRunner.ask(stage, header, prompt, validate)` sends one user message (the header line, then the prompt),
parses the reply and passes it to `validate`, which returns the stage's value or raises `InvalidSpec`. A reply
that does not parse or validate is answered with the error and the request to try again (the retry message
starts with the same header plus " (attempt k)"), at most `max_retries` times; then `StageFailed` is raised.
An endpoint failure (`ChatResult.ok` False, after the client's own network retries) raises `SynthError` at
once: it is not the model's output that is wrong. Every call is counted per stage (`StageRunner.stats`).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from typing import Any, TypeVar

from orchestra_jax.errors import UserError
from orchestra_jax.tau2.datamodel import InvalidSpec

__all__ = ["SynthError", "StageFailed", "parse_json_reply", "StageStats", "StageRunner", "SYSTEM_PROMPT"]

T = TypeVar("T")

SYSTEM_PROMPT = ("You generate data for simulated customer-service environments in which an AI agent helps users "
                 "by calling tools over a database. Follow the requested JSON shape exactly and reply with that "
                 "JSON only: no explanations.")

_THINK = re.compile(r"<think>.*?</think>", re.S)
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_-]*)[ \t]*\n(.*?)```", re.S)


class SynthError(UserError, RuntimeError):
  """The synthesis cannot go on (endpoint down, a required stage failed); the message names the stage."""


class StageFailed(SynthError):
  """A stage's replies did not validate within the retry budget."""

  def __init__(self, stage: str, header: str, attempts: int, error: str):
    self.stage = stage
    self.header = header
    self.attempts = attempts
    self.error = error
    super().__init__(f"synthesis stage {stage} ({header}) failed after {attempts} attempt"
                     f"{'s' if attempts != 1 else ''}: {error}")


def _excerpt(text: str, limit: int = 160) -> str:
  text = " ".join(text.split())
  return text if len(text) <= limit else text[:limit] + "..."


def parse_json_reply(text: str) -> Any:
  """The JSON value in an LLM reply (see the module docstring); raises InvalidSpec if there is none."""
  if not isinstance(text, str) or not text.strip():
    raise InvalidSpec("the reply is empty; reply with the JSON only")
  text = _THINK.sub("", text)
  if "<think>" in text:  # an unclosed think block: keep what follows the last marker
    text = text.rsplit("</think>", 1)[-1] if "</think>" in text else text.split("<think>", 1)[0]
  errors = []
  for m in _FENCE.finditer(text):
    if m.group(1).lower() not in ("", "json", "json5", "javascript"):
      continue
    try:
      return json.loads(m.group(2))
    except json.JSONDecodeError as e:
      errors.append(f"the ```json block does not parse (line {e.lineno}, column {e.colno}: {e.msg})")
  stripped = text.strip()
  try:
    return json.loads(stripped)
  except json.JSONDecodeError:
    pass
  decoder = json.JSONDecoder()
  for i, ch in enumerate(stripped):
    if ch in "{[":
      try:
        value, _ = decoder.raw_decode(stripped, i)
        return value
      except json.JSONDecodeError as e:
        errors.append(f"JSON starting at character {i} does not parse ({e.msg} at character {e.pos})")
        break
  detail = errors[0] if errors else "no JSON object found"
  raise InvalidSpec(f"{detail}; reply was: {_excerpt(text)!r}")


@dataclasses.dataclass
class StageStats:
  requests: int = 0  # ask() calls
  attempts: int = 0  # LLM calls, retries included
  retries: int = 0
  failures: int = 0  # ask() calls that raised StageFailed
  prompt_tokens: int = 0
  completion_tokens: int = 0
  cost_usd: float = 0.0
  latency_s: float = 0.0

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


class StageRunner:
  """Asks the LLM for one stage's JSON with bounded retries; see the module docstring."""

  def __init__(self, client, *, max_retries: int = 2, temperature: float | None = 0.7, max_tokens: int | None = 4096,
               seed: int | None = 0, system_prompt: str = SYSTEM_PROMPT, send_seed: bool = True):
    if not isinstance(max_retries, int) or max_retries < 0:
      raise ValueError(f"max_retries must be an integer >= 0, got {max_retries!r}")
    self.client = client
    self.max_retries = max_retries
    self.temperature = temperature
    self.max_tokens = max_tokens
    self.seed = seed
    self.send_seed = send_seed
    self.system_prompt = system_prompt
    self.stats: dict[str, StageStats] = {}
    self.log: list[dict[str, Any]] = []  # one entry per failed attempt: stage, header, error
    self._calls = 0

  def ask(self, stage: str, header: str, prompt: str, validate: Callable[[Any], T]) -> T:
    stats = self.stats.setdefault(stage, StageStats())
    stats.requests += 1
    messages = [{"role": "system", "content": self.system_prompt},
                {"role": "user", "content": f"{header}\n{prompt}"}]
    error = ""
    attempts = 0
    for attempt in range(1, self.max_retries + 2):
      attempts = attempt
      extra = {"seed": int(self.seed) + self._calls} if self.send_seed and self.seed is not None else None
      self._calls += 1
      result = self.client.chat(messages, max_tokens=self.max_tokens, temperature=self.temperature, extra=extra)
      stats.attempts += 1
      stats.retries += attempt > 1
      stats.prompt_tokens += result.prompt_tokens
      stats.completion_tokens += result.completion_tokens
      stats.cost_usd += result.cost_usd
      stats.latency_s += result.latency_s
      if not result.ok:
        raise SynthError(f"synthesis stage {stage} ({header}): the generator endpoint failed: {result.error}")
      try:
        return validate(parse_json_reply(result.text))
      except InvalidSpec as e:
        error = str(e)
      self.log.append({"stage": stage, "header": header, "attempt": attempt, "error": error})
      messages = messages + [
          {"role": "assistant", "content": result.text},
          {"role": "user", "content": f"{header} (attempt {attempt + 1})\nYour previous reply was rejected: {error}\n"
                                      "Reply again with the corrected JSON only."}]
    stats.failures += 1
    raise StageFailed(stage, header, attempts, error)
