"""Per-sample randomisation: preference vectors, their text, offered tools and alias remapping.

The paper randomises, for every training sample, which tools are offered, which model each alias stands for,
their prices and the user's preference, so that the orchestrator learns to read the tool descriptions instead
of memorising alias names. Everything here is seeded per sample (`sample_rng(seed, sample_id)`), so a sample's
randomisation does not depend on the order or the number of samples converted with it.

Preference vectors are dicts over the reward's features (docs/design.md section 5; same names as
`orchestra_jax.reward.features`): one entry per tool alias (weight on its call count), `"outcome"`,
`"-cost"` and `"-latency"`. Positive weight on "-cost" means "prefer cheap"; a negative weight on an alias
means "avoid it". Missing features weigh 0. `preference_array` gives the vector in the reward's order.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from orchestra_jax.data.format import Sample
from orchestra_jax.tools.catalog import Catalog

__all__ = ["OUTCOME", "NEG_COST", "NEG_LATENCY", "QA_TOOL_GROUPS", "ENV_TOOL_GROUPS", "feature_names",
           "preference_array", "preference_text", "random_preference", "random_tool_subset", "random_alias_map",
           "randomize_sample", "randomize_samples", "alias_map_to_remap", "sample_rng"]

OUTCOME, NEG_COST, NEG_LATENCY = "outcome", "-cost", "-latency"  # = orchestra_jax.reward.features
QA_TOOL_GROUPS = ("search", "enhance_reasoning", "answer")
ENV_TOOL_GROUPS = ("call_expert",)
STRONG = 1.0  # |weight| at or above which the text says "strongly"


def sample_rng(seed: int, sample_id: str) -> random.Random:
  """The random generator of one sample (string seeding is stable across runs and Python versions)."""
  return random.Random(f"orchestra-data/{int(seed)}/{sample_id}")


def feature_names(tool_names: Sequence[str]) -> list[str]:
  """[tool names..., "outcome", "-cost", "-latency"]: the reward's feature order."""
  return [*tool_names, OUTCOME, NEG_COST, NEG_LATENCY]


def preference_array(preference: Mapping[str, float], tool_names: Sequence[str]):
  """The preference as a float32 vector in `feature_names(tool_names)` order (what the reward takes).
  Raises ValueError for a feature that is not in that order."""
  names = feature_names(tool_names)
  unknown = sorted(set(preference) - set(names))
  if unknown:
    raise ValueError(f"preference weights features {unknown} that are not among {names}")
  return np.array([float(preference.get(n, 0.0)) for n in names], np.float32)


# --- text ---------------------------------------------------------------------------------------------------
def _join(names: Sequence[str]) -> str:
  names = list(names)
  return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def preference_text(preference: Mapping[str, float]) -> str:
  """The preference in words, e.g. {"outcome": 1, "-cost": 0.5, "expert-1": -0.5} ->
  "Prefer cheap tools; avoid expert-1." Deterministic; weights of |w| >= 1 read "strongly"."""
  cost = float(preference.get(NEG_COST, 0.0))
  latency = float(preference.get(NEG_LATENCY, 0.0))
  outcome = float(preference.get(OUTCOME, 0.0))
  tools = {k: float(v) for k, v in preference.items() if k not in (OUTCOME, NEG_COST, NEG_LATENCY) and v}
  clauses: list[str] = []

  def strength(w: float) -> str:
    return "strongly " if abs(w) >= STRONG else ""

  if cost > 0 and latency > 0 and (cost >= STRONG) == (latency >= STRONG):
    clauses.append(f"{strength(cost)}prefer cheap and fast tools")
  else:
    if cost > 0:
      clauses.append(f"{strength(cost)}prefer cheap tools")
    if latency > 0:
      clauses.append(f"{strength(latency)}prefer fast tools")
  if cost < 0:
    clauses.append(f"{strength(cost)}prefer capable tools even when they cost more")
  if latency < 0:
    clauses.append(f"{strength(latency)}prefer thorough tools even when they are slow")
  for sign, verb in ((1, "prefer"), (-1, "avoid")):
    for strong in (True, False):
      names = sorted(n for n, w in tools.items() if w * sign > 0 and (abs(w) >= STRONG) == strong)
      if names:
        clauses.append(f"{'strongly ' if strong else ''}{verb} {_join(names)}")
  if outcome <= 0:
    clauses.append("the correctness of the answer does not matter")
  elif not clauses:
    clauses.append("just get the answer right; cost and latency do not matter")
  text = "; ".join(clauses)
  return text[0].upper() + text[1:] + "."


# --- random draws -------------------------------------------------------------------------------------------
def random_preference(rng: random.Random, tools: Sequence[str], *, weights: Sequence[float] = (0.5, 1.0),
                      p_cost: float = 0.5, p_latency: float = 0.35, p_prefer_tool: float = 0.25,
                      p_avoid_tool: float = 0.25) -> dict[str, float]:
  """A random preference over `tools` (aliases): outcome 1 always; "-cost" / "-latency" with the given
  probabilities; at most one preferred and one avoided tool. Only non-zero weights are kept."""
  pref: dict[str, float] = {OUTCOME: 1.0}
  if rng.random() < p_cost:
    pref[NEG_COST] = float(rng.choice(weights))
  if rng.random() < p_latency:
    pref[NEG_LATENCY] = float(rng.choice(weights))
  pool = list(tools)
  if pool and rng.random() < p_prefer_tool:
    name = rng.choice(pool)
    pref[name] = float(rng.choice(weights))
    pool.remove(name)
  if pool and rng.random() < p_avoid_tool:
    pref[rng.choice(pool)] = -float(rng.choice(weights))
  return pref


