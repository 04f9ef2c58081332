"""Trajectory bookkeeping: masks, turn boundaries, JSON round trip, per-turn training samples."""

import json
import math

import pytest

from orchestra_jax.rollout import chat_format as cf
from orchestra_jax.tokenizer import qwen3_tokenizer_dir
from orchestra_jax.rollout.trajectory import ToolCallRecord, Trajectory, Turn, TurnSample

PROMPT = [1, 2, 3, 4]
GEN1, LP1 = [10, 11, 12], [-0.5, -1.25, -0.125]
RESP1 = [20, 21]
GEN2, LP2 = [13, 14], [-2.0, -0.0625]
RESP2 = [22, 23, 24]
GEN3, LP3 = [15], [-3.5]


def scripted() -> Trajectory:
  """prompt, generated, tool response, generated, tool response, generated (the answer)."""
  traj = Trajectory(metadata={"task_id": "frames-7", "preference": [0.0, 1.0, 0.5, -0.25]})
  traj.append_prompt(PROMPT)
  p1 = cf.parse_assistant_turn('<tool_call>{"name": "search", "arguments": {"model": "search-2"}}</tool_call>')
  traj.append_generated(GEN1, LP1, "stop", parsed=p1, text="turn one")
  traj.add_tool_call(ToolCallRecord("search", {"model": "search-2"}, alias="search-2", model="gpt-5-mini",
                                    result="docs", cost_usd=0.0025, latency_s=16.5, tokens_in=900, tokens_out=40))
  traj.append_tool_response(RESP1)
  p2 = cf.parse_assistant_turn('<tool_call>{"name": "python", "arguments": []}</tool_call>')
  turn2 = traj.append_generated(GEN2, LP2, "stop", parsed=p2)
  traj.append_tool_response(RESP2)
  p3 = cf.parse_assistant_turn('<tool_call>{"name": "answer", "arguments": {"model": "answer-1"}}</tool_call>')
  traj.append_generated(GEN3, LP3, "stop", parsed=p3)
  traj.add_tool_call(ToolCallRecord("answer", {"model": "answer-1"}, alias="answer-1", result="Canberra",
                                    cost_usd=0.01, latency_s=96.0))
  traj.final_answer, traj.finish_reason, traj.extra_cost_usd = "Canberra", "answer", 2e-6
  assert turn2.errors and turn2.errors[0].kind == cf.BAD_ARGUMENTS
  return traj


def test_masks_and_turn_boundaries():
  traj = scripted()
  assert traj.tokens == PROMPT + GEN1 + RESP1 + GEN2 + RESP2 + GEN3
  assert traj.generated_mask == [0] * 4 + [1] * 3 + [0] * 2 + [1] * 2 + [0] * 3 + [1]
  assert traj.logprobs == [0.0] * 4 + LP1 + [0.0] * 2 + LP2 + [0.0] * 3 + LP3
  assert [(t.start, t.end) for t in traj.turns] == [(4, 7), (9, 11), (14, 15)]
  for t, gen in zip(traj.turns, (GEN1, GEN2, GEN3)):
    assert traj.tokens[t.start:t.end] == gen and t.num_tokens == len(gen)
  assert [t.has_tool_call for t in traj.turns] == [True, False, True]
  assert [c.turn_index for c in traj.tool_calls] == [0, 2]
  assert traj.num_generated_tokens == 6
  assert traj.tool_counts() == {"search": 1, "answer": 1}
  assert traj.tool_counts(by="alias") == {"search-2": 1, "answer-1": 1}
  assert math.isclose(traj.cost_usd, 0.0125 + 2e-6) and traj.latency_s == 112.5
  traj.check()


def test_append_generated_validates():
  traj = Trajectory()
  with pytest.raises(ValueError):
    traj.append_generated([1, 2], [-0.1], "stop")
  with pytest.raises(ValueError):
    traj.append_generated([1], [float("nan")], "stop")
  assert traj.tokens == [] and traj.turns == []


def test_json_round_trip_exact():
  traj = scripted()
  traj.logprobs[5] = -1 / 3  # a float with no short decimal form
  traj.metadata["unicode"] = "Größe 🙂"
  s = traj.to_json()
  assert "\n" not in s
  back = Trajectory.from_json(s)
  assert back == traj
  assert back.to_json() == s
  assert back.turns[1].errors == traj.turns[1].errors and back.turns[0].tool_calls == traj.turns[0].tool_calls
  assert isinstance(back.turns[0].tool_calls[0].repairs, tuple)
  assert json.loads(s)["format_version"] == 1


def test_json_round_trip_numpy_inputs_and_neg_inf():
  np = pytest.importorskip("numpy")
  traj = Trajectory()
  traj.append_prompt(np.array([5, 6], dtype=np.int32))
  traj.append_generated(np.array([7, 8], dtype=np.int64), np.array([-0.25, -np.inf], dtype=np.float32), "length")
  assert all(type(x) is int for x in traj.tokens) and all(type(x) is float for x in traj.logprobs)
  back = Trajectory.from_json(traj.to_json())
  assert back == traj and back.logprobs[-1] == -math.inf


def test_from_dict_rejects_inconsistent():
  d = scripted().to_dict()
  d["generated_mask"] = d["generated_mask"][:-1]
  with pytest.raises(ValueError):
    Trajectory.from_dict(d)
  d = scripted().to_dict()
  d["turns"][1]["end"] = 100
  with pytest.raises(ValueError):
    Trajectory.from_dict(d)


