"""The tool catalog (schemas, prices, remapping, errors) and the cost ledger."""

import json
import threading

import pytest

from orchestra_jax.errors import UserError
from orchestra_jax.tools.catalog import (Catalog, CatalogError, InvalidToolCall, UnknownAliasError, llm_cost)
from orchestra_jax.tools.ledger import Ledger
from orchestra_jax.tools.sandbox import CODE_EXEC_USD_PER_S

# docs/design.md section 4: alias -> (model, $/M in, $/M out, latency s)
TABLE = {
    "search-1": ("gpt-5", 1.25, 10, 22), "reasoner-1": ("gpt-5", 1.25, 10, 31), "answer-1": ("gpt-5", 1.25, 10, 96),
    "search-2": ("gpt-5-mini", 0.25, 2, 16), "reasoner-2": ("gpt-5-mini", 0.25, 2, 25),
    "answer-2": ("gpt-5-mini", 0.25, 2, 27), "search-3": ("Qwen/Qwen3-32B", 0.8, 0.8, 8),
    "reasoner-3": ("Qwen/Qwen2.5-Coder-32B-Instruct", 0.8, 0.8, 9),
    "answer-3": ("meta-llama/Llama-3.3-70B-Instruct", 0.9, 0.9, 15), "answer-4": ("Qwen/Qwen3-32B", 0.8, 0.8, 11),
    "answer-math-1": ("Qwen/Qwen2.5-Math-72B-Instruct", 0.9, 0.9, 13),
    "answer-math-2": ("Qwen/Qwen2.5-Math-7B-Instruct", 0.2, 0.2, 9),
}


@pytest.fixture(scope="module")
def catalog():
  return Catalog.default()


def test_default_catalog_matches_design_table(catalog):
  for alias, (model, p_in, p_out, latency) in TABLE.items():
    b = catalog.backend(alias)
    assert (b.model, b.price_in, b.price_out, b.latency_s) == (model, p_in, p_out, latency), alias
    assert b.base_url.startswith("http://127.0.0.1:")
  assert {"expert-1", "expert-2", "expert-3"} <= set(catalog.aliases)
  assert catalog.backend("search-1").api_key_env == "OPENAI_API_KEY"
  assert catalog.backend("search-3").api_key_env is None
  assert catalog.orchestrator_price_in == catalog.orchestrator_price_out == 0.2
  assert catalog.code_execution_usd_per_s == CODE_EXEC_USD_PER_S == 8.3e-6


def test_api_key_is_read_from_the_named_variable_only(catalog, monkeypatch):
  monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
  b = catalog.backend("answer-1")
  assert b.api_key() == "sk-from-env"
  assert "sk-from-env" not in json.dumps(catalog.to_dict())
  assert catalog.backend("answer-4").api_key() is None


def test_tool_schemas_carry_enum_prices_and_latency(catalog):
  schemas = catalog.tool_schemas()
  assert [s["function"]["name"] for s in schemas] == ["search", "enhance_reasoning", "answer"]
  answer = schemas[2]["function"]
  prop = answer["parameters"]["properties"]["model"]
  assert answer["parameters"]["required"] == ["model"] and answer["parameters"]["type"] == "object"
  assert prop["enum"] == ["answer-1", "answer-2", "answer-3", "answer-4", "answer-math-1", "answer-math-2"]
  assert ("answer-1: $1.25 per million input tokens, $10 per million output tokens, typical latency 96 s."
          in prop["description"])
  assert "answer-math-2: $0.2 per million input tokens" in prop["description"]
  assert "gpt-5" not in json.dumps(schemas)  # model names stay hidden unless show_model_names
  expert = catalog.tool_schema("call_expert")["function"]
  assert list(expert["parameters"]["properties"]) == ["expert"]
  assert expert["parameters"]["properties"]["expert"]["enum"] == ["expert-1", "expert-2", "expert-3"]
  assert len(catalog.tool_schemas(None)) == 4
  shown = catalog.with_options(show_model_names=True).tool_schema("search")
  assert "search-1 (gpt-5): $1.25" in shown["function"]["parameters"]["properties"]["model"]["description"]
  json.dumps(schemas)  # serialisable as-is


