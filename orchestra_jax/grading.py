"""Grading an answer against its gold: exact match, then numeric equality, then a judge; and the LLM judge itself.

One cascade (`grade_cascade`) serves training (`reward.outcome.grade`, a float outcome) and evaluation
(`grade_answer`, the grading fields of a result record):

1. no prediction: wrong ("no_answer");
2. exact match after SQuAD normalisation ("exact");
3. equality as numbers within a tolerance ("numeric");
4. the judge, when there is one ("judge"; an LLM judge's unreadable reply: "judge_unparsed"), else wrong ("none").

A judge is any callable `judge(question, prediction, gold)` returning a bool, a score in [0, 1] or, for `LLMJudge`
(an LLM behind an OpenAI-compatible endpoint), a `JudgeVerdict`. Host-side Python: strings do not go through jit.
Imported by training, so this module imports no command and not the `evaluate` package.
"""

from __future__ import annotations

import dataclasses
import math
import re
import string
from collections.abc import Sequence
from typing import Any, Protocol

from orchestra_jax.errors import UserError
from orchestra_jax.tools.llm_client import ChatClient

__all__ = ["EvalError", "Judge", "normalize_answer", "exact_match", "parse_number", "numeric_match",
           "HLE_JUDGE_PROMPT", "REFERENCE_JUDGE_PROMPT", "JUDGE_PROMPTS", "judge_messages", "parse_judge_reply",
           "JudgeVerdict", "JudgeUnavailable", "LLMJudge", "Grade", "grade_cascade", "grade", "grade_answer",
           "TEXT_CHARS"]

TEXT_CHARS = 2000  # characters of a reply kept per result record (judge reply, last orchestrator text)


class EvalError(UserError, ValueError):
  """A bad eval argument, setting or output directory (the judge prompt included, which training's data env also
  names); the message is one line naming it."""


# --- matching -------------------------------------------------------------------------------------------------

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = set(string.punctuation)
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")


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


# --- the LLM judge --------------------------------------------------------------------------------------------

# After the HLE judge prompt (github.com/centerforaisafety/hle, MIT), with the verdict asked for as text.
HLE_JUDGE_PROMPT = """Judge whether the following [response] to [question] is correct or not based on the precise \
and unambiguous [correct_answer] below.

[question]: {question}

[response]: {response}

Your judgement must be in the format and criteria specified below:

extracted_final_answer: The final exact answer extracted from the [response]. Put the extracted answer as 'None' if \
there is no exact, final answer to extract from the response.

[correct_answer]: {correct_answer}

reasoning: Explain why the extracted_final_answer is correct or incorrect based on [correct_answer], focusing only \
on if there are meaningful differences between [correct_answer] and the extracted_final_answer. Do not comment on \
any background to the problem, do not attempt to solve the problem, do not argue for any answer different than \
[correct_answer], focus only on whether the answers match.

correct: Answer 'yes' if extracted_final_answer matches the [correct_answer] given above, or is within a small margin \
of error for numerical problems. Answer 'no' otherwise, i.e. if there is any inconsistency, ambiguity, \
non-equivalency, or if the extracted answer is incorrect.

confidence: The extracted confidence score between 0% and 100% from [response]. Put 100 if there is no confidence \
score available."""

REFERENCE_JUDGE_PROMPT = """Question: {question}

Gold answer: {correct_answer}

Response: {response}

Is the response equivalent to the gold answer (the same final answer; wording, formatting and a small margin of \
error for numbers do not matter)? Answer with one word: yes or no."""

JUDGE_PROMPTS = ("hle", "reference")
_PROMPTS = {"hle": HLE_JUDGE_PROMPT, "reference": REFERENCE_JUDGE_PROMPT}
_CORRECT_LINE = re.compile(r"correct\s*[:=]\s*[*_'\"`\s]*(yes|no)\b", re.IGNORECASE)
_EXTRACTED_LINE = re.compile(r"extracted_final_answer\s*[:=]\s*(.*)", re.IGNORECASE)
_YES_NO = re.compile(r"\b(yes|no)\b", re.IGNORECASE)


def judge_messages(style: str, question: str, prediction: str, gold: str) -> list[dict[str, str]]:
  """The judge's chat: one user message in the chosen prompt style."""
  if style not in _PROMPTS:
    raise EvalError(f"unknown judge prompt {style!r}; choose one of {', '.join(JUDGE_PROMPTS)}")
  return [{"role": "user", "content": _PROMPTS[style].format(question=question, response=prediction,
                                                              correct_answer=gold)}]


def parse_judge_reply(style: str, text: str) -> tuple[bool | None, str | None]:
  """(verdict, extracted answer) from a judge reply; verdict None when the reply says neither yes nor no.

  hle: the last `correct: yes|no` line (a bare yes/no reply is accepted too); reference: the first yes/no word.
  Any `<think>…</think>` block is ignored."""
  body = text.split("</think>")[-1] if "</think>" in text else text
  extracted = None
  if style == "hle":
    m = _EXTRACTED_LINE.search(body)
    if m:
      extracted = m.group(1).strip().strip("*").strip() or None
    found = _CORRECT_LINE.findall(body)
    if found:
      return found[-1].lower() == "yes", extracted
    bare = body.strip().strip(".*!").strip().lower()
    return ({"yes": True, "no": False}.get(bare), extracted)
  m = _YES_NO.search(body)
  return (m.group(1).lower() == "yes" if m else None), None


