"""`orchestra train` on the paper's setting: configs/orchestrator_8b.py's training sections, `env.name="data"`.

The model is shrunk to a tiny Qwen3 (every other section of the 8B config is kept: mesh with tensor=4, rebuild mode,
recomputed old log-probs, KL, the reward filters), the experts and the tau2 user are a real scripted
OpenAI-compatible server on 127.0.0.1, the QA records are real FRAMES questions and the eval set mixes QA with
tau2 mock tasks. Random weights never call a tool, so the starting checkpoint is a tiny model overfit (in this
test) to answer every prompt with `answer(model="answer-1")`, sampled greedily (top_k=1). The expert alternates right and wrong answers per
question, so every GRPO group of 4 holds exactly 2 correct rollouts: accuracy, kept groups and turn samples of
each step are known exactly.
"""

import collections
import dataclasses
import json
import subprocess
import sys
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from orchestra_jax import checkpoint as model_ckpt
from orchestra_jax import tokenizer as tokenizer_lib
from orchestra_jax.data import converters, format as data_format
from orchestra_jax.model import qwen3
from orchestra_jax.model.config import tiny
from orchestra_jax.rollout import chat_format
from orchestra_jax.tools.catalog import Catalog
from orchestra_jax.tools.qa_env import QAEnvironment
from orchestra_jax.tools.scripted_server import ScriptedServer

ROOT = Path(__file__).resolve().parent.parent
CALL = '<tool_call>\n{"name": "answer", "arguments": {"model": "answer-1"}}\n</tool_call>'
MODEL = tiny(num_layers=1, embed_dim=32, mlp_dim=64, num_heads=2, num_kv_heads=1, head_dim=16)


class AlternatingExperts:
  """Every model of the catalog: the n-th answer request about a question is right for even n, wrong for odd n."""

  def __init__(self, gold: dict[str, str]):
    self.gold, self.calls = gold, collections.Counter()
    self.lock = threading.Lock()

  def __call__(self, messages, body):
    text = " ".join(str(m.get("content")) for m in messages)
    question = next((q for q in self.gold if q in text), None)
    if question is None:
      return "<answer>unknown</answer>"
    with self.lock:
      n = self.calls[question]
      self.calls[question] += 1
    return f"<answer>{self.gold[question] if n % 2 == 0 else 'certainly not that'}</answer>"


def _overfit_policy(tok, questions, out_dir: Path, steps: int = 300):
  """A tiny model that answers every QA prompt with CALL (greedy), saved as an orchestra checkpoint."""
  env = QAEnvironment(Catalog.default())
  target = tok.encode(CALL + chat_format.IM_END)
  seqs = []
  for i, q in enumerate(questions):
    ep = env.new_episode({"id": str(i), "question": q}, "sft")
    prompt = chat_format.encode_prompt(tok, ep.messages(), ep.tools(), add_generation_prompt=True, enable_thinking=True)
    seqs.append((prompt + target, len(prompt)))
  width = max(len(t) for t, _ in seqs)
  tokens = np.zeros((len(seqs), width), np.int32)
  for i, (t, _) in enumerate(seqs):
    tokens[i, :len(t)] = t
  rows = np.concatenate([np.full(len(t) - p, i) for i, (t, p) in enumerate(seqs)])
  cols = np.concatenate([np.arange(p - 1, len(t) - 1) for t, p in seqs])  # hidden at c predicts token c + 1
  targets = jnp.asarray(tokens[rows, cols + 1])
  segments = jnp.asarray((np.arange(width)[None] < np.array([len(t) for t, _ in seqs])[:, None]).astype(np.int32))
  tokens_j = jnp.asarray(tokens)

  def loss_fn(params):
    hidden, _ = qwen3.forward(MODEL, params, tokens_j, segment_ids=segments, return_hidden=True)
    logits = hidden[rows, cols] @ params["embedding"].T  # tied head: [N, V]
    return -jnp.take_along_axis(jax.nn.log_softmax(logits), targets[:, None], -1).mean()

  opt = optax.adam(1e-2)
  params = qwen3.init_params(MODEL, jax.random.key(0))
  state = opt.init(params)

  @jax.jit
  def step(params, state):
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, state = opt.update(grads, state, params)
    return optax.apply_updates(params, updates), state, loss

  for i in range(steps):
    params, state, loss = step(params, state)
    if i % 10 == 9 and float(loss) < 0.02:  # every token's argmax is right: enough for greedy (top_k=1) rollouts
      break
  assert float(loss) < 0.02, f"the tiny policy did not learn the call (loss {float(loss)})"
  model_ckpt.save_model(out_dir, MODEL, params)
  return out_dir


