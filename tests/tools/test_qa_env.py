"""`QAEnvironment` end to end: a real `ScriptedServer` on 127.0.0.1 plays the expert LLMs, a BM25 index over a
corpus written here answers searches, and model-written code runs in real sandbox subprocesses. No mocks."""

from __future__ import annotations

import concurrent.futures as cf
import json
import socket

import pytest

from orchestra_jax.rollout.tool_calls import ToolCall
from orchestra_jax.tools.catalog import Catalog, CatalogError, UnknownAliasError, llm_cost
from orchestra_jax.tools.experts import QAEnvError
from orchestra_jax.tools.ledger import Ledger
from orchestra_jax.tools.qa_env import QAEnvironment, cut_left, extract_answer, extract_code, extract_query
from orchestra_jax.tools.sandbox import CODE_EXEC_USD_PER_S, SandboxConfig
from orchestra_jax.tools.scripted_server import ScriptedServer
from orchestra_jax.tools.search import BM25Retriever

QUESTION = "What is the capital city of Zorbia, and what is 17 * 23?"

CORPUS = [
    {"id": "d1", "contents": "Velmora is the capital city of Zorbia, a small mountain country."},
    {"id": "d2", "contents": "Zorbia exports copper and tin to its neighbours."},
    {"id": "d3", "contents": "Paris is the capital city of France."},
    {"id": "d4", "contents": "Bananas are rich in potassium."},
]

# prompt_tokens / completion_tokens are fixed so that costs can be checked exactly
SEARCH_RULE = {"contains": "wrap the query within <query>",
               "answer": "<think>I need the capital.</think><query>capital of Zorbia</query>",
               "prompt_tokens": 100, "completion_tokens": 10}
CODE_RULE = {"contains": "write additional python code",
             "answer": "Here you go:\n```python\nx = 17 * 23\nprint('product', x)\n```\nDone.",
             "prompt_tokens": 200, "completion_tokens": 20}
ANSWER_RULE = {"contains": "<answer> and </answer>", "answer": "<think>From Doc 1.</think><answer>Velmora</answer>",
               "prompt_tokens": 300, "completion_tokens": 5}
EXPERT_RULE = {"contains": "expert advice", "answer": "Search for the capital first, then compute.",
               "prompt_tokens": 50, "completion_tokens": 8}


def _script():
  rules = {"rules": [SEARCH_RULE, CODE_RULE, ANSWER_RULE, EXPERT_RULE], "default": {"answer": "?"}}
  return {
      "*": rules,  # every catalog model (gpt-5, gpt-5-mini, Qwen/..., cheap-answerer) answers by the rules
      "fault-refuse": {"fault": "refuse"},
      "fault-500": {"fault": "status:500"},
      "fault-json": {"fault": "malformed_json"},
      "fault-hang": {"fault": "hang"},
      "fault-nousage": {"rules": [SEARCH_RULE], "fault": "no_usage"},
      "fault-nochoices": {"fault": "missing_choices"},
      "no-query": {"default": {"answer": "hm", "prompt_tokens": 3, "completion_tokens": 1}},
      "no-code": {"default": {"answer": "I would rather not write code.", "prompt_tokens": 3, "completion_tokens": 6}},
  }


@pytest.fixture(scope="module")
def server():
  with ScriptedServer(_script()) as srv:
    yield srv


@pytest.fixture(scope="module")
def retriever(tmp_path_factory):
  path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
  path.write_text("".join(json.dumps(d) + "\n" for d in CORPUS), encoding="utf-8")
  return BM25Retriever.from_jsonl(path)


@pytest.fixture(scope="module")
def catalog(server):
  """The default catalog with every alias pointed at the scripted server, no API key."""
  base = Catalog.default()
  return base.remap({a: {"base_url": server.base_url + "/v1", "api_key_env": None} for a in base.aliases})


def _env(catalog, retriever, **kw):
  kw.setdefault("client_options", {"read_timeout": 0.5, "connect_timeout": 1.0, "max_retries": 0})
  kw.setdefault("sandbox_config", SandboxConfig(timeout_s=20))
  return QAEnvironment(catalog, retriever, **kw)


