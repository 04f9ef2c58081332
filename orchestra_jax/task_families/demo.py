"""The `demo` task family: the CPU demo's arithmetic/capital/element questions and three scripted priced tools
(`orchestra_jax/demo/world.py`); served locally, no network, with a supervised warm-up."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import ClassVar

from orchestra_jax.demo import world as demo
from orchestra_jax.task_families.base import ENV_SECTIONS, EnvSetup, bad_value, register_task_family, typed_section

__all__ = ["DemoEnvSection", "demo_environment"]


@dataclasses.dataclass(frozen=True)
class DemoEnvSection:
  """The `env` section for `env.name="demo"` (configs/demo.py)."""

  KEY: ClassVar[str] = "env"
  name: str = "demo"
  num_train_tasks: int = 480
  num_eval_tasks: int = 60  # per preference
  # Presets mixed in training, each evaluated separately. One preference per run: a 10M-parameter policy
  # trained on a mix collapses onto the always-right expert before it learns to read the preference.
  preferences: tuple[str, ...] = ("cheap",)

  def __post_init__(self):
    for key in ("num_train_tasks", "num_eval_tasks"):
      if getattr(self, key) < 1:
        raise bad_value(f"env.{key}", f"must be >= 1, got {getattr(self, key)}")
    if not self.preferences:
      raise bad_value("env.preferences", "name at least one preference preset")


@contextlib.contextmanager
def demo_environment(cfg):
  """`cfg`: a TrainingConfig, or a training ConfigDict."""
  e = typed_section(DemoEnvSection, cfg.env)
  prefs = list(e.preferences)
  with demo.DemoWorld(seed=cfg.seed) as w:
    yield EnvSetup(
        env=w.env(), aliases=list(w.aliases),
        train_tasks=demo.make_tasks(e.num_train_tasks, seed=cfg.seed, preference=prefs),
        eval_tasks={p: demo.make_tasks(e.num_eval_tasks, seed=cfg.seed + 10_000, preference=p) for p in prefs},
        grade=lambda task, traj, episode: w.grade(task, traj.final_answer),
        preference_vector=w.preference_vector, sft_examples=demo.sft_examples)


register_task_family("demo")(demo_environment)
ENV_SECTIONS["demo"] = DemoEnvSection
