"""`rollout.lockstep` in one process: a follower sampler replaying a leader's commands (the broadcast replaced by a
queue; tests/test_multihost_trainer.py runs the real thing across 2 processes) ends up making exactly the same
`step` calls with the same results, though the leader's agent loop schedules rows by tool-completion timing."""

import queue
import threading

import pytest

import scripted_policy
from orchestra_jax import tokenizer as tokenizer_lib
from orchestra_jax.rollout import lockstep
from orchestra_jax.rollout.agent_loop import AgentLoop, RolloutConfig
from orchestra_jax.rollout.sampler import Sampler, SamplingParams


@pytest.fixture(scope="module")
def tok():
  return tokenizer_lib.load_tokenizer(None)


@pytest.fixture(scope="module")
def policy(tok):
  return scripted_policy.train_policy(tok)


@pytest.fixture
def channel(monkeypatch):
  """broadcast_json: the leader's call (a value) is queued, the follower's (no value) takes the next one."""
  q = queue.Queue()

  def fake(value=None):
    if value is None:
      return q.get(timeout=120)
    q.put(value)
    return value

  monkeypatch.setattr(lockstep, "broadcast_json", fake)
  return q


def _recording(sampler):
  log = []
  real = sampler.step

  def step():
    turns = real()
    log.append([(t.slot, t.tokens, t.logprobs, t.finish_reason) for t in turns])
    return turns

  sampler.step = step
  return log


def test_follower_replays_agent_loop(channel, tok, policy):
  make = lambda: Sampler(policy.config, policy.params, max_len=512, batch_size=2, chunk_steps=8)
  lead, follow = make(), make()
  lead_log, follow_log = _recording(lead), _recording(follow)
  errors = []

  def run_follower():
    try:
      lockstep.follow(follow)
    except BaseException as e:  # surfaced by the assertion below
      errors.append(e)

  thread = threading.Thread(target=run_follower)
  thread.start()
  leader = lockstep.Leader(lead)
  config = RolloutConfig(temperature=0.0, max_new_tokens=48, mode="extend", tool_workers=16)
  # tool calls sleep, so which row resumes when depends on timing: only the leader sees it
  trajs = AgentLoop(leader, tok, scripted_policy.make_env(0.05), config).run(scripted_policy.tasks())
  leader.end()
  thread.join(timeout=120)
  assert not thread.is_alive() and not errors, errors
  assert all(t.finish_reason == "answer" for t in trajs if t.final_answer is not None)
  assert lead_log and follow_log == lead_log
  assert [follow.slot_state(i) for i in range(2)] == ["free", "free"]


def test_follower_replays_sampling_params_and_raises_on_abort(channel, policy):
  lead = Sampler(policy.config, policy.params, max_len=64, batch_size=2, chunk_steps=4)
  follow = Sampler(policy.config, policy.params, max_len=64, batch_size=2, chunk_steps=4)
  leader = lockstep.Leader(lead)
  sampling = SamplingParams(temperature=0.7, top_k=5, max_new_tokens=6, stop_ids=(7,))
  leader.start(1, [1, 2, 3], sampling, seed=11, tag="ignored")
  leader.step()
  leader.abort("boom")
  with pytest.raises(lockstep.LockstepError, match="boom"):
    lockstep.follow(follow)
  # the start and the step were replayed before the abort
  assert follow._rows[1].sampling == sampling
  assert follow.conversation(1) == lead.conversation(1)
