"""A miniature of the paper's claim: a synthetic task family and three tools of different price and accuracy.

The CPU demo trains a tiny random Qwen3 to route questions to priced models. Everything here is real except
the models themselves: the three aliases are served by a local `ScriptedServer` (OpenAI-compatible HTTP on
127.0.0.1, called through `ChatClient`), and `calc`'s code runs in the real sandbox (`run_python`).

Tasks (`make_tasks`), one kind per question template, recognisable from the first few tokens:

* `arithmetic`  "Compute 37 + 48."                     -> "85"    (small ints, + and *)
* `capital`     "What is the capital of France?"       -> "Paris" (32 countries)
* `element`     "What is the atomic number of Neon?"   -> "10"    (elements 1-30)

Tool: ONE orchestrator-facing function `answer(model)`; `model` is an enum of three aliases. Calling it ends the
episode (`ToolResult(done=True, final_answer=...)`):

| alias  | served as   | $/M in | $/M out | tokens in/out | latency s | USD per call | right on                 |
|--------|-------------|--------|---------|---------------|-----------|--------------|--------------------------|
| calc   | demo-coder  | 0.1    | 0.1     | 80 / 20       | 2         | 1.83e-5 (*)  | arithmetic               |
| small  | demo-small  | 0.25   | 2       | 80 / 20       | 5         | 6.0e-5       | arithmetic, capital      |
| expert | demo-expert | 1.25   | 10      | 80 / 250      | 30        | 2.6e-3       | everything               |

(*) calc = a cheap coder LLM that writes `print(<expr>)` for arithmetic questions and `print("unknown")`
otherwise; the code runs in the sandbox and its stdout is the answer. Its cost is the LLM's tokens at its price
plus `CALC_EXEC_S` (1 s) of code execution at 8.3e-6 $/s (docs/design.md section 4).

Determinism. Rewards are normalised over a group of rollouts (min/max), so tiny run-to-run differences in
cost or latency would be blown up to the full feature range. Hence every record of one alias carries the same
numbers: token counts are scripted, code execution is charged at the nominal `CALC_EXEC_S` rather than the
measured sandbox time, and `ToolCallRecord.latency_s` is the alias's CATALOG (typical) latency, not the
measured wall time. The measured times are kept in `DemoEpisode.timings` and `DemoWorld.call_log`
(`wall_s`: the whole call; `sandbox_wall_s`: the code run). Real server delays are tiny (0-5 ms).

Errors never raise from `DemoEpisode.call`: an unknown tool, a missing / non-string / unknown alias, extra
arguments, a failing endpoint or sandbox each give a `ToolResult` whose content starts with "Error:", with
`done=False` and a record whose `error` is set (zero cost for invalid calls).

Preferences: the system message states the preference in words (`task["preference_text"]`); the vector in
the reward's order [tool counts..., outcome, -cost, -latency] is `preference_vector(task, aliases)`. Presets
(`PRESETS`): `cheap` = {outcome 1, -cost 1} "Prefer cheap tools."; `expert` = {outcome 1, expert 1} "Prefer the
expert.". Under `cheap` the best route is calc for arithmetic, small for capitals, expert for elements; under
`expert` it is always expert.

Usage:

    with DemoWorld() as world:
      env = world.env()                       # a ToolEnvironment for the agent loop
      tasks = make_tasks(64, seed=0)
      ... rollouts ...; world.grade(task, trajectory.final_answer)
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from orchestra_jax.data.preferences import preference_text
from orchestra_jax.grading import grade
from orchestra_jax.reward.features import NEG_COST, NEG_LATENCY, OUTCOME
from orchestra_jax.reward.features import preference_vector as _vector
from orchestra_jax.rollout.chat_format import ToolCall, encode_prompt
from orchestra_jax.rollout.environment import Episode, ToolEnvironment, ToolResult
from orchestra_jax.rollout.trajectory import ToolCallRecord
from orchestra_jax.tools.llm_client import ChatClient
from orchestra_jax.tools.sandbox import CODE_EXEC_USD_PER_S, SandboxConfig, run_python
from orchestra_jax.tools.scripted_server import Reply, ScriptedServer, last_user_message

__all__ = ["KINDS", "ALIASES", "TOOL_NAME", "AliasSpec", "CATALOG", "CALC_EXEC_S", "CAPITALS", "ELEMENTS",
           "PRESETS", "PRESET_TEXT", "make_tasks", "solve", "build_messages", "tool_schemas", "tool_description",
           "assistant_text", "preference_vector", "sft_examples", "DemoWorld", "DemoEnvironment",
           "DemoEpisode"]

KINDS = ("arithmetic", "capital", "element")
ALIASES = ("calc", "small", "expert")
TOOL_NAME = "answer"
CALC_EXEC_S = 1.0  # nominal seconds of code execution charged per calc call (the measured time is logged)
ERROR_LATENCY_S = 1e-3  # nominal latency of a rejected call (nonzero: the agent loop replaces 0 by wall time)


# --- the tool catalog ----------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class AliasSpec:
  """One alias: the scripted model behind it, its prices ($/M tokens), catalog latency and scripted usage."""

  alias: str
  model: str  # model name on the scripted server
  price_in: float
  price_out: float
  latency_s: float  # catalog (typical) latency: what every record reports
  tokens_in: int  # scripted prompt tokens per call
  tokens_out: int  # scripted completion tokens per call
  exec_s: float = 0.0  # nominal code-execution seconds charged per call
  delay_s: float = 0.0  # real server delay (kept tiny so the demo is fast)

  @property
  def cost_usd(self) -> float:
    """USD of one call: tokens at the alias's prices plus nominal code execution."""
    return ((self.price_in * self.tokens_in + self.price_out * self.tokens_out) / 1e6
            + self.exec_s * CODE_EXEC_USD_PER_S)


