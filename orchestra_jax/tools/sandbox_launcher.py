"""The sandbox launcher P of `orchestra_jax/tools/sandbox.py`: a program of its own, run by path as

    python -I -S sandbox_launcher.py '<json config>'

in the new session, never in the trainer. It sets up the containment (namespaces, mounts, uid, rlimits), forks
the reaper C and the script's process G, and reports on the status pipe `status_fd` as JSON lines:
`{"started": info}`, then `{"exit": code, "cpu_s": s, "maxrss_kb": kb}`, or `{"fatal": message, "kind": kind}`.

Standard library only, and no import of orchestra_jax: it runs under `-I -S` with a scrubbed environment, where
neither the package nor site-packages is on the path. The interpreter reads this file once at start-up, as the
caller's uid and before any namespace or mount change, so the file needs no exposure to the sandbox uid (only G,
which execs `python -I -u main.py`, runs as that uid). Importing it runs nothing: `main(sys.argv)` is the program.
"""

import ctypes
import json
import os
import resource
import signal
import stat
import sys

NEWNS, NEWUSER, NEWPID, NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = (
    1, 2, 4, 8, 32, 4096, 16384, 1 << 18)
PR_SET_PDEATHSIG = 1

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
libc.unshare.argtypes = [ctypes.c_int]
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


def check(rc):
  if rc != 0:
    e = ctypes.get_errno()
    raise OSError(e, os.strerror(e))


def enc(s):
  return None if s is None else s.encode()


def mount(src, target, fstype, flags, data=None):
  check(libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)))


def pdeathsig(parent):
  # Die with the parent; `parent` None: cannot check for the race (parent outside our pid namespace).
  libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)
  if parent is not None and os.getppid() != parent:
    os._exit(137)


def accessible(path):
  # every ancestor traversable by "others" (the sandbox uid is no member of any group)
  cur = "/"
  for comp in [c for c in path.split("/") if c]:
    if not os.stat(cur).st_mode & 0o001:
      return False
    cur = os.path.join(cur, comp)
  return True


def mask(directory, keep, size, readonly=()):
  # Cover `directory` with an empty tmpfs, then bind back `keep` (its direct children) from the original;
  # those in `readonly` are bound read-only.
  fds = {}
  for name in sorted(keep):
    fds[name] = os.open(os.path.join(directory, name), os.O_PATH | os.O_NOFOLLOW)
  mode = oct(os.stat(directory).st_mode & 0o7777)[2:] if directory in ("/tmp", "/var/tmp", "/dev/shm") else "755"
  mount("tmpfs", directory, "tmpfs", MS_NOSUID | MS_NODEV, "size=%d,mode=%s" % (size, mode))
  for name, fd in fds.items():
    target = os.path.join(directory, name)
    if stat.S_ISDIR(os.fstat(fd).st_mode):
      os.mkdir(target, 0o755)
    else:
      os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
    mount("/proc/self/fd/%d" % fd, target, None, MS_BIND | MS_REC)
    if name in readonly:
      mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
    os.close(fd)


