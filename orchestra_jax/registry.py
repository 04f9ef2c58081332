"""One registry of named variants, by category: a variant is one function plus one name, and every config that
says the name can use it (in the style of Tunix's `rl/function_registry.py`).

Categories (and the config key that picks from each):
- `reward`: reward functions, `reward.name` (orchestra_jax/reward/rewards.py, `register_reward`).
- `advantage`: advantage estimators, `reward.estimator` (orchestra_jax/reward/advantages.py, `register_advantage`).
- `aggregation`: loss aggregations, `train.aggregation` (orchestra_jax/rl/loss.py, `register_aggregation`).
- `kl`: KL estimators, `train.kl_type` (orchestra_jax/rl/loss.py, `register_kl`).
- `task_family`: task families, `env.name` (orchestra_jax/task_families/, `register_task_family`).

    @register("reward", "mine")        # or @register_reward("mine")
    def mine(tool_counts, outcome, cost, latency, preference=None, mask=None): ...
    get("reward", "mine"); names("reward")

Registering a taken name replaces the function with a warning, so a notebook cell can be re-run and a user module
can override a built-in. A user's module registers in the trainer's process when the config names it in its
top-level `imports` key (`import_modules`; `orchestra_jax/trainer.py` imports them before reading a registry).

Standard library only: every module with a registry imports this one.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
import threading
import types
import warnings
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Callable, Generic, TypeVar

from orchestra_jax.errors import UserError

F = TypeVar("F", bound=Callable)

# category -> what its entries are called in messages
CATEGORIES: dict[str, str] = {
    "reward": "reward",
    "advantage": "advantage estimator",
    "aggregation": "loss aggregation",
    "kl": "KL estimator",
    "task_family": "task family",
}

_TABLES: dict[str, dict[str, Callable]] = {category: {} for category in CATEGORIES}
_FILE_MODULE_PREFIX = "_orchestra_imports_"  # sys.modules names of the .py files `import_modules` loads
_LOCK = threading.Lock()  # registration at import time may race with a lookup from a worker thread


class UnknownNameError(UserError, KeyError):
  """A config names a variant nobody registered; the message lists the known names."""

  def __str__(self) -> str:  # KeyError would quote the message
    return str(self.args[0])


class UserModuleError(UserError, ImportError):
  """A module of a config's `imports` could not be imported; the message is one line naming it."""

  def __str__(self) -> str:
    return str(self.args[0])


def _table(category: str) -> dict[str, Callable]:
  if category not in _TABLES:  # a programming error, not a config's: no UserError
    raise ValueError(f"unknown registry category {category!r}; categories: {', '.join(CATEGORIES)}")
  return _TABLES[category]


def register(category: str, name: str) -> Callable[[F], F]:
  """Decorator: registers the function as `name` in `category`; a taken name is replaced, with a warning."""
  table = _table(category)

  def decorate(fn: F) -> F:
    with _LOCK:
      old = table.get(name)
      table[name] = fn
    if old is not None and old is not fn:
      warnings.warn(f"{CATEGORIES[category]} {name!r} was already registered ({_describe(old)}); "
                    f"{_describe(fn)} replaces it", stacklevel=2)
    return fn
  return decorate


def get(category: str, name: str) -> Callable:
  """The function registered as `name` in `category`; UnknownNameError (one line, the known names) if none is."""
  table = _table(category)
  with _LOCK:
    fn = table.get(name)
  if fn is None:
    raise UnknownNameError(f"unknown {CATEGORIES[category]} {name!r}; known: {', '.join(names(category))}")
  return fn


def names(category: str) -> tuple[str, ...]:
  """The registered names of `category`, sorted."""
  table = _table(category)
  with _LOCK:
    return tuple(sorted(table))


def unregister(category: str, name: str) -> Callable | None:
  """Removes `name` from `category` (for tests that register throw-away variants); returns what was there."""
  table = _table(category)
  with _LOCK:
    return table.pop(name, None)


def categories() -> tuple[str, ...]:
  return tuple(CATEGORIES)


