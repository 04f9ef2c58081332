"""tau2-style environments: databases, tools, grading, user simulators (orchestra_jax.tau2).

Most tests run over the tau2 data shipped in the package (or $ORCHESTRA_DATA_DIR's copy); the data always ships,
so none of them skips.
"""

import dataclasses
import hashlib
import json
import time
from types import SimpleNamespace
from typing import Literal, Union

import pytest

from orchestra_jax.tau2 import (AgentMessage, Database, Domain, LLMUserSimulator, MissingJudgeError, ScriptedUser,
                                ToolCallRequest, UserSimulatorError, ValidationError, evaluate, evaluate_episode,
                                gold_agent, pass_hat_k, pass_hat_k_tasks, run_episode, stop_token, tau2_dir)
from orchestra_jax.tau2 import domain as domain_module
from orchestra_jax.tau2.domain import EvaluationCriteria, Task
from orchestra_jax.tau2.records import canonical_json, from_json, json_schema, to_json
from orchestra_jax.tau2.tools import safe_calculate, ToolError
from orchestra_jax.resources import read_json

TAU2 = tau2_dir()

# Tasks whose gold actions leave the database unchanged and that have no communicate_info: an empty
# conversation scores 1.0 on them (DB and COMMUNICATE both hold trivially). Mostly "refuse" / read-only tasks;
# retail 12 and 105 have a write in their gold actions, but it is refused by the tool (refund to a non-original,
# non-gift-card method; gift card balance below the exchange's price difference), as the task intends.
EMPTY_SCORES_ONE = {
  "airline": {"0", "1", "4", "5", "6", "10", "13", "26", "28", "31", "34", "36", "41", "43", "45", "46", "47", "48",
              "49"},
  "retail": {"10", "12", "25", "50", "57", "65", "105"},
}
# Gold actions that are refused on purpose (the task tests that the agent recovers); anything else would be a bug.
EXPECTED_REFUSALS = ("not found", "Non-delivered order cannot be exchanged",
                     "Payment method should be either the original payment method or a gift card",
                     "Insufficient gift card balance")


def _sha(text: str) -> str:
  return hashlib.sha256(text.encode()).hexdigest()


# --- no data needed -----------------------------------------------------------------------------------------
def test_pass_hat_k_small_cases():
  assert pass_hat_k(4, 4, 1) == 1.0 and pass_hat_k(4, 4, 4) == 1.0
  assert pass_hat_k(4, 0, 1) == 0.0
  assert pass_hat_k(4, 2, 1) == pytest.approx(0.5)
  assert pass_hat_k(4, 2, 2) == pytest.approx(1 / 6)
  assert pass_hat_k(5, 3, 2) == pytest.approx(3 / 10)
  assert pass_hat_k(4, 3, 4) == 0.0
  for bad in [(4, 5, 1), (4, 2, 0), (4, 2, 5), (3, -1, 1)]:
    with pytest.raises(ValueError):
      pass_hat_k(*bad)
  # per-task rewards: task a 2/4 successes, task b 4/4 (0.999... rounds to success, 0.5 does not)
  rewards = {"a": [1.0, 0.0, 1, 0.5], "b": [1.0, 0.9999999, True, 1.0]}
  assert pass_hat_k_tasks(rewards, 1) == pytest.approx((0.5 + 1.0) / 2)
  assert pass_hat_k_tasks(rewards, 2) == pytest.approx((1 / 6 + 1.0) / 2)


def test_calculate():
  assert safe_calculate("2 + 2") == "4.0"
  assert safe_calculate("(652.61 + 473.43) * 2 / 4") == "563.02"
  assert safe_calculate("-3 - -1") == "-2.0"
  for bad in ["2 ** 8", "__import__('os')", "1 / 0", "", "1 +"]:
    with pytest.raises(ToolError):
      safe_calculate(bad)


@dataclasses.dataclass(kw_only=True)
class _Card:
  kind: Literal["card"]
  number: str