def _call(name, **arguments):
  return ToolCall(name=name, arguments=arguments, raw="")


def _last_user_message(body):
  return [m for m in body["messages"] if m["role"] == "user"][-1]["content"]


# --- helpers ---------------------------------------------------------------------------------------------
def test_extractors():
  assert extract_query("<think>x</think><query> a b c </query>") == "a b c"
  assert extract_query("<think>x</think>plain words") == "plain words"
  assert extract_code("a\n```python\nprint(1)\n```\nb\n```python\nprint(2)\n```") == "print(2)"
  assert extract_code("```py\nprint(3)") == "print(3)"  # cut at the token limit
  assert extract_code("no code here") == ""
  assert extract_answer("<think>t</think><answer> 42 </answer>") == "42"
  assert extract_answer("so \\boxed{\\frac{1}{2}} it is") == "\\frac{1}{2}"
  assert extract_answer("<think>t</think> Paris ") == "Paris"
  assert cut_left("abcdef", 3) == "def" and cut_left("ab", 3) == "ab" and cut_left("ab", 0) == ""


# --- the happy path ----------------------------------------------------------------------------------------
def test_search_reason_answer_episode(server, catalog, retriever):
  server.reset()
  ledger = Ledger.for_catalog(catalog)
  env = _env(catalog, retriever, ledger=ledger)
  ep = env.new_episode({"id": "q1", "question": QUESTION, "answer": "Velmora",
                        "preference_text": "Prefer cheap tools."}, "r0")
  opening = ep.messages()
  assert opening[0]["role"] == "system" and "Prefer cheap tools." in opening[0]["content"]
  assert opening[1] == {"role": "user", "content": f"Problem: {QUESTION}\n\nChoose an appropriate tool."}
  assert [t["function"]["name"] for t in ep.tools()] == ["search", "enhance_reasoning", "answer"]

  # search: the expert writes the query, BM25 finds the documents
  res = ep.call(_call("search", model="search-2"))
  assert res.record.error is None and not res.done
  assert "capital of Zorbia" in res.content and "Velmora is the capital city of Zorbia" in res.content
  assert [d.id for d in ep.docs][-1] == "d1"  # best hit last: a left cut drops the weakest documents first
  prompt = _last_user_message(server.received[-1]["body"])
  assert QUESTION in prompt and "<query>" in prompt
  rec = res.record
  assert (rec.alias, rec.model, rec.tokens_in, rec.tokens_out) == ("search-2", "gpt-5-mini", 100, 10)
  assert rec.cost_usd == pytest.approx(llm_cost(0.25, 2.0, 100, 10))

  # enhance_reasoning: the expert writes code, the sandbox runs it
  res = ep.call(_call("enhance_reasoning", model="reasoner-3"))
  assert res.record.error is None, res.content
  assert "x = 17 * 23" in res.content and "product 391" in res.content
  prompt = _last_user_message(server.received[-1]["body"])
  assert prompt.startswith("Documents:\nDoc 1:") and "Velmora is the capital" in prompt  # docs in the context
  exec_s = ledger.calls[-1].exec_s
  assert exec_s > 0
  assert res.record.model == "Qwen/Qwen2.5-Coder-32B-Instruct"
  assert res.record.cost_usd == pytest.approx(llm_cost(0.8, 0.8, 200, 20) + exec_s * CODE_EXEC_USD_PER_S)
  assert ep.code_runs == [("x = 17 * 23\nprint('product', x)", "product 391")]

  # the rebuilt prompt carries the problem, the documents and the code with its output
  rebuilt = ep.rebuild_messages()
  assert rebuilt[0] == opening[0] and len(rebuilt) == 2
  text = rebuilt[1]["content"]
  assert text.startswith(f"Problem: {QUESTION}\n\nDocuments:\nDoc 1: ")
  assert "Velmora is the capital city of Zorbia" in text
  assert "python code and execution outputs:\n```python\nx = 17 * 23" in text and "```output\nproduct 391\n```" in text
  assert text.endswith("Choose an appropriate tool.")

  # answer: ends the episode with the expert's answer
  res = ep.call(_call("answer", model="answer-1"))
  assert res.done and res.final_answer == "Velmora" and res.record.error is None
  prompt = _last_user_message(server.received[-1]["body"])
  assert "product 391" in prompt and "Velmora is the capital" in prompt and prompt.rstrip().endswith("</answer>.")
  assert res.record.cost_usd == pytest.approx(llm_cost(1.25, 10.0, 300, 5))
  assert "Attempt1 answer by answer-1: Velmora" in ep.rebuild_messages()[1]["content"]

  # nothing after the end
  res = ep.call(_call("search", model="search-2"))
  assert res.content.startswith("Error: ") and "episode is over" in res.content and res.record.error

  totals = ledger.totals("r0")
  assert totals["num_calls"] == 4 and totals["num_errors"] == 1
  assert totals["calls_per_tool"] == {"search": 2, "enhance_reasoning": 1, "answer": 1}
  assert totals["prompt_tokens"] == 600 and totals["completion_tokens"] == 35
  expected = (llm_cost(0.25, 2.0, 100, 10) + llm_cost(0.8, 0.8, 200, 20) + exec_s * CODE_EXEC_USD_PER_S
              + llm_cost(1.25, 10.0, 300, 5))
  assert totals["cost_usd"] == pytest.approx(expected)
  assert totals["exec_cost_usd"] == pytest.approx(exec_s * CODE_EXEC_USD_PER_S)
  env.close()


