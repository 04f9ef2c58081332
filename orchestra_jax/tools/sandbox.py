"""Run model-written Python in a separate, contained process and report what happened.

Nothing model-written ever runs in the caller's process. `run_python(code)` starts

    trainer ──Popen──▶ launcher P (sandbox_launcher.py: python -I -S, scrubbed env, no stdin, own session)
                         │ unshare(net, mount, pid [, user]) · private /tmp · read-only / · pdeathsig
                         └─fork─▶ reaper C (pid 1 of the new pid namespace; reaps orphans)
                                    └─fork─▶ G: rlimits · setuid(sandbox uid) · exec python -I -u main.py

reads G's stdout / stderr as they come (capped: past the cap the run is killed), enforces the wall-clock
deadline, and returns a `SandboxResult`. Killing = SIGTERM to P, which SIGKILLs its child (with a pid
namespace that ends every process in it) and reaps it, so no zombie is left to an init that may not
reap; if P has not left within 0.5 s the whole process group gets SIGKILL. The script runs unbuffered
(`-u`), so what it printed before a kill is kept.

Containment, strongest available first (`isolation_report()` says what this machine gives):
- network: a new network namespace (only a `lo` that is down: even 127.0.0.1 is unreachable). Root
  needs CAP_SYS_ADMIN; others need unprivileged user namespaces (the namespaces are then made inside a
  new user namespace that maps the caller's own uid). Where neither works, `network="auto"` falls back
  to a *weaker* measure: a bootstrap replaces `_socket.socket` before the script runs, so AF_INET/INET6/
  raw sockets and DNS lookups raise PermissionError. Code can get around that (ctypes, a child process
  such as curl), and `SandboxResult.network_isolated` is then False. `network="namespace"` refuses to
  run without a namespace (SandboxUnavailable); `require_isolation=True` also demands process containment.
- processes: the reaper is pid 1 of a new pid namespace, so when it exits (script done or killed) the
  kernel kills every process left, daemons and `setsid` escapees included. RLIMIT_NPROC bounds fork
  bombs, but the kernel never applies it to uid 0 (nor to holders of CAP_SYS_RESOURCE/CAP_SYS_ADMIN), so
  when the trainer runs as root the script gets an unprivileged uid of its own: each concurrent run
  takes a distinct uid from a pool (`100000 + 1000 * trainer_pid + slot`; no /etc/passwd entry needed),
  which makes NPROC per run and lets a kill sweep by uid catch stragglers where there is no pid
  namespace. For that uid to reach the interpreter, a private mount namespace hides each parent
  directory it cannot traverse (e.g. /root, mode 700, when Python lives in /root/.pyenv) behind an empty
  tmpfs with only the needed child bound back in, which also hides the rest of /root from the script.
  Non-root callers keep their uid; in a user namespace NPROC counts that namespace only (Linux >= 5.14),
  otherwise the limit is raised by the user's current process count. Without any namespace as root (no
  CAP_SYS_ADMIN) and with an interpreter the sandbox uid cannot reach, the script stays uid 0: NPROC does
  not apply and a `setsid` escapee can outlive the run (noted in `isolation["notes"]`).
- filesystem (with a mount namespace and `private_fs`): private size-capped tmpfs over /tmp, /var/tmp and
  /dev/shm (the working dir is bound back in), / remounted read-only, a private /proc showing only the
  sandbox's processes.
- resources: RLIMIT_CPU (SIGXCPU, SIGKILL one second later), RLIMIT_AS, RLIMIT_FSIZE (Python ignores
  SIGXFSZ, so writes fail with EFBIG), RLIMIT_NOFILE, RLIMIT_NPROC, RLIMIT_CORE = 0.
- environment: a fresh temporary working dir that is also HOME and TMPDIR; PATH/LANG basics only (no API
  keys, no proxies); `python -I` (no PYTHON* variables, no user site, script dir not on sys.path).

The launcher is exec'd rather than set up from `preexec_fn`: preexec_fn is unsafe in a threaded parent
(rollout rows run on a thread pool) and can deadlock before exec; Popen here uses only its C-level options
(`start_new_session`, `pass_fds`), so calling `run_python` from many threads at once is fine. Cost: one
extra small interpreter start (~30 ms) per run.
"""
from __future__ import annotations

