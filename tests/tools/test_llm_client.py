"""`ChatClient` against the real `ScriptedServer` on 127.0.0.1: answers, prices, retries and every fault mode.

No mocks: each test talks HTTP to a live server, so the retry, timeout and error paths run exactly as they
would against vLLM. Timeouts and backoffs are a fraction of a second to keep the file fast.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
import requests

from orchestra_jax.tools import llm_client
from orchestra_jax.tools.llm_client import ChatClient, ClientConfigError, chat_many
from orchestra_jax.tools.scripted_server import Reply, ScriptError, ScriptedServer

USER = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is two plus two?"}]
SECRET = "sk-test-0123456789abcdef-DO-NOT-LEAK"


def _script():
  return {
      "adder": {"rules": [{"contains": "two plus two", "answer": "four of course", "delay_s": 0.1},
                          {"regex": r"^tool", "tool_calls": [{"name": "search", "arguments": {"q": "x"}}]}],
                "default": {"answer": "no idea", "prompt_tokens": 11, "completion_tokens": 7}},
      "always500": {"fault": "status:500"},
      "flaky429": {"fault": "status:429:2", "retry_after": 0},
      "slow429": {"fault": "status:429:1", "retry_after": 100},
      "bad400": {"fault": "status:400"},
      "refuser": {"fault": "refuse"},
      "garbled": {"fault": "malformed_json"},
      "nousage": {"fault": "no_usage"},
      "nochoices": {"fault": "missing_choices"},
      "hanger": {"fault": "hang"},
      "echo": lambda messages, body: Reply(text=messages[-1]["content"], delay_s=0.2),
  }


@pytest.fixture(scope="module")
def server():
  with ScriptedServer(_script()) as srv:
    yield srv


@pytest.fixture
def srv(server):
  server.reset()
  return server


def _client(srv, model, **kw) -> ChatClient:
  kw.setdefault("backoff_s", 0.01)
  kw.setdefault("read_timeout", 5.0)
  return ChatClient(srv.base_url, model, **kw)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_happy_path_text_tokens_cost_latency(srv):
  client = _client(srv, "adder", price_in_per_m=2.0, price_out_per_m=8.0)
  r = client.chat(USER, max_tokens=50, temperature=0.7, stop="###", extra={"seed": 3})
  assert r.ok and r.error is None and r.warning is None
  assert r.text == "four of course" and r.tool_calls == [] and r.finish_reason == "stop"
  assert (r.prompt_tokens, r.completion_tokens) == (3 + 5, 3)  # whitespace words of all messages / the answer
  assert r.cost_usd == pytest.approx(8 * 2.0 / 1e6 + 3 * 8.0 / 1e6)
  assert r.latency_s >= 0.1 and r.attempts == 1 and r.model == "adder" and r.status_code == 200
  body = srv.received[-1]["body"]
  assert srv.received[-1]["path"] == "/v1/chat/completions"
  assert body["model"] == "adder" and body["messages"] == USER
  assert (body["max_tokens"], body["temperature"], body["stop"], body["seed"]) == (50, 0.7, ["###"], 3)
  assert "Authorization" not in srv.received[-1]["headers"]
  assert json.loads(json.dumps(r.to_dict()))["cost_usd"] == r.cost_usd  # a ledger can store it as JSON

  # Scripted token counts override the defaults; cost follows them.
  r = client.chat([{"role": "user", "content": "something else"}])
  assert (r.text, r.prompt_tokens, r.completion_tokens) == ("no idea", 11, 7)
  assert r.cost_usd == pytest.approx(11 * 2e-6 + 7 * 8e-6)


def test_tool_calls_and_v1_base_url(srv):
  client = ChatClient(srv.base_url + "/v1/", "adder")  # the OpenAI-SDK spelling of the same endpoint
  r = client.chat([{"role": "user", "content": "tool please"}],
                  tools=[{"type": "function", "function": {"name": "search", "parameters": {}}}])
  assert r.ok and r.text == "" and r.finish_reason == "tool_calls"
  (call,) = r.tool_calls
  assert call["function"]["name"] == "search" and json.loads(call["function"]["arguments"]) == {"q": "x"}
  assert srv.received[-1]["body"]["tools"][0]["function"]["name"] == "search"


def test_models_listing(srv):
  data = requests.get(srv.base_url + "/v1/models", timeout=5).json()
  assert data["object"] == "list" and {"adder", "hanger", "echo"} <= {m["id"] for m in data["data"]}


def test_connection_refused():
  port = _free_port()  # bound then released: nothing listens there now
  client = ChatClient(f"http://127.0.0.1:{port}", "m", max_retries=2, backoff_s=0.01)
  r = client.chat(USER)
  assert not r.ok and r.attempts == 3 and r.status_code is None
  assert r.error == f"tool endpoint http://127.0.0.1:{port} refused the connection after 3 attempts"
  assert (r.text, r.prompt_tokens, r.completion_tokens, r.cost_usd) == ("", 0, 0, 0.0)


def test_server_closes_connection(srv):
  r = _client(srv, "refuser", max_retries=1).chat(USER)
  assert not r.ok and r.attempts == 2 and "closed the connection" in r.error


def test_500_is_retried_then_reported(srv):
  r = _client(srv, "always500", max_retries=2).chat(USER)
  assert not r.ok and r.attempts == 3 and r.status_code == 500
  assert "failed with HTTP 500 after 3 attempts" in r.error
  assert len(srv.received) == 3


def test_429_twice_then_ok(srv):
  r = _client(srv, "flaky429", max_retries=3).chat(USER)
  assert r.ok and r.attempts == 3 and r.text == "echo: What is two plus two?"
  assert len(srv.received) == 3


def test_retry_after_is_capped(srv):
  start = time.perf_counter()
  r = _client(srv, "slow429", retry_after_cap_s=0.05).chat(USER)  # the server asks for 100 s
  assert r.ok and r.attempts == 2 and time.perf_counter() - start < 2.0
  assert llm_client._retry_after_seconds("2.5") == 2.5
  assert llm_client._retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # a date in the past
  assert llm_client._retry_after_seconds("soon") is None


def test_other_4xx_not_retried(srv):
  r = _client(srv, "bad400", max_retries=3).chat(USER)
  assert not r.ok and r.attempts == 1 and r.status_code == 400
  assert "rejected the request with HTTP 400" in r.error and "scripted fault" in r.error


def test_malformed_json(srv):
  r = _client(srv, "garbled").chat(USER)
  assert not r.ok and r.attempts == 1 and "not valid JSON" in r.error and srv.base_url in r.error


def test_missing_choices(srv):
  r = _client(srv, "nochoices").chat(USER)
  assert not r.ok and r.error == f"tool endpoint {srv.base_url} returned a response without choices"


def test_missing_usage_is_estimated_with_warning(srv):
  r = _client(srv, "nousage", price_in_per_m=1.0, price_out_per_m=1.0).chat(USER)
  assert r.ok and r.usage_estimated and "no usage" in r.warning and "4 characters" in r.warning
  prompt_chars = len("You are terse.\nWhat is two plus two?")
  assert r.prompt_tokens == -(-prompt_chars // 4) and r.completion_tokens == -(-len(r.text) // 4)
  assert r.cost_usd > 0 and r.cost_usd == pytest.approx((r.prompt_tokens + r.completion_tokens) / 1e6)

  words = lambda s: len(s.split())  # noqa: E731 - a stand-in for a real tokenizer
  r = _client(srv, "nousage", count_tokens=words).chat(USER)
  assert r.ok and "count_tokens" in r.warning and (r.prompt_tokens, r.completion_tokens) == (8, 6)


def test_hang_hits_read_timeout_quickly(srv):
  start = time.perf_counter()
  r = _client(srv, "hanger", read_timeout=0.3, max_retries=1).chat(USER)
  elapsed = time.perf_counter() - start
  assert not r.ok and r.attempts == 2 and "timeout" in r.error and "0.3 s" in r.error
  assert 0.6 <= r.latency_s <= elapsed < 3.0


def test_api_key_sent_but_never_shown(srv, monkeypatch):
  monkeypatch.setenv("ORCH_TEST_KEY", SECRET)
  ok = _client(srv, "adder", api_key_env="ORCH_TEST_KEY").chat(USER)
  assert ok.ok and srv.received[-1]["headers"]["Authorization"] == f"Bearer {SECRET}"
  bad = _client(srv, "always500", api_key_env="ORCH_TEST_KEY", max_retries=1)
  r = bad.chat(USER)
  assert not r.ok
  for text in (r.error, repr(r), repr(bad), str(r.to_dict()), repr(ok)):
    assert SECRET not in text
  assert "ORCH_TEST_KEY" in repr(bad)  # the variable's name is fine to show

  monkeypatch.delenv("ORCH_TEST_KEY")
  n = len(srv.received)
  r = _client(srv, "adder", api_key_env="ORCH_TEST_KEY").chat(USER)
  assert not r.ok and r.attempts == 0 and "ORCH_TEST_KEY is not set" in r.error and len(srv.received) == n


def test_key_echoed_by_endpoint_is_scrubbed(monkeypatch):
  """An endpoint that echoes the request (headers included) in its error body must not leak the key."""
  monkeypatch.setenv("ORCH_TEST_KEY", SECRET)
  listener = socket.socket()
  listener.bind(("127.0.0.1", 0))
  listener.listen(1)

  def serve_once():
    conn, _ = listener.accept()
    with conn:
      lines = conn.recv(65536).decode("latin-1").split("\r\n")
      lines.sort(key=lambda line: not line.startswith("Authorization"))  # the key first: not cut by excerpting
      body = json.dumps({"error": {"message": "bad request: " + " | ".join(lines)}}).encode()
      conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nConnection: close\r\n"
                   b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)

  thread = threading.Thread(target=serve_once, daemon=True)
  thread.start()
  client = ChatClient(f"http://127.0.0.1:{listener.getsockname()[1]}", "m", api_key_env="ORCH_TEST_KEY")
  r = client.chat(USER)
  thread.join(5)
  listener.close()
  assert not r.ok and "HTTP 400" in r.error and "Bearer ***" in r.error and SECRET not in r.error


def test_chat_many_runs_concurrently(srv):
  client = _client(srv, "echo")  # every call waits 0.2 s on the server
  calls = [[{"role": "user", "content": f"message {i}"}] for i in range(32)]
  start = time.perf_counter()
  results = client.chat_many(calls, max_workers=32)
  wall = time.perf_counter() - start
  assert all(r.ok for r in results)
  assert [r.text for r in results] == [f"message {i}" for i in range(32)]  # input order
  assert all(r.latency_s >= 0.2 for r in results)
  assert wall < 0.5 * 32 * 0.2, f"32 calls of 0.2 s took {wall:.2f} s"


def test_module_chat_many_mixes_clients(srv):
  a, b = _client(srv, "adder"), _client(srv, "garbled")
  results = chat_many([(a, {"messages": USER, "max_tokens": 2}), (b, USER), (a, USER)], max_workers=3)
  assert [r.ok for r in results] == [True, False, True]
  assert results[0].text == "four of" and results[0].finish_reason == "length"  # cut to max_tokens words
  assert chat_many([], max_workers=4) == []


def test_bad_arguments_raise_user_errors():
  with pytest.raises(ClientConfigError, match="base_url"):
    ChatClient("localhost:8000", "m")
  with pytest.raises(ClientConfigError, match="read_timeout"):
    ChatClient("http://127.0.0.1:1", "m", read_timeout=0)
  with pytest.raises(ScriptError, match="unknown fault"):
    ScriptedServer({"m": {"fault": "explode"}})
  with pytest.raises(ScriptError, match="unknown key"):
    ScriptedServer({"m": {"rules": [{"contians": "x"}]}})


def test_cli_serves_a_json_script(tmp_path):
  script = tmp_path / "rules.json"
  script.write_text(json.dumps({"models": {"demo": {"rules": [{"contains": "capital", "answer": "Paris"}]}}}))
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  cmd = [sys.executable, "-m", "orchestra_jax.tools.scripted_server"]
  assert "--script" in subprocess.run(cmd + ["--help"], capture_output=True, text=True, check=True, env=env).stdout
  with subprocess.Popen(cmd + ["--port", "0", "--script", str(script)], stdout=subprocess.PIPE, text=True,
                        env=env) as proc:
    try:
      base_url = proc.stdout.readline().strip()
      assert base_url.startswith("http://127.0.0.1:")
      with ChatClient(base_url, "demo") as client:
        r = client.chat([{"role": "user", "content": "The capital of France?"}])
      assert r.ok and r.text == "Paris" and r.prompt_tokens == 4
    finally:
      proc.terminate()
  bad = tmp_path / "bad.json"
  bad.write_text("{not json")
  out = subprocess.run(cmd + ["--script", str(bad)], capture_output=True, text=True, env=env)
  assert out.returncode == 2 and "not valid JSON" in out.stderr
