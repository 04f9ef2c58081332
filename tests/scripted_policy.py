"""A tiny real Qwen3 overfit (by supervised steps in the test) to follow scripted tool-calling conversations.

Random weights never emit a tool call, so multi-turn tests first teach a small model the exact turns below; greedy
decoding then reproduces them through the real sampler, tokenizer, parser and tool environment.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from orchestra_jax.model import qwen3
from orchestra_jax.model.config import ModelConfig, tiny
from orchestra_jax.rollout import chat_format
from orchestra_jax.rollout.environment import FunctionEnvironment, function_schema

TOOLS = [function_schema("add", "Adds two integers.", {"a": "integer", "b": "integer"}),
         function_schema("answer", "Gives the final answer.", {"text": "string"})]

# task -> (turn-1 text, tool output shown to the model, turn-2 text)
SCRIPTS = {
    "What is 2+3?": ('<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>', "5",
                     '<tool_call>\n{"name": "answer", "arguments": {"text": "5"}}\n</tool_call>'),
    "What is 4+4?": ('<tool_call>\n{"name": "add", "arguments": {"a": 4, "b": 4}}\n</tool_call>', "8",
                     '<tool_call>\n{"name": "answer", "arguments": {"text": "8"}}\n</tool_call>'),
    # A malformed call: the loop must answer it with the parser's error and let the model go on.
    "Please add one and one.": ('<tool_call>\n{"name": "add" "arguments": 1}\n</tool_call>', None,
                     '<tool_call>\n{"name": "answer", "arguments": {"text": "2"}}\n</tool_call>'),
}


def make_env(sleep_s: float = 0.0) -> FunctionEnvironment:
  def add(a, b):
    time.sleep(sleep_s)
    return a + b

  return FunctionEnvironment({"add": add, "answer": lambda text: text}, TOOLS, finish_tools=("answer",),
                             costs={"add": 0.001, "answer": 0.01})


def tasks() -> list[dict]:
  return [{"id": f"t{i}", "question": q} for i, q in enumerate(SCRIPTS)]


@dataclasses.dataclass
class Policy:
  config: ModelConfig
  params: dict
  sequences: list[tuple[list[int], list[int]]]  # (tokens, loss mask) it was trained on
  final_loss: float


def _conversations(tokenizer, env) -> list[tuple[list[int], list[int]]]:
  """(tokens, assistant mask) for extend mode (one growing chat) and rebuild mode (turn 2 from a fresh prompt)."""
  out = []
  for task in tasks():
    turn1, tool_out, turn2 = SCRIPTS[task["question"]]
    episode = env.new_episode(task, "train")
    prompt = chat_format.encode_prompt(tokenizer, episode.messages(), TOOLS, add_generation_prompt=True)
    t1, t2 = tokenizer.encode(turn1), tokenizer.encode(turn2)
    parsed = chat_format.parse_assistant_turn(turn1)
    if parsed.tool_calls:
      reply = episode.call(parsed.tool_calls[0]).content
      assert reply == tool_out
    else:
      reply = "Error: " + parsed.errors[0].message
    response = chat_format.tool_response_ids(tokenizer, [reply], t1[-1])
    out.append((prompt + t1 + response + t2, [0] * len(prompt) + [1] * len(t1) + [0] * len(response) + [1] * len(t2)))
    rebuilt = chat_format.encode_prompt(tokenizer, episode.rebuild_messages(), TOOLS, add_generation_prompt=True)
    out.append((rebuilt + t2, [0] * len(rebuilt) + [1] * len(t2)))
  return out


def train_policy(tokenizer, steps: int = 400, seed: int = 0) -> Policy:
  config = tiny(num_layers=1, embed_dim=32, mlp_dim=64, num_heads=2, num_kv_heads=1, head_dim=16)
  seqs = _conversations(tokenizer, make_env())
  width = max(len(t) for t, _ in seqs)
  tokens = np.zeros((len(seqs), width), np.int32)
  segments = np.zeros_like(tokens)
  mask = np.zeros_like(tokens, dtype=np.float32)
  for i, (t, m) in enumerate(seqs):
    tokens[i, :len(t)], segments[i, :len(t)], mask[i, :len(m)] = t, 1, m
  # Only the assistant tokens are scored: gather their hidden states before the [*, V] LM head, so a step
  # costs a few hundred vocabulary rows instead of B x T of them.
  rows, cols = np.nonzero(mask[:, 1:])  # predicting tokens[:, 1:] from hidden[:, :-1]
  rows, cols = jnp.asarray(rows), jnp.asarray(cols)
  targets = jnp.asarray(tokens[:, 1:][np.nonzero(mask[:, 1:])])
  tokens, segments = jnp.asarray(tokens), jnp.asarray(segments)

  def loss_fn(params):
    hidden, _ = qwen3.forward(config, params, tokens[:, :-1], segment_ids=segments[:, :-1], return_hidden=True)
    logits = hidden[rows, cols] @ params["embedding"].T  # tied head: [N, V]
    return -jnp.take_along_axis(jax.nn.log_softmax(logits), targets[:, None], -1).mean()

  opt = optax.adam(1e-2)
  params = qwen3.init_params(config, jax.random.key(seed))
  state = opt.init(params)

  @jax.jit
  def step(params, state):
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, state = opt.update(grads, state, params)
    return optax.apply_updates(params, updates), state, loss

  loss = jnp.inf
  for i in range(steps):
    params, state, loss = step(params, state)
    if i % 20 == 19 and float(loss) < 2e-3:
      break
  return Policy(config, params, seqs, float(loss))
