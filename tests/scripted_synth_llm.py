"""The scripted LLM that answers `orchestra synth`'s prompts for the bank domain (fixtures/synth), shared by the
synthesis tests and the `synth_bank_dir` fixture of conftest.py."""

import json
from pathlib import Path

GENERATIONS = json.loads((Path(__file__).resolve().parent / "fixtures" / "synth" / "bank_generations.json").read_text())
MODEL = GENERATIONS["model"]


def _render(reply) -> str:
  if "text" in reply:
    return reply["text"]
  body = json.dumps(reply["json"], indent=1)
  return {"plain": body,
          "fenced": f"```json\n{body}\n```",
          "fenced_prose": f"Here is the design you asked for.\n```json\n{body}\n```\nLet me know if it needs changes.",
          "think": f"<think>Make it harder: {{\"draft\": true}} maybe.</think>\n{body}\nThis version adds a total."}[reply["style"]]


def script() -> dict:
  """The ScriptedServer script: the canned reply of each stage, matched on a phrase of its prompt."""
  rules = [{"contains": r["contains"], "answer": _render(r)} for r in GENERATIONS["replies"]]
  return {MODEL: {"rules": rules, "default": {"answer": "no canned reply for this request"}}}