CATALOG: dict[str, AliasSpec] = {
    "calc": AliasSpec("calc", "demo-coder", 0.1, 0.1, 2.0, 80, 20, exec_s=CALC_EXEC_S, delay_s=0.0),
    "small": AliasSpec("small", "demo-small", 0.25, 2.0, 5.0, 80, 20, delay_s=0.001),
    "expert": AliasSpec("expert", "demo-expert", 1.25, 10.0, 30.0, 80, 250, delay_s=0.005),
}


def tool_description(catalog: Mapping[str, AliasSpec] = CATALOG) -> str:
  """The `answer` tool's description: each alias's price and latency (as the reference shows them)."""
  parts = [f"{s.alias}: {s.price_in:g}/{s.price_out:g}, {s.latency_s:g} s" for s in catalog.values()]
  return "Answer with a model; ends the task. Price in $ per 1M tokens in/out, latency: " + "; ".join(parts) + "."


def tool_schemas(catalog: Mapping[str, AliasSpec] = CATALOG) -> list[dict[str, Any]]:
  """The one OpenAI-style function schema the orchestrator sees: `answer(model)` with an alias enum."""
  return [{"type": "function", "function": {
      "name": TOOL_NAME, "description": tool_description(catalog),
      "parameters": {"type": "object",
                     "properties": {"model": {"type": "string", "enum": list(catalog)}},
                     "required": ["model"]}}}]


def assistant_text(alias: str) -> str:
  """The assistant turn that calls `answer` with `alias`, exactly as the orchestrator should write it."""
  call = json.dumps({"name": TOOL_NAME, "arguments": {"model": alias}})
  return f"<tool_call>\n{call}\n</tool_call>"


# --- knowledge ------------------------------------------------------------------------------------------------
CAPITALS: dict[str, str] = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid", "Japan": "Tokyo",
    "Egypt": "Cairo", "Kenya": "Nairobi", "Peru": "Lima", "Chile": "Santiago", "Canada": "Ottawa",
    "Australia": "Canberra", "Brazil": "Brasilia", "Russia": "Moscow", "China": "Beijing", "India": "New Delhi",
    "Norway": "Oslo", "Sweden": "Stockholm", "Finland": "Helsinki", "Poland": "Warsaw", "Greece": "Athens",
    "Turkey": "Ankara", "Iran": "Tehran", "Iraq": "Baghdad", "Thailand": "Bangkok", "Vietnam": "Hanoi",
    "Mexico": "Mexico City", "Argentina": "Buenos Aires", "Portugal": "Lisbon", "Ireland": "Dublin",
    "Austria": "Vienna", "Hungary": "Budapest", "Cuba": "Havana",
}
ELEMENTS: dict[str, int] = {
    name: i + 1 for i, name in enumerate((
        "Hydrogen", "Helium", "Lithium", "Beryllium", "Boron", "Carbon", "Nitrogen", "Oxygen", "Fluorine", "Neon",
        "Sodium", "Magnesium", "Aluminium", "Silicon", "Phosphorus", "Sulfur", "Chlorine", "Argon", "Potassium",
        "Calcium", "Scandium", "Titanium", "Vanadium", "Chromium", "Manganese", "Iron", "Cobalt", "Nickel",
        "Copper", "Zinc"))
}