def test_remap_returns_a_new_catalog(catalog):
  remapped = catalog.remap({"answer-1": {"model": "Qwen/Qwen3-8B", "price_in": 0.1, "price_out": 0.3, "latency": 5},
                            "search-2": {"price_out": 4}})
  b = remapped.backend("answer-1")
  assert (b.model, b.price_in, b.price_out, b.latency_s) == ("Qwen/Qwen3-8B", 0.1, 0.3, 5.0)
  assert b.base_url == catalog.backend("answer-1").base_url  # untouched fields kept
  assert remapped.backend("search-2").price_out == 4 and remapped.backend("search-2").price_in == 0.25
  assert catalog.backend("answer-1").model == "gpt-5"  # original unchanged
  desc = remapped.tool_schema("answer")["function"]["parameters"]["properties"]["model"]["description"]
  assert "answer-1: $0.1 per million input tokens, $0.3 per million output tokens, typical latency 5 s." in desc
  assert catalog.remap({"search-3": "Qwen/Qwen3-8B"}).backend("search-3").model == "Qwen/Qwen3-8B"
  with pytest.raises(UnknownAliasError, match="answer-9"):
    catalog.remap({"answer-9": {"price_in": 1}})
  with pytest.raises(CatalogError, match="unknown field 'cost'"):
    catalog.remap({"answer-1": {"cost": 1}})
  with pytest.raises(CatalogError, match="price_in"):
    catalog.remap({"answer-1": {"price_in": -1}})


def test_parse_call_and_document_gate(catalog):
  call = catalog.parse_call("search", {"model": "search-3"})
  assert call.alias == "search-3" and call.backend.model == "Qwen/Qwen3-32B" and call.tool.name == "search"
  assert catalog.parse_call("answer", '{"model": "answer-2"}', documents_seen=False).alias == "answer-2"
  for name, args, match in [("search", {"model": "answer-1"}, "not one of"), ("search", {}, "requires"),
                            ("fly", {"model": "x"}, "unknown tool"), ("search", "{bad", "not valid JSON"),
                            ("search", [1], "JSON object")]:
    with pytest.raises(InvalidToolCall, match=match):
      catalog.parse_call(name, args)
  with pytest.raises(InvalidToolCall, match="unknown tool"):
    catalog.parse_call("call_expert", {"expert": "expert-1"}, allowed_tools=["search", "answer"])
  gated = catalog.with_options(require_document_before_answer=True)
  assert "Not allowed to call before a search has returned documents." in \
      gated.tool_schema("answer")["function"]["description"]
  with pytest.raises(InvalidToolCall, match="not allowed yet"):
    gated.parse_call("answer", {"model": "answer-1"}, documents_seen=False)
  assert gated.parse_call("answer", {"model": "answer-1"}, documents_seen=True).alias == "answer-1"


def _enums(cat):
  return {n: s["function"]["parameters"]["properties"][t.argument]["enum"]
          for n, t in cat.tools.items() for s in [cat.tool_schema(n)]}


def test_offer_restricts_aliases_and_drops_empty_tools(catalog):
  offered = catalog.offer(["answer-math-2", "search-3", "answer-1", "expert-2", "search-1"])
  # enums in catalog order (not the list's); enhance_reasoning lost every alias, so it is gone
  assert _enums(offered) == {"search": ["search-1", "search-3"], "answer": ["answer-1", "answer-math-2"],
                             "call_expert": ["expert-2"]}
  assert offered.aliases == ("search-1", "search-3", "answer-1", "answer-math-2", "expert-2")
  assert "answer-2" not in offered and "answer-2" in catalog  # the original is unchanged
  desc = offered.tool_schema("answer")["function"]["parameters"]["properties"]["model"]["description"]
  assert "answer-1: $1.25" in desc and "answer-2" not in desc
  with pytest.raises(InvalidToolCall, match="not one of answer-1, answer-math-2"):
    offered.parse_call("answer", {"model": "answer-2"})
  with pytest.raises(InvalidToolCall, match="unknown tool 'enhance_reasoning'"):
    offered.parse_call("enhance_reasoning", {"model": "reasoner-1"})
  assert offered.parse_call("search", {"model": "search-3"}).backend == catalog.backend("search-3")
  assert offered.tool_schemas(["search", "answer"])[0]["function"]["name"] == "search"
  with pytest.raises(UnknownAliasError):
    offered.tool_schema("enhance_reasoning")
  assert catalog.offer([]).tools == {} and catalog.offer([]).aliases == ()


