"""`Tau2Environment` end to end: tau2 domains (mock, airline) with a `ScriptedUser`, and expert models played by a
real `ScriptedServer` on 127.0.0.1 (no mocks)."""

from __future__ import annotations

import json

import pytest

from orchestra_jax.tau2 import ScriptedUser
from orchestra_jax.tau2.user import UserSimulator
from orchestra_jax.rollout.tool_calls import ToolCall
from orchestra_jax.tools.catalog import Catalog, UnknownAliasError, llm_cost
from orchestra_jax.tools.experts import QAEnvError
from orchestra_jax.tools.ledger import Ledger
from orchestra_jax.tools.scripted_server import ScriptedServer
from orchestra_jax.tools.tau2_env import SEND_MESSAGE_TOOL, Tau2Environment

TASK = "create_task_1_with_env_assertions"  # mock: create 'Important Meeting' for user_1; basis DB + ENV_ASSERTION
CREATE = {"name": "create_task", "arguments": {"user_id": "user_1", "title": "Important Meeting"}}


def _script():
  return {
      # expert-1: takes the next step itself with a tool call
      "gpt-5": {"default": {"tool_calls": [CREATE], "prompt_tokens": 400, "completion_tokens": 30}},
      # expert-2: writes the message to the user
      "gpt-5-mini": {"default": {"answer": "<think>ok</think><message>Your task Important Meeting is created."
                                           "</message>",
                                 "prompt_tokens": 250, "completion_tokens": 12}},
      "fault-500": {"fault": "status:500"},
  }


@pytest.fixture(scope="module")
def server():
  with ScriptedServer(_script()) as srv:
    yield srv


@pytest.fixture(scope="module")
def catalog(server):
  base = Catalog.default()
  return base.remap({a: {"base_url": server.base_url + "/v1", "api_key_env": None} for a in base.aliases})


def _user(*lines):
  return lambda task: ScriptedUser(list(lines))


def _env(catalog, domain="mock", user=None, **kw):
  kw.setdefault("client_options", {"read_timeout": 2.0, "max_retries": 0})
  return Tau2Environment(domain, catalog, user or _user("Please create a task 'Important Meeting' for user_1.",
                                                         "Great, thanks!"), **kw)


def _call(name, **arguments):
  return ToolCall(name=name, arguments=arguments, raw="")