def _describe(fn: Callable) -> str:
  module = getattr(fn, "__module__", None) or "?"
  name = getattr(fn, "__qualname__", type(fn).__name__)
  if module.startswith(_FILE_MODULE_PREFIX):  # a file of a config's `imports`: its path says more than its name
    return f"{name} of {getattr(sys.modules.get(module), '__file__', module)}"
  return f"{module}.{name}"


class Registry(Mapping[str, F], Generic[F]):
  """One category as an object: `.register(name)`, `.get(name)`, `.names()`, and a read-only mapping
  (`REWARDS[name]`, `name in REWARDS`, `sorted(REWARDS)`). Holds no state: the tables live in this module."""

  def __init__(self, category: str):
    _table(category)  # fails early on a misspelt category
    self.category = category
    self.kind = CATEGORIES[category]

  def register(self, name: str) -> Callable[[F], F]:
    return register(self.category, name)

  def get(self, name: str) -> F:  # type: ignore[override]  # Mapping.get(key, default) returns None; this raises
    return get(self.category, name)

  def names(self) -> tuple[str, ...]:
    return names(self.category)

  def __getitem__(self, name: str) -> F:
    return get(self.category, name)

  def __contains__(self, name: object) -> bool:
    with _LOCK:
      return name in _TABLES[self.category]

  def __iter__(self) -> Iterator[str]:
    return iter(self.names())

  def __len__(self) -> int:
    return len(self.names())

  def __repr__(self) -> str:
    return f"Registry({self.category!r}: {', '.join(self.names())})"


# --- user modules --------------------------------------------------------------------------------------

def import_modules(specs: Iterable[str]) -> list[types.ModuleType]:
  """Imports each of `specs`, so the registrations in it run: a module name (`my_pkg.rewards`, found on
  sys.path) or the path of a .py file (absolute, or relative to the working directory). Importing twice does
  not run a module again. Raises UserModuleError, one line naming the module, when one cannot be imported."""
  if isinstance(specs, str):  # one name, not its characters
    specs = (specs,)
  return [_import_one(str(spec)) for spec in specs]


def _is_path(spec: str) -> bool:
  return spec.endswith(".py") or "/" in spec or "\\" in spec


def _import_one(spec: str) -> types.ModuleType:
  if _is_path(spec):
    return _import_file(spec)
  try:
    return importlib.import_module(spec)
  except ModuleNotFoundError as e:
    if e.name is not None and (spec == e.name or spec.startswith(e.name + ".")):  # itself, not a dependency of it
      raise UserModuleError(
          f"no module named {spec!r} (name a module on sys.path, or give a .py file's path)") from None
    raise UserModuleError(f"importing {spec!r} failed: {type(e).__name__}: {_one_line(e)}") from e
  except Exception as e:  # the module's own code failed
    raise UserModuleError(f"importing {spec!r} failed: {type(e).__name__}: {_one_line(e)}") from e


def _import_file(spec: str) -> types.ModuleType:
  path = Path(spec).expanduser().resolve()
  if not path.is_file():
    raise UserModuleError(f"no file {spec!r} to import (looked for {path})")
  # A private module name per file: a file called e.g. `test.py` must not shadow or replace an installed module.
  digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
  name = f"{_FILE_MODULE_PREFIX}{''.join(c if c.isalnum() else '_' for c in path.stem)}_{digest}"
  if name in sys.modules:
    return sys.modules[name]
  module_spec = importlib.util.spec_from_file_location(name, path)
  if module_spec is None or module_spec.loader is None:
    raise UserModuleError(f"cannot import {spec!r}: not a python file")
  module = importlib.util.module_from_spec(module_spec)
  sys.modules[name] = module  # before running it, as `import` does (dataclasses and pickling look it up)
  try:
    module_spec.loader.exec_module(module)
  except Exception as e:
    del sys.modules[name]
    raise UserModuleError(f"importing {spec!r} failed: {type(e).__name__}: {_one_line(e)}") from e
  return module


def _one_line(e: BaseException) -> str:
  return " ".join(str(e).split())