_ARITH_RE = re.compile(r"Compute (\d+) ([+*]) (\d+)\.")
_CAPITAL_RE = re.compile(r"What is the capital of (.+?)\?")
_ELEMENT_RE = re.compile(r"What is the atomic number of (.+?)\?")


def solve(question: str) -> tuple[str, str] | None:
  """(kind, correct answer) of a question made by `make_tasks`; None for anything else."""
  m = _ARITH_RE.search(question)
  if m:
    a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
    return "arithmetic", str(a + b if op == "+" else a * b)
  m = _CAPITAL_RE.search(question)
  if m and m.group(1) in CAPITALS:
    return "capital", CAPITALS[m.group(1)]
  m = _ELEMENT_RE.search(question)
  if m and m.group(1) in ELEMENTS:
    return "element", str(ELEMENTS[m.group(1)])
  return None


# --- tasks and preferences -------------------------------------------------------------------------------------
PRESETS: dict[str, dict[str, float]] = {
    "cheap": {"outcome": 1.0, "-cost": 1.0},
    "expert": {"outcome": 1.0, "expert": 1.0},
}
PRESET_TEXT: dict[str, str] = {"cheap": "Prefer cheap tools.", "expert": "Prefer the expert."}


def _question(kind: str, rng: random.Random) -> tuple[str, str]:
  if kind == "arithmetic":
    if rng.random() < 0.5:
      a, b = rng.randint(2, 99), rng.randint(2, 99)
      return f"Compute {a} + {b}.", str(a + b)
    a, b = rng.randint(2, 19), rng.randint(2, 9)
    return f"Compute {a} * {b}.", str(a * b)
  if kind == "capital":
    country = rng.choice(sorted(CAPITALS))
    return f"What is the capital of {country}?", CAPITALS[country]
  element = rng.choice(sorted(ELEMENTS))
  return f"What is the atomic number of {element}?", str(ELEMENTS[element])


def _resolve_preference(preference, rng: random.Random) -> tuple[str | None, dict[str, float], str]:
  """(preset name or None, weights, text) for one task."""
  if preference is None:
    preference = sorted(PRESETS)
  if isinstance(preference, str):
    if preference not in PRESETS:
      raise ValueError(f"unknown preference preset {preference!r}; choose from {sorted(PRESETS)}")
    return preference, dict(PRESETS[preference]), PRESET_TEXT[preference]
  if isinstance(preference, Mapping):
    weights = {str(k): float(v) for k, v in preference.items()}
    return None, weights, preference_text(weights)
  names = list(preference)
  if not names:
    raise ValueError("preference: an empty list of presets")
  return _resolve_preference(rng.choice(names), rng)


def make_tasks(n: int, seed: int, kinds: Sequence[str] | None = None, preference=None) -> list[dict[str, Any]]:
  """`n` tasks, deterministic by `seed`. Kinds are balanced (cycled, then shuffled).

  `preference`: None draws one of the presets per task at random; a preset name ("cheap", "expert") or a list
  of names (drawn per task) picks presets; a dict of feature weights ({"outcome": 1, "-cost": 0.5, ...}) is
  used as is, with its text from `orchestra_jax.data.preferences.preference_text`.
  Each task: {"id", "kind", "question", "answer", "preference", "preference_name", "preference_text"}.
  """
  kinds = list(KINDS if kinds is None else kinds)
  unknown = sorted(set(kinds) - set(KINDS))
  if unknown or not kinds:
    raise ValueError(f"kinds must be a non-empty subset of {list(KINDS)}, got {kinds}")
  if n < 0:
    raise ValueError(f"n must be >= 0, got {n}")
  rng = random.Random(f"orchestra-demo/tasks/{int(seed)}")
  order = [kinds[i % len(kinds)] for i in range(n)]
  rng.shuffle(order)
  tasks = []
  for i, kind in enumerate(order):
    question, answer = _question(kind, rng)
    name, weights, text = _resolve_preference(preference, rng)
    tasks.append({"id": f"demo-{int(seed)}-{i}", "kind": kind, "question": question, "answer": answer,
                  "preference": weights, "preference_name": name, "preference_text": text})
  return tasks


