"""`orchestra train --check` against real endpoints (a scripted OpenAI-compatible server and a dead port), real
checkpoints and real data files."""

import socket
from pathlib import Path

import jax
import pytest

from orchestra_jax import checkpoint, cli
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
  assert not (tmp / "run" / "checkpoints").exists()  # nothing trained


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