from orchestra_jax.errors import UserError

import dataclasses
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

CODE_EXEC_USD_PER_S = 8.3e-6  # price of code execution per wall-clock second (docs/design.md section 4)

NETWORK_MODES = ("auto", "namespace", "patch", "allow")
KILLED_REASONS = ("timeout", "output_limit", "memory", "cpu", "file_size", "signal")


class SandboxConfigError(UserError, ValueError):
  """A sandbox setting that cannot work; the message names the field."""


class SandboxUnavailable(UserError, RuntimeError):
  """The isolation the configuration requires is not available on this machine (the message says why)."""


class SandboxError(RuntimeError):
  """The sandbox machinery itself failed (not the sandboxed code): a bug or a broken installation."""


@dataclasses.dataclass(frozen=True)
class SandboxConfig:
  """Limits and isolation of one execution. Sizes in bytes, times in seconds."""

  timeout_s: float = 60.0  # wall clock, start-up included; then the whole process group is killed
  cpu_s: int = 60  # RLIMIT_CPU of the script (SIGXCPU; SIGKILL one second later)
  memory_bytes: int = 2 << 30  # RLIMIT_AS
  file_size_bytes: int = 64 << 20  # RLIMIT_FSIZE: largest file the script can write
  open_files: int = 256  # RLIMIT_NOFILE
  processes: int = 64  # RLIMIT_NPROC (processes + threads of the sandbox uid)
  stdout_bytes: int = 1 << 20  # more stdout than this: killed, killed_reason="output_limit"
  stderr_bytes: int = 256 << 10  # same for stderr
  network: str = "auto"  # auto | namespace (required) | patch (weaker, for tests/benchmarks) | allow
  user: str | int = "auto"  # auto: own uid per run when root; "keep": never change uid; int: that uid
  private_fs: bool = True  # as root / in a user namespace: private /tmp, read-only /, private /proc
  tmpfs_bytes: int = 64 << 20  # size of each private tmpfs (/tmp, /var/tmp, /dev/shm)
  require_isolation: bool = False  # refuse to run unless network AND process containment are real
  use_namespaces: bool = True  # False: no Linux namespaces at all (the weaker fallbacks; for tests/benchmarks)

  def __post_init__(self):
    for name in ("timeout_s", "cpu_s", "memory_bytes", "file_size_bytes", "open_files", "processes",
                 "stdout_bytes", "stderr_bytes", "tmpfs_bytes"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise SandboxConfigError(f"sandbox.{name} must be a positive number, got {value!r}")
    if self.network not in NETWORK_MODES:
      raise SandboxConfigError(f"sandbox.network must be one of {', '.join(NETWORK_MODES)}; got {self.network!r}")
    if not (self.user in ("auto", "keep") or (isinstance(self.user, int) and not isinstance(self.user, bool)
                                                 and 0 < self.user < 2**32 - 1)):
      raise SandboxConfigError(f"sandbox.user must be 'auto', 'keep' or a uid > 0; got {self.user!r}")
    if self.open_files < 16:
      raise SandboxConfigError(f"sandbox.open_files must be at least 16 (Python needs a few), got {self.open_files}")


@dataclasses.dataclass
class SandboxResult:
  """What one execution did. `exit_code` is None when the sandbox killed it (see killed_reason);
  negative when a signal ended it (-N for signal N)."""

  stdout: str
  stderr: str
  exit_code: int | None
  killed_reason: str | None  # None | timeout | output_limit | memory | cpu | file_size | signal
  wall_s: float
  cpu_s: float | None  # user + system CPU of the script (None when killed before it reported)
  cost_usd: float  # CODE_EXEC_USD_PER_S * wall_s
  network_isolated: bool  # True only with a real network namespace
  truncated: bool  # stdout or stderr hit its cap
  isolation: dict[str, Any] = dataclasses.field(default_factory=dict)  # what the launcher managed to set up

  @property
  def ok(self) -> bool:
    return self.exit_code == 0 and self.killed_reason is None

  @property
  def error(self) -> str | None:
    """One line for the model: why it failed (last stderr line, or the kill reason); None when ok."""
    if self.ok:
      return None
    if self.killed_reason == "timeout":
      return "TimeoutError: execution exceeded the time limit and was killed"
    if self.killed_reason == "output_limit":
      return "OutputLimitError: the program printed too much output and was killed"
    if self.killed_reason == "cpu":
      return "CPUTimeLimitError: the program used up its CPU time and was killed"
    if self.killed_reason == "signal" and self.exit_code is not None:
      try:
        name = signal.Signals(-self.exit_code).name
      except ValueError:
        name = str(-self.exit_code)
      return f"killed by signal {name}"
    lines = [line for line in self.stderr.strip().splitlines() if line.strip()]
    if lines:
      return lines[-1].strip()
    if self.killed_reason:
      return f"killed ({self.killed_reason})"
    return f"exit code {self.exit_code}"

  def to_dict(self) -> dict[str, Any]:
    out = dataclasses.asdict(self)
    out["ok"] = self.ok
    out["error"] = self.error
    return out


# The launcher P is a program of its own, `sandbox_launcher.py` next to this file, run by path under
# `python -I -S` in the new session, never in the trainer. It imports nothing from this package (nothing of it is
# importable there) and reports everything it does on the status pipe as JSON lines.
_LAUNCHER_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_launcher.py")

# Weaker network block for machines without network namespaces: runs before the script, in the same
# interpreter, and replaces the socket type so that only AF_UNIX sockets (and wrapped fds) can be made.
_SOCKET_PATCH = r'''
import sys, errno, _socket
_Base = _socket.socket
class _GuardedSocket(_Base):
  __slots__ = ()
  def __init__(self, family=-1, type=-1, proto=-1, fileno=None):
    if fileno is None and (_socket.AF_INET if family == -1 else family) != getattr(_socket, "AF_UNIX", None):
      raise PermissionError(errno.EACCES, "network access is disabled in this sandbox")
    super().__init__(family, type, proto, fileno)
_socket.socket = _socket.SocketType = _GuardedSocket
def _denied(*args, **kwargs):
  raise PermissionError(errno.EACCES, "network access is disabled in this sandbox")
_socket.getaddrinfo = _socket.gethostbyname = _socket.gethostbyname_ex = _socket.gethostbyaddr = _denied
script = sys.argv[1]
sys.argv = sys.argv[1:]
import runpy
runpy.run_path(script, run_name="__main__")
'''


class _UidPool:
  """Distinct unprivileged uids for concurrent runs of this process: base + 1000 * pid + slot."""

  SLOTS = 1000

  def __init__(self, base: int = 100_000):
    self._base = base
    self._free: list[int] | None = None
    self._pid = -1
    self._cond = threading.Condition()

  def acquire(self) -> int:
    with self._cond:
      if self._pid != os.getpid():  # first use, or a forked child: its own range
        self._pid = os.getpid()
        self._free = list(range(self.SLOTS - 1, -1, -1))
      while not self._free:
        self._cond.wait()
      return self._base + self.SLOTS * self._pid + self._free.pop()

  def release(self, uid: int) -> None:
    with self._cond:
      slot = uid - self._base - self.SLOTS * self._pid
      if 0 <= slot < self.SLOTS:
        self._free.append(slot)
        self._cond.notify()


_UIDS = _UidPool()


def _expose_paths() -> list[str]:
  """Directories the sandbox uid must be able to read: the interpreter, its stdlib and site-packages."""
  paths = {os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix), os.path.realpath(sys.exec_prefix),
           os.path.dirname(os.path.realpath(sys.executable)), os.path.dirname(os.path.abspath(sys.executable))}
  return sorted(paths)


