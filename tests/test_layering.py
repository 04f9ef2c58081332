"""Layering of the package, read from the source (nothing imported): no import cycle between modules or between
folders, and training never reaches a command module. Imports inside functions count too: a late import only
hides a loop, it does not remove it (docs/architecture.md)."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "orchestra_jax"
# Modules that parse a command line; library code (training above all) must not import them.
COMMANDS = {"orchestra_jax.cli", "orchestra_jax.data.cli", "orchestra_jax.synth.cli", "orchestra_jax.evaluate.cli",
            "orchestra_jax.serve.cli"}


def _module_name(path: Path) -> str:
  parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
  return {_module_name(p): p for p in PACKAGE.rglob("*.py") if "resources" not in p.parts or p.name == "__init__.py"}


def _resolve(name: str, known: set[str]) -> str | None:
  """The module `name` refers to: itself, or for `from pkg import thing`, pkg.thing when that is a module."""
  while name and name not in known:
    name = name.rpartition(".")[0]
  return name or None


def import_graph() -> dict[str, set[str]]:
  modules = _modules()
  known = set(modules)
  graph: dict[str, set[str]] = {m: set() for m in modules}
  for name, path in modules.items():
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
      targets = []
      if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:  # relative import
          anchor = name.split(".")
          anchor = anchor[:len(anchor) - node.level + (1 if is_package else 0)]
          base = ".".join(anchor + ([base] if base else []))
        targets = [f"{base}.{a.name}" for a in node.names] + [base]
      for target in targets:
        if not target.startswith("orchestra_jax"):
          continue
        found = _resolve(target, known)
        # A package's __init__ re-exporting its own modules is not a dependency of theirs on it.
        if found and found != name and not (is_package and found.startswith(name + ".")):
          graph[name].add(found)
  return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """Strongly connected components with more than one node (Tarjan)."""
  index, low, stack, on_stack, out = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in graph.get(v, ()):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        out.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return out


def _folder(module: str) -> str:
  """The folder a module lives in (orchestra_jax.rollout.sampler -> orchestra_jax.rollout); a top-level module
  (orchestra_jax.trainer) is a node of its own."""
  return ".".join(module.split(".")[:2])


def test_no_import_cycle_between_modules():
  assert _cycles(import_graph()) == []


def test_no_import_cycle_between_folders():
  folders: dict[str, set[str]] = {}
  for src, targets in import_graph().items():
    folders.setdefault(_folder(src), set()).update(_folder(t) for t in targets if _folder(t) != _folder(src))
  assert _cycles(folders) == []


def test_training_never_imports_a_command():
  graph = import_graph()
  reached, todo = set(), ["orchestra_jax.trainer"]
  while todo:
    m = todo.pop()
    if m not in reached:
      reached.add(m)
      todo.extend(graph.get(m, ()))
  assert reached & COMMANDS == set()
  assert not any(m == "orchestra_jax.evaluate" or m.startswith("orchestra_jax.evaluate.") for m in reached)
