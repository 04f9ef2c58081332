"""The priced tool catalog: orchestrator-facing functions, the aliases they take and the backends behind them.

Three QA functions (`search(model)`, `enhance_reasoning(model)`, `answer(model)`) and, for tau2-style tasks,
`call_expert(expert)`. Each takes one argument whose value is an alias (`search-1`, `answer-math-2`, ...);
an alias maps to a backend: a model served behind an OpenAI-compatible endpoint, the NAME of the
environment variable holding its API key (never the key), a price in USD per million input / output
tokens and a typical latency. The orchestrator sees the aliases as a JSON-schema enum and each alias's
price and latency in the description text; per-sample training data may remap aliases to other models
and prices (`Catalog.remap`) and offer only some aliases (`Catalog.offer`, a sample's `tools`), which is what
lets the policy generalise to tools it has not seen.

Config file (JSON), e.g. configs/tools/default_catalog.json:

    {"require_document_before_answer": false, "show_model_names": false,
     "orchestrator": {"model": "Qwen/Qwen3-8B", "price_in": 0.2, "price_out": 0.2},
     "code_execution_usd_per_s": 8.3e-06,
     "tools": [{"name": "search", "description": "...", "argument": "model",
                "argument_description": "...", "aliases": ["search-1", "search-2", "search-3"]}, ...],
     "aliases": {"search-1": {"model": "gpt-5", "base_url": "http://127.0.0.1:8101/v1",
                              "api_key_env": "OPENAI_API_KEY", "price_in": 1.25, "price_out": 10.0,
                              "latency_s": 22.0, "description": ""}, ...}}
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any, Iterable, Mapping

from orchestra_jax.errors import UserError
from orchestra_jax.resources import default_catalog_path

QA_TOOLS = ("search", "enhance_reasoning", "answer")

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ALIAS = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")
_ANSWER_GATE_TEXT = "Not allowed to call before a search has returned documents."


class CatalogError(UserError, ValueError):
  """A catalog config or remapping that cannot work; the message names the file and the field."""


class UnknownAliasError(CatalogError):
  """An alias (or tool name) that the catalog does not define."""


class InvalidToolCall(ValueError):
  """The orchestrator's tool call cannot be executed (not the user's fault: the rollout reports it to the
  model and the turn counts as having no valid tool call). `str(err)` is the message for the model."""


@dataclasses.dataclass(frozen=True)
class Backend:
  """What an alias runs on. Prices in USD per million tokens; latency in seconds."""

  alias: str
  model: str
  base_url: str  # OpenAI-compatible base, e.g. http://127.0.0.1:8101/v1 (…/chat/completions is appended)
  api_key_env: str | None  # NAME of the environment variable with the key; None: no key (local vLLM)
  price_in: float
  price_out: float
  latency_s: float
  description: str = ""  # optional capability text shown to the orchestrator

  def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
    """USD of one call: p_in * prompt_tokens / 1e6 + p_out * completion_tokens / 1e6."""
    return llm_cost(self.price_in, self.price_out, prompt_tokens, completion_tokens)

  def api_key(self) -> str | None:
    """The key, read from the environment at call time (never stored in the catalog)."""
    return os.environ.get(self.api_key_env) if self.api_key_env else None

  def to_dict(self) -> dict[str, Any]:
    out = dataclasses.asdict(self)
    out.pop("alias")
    return out


@dataclasses.dataclass(frozen=True)
class ToolSpec:
  """One orchestrator-facing function with a single alias-valued argument."""

  name: str
  description: str
  argument: str  # "model" (QA tools) or "expert" (call_expert)
  argument_description: str
  aliases: tuple[str, ...]

  def to_dict(self) -> dict[str, Any]:
    out = dataclasses.asdict(self)
    out["aliases"] = list(self.aliases)
    return out


@dataclasses.dataclass(frozen=True)
class ResolvedCall:
  """A valid tool call: which function, which alias, and the backend that serves it."""

  tool: ToolSpec
  alias: str
  backend: Backend


def llm_cost(price_in: float, price_out: float, prompt_tokens: int, completion_tokens: int) -> float:
  """USD for an LLM call with prices in USD per million input / output tokens."""
  return (price_in * prompt_tokens + price_out * completion_tokens) / 1e6


def _fmt_price(p: float) -> str:
  return f"${p:g}"


class Catalog:
  """Immutable set of tools and alias backends; build with `Catalog.load(path)` / `Catalog.from_dict`."""

  def __init__(self, tools: Iterable[ToolSpec], backends: Mapping[str, Backend], *,
               require_document_before_answer: bool = False, show_model_names: bool = False,
               orchestrator_model: str = "Qwen/Qwen3-8B", orchestrator_price_in: float = 0.2,
               orchestrator_price_out: float = 0.2, code_execution_usd_per_s: float = 8.3e-6,
               source: str = "<catalog>"):
    self._tools = {t.name: t for t in tools}
    self._backends = dict(backends)
    self.require_document_before_answer = bool(require_document_before_answer)
    self.show_model_names = bool(show_model_names)
    self.orchestrator_model = orchestrator_model
    self.orchestrator_price_in = float(orchestrator_price_in)
    self.orchestrator_price_out = float(orchestrator_price_out)
    self.code_execution_usd_per_s = float(code_execution_usd_per_s)
    self.source = source
    for tool in self._tools.values():
      for alias in tool.aliases:
        if alias not in self._backends:
          raise CatalogError(f"{source}: tools.{tool.name}.aliases names {alias!r}, which is not in aliases "
                             f"(known: {', '.join(sorted(self._backends))})")

  # --- loading ----------------------------------------------------------------------------------
  @classmethod
  def load(cls, path: str | os.PathLike) -> "Catalog":
    """Read a JSON catalog config; errors name the file, the line (bad JSON) or the field."""
    path = Path(path)
    try:
      text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
      raise CatalogError(f"tool catalog not found: {path}") from None
    except OSError as e:
      raise CatalogError(f"cannot read tool catalog {path}: {e.strerror or e}") from None
    try:
      data = json.loads(text)
    except json.JSONDecodeError as e:
      raise CatalogError(f"{path}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    return cls.from_dict(data, source=str(path))

  @classmethod
  def default(cls) -> "Catalog":
    """The reference catalog of docs/design.md section 4 (configs/tools/default_catalog.json)."""
    return cls.load(default_catalog_path())

  @classmethod
  def from_dict(cls, data: Any, source: str = "<dict>") -> "Catalog":
    if not isinstance(data, dict):
      raise CatalogError(f"{source}: the catalog must be a JSON object, got {type(data).__name__}")
    known = {"require_document_before_answer", "show_model_names", "orchestrator", "code_execution_usd_per_s",
             "tools", "aliases"}
    _no_unknown(data, known, source, "")
    for key in ("tools", "aliases"):
      if key not in data:
        raise CatalogError(f"{source}: missing field '{key}'")
    if not isinstance(data["aliases"], dict) or not data["aliases"]:
      raise CatalogError(f"{source}: 'aliases' must be a non-empty object of alias -> backend")
    backends = {alias: _backend(alias, spec, source) for alias, spec in data["aliases"].items()}
    if not isinstance(data["tools"], list) or not data["tools"]:
      raise CatalogError(f"{source}: 'tools' must be a non-empty list of tool objects")
    tools = [_tool(i, spec, source) for i, spec in enumerate(data["tools"])]
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
      raise CatalogError(f"{source}: tool names must be unique, got {names}")
    orch = data.get("orchestrator", {})
    if not isinstance(orch, dict):
      raise CatalogError(f"{source}: 'orchestrator' must be an object")
    _no_unknown(orch, {"model", "price_in", "price_out"}, source, "orchestrator.")
    return cls(
        tools, backends,
        require_document_before_answer=_bool(data, "require_document_before_answer", False, source, ""),
        show_model_names=_bool(data, "show_model_names", False, source, ""),
        orchestrator_model=_str(orch, "model", source, "orchestrator.", default="Qwen/Qwen3-8B"),
        orchestrator_price_in=_number(orch, "price_in", source, "orchestrator.", default=0.2),
        orchestrator_price_out=_number(orch, "price_out", source, "orchestrator.", default=0.2),
        code_execution_usd_per_s=_number(data, "code_execution_usd_per_s", source, "", default=8.3e-6),
        source=source)

  def to_dict(self) -> dict[str, Any]:
    """The config form (round-trips through `from_dict`)."""
    return {
        "require_document_before_answer": self.require_document_before_answer,
        "show_model_names": self.show_model_names,
        "orchestrator": {"model": self.orchestrator_model, "price_in": self.orchestrator_price_in,
                         "price_out": self.orchestrator_price_out},
        "code_execution_usd_per_s": self.code_execution_usd_per_s,
        "tools": [t.to_dict() for t in self._tools.values()],
        "aliases": {a: b.to_dict() for a, b in self._backends.items()},
    }

  def save(self, path: str | os.PathLike) -> None:
    Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")

  # --- lookup -----------------------------------------------------------------------------------
  @property
  def tools(self) -> dict[str, ToolSpec]:
    return dict(self._tools)

  @property
  def backends(self) -> dict[str, Backend]:
    return dict(self._backends)

  @property
  def aliases(self) -> tuple[str, ...]:
    return tuple(self._backends)

  def backend(self, alias: str) -> Backend:
    try:
      return self._backends[alias]
    except (KeyError, TypeError):
      raise UnknownAliasError(f"unknown tool alias {alias!r} in {self.source}; "
                              f"known: {', '.join(sorted(self._backends))}") from None

  def tool(self, name: str) -> ToolSpec:
    try:
      return self._tools[name]
    except (KeyError, TypeError):
      raise UnknownAliasError(f"unknown tool {name!r} in {self.source}; known: {', '.join(self._tools)}") from None

  def __contains__(self, alias: object) -> bool:
    return alias in self._backends

  def __repr__(self) -> str:
    return f"Catalog({self.source}: tools={list(self._tools)}, aliases={len(self._backends)})"

  # --- what the orchestrator sees ---------------------------------------------------------------
  def alias_text(self, alias: str) -> str:
    """One alias as the orchestrator reads it: name, optional model/capabilities, price, latency."""
    b = self.backend(alias)
    head = f"{alias} ({b.model})" if self.show_model_names else alias
    text = (f"{head}: {_fmt_price(b.price_in)} per million input tokens, {_fmt_price(b.price_out)} per million "
            f"output tokens, typical latency {b.latency_s:g} s")
    if b.description:
      text += f"; {b.description.strip().rstrip('.')}"
    return text + "."

  def tool_schema(self, name: str) -> dict[str, Any]:
    """OpenAI function-tool schema of one tool; its argument is an enum of the tool's aliases."""
    t = self.tool(name)
    description = t.description.strip()
    if name == "answer" and self.require_document_before_answer:
      description = f"{description} {_ANSWER_GATE_TEXT}"
    arg_text = f"{t.argument_description.strip()} Choices: " + " ".join(self.alias_text(a) for a in t.aliases)
    return {
        "type": "function",
        "function": {
            "name": t.name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {t.argument: {"type": "string", "enum": list(t.aliases), "description": arg_text}},
                "required": [t.argument],
            },
        },
    }

  def tool_schemas(self, names: Iterable[str] | None = QA_TOOLS) -> list[dict[str, Any]]:
    """Schemas for `names` in that order (default: the three QA tools; None: every tool)."""
    names = list(self._tools) if names is None else list(names)
    return [self.tool_schema(n) for n in names]

  # --- the orchestrator's calls -----------------------------------------------------------------
  def parse_call(self, name: str, arguments: Mapping[str, Any] | str | None, *,
                 documents_seen: bool = True, allowed_tools: Iterable[str] | None = None) -> ResolvedCall:
    """Check one tool call of the orchestrator; raise InvalidToolCall with a message for the model.

    `arguments` may be the parsed object or its JSON text. `documents_seen`: whether any search has
    returned documents yet (matters when `require_document_before_answer`). `allowed_tools`: the tools
    offered this turn (None: all of the catalog's).
    """
    allowed = list(self._tools) if allowed_tools is None else list(allowed_tools)
    if name not in self._tools or name not in allowed:
      raise InvalidToolCall(f"unknown tool {name!r}; available: {', '.join(allowed)}")
    tool = self._tools[name]
    if isinstance(arguments, str):
      try:
        arguments = json.loads(arguments) if arguments.strip() else {}
      except json.JSONDecodeError as e:
        raise InvalidToolCall(f"arguments of {name} are not valid JSON: {e.msg}") from None
    if arguments is None:
      arguments = {}
    if not isinstance(arguments, Mapping):
      raise InvalidToolCall(f"arguments of {name} must be a JSON object, got {type(arguments).__name__}")
    if tool.argument not in arguments:
      raise InvalidToolCall(f"{name} requires the argument {tool.argument!r} (one of {', '.join(tool.aliases)})")
    alias = arguments[tool.argument]
    if not isinstance(alias, str) or alias not in tool.aliases:
      raise InvalidToolCall(f"{name}: {tool.argument}={alias!r} is not one of {', '.join(tool.aliases)}")
    if name == "answer" and self.require_document_before_answer and not documents_seen:
      raise InvalidToolCall(f"answer is not allowed yet: {_ANSWER_GATE_TEXT.lower()}")
    return ResolvedCall(tool=tool, alias=alias, backend=self._backends[alias])

  # --- per-sample remapping ---------------------------------------------------------------------
  def remap(self, mapping: Mapping[str, Mapping[str, Any]]) -> "Catalog":
    """A new catalog with some aliases pointing at other models / prices / latencies.

    `mapping`: {alias: {model?, price_in?, price_out?, latency_s? (or latency), base_url?, api_key_env?,
    description?}}; fields left out keep their current value; a bare string is shorthand for {model: it}.
    Unknown aliases and fields are errors.
    """
    if not isinstance(mapping, Mapping):
      raise CatalogError(f"remap expects an object of alias -> fields, got {type(mapping).__name__}")
    backends = dict(self._backends)
    for alias, fields in mapping.items():
      if alias not in backends:
        raise UnknownAliasError(f"remap: unknown tool alias {alias!r}; known: {', '.join(sorted(backends))}")
      if isinstance(fields, str):
        fields = {"model": fields}
      if not isinstance(fields, Mapping):
        raise CatalogError(f"remap.{alias} must be an object of fields, got {type(fields).__name__}")
      fields = dict(fields)
      if "latency" in fields:
        if "latency_s" in fields:
          raise CatalogError(f"remap.{alias}: give latency_s or latency, not both")
        fields["latency_s"] = fields.pop("latency")
      merged = backends[alias].to_dict()
      unknown = sorted(set(fields) - set(merged))
      if unknown:
        raise CatalogError(f"remap.{alias}: unknown field {unknown[0]!r}; allowed: {', '.join(sorted(merged))}")
      merged.update(fields)
      backends[alias] = _backend(alias, merged, "remap")
    return self._derive(self._tools.values(), backends)

  # --- per-sample offering ----------------------------------------------------------------------
  def offer(self, aliases: Iterable[str]) -> "Catalog":
    """A new catalog with only `aliases` offered (a sample's `tools` field, see data/format.py).

    Each tool's alias enum keeps the offered aliases in catalog order; a tool left without any is dropped
    (neither shown nor callable); backends of aliases not offered are dropped too, so `alias in catalog`,
    `backend()` and `parse_call` all agree on what exists. Every name must be an alias of this catalog
    (UnknownAliasError lists the others): a sample's domain tool names are the caller's to filter out first,
    since only the environment knows which names are legitimately not aliases. An empty list offers nothing;
    "empty means everything" is the caller's rule (it simply does not call `offer`).

    Apply `remap` first, then `offer`: a remap may name any alias of the full catalog, and a remapped
    backend stays attached to its alias through the restriction (offering never changes a backend).
    """
    if isinstance(aliases, (str, bytes)) or not isinstance(aliases, Iterable):
      raise CatalogError(f"offer expects a list of alias names, got {type(aliases).__name__}")
    wanted = list(aliases)
    unknown = [a for a in wanted if not isinstance(a, str) or a not in self._backends]
    if unknown:
      raise UnknownAliasError(f"offer: unknown tool alias(es) {', '.join(map(repr, unknown))} in {self.source}; "
                              f"known: {', '.join(sorted(self._backends))}")
    keep = set(wanted)
    tools = [dataclasses.replace(t, aliases=tuple(a for a in t.aliases if a in keep)) for t in self._tools.values()]
    backends = {a: b for a, b in self._backends.items() if a in keep}  # catalog order, not the list's
    return self._derive([t for t in tools if t.aliases], backends)

  def _derive(self, tools: Iterable[ToolSpec], backends: Mapping[str, Backend]) -> "Catalog":
    """A catalog with other tools / backends and this one's options (prices of the orchestrator, code, ...)."""
    return Catalog(tools, backends, require_document_before_answer=self.require_document_before_answer,
                   show_model_names=self.show_model_names, orchestrator_model=self.orchestrator_model,
                   orchestrator_price_in=self.orchestrator_price_in, orchestrator_price_out=self.orchestrator_price_out,
                   code_execution_usd_per_s=self.code_execution_usd_per_s, source=self.source)

  def with_options(self, **changes: Any) -> "Catalog":
    """A copy with catalog-level options changed (e.g. `require_document_before_answer=True`)."""
    data = copy.deepcopy(self.to_dict())
    for key, value in changes.items():
      if key not in data or key in ("tools", "aliases"):
        raise CatalogError(f"with_options: unknown option {key!r}")
      data[key] = value
    return Catalog.from_dict(data, source=self.source)