def test_episode_with_tools_expert_and_user_grades(server, catalog):
  ledger = Ledger.for_catalog(catalog)
  env = _env(catalog, ledger=ledger)
  ep = env.new_episode({"id": TASK, "preference_text": "Prefer cheap experts."}, "t0")

  msgs = ep.messages()
  assert msgs[0]["role"] == "system" and "<policy>" in msgs[0]["content"]
  assert "Prefer cheap experts." in msgs[0]["content"]
  assert msgs[1] == {"role": "assistant", "content": "Hi! How can I help you today?"}
  assert msgs[2] == {"role": "user", "content": "Please create a task 'Important Meeting' for user_1."}
  names = [t["function"]["name"] for t in ep.tools()]
  assert {"create_task", "get_users", "update_task_status", "call_expert", SEND_MESSAGE_TOOL} <= set(names)
  expert_schema = {t["function"]["name"]: t for t in ep.tools()}["call_expert"]
  assert expert_schema["function"]["parameters"]["properties"]["expert"]["enum"] == ["expert-1", "expert-2", "expert-3"]

  # a domain tool call goes to the environment
  res = ep.call(_call("get_users"))
  assert res.record.error is None and '"user_1"' in res.content and not res.done
  assert res.record.cost_usd == 0

  # call_expert (delegate): expert-1 makes the tool call on the episode's database
  server.reset()
  res = ep.call(_call("call_expert", expert="expert-1"))
  assert res.record.error is None, res.content
  assert "expert-1 made 1 tool call(s):" in res.content and "create_task(" in res.content and "task_2" in res.content
  sent = server.received[-1]["body"]
  assert sent["model"] == "gpt-5" and sent["messages"][0]["role"] == "system"
  assert {t["function"]["name"] for t in sent["tools"]} >= {"create_task", "get_users"}
  assert "call_expert" not in {t["function"]["name"] for t in sent["tools"]}
  assert any(m.get("tool_calls") for m in sent["messages"])  # the conversation so far, tool calls included
  rec = res.record
  assert (rec.alias, rec.model, rec.tokens_in, rec.tokens_out) == ("expert-1", "gpt-5", 400, 30)
  assert res.record.cost_usd == pytest.approx(llm_cost(1.25, 10.0, 400, 30))

  # the user is a tool: the result is the user's reply
  res = ep.call(_call(SEND_MESSAGE_TOOL, content="I created task_2 for you."))
  assert res.content == "Great, thanks!" and not res.done and res.record.error is None

  # expert-2 writes to the user; the user's stop ends the episode
  res = ep.call(_call("call_expert", expert="expert-2"))
  assert "expert-2 said to the user: Your task Important Meeting is created." in res.content
  assert "###STOP###" in res.content
  assert res.done and res.final_answer == "Your task Important Meeting is created."
  assert res.record.cost_usd == pytest.approx(llm_cost(0.25, 2.0, 250, 12))
  assert ep.termination_reason == "user_stop"

  info = ep.grade_info()
  assert info.reward == 1.0, info
  assert info.components["DB"] == 1.0 and info.components["ENV_ASSERTION"] == 1.0
  assert ep.grade() == 1.0

  # after the end: an error, still done
  res = ep.call(_call("get_users"))
  assert res.content.startswith("Error: the conversation has ended (user_stop)") and res.done and res.record.error

  totals = ledger.totals("t0")
  assert totals["num_calls"] == 5 and totals["num_errors"] == 1
  assert totals["calls_per_tool"] == {"get_users": 2, "call_expert": 2, SEND_MESSAGE_TOOL: 1}
  assert totals["calls_per_alias"] == {"expert-1": 1, "expert-2": 1}
  assert totals["cost_usd"] == pytest.approx(llm_cost(1.25, 10.0, 400, 30) + llm_cost(0.25, 2.0, 250, 12))

  # the rebuilt prompt: the opening plus the orchestrator's calls and results
  rebuilt = ep.rebuild_messages()
  assert rebuilt[:3] == msgs
  assert rebuilt[3]["tool_calls"][0]["name"] == "get_users" and rebuilt[4]["role"] == "tool"
  assert len(rebuilt) == 3 + 2 * 5
  env.close()


def test_orchestrator_acts_alone_and_unfinished_scores_zero(catalog):
  env = _env(catalog)
  ep = env.new_episode(TASK, "t1")
  res = ep.call(_call("create_task", user_id="user_1", title="Important Meeting"))
  assert res.record.error is None and "task_2" in res.content
  assert ep.grade() == 0.0  # the conversation never ended cleanly (as tau2: reward 0)
  assert ep.grade_info().note and "incomplete" in ep.grade_info().note
  assert ep.grade_info(termination_reason="user_stop").reward == 1.0
  # wrong database: 0 even after a clean end
  ep2 = env.new_episode({"id": TASK}, "t2")
  ep2.call(_call("create_task", user_id="user_1", title="Wrong title"))
  ep2.call(_call(SEND_MESSAGE_TOOL, content="Done."))
  res = ep2.call(_call(SEND_MESSAGE_TOOL, content="Anything else?"))
  assert res.done and res.content == "###STOP###" and ep2.grade() == 0.0
  env.close()


def test_errors_become_tool_responses(catalog):
  ledger = Ledger.for_catalog(catalog)
  env = _env(catalog, ledger=ledger)
  ep = env.new_episode({"id": TASK, "alias_map": {"expert-3": "fault-500"}}, "t3")
  cases = [
      (_call("call_expert", expert="expert-9"), "is not one of"),
      (_call("call_expert"), "requires the argument 'expert'"),
      (_call("call_expert", expert="expert-3"), "HTTP 500"),
      (_call("delete_everything"), "unknown tool 'delete_everything'"),
      (_call("update_task_status", task_id="task_99", status="completed"), "Task task_99 not found"),
      (_call("create_task", user_id="user_1"), "title"),
      (_call(SEND_MESSAGE_TOOL), "requires a non-empty string argument 'content'"),
  ]
  for call, phrase in cases:
    res = ep.call(call)
    assert res.content.startswith("Error: ") and phrase in res.content, (call.name, res.content)
    assert res.record.error and not res.done
    assert not ledger.calls[-1].ok
  assert ledger.calls[2].model == "fault-500" and ledger.calls[2].alias == "expert-3"
  assert ep.domain_env.db_hash() == env.domain.initial_db_hash()  # nothing was changed
  env.close()


