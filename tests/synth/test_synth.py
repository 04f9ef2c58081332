"""ToolScale-style synthesis end to end against the real ScriptedServer, plus its parts (orchestra_jax.synth)."""

import argparse
import json

import pytest

import scripted_synth_llm
from conftest import FIXTURES
from orchestra_jax.data import convert_toolscale, read_jsonl, sample_domain
from orchestra_jax.tau2.evaluation import evaluate
from orchestra_jax.errors import UserError
from orchestra_jax.synth import (DataModel, InvalidSpec, StageFailed, StageRunner, SynthConfig, SynthError,
                                 add_synth_parser, build_domain, compile_tools, load_domain_dir, parse_json_reply,
                                 run_synth, synthesize, verify_task)
from orchestra_jax.tools.llm_client import ChatClient
from orchestra_jax.tools.scripted_server import ScriptedServer

FIXTURES = FIXTURES / "synth"
GENERATIONS, MODEL = scripted_synth_llm.GENERATIONS, scripted_synth_llm.MODEL
_script = scripted_synth_llm.script


def _parser():
  parser = argparse.ArgumentParser(prog="orchestra")
  sub = parser.add_subparsers(dest="command", required=True)
  add_synth_parser(sub)
  return parser


@pytest.fixture(scope="module")
def server():
  with ScriptedServer(_script()) as srv:
    yield srv


@pytest.fixture(scope="module")
def synth_out(server, tmp_path_factory):
  out = tmp_path_factory.mktemp("bank")
  args = _parser().parse_args(["synth", "--endpoint", server.base_url + "/v1", "--model", MODEL, "--domain", "bank",
                               "--out", str(out), "--num-tasks", "7", "--seed", "3", "--rows-per-table", "4",
                               "--max-retries", "1", "--force"])
  assert run_synth(args) == 0
  return out


# --- end to end ---------------------------------------------------------------------------------------------
def test_report_counts_stages_and_drops(synth_out):
  report = json.loads((synth_out / "synth_report.json").read_text())
  c = report["counts"]
  assert c["rows"] == {"customers": 3, "accounts": 3} and c["rows_dropped"] == 2
  assert c["tools"] == 9 and c["intents"] == 7
  assert (c["tasks_generated"], c["tasks_verified"], c["tasks_dropped"]) == (7, 3, 4)
  assert (c["evolved_generated"], c["evolved_verified"], c["evolved_dropped"]) == (3, 2, 1)
  assert c["tasks_written"] == 5
  assert report["task_ids"] == ["task_1", "task_2", "task_6", "task_1_evolved1", "task_6_evolved1"]
  reasons = {d["id"]: d["reason"] for d in report["dropped_tasks"]}
  assert reasons["task_3"] == "gold action 0 (get_account) failed: Error: accounts acc_999 not found."
  assert reasons["task_4"] == "the task requires a write but its gold actions leave the database unchanged"
  assert reasons["task_5"] == "gold action 1 calls unknown tool 'close_all_accounts'"
  assert reasons["task_7"] == "duplicate of task_1 (same gold actions)"
  assert "does not occur in any gold action's result" in reasons["task_2_evolved1"]
  assert {d["stage"] for d in report["dropped_tasks"] if d["id"] == "task_2_evolved1"} == {"evolve"}
  assert any("platinum" in d["reason"] for d in report["dropped_rows"])
  assert any("cust_9" in d["reason"] for d in report["dropped_rows"])
  stages = report["stages"]
  assert list(stages) == ["tables", "schema", "data_model", "rows", "tools", "intents", "task", "evolve"]
  assert stages["intents"]["retries"] == 1 and stages["intents"]["attempts"] == 2
  assert stages["task"]["requests"] == 7 and stages["evolve"]["requests"] == 3
  assert [r["stage"] for r in report["rejected_replies"]] == ["intents"]
  assert report["model"] == MODEL and report["usage"]["requests"] == 18


def test_output_domain_loads_and_tasks_replay(synth_out):
  assert {p.name for p in synth_out.iterdir()} >= {"db.json", "tools.json", "policy.md", "tasks.json",
                                                   "train.jsonl", "synth_report.json"}
  domain = load_domain_dir(synth_out)
  assert domain.name == "bank" and len(domain.tasks) == 5
  assert domain.write_tools() == {"freeze_account", "update_account_status", "update_email", "open_account"}
  assert domain.policy.startswith("# Bank agent policy")
  for task in domain.tasks:
    assert domain.gold_errors(task) == ()
    env = domain.gold_replay(task)
    said = [{"role": "assistant", "content": "Here you go: " + ", ".join(task.evaluation_criteria.communicate_info)}]
    assert evaluate(env, said).reward == 1.0
    assert evaluate(domain.new_episode(task), []).reward == 0.0  # doing nothing fails
  # the write tasks change the database, and the initial state of the evolved task applies
  opened = domain.gold_replay("task_6").db.get("accounts", "acc_4")
  assert opened == {"account_id": "acc_4", "customer_id": "cust_4", "kind": "savings", "balance": 100.0,
                    "status": "active"}
  env = domain.new_episode("task_6_evolved1")
  assert env.db.get("customers", "cust_4")["email"] == "old@example.com"
  assert domain.db.get("customers", "cust_4")["email"] is None


