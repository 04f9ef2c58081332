"""`QAEnvironment`: the reference's QA tools (search, enhance_reasoning, answer) behind the `ToolEnvironment` API.

The orchestrator sees three functions (docs/design.md section 4), each with one argument `model` naming an alias of
the `Catalog`; the alias maps (per sample, see "Remapping") to an expert LLM behind an OpenAI-compatible
endpoint, with a price:

* `search(model)`: the chosen LLM writes a query from the problem and the context so far (reference prompt,
  `<query>…</query>`), then the retriever returns up to `topk` documents, restricted to the task's
  `allowed_doc_ids` when given. New documents join the episode context (deduplicated by id) and are shown in
  the tool response.
* `enhance_reasoning(model)`: the chosen LLM writes Python (the last ```` ```python ```` fence of its reply);
  it runs in the sandbox (`sandbox.run_python`: a separate, contained process, never this one). Code and
  output join the context. Cost = LLM cost + execution wall seconds × the catalog's code price (8.3e-6 $/s).
* `answer(model)`: the chosen LLM answers from the context (`<answer>…</answer>`, else the last `\\boxed{}`,
  else its whole reply); a successful answer ends the episode (`done=True`, `final_answer`). An answer call
  whose endpoint fails does NOT end the episode: the orchestrator gets the error and may pick another model.
* `call_expert(expert)` (only when listed in `tool_names`): the chosen LLM gets the context and the problem and
  returns advice, which joins the context as a note.

Task dict: `{"id", "question", "answer"?, "alias_map"?, "tools"?, "allowed_doc_ids"?, "preference_text"?}`.

Remapping. A task's `alias_map` (`{alias: {model?, price_in?, price_out?, latency_s?, base_url?, ...}}` or
`{alias: "model"}`) is applied with `Catalog.remap` for that episode only: the tool schemas the orchestrator
sees (prices in the descriptions) and the endpoint, model and price of each call follow it. A bad map raises
`CatalogError` from `new_episode` (a data error, not the model's).

Offered tools. A task's non-empty `tools` (the training record's field: the aliases this sample offers) restricts
the episode's catalog with `Catalog.offer`, after the remap: each tool's enum shows only the offered aliases, a
tool with none left is not offered at all, and a call naming anything else is an unknown tool or alias (the
usual "Error: ..." result, no request). Listed aliases of tools this environment does not run (e.g. `expert-1`
without "call_expert" in `tool_names`) are accepted and have no effect. Names that are not catalog aliases raise
`UnknownAliasError`, and a list that leaves `answer` without an alias raises `QAEnvError` (such an episode
could never end), both from `new_episode`. Empty or absent `tools`: everything is offered.

Errors never raise out of `Episode.call`. Unknown tool or alias, bad arguments, `answer` before any document
when the catalog sets `require_document_before_answer`, an endpoint that refuses, answers 5xx, sends
malformed JSON, hangs past the read timeout or leaves out `usage`, a retriever or sandbox that fails, a
reply without a query / code block: each gives a `ToolResult` whose content is one line starting with
"Error:", a `ToolCallRecord` with `error` set, and a ledger record with `ok=False`.

Expert calls go through `experts.ExpertClients` (one client per backend, shared by every episode) and are priced
into the ledger by `experts.record_call`; see `experts` for what a reply without `usage` costs (`missing_usage`).

Prompts. `messages()` is the opening prompt: a short system prompt (plus the task's `preference_text`) and one
user message "Problem: …". `rebuild_messages()` is the reference's training mode (docs/design.md section 3): the
same system prompt and one user message rebuilt from the state each turn: "Problem: …", then "Documents:" (each
cut to `max_doc_chars`), the code with its output and earlier answer attempts, cut from the left to
`context_chars` characters (the reference cuts tokens; we cut characters so no tokenizer is needed here).
Documents of one search are stored worst-first so a left cut drops the weakest ones first, as the reference
does. Expert prompts get the same context built with `expert_doc_chars` / `expert_context_chars`.

Not copied from the reference: it hides a tool that was used twice in a row from the tool list (and then
passes the unfiltered list anyway); our tool list is fixed per episode.

Threads. The agent loop may run several calls of one episode at once (one turn, several tool calls); episode
state is guarded by a lock that is never held across an LLM call or a sandbox run.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from orchestra_jax.rollout.environment import Episode, ToolEnvironment, ToolResult
from orchestra_jax.rollout.tool_calls import ToolCall
from orchestra_jax.tools.catalog import QA_TOOLS, Backend, Catalog, InvalidToolCall, ResolvedCall, UnknownAliasError
# ExpertClients, ExpertReply and record_call are re-exported: they lived here, and callers may still import them.
from orchestra_jax.tools.experts import (ExpertClients, ExpertReply, QAEnvError, record_call,  # noqa: F401
                                         shorten, strip_thinking)
from orchestra_jax.tools.ledger import Ledger
from orchestra_jax.tools.sandbox import SandboxConfig, run_python

log = logging.getLogger(__name__)

__all__ = ["QAEnvironment", "QAEpisode", "QAEnvError", "extract_query", "extract_code", "extract_answer", "cut_left",
           "offer_tools", "DEFAULT_SYSTEM_PROMPT", "SEARCH_INSTRUCTION", "CODE_INSTRUCTION", "ANSWER_INSTRUCTION",
           "EXPERT_INSTRUCTION"]

# --- prompts (the reference's wording, spelling fixed) ---------------------------------------------------
DEFAULT_SYSTEM_PROMPT = "You are good at using tools."
SEARCH_INSTRUCTION = (
    "Instead of directly answering the question, please write a query to search for a piece of relevant and "
    "missing information. The query should be a few key words about the information to search or a short "
    "sentence. Wrap the query within <query> and </query>.")
CODE_INSTRUCTION = (
    "Instead of directly answering the question, please write additional python code that will give "
    "intermediate results after execution. Wrap the code within ```python and ```. The code should be "
    "self-contained with all the import and initialization.")
ANSWER_INSTRUCTION = (
    "Wrap the thinking process and explanation between <think> and </think> and wrap only the exact answer "
    "without any explanation within <answer> and </answer>.")
EXPERT_INSTRUCTION = (
    "Do not answer the problem yet. Give concise expert advice on how to solve it: what is known, what is "
    "missing, and which step should come next.")
CHOOSE_TOOL = "Choose an appropriate tool."


# --- text helpers --------------------------------------------------------------------------------------
def cut_left(text: str, limit: int) -> str:
  """The last `limit` characters of `text` (the reference truncates context from the left)."""
  if limit <= 0:
    return ""
  return text if len(text) <= limit else text[-limit:]


def extract_query(text: str) -> str:
  """The search query of a reply: inside the last `<query>…</query>`, else the reply after any thinking."""
  if "<query>" in text:
    return text.split("<query>")[-1].split("</query>")[0].strip()
  return strip_thinking(text).replace("</query>", "").strip()


_FENCE = re.compile(r"```[ \t]*(?:python3?|py)\b[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)


def extract_code(text: str) -> str:
  """The code of the last ```` ```python ```` (or ```` ```py ````) fence; an unterminated last fence runs to the
  end (a reply cut at the token limit). "" when there is none."""
  blocks = _FENCE.findall(strip_thinking(text)) or _FENCE.findall(text)
  return blocks[-1].strip("\n") if blocks else ""


def _last_boxed(text: str) -> str | None:
  start = text.rfind("\\boxed{")
  if start < 0:
    return None
  i, depth, out = start + len("\\boxed{"), 1, []
  while i < len(text):
    ch = text[i]
    if ch == "{":
      depth += 1
    elif ch == "}":
      depth -= 1
      if depth == 0:
        return "".join(out).strip()
    out.append(ch)
    i += 1
  return None


def extract_answer(text: str) -> str:
  """The answer of a reply: inside the last `<answer>…</answer>`, else the last `\\boxed{…}`, else the reply
  after any thinking (stripped)."""
  if "<answer>" in text:
    return text.split("<answer>")[-1].split("</answer>")[0].strip()
  boxed = _last_boxed(text)
  if boxed is not None:
    return boxed
  return strip_thinking(text).strip()


def offer_tools(catalog: Catalog, tools: Any, task_id: Any, *, own_tools: Sequence[str] = (),
                own_label: str = "") -> tuple[Catalog, list[str]]:
  """A task's `tools` field applied: (`catalog.offer` of the listed aliases, the listed names of `own_tools`).

  `own_tools`: names that are legitimately not aliases (a tau2 domain's tools; `own_label` says whose, for the
  error). Any other name that is not an alias of `catalog` raises UnknownAliasError naming the task. Shared by
  QAEnvironment and Tau2Environment; callers skip it for an empty list ("everything is offered")."""
  if isinstance(tools, (str, bytes)) or not isinstance(tools, Sequence) \
      or not all(isinstance(t, str) and t for t in tools):
    raise QAEnvError(f"task {task_id!r}: 'tools' must be a list of alias names, got {tools!r}")
  own = set(own_tools)
  unknown = [t for t in tools if t not in catalog and t not in own]
  if unknown:
    what = f"catalog aliases or {own_label}" if own_label else "aliases of the catalog"
    raise UnknownAliasError(f"task {task_id!r}: 'tools' lists {', '.join(map(repr, unknown))}, which are not "
                            f"{what} ({catalog.source}; aliases: {', '.join(catalog.aliases)})")
  listed_own = [t for t in tools if t in own and t not in catalog]
  return catalog.offer([t for t in tools if t in catalog]), listed_own


# --- the environment -------------------------------------------------------------------------------------
def _positive_int(name: str, value: Any) -> int:
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise QAEnvError(f"{name} must be a positive integer, got {value!r}")
  return value


class QAEnvironment(ToolEnvironment):
  """QA tasks with the catalog's priced tools; one `QAEpisode` per rollout row. See the module docstring.

  Args:
    catalog: the tool catalog (aliases, backends, prices, `require_document_before_answer`).
    retriever: anything with `retrieve(queries, topk, allowed_ids) -> [[Doc]]` (BM25Retriever,
      RemoteRetriever); None: `search` answers with an error.
    sandbox_config: limits of each code run (default: `SandboxConfig()`; 60 s as in the reference).
    ledger: where every call is recorded (default: a new `Ledger.for_catalog(catalog)`); rollout key =
      the episode's `rollout_id`.
    max_doc_chars: characters of each document in the orchestrator's prompt and in tool responses (the
      reference shows 1200).
    topk: documents per search (the reference asks its retriever for 50).
    tool_names: the catalog tools offered (default: search, enhance_reasoning, answer; add "call_expert").
    client_options / chat_options / missing_usage: see `experts.ExpertClients`.
    context_chars / code_chars / attempt_chars: budgets of the rebuilt orchestrator prompt (left cuts).
    expert_doc_chars (None: whole documents) / expert_context_chars / expert_code_chars: same for the
      prompts of the expert LLMs.
    search_usd_per_call: extra cost of one retrieval (0 for a local index; a paid web search costs more).
    max_query_chars: the query is cut to this many characters (the reference sends 390).
    system_prompt: the orchestrator's system prompt.
  """

  def __init__(self, catalog: Catalog, retriever: Any = None, sandbox_config: SandboxConfig | None = None,
               ledger: Ledger | None = None, max_doc_chars: int = 1200, topk: int = 10, *,
               tool_names: Sequence[str] = QA_TOOLS, client_options: Mapping[str, Any] | None = None,
               chat_options: Mapping[str, Any] | None = None, missing_usage: str = "error",
               context_chars: int = 100_000, code_chars: int = 48_000, attempt_chars: int = 32_000,
               expert_doc_chars: int | None = None, expert_context_chars: int = 100_000,
               expert_code_chars: int = 48_000, search_usd_per_call: float = 0.0, max_query_chars: int = 390,
               system_prompt: str = DEFAULT_SYSTEM_PROMPT):
    if not isinstance(catalog, Catalog):
      raise QAEnvError(f"catalog must be a Catalog, got {type(catalog).__name__}")
    self.catalog = catalog
    self.tool_names = tuple(tool_names)
    for name in self.tool_names:
      if name not in catalog.tools:
        raise QAEnvError(f"tool_names lists {name!r}, which the catalog {catalog.source} does not define "
                         f"(known: {', '.join(catalog.tools)})")
      if name not in _HANDLERS:
        raise QAEnvError(f"tool_names lists {name!r}, which QAEnvironment cannot run "
                         f"(it runs {', '.join(_HANDLERS)})")
    if retriever is not None and not callable(getattr(retriever, "retrieve", None)):
      raise QAEnvError("retriever must have a retrieve(queries, topk, allowed_ids) method, "
                       f"got {type(retriever).__name__}")
    self.retriever = retriever
    self.sandbox_config = sandbox_config if sandbox_config is not None else SandboxConfig()
    if not isinstance(self.sandbox_config, SandboxConfig):
      raise QAEnvError(f"sandbox_config must be a SandboxConfig, got {type(sandbox_config).__name__}")
    self.ledger = ledger if ledger is not None else Ledger.for_catalog(catalog)
    self.max_doc_chars = _positive_int("max_doc_chars", max_doc_chars)
    self.topk = _positive_int("topk", topk)
    self.context_chars = _positive_int("context_chars", context_chars)
    self.code_chars = _positive_int("code_chars", code_chars)
    self.attempt_chars = _positive_int("attempt_chars", attempt_chars)
    self.expert_doc_chars = None if expert_doc_chars is None else _positive_int("expert_doc_chars", expert_doc_chars)
    self.expert_context_chars = _positive_int("expert_context_chars", expert_context_chars)
    self.expert_code_chars = _positive_int("expert_code_chars", expert_code_chars)
    self.max_query_chars = _positive_int("max_query_chars", max_query_chars)
    if isinstance(search_usd_per_call, bool) or not isinstance(search_usd_per_call, (int, float)) \
        or not search_usd_per_call >= 0:
      raise QAEnvError(f"search_usd_per_call must be a number >= 0, got {search_usd_per_call!r}")
    self.search_usd_per_call = float(search_usd_per_call)
    self.system_prompt = str(system_prompt)
    self.clients = ExpertClients(client_options, chat_options, missing_usage)

  def new_episode(self, task: Mapping[str, Any], rollout_id: str) -> "QAEpisode":
    if not isinstance(task, Mapping):
      raise QAEnvError(f"a QA task must be a dict with 'question', got {type(task).__name__}")
    question = task.get("question")
    if not isinstance(question, str) or not question.strip():
      raise QAEnvError(f"task {task.get('id')!r}: 'question' must be a non-empty string")
    catalog = self.catalog
    if task.get("alias_map"):
      catalog = catalog.remap(task["alias_map"])
    if task.get("tools"):  # remap first: the map may name aliases this sample does not offer
      catalog, _ = offer_tools(catalog, task["tools"], task.get("id"))
      if "answer" in self.tool_names and "answer" not in catalog.tools:
        raise QAEnvError(f"task {task.get('id')!r}: 'tools' offers no alias of answer "
                         f"({', '.join(self.catalog.tool('answer').aliases)}), so an episode could never end")
    allowed = task.get("allowed_doc_ids")
    if allowed is not None:
      if isinstance(allowed, (str, bytes)) or not isinstance(allowed, Iterable):
        raise QAEnvError(f"task {task.get('id')!r}: 'allowed_doc_ids' must be a list of document ids")
      allowed = {str(x) for x in allowed}
    return QAEpisode(self, dict(task), catalog, rollout_id, allowed)

  def close(self) -> None:
    self.clients.close()


@dataclasses.dataclass(frozen=True)
class _Doc:
  id: str
  contents: str


class QAEpisode(Episode):
  """One QA rollout: the documents, code runs and answers so far, and the per-sample catalog."""

  def __init__(self, env: QAEnvironment, task: dict[str, Any], catalog: Catalog, rollout_id: str,
               allowed_doc_ids: set[str] | None):
    self.env = env
    self.task = task
    self.catalog = catalog
    # the environment's tools that this task's catalog still offers (`Catalog.offer` drops a tool without aliases)
    self.tool_names = tuple(n for n in env.tool_names if n in catalog.tools)
    self.rollout_id = rollout_id
    self.allowed_doc_ids = allowed_doc_ids
    self.question: str = task["question"]
    self._lock = threading.Lock()
    self.docs: list[_Doc] = []  # worst-first within each search, newest search last
    self._doc_ids: set[str] = set()
    self.code_runs: list[tuple[str, str]] = []  # (code, output)
    self.attempts: list[tuple[str, str]] = []  # (who, answer)
    self.notes: list[tuple[str, str]] = []  # (who, expert advice)
    self.done = False
    self.final_answer: str | None = None

  # --- prompts ---------------------------------------------------------------------------------------
  def _system(self) -> str:
    text = self.env.system_prompt
    pref = self.task.get("preference_text")
    if isinstance(pref, str) and pref.strip():
      text = f"{text}\n\nUser preference: {pref.strip()}"
    return text

  def messages(self) -> list[dict[str, Any]]:
    return [{"role": "system", "content": self._system()},
            {"role": "user", "content": f"Problem: {self.question}\n\n{CHOOSE_TOOL}"}]

  def tools(self) -> list[dict[str, Any]]:
    return self.catalog.tool_schemas(self.tool_names)

  def _who(self, alias: str, backend: Backend) -> str:
    return f"{alias} ({backend.model})" if self.catalog.show_model_names else alias

  @staticmethod
  def _code_text(runs: Sequence[tuple[str, str]]) -> str:
    return "".join(f"```python\n{code}\n```\n\n```output\n{output}\n```\n\n" for code, output in runs)

  def context(self) -> str:
    """The orchestrator's view of the state (the reference's context_str), cut from the left."""
    with self._lock:
      docs, runs, attempts, notes = list(self.docs), list(self.code_runs), list(self.attempts), list(self.notes)
    env = self.env
    doc_str = "".join(f"Doc {i + 1}: {d.contents[:env.max_doc_chars]} ...\n\n" for i, d in enumerate(docs))
    attempt_str = "".join(f"Attempt{i + 1} answer by {who}: {ans}\n" for i, (who, ans) in enumerate(attempts))
    attempt_str += "".join(f"Advice from {who}: {text}\n" for who, text in notes)
    attempt_str = cut_left(attempt_str, env.attempt_chars)
    if attempt_str and not attempt_str.startswith(("Attempt", "Advice")):
      attempt_str = "Attempt answer: " + attempt_str
    code_attempt = cut_left(self._code_text(runs) + attempt_str, env.code_chars)
    if code_attempt and not code_attempt.startswith(("```", "Attempt", "Advice")):
      code_attempt = "```\n" + code_attempt
    budget = env.context_chars - len(self.question)
    body = doc_str + ("\npython code and execution outputs:\n" + code_attempt if code_attempt else "")
    context = cut_left(body, budget)
    if doc_str:
      context = "Documents:\n" + context
    return context.strip()

  def rebuild_messages(self) -> list[dict[str, Any]]:
    context = self.context()
    middle = f"{context}\n\n" if context else ""
    return [{"role": "system", "content": self._system()},
            {"role": "user", "content": f"Problem: {self.question}\n\n{middle}{CHOOSE_TOOL}"}]

  def expert_context(self) -> str:
    """What the expert LLMs see before the question: documents and code runs, cut from the left."""
    with self._lock:
      docs, runs = list(self.docs), list(self.code_runs)
    env = self.env
    limit = env.expert_doc_chars
    doc_str = "".join(f"Doc {i + 1}: {d.contents if limit is None else d.contents[:limit]}\n\n"
                      for i, d in enumerate(docs))
    code_str = cut_left(self._code_text(runs), env.expert_code_chars)
    if code_str and not code_str.startswith("```"):
      code_str = "```\n" + code_str
    context = cut_left(doc_str + code_str, env.expert_context_chars - len(self.question))
    if doc_str:
      context = "Documents:\n" + context
    return context.strip()

  def _expert_prompt(self, tail: str) -> list[dict[str, Any]]:
    context = self.expert_context()
    return [{"role": "user", "content": (f"{context}\n\n" if context else "") + tail}]

  # --- calls -----------------------------------------------------------------------------------------
  def call(self, call: ToolCall) -> ToolResult:
    start = time.perf_counter()
    name, arguments = call.name, call.arguments
    try:
      with self._lock:
        finished, docs_seen = self.done, bool(self.docs)
      if finished:
        raise InvalidToolCall(f"the episode is over: answer was already given ({shorten(self.final_answer or '')!r})")
      resolved = self.catalog.parse_call(name, arguments, documents_seen=docs_seen,
                                         allowed_tools=self.tool_names)
    except InvalidToolCall as e:
      return self._invalid(call, str(e), start)
    except Exception as e:  # catalog bug: still never raise into the loop
      log.exception("parse_call failed for %s", name)
      return self._invalid(call, f"internal error while checking the call ({type(e).__name__}: {e})", start)
    try:
      return _HANDLERS[resolved.tool.name](self, call, resolved, start)
    except Exception as e:  # a bug in a handler: report it to the model, keep the rollout alive
      log.exception("tool %s failed", name)
      return self._result(call, resolved, start, error=f"internal error in {name} ({type(e).__name__}: {e})")

  def _invalid(self, call: ToolCall, message: str, start: float) -> ToolResult:
    alias = model = None
    args = call.arguments
    if isinstance(args, Mapping) and call.name in self.catalog.tools:
      value = args.get(self.catalog.tool(call.name).argument)
      if isinstance(value, str):
        alias = value
        if value in self.catalog:
          model = self.catalog.backend(value).model
    content = f"Error: {message}"
    record = record_call(self.env.ledger, self.rollout_id, call.name, args, content=content, error=message,
                         latency_s=time.perf_counter() - start, alias=alias, model=model)
    return ToolResult(content=content, record=record)

  def _result(self, call: ToolCall, r: ResolvedCall, start: float, *, content: str | None = None,
              error: str | None = None, reply: ExpertReply | None = None, exec_s: float = 0.0,
              extra_cost_usd: float = 0.0, done: bool = False, final_answer: str | None = None) -> ToolResult:
    if error is not None:
      content = f"Error: {r.tool.name} with {r.alias} failed: {error}"
      done, final_answer = False, None
    record = record_call(self.env.ledger, self.rollout_id, call.name, call.arguments, content=content or "",
                         error=error, latency_s=time.perf_counter() - start, backend=r.backend, alias=r.alias,
                         reply=reply, exec_s=exec_s, extra_cost_usd=extra_cost_usd)
    return ToolResult(content=content or "", done=done, final_answer=final_answer, record=record)

  def _search(self, call: ToolCall, r: ResolvedCall, start: float) -> ToolResult:
    if self.env.retriever is None:  # checked first: no query is worth paying for
      return self._result(call, r, start, error="no retriever is configured for search")
    reply = self.env.clients.chat(r.backend, self._expert_prompt(f"Question: {self.question}\n{SEARCH_INSTRUCTION}"))
    if reply.error:
      return self._result(call, r, start, error=reply.error, reply=reply)
    query = extract_query(reply.text)
    if len(query) < 5:  # the reference skips retrieval for such queries
      return self._result(call, r, start, reply=reply,
                          error=f"the model wrote no usable search query (got {shorten(query)!r})")
    query = query[:self.env.max_query_chars]
    allowed = None if self.allowed_doc_ids is None else [self.allowed_doc_ids]
    try:
      hits = self.env.retriever.retrieve([query], topk=self.env.topk, allowed_ids=allowed)[0]
    except Exception as e:  # retriever down, bad answer: the model sees it, the rollout goes on
      return self._result(call, r, start, reply=reply, error=f"retrieval failed for query {query!r}: {e}")
    found = []
    for hit in hits:
      doc_id = getattr(hit, "id", None) if not isinstance(hit, Mapping) else hit.get("id")
      contents = getattr(hit, "contents", None) if not isinstance(hit, Mapping) else hit.get("contents")
      if contents is None:
        continue
      found.append(_Doc(str(doc_id if doc_id is not None else contents), str(contents)))
    with self._lock:
      new = [d for d in found if d.id not in self._doc_ids]
      for d in reversed(new):  # best last: a left cut of the context drops the weakest first
        self.docs.append(d)
        self._doc_ids.add(d.id)
      number = {d.id: i + 1 for i, d in enumerate(self.docs)}
    lines = [f"Search query ({r.alias}): {query}"]
    if not found:
      lines.append("No documents found.")
    else:
      lines.append(f"Found {len(found)} documents ({len(new)} new):")
      lines += [f"Doc {number.get(d.id, '?')}: {d.contents[:self.env.max_doc_chars]}" for d in found]
    return self._result(call, r, start, content="\n".join(lines), reply=reply,
                        extra_cost_usd=self.env.search_usd_per_call)

  def _enhance_reasoning(self, call: ToolCall, r: ResolvedCall, start: float) -> ToolResult:
    reply = self.env.clients.chat(r.backend, self._expert_prompt(f"Question: {self.question}\n{CODE_INSTRUCTION}"))
    if reply.error:
      return self._result(call, r, start, error=reply.error, reply=reply)
    code = extract_code(reply.text)
    if not code.strip():
      return self._result(call, r, start, reply=reply, error="the model wrote no ```python code block")
    try:
      run = run_python(code, self.env.sandbox_config)
    except Exception as e:  # SandboxUnavailable / SandboxError: the machinery, not the code
      return self._result(call, r, start, reply=reply, error=f"code execution is unavailable: {e}")
    output = run.stdout.rstrip("\n")
    if not run.ok:
      output = (output + "\n" if output else "") + (run.error or "execution failed")
    if run.truncated:
      output += "\n[output truncated]"
    with self._lock:
      if output.strip():
        self.code_runs.append((code, output))
    shown = cut_left(output, self.env.code_chars)
    content = f"```python\n{code}\n```\n\n```output\n{shown}\n```"
    return self._result(call, r, start, content=content, reply=reply, exec_s=run.wall_s)

  def _answer(self, call: ToolCall, r: ResolvedCall, start: float) -> ToolResult:
    reply = self.env.clients.chat(r.backend,
                                  self._expert_prompt(f"Problem:\n{self.question}\n\n{ANSWER_INSTRUCTION}"))
    if reply.error:
      return self._result(call, r, start, error=reply.error, reply=reply)
    answer = extract_answer(reply.text)
    with self._lock:
      if self.done:
        late = True
      else:
        late = False
        self.done, self.final_answer = True, answer
        self.attempts.append((self._who(r.alias, r.backend), answer))
    if late:
      return self._result(call, r, start, reply=reply,
                          error="another answer call of this turn already ended the episode")
    return self._result(call, r, start, content=f"Answer ({r.alias}): {answer}", reply=reply, done=True,
                        final_answer=answer)

  def _call_expert(self, call: ToolCall, r: ResolvedCall, start: float) -> ToolResult:
    reply = self.env.clients.chat(r.backend, self._expert_prompt(f"Problem: {self.question}\n\n{EXPERT_INSTRUCTION}"))
    if reply.error:
      return self._result(call, r, start, error=reply.error, reply=reply)
    advice = strip_thinking(reply.text).strip()
    if not advice:
      return self._result(call, r, start, reply=reply, error="the expert returned an empty reply")
    with self._lock:
      self.notes.append((self._who(r.alias, r.backend), advice))
    return self._result(call, r, start, content=f"Advice ({r.alias}): {advice}", reply=reply)


_HANDLERS = {
    "search": QAEpisode._search,
    "enhance_reasoning": QAEpisode._enhance_reasoning,
    "answer": QAEpisode._answer,
    "call_expert": QAEpisode._call_expert,
}