def preference_vector(task: Mapping[str, Any], aliases: Sequence[str] = ALIASES):
  """P [len(aliases) + 3] float32 in the reward's order [tool counts..., outcome, -cost, -latency]
  (= orchestra_jax.reward.features.preference_vector). Raises ValueError for weights on unknown features."""
  weights = dict(task["preference"])
  tools = {k: v for k, v in weights.items() if k not in (OUTCOME, NEG_COST, NEG_LATENCY)}
  return _vector(list(aliases), outcome=weights.get(OUTCOME, 0.0), cost=weights.get(NEG_COST, 0.0),
                 latency=weights.get(NEG_LATENCY, 0.0), tools=tools)


def build_messages(task: Mapping[str, Any]) -> list[dict[str, str]]:
  """The opening prompt: a short system message with the preference, then the question."""
  system = ("Pick a model. " + str(task.get("preference_text") or "")).strip()
  return [{"role": "system", "content": system}, {"role": "user", "content": task["question"]}]


# --- warm-up data -----------------------------------------------------------------------------------------------
def sft_examples(tokenizer, tasks: Sequence[Mapping[str, Any]], seed: int,
                 aliases: Sequence[str] = ALIASES) -> list[tuple[list[int], list[int]]]:
  """(tokens, loss mask) per task: the rollout prompt followed by a call of a random alias (seeded).

  Prompt = `encode_prompt(tokenizer, messages, tools, add_generation_prompt=True)` exactly as the agent loop
  renders it; the assistant turn is `assistant_text(alias)` (ending at `</tool_call>`, where sampling stops),
  encoded with `tokenizer.encode`. The mask is 1 on the assistant tokens only.
  """
  rng = random.Random(f"orchestra-demo/sft/{int(seed)}")
  tools = tool_schemas()
  responses: dict[str, list[int]] = {}
  out = []
  for task in tasks:
    alias = rng.choice(list(aliases))
    if alias not in responses:
      responses[alias] = [int(i) for i in tokenizer.encode(assistant_text(alias), add_special_tokens=False)]
    prompt = encode_prompt(tokenizer, build_messages(task), tools, add_generation_prompt=True)
    resp = responses[alias]
    out.append((prompt + resp, [0] * len(prompt) + [1] * len(resp)))
  return out


# --- the scripted models ------------------------------------------------------------------------------------------
def _reply(spec: AliasSpec, text: str) -> Reply:
  return Reply(text=text, prompt_tokens=spec.tokens_in, completion_tokens=spec.tokens_out, delay_s=spec.delay_s)


def _coder(messages, body) -> Reply:
  """Writes `print(<expr>)` for arithmetic, `print("unknown")` for anything else."""
  m = _ARITH_RE.search(last_user_message(messages))
  code = f"print({m.group(1)} {m.group(2)} {m.group(3)})" if m else 'print("unknown")'
  return _reply(CATALOG["calc"], f"```python\n{code}\n```")


def _small(messages, body) -> Reply:
  """Right on arithmetic and capitals; on elements it answers the next element's number (wrong)."""
  solved = solve(last_user_message(messages))
  if solved is None:
    text = "I don't know."
  elif solved[0] == "element":
    text = str(int(solved[1]) + 1)
  else:
    text = solved[1]
  return _reply(CATALOG["small"], text)


def _expert(messages, body) -> Reply:
  """Always right."""
  solved = solve(last_user_message(messages))
  return _reply(CATALOG["expert"], solved[1] if solved else "I don't know.")


