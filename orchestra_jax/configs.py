"""Experiment configs: python files that define `get_config() -> ml_collections.ConfigDict`.

A run is `orchestra <command> --config tiny --config.model.num_layers=4 ...`. `--config` takes a file path or
the name of a packaged config (`demo`, `tiny`, `orchestrator_8b`: the repository's `configs/`, shipped in the
wheel; see `resources.resolve_config`), or a run's saved `run_config.json` (`save_config`, written by every
`orchestra train` into its workdir), so a run can be repeated exactly. Overrides are parsed by the type of the
field they replace, and every mistake (unknown key, bad value, missing file) is one `ConfigFileError` line that
names the key, so a typo fails before any device work starts.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import ml_collections

from orchestra_jax import resources
from orchestra_jax.errors import UserError
from orchestra_jax.model.config import ConfigError, ModelConfig

_PREFIX = "config."
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


class ConfigFileError(UserError, ValueError):
  """A config file or override that cannot be used; the message is one line naming the file or key."""


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> ml_collections.ConfigDict:
  """Runs `get_config()` of the config file at `path` (a path, a packaged config's name, or a saved
  `run_config.json`), applies `overrides`, and locks the result.

  Overrides look like `--config.model.num_layers=4`, `config.model.num_layers=4`, or the two tokens
  `--config.model.num_layers 4`. Locking means later code cannot add keys by typo either.
  """
  try:
    found = resources.resolve_config(path)
  except resources.DataNotFoundError as e:
    raise ConfigFileError(str(e)) from None
  cfg = _read_json_config(found) if found.suffix == ".json" else _run_config_file(found)
  for key, text in _override_pairs(overrides):
    _apply(cfg, key, text)
  cfg.lock()
  return cfg


def model_config(cfg: ml_collections.ConfigDict) -> ModelConfig:
  """The `ModelConfig` described by `cfg.model`; its checks surface as ConfigFileError naming `model.<field>`."""
  if "model" not in cfg or not isinstance(cfg.model, ml_collections.ConfigDict):
    raise ConfigFileError("config has no 'model' section")
  try:
    return ModelConfig.from_dict(cfg.model.to_dict())
  except ConfigError as e:  # its messages already name model.<field>
    raise ConfigFileError(_one_line(str(e))) from e
  except TypeError as e:  # a field the config leaves out: "missing 1 required positional argument: 'vocab_size'"
    missing = str(e).rsplit(":", 1)[-1].strip(" '")
    raise ConfigFileError(f"config key 'model.{missing}' is missing ({_one_line(str(e))})") from e


def split_config_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
  """Splits `--config.<key>=<value>` and `--config.<key> <value>` out of argv, for an argparse CLI.

  Returns (overrides as `--config.<key>=<value>` strings, the remaining args in order). `--config <file>`
  itself is left in the remaining args.
  """
  overrides, rest = [], []
  i = 0
  while i < len(argv):
    arg = argv[i]
    if arg.startswith("--" + _PREFIX):
      if "=" not in arg:
        if i + 1 >= len(argv):
          raise ConfigFileError(f"no value for config key '{arg[2 + len(_PREFIX):]}'")
        arg = f"{arg}={argv[i + 1]}"
        i += 1
      overrides.append(arg)
    else:
      rest.append(arg)
    i += 1
  return overrides, rest


def save_config(cfg: ml_collections.ConfigDict, path: str | Path) -> Path:
  """Writes the resolved config (overrides applied) as JSON, atomically and world-readable; `load_config`
  reads it back (`--config WORKDIR/run_config.json`)."""
  path = Path(path)
  text = json.dumps(cfg.to_dict(), indent=2, sort_keys=True, default=_json_default) + "\n"
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
  try:
    with os.fdopen(fd, "w", encoding="utf-8") as f:
      f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
  except BaseException:
    Path(tmp).unlink(missing_ok=True)
    raise
  return path


def _json_default(value: Any) -> Any:
  raise TypeError(f"config value {value!r} of type {type(value).__name__} cannot be saved as JSON")


# --- loading -----------------------------------------------------------------------------------------

def _read_json_config(path: Path) -> ml_collections.ConfigDict:
  """A config saved by `save_config`. JSON has no tuples: lists become tuples, as config files write them."""
  try:
    data = json.loads(path.read_text(encoding="utf-8"))
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ConfigFileError(f"config file {path} is not a readable JSON config: {_one_line(str(e))}") from None
  if not isinstance(data, dict):
    raise ConfigFileError(f"config file {path} must hold a JSON object, got {type(data).__name__}")

  def tuples(value: Any) -> Any:
    if isinstance(value, dict):
      return {k: tuples(v) for k, v in value.items()}
    if isinstance(value, list):
      return tuple(tuples(v) for v in value)
    return value

  return ml_collections.ConfigDict(tuples(data))


def _run_config_file(path: Path) -> ml_collections.ConfigDict:
  if not path.is_file():
    raise ConfigFileError(f"config file {path} does not exist")
  spec = importlib.util.spec_from_file_location(f"_orchestra_config_{path.stem}", path)
  if spec is None or spec.loader is None:
    raise ConfigFileError(f"config file {path} is not a python file")
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
  except Exception as e:
    raise ConfigFileError(f"config file {path} failed to load: {type(e).__name__}: {_one_line(str(e))}") from e
  if not callable(getattr(module, "get_config", None)):
    raise ConfigFileError(f"config file {path} defines no get_config()")
  try:
    cfg = module.get_config()
  except Exception as e:
    raise ConfigFileError(f"get_config() of config file {path} failed: {type(e).__name__}: {_one_line(str(e))}") from e
  if not isinstance(cfg, ml_collections.ConfigDict):
    raise ConfigFileError(f"get_config() of config file {path} returned {type(cfg).__name__}, not a ConfigDict")
  return cfg


def _override_pairs(overrides) -> list[tuple[str, str]]:
  """(dotted key, value text) for each override, accepting the `=` and the two-token forms."""
  pairs = []
  i = 0
  while i < len(overrides):
    arg = overrides[i].removeprefix("--")
    if not arg.startswith(_PREFIX):
      raise ConfigFileError(f"override {overrides[i]!r} does not start with --config.")
    key, sep, text = arg[len(_PREFIX):].partition("=")
    if not sep:
      if i + 1 >= len(overrides):
        raise ConfigFileError(f"no value for config key '{key}'")
      text = overrides[i + 1]
      i += 1
    pairs.append((key, text))
    i += 1
  return pairs


# --- overrides ---------------------------------------------------------------------------------------

def _apply(cfg: ml_collections.ConfigDict, key: str, text: str) -> None:
  parts = key.split(".")
  node = cfg
  for depth, part in enumerate(parts[:-1]):
    if part not in node:
      raise ConfigFileError(_unknown(cfg, key))
    node = node[part]
    if not isinstance(node, ml_collections.ConfigDict):
      prefix = ".".join(parts[:depth + 1])
      raise ConfigFileError(f"unknown config key '{key}': '{prefix}' is a value, not a group")
  leaf = parts[-1]
  if not leaf or leaf not in node:
    raise ConfigFileError(_unknown(cfg, key))
  old = node[leaf]
  if isinstance(old, ml_collections.ConfigDict):
    raise ConfigFileError(f"config key '{key}' is a group; set one of its fields, e.g. '{key}.{next(iter(old), '')}'")
  value = _parse(key, text, old)
  try:
    node[leaf] = value
  except (TypeError, ValueError, AttributeError) as e:  # e.g. a typed placeholder refusing the value
    raise ConfigFileError(f"bad value for config key '{key}': {_one_line(str(e))}") from e


def _parse(key: str, text: str, old: Any) -> Any:
  """`text` read as the type of `old`, the value it replaces."""
  def bad(expected: str) -> ConfigFileError:
    return ConfigFileError(f"bad value for config key '{key}': expected {expected}, got {text!r}")

  stripped = text.strip()
  if old is None:  # untyped: `none`, any python literal, or else the text itself
    if stripped.lower() in ("none", "null"):
      return None
    try:
      return ast.literal_eval(stripped)
    except (ValueError, SyntaxError):
      return text
  if isinstance(old, bool):  # before int: bool is an int subclass
    if stripped.lower() in _TRUE:
      return True
    if stripped.lower() in _FALSE:
      return False
    raise bad("bool (true/false/1/0/yes/no)")
  if isinstance(old, int):
    try:
      return int(stripped)
    except ValueError:
      raise bad("int") from None
  if isinstance(old, float):
    try:
      return float(stripped)
    except ValueError:
      raise bad("float") from None
  if isinstance(old, str):
    return text
  if isinstance(old, (tuple, list)):
    kind = type(old).__name__
    if stripped and stripped[:1] in "([":  # "" means empty (and "" is in every string)
      try:
        value = ast.literal_eval(stripped)
      except (ValueError, SyntaxError):
        raise bad(f"{kind} (comma-separated or a python literal)") from None
      if not isinstance(value, (tuple, list)):
        raise bad(kind)
    else:
      value = [_literal_or_text(s.strip()) for s in stripped.split(",")] if stripped else []
    return type(old)(value)
  try:  # anything else (dicts, ...): a python literal of the same type
    value = ast.literal_eval(stripped)
  except (ValueError, SyntaxError):
    raise bad(type(old).__name__) from None
  if not isinstance(value, type(old)):
    raise bad(type(old).__name__)
  return value


def _literal_or_text(s: str) -> Any:
  try:
    return ast.literal_eval(s)
  except (ValueError, SyntaxError):
    return s


def _unknown(cfg: ml_collections.ConfigDict, key: str) -> str:
  close = difflib.get_close_matches(key, _flat_keys(cfg), n=1)
  hint = f" (did you mean '{close[0]}'?)" if close else ""
  return f"unknown config key '{key}'{hint}"


def _flat_keys(cfg: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
  keys = []
  for name, value in cfg.items():
    keys.append(prefix + name)
    if isinstance(value, ml_collections.ConfigDict):
      keys.extend(_flat_keys(value, f"{prefix}{name}."))
  return keys


def _one_line(text: str) -> str:
  return " ".join(text.split())
