"""`orchestra serve`: a real server on 127.0.0.1 with a tiny random Qwen3 checkpoint and the real tokenizer,
talked to with the project's own `ChatClient` (and `requests` for the raw-HTTP cases).

Greedy outputs are checked token for token against `Sampler.generate` on the same prompt ids, usage against the
tokenizer's counts, and concurrent requests against the same requests sent one at a time.
"""

from __future__ import annotations

import _thread
import argparse
import json
import socket
import threading
import time
import types

import jax
import pytest
import requests

from orchestra_jax import checkpoint, serve, tokenizer
from orchestra_jax.model import qwen3
from orchestra_jax.model.config import tiny
from orchestra_jax.rollout import chat_format
from orchestra_jax.rollout.sampler import Sampler, SamplingParams
from orchestra_jax.tools.llm_client import ChatClient, chat_many

NAME = "tiny-served"
MAX_LEN = 128
BATCH = 4
QUESTIONS = ["hi", "What is 2+2?", "Name a color.", "Say yes.", "Count to three.", "Why?", "Tell a joke.", "Ok"]


def _msgs(q):
  return [{"role": "user", "content": q}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
  path = tmp_path_factory.mktemp("serve") / "tiny-ckpt"
  # Untied head and weights x10 (std 0.2): with HF's std-0.02 init and a tied head, the residual stream is
  # nearly the last token's embedding and greedy decoding repeats that token ("\n" after every chat prompt),
  # which would make every output comparison below vacuous.
  config = tiny(num_layers=1, tie_word_embeddings=False)
  params = qwen3.init_params(config, jax.random.key(3))
  params = jax.tree_util.tree_map_with_path(lambda k, x: x if "norm" in jax.tree_util.keystr(k) else x * 10, params)
  checkpoint.save_model(path, config, params, tokenizer_dir=str(tokenizer.qwen3_tokenizer_dir()))
  return path


@pytest.fixture(scope="module")
def loaded(model_dir):
  config, params = checkpoint.load_model(model_dir)
  return config, params, tokenizer.load_tokenizer(model_dir)


@pytest.fixture(scope="module")
def server(loaded, model_dir):
  config, params, tok = loaded
  with serve.ModelServer(config, params, tok, model_name=NAME, max_len=MAX_LEN, max_batch=BATCH,
                         model_path=str(model_dir)) as srv:
    yield srv


@pytest.fixture(scope="module")
def client(server):
  with ChatClient(server.base_url + "/v1", NAME, max_retries=0, read_timeout=120.0) as c:
    yield c


@pytest.fixture(scope="module")
def reference(loaded, server):
  """prompt ids -> greedy SampleResult from a Sampler with the server's shapes and stop ids (cached)."""
  config, params, _ = loaded
  sampler = Sampler(config, params, max_len=MAX_LEN, batch_size=BATCH, stop_ids=server.stop_ids, tool_call_ids=())
  cache = {}

  def run(prompts, max_new):
    todo = [p for p in prompts if (tuple(p), max_new) not in cache]
    if todo:
      sp = SamplingParams(temperature=0.0, max_new_tokens=max_new, stop_ids=server.stop_ids)
      for p, r in zip(todo, sampler.generate(todo, sp)):
        cache[(tuple(p), max_new)] = r
    return [cache[(tuple(p), max_new)] for p in prompts]

  return run


def _expected_content(tok, tokens):
  return serve.assistant_message(tok.decode(tokens, skip_special_tokens=True), "length")[0]["content"] or ""


def test_greedy_chat_matches_sampler_and_usage(server, client, loaded, reference):
  _, _, tok = loaded
  msgs = _msgs("What is 17 * 23?")
  prompt = tok.apply_chat_template(msgs, add_generation_prompt=True)
  assert prompt == chat_format.encode_prompt(tok, msgs)
  ref = reference([prompt], 12)[0]
  res = client.chat(msgs, max_tokens=12, temperature=0.0)
  assert res.ok, res.error
  assert res.text == _expected_content(tok, ref.tokens)
  assert (res.prompt_tokens, res.completion_tokens) == (len(prompt), len(ref.tokens))
  assert not res.usage_estimated
  assert res.finish_reason == ("length" if ref.finish_reason == "length" else "stop")
  # Raw HTTP: the full OpenAI shape and the exact ids (vLLM's return_token_ids extension).
  body = requests.post(server.base_url + "/v1/chat/completions", timeout=60, json={
      "model": NAME, "messages": msgs, "max_completion_tokens": 12, "temperature": 0, "return_token_ids": True,
      "logprobs": True, "some_unknown_field": {"ignored": True}}).json()
  assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-") and body["model"] == NAME
  choice = body["choices"][0]
  assert choice["index"] == 0 and choice["message"]["role"] == "assistant"
  assert body["prompt_token_ids"] == prompt and choice["token_ids"] == ref.tokens
  assert body["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": len(ref.tokens),
                           "total_tokens": len(prompt) + len(ref.tokens)}
  lps = [e["logprob"] for e in choice["logprobs"]["content"]]
  assert lps == pytest.approx(ref.logprobs, abs=1e-5)


def test_concurrent_requests_share_the_batch_and_match_sequential(server, client, loaded, reference):
  _, _, tok = loaded
  calls = [{"messages": _msgs(q), "max_tokens": 10, "temperature": 0.0} for q in QUESTIONS]
  sequential = [client.chat(**c) for c in calls]
  completed_before = server.engine.completed
  concurrent = chat_many([(client, c) for c in calls], max_workers=len(calls))
  assert server.engine.completed - completed_before == len(calls)
  assert server.engine.peak_batch >= 2  # the requests really were decoded together
  assert all(r.ok for r in sequential + concurrent), [r.error for r in sequential + concurrent if not r.ok]
  assert [r.text for r in concurrent] == [r.text for r in sequential]
  assert [r.completion_tokens for r in concurrent] == [r.completion_tokens for r in sequential]
  prompts = [tok.apply_chat_template(c["messages"], add_generation_prompt=True) for c in calls]
  refs = reference(prompts, 10)
  assert [r.text for r in concurrent] == [_expected_content(tok, ref.tokens) for ref in refs]
  assert [r.prompt_tokens for r in concurrent] == [len(p) for p in prompts]


def test_max_tokens_gives_length(client):
  res = client.chat(_msgs("hi"), max_tokens=3, temperature=0.0)
  assert res.ok, res.error
  assert res.finish_reason == "length" and res.completion_tokens == 3


def test_sampling_fields_reach_the_sampler(server):
  """Field parsing only (a sampled request would compile another sampler variant: seconds on CPU)."""
  body = {"seed": 7, "temperature": 0.5, "top_p": 0.9, "top_k": -1, "max_tokens": 1000, "stop_token_ids": [42]}
  sampling, seed = server._sampling(body, 20)
  assert seed == 7
  assert (sampling.temperature, sampling.top_p, sampling.top_k) == (0.5, pytest.approx(0.9), 0)
  assert sampling.max_new_tokens == MAX_LEN - 20  # clamped to the room left in the cache row
  assert sampling.stop_ids == tuple(server.stop_ids) + (42,)
  sampling, _ = server._sampling({"max_completion_tokens": 5, "max_tokens": 9}, 20)
  assert sampling.max_new_tokens == 5 and sampling.temperature == 1.0  # OpenAI's default temperature


def test_completions_and_stop_strings(server, loaded, reference):
  _, _, tok = loaded
  url = server.base_url + "/v1/completions"
  prompt_text = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
  ids = tok.encode(prompt_text)
  ref = reference([ids], 12)[0]
  full = tok.decode(ref.tokens, skip_special_tokens=True)
  r = requests.post(url, json={"prompt": prompt_text, "max_tokens": 12, "temperature": 0}, timeout=60).json()
  assert r["object"] == "text_completion" and r["choices"][0]["text"] == full
  assert r["usage"]["prompt_tokens"] == len(ids) and r["usage"]["completion_tokens"] == len(ref.tokens)
  # A stop string from the middle of the greedy text cuts there, and usage counts the tokens up to it.
  stop = full[len(full) // 2:len(full) // 2 + 3]
  assert stop.strip(), full
  cut = full.find(stop)
  r = requests.post(url, json={"prompt": ids, "max_tokens": 12, "temperature": 0, "stop": [stop],
                               "return_token_ids": True}, timeout=60).json()
  choice = r["choices"][0]
  assert choice["text"] == full[:cut] and choice["finish_reason"] == "stop"
  n = r["usage"]["completion_tokens"]
  assert choice["token_ids"] == ref.tokens[:n] and stop in tok.decode(ref.tokens[:n])
  assert stop not in tok.decode(ref.tokens[:n - 1])


def _post(server, path, data: bytes | dict):
  raw = json.dumps(data).encode() if isinstance(data, dict) else data
  return requests.post(server.base_url + path, data=raw, headers={"Content-Type": "application/json"}, timeout=60)


def test_bad_requests_get_clear_errors_and_the_engine_survives(server, client):
  r = _post(server, "/v1/chat/completions", b'{"messages": [')
  assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
  assert r.json()["error"]["type"] == "invalid_request_error"
  cases = [
      ({"model": NAME}, "'messages' is required"),
      ({"messages": "hi"}, "non-empty list"),
      ({"messages": _msgs("hi"), "n": 2}, "only n=1"),
      ({"messages": _msgs("hi"), "stream": True}, "streaming"),
      ({"messages": _msgs("hi"), "temperature": -1}, "'temperature'"),
      ({"messages": _msgs("hi"), "max_tokens": 0}, "'max_tokens'"),
      ({"messages": _msgs("hi"), "top_p": "high"}, "'top_p'"),
      ({"messages": _msgs("word " * 200)}, "--max-len 128"),
      ({"messages": _msgs("hi"), "tool_choice": "required"}, "tool_choice"),
  ]
  for body, needle in cases:
    r = _post(server, "/v1/chat/completions", body)
    assert r.status_code == 400, (body, r.text)
    assert needle in r.json()["error"]["message"], (needle, r.text)
  assert _post(server, "/v1/completions", {"prompt": [10**9]}).status_code == 400
  r = _post(server, "/v1/chat/completions", {"model": "other", "messages": _msgs("hi")})
  assert r.status_code == 404 and "other" in r.json()["error"]["message"]
  assert _post(server, "/v1/nothing", {}).status_code == 404
  assert requests.get(server.base_url + "/v2/models", timeout=10).status_code == 404
  # The project's client reports a 400 with the server's message, without retrying.
  res = client.chat(_msgs("hi"), max_tokens=4, extra={"n": 2})
  assert not res.ok and res.status_code == 400 and "only n=1" in res.error and res.attempts == 1
  # The engine is still up and serving.
  health = requests.get(server.base_url + "/health", timeout=10)
  assert health.status_code == 200 and health.json()["status"] == "ok"
  ok = client.chat(_msgs("hi"), max_tokens=2, temperature=0.0)
  assert ok.ok and ok.completion_tokens == 2


class _FlakySampler:
  """The slot API of `Sampler` with no model: each turn is [prompt[0] + 1]; `step` raises while `fail` is set."""

  max_len, batch_size = 16, 2

  def __init__(self, fail):
    self.fail, self.rows = fail, {}

  def free_slots(self):
    return [s for s in range(self.batch_size) if s not in self.rows]

  def has_work(self):
    return bool(self.rows)

  def start(self, slot, prompt, sampling, seed=0):
    if max(prompt) >= 100:
      raise ValueError("token ids must be in [0, 100)")
    self.rows[slot] = prompt

  def step(self):
    if self.fail:
      raise FloatingPointError("device on fire")
    return [types.SimpleNamespace(slot=s, tokens=[p[0] + 1], logprobs=[0.0], finish_reason="stop")
            for s, p in self.rows.items()]

  def release(self, slot):
    del self.rows[slot]


def test_engine_survives_bad_prompts_and_failed_steps():
  fail = [True]
  engine = serve.Engine(lambda: _FlakySampler(fail.pop() if fail else False)).start()
  try:
    bad = engine.submit([500], None)
    with pytest.raises(ValueError, match=r"\[0, 100\)"):
      bad.result(timeout=10)
    doomed = engine.submit([1], None)  # its step raises: this request fails, the sampler is rebuilt
    with pytest.raises(RuntimeError, match="device on fire"):
      doomed.result(timeout=10)
    results = [f.result(timeout=10) for f in [engine.submit([i], None) for i in range(5)]]  # 5 > 2 slots
    assert [r.tokens for r in results] == [[i + 1] for i in range(5)]
    assert engine.alive() and engine.completed == 7
  finally:
    engine.close()
  assert not engine.alive()
  with pytest.raises(serve.EngineClosed, match="shutting down"):
    engine.submit([1], None).result(timeout=1)


def test_models_lists_served_name(server):
  body = requests.get(server.base_url + "/v1/models", timeout=10).json()
  assert body["object"] == "list" and [m["id"] for m in body["data"]] == [NAME]
  assert body["data"][0]["max_model_len"] == MAX_LEN


def test_hermes_tool_calls_to_openai_message():
  text = ('<think>\nI should look it up.\n</think>\n\nLet me check.\n'
          '<tool_call>\n{"name": "search", "arguments": {"query": "17 * 23", "k": 3}}\n</tool_call>\n'
          '<tool_call>\n{"name": "calc", "arguments": "{\\"expr\\": \\"17*23\\"}"}\n</tool_call>')
  msg, reason = serve.assistant_message(text, "stop")
  assert reason == "tool_calls"
  assert msg["role"] == "assistant" and msg["content"] == "Let me check."
  assert msg["reasoning_content"] == "I should look it up."
  calls = msg["tool_calls"]
  assert [c["type"] for c in calls] == ["function", "function"] and len({c["id"] for c in calls}) == 2
  assert [c["function"]["name"] for c in calls] == ["search", "calc"]
  assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"query": "17 * 23", "k": 3}, {"expr": "17*23"}]
  assert all(isinstance(c["function"]["arguments"], str) for c in calls)
  # Only a call: content None (as OpenAI sends it). Cut by the length limit: "length" wins.
  only, reason = serve.assistant_message('<tool_call>{"name": "f", "arguments": {}}</tool_call>', "stop")
  assert only["content"] is None and reason == "tool_calls" and "reasoning_content" not in only
  assert serve.assistant_message('<tool_call>{"name": "f", "arguments": {}}</tool_call>', "length")[1] == "length"
  # A block that does not parse stays visible as text; no tool_calls.
  bad, reason = serve.assistant_message("Hmm <tool_call>{not json}</tool_call>", "stop")
  assert reason == "stop" and "tool_calls" not in bad and bad["content"] == "Hmm\n<tool_call>{not json}</tool_call>"
  plain, reason = serve.assistant_message("Just text.", "stop")
  assert plain == {"role": "assistant", "content": "Just text."} and reason == "stop"