_SCRIPTS = {"calc": _coder, "small": _small, "expert": _expert}
_ANSWER_SYSTEM = "Reply with only the final answer."
_CODE_SYSTEM = "Write Python code that prints the answer."
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


def _extract_code(text: str) -> str:
  blocks = _FENCE.findall(text)
  return blocks[-1].strip("\n") if blocks else text.strip()


# --- the environment ----------------------------------------------------------------------------------------------
class DemoEpisode(Episode):
  """One rollout of one task. `timings` holds the measured wall times of its calls."""

  def __init__(self, world: "DemoWorld", task: Mapping[str, Any], rollout_id: str):
    self._world, self.task, self.rollout_id = world, dict(task), rollout_id
    self.timings: list[dict[str, Any]] = []

  def messages(self):
    return build_messages(self.task)

  def tools(self):
    return tool_schemas(self._world.catalog)

  def _error(self, call: ToolCall, message: str, alias: str | None = None, model: str | None = None,
             cost: float = 0.0, latency: float = ERROR_LATENCY_S, tokens: tuple[int, int] = (0, 0)) -> ToolResult:
    content = "Error: " + message
    record = ToolCallRecord(name=call.name, arguments=dict(call.arguments) if isinstance(call.arguments, dict) else {},
                            alias=alias, model=model, result=content, error=message, cost_usd=cost,
                            latency_s=latency, tokens_in=tokens[0], tokens_out=tokens[1])
    return ToolResult(content=content, done=False, record=record)

  def call(self, call: ToolCall) -> ToolResult:
    start = time.perf_counter()
    catalog = self._world.catalog
    choices = ", ".join(catalog)
    if call.name != TOOL_NAME:
      return self._error(call, f"unknown tool {call.name!r}; the only tool is {TOOL_NAME}(model).")
    args = call.arguments if isinstance(call.arguments, dict) else {}
    extra = sorted(set(args) - {"model"})
    if "model" not in args:
      return self._error(call, f"{TOOL_NAME} needs the argument 'model', one of: {choices}.")
    alias = args["model"]
    if not isinstance(alias, str):
      return self._error(call, f"'model' must be a string, one of: {choices}; got {alias!r}.")
    if extra:
      return self._error(call, f"{TOOL_NAME} takes only 'model'; unexpected {', '.join(map(repr, extra))}.")
    spec = catalog.get(alias)
    if spec is None:
      return self._error(call, f"unknown model {alias!r}; choose one of: {choices}.")

    client = self._world.clients[alias]
    system = _CODE_SYSTEM if alias == "calc" else _ANSWER_SYSTEM
    res = client.chat([{"role": "system", "content": system}, {"role": "user", "content": self.task["question"]}])
    cost, tokens = res.cost_usd, (res.prompt_tokens, res.completion_tokens)
    timing = {"alias": alias, "llm_latency_s": res.latency_s, "sandbox_wall_s": None}
    if not res.ok:
      return self._finish(call, start, timing,
                          self._error(call, f"{alias} failed: {res.error}", alias, spec.model, cost, spec.latency_s,
                                      tokens))
    answer = res.text.strip()
    if spec.exec_s:
      cost += spec.exec_s * CODE_EXEC_USD_PER_S
      try:
        run = run_python(_extract_code(res.text), self._world.sandbox_config)
      except Exception as e:  # the sandbox machinery failed: the model's feedback, never a crash
        return self._finish(call, start, timing,
                            self._error(call, f"{alias}: code execution failed ({type(e).__name__}: {e})", alias,
                                        spec.model, cost, spec.latency_s, tokens))
      timing["sandbox_wall_s"] = run.wall_s
      if not run.ok:
        return self._finish(call, start, timing,
                            self._error(call, f"{alias}: code failed: {run.error}", alias, spec.model, cost,
                                        spec.latency_s, tokens))
      answer = run.stdout.strip()
    record = ToolCallRecord(name=TOOL_NAME, arguments=dict(args), alias=alias, model=spec.model, result=answer,
                            cost_usd=cost, latency_s=spec.latency_s, tokens_in=tokens[0], tokens_out=tokens[1])
    return self._finish(call, start, timing, ToolResult(content=answer, done=True, final_answer=answer,
                                                        record=record))

  def _finish(self, call: ToolCall, start: float, timing: dict[str, Any], result: ToolResult) -> ToolResult:
    rec = result.record
    timing.update(wall_s=time.perf_counter() - start, ok=rec.error is None, cost_usd=rec.cost_usd,
                  latency_s=rec.latency_s, task_id=self.task.get("id"), rollout_id=self.rollout_id)
    self.timings.append(timing)
    self._world._log(timing)
    return result