@dataclasses.dataclass(kw_only=True)
class _Cash:
  kind: Literal["cash"]
  amount: float


@dataclasses.dataclass(kw_only=True)
class _Person:
  name: str
  age: int
  wallet: list[Union[_Card, _Cash]]
  nickname: str | None = None


def test_records_validate_and_round_trip():
  raw = {"name": "Ada", "age": 36, "wallet": [{"kind": "card", "number": "1"}, {"kind": "cash", "amount": 5}]}
  p = from_json(_Person, raw)
  assert isinstance(p.wallet[0], _Card) and isinstance(p.wallet[1], _Cash)
  assert p.wallet[1].amount == 5.0 and isinstance(p.wallet[1].amount, float)  # numbers follow the declared type
  assert to_json(p) == {**raw, "wallet": [raw["wallet"][0], {"kind": "cash", "amount": 5.0}]}  # nickname omitted
  assert from_json(_Person, {**raw, "age": 36.0}).age == 36
  for bad, where in [({**raw, "age": "x"}, "age"), ({**raw, "age": 1.5}, "age"), ({"name": "Ada", "age": 1}, "wallet"),
                     ({**raw, "extra": 1}, "extra"), ({**raw, "wallet": [{"kind": "coin"}]}, "wallet[0]")]:
    with pytest.raises(ValidationError, match=r"\w") as e:
      from_json(_Person, bad)
    assert where in str(e.value)
  schema = json_schema(_Person)
  assert schema["required"] == ["name", "age", "wallet"]
  assert schema["properties"]["wallet"]["items"]["anyOf"][0]["properties"]["kind"] == {"type": "string",
                                                                                         "enum": ["card"]}


def _small_db() -> Database:
  data = {"people": {"a": {"name": "Ada", "age": 36, "wallet": []},
                     "b": {"name": "Bob", "age": 7, "wallet": [{"kind": "cash", "amount": 2.5}]}}}
  return Database.from_json({"people": _Person}, data)


def test_database_copy_on_write_hash_and_transactions():
  root = _small_db()
  h0 = root.hash()
  assert h0 == _sha(canonical_json(root.to_json())) == root.hash(use_cache=False)
  with pytest.raises(RuntimeError):
    root.edit("people", "a")  # the root is frozen
  ep1, ep2 = root.fork(), root.fork()
  ep1.edit("people", "a").age = 37
  assert ep1.hash() != h0 and ep2.hash() == h0 and root.hash(use_cache=False) == h0
  assert ep1.hash() == _sha(canonical_json(ep1.to_json()))
  assert root.get("people", "a").age == 36
  ep1.edit("people", "a").age = 36  # back to the original value: back to the original hash
  assert ep1.hash() == h0
  # a failing transaction leaves no trace, even on records edited before it and inside it
  ep1.edit("people", "b").wallet[0].amount = 3.0
  before = ep1.hash()
  with pytest.raises(ToolError):
    with ep1.transaction():
      ep1.edit("people", "b").wallet.clear()
      ep1.put("people", "c", {"name": "Cy", "age": 1, "wallet": []})
      ep1.delete("people", "a")
      raise ToolError("boom")
  assert ep1.hash() == before and ep1.get("people", "b").wallet[0].amount == 3.0 and not ep1.has("people", "c")
  # forks of a fork are independent too
  ep3 = ep1.fork()
  ep3.edit("people", "b").name = "Bobby"
  assert ep1.get("people", "b").name == "Bob" and ep1.hash() == before
  # merge (tau2 initialization_data): objects merge, lists are replaced, new keys create records
  ep2.merge({"people": {"a": {"wallet": [{"kind": "card", "number": "9"}]}, "d": {"name": "Di", "age": 2,
                                                                                 "wallet": []}}})
  assert ep2.get("people", "a").name == "Ada" and ep2.get("people", "a").wallet[0].number == "9"
  assert ep2.has("people", "d") and root.hash() == h0