def test_advice_mode_executes_nothing(catalog):
  env = _env(catalog, expert_mode="advice")
  ep = env.new_episode(TASK, "t4")
  res = ep.call(_call("call_expert", expert="expert-1"))
  assert "Suggested tool call: create_task(" in res.content and res.record.error is None
  assert ep.domain_env.db_hash() == env.domain.initial_db_hash()
  env.close()


class _BrokenUser(UserSimulator):
  def __init__(self):
    self.calls = 0

  def respond(self, conversation):
    self.calls += 1
    if self.calls > 1:
      raise RuntimeError("simulator endpoint down")
    return "Hello, I need help."


def test_user_simulator_failure_and_agent_stop(catalog):
  env = _env(catalog, user=lambda task: _BrokenUser())
  ep = env.new_episode(TASK, "t5")
  res = ep.call(_call(SEND_MESSAGE_TOOL, content="How can I help?"))
  assert res.done and res.record.error and "simulator endpoint down" in res.content
  assert res.final_answer is None and ep.termination_reason == "user_error" and ep.grade() == 0.0
  ep2 = env.new_episode(TASK, "t6")
  res = ep2.call(_call(SEND_MESSAGE_TOOL, content="Goodbye. ###STOP###"))
  assert res.done and ep2.termination_reason == "agent_stop" and res.final_answer == "Goodbye. ###STOP###"
  env.close()


def test_message_history_opening(catalog):
  env = _env(catalog, user=_user("Also mark it completed please."))
  ep = env.new_episode("update_task_with_message_history", "t7")
  msgs = ep.messages()
  assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "assistant", "user"]
  assert msgs[2]["tool_calls"][0]["name"] == "create_task" and msgs[-1]["content"] == "Also mark it completed please."
  env.close()


def test_airline_gold_actions_through_the_orchestrator_api(catalog):
  env = _env(catalog, domain="airline", user=_user("I want to change my reservation.", "ok"))
  task = env.domain.task("7")
  ep = env.new_episode({"id": "7"}, "t8")
  assert "book_reservation" in [t["function"]["name"] for t in ep.tools()]
  for action in task.gold_actions:
    res = ep.call(ToolCall(name=action.name, arguments=json.loads(json.dumps(dict(action.arguments))), raw=""))
    assert res.record.error is None, res.content
  info = " ".join(task.evaluation_criteria.communicate_info)
  assert ep.call(_call(SEND_MESSAGE_TOOL, content=f"All done: {info}.")).content == "ok"
  res = ep.call(_call(SEND_MESSAGE_TOOL, content="Anything else?"))
  assert res.done and ep.grade() == 1.0
  env.close()


def test_bad_settings(catalog):
  with pytest.raises(QAEnvError):
    Tau2Environment("mock", catalog, _user(), expert_mode="auto")
  with pytest.raises(ValueError):
    Tau2Environment("nowhere", catalog, _user())


# --- per-sample offered tools (the record's `tools` field) ---------------------------------------------

MOCK_TOOLS = ["create_task", "get_users", "update_task_status", "transfer_to_human_agents"]


def _names(ep):
  return [t["function"]["name"] for t in ep.tools()]


