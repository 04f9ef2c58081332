"""Lazy public names for a package `__init__`: a name is imported from its module on first use.

Why: `orchestra --help` and the pure-math modules should not pay for importing JAX, grain or the HTTP stack
through a package they only touch for one name.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], object], Callable[[], list]]:
  """`(__getattr__, __dir__)` for `package`: `exports` maps each public name to the module that defines it,
  relative to the package (`"format"`) or absolute (`"orchestra_jax.tau2.datamodel"`)."""
  def __getattr__(name: str):
    module = exports.get(name)
    if module is None:
      raise AttributeError(f"module {package!r} has no attribute {name!r}")
    target = module if module.startswith("orchestra_jax.") else f"{package}.{module}"
    value = getattr(importlib.import_module(target), name)
    setattr(sys.modules[package], name, value)  # later lookups skip __getattr__
    return value

  def __dir__() -> list:
    return sorted(set(vars(sys.modules[package])) | set(exports))

  return __getattr__, __dir__