def test_openai_messages_render_with_the_chat_template():
  """A multi-turn tool conversation as OpenAI clients send it (null content, arguments as a JSON string, text
  parts) renders with the Qwen3 template exactly as the equivalent plain messages do."""
  tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
  body = {"tools": [tool], "messages": [
      {"role": "user", "content": [{"type": "text", "text": "Weather "}, {"type": "text", "text": "in Paris?"}]},
      {"role": "assistant", "content": None, "tool_calls": [
          {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]}
  tok = tokenizer.load_tokenizer(None)
  got = tok.render_chat(serve.parse_messages(body), tools=serve.parse_tools(body))
  want = chat_format.render_messages(tok, [
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
          "name": "get_weather", "arguments": {"city": "Paris"}}}]},
      {"role": "tool", "content": "sunny"}], tools=[tool])
  assert got == want
  assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in got
  assert "<tool_response>\nsunny\n</tool_response>" in got
  assert json.loads(got.split("<tools>\n")[1].split("\n</tools>")[0]) == tool  # the schema in the system turn
  with pytest.raises(serve.BadRequest, match="image_url"):
    serve.parse_messages({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})
  with pytest.raises(serve.BadRequest, match=r"messages\[0\] \(user\) needs 'content'"):
    serve.parse_messages({"messages": [{"role": "user"}]})


