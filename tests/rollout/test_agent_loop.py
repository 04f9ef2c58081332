"""Multi-turn tool-calling rollouts through the real sampler, tokenizer, parser and in-process tools."""

import json

import jax
import pytest

import scripted_policy
from orchestra_jax import tokenizer as tokenizer_lib
from orchestra_jax.model import qwen3
from orchestra_jax.model.config import tiny
from orchestra_jax.rollout.agent_loop import AgentLoop, RolloutConfig
from orchestra_jax.rollout.sampler import Sampler
from orchestra_jax.rollout.trajectory import Trajectory


@pytest.fixture(scope="module")
def tok():
  return tokenizer_lib.load_tokenizer(None)


@pytest.fixture(scope="module")
def policy(tok):
  policy = scripted_policy.train_policy(tok)
  assert policy.final_loss < 0.05, "the scripted policy did not learn its conversations"
  return policy


def _loop(policy, tok, mode="extend", batch=2, sleep_s=0.0, **kw):
  sampler = Sampler(policy.config, policy.params, max_len=512, batch_size=batch, chunk_steps=8)
  config = RolloutConfig(temperature=0.0, max_new_tokens=48, mode=mode, **kw)
  return AgentLoop(sampler, tok, scripted_policy.make_env(sleep_s), config)


def test_extend_mode_masks_turns_and_answers(policy, tok):
  loop = _loop(policy, tok)
  tasks = scripted_policy.tasks()
  trajs = loop.run(tasks)  # 3 tasks through 2 slots: the third waits for a free slot
  by_question = {t["question"]: traj for t, traj in zip(tasks, trajs)}

  traj = by_question["What is 2+3?"]
  assert traj.finish_reason == "answer" and traj.final_answer == "5"
  assert [c.name for c in traj.tool_calls] == ["add", "answer"]
  assert traj.tool_calls[0].result == "5" and traj.tool_calls[0].turn_index == 0
  assert traj.cost_usd == pytest.approx(0.011)
  # The stored sequence is exactly the conversation the model was trained on (no re-tokenisation drift)...
  trained_tokens, trained_mask = policy.sequences[0]
  assert traj.tokens == trained_tokens
  # ...and the generated mask marks exactly the two assistant turns; prompt and tool response are masked out.
  assert traj.generated_mask == trained_mask
  assert len(traj.turns) == 2
  first, second = traj.turns
  text = lambda turn: tok.decode(traj.tokens[turn.start:turn.end])
  assert text(first).startswith("<tool_call>") and text(first).endswith("</tool_call>")
  assert '"answer"' in text(second)
  assert "<tool_response>\n5\n</tool_response>" in tok.decode(traj.tokens[first.end:second.start])
  assert all(lp < 0 for lp, m in zip(traj.logprobs, traj.generated_mask) if m)
  assert all(lp == 0 for lp, m in zip(traj.logprobs, traj.generated_mask) if not m)

  # The malformed call got the parser's error as its tool response, and the row went on to answer.
  bad = by_question["Please add one and one."]
  assert bad.turns[0].errors and bad.turns[0].errors[0].kind == "malformed_json"
  assert "Error:" in tok.decode(bad.tokens[bad.turns[0].end:bad.turns[1].start])
  assert bad.final_answer == "2" and [c.name for c in bad.tool_calls] == ["answer"]
  assert loop.stats.turns == 6 and loop.stats.tool_calls == 5


def test_turn_samples_and_json_round_trip(policy, tok):
  trajs = _loop(policy, tok).run(scripted_policy.tasks()[:1])
  traj = trajs[0]
  samples = traj.to_turn_samples()
  assert len(samples) == 2
  for sample, turn in zip(samples, traj.turns):
    assert sample.prompt_tokens == traj.tokens[:turn.start]
    assert sample.response_tokens == traj.tokens[turn.start:turn.end]
    assert sample.old_logprobs == traj.logprobs[turn.start:turn.end]
  again = Trajectory.from_json(json.dumps(json.loads(traj.to_json())))
  assert again.tokens == traj.tokens and again.final_answer == traj.final_answer


def test_rebuild_mode_prompts_each_turn_from_state(policy, tok):
  trajs = _loop(policy, tok, mode="rebuild").run(scripted_policy.tasks()[:2])
  for traj, answer in zip(trajs, ["5", "8"]):
    assert traj.final_answer == answer
    second = traj.turns[1]
    assert second.prompt_tokens is not None
    assert "Problem:" in tok.decode(second.prompt_tokens) and "-> " in tok.decode(second.prompt_tokens)
    samples = traj.to_turn_samples()
    assert samples[1].prompt_tokens == second.prompt_tokens


def test_limits_end_rows(policy, tok):
  trajs = _loop(policy, tok, max_turns=1).run(scripted_policy.tasks()[:1])
  assert trajs[0].finish_reason == "max_turns" and trajs[0].final_answer is None and len(trajs[0].turns) == 1
  prompt_len = policy.sequences[0][1].index(1)  # the first turn fits the budget, the second does not
  trajs = _loop(policy, tok, max_total_tokens=prompt_len + 48 + 5).run(scripted_policy.tasks()[:1])
  assert trajs[0].finish_reason == "max_tokens" and len(trajs[0].turns) == 1


def test_tool_latency_overlaps_with_decoding(policy, tok):
  """4 rows whose tools sleep 0.4 s each: the loop waits much less than the summed tool time."""
  loop = _loop(policy, tok, batch=4, sleep_s=0.4)
  tasks = [scripted_policy.tasks()[i % 2] for i in range(4)]
  trajs = loop.run(tasks)
  assert all(t.finish_reason == "answer" for t in trajs)
  assert loop.stats.tool_busy_s >= 4 * 0.4
  assert loop.stats.tool_wait_s < 0.6 * loop.stats.tool_busy_s


def test_untrained_model_ends_without_tool_call(tok):
  config = tiny(num_layers=1)
  sampler = Sampler(config, qwen3.init_params(config, jax.random.key(3)), max_len=512, batch_size=1)
  loop = AgentLoop(sampler, tok, scripted_policy.make_env(), RolloutConfig(temperature=0.0, max_new_tokens=8, mode="extend",
                                                                                  tool_workers=16))
  traj = loop.run(scripted_policy.tasks()[:1])[0]
  assert traj.finish_reason in ("no_tool_call", "length") and traj.final_answer is None
  assert sum(traj.generated_mask) == len(traj.turns[0].num_tokens * [1])