# --- shipped data -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["mock", "airline", "retail"])
def test_db_loads_validated_and_round_trips(name):
  domain = Domain.load(name)
  raw = read_json(TAU2 / name / "db.json")  # db.json or db.json.gz
  assert domain.db.to_json() == raw  # every field typed, nothing lost or added
  assert domain.db.hash() == _sha(canonical_json(raw))
  assert domain.policy.strip() and domain.tasks


def test_loading_is_cached_and_episodes_are_isolated():
  first = Domain.load("airline")
  t = time.perf_counter()
  again = Domain.load("airline")
  assert again is first and time.perf_counter() - t < 0.05
  # parsing afresh (bypassing the cache) gives the same hash
  fresh = domain_module._load_domain.__wrapped__("airline", str(TAU2))
  assert fresh is not first and fresh.db.hash() == first.db.hash()

  h0 = first.initial_db_hash()
  ep1, ep2 = first.new_episode(), first.new_episode()
  assert ep1.db_hash() == ep2.db_hash() == h0
  out = ep1.call("send_certificate", {"user_id": "mia_li_3668", "amount": 100})
  assert out.startswith("Certificate certificate_") and ep1.db_hash() != h0
  assert ep2.db_hash() == h0 and "certificate_3221322" not in ep2.call("get_user_details", {"user_id": "mia_li_3668"})
  assert first.db.hash(use_cache=False) == h0


def test_db_hash_sensitive_to_one_field():
  domain = Domain.load("retail")
  env = domain.new_episode()
  h0 = env.db_hash()
  order = env.db.edit("orders", "#W2611340")
  order.items[1].price = round(order.items[1].price + 0.01, 2)
  h1 = env.db_hash()
  assert h1 != h0 and h1 == _sha(env.db.canonical_json(use_cache=False))
  order.items[1].price = round(order.items[1].price - 0.01, 2)
  assert env.db_hash() == h0