class DemoEnvironment(ToolEnvironment):
  """The `ToolEnvironment` of a `DemoWorld`: one `DemoEpisode` per rollout."""

  def __init__(self, world: "DemoWorld"):
    self.world = world

  def new_episode(self, task, rollout_id):
    if "question" not in task:
      raise ValueError(f"demo task {task.get('id')!r} has no 'question'")
    return DemoEpisode(self.world, task, rollout_id)


class DemoWorld:
  """The scripted models on 127.0.0.1 plus the sandbox; `with DemoWorld() as world: env = world.env()`.

  `seed` is the default seed of `world.make_tasks` / `world.sft_examples`. `sandbox_config` limits the calc
  code runs (default: 10 s, 1 GiB). `call_log` collects every call's measured timings (thread-safe).
  """

  def __init__(self, seed: int = 0, sandbox_config: SandboxConfig | None = None, verbose: bool = False):
    self.seed = int(seed)
    self.catalog: dict[str, AliasSpec] = dict(CATALOG)
    self.sandbox_config = sandbox_config or SandboxConfig(timeout_s=10.0, cpu_s=5, memory_bytes=1 << 30)
    self.call_log: list[dict[str, Any]] = []
    self._lock = threading.Lock()
    self.server = ScriptedServer({spec.model: _SCRIPTS[a] for a, spec in self.catalog.items()}, verbose=verbose)
    self.clients: dict[str, ChatClient] = {}
    self._started = False

  # --- lifecycle -----------------------------------------------------------------------------------------------
  def start(self) -> "DemoWorld":
    if not self._started:
      self.server.start()
      self.clients = {a: ChatClient(self.server.base_url, s.model, price_in_per_m=s.price_in,
                                    price_out_per_m=s.price_out, read_timeout=30.0, max_retries=1, backoff_s=0.05)
                      for a, s in self.catalog.items()}
      self._started = True
    return self

  def close(self) -> None:
    for c in self.clients.values():
      c.close()
    self.server.close()
    self._started = False

  def __enter__(self) -> "DemoWorld":
    return self.start()

  def __exit__(self, *exc) -> None:
    self.close()

  # --- API -----------------------------------------------------------------------------------------------------
  def env(self) -> DemoEnvironment:
    self.start()
    return DemoEnvironment(self)

  @property
  def base_url(self) -> str:
    return self.server.base_url

  @property
  def aliases(self) -> list[str]:
    """The reward's tool feature names (records carry these as `alias`)."""
    return list(self.catalog)

  @property
  def prices(self) -> dict[str, tuple[float, float]]:
    """alias -> ($ per 1M input tokens, $ per 1M output tokens)."""
    return {a: (s.price_in, s.price_out) for a, s in self.catalog.items()}

  @property
  def call_costs(self) -> dict[str, float]:
    """alias -> USD of one successful call (what every record of that alias carries)."""
    return {a: s.cost_usd for a, s in self.catalog.items()}

  @property
  def latencies(self) -> dict[str, float]:
    """alias -> catalog latency in seconds (what every record of that alias carries)."""
    return {a: s.latency_s for a, s in self.catalog.items()}

  def grade(self, task: Mapping[str, Any], final_answer: str | None) -> float:
    """1.0 on an exact (normalised) or numeric match with the task's answer, else 0.0 (None -> 0.0)."""
    return grade(final_answer, task["answer"], question=task.get("question", ""))

  def make_tasks(self, n: int, seed: int | None = None, kinds=None, preference=None) -> list[dict[str, Any]]:
    return make_tasks(n, self.seed if seed is None else seed, kinds=kinds, preference=preference)

  def preference_vector(self, task: Mapping[str, Any]):
    return preference_vector(task, self.aliases)

  def _log(self, timing: dict[str, Any]) -> None:
    with self._lock:
      self.call_log.append(timing)
