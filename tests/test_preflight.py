"""`orchestra train --check` against real endpoints (a scripted OpenAI-compatible server and a dead port), real
checkpoints and real data files."""

import json
import socket
from pathlib import Path

import jax
import ml_collections
import pytest

from orchestra_jax import checkpoint, cli, preflight
from orchestra_jax.data import format as data_format
from orchestra_jax.model import qwen3
from orchestra_jax.model.config import tiny
from orchestra_jax.tools.catalog import Catalog
from orchestra_jax.tools.scripted_server import ScriptedServer

ROOT = Path(__file__).resolve().parent.parent
MODEL = tiny(num_layers=1, embed_dim=32, mlp_dim=64, num_heads=2, num_kv_heads=1, head_dim=16)


def _dead_url() -> str:
  with socket.socket() as s:  # a port nobody listens on once this closes
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  return f"http://127.0.0.1:{port}/v1"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("preflight")
  base = Catalog.default()
  with ScriptedServer({m: {"default": {"answer": "ok"}} for m in {b.model for b in base.backends.values()}}
                      | {"user": {"default": {"answer": "hi"}}, "judge": {"default": {"answer": "yes"}}}) as srv:
    catalog = base.remap({a: {"base_url": srv.base_url + "/v1", "api_key_env": None} for a in base.aliases})
    catalog.save(tmp / "catalog.json")
    records = [data_format.Sample(id=f"q{i}", kind="qa", question=f"Question {i}?", answer="A") for i in range(4)]
    data_format.write_jsonl(tmp / "train.jsonl", records)
    checkpoint.save_model(tmp / "ckpt", MODEL.replace(param_dtype="bfloat16"), qwen3.init_params(MODEL, jax.random.key(0)))
    yield tmp, srv


def _argv(tmp, srv, *extra):
  fields = [f"--config.model.{k}={v}" for k, v in MODEL.to_dict().items()]
  return ["train", "--config", str(ROOT / "configs" / "orchestrator_8b.py"), "--check", *fields,
          f"--config.init_checkpoint={tmp / 'ckpt'}", f"--config.workdir={tmp / 'run'}",
          f"--config.env.train_data={tmp / 'train.jsonl'}", "--config.env.eval_data=", "--config.env.num_eval_tasks=1",
          f"--config.env.catalog={tmp / 'catalog.json'}", "--config.prompts_per_step=2",
          f"--config.env.judge_endpoint={srv.base_url}/v1", "--config.env.judge_model=judge", *extra]


def test_all_checks_pass(world, capsys):
  tmp, srv = world
  before = len(srv.received)
  assert cli.main(_argv(tmp, srv)) == 0
  out = capsys.readouterr().out
  rows = [l for l in out.splitlines() if l.startswith("| ") and not l.startswith("| check")]
  assert rows and all("| yes |" in r for r in rows), out
  assert "architecture matches" in out and "3 training tasks; evaluation: qa 1" in out
  assert "tool search-1" in out and "serves judge" in out
  probes = srv.received[before:]
  assert probes and all(r["path"] == "/v1/models" for r in probes)  # nothing but GET /v1/models: no chat calls
  assert not (tmp / "run").exists()  # nothing trained, nothing created


def test_failures_are_listed_and_exit_2(world, capsys, monkeypatch):
  tmp, srv = world
  monkeypatch.delenv("ORCHESTRA_TEST_MISSING_KEY", raising=False)
  catalog = Catalog.load(tmp / "catalog.json").remap({"search-1": {"api_key_env": "ORCHESTRA_TEST_MISSING_KEY"}})
  catalog.save(tmp / "catalog_key.json")
  argv = _argv(tmp, srv, f"--config.env.judge_endpoint={_dead_url()}", f"--config.env.catalog={tmp / 'catalog_key.json'}",
               "--config.model.mlp_dim=128")
  assert cli.main(argv) == 2
  captured = capsys.readouterr()
  table = {l.split(" | ")[0][2:]: l for l in captured.out.splitlines() if l.startswith("| ")}
  assert "| NO |" in table["init_checkpoint"] and "mlp_dim" in table["init_checkpoint"]
  judge = next(v for k, v in table.items() if k.startswith("judge:"))
  assert "| NO |" in judge and "refused the connection" in judge
  search = next(v for k, v in table.items() if k.startswith("tool search-1"))
  assert "| NO |" in search and "ORCHESTRA_TEST_MISSING_KEY is not set" in search
  err = [l for l in captured.err.splitlines() if l.strip()]
  assert len(err) == 1 and "3 of" in err[0] and "checks failed" in err[0]


