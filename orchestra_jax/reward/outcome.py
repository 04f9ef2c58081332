"""The outcome o(τ) ∈ {0, 1} of a QA rollout: exact match after normalisation, numeric tolerance, else a judge.

Host-side Python (strings do not go through jit). docs/design.md section 7: "QA data: question/answer pairs graded by
exact match, else an LLM judge". `grade` tries, in order: exact match of the SQuAD-normalised strings, equality of
the two as numbers within a tolerance, and finally the judge callable when one is given.

A judge is any callable `judge(question, prediction, gold) -> bool | float` (score in [0, 1]); the HTTP client that
asks an LLM lives elsewhere, so tests pass a plain function here.
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Sequence
from typing import Protocol

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = set(string.punctuation)
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")


class Judge(Protocol):
  """An LLM judge: 1.0 / True when `prediction` answers `question` the way `gold` does."""

  def __call__(self, question: str, prediction: str, gold: str) -> bool | float: ...


def normalize_answer(s: str) -> str:
  """SQuAD's normalisation: lowercase, drop punctuation, drop articles (a, an, the), collapse whitespace."""
  s = s.lower()
  s = "".join(ch for ch in s if ch not in _PUNCT)
  s = _ARTICLES.sub(" ", s)
  return " ".join(s.split())


def _golds(gold: str | Sequence[str]) -> list[str]:
  return [gold] if isinstance(gold, str) else [str(g) for g in gold]


def exact_match(prediction: str | None, gold: str | Sequence[str]) -> bool:
  """True when the normalised prediction equals a normalised gold answer (any of several)."""
  if prediction is None:
    return False
  p = normalize_answer(prediction)
  return any(p == normalize_answer(g) for g in _golds(gold))


def parse_number(s: str | None) -> float | None:
  """A number written as `1,234.5`, `$12`, `45%`, `3/4`, `-2e3` (surrounding whitespace, `$`, `%` and a trailing
  period ignored); None if `s` is not just one number. A percentage is read as its face value (`45%` -> 45.0)."""
  if s is None:
    return None
  t = s.strip().rstrip(".").strip().replace(",", "").replace("$", "").replace("%", "").replace(" ", "")
  if not t:
    return None
  if t.count("/") == 1:
    num, den = t.split("/")
    if _NUMBER.match(num) and _NUMBER.match(den) and float(den) != 0:
      return float(num) / float(den)
    return None
  if _NUMBER.match(t):
    return float(t)
  return None


def numeric_match(prediction: str | None, gold: str | Sequence[str], rel_tol: float = 1e-4,
                  abs_tol: float = 1e-8) -> bool:
  """True when both parse as numbers and agree within `rel_tol` (relative) or `abs_tol` (absolute)."""
  p = parse_number(prediction)
  if p is None:
    return False
  for g in _golds(gold):
    q = parse_number(g)
    if q is not None and math.isclose(p, q, rel_tol=rel_tol, abs_tol=abs_tol):
      return True
  return False


def grade(prediction: str | None, gold: str | Sequence[str], *, question: str = "", judge: Judge | None = None,
          rel_tol: float = 1e-4, abs_tol: float = 1e-8) -> float:
  """The outcome in [0, 1]: 0 with no answer; 1 on exact or numeric match; else the judge's score (0 without one).

  A judge returning a float in (0, 1) is passed through; threshold it yourself for a strict {0, 1} outcome.
  """
  if prediction is None:
    return 0.0
  if exact_match(prediction, gold) or numeric_match(prediction, gold, rel_tol, abs_tol):
    return 1.0
  if judge is None:
    return 0.0
  best = 0.0
  for g in _golds(gold):
    score = float(judge(question, prediction, g))
    if not 0.0 <= score <= 1.0 or math.isnan(score):
      raise ValueError(f"judge returned {score!r}; expected a bool or a score in [0, 1]")
    best = max(best, score)
  return best