def test_bad_arguments_give_error_text_and_do_not_mutate():
  airline = Domain.load("airline").new_episode()
  retail = Domain.load("retail").new_episode()
  book = {"user_id": "mia_li_3668", "origin": "JFK", "destination": "SEA", "flight_type": "one_way",
          "cabin": "economy", "flights": [{"flight_number": "HAT136", "date": "2024-05-20"},
                                          {"flight_number": "HAT039", "date": "2024-05-20"}],
          "passengers": [{"first_name": "Mia", "last_name": "Li", "dob": "1990-04-05"}],
          "payment_methods": [{"payment_id": "certificate_7504069", "amount": 250},
                              {"payment_id": "credit_card_4421486", "amount": 5}],
          "total_baggages": 3, "nonfree_baggages": 0, "insurance": "no"}
  cases = [
    (airline, "get_user_details", {"user_id": "nobody"}, "not found"),
    (airline, "get_user_details", {}, "Missing required argument 'user_id'"),
    (airline, "get_user_details", {"user_id": 3}, "expected a string"),
    (airline, "get_user_details", '{"user_id": ', "not valid JSON"),
    (airline, "no_such_tool", {}, "Unknown tool"),
    (airline, "call_expert", {"expert": "expert-1"}, "orchestrator"),
    (airline, "book_reservation", {**book, "payment_methods": [{"payment_id": "credit_card_4421486",
                                                                "amount": 254}]}, "does not add up"),
    (airline, "book_reservation", {**book, "payment_methods": [{"payment_id": "certificate_7504069",
                                                                "amount": 255}]}, "Not enough balance"),
    (airline, "book_reservation", {**book, "cabin": "first"}, "expected one of"),
    (airline, "book_reservation", {**book, "flights": [{"flight_number": "HAT001", "date": "2024-05-01"}]},
     "not available"),
    (airline, "book_reservation", {**book, "bogus": 1}, "Unexpected argument"),
    (airline, "update_reservation_passengers", {"reservation_id": "4WQ150", "passengers": []}, "does not match"),
    (airline, "update_reservation_baggages", {"reservation_id": "4WQ150", "total_baggages": 9,
                                              "nonfree_baggages": 4, "payment_id": "certificate_1"}, "not found"),
    (retail, "cancel_pending_order", {"order_id": "#W2611340", "reason": "no longer needed"}, "Non-pending"),
    (retail, "modify_user_address", {"user_id": "noah_brown_6181"}, "Missing required argument"),
    (retail, "return_delivered_order_items", {"order_id": "#W2611340", "item_ids": ["1"],
                                              "payment_method_id": "x"}, "Error"),
    (retail, "calculate", {"expression": "import os"}, "Invalid characters"),
  ]
  hashes = {id(airline): airline.db_hash(), id(retail): retail.db_hash()}
  for env, name, args, expected in cases:
    out = env.call(name, args)
    assert out.startswith("Error: ") and expected in out, (name, args, out)
    assert env.db_hash() == hashes[id(env)], (name, args)
    assert env.tool_log[-1].error and not env.tool_log[-1].internal
  # the same booking with correct payments succeeds, debits the certificate and takes a seat
  out = json.loads(airline.call("book_reservation", book))
  assert out["reservation_id"] == "HATHAT" and out["created_at"] == "2024-05-15T15:00:00"
  user = json.loads(airline.call("get_user_details", {"user_id": "mia_li_3668"}))
  assert "certificate_7504069" not in user["payment_methods"] and "HATHAT" in user["reservations"]
  assert json.loads(airline.call("book_reservation", {**book, "payment_methods": [
    {"payment_id": "credit_card_4421486", "amount": 255}]}))["reservation_id"] == "HATHAU"
  cancelled = json.loads(airline.call("cancel_reservation", {"reservation_id": "HATHAT"}))
  assert cancelled["status"] == "cancelled" and [p["amount"] for p in cancelled["payment_history"]] == [250, 5, -250, -5]
  assert "already cancelled" in airline.call("cancel_reservation", {"reservation_id": "HATHAT"})


def test_tool_schemas_and_gold_action_coverage():
  for name in ["mock", "airline", "retail"]:
    domain = Domain.load(name)
    schemas = domain.tool_schemas()
    names = [s["function"]["name"] for s in schemas]
    assert len(names) == len(set(names)) and "call_expert" not in names
    for s in schemas:
      fn = s["function"]
      assert s["type"] == "function" and fn["description"] and fn["parameters"]["type"] == "object"
      assert set(fn["parameters"]["required"]) <= set(fn["parameters"]["properties"])
    with_expert = domain.tool_schemas(include_call_expert=True)
    expert = with_expert[-1]["function"]
    assert expert["name"] == "call_expert" and expert["parameters"]["required"] == ["expert"]
    assert expert["parameters"]["properties"]["expert"]["enum"] == ["expert-1", "expert-2", "expert-3"]
    used = {a.name for t in domain.tasks for a in t.gold_actions}
    assert used <= set(names), used - set(names)
  assert {"book_reservation", "search_onestop_flight", "get_flight_status", "list_all_airports"} <= set(
    Domain.load("airline").tool_names)
  assert {"list_all_product_types", "modify_pending_order_payment"} <= set(Domain.load("retail").tool_names)


def _run_gold(domain, task):
  env = domain.new_episode(task)
  result = run_episode(env, gold_agent(task), ScriptedUser(["Hi, I need some help."]), max_turns=200)
  return env, result, evaluate_episode(env, result)


@pytest.mark.parametrize("name", ["airline", "retail"])
def test_gold_replay_scores_one_on_every_task(name):
  domain = Domain.load(name)
  for task in domain.tasks:
    env, result, info = _run_gold(domain, task)
    assert result.termination_reason == "user_stop" and result.stop_token == "###STOP###"
    assert info.reward == 1.0, (task.id, info.components, info.details["communicate"])
    assert not any(r.internal for r in env.tool_log), [r.result for r in env.tool_log if r.internal]
    for r in env.tool_log:  # gold calls may be refused on purpose, but never for malformed arguments
      assert not r.error or any(s in r.result for s in EXPECTED_REFUSALS), (task.id, r.name, r.result)
  assert domain.db.hash(use_cache=False) == domain.initial_db_hash()  # no episode touched the shared records


