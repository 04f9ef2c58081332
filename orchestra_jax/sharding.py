"""Logical axis names -> mesh axes.

Every weight and activation in the model names its dimensions with logical names (`embed`, `q_heads`,
`batch`, ...). A rule table maps each logical name to zero or more mesh axes (`data`, `fsdp`, `tensor`), so
the same model file runs data-parallel, FSDP, tensor-parallel or any mix by changing the mesh shape alone.

A mesh axis that does not divide a dimension is dropped for that dimension (the dimension is then
replicated over it), so small test models run on any mesh; `describe_sharding` shows what happened.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")

LogicalNames = tuple[str | None, ...]
Rules = tuple[tuple[str, str | tuple[str, ...] | None], ...]

# Weights are sharded over `fsdp` on their embed dim and over `tensor` on heads / mlp / vocab;
# activations over (data, fsdp) on batch and `tensor` on heads / mlp / vocab.
DEFAULT_RULES: Rules = (
    # weights
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("q_heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("norm", None),
    ("layers", None),
    # activations
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("cache_length", None),
    ("act_embed", None),
    ("act_q_heads", "tensor"),
    ("act_kv_heads", "tensor"),
    ("act_mlp", "tensor"),
    ("act_vocab", "tensor"),
)


@dataclasses.dataclass(frozen=True)
class ShardingConfig:
  """A device mesh plus the rule table that places logical axes on it."""

  mesh: Mesh
  rules: Rules = DEFAULT_RULES

  def spec(self, shape: Sequence[int], names: LogicalNames) -> PartitionSpec:
    return logical_to_spec(shape, names, self.mesh, self.rules)

  def sharding(self, shape: Sequence[int], names: LogicalNames) -> NamedSharding:
    return NamedSharding(self.mesh, self.spec(shape, names))

  def constrain(self, x: jax.Array, names: LogicalNames) -> jax.Array:
    return jax.lax.with_sharding_constraint(x, self.sharding(x.shape, names))


def make_mesh(shape: Sequence[int] = (-1, 1, 1), axis_names: Sequence[str] = MESH_AXES,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A (data, fsdp, tensor) mesh; one -1 in `shape` takes the remaining devices."""
  devices = list(devices if devices is not None else jax.devices())
  shape = list(shape)
  if len(shape) != len(axis_names):
    raise ValueError(f"mesh shape {tuple(shape)} needs one size per axis {tuple(axis_names)}")
  if shape.count(-1) > 1:
    raise ValueError(f"mesh shape {tuple(shape)} may contain at most one -1")
  if -1 in shape:
    known = math.prod(s for s in shape if s != -1)
    if len(devices) % known:
      raise ValueError(f"mesh shape {tuple(shape)} does not fit {len(devices)} devices")
    shape[shape.index(-1)] = len(devices) // known
  if math.prod(shape) != len(devices):
    raise ValueError(f"mesh shape {tuple(shape)} needs {math.prod(shape)} devices, {len(devices)} available")
  auto = (jax.sharding.AxisType.Auto,) * len(axis_names)
  return jax.make_mesh(tuple(shape), tuple(axis_names), axis_types=auto, devices=devices)


def _rule_table(rules: Rules) -> dict[str, tuple[str, ...]]:
  table = {}
  for logical, mesh_axes in rules:
    if mesh_axes is None:
      table[logical] = ()
    elif isinstance(mesh_axes, str):
      table[logical] = (mesh_axes,)
    else:
      table[logical] = tuple(mesh_axes)
  return table


def logical_to_spec(shape: Sequence[int], names: LogicalNames, mesh: Mesh, rules: Rules = DEFAULT_RULES
                    ) -> PartitionSpec:
  """PartitionSpec for an array of `shape` whose dims are called `names`.

  Mesh axes of size 1, axes already used by an earlier dim, and axes that do not divide the dim are left out.
  """
  if len(shape) != len(names):
    raise ValueError(f"logical names {names} do not match an array of rank {len(shape)}")
  table = _rule_table(rules)
  used: set[str] = set()
  spec = []
  for dim, name in zip(shape, names):
    if name is None:
      spec.append(None)
      continue
    if name not in table:
      raise KeyError(f"logical axis {name!r} has no rule; add it to the sharding rules")
    chosen = []
    size = 1
    for axis in table[name]:
      axis_size = mesh.shape[axis]
      if axis in used or axis_size == 1 or dim % (size * axis_size):
        continue
      chosen.append(axis)
      size *= axis_size
    used.update(chosen)
    spec.append(None if not chosen else chosen[0] if len(chosen) == 1 else tuple(chosen))
  return PartitionSpec(*spec)


def tree_shardings(shapes: Any, names: Any, sharding: ShardingConfig) -> Any:
  """NamedShardings for a pytree of arrays/ShapeDtypeStructs given a matching pytree of logical names."""
  is_names = lambda x: isinstance(x, tuple) and all(n is None or isinstance(n, str) for n in x)
  return jax.tree.map(lambda n, s: sharding.sharding(s.shape, n), names, shapes, is_leaf=is_names)


def describe_sharding(shapes: Any, shardings: Any) -> str:
  """One line per leaf: path, shape and spec; for logs and `--help`-level debugging."""
  lines = []
  flat, _ = jax.tree_util.tree_flatten_with_path(shapes)
  flat_s = jax.tree.leaves(shardings, is_leaf=lambda x: isinstance(x, NamedSharding))
  for (path, leaf), s in zip(flat, flat_s):
    lines.append(f"{jax.tree_util.keystr(path):60s} {str(tuple(np.shape(leaf))):24s} {s.spec}")
  return "\n".join(lines)
