"""The two orchestrators an eval can run: our checkpoint through the continuous-batching sampler, and any model
behind an OpenAI-compatible endpoint. Both hand every finished item to `finish(task, traj, episode, **info)`, where
`info` holds the `evaluate.results.item_record` keywords."""

from __future__ import annotations

import concurrent.futures as cf
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Callable

from orchestra_jax import checkpoint, sharding as sharding_lib, tokenizer as tokenizer_lib
from orchestra_jax.errors import UserError
from orchestra_jax.evaluate.tasks import EvalSettings, env_task
from orchestra_jax.rollout import chat_format
from orchestra_jax.rollout.agent_loop import AgentLoop, RolloutConfig, run_call
from orchestra_jax.rollout.sampler import Sampler
from orchestra_jax.rollout.trajectory import Trajectory
from orchestra_jax.tools.catalog import llm_cost
from orchestra_jax.tools.llm_client import ChatClient


# --- our checkpoint through the sampler -----------------------------------------------------------------------

def _turn_tokens(traj) -> tuple[int, int]:
  """(prompt, completion) tokens an API would bill for the orchestrator's turns (the whole context per turn)."""
  prompt = completion = 0
  for t in traj.turns:
    prompt += len(t.prompt_tokens) if t.prompt_tokens is not None else t.start
    completion += t.end - t.start
  return prompt, completion


def run_checkpoint(model_dir: str, cfg, settings: EvalSettings, env, catalog, items: list[tuple[int, dict]],
                   finish: Callable[..., None]) -> None:
  """Runs `items` ((position, task) pairs) with the model at `model_dir`, as `orchestra train` evaluates; each item
  goes to `finish` the moment its row ends, while other rows keep decoding."""
  if not Path(model_dir).is_dir():
    raise checkpoint.CheckpointError(f"model directory {model_dir} does not exist")
  sharding = None
  if "mesh" in cfg:
    sharding = sharding_lib.ShardingConfig(sharding_lib.make_mesh(tuple(cfg.mesh.shape)))
  tok_dir = cfg.get("tokenizer_dir") or None
  if tok_dir is None and any((Path(model_dir) / f).is_file() for f in checkpoint.TOKENIZER_FILES):
    tok_dir = model_dir
  tok = tokenizer_lib.load_tokenizer(tok_dir)
  model_config, params = checkpoint.load_model(model_dir, sharding)
  max_len = settings.max_len or min(16384, model_config.max_position_embeddings)
  sampler = Sampler(model_config, params, max_len=max_len, batch_size=settings.batch_size, sharding=sharding,
                    chunk_steps=settings.chunk_steps)
  rollout = RolloutConfig(max_turns=settings.max_turns, max_new_tokens=settings.max_new_tokens,
                          temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k,
                          mode=settings.mode, tool_workers=settings.tool_workers,
                          enable_thinking=settings.enable_thinking)
  tasks = [task for _, task in items]

  def on_done(i: int, traj, episode, wall: float) -> None:
    tokens = _turn_tokens(traj)
    cost = llm_cost(catalog.orchestrator_price_in, catalog.orchestrator_price_out, *tokens)
    last = traj.turns[-1].text if traj.turns else None
    finish(tasks[i], traj, episode, turns=len(traj.turns), orchestrator_cost=cost, orchestrator_latency=None,
           orchestrator_tokens=tokens, wall_s=wall, last_text=last)

  loop = AgentLoop(sampler, tok, env, rollout)
  env_tasks = [env_task(t, env) for t in tasks]
  loop.run(env_tasks, seeds=[pos for pos, _ in items], rollout_ids=[t["id"] for t in tasks], on_done=on_done)


# --- an OpenAI-compatible endpoint ----------------------------------------------------------------------------

def _openai_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
  """Episode messages in OpenAI chat form: `{name, arguments}` tool calls get ids and JSON-text arguments, and
  tool messages the id of the call they answer."""
  out, pending, n = [], [], 0
  for m in messages:
    msg = {k: v for k, v in m.items() if k in ("role", "content", "tool_calls", "tool_call_id", "name")}
    if msg.get("tool_calls"):
      calls = []
      for c in msg["tool_calls"]:
        if isinstance(c, Mapping) and "function" in c:
          calls.append(dict(c))
        else:
          n += 1
          args = c.get("arguments") or {}
          calls.append({"id": c.get("id") or f"call_hist_{n}", "type": "function",
                        "function": {"name": c.get("name"),
                                     "arguments": args if isinstance(args, str) else json.dumps(args)}})
        pending.append(calls[-1]["id"])
      msg["tool_calls"] = calls
      msg["content"] = msg.get("content") or ""
    elif msg.get("role") == "tool":
      call_id = msg.get("tool_call_id")
      if call_id is None and pending:
        call_id = pending.pop(0)
      elif call_id in pending:
        pending.remove(call_id)
      msg["tool_call_id"] = call_id
      msg.pop("name", None)
    out.append(msg)
  return out


