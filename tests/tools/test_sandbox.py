"""The code sandbox with real subprocesses: each test shows containment AND an unaffected test process."""

import os
import resource
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from orchestra_jax.errors import UserError
from orchestra_jax.tools import sandbox
from orchestra_jax.tools.sandbox import CODE_EXEC_USD_PER_S, SandboxConfig, SandboxConfigError, run_python


@pytest.fixture(scope="module")
def report():
  return sandbox.isolation_report()


def _procs_of(uid: int) -> list[int]:
  out = []
  for entry in os.scandir("/proc"):
    if entry.name.isdigit():
      try:
        if entry.stat().st_uid == uid:
          out.append(int(entry.name))
      except OSError:
        pass
  return out


_LIMITS = ("RLIMIT_FSIZE", "RLIMIT_CPU", "RLIMIT_NPROC", "RLIMIT_AS", "RLIMIT_NOFILE")
_OWN_LIMITS = {name: resource.getrlimit(getattr(resource, name)) for name in _LIMITS}


def _test_process_fine():
  """The test process can still fork, exec and write files, and its own limits are untouched."""
  assert subprocess.run(["true"]).returncode == 0
  assert {name: resource.getrlimit(getattr(resource, name)) for name in _LIMITS} == _OWN_LIMITS


def test_normal_code_returns_output():
  r = run_python("import sys\nprint('hello', 6 * 7)\nprint('warn', file=sys.stderr)")
  assert r.ok and r.exit_code == 0 and r.killed_reason is None and r.error is None
  assert r.stdout == "hello 42\n" and r.stderr == "warn\n"
  assert r.wall_s > 0 and r.cost_usd == pytest.approx(CODE_EXEC_USD_PER_S * r.wall_s)
  assert r.to_dict()["ok"] is True


def test_syntax_error_reported():
  r = run_python("def f(:\n  pass\n")
  assert not r.ok and r.exit_code == 1 and r.killed_reason is None
  assert r.error.startswith("SyntaxError")


def test_runtime_error_and_files():
  r = run_python("print(open('data/in.txt').read())\n1/0", files={"data/in.txt": "payload"})
  assert r.stdout == "payload\n" and r.exit_code == 1 and r.error.startswith("ZeroDivisionError")
  with pytest.raises(SandboxConfigError):
    run_python("pass", files={"../escape.txt": "x"})


@pytest.mark.parametrize("network", ["auto", "patch"])
def test_no_network_to_a_live_local_listener(network, report):
  srv = socket.socket()
  srv.bind(("127.0.0.1", 0))
  srv.listen(8)
  srv.settimeout(0.3)
  port = srv.getsockname()[1]
  try:
    code = (f"import socket\ntry:\n  socket.create_connection(('127.0.0.1', {port}), timeout=3)\n  print('CONNECTED')\n"
            f"except OSError as e:\n  print('BLOCKED', e)\n")
    r = run_python(code, SandboxConfig(network=network))
    assert r.ok and r.stdout.startswith("BLOCKED"), r.stdout + r.stderr
    with pytest.raises(socket.timeout):  # nothing ever reached the listener
      srv.accept()
    assert r.network_isolated == (network == "auto" and report["netns"])
    # The test process itself still reaches its listener.
    with socket.create_connection(("127.0.0.1", port), timeout=3):
      conn, _ = srv.accept()
      conn.close()
  finally:
    srv.close()


def test_network_allowed_when_asked():
  srv = socket.socket()
  srv.bind(("127.0.0.1", 0))
  srv.listen(1)
  port = srv.getsockname()[1]
  try:
    r = run_python(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=3)\nprint('CONNECTED')",
                   SandboxConfig(network="allow"))
    assert r.stdout == "CONNECTED\n" and not r.network_isolated
  finally:
    srv.close()


def test_api_keys_do_not_leak(monkeypatch):
  secret = "sk-test-4f9c2a7e1d"
  monkeypatch.setenv("OPENAI_API_KEY", secret)
  monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
  code = ("import os\nprint(os.environ.get('OPENAI_API_KEY'))\n"
          "print(any('sk-test' in v for v in os.environ.values()))\n"
          "print(sorted(k for k in os.environ if 'PROXY' in k.upper()))\nprint(os.environ['HOME'] == os.getcwd())")
  r = run_python(code)
  assert r.stdout.split("\n")[:4] == ["None", "False", "[]", "True"], r.stdout + r.stderr
  assert secret not in r.stdout + r.stderr
  assert os.environ["OPENAI_API_KEY"] == secret


def test_one_gigabyte_file_is_stopped():
  code = ("f = open('big.bin', 'wb')\ntry:\n  for _ in range(1024):\n    f.write(b'x' * (1 << 20))\n"
          "finally:\n  import os, sys\n  print('size', os.path.getsize('big.bin'), file=sys.stderr)\n")
  start = time.monotonic()
  r = run_python(code, SandboxConfig(file_size_bytes=8 << 20))
  assert r.killed_reason == "file_size" and not r.ok, r.stderr
  size = int(r.stderr.split("size ")[1].split()[0])
  assert size <= 8 << 20
  assert time.monotonic() - start < 10
  _test_process_fine()
  with open(os.devnull, "wb") as f:
    f.write(b"x" * (16 << 20))


