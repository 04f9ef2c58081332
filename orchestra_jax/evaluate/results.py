"""An eval's output directory: `run.json` pinning it to one run, the durable `results.jsonl` (one line per graded
item, written with one fsynced write), and how a finished episode becomes that line."""

from __future__ import annotations

import json
import math
import os
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestra_jax.evaluate.tasks import tau2_domain
from orchestra_jax.grading import TEXT_CHARS, EvalError, Judge, grade_answer

RESULTS_FILE = "results.jsonl"
SUMMARY_FILE = "summary.json"
RUN_CONFIG_FILE = "run_config.json"
RUN_FILE = "run.json"
PLOT_FILE = "accuracy_vs_cost.png"
_IDENTITY_KEYS = ("benchmark", "orchestrator", "tasks", "hle_path")


# --- files ----------------------------------------------------------------------------------------------------

class ResultsFile:
  """Append-only JSONL of per-item results: one write per line, flushed and fsynced; thread-safe."""

  def __init__(self, path: str | os.PathLike):
    self.path = Path(path)
    self._lock = threading.Lock()

  def load(self) -> list[dict[str, Any]]:
    """Every complete line. A torn last line (a crash mid-write) is cut off the file; a bad complete line is an
    error naming it."""
    if not self.path.exists():
      return []
    data = self.path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):
      print(f"orchestra eval: dropping an incomplete last line of {self.path} (a crash mid-write); "
            "that item runs again", file=sys.stderr)
      with open(self.path, "r+b") as f:
        f.truncate(end)
        f.flush()
        os.fsync(f.fileno())
    records = []
    for number, line in enumerate(data[:end].decode("utf-8").splitlines(), 1):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise EvalError(f"{self.path}:{number}: not valid JSON ({e.msg}); fix or remove that line") from None
      if not isinstance(record, dict) or not isinstance(record.get("id"), str):
        raise EvalError(f"{self.path}:{number}: a result line must be a JSON object with a string 'id'")
      records.append(record)
    return records

  def append(self, record: Mapping[str, Any]) -> None:
    line = json.dumps(record, ensure_ascii=False, sort_keys=True, allow_nan=False) + "\n"
    with self._lock:
      new = not self.path.exists()
      with open(self.path, "a", encoding="utf-8") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())
      if new:
        _fsync_dir(self.path.parent)


def _fsync_dir(path: Path) -> None:
  try:
    fd = os.open(path, os.O_RDONLY)
  except OSError:
    return
  try:
    os.fsync(fd)
  except OSError:
    pass
  finally:
    os.close(fd)


def write_json(path: Path, obj: Any) -> None:
  """`obj` as indented JSON, replacing `path` atomically."""
  tmp = path.with_name(path.name + ".tmp")
  tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
  os.replace(tmp, path)


def claim_out_dir(out: Path, identity: Mapping[str, Any]) -> None:
  """Creates `out` and pins it to this run (`run.json`); a directory pinned to another run is refused."""
  out.mkdir(parents=True, exist_ok=True)
  run_file = out / RUN_FILE
  if run_file.exists():
    try:
      old = json.loads(run_file.read_text())
    except (OSError, json.JSONDecodeError) as e:
      raise EvalError(f"{run_file} is unreadable ({e}); remove it or use another --out") from None
    for key in _IDENTITY_KEYS:
      if old.get(key) != identity.get(key):
        raise EvalError(f"--out {out} holds results of another run ({key}: {json.dumps(old.get(key))} there, "
                        f"{json.dumps(identity.get(key))} now); use another --out")
  else:
    write_json(run_file, dict(identity))


# --- per-item records -----------------------------------------------------------------------------------------

def _calls(traj) -> list[dict[str, Any]]:
  return [{"name": c.name, "alias": c.alias, "model": c.model, "cost_usd": c.cost_usd, "latency_s": c.latency_s,
           "error": c.error, "turn": c.turn_index} for c in traj.tool_calls]


def _finite(x: float) -> float:
  return float(x) if math.isfinite(x) else 0.0


def item_record(benchmark: str, task: Mapping[str, Any], traj, grading: Mapping[str, Any], *, turns: int,
                orchestrator_cost: float, orchestrator_latency: float | None, orchestrator_tokens: tuple[int, int],
                wall_s: float, last_text: str | None, error: str | None = None) -> dict[str, Any]:
  """The results.jsonl line of one graded item."""
  tool_cost = sum(c.cost_usd for c in traj.tool_calls)
  tool_latency = traj.latency_s
  record = {
      "id": task["id"], "benchmark": benchmark, "question": task.get("question"),
      "prediction": traj.final_answer, "gold": task.get("answer"),
      **grading,
      "cost_usd": _finite(tool_cost + orchestrator_cost), "tool_cost_usd": _finite(tool_cost),
      "orchestrator_cost_usd": _finite(orchestrator_cost),
      "orchestrator_tokens": {"prompt": orchestrator_tokens[0], "completion": orchestrator_tokens[1]},
      "latency_s": _finite(tool_latency + (orchestrator_latency or 0.0)), "tool_latency_s": _finite(tool_latency),
      "orchestrator_latency_s": None if orchestrator_latency is None else _finite(orchestrator_latency),
      "wall_s": _finite(wall_s), "tool_counts": traj.tool_counts("alias"), "tool_calls": len(traj.tool_calls),
      "turns": turns, "finish_reason": traj.finish_reason, "calls": _calls(traj),
      "last_text": None if last_text is None else last_text[:TEXT_CHARS],
  }
  if task.get("preference"):
    record["preference"] = dict(task["preference"])
  if error:
    record["error"] = error
  return record


class Grader:
  """Grades one finished episode (QA: exact / numeric / judge; tau2: the episode's reward)."""

  def __init__(self, benchmark: str, judge: Judge | None):
    self.benchmark, self.judge = benchmark, judge
    self.is_tau2 = tau2_domain(benchmark) is not None

  def __call__(self, task: Mapping[str, Any], traj, episode) -> dict[str, Any]:
    if not self.is_tau2:
      return grade_answer(task["question"], traj.final_answer, task["answer"], self.judge)
    info = episode.grade_info(on_missing_judge="skip")
    return {"correct": bool(info.success), "score": float(info.reward), "judged_by": "tau2",
            "tau2": {"components": info.components, "skipped": list(info.skipped), "note": info.note,
                     "termination": episode.termination_reason}}
