"""PNG plots of a training run from its metrics records (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _series(records, kind: str, key: str):
  pts = [(r["step"], r[key]) for r in records if r["kind"] == kind and key in r]
  return [p[0] for p in pts], [p[1] for p in pts]


def write_plots(records: list[dict[str, Any]], out_dir: str | Path) -> list[Path]:
  """reward.png, accuracy.png, cost.png, tool_mix.png; returns the files written."""
  # Late: the headless backend must be chosen before pyplot is first imported, and pyplot is slow to import.
  import matplotlib  # noqa: PLC0415
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415

  out = Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  eval_kinds = sorted({r["kind"] for r in records if r["kind"].startswith("eval_")})
  written = []

  def save(fig, name):
    fig.tight_layout()
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    written.append(out / name)

  fig, ax = plt.subplots(figsize=(6, 3.5))
  ax.plot(*_series(records, "train", "reward"), label="train reward (mean)")
  ax.set_xlabel("RL step"), ax.set_ylabel("reward"), ax.legend(), ax.grid(alpha=0.3)
  save(fig, "reward.png")

  for key, name, label in (("accuracy", "accuracy.png", "accuracy"), ("cost_per_task", "cost.png", "cost per task (USD)")):
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(*_series(records, "train", key), label="train (sampled)", alpha=0.6)
    for kind in eval_kinds:
      ax.plot(*_series(records, kind, key), marker="o", label=f"eval, prefer {kind[5:]} (greedy)")
    ax.set_xlabel("RL step"), ax.set_ylabel(label), ax.legend(), ax.grid(alpha=0.3)
    save(fig, name)

  shares = sorted({k for r in records for k in r if k.startswith("share_")})
  if eval_kinds and shares:
    fig, axes = plt.subplots(1, len(eval_kinds), figsize=(5 * len(eval_kinds), 3.5), squeeze=False)
    for ax, kind in zip(axes[0], eval_kinds):
      steps, _ = _series(records, kind, shares[0])
      bottom = [0.0] * len(steps)
      for key in shares:
        _, vals = _series(records, kind, key)
        ax.bar([str(s) for s in steps], vals, bottom=bottom, label=key[6:])
        bottom = [b + v for b, v in zip(bottom, vals)]
      ax.set_title(f"tool mix, prefer {kind[5:]}"), ax.set_xlabel("RL step"), ax.set_ylabel("share of calls")
      ax.legend(fontsize=8)
    save(fig, "tool_mix.png")
  return written