# --- field validation -----------------------------------------------------------------------------
def _no_unknown(obj: Mapping[str, Any], known: set[str], source: str, where: str) -> None:
  unknown = sorted(set(obj) - known)
  if unknown:
    raise CatalogError(f"{source}: unknown field '{where}{unknown[0]}'; allowed: {', '.join(sorted(known))}")


def _number(obj: Mapping[str, Any], key: str, source: str, where: str, default: float | None = None) -> float:
  if key not in obj:
    if default is None:
      raise CatalogError(f"{source}: missing field '{where}{key}'")
    return float(default)
  value = obj[key]
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or value == float("inf"):
    raise CatalogError(f"{source}: '{where}{key}' must be a non-negative number, got {value!r}")
  return float(value)


def _str(obj: Mapping[str, Any], key: str, source: str, where: str, default: str | None = None,
         allow_empty: bool = False) -> str:
  if key not in obj:
    if default is None:
      raise CatalogError(f"{source}: missing field '{where}{key}'")
    return default
  value = obj[key]
  if not isinstance(value, str) or (not allow_empty and not value.strip()):
    raise CatalogError(f"{source}: '{where}{key}' must be a non-empty string, got {value!r}")
  return value


def _bool(obj: Mapping[str, Any], key: str, default: bool, source: str, where: str) -> bool:
  value = obj.get(key, default)
  if not isinstance(value, bool):
    raise CatalogError(f"{source}: '{where}{key}' must be true or false, got {value!r}")
  return value


