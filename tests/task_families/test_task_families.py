"""The `data` task family of `orchestra train`: record loading, checks, routing and grading (orchestra_jax/task_families/data.py).

Real parts throughout: records written with the data format's writer, the shipped tau2 mock domain, a domain written
by `orchestra synth`, a scripted OpenAI-compatible server on 127.0.0.1 for the experts and the user simulator.
"""

import dataclasses
import json

import numpy as np
import pytest

from conftest import FIXTURES, REPO
from orchestra_jax import trainer
from orchestra_jax.configs import ConfigFileError, load_config
from orchestra_jax.data import converters, format as data_format
from orchestra_jax.data.format import DataFormatError
from orchestra_jax.task_families import (DATA_ENV_DEFAULTS, GradingUnavailable, data_env_config, data_environment, eval_group,
                                        load_task_records, parse_preference)
from orchestra_jax.rollout.chat_format import ToolCall
from orchestra_jax.rollout.trajectory import Trajectory
from orchestra_jax.tools.catalog import Catalog
from orchestra_jax.tools.scripted_server import ScriptedServer

BIG = str(REPO / "configs" / "orchestrator_8b.py")


@pytest.fixture(scope="module")
def server():
  with ScriptedServer({"*": {"default": {"answer": "<answer>Paris</answer>"}},
                       "user": {"default": {"answer": "Hi, please help me."}}}) as srv:
    yield srv


@pytest.fixture
def files(tmp_path, server):
  qa = [data_format.Sample(id=f"q{i}", kind="qa", question=f"What is the capital of country {i}?", answer="Paris")
        for i in range(6)]
  mock = converters.convert_tau2("mock")[:2]
  data_format.write_jsonl(tmp_path / "qa.jsonl", qa)
  data_format.write_jsonl(tmp_path / "mixed.jsonl", qa + mock)
  base = Catalog.default()
  catalog = base.remap({a: {"base_url": server.base_url + "/v1", "api_key_env": None} for a in base.aliases})
  catalog.save(tmp_path / "catalog.json")
  return tmp_path


def _cfg(files, server, overrides=()):
  """configs/orchestrator_8b.py with the env pointed at local files and the scripted server."""
  return load_config(BIG, [f"--config.env.train_data={files / 'mixed.jsonl'}", "--config.env.eval_data=",
                           f"--config.env.catalog={files / 'catalog.json'}", "--config.env.num_eval_tasks=2",
                           "--config.env.judge_endpoint=", "--config.env.judge_model=",
                           f"--config.env.user_endpoint={server.base_url}/v1", "--config.env.user_model=user",
                           "--config.prompts_per_step=2", *overrides])


def test_the_8b_config_validates_and_carries_the_papers_hyperparameters():
  cfg = load_config(BIG)
  trainer.validate(cfg)
  assert (cfg.prompts_per_step, cfg.group_size, cfg.rollout.max_turns, cfg.rollout.temperature) == (16, 8, 30, 1.0)
  assert (cfg.train.learning_rate, cfg.train.b1, cfg.train.b2, cfg.train.weight_decay, cfg.train.grad_clip_norm) == \
      (1e-6, 0.9, 0.999, 0.01, 1.0)
  assert (cfg.train.clip_low, cfg.train.clip_high, cfg.train.dual_clip, cfg.train.kl_coef) == (0.2, 0.28, 10.0, 1e-4)
  assert (cfg.train.mini_batch_size, cfg.train.ppo_epochs, cfg.reward.clip, cfg.reward.std_threshold) == (16, 1, 3.0, 0.1)
  assert cfg.reward.drop_no_final_answer and cfg.reward.require_tool_call and cfg.eval.max_turns == 50
  assert cfg.model.param_dtype == "float32" and cfg.model.dtype == "bfloat16"  # master weights (lr 1e-6)
  assert set(cfg.env.keys()) == set(DATA_ENV_DEFAULTS)