def _sandbox_env(workdir: str) -> dict[str, str]:
  """Everything the script sees in os.environ: no API keys, no proxies, nothing from the trainer."""
  bin_dir = os.path.dirname(os.path.abspath(sys.executable))
  return {
      "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
      "HOME": workdir, "TMPDIR": workdir, "USER": "sandbox", "LOGNAME": "sandbox", "TERM": "dumb",
      "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MPLBACKEND": "Agg",
  }


def _kill_uid(uid: int) -> None:
  """SIGKILL every process of `uid` (a per-run uid, so nothing else), until none is left."""
  for _ in range(50):
    found = False
    for entry in os.scandir("/proc"):
      if not entry.name.isdigit():
        continue
      try:
        if entry.stat().st_uid != uid:
          continue
        with open(f"/proc/{entry.name}/stat", "rb") as f:
          if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
            continue
        os.kill(int(entry.name), signal.SIGKILL)
        found = True
      except (OSError, IndexError):
        pass
    if not found:
      return
    time.sleep(0.005)


def _classify(exit_code: int | None, stderr: str, cpu_s: float | None, config: SandboxConfig) -> str | None:
  """Why the script ended abnormally, from its exit status and the tail of its stderr."""
  if exit_code is None or exit_code == 0:
    return None
  tail = stderr[-2000:]
  if exit_code < 0:
    sig = -exit_code
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu_s is not None and cpu_s >= config.cpu_s - 0.05):
      return "cpu"
    if sig == signal.SIGXFSZ:
      return "file_size"
    if sig in (signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT) and "MemoryError" in tail:
      return "memory"
    return "signal"
  last = [line for line in tail.splitlines() if line.strip()][-1:] or [""]
  if "MemoryError" in last[0] or "Cannot allocate memory" in last[0]:
    return "memory"
  if "File too large" in last[0] or "[Errno 27]" in last[0]:
    return "file_size"
  return None