def test_alias_remapping_changes_model_and_price(server, catalog, retriever):
  env = _env(catalog, retriever)
  remap = {"answer-2": {"model": "cheap-answerer", "price_in": 0.1, "price_out": 0.3}}
  ep = env.new_episode({"id": "q2", "question": QUESTION, "alias_map": remap}, "r1")
  schema = {t["function"]["name"]: t for t in ep.tools()}["answer"]
  assert "answer-2: $0.1 per million input tokens, $0.3 per million output tokens" in json.dumps(schema)
  server.reset()
  res = ep.call(_call("answer", model="answer-2"))
  assert server.received[-1]["body"]["model"] == "cheap-answerer"
  assert res.done and res.final_answer == "Velmora"
  assert (res.record.model, res.record.alias) == ("cheap-answerer", "answer-2")
  assert res.record.cost_usd == pytest.approx(llm_cost(0.1, 0.3, 300, 5))
  assert env.ledger.calls[-1].price_in == 0.1
  # the remap is per episode: another episode sees the catalog's own backend
  other = env.new_episode({"id": "q3", "question": QUESTION}, "r2")
  res = other.call(_call("answer", model="answer-2"))
  assert res.record.model == "gpt-5-mini" and res.record.cost_usd == pytest.approx(llm_cost(0.25, 2.0, 300, 5))
  with pytest.raises(CatalogError):
    env.new_episode({"id": "q4", "question": QUESTION, "alias_map": {"search-9": "x"}}, "r3")
  env.close()


def test_allowed_doc_ids_whitelist(catalog, retriever):
  env = _env(catalog, retriever)
  ep = env.new_episode({"id": "q5", "question": QUESTION, "allowed_doc_ids": ["d2", "d3"]}, "r5")
  res = ep.call(_call("search", model="search-3"))
  assert res.record.error is None
  assert {d.id for d in ep.docs} == {"d2", "d3"} and "Velmora" not in res.content
  env.close()


def test_rebuild_truncates_from_the_left(catalog, retriever):
  env = _env(catalog, retriever, context_chars=len(QUESTION) + 120)
  ep = env.new_episode({"id": "q6", "question": QUESTION}, "r6")
  ep.call(_call("search", model="search-1"))
  ep.call(_call("enhance_reasoning", model="reasoner-1"))
  text = ep.rebuild_messages()[1]["content"]
  assert text.startswith(f"Problem: {QUESTION}\n\nDocuments:\n")
  assert "product 391" in text  # the newest state survives the cut ...
  assert "Velmora is the capital" not in text  # ... the oldest does not
  env.close()