@pytest.mark.parametrize("override, needle", [
    ("--config.env.judge_endpoint=", "go together"),
    ("--config.env.expert_mode=boss", "env.expert_mode"),
    ("--config.env.judge_prompt=strict", "env.judge_prompt"),
    ("--config.env.default_preference=outcome", "FEATURE=WEIGHT"),
    ("--config.env.corpus=c.jsonl", "exclude each other"),
])
def test_bad_env_settings_are_one_line(override, needle):
  cfg = load_config(BIG, ["--config.env.retriever_url=http://127.0.0.1:9/" if "corpus" in override else
                          "--config.env.topk=10", override])
  with pytest.raises(ConfigFileError) as info:
    trainer.validate(cfg)
  assert needle in str(info.value) and "\n" not in str(info.value)


def test_bf16_weights_at_the_papers_learning_rate_are_refused():
  cfg = load_config(BIG, ["--config.model.param_dtype=bfloat16"])
  with pytest.raises(ConfigFileError, match="model.param_dtype=bfloat16 cannot hold AdamW updates"):
    trainer.validate(cfg)
  trainer.validate(load_config(BIG, ["--config.model.param_dtype=bfloat16", "--config.train.learning_rate=1e-3"]))


def test_env_section_must_be_complete_and_keys_known():
  import ml_collections
  cfg = load_config(BIG)
  cfg.unlock()
  cfg.env = ml_collections.ConfigDict({"name": "data", "train_data": ("x.jsonl",)})
  with pytest.raises(ConfigFileError, match="lacks 'eval_data'"):
    trainer.validate(cfg)
  with pytest.raises(ConfigFileError, match="unknown config key 'env.train_file'"):
    data_env_config(train_file="x.jsonl")


def test_parse_preference():
  assert parse_preference("outcome=1, -cost=0.5, expert-1=-0.5") == {"outcome": 1.0, "-cost": 0.5, "expert-1": -0.5}
  assert parse_preference("") == {}
  for bad in ("outcome", "=1", "outcome=high"):
    with pytest.raises(ConfigFileError, match="FEATURE=WEIGHT"):
      parse_preference(bad)


def test_load_task_records(files, synth_bank_dir, tmp_path):
  tasks = load_task_records([str(files / "mixed.jsonl")])
  assert [t["kind"] for t in tasks] == ["qa"] * 6 + ["tau2"] * 2
  assert tasks[0]["answer"] == "Paris" and "tau2_task" not in tasks[0]
  assert tasks[6]["domain"] == "mock" and tasks[6]["tau2_task"]["id"] and tasks[6]["tools"]
  json.dumps(tasks)  # they go to the rollout logs as they are
  assert [eval_group(t) for t in tasks[5:7]] == ["qa", "tau2-mock"]
  # a toolscale record's domain directory is relative to its file, made absolute on loading
  bank = converters.convert_toolscale(FIXTURES / "synth" / "toolscale_bank.jsonl",
                                      domain_dir=synth_bank_dir)
  rel = [dataclasses.replace(s, metadata={**s.metadata, "domain_dir": "../" + synth_bank_dir.name}) for s in bank]
  (tmp_path / "sub").mkdir()
  data_format.write_jsonl(tmp_path / "sub" / "bank.jsonl", rel)
  assert {t["domain_dir"] for t in load_task_records([str(tmp_path / "sub" / "bank.jsonl")])} == \
      {str((tmp_path / synth_bank_dir.name).resolve())}
  no_dir = [dataclasses.replace(s, metadata={}) for s in bank]
  data_format.write_jsonl(tmp_path / "nodir.jsonl", no_dir)
  with pytest.raises(DataFormatError, match="metadata.domain_dir"):
    load_task_records([str(tmp_path / "nodir.jsonl")])
  with pytest.raises(DataFormatError, match="more than one training file"):
    load_task_records([str(files / "qa.jsonl"), str(files / "mixed.jsonl")])