@pytest.mark.parametrize("name", ["airline", "retail"])
def test_empty_conversation_scores_zero_when_a_write_is_required(name):
  domain = Domain.load(name)
  initial = domain.initial_db_hash()
  scores_one = set()
  for task in domain.tasks:
    info = evaluate(domain.new_episode(task), [], termination_reason="user_stop")
    writes = domain.gold_db_hash(task) != initial
    if writes:
      assert info.reward == 0.0 and info.components["DB"] == 0.0, task.id
    elif info.reward == 1.0:
      scores_one.add(task.id)
    if not task.evaluation_criteria.communicate_info and not writes:
      assert info.reward == 1.0
  assert scores_one == EMPTY_SCORES_ONE[name]


def test_mock_domain():
  domain = Domain.load("mock")
  tasks = {t.id: t for t in domain.tasks}
  for task in domain.tasks:
    if not task.gold_actions:
      continue
    env, result, info = _run_gold(domain, task)
    assert info.reward == 1.0, (task.id, info.components)
    assert not env.init_warnings
  # initial states: initialization_data, initialization_actions and message_history all create task_2
  for tid in ["update_task_with_initialization_data", "update_task_with_initialization_actions",
              "update_task_with_message_history"]:
    env = domain.new_episode(tasks[tid])
    assert json.loads(env.call("update_task_status", {"task_id": "task_2", "status": "completed"}))["title"] == \
      "Project Review"
  env = domain.new_episode(tasks["update_task_with_message_history"])
  assert [m["role"] for m in env.initial_messages] == ["user", "assistant", "tool", "assistant"]
  # ENV_ASSERTION-only task (no gold actions): the agent must complete task_2
  task = tasks["update_task_with_history_and_env_assertions"]
  env = domain.new_episode(task)
  assert evaluate(env, []).reward == 0.0
  env.call("update_task_status", {"task_id": "task_2", "status": "completed"})
  assert evaluate(env, []).reward == 1.0
  # DB + ACTION with compare_args=[]: any transfer_to_human_agents call matches
  task = tasks["impossible_task_1"]
  env = domain.new_episode(task)
  assert evaluate(env, []).reward == 0.0
  env.call("transfer_to_human_agents", {"summary": "wants to delete tasks"})
  assert evaluate(env, []).reward == 1.0
  # policy: a status outside pending/completed is refused
  assert "expected one of" in env.call("update_task_status", {"task_id": "task_1", "status": "done"})


def test_nl_assertions_need_a_judge():
  domain = Domain.load("mock")
  base = domain.task("create_task_1_nl_eval")
  task = Task(id=base.id, domain="mock", user_scenario=base.user_scenario, raw=base.raw,
              evaluation_criteria=EvaluationCriteria(nl_assertions=base.evaluation_criteria.nl_assertions,
                                                     reward_basis=("DB", "NL_ASSERTION")))
  env = domain.new_episode(task)
  with pytest.raises(MissingJudgeError):
    evaluate(env, [], task=task)
  skipped = evaluate(env, [], task=task, on_missing_judge="skip")
  assert skipped.reward == 1.0 and skipped.skipped == ("NL_ASSERTION",)
  assert evaluate(env, [], task=task, on_missing_judge="zero").reward == 0.0
  assert evaluate(env, [], task=task, judge=lambda msgs, nl: [True] * len(nl)).reward == 1.0
  assert evaluate(env, [], task=task, judge=lambda msgs, nl: [True, False]).reward == 0.0


