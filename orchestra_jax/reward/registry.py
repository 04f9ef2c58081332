"""A name -> function table, so a variant (reward, advantage estimator, loss aggregation, KL estimator) is one
function plus one name: `@REWARDS.register("mine")` and every config that says `"mine"` can use it."""

from __future__ import annotations

from typing import Callable, Generic, TypeVar

from orchestra_jax.errors import UserError

F = TypeVar("F", bound=Callable)


class UnknownNameError(UserError, KeyError):
  """A config names a variant nobody registered; the message lists the known names."""

  def __str__(self) -> str:  # KeyError would quote the message
    return str(self.args[0])


class Registry(Generic[F]):
  """Functions of one kind by name. Registering a second function under a taken name is an error."""

  def __init__(self, kind: str):
    self.kind = kind
    self._fns: dict[str, F] = {}

  def register(self, name: str) -> Callable[[F], F]:
    def decorate(fn: F) -> F:
      if self._fns.get(name, fn) is not fn:
        raise ValueError(f"{self.kind} {name!r} is already registered")
      self._fns[name] = fn
      return fn
    return decorate

  def get(self, name: str) -> F:
    if name not in self._fns:
      raise UnknownNameError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}")
    return self._fns[name]

  def names(self) -> tuple[str, ...]:
    return tuple(sorted(self._fns))

  def __contains__(self, name: str) -> bool:
    return name in self._fns