def test_call_expert_in_qa(catalog, retriever):
  env = _env(catalog, retriever, tool_names=("search", "enhance_reasoning", "answer", "call_expert"))
  ep = env.new_episode({"id": "q7", "question": QUESTION}, "r7")
  assert "call_expert" in [t["function"]["name"] for t in ep.tools()]
  res = ep.call(_call("call_expert", expert="expert-2"))
  assert res.record.error is None and "Search for the capital first" in res.content
  assert res.record.cost_usd == pytest.approx(llm_cost(0.25, 2.0, 50, 8))
  assert "Advice from expert-2: Search for the capital first" in ep.rebuild_messages()[1]["content"]
  env.close()


def test_concurrent_calls_of_one_episode(catalog, retriever):
  """The agent loop runs the calls of one turn on a thread pool; the episode state must stay consistent."""
  env = _env(catalog, retriever)
  ep = env.new_episode({"id": "q8", "question": QUESTION}, "r8")
  calls = [_call("search", model="search-2"), _call("search", model="search-3"),
           _call("enhance_reasoning", model="reasoner-2"), _call("enhance_reasoning", model="reasoner-3")]
  with cf.ThreadPoolExecutor(4) as pool:
    results = list(pool.map(ep.call, calls))
  assert all(r.record.error is None for r in results), [r.content for r in results]
  assert len(ep.code_runs) == 2 and len({d.id for d in ep.docs}) == len(ep.docs)
  assert env.ledger.totals("r8")["num_calls"] == 4
  env.close()


# --- faults ----------------------------------------------------------------------------------------------------
def _closed_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.mark.parametrize("model,phrase", [
    ("fault-refuse", "closed the connection"),
    ("fault-500", "HTTP 500"),
    ("fault-json", "not valid JSON"),
    ("fault-hang", "read timeout"),
    ("fault-nousage", "no usage"),
    ("fault-nochoices", "without choices"),
    ("no-query", "no usable search query"),
])
def test_endpoint_faults_become_error_responses(catalog, retriever, model, phrase):
  ledger = Ledger.for_catalog(catalog)
  env = _env(catalog, retriever, ledger=ledger)
  ep = env.new_episode({"id": "f", "question": QUESTION, "alias_map": {"search-1": model}}, "rf")
  res = ep.call(_call("search", model="search-1"))
  assert res.content.startswith("Error: search with search-1 failed: ") and phrase in res.content, res.content
  assert not res.done and res.final_answer is None
  assert res.record.error and phrase in res.record.error and res.record.model == model
  last = ledger.calls[-1]
  assert not last.ok and phrase in last.error and last.alias == "search-1"
  if model == "fault-nousage":  # never free: charged at the estimated token counts
    assert res.record.cost_usd > 0 and res.record.tokens_in > 0
  else:
    assert ep.docs == []
  env.close()


def test_connection_refused(catalog, retriever):
  env = _env(catalog, retriever)
  dead = f"http://127.0.0.1:{_closed_port()}/v1"
  ep = env.new_episode({"id": "f", "question": QUESTION, "alias_map": {"answer-1": {"base_url": dead}}}, "rr")
  res = ep.call(_call("answer", model="answer-1"))
  assert res.content.startswith("Error: answer with answer-1 failed:") and "refused the connection" in res.content
  assert not res.done and res.record.error and res.record.cost_usd == 0
  assert not env.ledger.calls[-1].ok
  env.close()


def test_missing_usage_estimate_mode(catalog, retriever):
  env = _env(catalog, retriever, missing_usage="estimate")
  ep = env.new_episode({"id": "f", "question": QUESTION, "alias_map": {"search-1": "fault-nousage"}}, "re")
  res = ep.call(_call("search", model="search-1"))
  assert res.record.error is None and "Velmora" in res.content and res.record.cost_usd > 0
  assert env.ledger.calls[-1].ok and "no usage" in env.ledger.calls[-1].error
  env.close()


