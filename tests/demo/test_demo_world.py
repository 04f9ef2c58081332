"""The CPU demo's world: real scripted servers on 127.0.0.1, the real sandbox, the real Qwen3 tokenizer."""

import concurrent.futures as cf
import json

import numpy as np
import pytest

from orchestra_jax.demo import world as W
from orchestra_jax.rollout.chat_format import ToolCall, encode_prompt, parse_assistant_turn, validate_tool_calls
from orchestra_jax.rollout.environment import ToolEnvironment
from orchestra_jax.reward.features import feature_names


@pytest.fixture(scope="module")
def world():
  with W.DemoWorld(seed=0) as w:
    yield w


@pytest.fixture(scope="module")
def tasks_by_kind():
  return {k: W.make_tasks(1, seed=3, kinds=[k])[0] for k in W.KINDS}


def _call(env, task, arguments, name="answer"):
  ep = env.new_episode(task, "r0")
  return ep, ep.call(ToolCall(name=name, arguments=arguments, raw=""))


EXPECTED_RIGHT = {"calc": {"arithmetic"}, "small": {"arithmetic", "capital"}, "expert": set(W.KINDS)}


def test_alias_correctness_per_kind(world, tasks_by_kind):
  env = world.env()
  assert isinstance(env, ToolEnvironment)
  assert world.aliases == ["calc", "small", "expert"]
  for kind, task in tasks_by_kind.items():
    for alias in world.aliases:
      ep, res = _call(env, task, {"model": alias})
      assert res.done and res.record.error is None, (kind, alias, res.content)
      assert res.final_answer == res.content == res.record.result
      want = 1.0 if kind in EXPECTED_RIGHT[alias] else 0.0
      assert world.grade(task, res.final_answer) == want, (kind, alias, res.final_answer, task["answer"])
      rec = res.record
      assert (rec.name, rec.alias, rec.model) == ("answer", alias, W.CATALOG[alias].model)
      assert (rec.tokens_in, rec.tokens_out) == (W.CATALOG[alias].tokens_in, W.CATALOG[alias].tokens_out)
      assert ep.timings[-1]["wall_s"] > 0 and ep.timings[-1]["ok"]
  # calc's answer really came out of the sandbox
  calc_timings = [t for t in world.call_log if t["alias"] == "calc"]
  assert calc_timings and all(t["sandbox_wall_s"] and t["sandbox_wall_s"] > 0 for t in calc_timings)
  assert world.grade(tasks_by_kind["capital"], None) == 0.0


def test_costs_ordered_and_deterministic_latency_catalog(world, tasks_by_kind):
  env = world.env()
  task = tasks_by_kind["arithmetic"]
  costs, lats = {}, {}
  for alias in world.aliases:
    recs = [_call(env, task, {"model": alias})[1].record for _ in range(2)]
    # the other kinds' records carry the same numbers (scripted tokens, nominal execution time)
    recs += [_call(env, tasks_by_kind[k], {"model": alias})[1].record for k in ("capital", "element")]
    assert len({r.cost_usd for r in recs}) == 1, [r.cost_usd for r in recs]
    assert len({r.latency_s for r in recs}) == 1
    costs[alias], lats[alias] = recs[0].cost_usd, recs[0].latency_s
    assert costs[alias] == pytest.approx(world.call_costs[alias], rel=1e-12)
    assert lats[alias] == world.latencies[alias] == W.CATALOG[alias].latency_s
  assert costs["calc"] < costs["small"] < costs["expert"]
  assert 10 <= costs["expert"] / costs["small"] <= 50
  # calc = LLM tokens at its price + nominal sandbox seconds at 8.3e-6 $/s
  c = W.CATALOG["calc"]
  assert costs["calc"] == pytest.approx((c.tokens_in * 0.1 + c.tokens_out * 0.1) / 1e6 + W.CALC_EXEC_S * 8.3e-6)
  assert world.prices == {"calc": (0.1, 0.1), "small": (0.25, 2.0), "expert": (1.25, 10.0)}
  # measured wall time is kept apart from the catalog latency
  assert all(t["wall_s"] < 5 for t in world.call_log)


def test_concurrent_calls(world):
  env = world.env()
  tasks = W.make_tasks(9, seed=5)
  jobs = [(t, a) for t in tasks for a in ("small", "expert")] + [(tasks[0], "calc"), (tasks[1], "calc")]
  with cf.ThreadPoolExecutor(8) as pool:
    results = list(pool.map(lambda ta: (ta, _call(env, ta[0], {"model": ta[1]})[1]), jobs))
  for (task, alias), res in results:
    assert res.done and res.record.alias == alias
    assert world.grade(task, res.final_answer) == (1.0 if task["kind"] in EXPECTED_RIGHT[alias] else 0.0)