def run_python(code: str, config: SandboxConfig | None = None, files: dict[str, str | bytes] | None = None,
               tmp_root: str | None = None) -> SandboxResult:
  """Execute `code` as a Python script in a contained process; thread-safe.

  `files` are written into the fresh working dir first (relative paths). `tmp_root` is where the
  working dir is made (default: tempfile's). Raises SandboxUnavailable when `config` requires isolation
  this machine cannot give, SandboxError when the sandbox machinery itself fails.
  """
  config = config or SandboxConfig()
  if not isinstance(code, str):
    raise TypeError(f"code must be str, got {type(code).__name__}")
  root = os.geteuid() == 0
  uid = None
  if config.user == "auto" and root:
    uid = _UIDS.acquire()
  elif isinstance(config.user, int) and root:
    uid = config.user
  dedicated_uid = uid is not None and config.user == "auto"
  info: dict[str, Any] = {}
  workdir = tempfile.mkdtemp(prefix="orchestra-sandbox-", dir=tmp_root)
  status_r = status_w = -1
  proc = None
  try:
    script = os.path.join(workdir, "main.py")
    with open(script, "w", encoding="utf-8") as f:
      f.write(code)
    for rel, content in (files or {}).items():
      path = os.path.normpath(os.path.join(workdir, rel))
      if not path.startswith(workdir + os.sep):
        raise SandboxConfigError(f"sandbox file path must stay inside the working dir: {rel!r}")
      os.makedirs(os.path.dirname(path), exist_ok=True)
      with open(path, "wb" if isinstance(content, bytes) else "w") as f:
        f.write(content)
    if uid is not None:
      for dirpath, dirnames, filenames in os.walk(workdir):
        for name in [dirpath] + [os.path.join(dirpath, n) for n in dirnames + filenames]:
          os.chown(name, uid, uid)
    os.chmod(workdir, 0o700)
    status_r, status_w = os.pipe()
    cfg = {
        "status_fd": status_w, "parent": os.getpid(), "network": config.network, "uid": uid,
        "workdir": workdir, "script": script,
        "exe": sys.executable, "expose": _expose_paths() + [workdir], "private_fs": config.private_fs,
        "tmpfs_bytes": int(config.tmpfs_bytes), "require_isolation": config.require_isolation,
        "namespaces": bool(config.use_namespaces),
        "patch": _SOCKET_PATCH,
        "limits": {"cpu": int(config.cpu_s), "as": int(config.memory_bytes), "fsize": int(config.file_size_bytes),
                   "nofile": int(config.open_files), "nproc": int(config.processes)},
    }
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", _LAUNCHER_PATH, json.dumps(cfg)], stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=workdir, env=_sandbox_env(workdir),
        start_new_session=True, pass_fds=(status_w,), close_fds=True)
    os.close(status_w)
    status_w = -1
    out = _Collector(proc, status_r, config, start)
    out.run()
    wall = time.monotonic() - start
    if not out.status_lines and out.killed_reason is None:
      raise SandboxError(f"sandbox launcher failed (exit {proc.returncode}): "
                         f"{out.stderr.decode('utf-8', 'replace')[-2000:]}")
    statuses = [json.loads(line) for line in out.status_lines]
    final: dict[str, Any] = {}
    for entry in statuses:
      if "fatal" in entry:
        if entry.get("kind") == "unavailable":
          raise SandboxUnavailable(entry["fatal"])
        raise SandboxError(entry["fatal"])
      if "started" in entry:
        info = entry["started"]
      if "exit" in entry:
        final = entry
    stdout = out.stdout.decode("utf-8", "replace")
    stderr = out.stderr.decode("utf-8", "replace")
    exit_code = None if out.killed_reason else final.get("exit")
    cpu_s = final.get("cpu_s")
    killed = out.killed_reason or _classify(exit_code, stderr, cpu_s, config)
    if out.killed_reason is None and not final:
      raise SandboxError(f"sandbox launcher ended without reporting (exit {proc.returncode}): {stderr[-2000:]}")
    return SandboxResult(
        stdout=stdout, stderr=stderr, exit_code=exit_code, killed_reason=killed, wall_s=wall, cpu_s=cpu_s,
        cost_usd=CODE_EXEC_USD_PER_S * wall, network_isolated=bool(info.get("netns")), truncated=out.truncated,
        isolation=info)
  finally:
    if proc is not None:
      _kill_group(proc.pid)
      if dedicated_uid and not info.get("pidns"):
        _kill_uid(uid)  # without a pid namespace, stragglers that left the process group
      proc.wait()
      for stream in (proc.stdout, proc.stderr):
        if stream:
          stream.close()
    for fd in (status_r, status_w):
      if fd >= 0:
        os.close(fd)
    shutil.rmtree(workdir, ignore_errors=True)
    if dedicated_uid:
      _UIDS.release(uid)