def _backend(alias: Any, spec: Any, source: str) -> Backend:
  if not isinstance(alias, str) or not _ALIAS.match(alias):
    raise CatalogError(f"{source}: alias names must be non-empty strings of letters, digits, '-', '_', got {alias!r}")
  where = f"aliases.{alias}."
  if not isinstance(spec, Mapping):
    raise CatalogError(f"{source}: '{where[:-1]}' must be an object, got {type(spec).__name__}")
  _no_unknown(spec, {"model", "base_url", "api_key_env", "price_in", "price_out", "latency_s", "description"},
              source, where)
  base_url = _str(spec, "base_url", source, where)
  if not base_url.startswith(("http://", "https://")):
    raise CatalogError(f"{source}: '{where}base_url' must start with http:// or https://, got {base_url!r}")
  if "api_key_env" not in spec:
    raise CatalogError(f"{source}: missing field '{where}api_key_env' (an environment variable name, or null)")
  key_env = spec["api_key_env"]
  if key_env is not None and (not isinstance(key_env, str) or not _ENV_NAME.match(key_env)):
    raise CatalogError(f"{source}: '{where}api_key_env' must be the NAME of an environment variable "
                       f"(letters, digits, '_'), never the key itself, or null")
  return Backend(alias=alias, model=_str(spec, "model", source, where), base_url=base_url.rstrip("/"),
                 api_key_env=key_env, price_in=_number(spec, "price_in", source, where),
                 price_out=_number(spec, "price_out", source, where),
                 latency_s=_number(spec, "latency_s", source, where),
                 description=_str(spec, "description", source, where, default="", allow_empty=True))