def test_turn_samples_prefix_mode():
  traj = scripted()
  samples = traj.to_turn_samples()
  assert [s.turn_index for s in samples] == [0, 1, 2]
  s0, s1, s2 = samples
  assert s0 == TurnSample(PROMPT, GEN1, [1, 1, 1], LP1, 0)
  assert s1.prompt_tokens == PROMPT + GEN1 + RESP1 and s1.response_tokens == GEN2 and s1.old_logprobs == LP2
  assert s2.prompt_tokens == PROMPT + GEN1 + RESP1 + GEN2 + RESP2 and s2.response_tokens == GEN3
  for s in samples:
    assert len(s.response_tokens) == len(s.response_mask) == len(s.old_logprobs)
    # Each sample's prompt + response is a prefix of the trajectory: the context the turn was sampled in.
    assert traj.tokens[:len(s.prompt_tokens) + len(s.response_tokens)] == s.prompt_tokens + s.response_tokens
  # The docs/design.md filter: drop turns with no parseable tool call.
  assert [s.turn_index for s in traj.to_turn_samples(require_tool_call=True)] == [0, 2]


def test_turn_samples_skip_empty_turns():
  traj = Trajectory()
  traj.append_prompt([1])
  traj.append_generated([], [], "length")
  traj.append_generated([2], [-0.5], "stop")
  assert [s.turn_index for s in traj.to_turn_samples()] == [1]
  assert traj.to_turn_samples()[0].prompt_tokens == [1]


def test_rebuild_mode_samples():
  # The reference QA loop: each turn's prompt is rebuilt from state, not the running chat.
  traj = Trajectory()
  prompts = [[1, 2, 3], [1, 2, 9, 9, 3], [1, 7, 3]]
  gens = [([10, 11], [-0.1, -0.2]), ([12], [-0.3]), ([13, 14, 15], [-0.4, -0.5, -0.6])]
  for p, (g, lp) in zip(prompts, gens):
    traj.append_generated(g, lp, "stop", prompt_tokens=p)
  assert traj.tokens == [10, 11, 12, 13, 14, 15] and traj.generated_mask == [1] * 6
  samples = traj.to_turn_samples()
  assert [s.prompt_tokens for s in samples] == prompts
  assert [(s.response_tokens, s.old_logprobs) for s in samples] == gens
  assert all(s.response_mask == [1] * len(s.response_tokens) for s in samples)
  back = Trajectory.from_json(traj.to_json())
  assert back == traj and back.to_turn_samples() == samples


def test_mixed_modes():
  traj = Trajectory()
  traj.append_prompt([1, 2])
  traj.append_generated([3], [-0.1], "stop")
  traj.append_tool_response([4])
  traj.append_generated([5], [-0.2], "stop", prompt_tokens=[8, 9])
  s = traj.to_turn_samples()
  assert [x.prompt_tokens for x in s] == [[1, 2], [8, 9]]


def test_turn_dict_round_trip():
  t = Turn(start=3, end=5, finish_reason="length", prompt_tokens=[1, 2], text="x")
  assert Turn.from_dict(json.loads(json.dumps(t.to_dict()))) == t


def test_with_real_tokenizer_and_chat_format():
  """End to end with the Qwen3 tokenizer: samples reproduce the template's context for each turn."""
  d = str(qwen3_tokenizer_dir())
  from transformers import AutoTokenizer
  tok = AutoTokenizer.from_pretrained(d)
  SYSTEM = {"role": "system", "content": "You are an orchestrator."}
  USER = {"role": "user", "content": "What is the capital of Australia?"}
  TOOLS = [{"name": "search", "description": "Search.", "parameters": {
      "type": "object", "properties": {"model": {"type": "string"}}, "required": ["model"]}}]
  TEXT1 = ('<think>\nLook it up.\n</think>\n\n'
           '<tool_call>\n{"name": "search", "arguments": {"model": "search-2"}}\n</tool_call>\n'
           '<tool_call>\n{"name": "search", "arguments": {"model": "search-3"}}\n</tool_call>')
  RESULTS1 = ["Canberra is the capital.", "Canberra (pop. 460k)."]
  traj = Trajectory()
  traj.append_prompt(cf.encode_prompt(tok, [SYSTEM, USER], TOOLS))
  gen = tok.encode(TEXT1 + "<|im_end|>", add_special_tokens=False)
  traj.append_generated(gen, [-0.1] * len(gen), "stop", parsed=cf.parse_assistant_turn(TEXT1))
  traj.append_tool_response(cf.tool_response_ids(tok, RESULTS1, gen[-1]))
  answer = "<think>\nDone.\n</think>\n\nCanberra."
  gen2 = tok.encode(answer + "<|im_end|>", add_special_tokens=False)
  traj.append_generated(gen2, [-0.2] * len(gen2), "stop", parsed=cf.parse_assistant_turn(answer))
  s0, s1 = traj.to_turn_samples()
  assert [c.arguments["model"] for c in traj.turns[0].tool_calls] == ["search-2", "search-3"]
  full = cf.render_messages(tok, [SYSTEM, USER, {"role": "assistant", "content": TEXT1},
                                  {"role": "tool", "content": RESULTS1[0]}, {"role": "tool", "content": RESULTS1[1]}],
                            TOOLS)
  assert s1.prompt_tokens == tok.encode(full, add_special_tokens=False)
  assert s1.response_tokens == gen2 and s1.response_tokens[-1] == cf.IM_END_ID
