"""The outcome o(τ) ∈ {0, 1} of a QA rollout: exact match after normalisation, numeric tolerance, else a judge.

docs/design.md section 7: "QA data: question/answer pairs graded by exact match, else an LLM judge". The cascade
lives in `orchestra_jax.grading`, shared with `orchestra eval`; this module keeps the reward package's names for it.
`grade` tries, in order: exact match of the SQuAD-normalised strings, equality of the two as numbers within a
tolerance, and finally the judge callable when one is given.

A judge is any callable `judge(question, prediction, gold) -> bool | float` (score in [0, 1]); the HTTP client that
asks an LLM (`grading.LLMJudge`) lives elsewhere, so tests pass a plain function here.
"""

from orchestra_jax.grading import Judge, exact_match, grade, normalize_answer, numeric_match, parse_number

__all__ = ["Judge", "exact_match", "grade", "normalize_answer", "numeric_match", "parse_number"]