def test_bad_config_stops_at_the_first_row(world, capsys):
  tmp, srv = world
  assert cli.main(_argv(tmp, srv, "--config.group_size=1")) == 2
  captured = capsys.readouterr()
  assert "| config | NO |" in captured.out and "group_size" in captured.out
  assert "init_checkpoint" not in captured.out


def _table(out: str) -> dict[str, str]:
  return {l.split(" | ")[0][2:]: l for l in out.splitlines() if l.startswith("| ")}


def test_workdir_check_creates_nothing(world, tmp_path, capsys, monkeypatch):
  tmp, srv = world
  workdir = tmp_path / "not" / "yet" / "run"
  assert cli.main(_argv(tmp, srv, f"--config.workdir={workdir}")) == 0
  row = _table(capsys.readouterr().out)["workdir"]
  assert "| yes |" in row and f"it can be created in {tmp_path}" in row
  assert not (tmp_path / "not").exists()

  def check(path) -> tuple[bool, str]:
    rows: list[preflight.Check] = []
    ok = preflight._step(rows, "workdir", lambda: preflight._workdir(ml_collections.ConfigDict({"workdir": str(path)})))
    return ok, rows[0].detail

  (tmp_path / "file").write_text("x")
  assert check(tmp_path) == (True, f"{tmp_path} exists and is writable")
  ok, detail = check(tmp_path / "file" / "sub" / "run")  # under a regular file: mkdir could never work
  assert not ok and detail == f"config key 'workdir': {tmp_path / 'file' / 'sub' / 'run'} cannot be created: " \
                              f"{tmp_path / 'file'} is not a directory"
  ok, detail = check(tmp_path / "file")
  assert not ok and "exists and is not a directory" in detail
  # chmod cannot make a directory unwritable for root (tests may run as root): the answer is faked instead
  monkeypatch.setattr(preflight.os, "access", lambda path, mode: False)
  ok, detail = check(tmp_path / "new")
  assert not ok and detail.endswith(f"cannot be created: {tmp_path} is not writable by this user")
  ok, detail = check(tmp_path)
  assert not ok and detail.endswith(f"{tmp_path} is not writable by this user")
  assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


MOCK_TASK = {"id": "t1", "user_scenario": {"instructions": "Create a task called 'Meeting' for user_1."},
             "evaluation_criteria": {"actions": [{"action_id": "a", "name": "create_task",
                                                  "arguments": {"user_id": "user_1", "title": "Meeting"}}]}}


def _env_data(tmp: Path) -> Path:
  """A data directory with a small tau2 `mock` domain (tasks t1, t2) and a synthesised `pets` domain in
  tmp/pets: what the environment records below name."""
  from orchestra_jax.tau2.datamodel import DataModel
  from orchestra_jax.tau2.synth_domain import build_domain, write_domain_dir
  from orchestra_jax.tau2.declarative_tools import compile_tools

  mock = tmp / "data" / "tau2" / "mock"
  mock.mkdir(parents=True)
  (mock / "db.json").write_text(json.dumps({
      "tasks": {"task_1": {"task_id": "task_1", "title": "Old", "status": "pending"}},
      "users": {"user_1": {"user_id": "user_1", "name": "Ann", "tasks": ["task_1"]}}}))
  (mock / "policy.md").write_text("Help the user with their tasks.\n")
  (mock / "tasks.json").write_text(json.dumps([MOCK_TASK, {**MOCK_TASK, "id": "t2"}]))
  model = DataModel.compile({"pets": {"properties": {"pet_id": {"type": "string"}, "name": {"type": "string"}},
                                      "required": ["pet_id", "name"]}},
                            {"pets": {"primary_key": "pet_id"}})
  tools = compile_tools([{"name": "get_pet", "description": "Get a pet.", "operation": "get", "table": "pets"}], model)
  write_domain_dir(tmp / "pets", build_domain("pets", model, tools, {"pets": {"p1": {"pet_id": "p1", "name": "Rex"}}},
                                              "Be kind."))
  return tmp / "data"