def test_help_explains_every_option():
  parser = argparse.ArgumentParser(prog="orchestra")
  sub = parser.add_subparsers(dest="command")
  p = serve.add_serve_parser(sub)
  text = p.format_help()
  for opt in ("--model", "--port", "--host", "--max-batch", "--max-len", "--served-model-name", "--tokenizer"):
    assert opt in text
  args = parser.parse_args(["serve", "--model", "m", "--port", "0"])
  assert (args.host, args.max_batch, args.port) == ("127.0.0.1", serve.DEFAULT_MAX_BATCH, 0)


def test_run_serve_cli(model_dir, capsys):
  """`run_serve` end to end on this (main) thread: warm-up, prints the URL, answers, stops on Ctrl-C.
  Same shapes as the module's server, so the compiled sampler functions are reused."""
  if threading.current_thread() is not threading.main_thread():
    pytest.skip("Ctrl-C (interrupt_main) reaches only the main thread")
  with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
  parser = argparse.ArgumentParser(prog="orchestra")
  serve.add_serve_parser(parser.add_subparsers(dest="command"))
  args = parser.parse_args(["serve", "--model", str(model_dir), "--port", str(port), "--max-len", str(MAX_LEN),
                            "--max-batch", str(BATCH), "--served-model-name", "cli", "--quiet"])
  url = f"http://127.0.0.1:{port}"
  outcome = {}

  def talk():
    try:
      deadline = time.time() + 60
      while time.time() < deadline:
        try:
          if requests.get(url + "/health", timeout=1).status_code == 200:
            break
        except requests.RequestException:  # not listening yet, or still warming up (connection not served)
          pass
        time.sleep(0.1)
      with ChatClient(url, "cli", max_retries=0) as c:
        outcome["result"] = c.chat(_msgs("hi"), max_tokens=3, temperature=0.0)
    except BaseException as e:  # noqa: BLE001 - reported on the main thread
      outcome["error"] = e
    finally:
      _thread.interrupt_main()  # Ctrl-C

  helper = threading.Thread(target=talk, daemon=True)
  helper.start()
  serve.run_serve(args)
  helper.join(10)
  assert "error" not in outcome, outcome.get("error")
  res = outcome["result"]
  assert res.ok and res.completion_tokens == 3, res.error
  out = capsys.readouterr()
  assert f"serving 'cli' at {url}/v1" in out.out
  assert "warm-up took" in out.err and "stopping" in out.err
  with pytest.raises(requests.ConnectionError):
    requests.get(url + "/health", timeout=2)
