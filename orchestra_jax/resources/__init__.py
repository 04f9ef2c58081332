"""Files that ship inside the package, found through `importlib.resources` (never by climbing out of it).

* `data/` (package data): the tau2-bench domains (`tau2/`, MIT, Sierra Research) and the FRAMES questions
  (`frames/`, Apache-2.0, Google); see THIRD_PARTY_NOTICES.md and docs/design.md section 8. Large files are
  stored gzipped (`db.json.gz`); `find_data_file` and `open_text` take either form, so a user's own plain copy
  in `$ORCHESTRA_DATA_DIR` works too.
* `configs` (the repository's top-level `configs/`, carried in the wheel as `orchestra_jax.resources.configs`):
  the named configs (`--config demo`, `--config tiny`, `--config orchestrator_8b`) and the default tool catalog.

A checkout and an installed wheel resolve the same way; so does every working directory.
"""

from __future__ import annotations

import gzip
import importlib.resources
import io
import json
import os
from pathlib import Path
from typing import Any, TextIO

from orchestra_jax.errors import UserError

__all__ = ["DATA_ENV_VAR", "DataNotFoundError", "data_dir", "packaged_data_dir", "find_data_file", "open_text",
           "read_text", "read_json", "configs_dir", "config_names", "resolve_config", "default_catalog_path"]

DATA_ENV_VAR = "ORCHESTRA_DATA_DIR"


class DataNotFoundError(UserError, FileNotFoundError):
  """A data directory or file (packaged or under `$ORCHESTRA_DATA_DIR`) is missing."""


def _package_path(package: str, *parts: str) -> Path:
  root = importlib.resources.files(package)
  if not isinstance(root, Path):  # e.g. imported from a zip: our loaders need real files
    raise DataNotFoundError(f"package {package} is not installed as files on disk ({root!r}); "
                            "install orchestra-jax with pip (not zipped)")
  return root.joinpath(*parts)


def packaged_data_dir() -> Path:
  """The data shipped in the package: `<package>/resources/data`, holding `tau2/` and `frames/`."""
  return _package_path(__name__, "data")


def data_dir() -> Path:
  """`$ORCHESTRA_DATA_DIR` (a user's own copy holding `tau2/` and `frames/`) when set, else the packaged data."""
  env = os.environ.get(DATA_ENV_VAR)
  if env:
    return Path(env).expanduser().resolve()
  return packaged_data_dir()


def find_data_file(path: str | os.PathLike) -> Path:
  """`path`, or its gzipped twin `path.gz`; DataNotFoundError naming `path` when neither exists."""
  path = Path(path)
  if path.is_file():
    return path
  gz = path.with_name(path.name + ".gz")
  if gz.is_file():
    return gz
  raise DataNotFoundError(f"missing data file {path}")


def open_text(path: str | os.PathLike) -> TextIO:
  """Opens `path` (or `path.gz`) as UTF-8 text; `.gz` files are decompressed on the fly."""
  found = find_data_file(path)
  if found.suffix == ".gz":
    return io.TextIOWrapper(gzip.open(found, "rb"), encoding="utf-8")
  return open(found, encoding="utf-8")


def read_text(path: str | os.PathLike) -> str:
  with open_text(path) as f:
    return f.read()


def read_json(path: str | os.PathLike) -> Any:
  with open_text(path) as f:
    return json.load(f)


# --- configs ------------------------------------------------------------------------------------------------
def configs_dir() -> Path:
  """The packaged configs (the repository's `configs/`)."""
  return _package_path(f"{__name__}.configs")


def config_names() -> list[str]:
  return sorted(p.stem for p in configs_dir().glob("*.py") if not p.name.startswith("_"))


def resolve_config(name_or_path: str | os.PathLike) -> Path:
  """A config file: an existing path as given, else a packaged config named like `tiny` (or `tiny.py`).

  A path that exists always wins, so a user's own `configs/demo.py` overrides the packaged one of that name.
  """
  path = Path(name_or_path).expanduser()
  if path.is_file():
    return path
  text = str(name_or_path)
  if "/" not in text and os.sep not in text:
    candidate = configs_dir() / (text if text.endswith(".py") else text + ".py")
    if candidate.is_file() and not candidate.name.startswith("_"):
      return candidate
  names = config_names()
  raise DataNotFoundError(f"config file {text} does not exist (packaged configs, by name: {', '.join(names)}; "
                          f"e.g. --config {names[0]})")


def default_catalog_path() -> Path:
  """The reference tool catalog (docs/design.md section 4): `configs/tools/default_catalog.json`."""
  return configs_dir() / "tools" / "default_catalog.json"