def _kill_group(pgid: int) -> None:
  try:
    os.killpg(pgid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass


class _Collector:
  """Reads stdout / stderr / status of the launcher until it exits, enforcing the deadline and caps."""

  def __init__(self, proc: subprocess.Popen, status_fd: int, config: SandboxConfig, start: float):
    self.proc, self.config = proc, config
    self.deadline = start + config.timeout_s
    self.stdout = bytearray()
    self.stderr = bytearray()
    self.status = bytearray()
    self.killed_reason: str | None = None
    self._killed_at = 0.0
    self.truncated = False
    self._fds = {proc.stdout.fileno(): "stdout", proc.stderr.fileno(): "stderr", status_fd: "status"}
    self._caps = {"stdout": config.stdout_bytes, "stderr": config.stderr_bytes, "status": 1 << 20}

  @property
  def status_lines(self) -> list[str]:
    return [line for line in self.status.decode("utf-8", "replace").splitlines() if line.strip()]

  def _kill(self, reason: str) -> None:
    # SIGTERM asks the launcher to SIGKILL its child (and so the pid namespace) and reap it; the loop
    # SIGKILLs the whole process group if the launcher has not left within half a second.
    if self.killed_reason is None:
      self.killed_reason = reason
      self._killed_at = time.monotonic()
      try:
        os.kill(self.proc.pid, signal.SIGTERM)
      except ProcessLookupError:
        pass

  def run(self) -> None:
    sel = selectors.DefaultSelector()
    for fd, name in self._fds.items():
      os.set_blocking(fd, False)
      sel.register(fd, selectors.EVENT_READ, name)
    open_pipes = len(self._fds)
    pidfd = None
    try:  # readable when the launcher exits: no polling needed on Linux >= 5.3
      pidfd = os.pidfd_open(self.proc.pid)
      sel.register(pidfd, selectors.EVENT_READ, "exit")
    except (AttributeError, OSError):
      pass
    exited_at = None
    try:
      while open_pipes:
        now = time.monotonic()
        if exited_at is None and self.proc.poll() is not None:
          exited_at = now
          if pidfd is not None:
            sel.unregister(pidfd)
          # The launcher reported and left: end anything the script left in its group so the pipes close.
          _kill_group(self.proc.pid)
        if exited_at is not None and now - exited_at > 2.0:
          break  # a straggler outside the group holds a pipe open; stop reading
        if self.killed_reason is None and now >= self.deadline:
          self._kill("timeout")
        if self.killed_reason is not None and exited_at is None and now - self._killed_at > 0.5:
          _kill_group(self.proc.pid)
        wait = max(0.0, self.deadline - now) if pidfd is not None and exited_at is None else 0.05
        if self.killed_reason is not None:
          wait = min(wait, 0.05)
        for key, _ in sel.select(timeout=wait):
          name = key.data
          if name == "exit":
            continue  # handled by poll() at the top of the loop
          try:
            chunk = os.read(key.fd, 1 << 16)
          except BlockingIOError:
            continue
          if not chunk:
            sel.unregister(key.fd)
            open_pipes -= 1
            continue
          buf = getattr(self, name)
          room = self._caps[name] - len(buf)
          if len(chunk) > room:
            buf += chunk[:max(room, 0)]
            self.truncated = True
            self._kill("output_limit")
          else:
            buf += chunk
    finally:
      sel.close()
      if pidfd is not None:
        os.close(pidfd)


_REPORT: dict[str, Any] | None = None
_REPORT_LOCK = threading.Lock()


def isolation_report(refresh: bool = False) -> dict[str, Any]:
  """What isolation this machine gives (runs `pass` once and caches): the launcher's `started` record
  (netns, userns, mountns, pidns, private_tmp, readonly_root, private_proc, hidden, uid, notes) plus
  `network_isolated` and `python`."""
  global _REPORT
  with _REPORT_LOCK:
    if _REPORT is None or refresh:
      result = run_python("pass", SandboxConfig(timeout_s=30))
      _REPORT = dict(result.isolation, network_isolated=result.network_isolated, python=sys.executable)
      _REPORT.pop("timeout_s", None)
    return dict(_REPORT)


class Sandbox:
  """A `SandboxConfig` bound to `run`: `Sandbox(SandboxConfig(timeout_s=10)).run("print(1)")`."""

  def __init__(self, config: SandboxConfig | None = None, tmp_root: str | None = None):
    self.config = config or SandboxConfig()
    self.tmp_root = tmp_root

  def run(self, code: str, files: dict[str, str | bytes] | None = None) -> SandboxResult:
    return run_python(code, self.config, files=files, tmp_root=self.tmp_root)