@pytest.mark.parametrize("name,arguments,needle", [
    ("answer", {"model": "gpt-9"}, "unknown model 'gpt-9'"),
    ("answer", {}, "needs the argument 'model'"),
    ("answer", {"model": 3}, "must be a string"),
    ("answer", {"model": "calc", "extra": 1}, "unexpected 'extra'"),
    ("search", {"model": "calc"}, "unknown tool 'search'"),
])
def test_bad_calls_are_error_results(world, tasks_by_kind, name, arguments, needle):
  ep, res = _call(world.env(), tasks_by_kind["capital"], arguments, name=name)
  assert not res.done and res.final_answer is None
  assert res.content.startswith("Error: ") and needle in res.content
  if name == "answer" and "extra" not in arguments:
    assert "calc, small, expert" in res.content  # the message lists the valid choices
  rec = res.record
  assert rec.error and rec.alias is None and rec.cost_usd == 0.0 and rec.latency_s == W.ERROR_LATENCY_S


def test_tasks_deterministic_and_well_formed():
  a, b = W.make_tasks(30, seed=7), W.make_tasks(30, seed=7)
  assert a == b
  assert a != W.make_tasks(30, seed=8)
  assert len({t["id"] for t in a}) == 30
  assert sorted(t["kind"] for t in a) == sorted(list(W.KINDS) * 10)  # balanced
  prefixes = {"arithmetic": "Compute ", "capital": "What is the capital of ",
              "element": "What is the atomic number of "}
  for t in a:
    assert set(t) >= {"id", "kind", "question", "answer", "preference", "preference_text"}
    assert t["question"].startswith(prefixes[t["kind"]])
    assert W.solve(t["question"]) == (t["kind"], t["answer"])
    assert t["preference_name"] in W.PRESETS and t["preference_text"] == W.PRESET_TEXT[t["preference_name"]]
  assert {t["preference_name"] for t in a} == set(W.PRESETS)
  only = W.make_tasks(5, seed=1, kinds=["element"], preference="cheap")
  assert all(t["kind"] == "element" and t["preference_name"] == "cheap" for t in only)
  custom = W.make_tasks(2, seed=1, preference={"outcome": 1.0, "-latency": 1.0})[0]
  assert custom["preference_name"] is None and "fast" in custom["preference_text"].lower()
  with pytest.raises(ValueError):
    W.make_tasks(3, seed=0, kinds=["poetry"])
  with pytest.raises(ValueError):
    W.make_tasks(3, seed=0, preference="lavish")


def test_preference_vectors_and_prompt():
  aliases = list(W.ALIASES)
  assert feature_names(aliases) == ["calc", "small", "expert", "outcome", "-cost", "-latency"]
  cheap, expert = (W.make_tasks(1, 0, preference=p)[0] for p in ("cheap", "expert"))
  np.testing.assert_array_equal(W.preference_vector(cheap, aliases), [0, 0, 0, 1, 1, 0])
  np.testing.assert_array_equal(W.preference_vector(expert, aliases), [0, 0, 1, 1, 0, 0])
  assert W.preference_vector(cheap).dtype == np.float32
  msgs = W.build_messages(cheap)
  assert msgs[0]["role"] == "system" and "Prefer cheap tools." in msgs[0]["content"]
  assert msgs[1] == {"role": "user", "content": cheap["question"]}
  desc = W.tool_schemas()[0]["function"]["description"]
  for alias, spec in W.CATALOG.items():
    assert f"{alias}: {spec.price_in:g}/{spec.price_out:g}, {spec.latency_s:g} s" in desc
  assert W.tool_schemas()[0]["function"]["parameters"]["properties"]["model"]["enum"] == aliases


def test_sft_examples(world):
  from orchestra_jax.tokenizer import load_tokenizer
  tok = load_tokenizer(None)
  tasks = W.make_tasks(12, seed=2)
  examples = W.sft_examples(tok, tasks, seed=4)
  assert examples == W.sft_examples(tok, tasks, seed=4)
  seen = set()
  env = world.env()
  for task, (ids, mask) in zip(tasks, examples):
    assert len(ids) == len(mask) and set(mask) == {0, 1}
    first = mask.index(1)
    assert all(mask[first:]) and not any(mask[:first])  # mask covers exactly the assistant suffix
    ep = env.new_episode(task, "sft")
    assert ids[:first] == encode_prompt(tok, ep.messages(), ep.tools(), add_generation_prompt=True)
    text = tok.decode(ids[first:])
    parsed = parse_assistant_turn(text, assume_closed=True)
    assert len(parsed.tool_calls) == 1 and not parsed.errors
    call = parsed.tool_calls[0]
    assert text == W.assistant_text(call.arguments["model"])
    assert text == '<tool_call>\n' + json.dumps({"name": "answer", "arguments": {"model": call.arguments["model"]}}) \
        + '\n</tool_call>'
    assert not validate_tool_calls([call], ep.tools())
    seen.add(call.arguments["model"])
  assert seen == set(W.ALIASES)  # random aliases, all of them over 12 draws
  assert len(examples[0][0]) < 300  # the prompt stays short for the CPU demo