def test_fork_bomb_is_contained(report):
  bomb = "import os\nwhile True:\n  try:\n    os.fork()\n  except OSError:\n    pass\n"
  start = time.monotonic()
  r = run_python(bomb, SandboxConfig(processes=16, timeout_s=2, cpu_s=5))
  assert time.monotonic() - start < 10
  assert not r.ok and r.killed_reason in ("timeout", "cpu")
  if r.isolation["uid"] != 0:
    assert _procs_of(r.isolation["uid"]) == []  # every process of the bomb is gone
  _test_process_fine()


def test_process_limit_applies(report):
  if report["uid"] == 0 and not report["userns"]:
    pytest.skip("running as root without a uid change: the kernel never applies RLIMIT_NPROC to uid 0")
  code = ("import os, time\nn = 0\nfor _ in range(200):\n  try:\n    pid = os.fork()\n  except OSError:\n    break\n"
          "  if pid == 0:\n    time.sleep(5)\n    os._exit(0)\n  n += 1\nprint(n)\n")
  r = run_python(code, SandboxConfig(processes=10, timeout_s=10))
  assert r.ok and 0 < int(r.stdout) < 10, r.stdout + r.stderr


def test_escaped_daemon_does_not_outlive_the_run(report):
  # A child that leaves the process group (setsid) and sleeps: it must be gone once run_python returns.
  code = "import os, time\nif os.fork() == 0:\n  os.setsid()\n  time.sleep(60)\n  os._exit(0)\nprint('parent done')\n"
  r = run_python(code, SandboxConfig(timeout_s=5))
  assert r.ok and r.stdout == "parent done\n" and r.wall_s < 5
  if r.isolation["uid"] != 0:
    assert _procs_of(r.isolation["uid"]) == []


def test_infinite_loop_killed_at_timeout():
  start = time.monotonic()
  r = run_python("print('started', flush=True)\nwhile True:\n  pass\n", SandboxConfig(timeout_s=1))
  assert r.killed_reason == "timeout" and r.exit_code is None
  assert r.stdout == "started\n"  # output before the kill survives (unbuffered)
  assert 1 <= r.wall_s < 4 and time.monotonic() - start < 5
  assert r.error.startswith("TimeoutError")


def test_hundred_megabytes_of_output_capped():
  r = run_python("import sys\nsys.stdout.write('x' * 100_000_000)\n", SandboxConfig(stdout_bytes=1 << 20))
  assert r.killed_reason == "output_limit" and r.truncated
  assert len(r.stdout) == 1 << 20 and set(r.stdout) == {"x"}
  assert r.wall_s < 10


def test_memory_and_cpu_limits():
  r = run_python("x = bytearray(4 << 30)", SandboxConfig(memory_bytes=512 << 20))
  assert r.killed_reason == "memory" and r.error == "MemoryError"
  r = run_python("while True:\n  pass\n", SandboxConfig(cpu_s=1, timeout_s=10))
  assert r.killed_reason == "cpu" and r.exit_code is not None and r.exit_code < 0


def test_filesystem_outside_workdir_is_read_only(report):
  if not report["readonly_root"]:
    pytest.skip("no mount namespace here: / stays as writable as the sandbox uid's permissions allow")
  r = run_python("open('ok.txt', 'w').write('x')\nopen('/etc/orchestra-sandbox-probe', 'w')")
  assert "Read-only file system" in r.stderr and not os.path.exists("/etc/orchestra-sandbox-probe")


def test_interpreter_and_venv_are_reachable_but_read_only(report):
  """The trainer's interpreter (a venv, perhaps under /tmp like a CI clone) runs the script but cannot be changed."""
  import sys
  if not report["readonly_root"]:
    pytest.skip("no mount namespace here")
  probe = os.path.join(sys.prefix, "orchestra-sandbox-probe")
  r = run_python(f"import sys\nprint(sys.prefix)\nopen({probe!r}, 'w')")
  assert r.stdout.splitlines()[0] == sys.prefix
  assert "Read-only file system" in r.stderr or "Permission denied" in r.stderr
  assert not os.path.exists(probe)


def test_concurrent_runs_from_threads():
  with ThreadPoolExecutor(6) as pool:
    results = list(pool.map(lambda i: run_python(f"print({i} * {i})"), range(12)))
  assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(12)]


def test_weaker_fallback_without_namespaces():
  # What a machine without namespaces gets: the socket patch (network_isolated False), still no keys.
  srv = socket.socket()
  srv.bind(("127.0.0.1", 0))
  srv.listen(1)
  srv.settimeout(0.3)
  try:
    code = f"import socket\nsocket.create_connection(('127.0.0.1', {srv.getsockname()[1]}), timeout=3)\n"
    r = run_python(code, SandboxConfig(use_namespaces=False))
    assert r.error == "PermissionError: [Errno 13] network access is disabled in this sandbox"
    assert not r.network_isolated and not r.isolation["pidns"]
    with pytest.raises(socket.timeout):
      srv.accept()
  finally:
    srv.close()
  for kwargs in ({"network": "namespace"}, {"require_isolation": True}):
    with pytest.raises(sandbox.SandboxUnavailable, match="namespaces disabled") as err:
      run_python("pass", SandboxConfig(use_namespaces=False, **kwargs))
    assert isinstance(err.value, UserError)


def test_config_errors_are_user_errors():
  for kwargs in ({"network": "bogus"}, {"timeout_s": 0}, {"user": "root"}, {"open_files": 3}):
    with pytest.raises(SandboxConfigError) as err:
      SandboxConfig(**kwargs)
    assert isinstance(err.value, UserError) and "sandbox." in str(err.value)