@pytest.mark.parametrize("call,phrase", [
    (_call("search", model="search-9"), "is not one of"),
    (_call("search", modle="search-1"), "requires the argument 'model'"),
    (_call("browse", model="search-1"), "unknown tool 'browse'"),
    (ToolCall(name="answer", arguments="not json", raw=""), "not valid JSON"),
    (_call("call_expert", expert="expert-1"), "unknown tool 'call_expert'"),  # not offered in this env
])
def test_invalid_calls_become_error_responses(catalog, retriever, call, phrase):
  env = _env(catalog, retriever)
  ep = env.new_episode({"id": "i", "question": QUESTION}, "ri")
  res = ep.call(call)
  assert res.content.startswith("Error: ") and phrase in res.content, res.content
  assert res.record.error and not res.done and res.record.cost_usd == 0
  assert not env.ledger.calls[-1].ok and env.ledger.calls[-1].rollout == "ri"
  env.close()


def test_answer_needs_documents_when_required(catalog, retriever):
  env = _env(catalog.with_options(require_document_before_answer=True), retriever)
  ep = env.new_episode({"id": "g", "question": QUESTION}, "rg")
  assert "Not allowed to call before a search" in json.dumps(ep.tools())
  res = ep.call(_call("answer", model="answer-2"))
  assert res.content.startswith("Error: answer is not allowed yet") and res.record.error and not res.done
  assert ep.call(_call("search", model="search-2")).record.error is None
  res = ep.call(_call("answer", model="answer-2"))
  assert res.done and res.final_answer == "Velmora"
  env.close()


def test_no_code_block_and_failing_code(catalog, retriever, server):
  env = _env(catalog, retriever)
  ep = env.new_episode({"id": "c", "question": QUESTION, "alias_map": {"reasoner-1": "no-code"}}, "rc")
  res = ep.call(_call("enhance_reasoning", model="reasoner-1"))
  assert "wrote no ```python code block" in res.content and res.record.error
  assert res.record.cost_usd == pytest.approx(llm_cost(1.25, 10.0, 3, 6))  # the LLM call is still paid
  env.close()


def test_no_retriever_and_bad_settings(catalog):
  env = QAEnvironment(catalog, None, client_options={"max_retries": 0, "read_timeout": 2.0})
  ep = env.new_episode({"id": "n", "question": QUESTION}, "rn")
  res = ep.call(_call("search", model="search-2"))
  assert "no retriever is configured" in res.content and res.record.error and res.record.cost_usd == 0
  env.close()
  with pytest.raises(QAEnvError):
    QAEnvironment(catalog, tool_names=("search", "teleport"))
  with pytest.raises(QAEnvError):
    QAEnvironment(catalog, missing_usage="ignore")
  with pytest.raises(QAEnvError):
    QAEnvironment(catalog).new_episode({"id": "x"}, "r")


# --- per-sample offered tools (the record's `tools` field) ---------------------------------------------

def _enums(ep):
  return {t["function"]["name"]: t["function"]["parameters"]["properties"]["model"]["enum"] for t in ep.tools()}