def test_offer_errors_and_options(catalog):
  with pytest.raises(UnknownAliasError, match="'get_user_details', 'search-9'") as err:
    catalog.offer(["search-1", "get_user_details", "search-9"])
  assert isinstance(err.value, UserError)
  # callers holding non-alias names (a tau2 domain's tools) filter with `in` first
  names = ["get_user_details", "expert-1"]
  assert catalog.offer([n for n in names if n in catalog]).aliases == ("expert-1",)
  with pytest.raises(CatalogError, match="list of alias names"):
    catalog.offer("search-1")
  gated = catalog.with_options(require_document_before_answer=True, show_model_names=True).offer(["answer-2"])
  assert gated.require_document_before_answer and gated.show_model_names
  assert "answer-2 (gpt-5-mini)" in json.dumps(gated.tool_schema("answer"))
  # the ledger reads only catalog-level prices, which offering keeps
  ledger, base = Ledger.for_catalog(catalog.offer(["answer-1"])), Ledger.for_catalog(catalog)
  assert (ledger.orchestrator_price_in, ledger.orchestrator_price_out, ledger.code_usd_per_s) == \
      (base.orchestrator_price_in, base.orchestrator_price_out, base.code_usd_per_s)


def test_offer_composes_with_remap(catalog):
  # remap first (it may name aliases the sample does not offer), then offer: the remapped backend survives
  cat = catalog.remap({"answer-1": {"model": "Qwen/Qwen3-8B", "price_in": 0.1}, "search-1": {"price_in": 9}})
  cat = cat.offer(["answer-1", "search-2"])
  assert cat.backend("answer-1").model == "Qwen/Qwen3-8B" and cat.backend("answer-1").price_in == 0.1
  assert "search-1" not in cat and _enums(cat) == {"search": ["search-2"], "answer": ["answer-1"]}
  assert cat.parse_call("answer", {"model": "answer-1"}).backend.model == "Qwen/Qwen3-8B"
  # remap after offer may only name offered aliases
  assert cat.remap({"search-2": {"price_out": 1}}).backend("search-2").price_out == 1
  with pytest.raises(UnknownAliasError, match="search-1"):
    cat.remap({"search-1": {"price_in": 1}})


def test_round_trip_and_load(catalog, tmp_path):
  path = tmp_path / "cat.json"
  catalog.save(path)
  again = Catalog.load(path)
  assert again.to_dict() == catalog.to_dict()


@pytest.mark.parametrize("mutate, match", [
    (lambda d: d["aliases"]["search-1"].pop("price_out"), "missing field 'aliases.search-1.price_out'"),
    (lambda d: d["aliases"]["search-1"].pop("model"), "missing field 'aliases.search-1.model'"),
    (lambda d: d["aliases"]["search-1"].__setitem__("api_key_env", "sk-abc123-secret"), "NAME of an environment"),
    (lambda d: d["aliases"]["search-1"].__setitem__("base_url", "127.0.0.1:8000"), "base_url"),
    (lambda d: d["aliases"]["search-1"].__setitem__("price_in", "cheap"), "aliases.search-1.price_in"),
    (lambda d: d["tools"][0]["aliases"].append("search-9"), "search-9"),
    (lambda d: d["tools"][0].pop("aliases"), "missing field 'tools.search.aliases'"),
    (lambda d: d.pop("aliases"), "missing field 'aliases'"),
    (lambda d: d.__setitem__("require_document_before_answer", "yes"), "require_document_before_answer"),
    (lambda d: d.__setitem__("extra", 1), "unknown field 'extra'"),
])
def test_bad_configs_name_the_field(catalog, tmp_path, mutate, match):
  data = json.loads(json.dumps(catalog.to_dict()))
  mutate(data)
  path = tmp_path / "bad.json"
  path.write_text(json.dumps(data))
  with pytest.raises(CatalogError, match=match) as err:
    Catalog.load(path)
  assert isinstance(err.value, UserError) and str(path) in str(err.value)


