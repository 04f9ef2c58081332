"""Multi-turn tool-calling rollouts through the real sampler, tokenizer, parser and in-process tools."""

import concurrent.futures as cf
import json

import jax
import pytest

import scripted_policy
from orchestra_jax import tokenizer as tokenizer_lib
from orchestra_jax.model import qwen3
from orchestra_jax.model.config import tiny
from orchestra_jax.rollout.agent_loop import AgentLoop, RolloutConfig
from orchestra_jax.rollout.sampler import Sampler, TurnResult
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


# --- hostile rows: one bad row never ends the batch -----------------------------------------------------
def _hostile_env(bad_add=None, broken_call_for=None):
  """The scripted env, with `add` replaced by `bad_add` and `Episode.call` returning `broken_call_for[task id]`
  (a bug: not a ToolResult) for the named tasks."""
  env = scripted_policy.make_env()
  if bad_add is not None:
    env.functions["add"] = bad_add
  if broken_call_for:
    make = env.new_episode

    def new_episode(task, rollout_id):
      episode = make(task, rollout_id)
      if task["id"] in broken_call_for:
        episode.call = lambda call: broken_call_for[task["id"]]
      return episode
    env.new_episode = new_episode
  return env


def _hostile_loop(policy, tok, env, mode="extend", batch=3, **kw):
  sampler = Sampler(policy.config, policy.params, max_len=512, batch_size=batch, chunk_steps=8)
  return AgentLoop(sampler, tok, env, RolloutConfig(temperature=0.0, max_new_tokens=48, mode=mode, **kw))


@pytest.mark.parametrize("mode", ["extend", "rebuild"])
def test_lone_surrogate_in_a_tool_reply_does_not_stop_the_batch(policy, tok, mode):
  # An expert's reply decoded from JSON "\ud800": a str with a lone surrogate, which a UTF-8 tokenizer refuses.
  bad = json.loads('"\\ud800"')
  env = _hostile_env(bad_add=lambda a, b: f"{a + b}{bad}" if a == 4 else a + b)
  tasks = scripted_policy.tasks()
  trajs = _hostile_loop(policy, tok, env, mode=mode).run(tasks)
  assert all(t is not None for t in trajs)
  good, hostile, malformed = trajs
  assert good.final_answer == "5" and malformed.final_answer == "2"
  if mode == "extend":
    assert good.tokens == policy.sequences[0][0]  # untouched by its neighbour
  assert hostile.tool_calls[0].result == "8" + bad and len(hostile.turns) >= 2  # the row went on past the reply
  # The rollout record is valid UTF-8 JSON (what the trainer writes).
  assert json.loads(hostile.to_json().encode("utf-8"))["tool_calls"][0]["result"] == "8\ufffd"


def test_broken_episode_call_is_a_tool_error_for_its_row(policy, tok):
  env = _hostile_env(broken_call_for={"t1": None})  # Episode.call returned None instead of a ToolResult
  trajs = _hostile_loop(policy, tok, env).run(scripted_policy.tasks())
  good, broken, malformed = trajs
  assert good.final_answer == "5" and good.tokens == policy.sequences[0][0] and malformed.final_answer == "2"
  record = broken.tool_calls[0]
  assert record.name == "add" and record.error and "ToolResult" in record.error
  reply = tok.decode(broken.tokens[broken.turns[0].end:broken.turns[1].start])
  assert "Error:" in reply and "add" in reply


def test_tool_call_limits_reach_the_transcript(policy, tok):
  """A turn with too many calls, a 5,000-digit integer and 1,000-deep arguments: each block gets an error reply,
  only the first `max_tool_calls_per_turn` valid calls run, and nothing raises."""
  loop = _hostile_loop(policy, tok, scripted_policy.make_env(), batch=1, max_tool_calls_per_turn=3)
  call = '<tool_call>\n{"name": "add", "arguments": {"a": %s, "b": 1}}\n</tool_call>'
  text = (call % ("1" * 5000) + call % ("[" * 200 + "]" * 200) + call % 1 + "".join(call % i for i in range(10))
          + "<|im_end|>")
  row = loop._open(0, scripted_policy.tasks()[0], 0, "0")
  tokens = tok.encode(text)
  with cf.ThreadPoolExecutor(2) as pool:
    loop._on_turn(row, TurnResult(tokens=tokens, logprobs=[-1.0] * len(tokens), finish_reason="stop"), pool)
    cf.wait(row.futures)
  replies = [r if isinstance(r, str) else r.result().content for r in row.replies]
  assert len(replies) == 13 and len(row.futures) == 1 and loop.stats.tool_calls == 1
  assert "digits" in replies[0] and "nested" in replies[1] and replies[2] == "2"
  assert all("at most 3 tool calls per turn" in r for r in replies[3:])
  kinds = [e.kind for e in row.trajectory.turns[0].errors]
  assert kinds.count("too_many_calls") == 10 and len(kinds) == 12