def test_training_jsonl(synth_out):
  samples = read_jsonl(synth_out / "train.jsonl")
  assert [s.id for s in samples] == [f"synth/bank/{i}" for i in
                                     ["task_1", "task_2", "task_6", "task_1_evolved1", "task_6_evolved1"]]
  for s in samples:
    assert s.kind == "toolscale" and s.domain == "bank" and s.metadata["domain_dir"] == "."
    assert "get_account" in s.tools and any(t.startswith("expert-") for t in s.tools)
    assert s.preference_text and s.alias_map
    domain = sample_domain(s, base_dir=synth_out)
    assert domain.gold_errors(domain.task(s.task["id"])) == ()
  assert [s.metadata["writes"] for s in samples] == [False, True, True, False, True]


def test_toolscale_rows_run_on_a_synthesised_domain(synth_out):
  samples = convert_toolscale(FIXTURES / "toolscale_bank.jsonl", domain_dir=synth_out)
  domain = load_domain_dir(synth_out)
  for s in samples:
    assert s.tools == domain.tool_names
    verdict = verify_task(domain, s.task)
    assert verdict.ok, verdict.reason
  assert verify_task(domain, samples[1].task).db_changed


def test_out_dir_is_not_overwritten_without_force(server, synth_out):
  args = _parser().parse_args(["synth", "--endpoint", server.base_url, "--model", MODEL, "--domain", "bank",
                               "--out", str(synth_out)])
  with pytest.raises(UserError, match="--force"):
    run_synth(args)


def test_help_describes_every_option(capsys):
  with pytest.raises(SystemExit):
    _parser().parse_args(["synth", "--help"])
  text = capsys.readouterr().out
  for flag in ("--endpoint", "--model", "--domain", "--out", "--num-tasks", "--seed", "--api-key-env",
               "--rows-per-table", "--evolve-rounds", "--max-retries", "--force"):
    assert flag in text
  assert "environment variable" in text


def test_a_failing_endpoint_is_an_error_not_a_retry(tmp_path):
  with ScriptedServer({"m": {"fault": "status:500"}}) as srv, ChatClient(srv.base_url, "m", max_retries=0) as client:
    with pytest.raises(SynthError, match="stage tables.*HTTP 500"):
      synthesize(client, SynthConfig(domain="bank"), tmp_path / "out")
  assert not (tmp_path / "out" / "tasks.json").exists()


# --- parts ----------------------------------------------------------------------------------------------------
def test_parse_json_reply():
  assert parse_json_reply('{"a": 1}') == {"a": 1}
  assert parse_json_reply('Sure.\n```json\n{"a": [1, 2]}\n```\nDone.') == {"a": [1, 2]}
  assert parse_json_reply('```\n[1, 2]\n```') == [1, 2]
  assert parse_json_reply('<think>{"no": 1}</think>{"yes": true} trailing words') == {"yes": True}
  assert parse_json_reply('Result: {"a": {"b": "}"}} and more') == {"a": {"b": "}"}}
  with pytest.raises(InvalidSpec, match="no JSON"):
    parse_json_reply("I cannot help with that.")
  with pytest.raises(InvalidSpec, match="does not parse"):
    parse_json_reply('```json\n{"a": 1,,}\n```')


def test_stage_runner_retries_then_fails():
  script = {"m": {"rules": [{"contains": "(attempt 3)", "answer": '{"n": 3}'}], "default": {"answer": '{"n": 0}'}}}

  def positive(d):
    if d["n"] <= 0:
      raise InvalidSpec("n must be positive")
    return d["n"]

  with ScriptedServer(script) as srv, ChatClient(srv.base_url, "m", max_retries=0) as client:
    assert StageRunner(client, max_retries=2).ask("demo", "[synth:demo]", "give n", positive) == 3
    runner = StageRunner(client, max_retries=1)
    with pytest.raises(StageFailed, match="after 2 attempts: n must be positive"):
      runner.ask("demo", "[synth:demo]", "give n", positive)
    assert runner.stats["demo"].failures == 1 and runner.stats["demo"].attempts == 2
    sent = srv.received[-1]["body"]["messages"]
    assert sent[-1]["content"].startswith("[synth:demo] (attempt 2)\nYour previous reply was rejected: n must be")


_SCHEMAS = {
    "owners": {"properties": {"owner_id": {"type": "string"}, "name": {"type": "string"}},
               "required": ["owner_id", "name"]},
    "pets": {"properties": {"pet_id": {"type": "integer"}, "owner_id": {"type": "string"},
                            "species": {"type": "string", "enum": ["cat", "dog"]},
                            "tags": {"type": "array", "items": {"type": "string"}}},
             "required": ["pet_id", "owner_id", "species"]},
}
_RELATIONS = {"owners": {"primary_key": "owner_id"}, "pets": {"primary_key": "pet_id", "foreign_keys": {"owner_id": "owners"}}}