def test_scripted_user_episode_and_terminations():
  domain = Domain.load("retail")
  task = domain.task("0")
  env = domain.new_episode(task)
  user = ScriptedUser(["Hi, I am Yusuf Rossi, zip 19122."])

  def agent(messages):
    if messages[-1]["role"] == "user" and "Yusuf" in messages[-1]["content"]:
      return {"name": "find_user_id_by_name_zip", "arguments": {"first_name": "Yusuf", "last_name": "Rossi",
                                                                "zip": "19122"}}
    if messages[-1]["role"] == "tool":
      return "Your user id is " + messages[-1]["content"]
    return AgentMessage("Goodbye.", stop=True)

  result = run_episode(env, agent, user, max_turns=10)
  roles = [m["role"] for m in result.messages]
  assert roles == ["assistant", "user", "assistant", "tool", "assistant", "user"]
  assert result.messages[3]["content"] == "yusuf_rossi_9620" and result.messages[-1]["content"] == "###STOP###"
  assert result.termination_reason == "user_stop" and result.num_agent_steps == 2
  # a user with more to say: the agent ends the episode
  result = run_episode(domain.new_episode(task), agent, ScriptedUser(["Hi, I am Yusuf Rossi, zip 19122.", "Bye."]))
  assert result.termination_reason == "agent_stop" and result.messages[-1]["content"] == "Goodbye."
  assert stop_token("ok ###TRANSFER###") == "###TRANSFER###" and stop_token("fine") is None
  # the gold write was not done: DB 0; termination outside user/agent stop: reward 0 regardless
  assert evaluate_episode(env, result).reward == 0.0
  gold_env, gold_result, _ = _run_gold(domain, task)
  assert evaluate(gold_env, gold_result.messages, termination_reason="max_turns").reward == 0.0
  looping = run_episode(domain.new_episode(task), lambda m: ToolCallRequest("calculate", {"expression": "1+1"}),
                        ScriptedUser(["hi"]), max_turns=3)
  assert looping.termination_reason == "max_turns" and looping.num_agent_steps == 3
  crashing = run_episode(domain.new_episode(task), lambda m: 1 / 0, ScriptedUser(["hi"]))
  assert crashing.termination_reason == "agent_error" and "ZeroDivisionError" in crashing.error


def test_llm_user_simulator():
  domain = Domain.load("airline")
  task = domain.task("7")
  calls = []

  def chat(messages):
    calls.append(messages)
    return "I want to cancel XEHM4B." if len(calls) == 1 else "Thanks! ###STOP###"

  user = LLMUserSimulator(chat, task)
  assert "User Simulation Guidelines" in user.system_prompt and "###OUT-OF-SCOPE###" in user.system_prompt
  assert "XEHM4B" in user.system_prompt and "daiki_muller_1116" in user.system_prompt
  env = domain.new_episode(task)
  steps = iter([ToolCallRequest("get_reservation_details", {"reservation_id": "XEHM4B"}), "Here it is.", None])
  result = run_episode(env, lambda m: next(steps), user)
  assert result.termination_reason == "user_stop" and result.stop_token == "###STOP###"
  # roles are flipped for the simulator, tool traffic is hidden from it
  second = calls[1]
  assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]
  assert second[1]["content"] == "Hi! How can I help you today?" and second[3]["content"] == "Here it is."
  # ChatClient-like results: .text when ok, an error otherwise
  ok = LLMUserSimulator(lambda m: SimpleNamespace(ok=True, text=" hello ", error=None), task, guidelines="G")
  assert ok.respond([]) == "hello" and ok.system_prompt.startswith("G\n\n<scenario>")
  failing = LLMUserSimulator(lambda m: SimpleNamespace(ok=False, text="", error="HTTP 500"), task, guidelines="G")
  with pytest.raises(UserSimulatorError, match="HTTP 500"):
    failing.respond([])
  result = run_episode(domain.new_episode(task), lambda m: None, failing)
  assert result.termination_reason == "user_error"
