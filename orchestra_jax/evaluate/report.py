"""An eval's numbers from its result records: the summary (`summary.json`), the markdown table, the accuracy-vs-cost
plot, and other runs' summaries to compare with."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from orchestra_jax.evaluate.results import SUMMARY_FILE
from orchestra_jax.grading import EvalError
from orchestra_jax.reward.features import NEG_COST, NEG_LATENCY, OUTCOME, preference_vector
from orchestra_jax.reward.rewards import compute_rewards


def preference_reward_mean(records: Sequence[Mapping[str, Any]]) -> float | None:
  """Mean preference reward over the records that carry a `preference` (feature -> weight), each group of records
  with the same preference normalised together (`reward.rewards.preference_reward`); None when none has one."""
  groups: dict[str, list[Mapping[str, Any]]] = {}
  for r in records:
    if r.get("preference"):
      groups.setdefault(json.dumps(r["preference"], sort_keys=True), []).append(r)
  if not groups:
    return None
  special = {OUTCOME, NEG_COST, NEG_LATENCY}
  total, count = 0.0, 0
  for key, rs in groups.items():
    pref = json.loads(key)
    tools = {k: float(v) for k, v in pref.items() if k not in special}
    names = sorted(set(tools) | {a for r in rs for a in (r.get("tool_counts") or {})})
    p = preference_vector(names, outcome=float(pref.get(OUTCOME, 0.0)), cost=float(pref.get(NEG_COST, 0.0)),
                          latency=float(pref.get(NEG_LATENCY, 0.0)), tools=tools)
    counts = np.array([[float((r.get("tool_counts") or {}).get(a, 0)) for a in names] for r in rs], np.float32)
    counts = counts.reshape(len(rs), len(names))
    outcome = np.array([1.0 if r.get("correct") else 0.0 for r in rs], np.float32)
    cost = np.array([r.get("cost_usd", 0.0) for r in rs], np.float32)
    latency = np.array([r.get("latency_s", 0.0) for r in rs], np.float32)
    rewards = np.asarray(compute_rewards("preference", counts, outcome, cost, latency, p))
    total += float(rewards.sum())
    count += len(rs)
  return total / count


def summarize(records: Sequence[Mapping[str, Any]], *, label: str, benchmark: str,
              meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
  """The run's numbers from its result records."""
  n = len(records)
  mean = lambda key: (sum(float(r.get(key) or 0.0) for r in records) / n) if n else 0.0
  counts: dict[str, int] = {}
  judged: dict[str, int] = {}
  for r in records:
    for alias, c in (r.get("tool_counts") or {}).items():
      counts[alias] = counts.get(alias, 0) + int(c)
    judged[r.get("judged_by", "?")] = judged.get(r.get("judged_by", "?"), 0) + 1
  total_calls = sum(counts.values())
  correct = sum(1 for r in records if r.get("correct"))
  return {
      "label": label, "benchmark": benchmark, "n": n, "correct": correct, "accuracy": correct / n if n else 0.0,
      "mean_cost_usd": mean("cost_usd"), "mean_tool_cost_usd": mean("tool_cost_usd"),
      "mean_orchestrator_cost_usd": mean("orchestrator_cost_usd"), "mean_latency_s": mean("latency_s"),
      "mean_turns": mean("turns"), "mean_tool_calls": mean("tool_calls"),
      "no_answer": (sum(1 for r in records if r.get("prediction") is None) / n) if n else 0.0,
      "tool_calls_total": total_calls,
      "tool_shares": {a: c / total_calls for a, c in sorted(counts.items())} if total_calls else {},
      "judged_by": dict(sorted(judged.items())),
      "judge_cost_usd": sum(float(r.get("judge_cost_usd") or 0.0) for r in records),
      "preference_reward": preference_reward_mean(records),
      **(dict(meta) if meta else {}),
  }


def format_table(summaries: Sequence[Mapping[str, Any]]) -> str:
  """A markdown table, one row per run."""
  lines = ["| run | benchmark | n | accuracy | mean cost (USD) | mean latency (s) | tool shares | pref. reward |",
           "|---|---|---|---|---|---|---|---|"]
  for s in summaries:
    shares = sorted((s.get("tool_shares") or {}).items(), key=lambda kv: -kv[1])
    share_text = ", ".join(f"{a} {v:.0%}" for a, v in shares[:6]) + (", ..." if len(shares) > 6 else "")
    pref = s.get("preference_reward")
    lines.append(f"| {s['label']} | {s['benchmark']} | {s['n']} | {s['accuracy']:.1%} | {s['mean_cost_usd']:.3g} | "
                 f"{s['mean_latency_s']:.3g} | {share_text or '-'} | {'-' if pref is None else f'{pref:.3f}'} |")
  return "\n".join(lines)


def plot_accuracy_cost(summaries: Sequence[Mapping[str, Any]], path: str | os.PathLike) -> Path:
  """Accuracy vs mean cost per task, one labelled point per run (matplotlib, headless)."""
  # Late: the headless backend must be chosen before pyplot is first imported, and pyplot is slow to import.
  import matplotlib  # noqa: PLC0415
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415

  fig, ax = plt.subplots(figsize=(6, 4))
  for s in summaries:
    x, y = s["mean_cost_usd"], 100 * s["accuracy"]
    ax.scatter([x], [y], s=40)
    ax.annotate(f"{s['label']} ({s['benchmark']}, n={s['n']})", (x, y), textcoords="offset points", xytext=(5, 5),
                fontsize=8)
  ax.set_xlabel("mean cost per task (USD)"), ax.set_ylabel("accuracy (%)")
  ax.set_ylim(-5, 105)
  costs = [s["mean_cost_usd"] for s in summaries]
  hi = max(costs) if costs else 0.0
  ax.set_xlim(-0.05 * (hi or 1e-6), 1.35 * (hi or 1e-6))
  ax.grid(alpha=0.3)
  ax.set_title("accuracy vs cost")
  fig.tight_layout()
  out = Path(path)
  fig.savefig(out, dpi=110)
  plt.close(fig)
  return out


def load_compare(paths: Sequence[str]) -> list[dict[str, Any]]:
  """Other runs' summaries: each path an eval output directory or its summary.json."""
  out = []
  for p in paths:
    path = Path(p)
    if path.is_dir():
      path = path / SUMMARY_FILE
    try:
      out.append(json.loads(path.read_text()))
    except FileNotFoundError:
      raise EvalError(f"--compare {p}: no {SUMMARY_FILE} there") from None
    except (OSError, json.JSONDecodeError) as e:
      raise EvalError(f"--compare {p}: cannot read {path}: {e}") from None
  return out