def test_bad_json_and_missing_file(tmp_path):
  path = tmp_path / "broken.json"
  path.write_text('{"tools": [\n  1,\n}')
  with pytest.raises(CatalogError, match=r"not valid JSON \(line 3"):
    Catalog.load(path)
  with pytest.raises(CatalogError, match="not found"):
    Catalog.load(tmp_path / "nope.json")


def test_unknown_alias_is_a_user_error(catalog):
  with pytest.raises(UnknownAliasError) as err:
    catalog.backend("search-7")
  assert isinstance(err.value, UserError) and "search-7" in str(err.value) and "search-1" in str(err.value)


# --- ledger -------------------------------------------------------------------------------------

def test_ledger_costs_and_totals(catalog):
  ledger = Ledger.for_catalog(catalog)
  search = catalog.backend("search-1")
  rec = ledger.record_call("search", search, prompt_tokens=2000, completion_tokens=100, latency_s=3.5,
                           extra_cost_usd=0.001)
  assert rec.llm_cost_usd == pytest.approx(1.25 * 2000 / 1e6 + 10 * 100 / 1e6)
  assert rec.cost_usd == pytest.approx(rec.llm_cost_usd + 0.001)
  assert (rec.alias, rec.model) == ("search-1", "gpt-5")
  code = ledger.record_call("enhance_reasoning", catalog.backend("reasoner-3"), prompt_tokens=1000,
                            completion_tokens=500, latency_s=12.0, exec_s=2.0, ok=False, error="ZeroDivisionError")
  assert code.exec_cost_usd == pytest.approx(2.0 * 8.3e-6)
  assert code.cost_usd == pytest.approx(0.8 * 1500 / 1e6 + 2.0 * 8.3e-6)
  ledger.record_call("answer", catalog.backend("answer-math-2"), prompt_tokens=10, completion_tokens=10, latency_s=1)
  orch = ledger.record_orchestrator(prompt_tokens=5000, completion_tokens=1000)
  assert orch == pytest.approx(0.2 * 6000 / 1e6)
  t = ledger.totals()
  assert t["cost_usd"] == pytest.approx(rec.cost_usd + code.cost_usd + llm_cost(0.2, 0.2, 10, 10) + orch)
  assert t["latency_s"] == pytest.approx(16.5)
  assert t["num_calls"] == 3 and t["num_errors"] == 1
  assert t["calls_per_tool"] == {"search": 1, "enhance_reasoning": 1, "answer": 1}
  assert t["calls_per_alias"] == {"search-1": 1, "reasoner-3": 1, "answer-math-2": 1}
  assert t["orchestrator_prompt_tokens"] == 5000 and t["orchestrator_cost_usd"] == pytest.approx(orch)
  with pytest.raises(ValueError):
    ledger.record_call("search", search, prompt_tokens=-1)


def test_ledger_thread_safe_per_rollout_and_json(catalog):
  ledger = Ledger()
  backend = catalog.backend("answer-2")

  def row(r):
    for _ in range(200):
      ledger.record_call("answer", backend, prompt_tokens=100, completion_tokens=10, latency_s=0.5, rollout=r)
      ledger.record_orchestrator(10, 1, rollout=r)

  threads = [threading.Thread(target=row, args=(r,)) for r in range(8)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert len(ledger) == 1600
  per = ledger.totals_by_rollout()
  assert sorted(per) == list(range(8))
  for r in range(8):
    assert per[r]["num_calls"] == 200 and per[r]["latency_s"] == pytest.approx(100.0)
    assert per[r]["cost_usd"] == pytest.approx(200 * (llm_cost(0.25, 2, 100, 10) + llm_cost(0.2, 0.2, 10, 1)))
  again = Ledger.from_json(ledger.to_json())
  assert again.totals()["cost_usd"] == pytest.approx(ledger.totals()["cost_usd"])
  assert again.totals(3) == ledger.totals(3)
  json.dumps(ledger.totals())