@dataclasses.dataclass(frozen=True)
class JudgeVerdict:
  correct: bool | None  # None: the reply could not be read
  reply: str
  extracted: str | None
  cost_usd: float
  latency_s: float


class JudgeUnavailable(RuntimeError):
  """The judge endpoint failed; the item is left ungraded (not written) so a rerun retries it."""


class LLMJudge:
  """An LLM judge behind an OpenAI-compatible endpoint (`tools.llm_client.ChatClient`)."""

  def __init__(self, endpoint: str, model: str, style: str, *, api_key_env: str | None = None,
               max_tokens: int = 1024, read_timeout: float = 300.0, max_retries: int = 3):
    if style not in JUDGE_PROMPTS:
      raise EvalError(f"unknown --judge-prompt {style!r}; choose one of {', '.join(JUDGE_PROMPTS)}")
    self.style, self.model, self.endpoint, self.max_tokens = style, model, endpoint, max_tokens
    self.client = ChatClient(endpoint, model, api_key_env, read_timeout=read_timeout, max_retries=max_retries)

  def __call__(self, question: str, prediction: str, gold: str) -> JudgeVerdict:
    result = self.client.chat(judge_messages(self.style, question, prediction, gold), max_tokens=self.max_tokens,
                              temperature=0.0)
    if not result.ok:
      raise JudgeUnavailable(result.error or "the judge call failed")
    correct, extracted = parse_judge_reply(self.style, result.text)
    return JudgeVerdict(correct, result.text, extracted, result.cost_usd, result.latency_s)

  def close(self) -> None:
    self.client.close()


# --- the cascade ----------------------------------------------------------------------------------------------

class Judge(Protocol):
  """A judge: True / 1.0 (or a verdict saying so) when `prediction` answers `question` the way `gold` does."""

  def __call__(self, question: str, prediction: str, gold: str) -> bool | float | JudgeVerdict: ...


@dataclasses.dataclass(frozen=True)
class Grade:
  score: float  # in [0, 1]
  judged_by: str  # no_answer | exact | numeric | judge | judge_unparsed | none
  verdict: JudgeVerdict | None = None  # the LLM judge's, when it decided


def grade_cascade(prediction: str | None, gold: str | Sequence[str], *, question: str = "",
                  judge: Judge | None = None, rel_tol: float = 1e-4, abs_tol: float = 1e-8) -> Grade:
  """No answer -> exact -> numeric -> judge (each gold in turn, the best score wins; a float judge's score in
  (0, 1) is passed through). Raises `JudgeUnavailable` when an LLM judge's endpoint fails, ValueError when a judge
  returns a score outside [0, 1]."""
  if prediction is None:
    return Grade(0.0, "no_answer")
  if exact_match(prediction, gold):
    return Grade(1.0, "exact")
  if numeric_match(prediction, gold, rel_tol, abs_tol):
    return Grade(1.0, "numeric")
  if judge is None:
    return Grade(0.0, "none")
  best = None
  for g in _golds(gold):
    out = judge(question, prediction, g)
    if isinstance(out, JudgeVerdict):
      this = Grade(float(bool(out.correct)), "judge" if out.correct is not None else "judge_unparsed", out)
    else:
      score = float(out)
      if not 0.0 <= score <= 1.0 or math.isnan(score):
        raise ValueError(f"judge returned {score!r}; expected a bool or a score in [0, 1]")
      this = Grade(score, "judge")
    if best is None or this.score > best.score:
      best = this
  return best if best is not None else Grade(0.0, "none")  # no gold to ask about


def grade(prediction: str | None, gold: str | Sequence[str], *, question: str = "", judge: Judge | None = None,
          rel_tol: float = 1e-4, abs_tol: float = 1e-8) -> float:
  """The outcome in [0, 1]: 0 with no answer; 1 on exact or numeric match; else the judge's score (0 without one).

  A judge returning a float in (0, 1) is passed through; threshold it yourself for a strict {0, 1} outcome.
  """
  return grade_cascade(prediction, gold, question=question, judge=judge, rel_tol=rel_tol, abs_tol=abs_tol).score


def grade_answer(question: str, prediction: str | None, gold: str, judge: Judge | None) -> dict[str, Any]:
  """Grading fields of a QA record: correct, score, judged_by (+ judge reply, extracted answer, judge cost)."""
  g = grade_cascade(prediction, gold, question=question, judge=judge)
  out: dict[str, Any] = {"correct": g.score >= 1.0, "score": g.score, "judged_by": g.judged_by}
  if g.verdict is not None:
    out["judge_reply"] = g.verdict.reply[:TEXT_CHARS]
    out["judge_cost_usd"] = g.verdict.cost_usd
    if g.verdict.extracted is not None:
      out["judge_extracted"] = g.verdict.extracted
  return out