def test_offered_tools_restrict_schemas_and_calls(server, catalog, retriever):
  env = _env(catalog, retriever)  # the ledger comes from the full catalog
  ep = env.new_episode({"id": "o1", "question": QUESTION, "tools": ["search-2", "answer-1"]}, "ro1")
  assert _enums(ep) == {"search": ["search-2"], "answer": ["answer-1"]}  # enhance_reasoning: no alias, not offered
  assert "answer-2" not in json.dumps(ep.tools())
  before = len(server.received)
  for call, phrase in [(_call("answer", model="answer-2"), "answer: model='answer-2' is not one of answer-1"),
                       (_call("search", model="search-1"), "is not one of search-2"),
                       (_call("enhance_reasoning", model="reasoner-1"),
                        "unknown tool 'enhance_reasoning'; available: search, answer")]:
    res = ep.call(call)
    assert res.content.startswith("Error: ") and phrase in res.content and "\n" not in res.content, res.content
    assert res.record.error and not res.done and res.record.cost_usd == 0
    assert not env.ledger.calls[-1].ok
  assert len(server.received) == before  # refused before any request
  assert env.ledger.calls[0].alias == "answer-2" and env.ledger.calls[0].model is None
  assert ep.call(_call("search", model="search-2")).record.error is None
  res = ep.call(_call("answer", model="answer-1"))
  assert res.done and res.final_answer == "Velmora" and server.received[-1]["body"]["model"] == "gpt-5"
  totals = env.ledger.totals("ro1")
  assert totals["num_calls"] == 5 and totals["num_errors"] == 3
  # a tool that is not offered is an unknown tool: its call carries no alias, like any unknown tool's
  assert totals["calls_per_alias"] == {"answer-2": 1, "search-1": 1, "search-2": 1, "answer-1": 1}
  assert totals["cost_usd"] == pytest.approx(llm_cost(0.25, 2.0, 100, 10) + llm_cost(1.25, 10.0, 300, 5))
  # empty `tools` means everything
  full = env.new_episode({"id": "o2", "question": QUESTION, "tools": []}, "ro2")
  assert _enums(full) == _enums(env.new_episode({"id": "o3", "question": QUESTION}, "ro3"))
  assert len(_enums(full)["answer"]) == 6
  env.close()


def test_offered_and_remapped_alias_uses_the_remapped_model(server, catalog, retriever):
  env = _env(catalog, retriever)
  remap = {"answer-2": {"model": "cheap-answerer", "price_in": 0.1, "price_out": 0.3},
           "answer-3": {"model": "cheap-answerer"}}  # a remap of an alias not offered is harmless
  ep = env.new_episode({"id": "o4", "question": QUESTION, "alias_map": remap, "tools": ["answer-2", "search-3"]},
                       "ro4")
  assert _enums(ep) == {"search": ["search-3"], "answer": ["answer-2"]}
  assert "answer-2: $0.1 per million input tokens, $0.3 per million output tokens" in json.dumps(ep.tools())
  res = ep.call(_call("answer", model="answer-2"))
  assert server.received[-1]["body"]["model"] == "cheap-answerer"
  assert res.done and (res.record.model, res.record.alias) == ("cheap-answerer", "answer-2")
  assert res.record.cost_usd == pytest.approx(llm_cost(0.1, 0.3, 300, 5))
  env.close()


def test_offered_tools_errors(catalog, retriever):
  env = _env(catalog, retriever)
  with pytest.raises(UnknownAliasError, match=r"task 'o5': 'tools' lists 'search-9', 'get_user_details'"):
    env.new_episode({"id": "o5", "question": QUESTION, "tools": ["search-1", "search-9", "get_user_details",
                                                                  "answer-1"]}, "r")
  with pytest.raises(QAEnvError, match="offers no alias of answer"):
    env.new_episode({"id": "o6", "question": QUESTION, "tools": ["search-1", "reasoner-2"]}, "r")
  with pytest.raises(QAEnvError, match="'tools' must be a list of alias names"):
    env.new_episode({"id": "o7", "question": QUESTION, "tools": "answer-1"}, "r")
  # an alias of a tool this environment does not run is accepted and changes nothing
  ep = env.new_episode({"id": "o8", "question": QUESTION, "tools": ["answer-4", "expert-1"]}, "r")
  assert _enums(ep) == {"answer": ["answer-4"]}
  res = ep.call(_call("call_expert", expert="expert-1"))
  assert "unknown tool 'call_expert'; available: answer" in res.content
  env.close()


def test_offered_expert_aliases_in_qa(catalog, retriever):
  env = _env(catalog, retriever, tool_names=("search", "enhance_reasoning", "answer", "call_expert"))
  ep = env.new_episode({"id": "o9", "question": QUESTION, "tools": ["answer-1", "expert-3"]}, "r")
  names = [t["function"]["name"] for t in ep.tools()]
  assert names == ["answer", "call_expert"]
  assert ep.tools()[1]["function"]["parameters"]["properties"]["expert"]["enum"] == ["expert-3"]
  assert "is not one of expert-3" in ep.call(_call("call_expert", expert="expert-1")).content
  env.close()