class _EndpointOrchestrator:
  """A model behind an OpenAI-compatible endpoint driving one episode at a time (thread-safe)."""

  def __init__(self, endpoint: str, model: str, api_key_env: str | None, catalog, settings: EvalSettings):
    price_in, price_out = catalog.orchestrator_price_in, catalog.orchestrator_price_out
    for backend in catalog.backends.values():  # a catalog alias serving this model: its prices
      if backend.model == model:
        price_in, price_out = backend.price_in, backend.price_out
        break
    self.client = ChatClient(endpoint, model, api_key_env, read_timeout=settings.read_timeout,
                             max_retries=settings.max_retries, price_in_per_m=price_in, price_out_per_m=price_out,
                             pool_size=max(8, settings.workers))
    self.settings = settings

  def run(self, episode, task_id: str):
    s = self.settings
    traj = Trajectory(metadata={"task_id": task_id, "rollout_id": task_id})
    tools = episode.tools()
    messages = _openai_messages(episode.messages())
    turns, cost, latency, tokens, last_text, error = 0, 0.0, 0.0, [0, 0], None, None
    while True:
      if turns >= s.max_turns:
        traj.finish_reason = "max_turns"
        break
      result = self.client.chat(messages, tools=tools, temperature=s.temperature,
                                max_tokens=s.orchestrator_max_tokens or None)
      turns += 1
      cost += result.cost_usd
      latency += result.latency_s
      tokens[0] += result.prompt_tokens
      tokens[1] += result.completion_tokens
      if not result.ok:
        traj.finish_reason, error = "orchestrator_error", result.error
        break
      last_text = result.text
      if not result.tool_calls:
        traj.finish_reason = "no_tool_call" if result.finish_reason != "length" else "length"
        break
      messages.append({"role": "assistant", "content": result.text or "", "tool_calls": result.tool_calls})
      calls = []
      for index, c in enumerate(result.tool_calls):
        fn = c.get("function") if isinstance(c, Mapping) else None
        name = fn.get("name") if isinstance(fn, Mapping) else None
        raw = fn.get("arguments") if isinstance(fn, Mapping) else None
        try:
          args = json.loads(raw) if isinstance(raw, str) and raw.strip() else (raw or {})
          if not isinstance(args, dict):
            raise ValueError("arguments must be a JSON object")
          bad = None
        except ValueError as e:
          args, bad = {}, f"Error: arguments of tool call #{index + 1} ({name}) are not valid JSON: {e}"
        call = chat_format.ToolCall(name=str(name), arguments=args, raw=json.dumps(c, default=str), index=index)
        calls.append((c, call, bad))
      invalid = {e.index: e for e in chat_format.validate_tool_calls([c for _, c, b in calls if b is None], tools)}
      done = False
      for c, call, bad in calls:
        if bad is None and call.index in invalid:
          bad = f"Error: {invalid[call.index].message}"
        if bad is None and done:  # an earlier call of this turn ended the episode: nothing more to pay for
          bad = "Error: the episode has ended; this call was not run"
        if bad is not None:
          content = bad
        else:
          res = run_call(episode, call)
          res.record.turn_index = turns - 1
          traj.add_tool_call(res.record)
          content = res.content
          if res.done and not done:
            done = True
            traj.final_answer, traj.finish_reason = res.final_answer, "answer"
        messages.append({"role": "tool", "tool_call_id": c.get("id") if isinstance(c, Mapping) else None,
                         "content": content})
      if done:
        break
    return traj, dict(turns=turns, orchestrator_cost=cost, orchestrator_latency=latency,
                      orchestrator_tokens=tuple(tokens), last_text=last_text, error=error)

  def close(self) -> None:
    self.client.close()


def run_endpoint(endpoint: str, model: str, api_key_env: str | None, settings: EvalSettings, env, catalog,
                 items: list[tuple[int, dict]], finish: Callable[..., None]) -> list[str]:
  """Runs `items` with the model `model` at `endpoint`, `settings.workers` at a time; returns one line per item
  that failed (a UserError is raised instead)."""
  orch = _EndpointOrchestrator(endpoint, model, api_key_env, catalog, settings)
  errors: list[str] = []

  def one(task: dict) -> None:
    start = time.perf_counter()
    episode = env.new_episode(env_task(task, env), task["id"])
    try:
      traj, info = orch.run(episode, task["id"])
    finally:
      episode.close()
    finish(task, traj, episode, wall_s=time.perf_counter() - start, **info)

  pool = cf.ThreadPoolExecutor(max_workers=settings.workers, thread_name_prefix="eval")
  try:
    futures = {pool.submit(one, task): task["id"] for _, task in items}
    for f in cf.as_completed(futures):
      exc = f.exception()
      if isinstance(exc, UserError):
        raise exc
      if exc is not None:
        errors.append(f"{futures[f]}: {type(exc).__name__}: {exc}")
  finally:  # on an error or Ctrl-C, queued items are dropped; running ones finish and are written
    pool.shutdown(wait=True, cancel_futures=True)
    orch.close()
  return errors