def random_tool_subset(rng: random.Random, groups: Mapping[str, Sequence[str]], keep_prob: float = 0.75) -> list[str]:
  """For each tool (name -> its aliases) a random non-empty subset of its aliases, in catalog order."""
  out: list[str] = []
  for aliases in groups.values():
    kept = [a for a in aliases if rng.random() < keep_prob]
    if not kept and aliases:
      kept = [rng.choice(list(aliases))]
    out.extend(kept)
  return out


def _round_sig(x: float, digits: int = 3) -> float:
  if x == 0:
    return 0.0
  return round(x, digits - 1 - int(math.floor(math.log10(abs(x)))))


def _jitter(rng: random.Random, lo: float, hi: float) -> float:
  """Log-uniform in [lo, hi]."""
  return math.exp(rng.uniform(math.log(lo), math.log(hi)))


def random_alias_map(rng: random.Random, aliases: Iterable[str], catalog=None, *, permute: bool = True,
                     price_range: tuple[float, float] = (0.5, 2.0),
                     latency_range: tuple[float, float] = (0.5, 2.0)) -> dict[str, dict[str, Any]]:
  """alias -> {model, price_in, price_out, latency} for each alias.

  With `permute`, an alias's model is drawn from the models the catalog assigns to any alias of the same tool
  (so "answer-1" may stand for the small model in one sample and the large one in the next); its base
  prices and latency are those of the chosen model for that tool. Prices and latency are then scaled by
  log-uniform factors from `price_range` / `latency_range` and rounded to 3 significant digits.
  `catalog`: a `tools.catalog.Catalog` (default: the reference catalog)."""
  if catalog is None:
    catalog = Catalog.default()
  tool_of = {a: t for t in catalog.tools.values() for a in t.aliases}
  out: dict[str, dict[str, Any]] = {}
  for alias in aliases:
    base = catalog.backend(alias)  # raises for an alias the catalog does not know
    choice = base
    if permute and alias in tool_of:
      candidates = {}
      for other in tool_of[alias].aliases:
        b = catalog.backend(other)
        candidates.setdefault(b.model, b)  # one backend per model: its prices and its latency for this tool
      choice = candidates[rng.choice(sorted(candidates))]
    scale = _jitter(rng, *price_range)
    out[alias] = {"model": choice.model, "price_in": _round_sig(choice.price_in * scale),
                  "price_out": _round_sig(choice.price_out * scale),
                  "latency": _round_sig(choice.latency_s * _jitter(rng, *latency_range))}
  return out


def alias_map_to_remap(alias_map: Mapping[str, Mapping[str, Any]], catalog) -> dict[str, dict[str, Any]]:
  """A sample's alias_map in the form `Catalog.remap` takes, with the endpoint (base_url, api_key_env) of
  each remapped model looked up in `catalog` (the first alias serving that model), so a permuted alias
  reaches the server that actually serves its new model."""
  serving: dict[str, Any] = {}
  for b in catalog.backends.values():
    serving.setdefault(b.model, b)
  out: dict[str, dict[str, Any]] = {}
  for alias, spec in alias_map.items():
    fields: dict[str, Any] = {}
    if "model" in spec:
      fields["model"] = spec["model"]
      if spec["model"] in serving:
        fields["base_url"] = serving[spec["model"]].base_url
        fields["api_key_env"] = serving[spec["model"]].api_key_env
    for key, target in (("price_in", "price_in"), ("price_out", "price_out"), ("latency", "latency_s")):
      if key in spec:
        fields[target] = spec[key]
    out[alias] = fields
  return out


def randomize_sample(sample: Sample, seed: int, catalog=None, *, subset: bool = True, remap: bool = True,
                     preference: bool = True, keep_prob: float = 0.75) -> Sample:
  """A copy of `sample` with random offered aliases (`tools`), `alias_map`, `preference` and
  `preference_text`, seeded by (seed, sample.id). QA samples get the search / enhance_reasoning / answer
  aliases; environment samples keep their domain tools and get call_expert aliases."""
  if catalog is None:
    catalog = Catalog.default()
  rng = sample_rng(seed, sample.id)
  group_names = ENV_TOOL_GROUPS if sample.is_env else QA_TOOL_GROUPS
  all_tools = catalog.tools
  groups = {g: all_tools[g].aliases for g in group_names if g in all_tools}
  offered = random_tool_subset(rng, groups, keep_prob) if subset else [a for v in groups.values() for a in v]
  alias_set = set(catalog.aliases)
  own_tools = [t for t in sample.tools if t not in alias_set]  # domain tools of environment samples
  changes: dict[str, Any] = {"tools": own_tools + offered}
  changes["alias_map"] = random_alias_map(rng, offered, catalog) if remap else {}
  if preference:
    pref = random_preference(rng, offered)
    changes["preference"] = pref
    changes["preference_text"] = preference_text(pref)
  return sample.replace(**changes)


def randomize_samples(samples: Iterable[Sample], seed: int, catalog=None, **kwargs: Any) -> list[Sample]:
  """`randomize_sample` for each sample (the catalog is loaded once)."""
  if catalog is None:
    catalog = Catalog.default()
  return [randomize_sample(s, seed, catalog, **kwargs) for s in samples]