def main(args):
  cfg = json.loads(args[1])
  STATUS = cfg["status_fd"]
  os.set_inheritable(STATUS, False)

  def emit(**kw):
    os.write(STATUS, (json.dumps(kw) + "\n").encode())

  def fatal(msg, code=121, kind="error"):
    try:
      emit(fatal=msg, kind=kind)
    finally:
      os._exit(code)

  info = {"netns": False, "userns": False, "mountns": False, "pidns": False, "private_tmp": False,
          "readonly_root": False, "private_proc": False, "hidden": [], "uid": os.getuid(), "notes": []}
  root = os.geteuid() == 0
  net = cfg["network"]
  want_net = net in ("auto", "namespace")
  drop = cfg["uid"] is not None and root
  pdeathsig(cfg["parent"])

  def try_unshare(flag, name):
    try:
      check(libc.unshare(flag))
      info[name] = True
    except OSError as e:
      info["notes"].append("unshare(%s): %s" % (name, e.strerror))

  if not cfg["namespaces"]:
    info["notes"].append("namespaces disabled by configuration (use_namespaces=False)")
  if not root and cfg["namespaces"]:
    uid, gid = os.getuid(), os.getgid()
    try_unshare(NEWUSER, "userns")
    if info["userns"]:
      try:
        for path, text in (("/proc/self/setgroups", "deny"), ("/proc/self/uid_map", "%d %d 1" % (uid, uid)),
                           ("/proc/self/gid_map", "%d %d 1" % (gid, gid))):
          with open(path, "w") as f:
            f.write(text)
      except OSError as e:
        info["notes"].append("user namespace maps: %s" % e)
  if (root and cfg["namespaces"]) or info["userns"]:
    if want_net:
      try_unshare(NEWNET, "netns")
    try_unshare(NEWNS, "mountns")
    try_unshare(NEWPID, "pidns")
  if net == "namespace" and not info["netns"]:
    fatal("network='namespace' but no network namespace could be created: " + "; ".join(info["notes"]), 120,
          "unavailable")

  workdir = cfg["workdir"]
  if info["mountns"]:
    try:
      mount(None, "/", None, MS_REC | MS_PRIVATE)
      if drop:
        # Make the interpreter reachable for the sandbox uid: hide each blocking parent behind a tmpfs
        # that holds only the path to the interpreter (e.g. /root -> tmpfs with /root/.pyenv bound in).
        # A failure here leaves the path blocked, and the uid change below is skipped.
        for _ in range(16):
          groups = {}
          for target in cfg["expose"]:
            cur = "/"
            for comp in [c for c in target.split("/") if c]:
              if not os.stat(cur).st_mode & 0o001:
                groups.setdefault(cur, set()).add(comp)
                break
              cur = os.path.join(cur, comp)
          if not groups:
            break
          for directory, keep in groups.items():
            mask(directory, keep, 1 << 20)
            info["hidden"].append(directory)
      if cfg["private_fs"]:
        covered = False
        for directory in ("/tmp", "/var/tmp", "/dev/shm"):
          if os.path.isdir(directory) and not os.path.islink(directory):
            def child_of(path):
              rel = os.path.relpath(path, directory)
              return None if rel.startswith("..") else rel.split("/")[0]
            # The work dir stays writable; an interpreter or venv living under /tmp (a CI clone, say) must stay
            # reachable, read-only.
            work = child_of(workdir)
            interpreter = {c for c in map(child_of, cfg["expose"]) if c}
            keep = interpreter | ({work} if work else set())
            mask(directory, keep, cfg["tmpfs_bytes"], readonly=interpreter - {work})
            covered = covered or bool(work)
        info["private_tmp"] = True
        if not covered:
          mount(workdir, workdir, None, MS_BIND | MS_REC)
        mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY)
        info["readonly_root"] = True
    except OSError as e:
      info["notes"].append("private filesystem: %s" % e)
    os.chdir(workdir)  # through the new mounts: the old cwd may sit on the now read-only /

  uid = cfg["uid"] if drop else None
  if drop:
    blocked = [p for p in cfg["expose"] if not accessible(p)]
    if blocked:  # no mount namespace (or hiding failed): the interpreter would be out of the uid's reach
      info["notes"].append("kept uid 0 (RLIMIT_NPROC does not apply): uid %d could not reach %s" % (uid, blocked[0]))
      uid = None
  if uid is not None:
    info["uid"] = uid
  if cfg["require_isolation"]:
    missing = []
    if not info["netns"] and net != "allow":
      missing.append("network namespace")
    if not info["pidns"] and uid is None:
      missing.append("process containment (pid namespace or unprivileged uid)")
    if missing:
      fatal("require_isolation: no " + " and no ".join(missing) + " (" + "; ".join(info["notes"]) + ")", 120,
            "unavailable")

  def child(parent):
    # G: the script's process.
    try:
      lim = cfg["limits"]
      for name, value in (("RLIMIT_CPU", (lim["cpu"], lim["cpu"] + 1)), ("RLIMIT_AS", lim["as"]),
                          ("RLIMIT_FSIZE", lim["fsize"]), ("RLIMIT_NOFILE", lim["nofile"]),
                          ("RLIMIT_CORE", 0), ("RLIMIT_NPROC", lim["nproc"])):
        value = value if isinstance(value, tuple) else (value, value)
        if name == "RLIMIT_NPROC" and uid is None and not info["userns"]:
          # Same uid as the trainer: the count includes all of the user's processes.
          mine = 0
          for entry in os.scandir("/proc"):
            try:
              mine += entry.name.isdigit() and entry.stat().st_uid == os.getuid()
            except OSError:
              pass
          value = (value[0] + mine, value[1] + mine)
        resource.setrlimit(getattr(resource, name), value)
      if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
      pdeathsig(parent)
      exe = cfg["exe"]
      if net == "patch" or (net == "auto" and not info["netns"]):
        argv = [exe, "-I", "-u", "-c", cfg["patch"], cfg["script"]]
      else:
        argv = [exe, "-I", "-u", cfg["script"]]
      os.execv(exe, argv)
    except BaseException as e:
      fatal("could not start the sandboxed interpreter: %r" % (e,), 127)

  child_pid = None
  def on_term(signum, frame):
    # The trainer's polite kill: SIGKILL our child (in a pid namespace that ends every process in it),
    # then reap it and exit, so nothing is left for an init that may not reap.
    if child_pid is not None:
      try:
        os.kill(child_pid, 9)
      except OSError:
        pass
  signal.signal(signal.SIGTERM, on_term)

  def supervise():
    # Fork G and wait for it (as pid 1 also reaping orphans); report its status.
    nonlocal child_pid
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
      child(parent)
    child_pid = pid
    while True:
      try:
        wpid, status, ru = os.wait4(-1, 0)
      except ChildProcessError:
        fatal("lost the sandboxed process")
      if wpid == pid:
        break
    emit(exit=os.waitstatus_to_exitcode(status), cpu_s=ru.ru_utime + ru.ru_stime, maxrss_kb=ru.ru_maxrss)

  if info["pidns"]:
    pid = os.fork()
    if pid == 0:
      pdeathsig(None)
      if info["mountns"]:
        try:
          mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
          info["private_proc"] = True
        except OSError as e:
          info["notes"].append("private /proc: %s" % e)
      emit(started=info)
      supervise()
      os._exit(0)
    child_pid = pid
    _, status = os.waitpid(pid, 0)
    os._exit(0 if status == 0 else 122)
  emit(started=info)
  supervise()
  os._exit(0)


if __name__ == "__main__":
  main(sys.argv)