def _env_records(tmp: Path, name: str, *env_records: data_format.Sample) -> Path:
  qa = [data_format.Sample(id=f"q{i}", kind="qa", question=f"Question {i}?", answer="A") for i in range(4)]
  return data_format.write_jsonl(tmp / name, [*qa, *env_records])


def _tau2(id: str, task: dict, **fields) -> data_format.Sample:
  return data_format.Sample(id=id, kind="tau2", question="Create a task.", domain="mock", task=task, **fields)


def _toolscale(id: str, domain_dir: str, **fields) -> data_format.Sample:
  return data_format.Sample(id=id, kind="toolscale", question="Find my pet.", domain="pets",
                            task={**MOCK_TASK, "id": "p1", "evaluation_criteria": {}},
                            metadata={"domain_dir": domain_dir}, **fields)


def test_every_environment_record_resolves(world, tmp_path, capsys, monkeypatch):
  """A tau2 domain whose data is missing, a task id the domain lacks, a synthesised domain directory that is not
  there and a tool nobody offers each fail the `domains` row (they used to fail the first rollout, mid-run)."""
  tmp, srv = world
  data = _env_data(tmp_path)
  good = _env_records(tmp_path, "good.jsonl",
                      _tau2("by-id", {"id": "t2"}, tools=["create_task", "expert-1"]), _tau2("full", MOCK_TASK),
                      _toolscale("pet", "pets", tools=["get_pet"]))
  user = [f"--config.env.user_endpoint={srv.base_url}/v1", "--config.env.user_model=user"]
  monkeypatch.setenv("ORCHESTRA_DATA_DIR", str(data))
  assert cli.main(_argv(tmp, srv, f"--config.env.train_data={good}", *user)) == 0
  out = capsys.readouterr().out
  row = _table(out)["domains"]
  assert "| yes |" in row and "tau2-mock 2 records, toolscale-pets 1 records" in row, out
  assert "tau2 user simulator" in out

  # The pod's case: the records name a tau2 domain, the data directory does not hold it.
  monkeypatch.setenv("ORCHESTRA_DATA_DIR", str(tmp_path / "empty"))
  assert cli.main(_argv(tmp, srv, f"--config.env.train_data={good}", *user)) == 2
  captured = capsys.readouterr()
  row = _table(captured.out)["domains"]
  assert "| NO |" in row and "2 of 3 tau2/toolscale records do not resolve" in row
  assert f"tau2-mock: tau2 data for domain 'mock' not found at {tmp_path / 'empty' / 'tau2' / 'mock'}" in row
  assert "(2 records, e.g. 'by-id')" in row
  assert "1 of" in captured.err and "checks failed: domains" in captured.err

  monkeypatch.setenv("ORCHESTRA_DATA_DIR", str(data))
  bad = _env_records(tmp_path, "bad.jsonl", _tau2("gone", {"id": "t9"}), _tau2("tool", MOCK_TASK, tools=["frobnicate"]),
                     _toolscale("lost", "no-such-domain"), _toolscale("pet", "pets"))
  assert cli.main(_argv(tmp, srv, f"--config.env.train_data={bad}", *user)) == 2
  row = _table(capsys.readouterr().out)["domains"]
  assert "| NO |" in row and "3 of 4 tau2/toolscale records do not resolve" in row
  assert f"toolscale-pets: synthesised domain directory not found: {tmp_path / 'no-such-domain'}" in row
  assert f"record 'gone': domain mock has no task 't9' (2 tasks in {data / 'tau2' / 'mock' / 'tasks.json'})" in row
  assert "record 'tool': task 'tool': 'tools' lists 'frobnicate', which are not catalog aliases or tools of " \
         "domain mock" in row