def _model_overrides():
  return [f"--config.model.{k}={v}" for k, v in dataclasses.asdict(MODEL).items()]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("data_env")
  frames = converters.convert_frames()
  train, held = frames[:6], frames[6:8]
  mock = converters.convert_tau2("mock")[:2]
  data_format.write_jsonl(tmp / "train.jsonl", train)
  data_format.write_jsonl(tmp / "eval.jsonl", held + mock)
  gold = {s.question: s.answer for s in train + held}
  experts = AlternatingExperts(gold)
  server = ScriptedServer({"*": experts, "user": {"default": {"answer": "Hi, I need help with my task."}}}).start()
  base = Catalog.default()
  catalog = base.remap({a: {"base_url": server.base_url + "/v1", "api_key_env": None} for a in base.aliases})
  catalog.save(tmp / "catalog.json")
  tok = tokenizer_lib.load_tokenizer(None)
  policy = _overfit_policy(tok, [s.question for s in train + held], tmp / "policy")
  yield {"tmp": tmp, "server": server, "experts": experts, "policy": policy}
  server.close()


def test_8b_config_trains_on_data_records(setup):
  tmp, server = setup["tmp"], setup["server"]
  workdir = tmp / "run"
  cmd = [sys.executable, "-m", "orchestra_jax.cli", "train", "--config", "configs/orchestrator_8b.py", "--quiet",
         *_model_overrides(), f"--config.init_checkpoint={setup['policy']}", f"--config.workdir={workdir}",
         f"--config.env.train_data={tmp / 'train.jsonl'}", f"--config.env.eval_data={tmp / 'eval.jsonl'}",
         f"--config.env.catalog={tmp / 'catalog.json'}", "--config.env.judge_endpoint=", "--config.env.judge_model=",
         f"--config.env.user_endpoint={server.base_url}/v1", "--config.env.user_model=user",
         "--config.env.num_eval_tasks=0", "--config.steps=2", "--config.prompts_per_step=2", "--config.group_size=4",
         "--config.rollout.max_turns=2", "--config.rollout.max_new_tokens=32", "--config.rollout.max_len=4096",
         # top_k=1: greedy rollouts, so every rollout makes the overfit call and group outcomes are exact.
         "--config.rollout.top_k=1", "--config.rollout.batch_size=8", "--config.rollout.chunk_steps=8", "--config.rollout.tool_workers=8",
         "--config.train.mini_batch_size=8", "--config.train.logprob_window=32", "--config.train.seq_bucket=256",
         "--config.checkpoint_every=1", "--config.eval_every=100"]
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  records = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  train = {r["step"]: r for r in records if r["kind"] == "train"}
  assert sorted(train) == [1, 2]
  for r in train.values():
    # 2 tasks x 4 rollouts, each one `answer` turn; the expert is right for exactly 2 rollouts per task.
    assert r["accuracy"] == 0.5 and r["kept"] == 1.0 and r["turn_samples"] == 8 and r["no_answer"] == 0.0
    assert np.isfinite(r["loss"]) and r["share_answer-1"] == 1.0 and r["cost_per_task"] > 0
  evals = collections.defaultdict(list)
  for r in records:
    if r["kind"].startswith("eval_"):
      evals[r["kind"]].append(r["step"])
  assert evals == {"eval_qa": [0, 2], "eval_tau2-mock": [0, 2]}
  tau2 = [r for r in records if r["kind"] == "eval_tau2-mock"]
  assert all(r["accuracy"] == 0.0 for r in tau2)  # `answer` is not a tau2 tool: no task is ever completed
  rollouts = [json.loads(l) for l in (workdir / "rollouts" / "step_000001.jsonl").read_text().splitlines()]
  assert len(rollouts) == 8 and {r["task"]["kind"] for r in rollouts} == {"qa"}
  # A correct rollout has the larger reward within its group, and advantages have zero mean per group.
  for g in range(2):
    group = rollouts[g * 4:(g + 1) * 4]
    assert abs(sum(r["advantage"] for r in group)) < 1e-4
    assert len({r["reward"] for r in group}) == 2
  steps = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
  assert steps[-1] == 2
  # The user simulator was called for the tau2 tasks, the experts for the QA tasks.
  models = collections.Counter(r["body"]["model"] for r in server.received if r["path"].endswith("/chat/completions"))
  assert models["user"] > 0 and sum(v for k, v in models.items() if k != "user") >= 16