def test_held_out_evaluation_is_seeded_and_disjoint(files, server):
  cfg = _cfg(files, server, ["--config.env.num_eval_tasks=3"])
  with data_environment(cfg) as a:
    train_ids = [t["id"] for t in a.train_tasks]
    eval_ids = [t["id"] for g in a.eval_tasks.values() for t in g]
  assert len(eval_ids) == 3 and len(train_ids) == 5 and not set(train_ids) & set(eval_ids)
  with data_environment(cfg) as b:
    assert [t["id"] for g in b.eval_tasks.values() for t in g] == eval_ids
  cfg = _cfg(files, server, ["--config.env.num_eval_tasks=3", "--config.seed=1"])
  with data_environment(cfg) as c:
    assert sorted(t["id"] for g in c.eval_tasks.values() for t in g) != sorted(eval_ids)


@pytest.mark.parametrize("records, overrides, error, needle", [
    ("alias_map", [], DataFormatError, "'q0'"),
    ("preference", [], DataFormatError, "not among"),
    ("tools", [], DataFormatError, "no `answer` alias"),
    (None, ["--config.env.user_endpoint="], ConfigFileError, "env.user_endpoint"),
    (None, ["--config.prompts_per_step=16"], ConfigFileError, "fewer than prompts_per_step=16"),
    (None, ["--config.env.train_data="], ConfigFileError, "env.train_data"),
])
def test_data_problems_stop_before_any_rollout(files, server, records, overrides, error, needle):
  if records is not None:
    bad = {"alias_map": {"alias_map": {"answer-9": {"model": "x"}}}, "preference": {"preference": {"speed": 1.0}},
           "tools": {"tools": ["search-1"]}}[records]
    rows = [json.loads(l) for l in (files / "mixed.jsonl").read_text().splitlines()]
    rows[0].update(bad)
    (files / "mixed.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  with pytest.raises(error) as info:
    with data_environment(_cfg(files, server, overrides)):
      pass
  assert needle in str(info.value) and "\n" not in str(info.value)


def test_records_route_to_their_environment_and_are_graded(files, server):
  cfg = _cfg(files, server, ["--config.env.default_preference=outcome=1, -cost=0.5"])
  with data_environment(cfg) as setup:
    tasks = setup.train_tasks + [t for g in setup.eval_tasks.values() for t in g]
    qa = next(t for t in tasks if t["kind"] == "qa")
    tau2 = next(t for t in tasks if t["kind"] == "tau2")
    ep = setup.env.new_episode(qa, "r0")
    assert {s["function"]["name"] for s in ep.tools()} == {"search", "enhance_reasoning", "answer"}
    res = ep.call(ToolCall(name="answer", arguments={"model": "answer-1"}, raw=""))
    assert res.done and res.final_answer == "Paris"
    right, wrong = Trajectory(), Trajectory()
    right.final_answer, wrong.final_answer = "paris", "Lyon"
    assert setup.grade(qa, right, ep) == 1.0 and setup.grade(qa, wrong, ep) == 0.0
    ep2 = setup.env.new_episode(tau2, "r1")
    names = {s["function"]["name"] for s in ep2.tools()}
    assert {"call_expert", "send_message_to_user"} <= names and "answer" not in names
    assert setup.grade(tau2, Trajectory(), ep2) == 0.0  # nothing done, conversation not ended
    assert any(r["body"]["model"] == "user" for r in server.received)  # the user simulator opened it
    vec = setup.preference_vector(qa)
    assert vec.shape == (len(setup.aliases) + 3,) and list(vec[-3:]) == [1.0, 0.5, 0.0] and not vec[:-3].any()
    with_pref = dict(qa, preference={"answer-1": 1.0, "outcome": 1.0})
    assert setup.preference_vector(with_pref)[setup.aliases.index("answer-1")] == 1.0


def test_toolscale_records_run_in_their_synthesised_domain(files, server, synth_bank_dir, tmp_path):
  bank = converters.convert_toolscale(FIXTURES / "synth" / "toolscale_bank.jsonl",
                                      domain_dir=synth_bank_dir)
  qa = data_format.read_jsonl(files / "qa.jsonl")
  data_format.write_jsonl(tmp_path / "bank.jsonl", qa + bank)
  cfg = _cfg(files, server, [f"--config.env.train_data={tmp_path / 'bank.jsonl'}", "--config.env.num_eval_tasks=0"])
  with data_environment(cfg) as setup:
    task = next(t for t in setup.train_tasks if t["kind"] == "toolscale")
    ep = setup.env.new_episode(task, "b0")
    from orchestra_jax.tau2.synth_domain import load_domain_dir
    domain_tools = set(load_domain_dir(synth_bank_dir).tool_names)
    assert domain_tools and domain_tools <= {s["function"]["name"] for s in ep.tools()}
    assert setup.grade(task, Trajectory(), ep) in (0.0, 1.0)
    assert np.isfinite(setup.preference_vector(task)).all()


def test_a_failing_judge_stops_the_run_with_one_line(files):
  with ScriptedServer({"*": {"default": {"answer": "<answer>Lyon</answer>"}},
                       "judge": {"fault": "status:500"}, "user": {"default": {"answer": "Hi."}}}) as srv:
    cfg = load_config(BIG, [f"--config.env.train_data={files / 'qa.jsonl'}", "--config.env.eval_data=",
                            f"--config.env.catalog={files / 'catalog.json'}", "--config.env.num_eval_tasks=0",
                            f"--config.env.judge_endpoint={srv.base_url}/v1", "--config.env.judge_model=judge",
                            "--config.env.max_retries=0", "--config.prompts_per_step=2"])
    with data_environment(cfg) as setup:
      task = setup.train_tasks[0]
      exact = Trajectory()
      exact.final_answer = "Paris"
      assert setup.grade(task, exact, None) == 1.0  # exact match never asks the judge
      wrong = Trajectory()
      wrong.final_answer = "Lyon"
      with pytest.raises(GradingUnavailable) as info:
        setup.grade(task, wrong, None)
  message = str(info.value)
  assert "\n" not in message and srv.base_url in message and repr(task["id"]) in message and "resume" in message


def test_a_remapped_alias_calls_the_endpoint_serving_its_new_model(files, server):
  """Records name models (`alias_map: {answer-1: {model: M}}`); the call must go to the server the catalog lists
  for M, not to answer-1's own endpoint with M's name."""
  with ScriptedServer({"*": {"default": {"answer": "<answer>Rome</answer>"}}}) as other:
    base = Catalog.load(files / "catalog.json")
    model_4 = base.backend("answer-4").model
    serving = [a for a, b in base.backends.items() if b.model == model_4]  # all of them move to `other`
    base.remap({a: {"base_url": other.base_url + "/v1"} for a in serving}).save(files / "catalog2.json")
    assert "answer-1" not in serving
    rows = [json.loads(l) for l in (files / "qa.jsonl").read_text().splitlines()]
    rows[0]["alias_map"] = {"answer-1": {"model": model_4, "price_in": 9.0}}
    (files / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = _cfg(files, server, [f"--config.env.train_data={files / 'qa.jsonl'}", "--config.env.num_eval_tasks=0",
                               f"--config.env.catalog={files / 'catalog2.json'}"])
    with data_environment(cfg) as setup:
      task = next(t for t in setup.train_tasks if t["id"] == "q0")
      res = setup.env.new_episode(task, "m0").call(ToolCall(name="answer", arguments={"model": "answer-1"}, raw=""))
    assert res.final_answer == "Rome" and res.record.model == model_4
    assert other.received[-1]["body"]["model"] == model_4