def _tool(index: int, spec: Any, source: str) -> ToolSpec:
  where = f"tools[{index}]."
  if not isinstance(spec, Mapping):
    raise CatalogError(f"{source}: '{where[:-1]}' must be an object, got {type(spec).__name__}")
  _no_unknown(spec, {"name", "description", "argument", "argument_description", "aliases"}, source, where)
  name = _str(spec, "name", source, where)
  if not _IDENT.match(name):
    raise CatalogError(f"{source}: '{where}name' must be an identifier, got {name!r}")
  where = f"tools.{name}."
  argument = _str(spec, "argument", source, where, default="model")
  if not _IDENT.match(argument):
    raise CatalogError(f"{source}: '{where}argument' must be an identifier, got {argument!r}")
  aliases = spec.get("aliases")
  if aliases is None:
    raise CatalogError(f"{source}: missing field '{where}aliases'")
  if not isinstance(aliases, list) or not aliases or not all(isinstance(a, str) for a in aliases):
    raise CatalogError(f"{source}: '{where}aliases' must be a non-empty list of alias names")
  if len(set(aliases)) != len(aliases):
    raise CatalogError(f"{source}: '{where}aliases' lists an alias twice: {aliases}")
  return ToolSpec(name=name, description=_str(spec, "description", source, where), argument=argument,
                  argument_description=_str(spec, "argument_description", source, where,
                                            default=f"The {argument} to use."),
                  aliases=tuple(aliases))
