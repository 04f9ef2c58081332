"""`orchestra eval` as a user runs it: a tiny random checkpoint and scripted OpenAI-compatible servers (tools, judge,
orchestrator, tau2 user) on 127.0.0.1, real FRAMES questions, SIGKILL mid-run and resume."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO
from orchestra_jax import evaluate
from orchestra_jax.data.converters import convert_frames
from orchestra_jax.tools.catalog import Catalog
from orchestra_jax.tools.scripted_server import Reply, ScriptedServer, last_user_message

FRAMES5 = convert_frames()[:5]
IDS = [s.id for s in FRAMES5]
# What the `answer` expert says per question, and how each item should then be graded.
EXPERT = {0: "<answer>jane ballou.</answer>",  # exact after normalisation
          1: "<answer>the 37th tallest, JUDGE-YES</answer>",  # judge says yes
          2: "<answer>about 90 years JUDGE-NO</answer>",  # judge says no
          3: "<answer>JUDGE-YES france (the holders)</answer>",
          4: "<answer>87.0</answer>"}  # wrong (gold Jens Kidman) and the judge says no
EXPECTED = {IDS[0]: (True, "exact"), IDS[1]: (True, "judge"), IDS[2]: (False, "judge"), IDS[3]: (True, "judge"),
            IDS[4]: (False, "judge")}

CONFIG = '''
import ml_collections


def get_config():
  cfg = ml_collections.ConfigDict()
  cfg.seed = 0
  cfg.tokenizer_dir = ""
  cfg.eval = ml_collections.ConfigDict({
      "max_turns": 3, "max_new_tokens": 8, "max_len": 1024, "batch_size": 5, "chunk_steps": 8, "workers": 1,
      "judge_workers": 2, "read_timeout": 30.0, "max_retries": 0, "tau2_split": "base"})
  return cfg
'''


def _expert(messages, body):
  text = last_user_message(messages)
  for i, s in enumerate(FRAMES5):
    if s.question.strip() in text:
      return Reply(text=EXPERT[i], prompt_tokens=100, completion_tokens=10)
  return Reply(text="<answer>unknown</answer>", prompt_tokens=100, completion_tokens=10)


def _judge(messages, body):
  text = last_user_message(messages)
  response = text.split("[response]:")[-1].split("Your judgement")[0] if "[response]:" in text else \
      text.split("Response:")[-1].split("Is the response")[0]
  verdict = "yes" if "JUDGE-YES" in response else "no"
  if "extracted_final_answer" in text:  # the HLE-style prompt
    return f"extracted_final_answer: {response.strip()}\nreasoning: scripted.\ncorrect: {verdict}\nconfidence: 100"
  return verdict.capitalize() + "."


def _orchestrator(messages, body):
  return Reply(text="", tool_calls=[{"name": "answer", "arguments": {"model": "answer-1"}}], prompt_tokens=50,
               completion_tokens=5)


@pytest.fixture(scope="module")
def servers():
  with ScriptedServer({"*": _expert}) as tools, \
      ScriptedServer({"judge": _judge, "slow-judge": lambda m, b: Reply(text=_judge(m, b), delay_s=0.6)}) as judge, \
      ScriptedServer({"orch": _orchestrator}) as orch:
    yield {"tools": tools, "judge": judge, "orch": orch}


@pytest.fixture(scope="module")
def files(tmp_path_factory, servers):
  root = tmp_path_factory.mktemp("eval_files")
  data = Catalog.default().to_dict()
  for spec in data["aliases"].values():
    spec["base_url"], spec["api_key_env"] = servers["tools"].base_url + "/v1", None
  (root / "catalog.json").write_text(json.dumps(data))
  (root / "config.py").write_text(CONFIG)
  return {"catalog": str(root / "catalog.json"), "config": str(root / "config.py")}


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
  import jax

  from orchestra_jax import checkpoint, tokenizer
  from orchestra_jax.model import qwen3
  from orchestra_jax.model.config import tiny
  config = tiny(num_layers=1)
  path = tmp_path_factory.mktemp("ckpt") / "tiny"
  checkpoint.save_model(path, config, qwen3.init_params(config, jax.random.key(0)),
                        tokenizer_dir=str(tokenizer.qwen3_tokenizer_dir()))
  return str(path)


def _args(files, servers, out, *extra, judge="judge", quiet=True):
  return ["--config", files["config"], "--benchmark", "frames", "--limit", "5", "--out", str(out),
          "--catalog", files["catalog"], "--judge-endpoint", servers["judge"].base_url, "--judge-model", judge,
          *(["--quiet"] if quiet else []), *map(str, extra)]


def _endpoint(servers):
  return ["--orchestrator-endpoint", servers["orch"].base_url, "--orchestrator-model", "orch"]


def _lines(out):
  return [json.loads(l) for l in (Path(out) / "results.jsonl").read_text().splitlines() if l.strip()]


def test_tiny_checkpoint_eval_writes_results_summary_and_plot(tmp_path, files, servers, tiny_ckpt, capsys):
  out = tmp_path / "run"
  assert evaluate.main(_args(files, servers, out, "--model", tiny_ckpt)) == 0
  records = _lines(out)
  assert sorted(r["id"] for r in records) == sorted(IDS)
  for r in records:  # random weights never call a tool: no answer, graded without bothering the judge
    assert r["gold"] == FRAMES5[IDS.index(r["id"])].answer
    assert r["prediction"] is None and r["correct"] is False and r["judged_by"] == "no_answer"
    assert 1 <= r["turns"] <= 3 and r["finish_reason"] != "answer"
    assert r["orchestrator_tokens"]["prompt"] > 700 and r["orchestrator_cost_usd"] > 0
    assert r["cost_usd"] == pytest.approx(r["tool_cost_usd"] + r["orchestrator_cost_usd"])
    assert r["tool_counts"] == {} and r["wall_s"] > 0
  summary = json.loads((out / "summary.json").read_text())
  assert summary["n"] == 5 and summary["accuracy"] == 0.0 and summary["no_answer"] == 1.0
  assert summary["label"] == "tiny" and summary["judged_by"] == {"no_answer": 5}
  assert summary["preference_reward"] is None
  from orchestra_jax.configs import load_config
  assert "eval" in load_config(out / "run_config.json")  # the resolved config it ran with
  assert (out / "accuracy_vs_cost.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert json.loads((out / "run.json").read_text())["orchestrator"]["kind"] == "checkpoint"
  table = capsys.readouterr().out
  assert "| run | benchmark |" in table and "| tiny | frames | 5 | 0.0% |" in table

  # A rerun finds everything done: no model load, nothing appended, same summary.
  before = (out / "results.jsonl").read_bytes()
  assert evaluate.main(_args(files, servers, out, "--model", tiny_ckpt)) == 0
  assert (out / "results.jsonl").read_bytes() == before
  # The same --out for another orchestrator is refused with one line.
  assert evaluate.main(_args(files, servers, out, *_endpoint(servers))) == 2
  err = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
  assert len(err) == 1 and "another run" in err[0]


def test_endpoint_orchestrator_killed_mid_run_resumes_without_repeats(tmp_path, files, servers, capsys):
  out = tmp_path / "killed"
  cmd = [sys.executable, "-m", "orchestra_jax.evaluate", *_args(files, servers, out, *_endpoint(servers),
                                                                 judge="slow-judge")]
  servers["judge"].reset()
  child = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  results = out / "results.jsonl"
  deadline = time.time() + 60
  try:
    while time.time() < deadline and child.poll() is None:
      if results.exists() and results.read_text().count("\n") >= 2:
        break
      time.sleep(0.05)
    assert child.poll() is None, f"the run ended before it was killed: {child.stderr.read()[-2000:]}"
    child.send_signal(signal.SIGKILL)
  finally:
    child.kill()
    child.wait()
  before = results.read_bytes()
  n_before = before.count(b"\n")
  assert 2 <= n_before < 5 and before.endswith(b"\n")

  assert evaluate.main(_args(files, servers, out, *_endpoint(servers), judge="slow-judge", quiet=False)) == 0
  after = results.read_bytes()
  assert after.startswith(before)  # the earlier lines are untouched
  records = _lines(out)
  ids = [r["id"] for r in records]
  assert len(ids) == len(set(ids)) == 5 and set(ids) == set(IDS)
  assert f"{n_before} of 5 items already" in capsys.readouterr().err
  for r in records:
    assert (r["correct"], r["judged_by"]) == EXPECTED[r["id"]], r
    assert r["finish_reason"] == "answer" and r["turns"] == 1 and r["tool_counts"] == {"answer-1": 1}
    assert r["prediction"] == EXPERT[IDS.index(r["id"])][len("<answer>"):-len("</answer>")]
    assert r["orchestrator_tokens"] == {"prompt": 50, "completion": 5}
    assert r["tool_cost_usd"] > 0 and r["latency_s"] > 0
  judged = [r for r in records if r["judged_by"] == "judge"]
  assert all(r["judge_reply"] in ("Yes.", "No.") for r in judged)  # reference-style prompt by default
  prompts = [b["body"]["messages"][0]["content"] for b in servers["judge"].received if b["body"]]
  assert prompts and all("Gold answer:" in p and "extracted_final_answer" not in p for p in prompts)
  summary = json.loads((out / "summary.json").read_text())
  assert summary["accuracy"] == pytest.approx(3 / 5) and summary["tool_shares"] == {"answer-1": 1.0}
  assert summary["judged_by"] == {"exact": 1, "judge": 4}

  # A crash mid-write leaves a torn last line: it is cut off and that item is not counted.
  with open(results, "ab") as f:
    f.write(b'{"id": "frames/wiki____9", "corr')
  assert evaluate.main(_args(files, servers, out, *_endpoint(servers))) == 0
  assert results.read_bytes() == after
  assert "incomplete last line" in capsys.readouterr().err


def test_hle_judge_prompt_and_preference_reward(tmp_path, files, servers, capsys):
  tasks = tmp_path / "tasks.jsonl"
  with open(tasks, "w") as f:
    for s in FRAMES5[1:3]:
      f.write(json.dumps({"id": s.id, "kind": "qa", "question": s.question, "answer": s.answer,
                          "preference": {"outcome": 1.0, "-cost": 1.0}, "preference_text": "Prefer cheap tools."})
              + "\n")
  servers["judge"].reset()
  servers["orch"].reset()
  out = tmp_path / "hle_style"
  assert evaluate.main(_args(files, servers, out, *_endpoint(servers), "--tasks", tasks, "--judge-prompt", "hle")) == 0
  records = {r["id"]: r for r in _lines(out)}
  assert records[IDS[1]]["correct"] is True and records[IDS[2]]["correct"] is False
  assert records[IDS[1]]["judge_extracted"] == "the 37th tallest, JUDGE-YES"
  assert all(r["preference"] == {"outcome": 1.0, "-cost": 1.0} for r in records.values())
  prompts = [b["body"]["messages"][0]["content"] for b in servers["judge"].received if b["body"]]
  assert len(prompts) == 2 and all("extracted_final_answer" in p and "[correct_answer]: " in p for p in prompts)
  # The preference text reaches the orchestrator's system prompt.
  system = servers["orch"].received[0]["body"]["messages"][0]["content"]
  assert "Prefer cheap tools." in system
  summary = json.loads((out / "summary.json").read_text())
  assert summary["judge_prompt"] == "hle" and summary["n"] == 2
  # One correct item in a group of two with equal cost: outcome normalises to 1 for it, 0 for the wrong one.
  assert summary["preference_reward"] == pytest.approx(0.5)

  # --compare puts other runs in the table (and the plot); nothing is rerun.
  other = tmp_path / "other"
  other.mkdir()
  (other / "summary.json").write_text(json.dumps({**summary, "label": "baseline", "accuracy": 0.25}))
  capsys.readouterr()
  assert evaluate.main(_args(files, servers, out, *_endpoint(servers), "--tasks", tasks, "--judge-prompt", "hle",
                             "--compare", other)) == 0
  table = capsys.readouterr().out.splitlines()
  assert any(l.startswith("| orch | frames | 2 | 50.0% |") and l.endswith("| 0.500 |") for l in table), table
  assert any(l.startswith("| baseline | frames | 2 | 25.0% |") for l in table), table
  assert len(servers["judge"].received) == 2


def test_judge_prompt_parsing():
  msgs = evaluate.judge_messages("hle", "Q?", "It is 4.", "4")
  assert "[question]: Q?" in msgs[0]["content"] and "[correct_answer]: 4" in msgs[0]["content"]
  assert "Gold answer: 4" in evaluate.judge_messages("reference", "Q?", "It is 4.", "4")[0]["content"]
  reply = "extracted_final_answer: 4\nreasoning: matches.\ncorrect: **yes**\nconfidence: 90%"
  assert evaluate.parse_judge_reply("hle", reply) == (True, "4")
  assert evaluate.parse_judge_reply("hle", "<think>correct: yes?</think>\ncorrect: no") == (False, None)
  assert evaluate.parse_judge_reply("hle", "No") == (False, None)
  assert evaluate.parse_judge_reply("hle", "I cannot tell.") == (None, None)
  assert evaluate.parse_judge_reply("reference", "Yes, they are equivalent.") == (True, None)
  assert evaluate.parse_judge_reply("reference", "<think>yes or no</think> no.") == (False, None)
  assert evaluate.parse_judge_reply("reference", "maybe") == (None, None)
  with pytest.raises(evaluate.EvalError, match="judge prompt"):
    evaluate.judge_messages("nope", "q", "p", "g")


def test_tau2_mock_with_endpoint_orchestrator_and_user_simulator(tmp_path, files, servers):
  def orchestrator(messages, body):
    if not any(m.get("role") == "tool" for m in messages):
      return Reply(text="", tool_calls=[{"name": "create_task",
                                         "arguments": {"user_id": "user_1", "title": "Important Meeting"}}])
    return Reply(text="", tool_calls=[{"name": "send_message_to_user", "arguments": {
        "content": "The agent confirmed the task was created successfully"}}])

  def user(messages, body):
    spoke = sum(1 for m in messages if m.get("role") == "assistant")  # the user's own earlier messages
    return "Please create a task 'Important Meeting' for user_1." if spoke == 0 else "Thanks! ###STOP###"

  with ScriptedServer({"orch": orchestrator, "user": user}) as srv:
    out = tmp_path / "tau2"
    args = ["--config", files["config"], "--benchmark", "tau2-mock", "--limit", "1", "--out", str(out), "--catalog",
            files["catalog"], "--orchestrator-endpoint", srv.base_url, "--orchestrator-model", "orch",
            "--user-endpoint", srv.base_url, "--user-model", "user", "--quiet"]
    assert evaluate.main(args) == 0
  (record,) = _lines(out)
  assert record["id"] == "tau2/mock/create_task_1" and record["judged_by"] == "tau2"
  assert record["correct"] is True and record["score"] == 1.0 and record["finish_reason"] == "answer"
  assert record["tool_counts"] == {"create_task": 1, "send_message_to_user": 1} and record["turns"] == 2
  assert record["tau2"]["termination"] == "user_stop"


@pytest.mark.parametrize("argv,needles", [
    (["--benchmark", "nope", "--model", "x"], ["nope", "frames, hle, tau2-airline, tau2-retail, tau2-mock"]),
    (["--benchmark", "frames", "--model", "x", "--orchestrator-endpoint", "http://127.0.0.1:9",
      "--orchestrator-model", "m"], ["exactly one"]),
    (["--benchmark", "hle", "--orchestrator-endpoint", "http://127.0.0.1:9", "--orchestrator-model", "m"],
     ["--hle-path", "never shipped"]),
    (["--benchmark", "frames", "--model", "x", "--judge-prompt", "strict"], ["strict", "hle, reference"]),
    (["--benchmark", "frames", "--model", "x", "--config.eval.max_turns=0"], ["eval.max_turns"]),
    (["--benchmark", "frames", "--model", "x", "--config.eval.max_trns=3"], ["eval.max_trns"]),
    (["--benchmark", "frames", "--model", "/no/such/ckpt"], ["--model /no/such/ckpt", "not found"]),
    (["--benchmark", "tau2-mock", "--orchestrator-endpoint", "http://127.0.0.1:9", "--orchestrator-model", "m"],
     ["--user-endpoint", "--user-model"]),
])
def test_bad_arguments_are_one_clear_line(argv, needles, files, tmp_path, capsys):
  argv = [str(tmp_path) if a == "x" else a for a in argv]  # an existing (if useless) model directory
  assert evaluate.main(["--config", files["config"], "--out", str(tmp_path / "o"), *argv]) == 2
  err = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
  assert len(err) == 1 and err[0].startswith("orchestra: error:"), err
  for needle in needles:
    assert needle in err[0], err[0]
  assert not (tmp_path / "o").exists()