def _pets_domain(tools):
  model = DataModel.compile(_SCHEMAS, _RELATIONS)
  db = {"owners": {"o1": {"owner_id": "o1", "name": "Ann"}, "o2": {"owner_id": "o2", "name": "Bo"}},
        "pets": {"1": {"pet_id": 1.0, "owner_id": "o1", "species": "cat", "tags": ["old"]}}}
  return build_domain("pets", model, compile_tools(tools, model), db, "Be kind.")


def test_data_model_and_declarative_tools():
  model = DataModel.compile(_SCHEMAS, _RELATIONS)
  assert model.dependency_order() == ["owners", "pets"]
  with pytest.raises(InvalidSpec, match="pets.owner_id: foreign key to unknown table 'people'"):
    DataModel.compile(_SCHEMAS, {**_RELATIONS, "pets": {"primary_key": "pet_id", "foreign_keys": {"owner_id": "people"}}})
  with pytest.raises(InvalidSpec, match="'colour' is not a column of pets"):
    compile_tools([{"name": "paint", "description": "d", "operation": "update", "table": "pets", "fields": ["colour"]}],
                  model)
  with pytest.raises(InvalidSpec, match="required column 'species' of pets is neither in fields nor in set"):
    compile_tools([{"name": "add", "description": "d", "operation": "create", "table": "pets", "fields": ["owner_id"]}],
                  model)
  with pytest.raises(InvalidSpec, match="cannot change the primary key"):
    compile_tools([{"name": "re", "description": "d", "operation": "update", "table": "pets", "fields": ["pet_id"]}],
                  model)
  domain = _pets_domain([
      {"name": "get_pet", "description": "Get a pet.", "operation": "get", "table": "pets"},
      {"name": "find_pets", "description": "Find pets.", "operation": "list", "table": "pets",
       "filters": ["owner_id", "tags"]},
      {"name": "add_pet", "description": "Add a pet.", "operation": "create", "table": "pets",
       "fields": ["owner_id", "species"]},
      {"name": "remove_owner", "description": "Remove an owner.", "operation": "delete", "table": "owners"},
  ])
  env = domain.new_episode()
  assert json.loads(env.call("get_pet", {"pet_id": 1}))["species"] == "cat"
  assert json.loads(env.call("find_pets", {"tags": "OLD"}))[0]["pet_id"] == 1
  before = env.db_hash()
  assert env.call("add_pet", {"owner_id": "o9", "species": "dog"}).startswith("Error: Invalid pets row")
  assert env.call("add_pet", {"owner_id": "o1", "species": "fish"}).startswith("Error: Invalid argument")
  assert env.db_hash() == before  # failed writes change nothing
  assert json.loads(env.call("add_pet", {"owner_id": "o2", "species": "dog"}))["pet_id"] == 2  # integer keys: max + 1
  assert env.call("remove_owner", {"owner_id": "o1"}).startswith("Error: Cannot delete owners o1: pets 1 refers")
  assert env.call("remove_owner", {"owner_id": "nobody"}) == "Error: owners nobody not found."
  assert domain.db.get("pets", "2") is None  # the frozen root is untouched


def test_verify_task_reasons():
  domain = _pets_domain([
      {"name": "get_pet", "description": "Get a pet.", "operation": "get", "table": "pets"},
      {"name": "make_dog", "description": "Make a pet a dog.", "operation": "update", "table": "pets",
       "set": {"species": "dog"}},
  ])

  def task(actions, info=(), **extra):
    return {"id": "t", "user_scenario": {"instructions": "x"},
            "evaluation_criteria": {"actions": [{"name": n, "arguments": a} for n, a in actions],
                                    "communicate_info": list(info)}, **extra}

  assert verify_task(domain, task([("get_pet", {"pet_id": 1})], ["cat"])).ok
  assert verify_task(domain, task([])).reason == "the task has no gold actions"
  assert "unknown tool 'feed'" in verify_task(domain, task([("feed", {})])).reason
  assert "pets 7 not found" in verify_task(domain, task([("get_pet", {"pet_id": 7})])).reason
  assert verify_task(domain, task([("get_pet", {"pet_id": 1})]), requires_write=True).reason == \
      "the task requires a write but its gold actions leave the database unchanged"
  assert verify_task(domain, task([("make_dog", {"pet_id": 1})])).db_changed
  dog_already = task([("make_dog", {"pet_id": 1})],
                     initial_state={"initialization_data": {"agent_data": {"pets": {"1": {"species": "dog"}}}}})
  assert verify_task(domain, dog_already).reason == "its write actions leave the database unchanged"
  assert "communicate_info 'parrot'" in verify_task(domain, task([("get_pet", {"pet_id": 1})], ["parrot"])).reason