def test_offered_experts_restrict_call_expert(server, catalog):
  ledger = Ledger.for_catalog(catalog)
  env = _env(catalog, ledger=ledger)
  ep = env.new_episode({"id": TASK, "tools": MOCK_TOOLS + ["expert-2"]}, "o1")
  assert _names(ep) == MOCK_TOOLS + ["call_expert", SEND_MESSAGE_TOOL]
  schema = {t["function"]["name"]: t for t in ep.tools()}["call_expert"]
  assert schema["function"]["parameters"]["properties"]["expert"]["enum"] == ["expert-2"]
  assert "expert-1" not in json.dumps(ep.tools())
  before = len(server.received)
  res = ep.call(_call("call_expert", expert="expert-1"))
  assert res.content.startswith("Error: ") and "is not one of expert-2" in res.content and res.record.error
  assert len(server.received) == before  # refused before any request
  res = ep.call(_call("call_expert", expert="expert-2"))
  assert res.record.error is None and "expert-2 said to the user" in res.content
  assert server.received[-1]["body"]["model"] == "gpt-5-mini"
  totals = ledger.totals("o1")
  assert totals["calls_per_alias"] == {"expert-1": 1, "expert-2": 1} and totals["num_errors"] == 1
  assert totals["cost_usd"] == pytest.approx(llm_cost(0.25, 2.0, 250, 12))
  env.close()


def test_offered_and_remapped_expert(server, catalog):
  env = _env(catalog)
  ep = env.new_episode({"id": TASK, "tools": ["expert-3"], "alias_map": {"expert-3": {"model": "gpt-5",
                                                                                      "price_in": 2.0}}}, "o2")
  assert _names(ep) == MOCK_TOOLS + ["call_expert", SEND_MESSAGE_TOOL]  # no domain tool listed: all of them
  res = ep.call(_call("call_expert", expert="expert-3"))
  assert server.received[-1]["body"]["model"] == "gpt-5" and res.record.error is None, res.content
  assert (res.record.model, res.record.alias) == ("gpt-5", "expert-3")
  assert res.record.cost_usd == pytest.approx(llm_cost(2.0, 0.8, 400, 30))
  env.close()


def test_domain_tools_only_keeps_every_expert(server, catalog):
  env = _env(catalog)
  ep = env.new_episode({"id": TASK, "tools": list(MOCK_TOOLS)}, "o3")  # as convert_tau2 writes it
  assert _names(ep) == MOCK_TOOLS + ["call_expert", SEND_MESSAGE_TOOL]
  schema = next(t for t in ep.tools() if t["function"]["name"] == "call_expert")
  assert schema["function"]["parameters"]["properties"]["expert"]["enum"] == ["expert-1", "expert-2", "expert-3"]
  res = ep.call(_call("call_expert", expert="expert-2"))
  assert res.record.error is None and res.record.alias == "expert-2", res.content
  env.close()


def test_offered_domain_tools_bind_orchestrator_and_expert(server, catalog):
  env = _env(catalog)
  ep = env.new_episode({"id": TASK, "tools": ["get_users", "expert-1"]}, "o4")
  assert _names(ep) == ["get_users", "call_expert", SEND_MESSAGE_TOOL]
  res = ep.call(_call("create_task", user_id="user_1", title="Important Meeting"))
  assert res.content == ("Error: unknown tool 'create_task'; available: get_users, call_expert, "
                         f"{SEND_MESSAGE_TOOL}") and res.record.error
  assert ep.call(_call("get_users")).record.error is None
  # the delegated expert sees and runs only the offered domain tools (expert-1 is scripted to create_task)
  res = ep.call(_call("call_expert", expert="expert-1"))
  assert {t["function"]["name"] for t in server.received[-1]["body"]["tools"]} == {"get_users"}
  assert "create_task(" in res.content and "unknown tool 'create_task'" in res.content
  assert ep.domain_env.db_hash() == env.domain.initial_db_hash()
  env.close()


def test_offered_tools_unknown_names_raise(catalog):
  env = _env(catalog)
  with pytest.raises(UnknownAliasError, match=r"'get_user_details', 'expert-9'.*tools of domain mock"):
    env.new_episode({"id": TASK, "tools": ["get_users", "get_user_details", "expert-9"]}, "o5")
  with pytest.raises(QAEnvError, match="'tools' must be a list"):
    env.new_episode({"id": TASK, "tools": "expert-1"}, "o6")
  env.close()
