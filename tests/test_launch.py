"""launch/tpu_pod.sh, launch/gpu.sh and orchestra_jax.distributed's environment checks.

The scripts run under `bash` in subprocesses. Nothing here needs gcloud, ssh, SLURM or an accelerator: dry runs
print commands, and a fake `gcloud` (which runs `ssh --command` locally in a temporary "worker" home) drives one
end-to-end pass of tpu_pod.sh. No multi-process JAX run is started.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TPU = ROOT / "launch" / "tpu_pod.sh"
GPU = ROOT / "launch" / "gpu.sh"
CONFIG = "configs/tiny.py"

# Overrides that a naive launcher would mangle: spaces, both quote kinds, shell metacharacters.
TRICKY = ["--config.run.name=my run", "--config.note=it's \"quoted\" $HOME; echo pwned", "--config.seed", "7"]

TPU_BASE = ["--name", "pod-1", "--zone", "us-east5-a", "--accelerator-type", "v5p-64", "--config", CONFIG]


def sh(script: Path, *args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
  return subprocess.run(["bash", str(script), *args], capture_output=True, text=True, env=env,
                        cwd=cwd or ROOT, timeout=60)


def commands(out: str) -> list[list[str]]:
  """The `+ ` lines of a dry run, each split back into its words the way a shell would."""
  return [shlex.split(line[2:]) for line in out.splitlines() if line.startswith("+ ")]


def remote_command(words: list[str]) -> str:
  return words[words.index("--command") + 1]


def trainer_args(shell_code: str) -> list[str]:
  """The words after `orchestra train` in a remote command line (up to the `2>&1 | tee` or redirection)."""
  words = shlex.split(shell_code)
  start = next(i for i, w in enumerate(words) if w.endswith("bin/orchestra")) + 1
  assert words[start] == "train"
  end = next((i for i in range(start, len(words)) if words[i] in ("2>&1", ">", "|")), len(words))
  return words[start + 1:end]


def hostname() -> str:
  """What `$(hostname)` gives in the remote commands (run here by the fakes)."""
  return subprocess.run(["hostname"], capture_output=True, text=True, check=True).stdout.strip()


def unprefixed(line: str) -> str:
  """A line of tpu_pod.sh's pre-flight output without its "[<worker hostname>] " prefix."""
  prefix = f"[{hostname()}] "
  assert line.startswith(prefix), line
  return line[len(prefix):]


def path_without(tmp_path: Path, *names: str) -> str:
  """A PATH with every command of the current PATH except `names` (merged /usr makes PATH=/bin unsafe)."""
  d = tmp_path / "bin_without"
  d.mkdir()
  for folder in os.environ.get("PATH", "").split(os.pathsep):
    if not os.path.isdir(folder):
      continue
    for entry in os.listdir(folder):
      target = os.path.join(folder, entry)
      if entry in names or (d / entry).exists() or not os.access(target, os.X_OK) or os.path.isdir(target):
        continue
      (d / entry).symlink_to(target)
  return str(d)


# ----------------------------------------------------------------------------------------------------------------
# Static checks


@pytest.mark.parametrize("script", [TPU, GPU], ids=lambda p: p.name)
def test_bash_syntax(script):
  r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
  assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("script", [TPU, GPU], ids=lambda p: p.name)
def test_shellcheck(script):
  if shutil.which("shellcheck") is None:
    pytest.skip("shellcheck not installed")
  r = subprocess.run(["shellcheck", "-S", "warning", str(script)], capture_output=True, text=True)
  assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("script", [TPU, GPU], ids=lambda p: p.name)
def test_help_documents_every_flag(script):
  r = sh(script, "--help")
  assert r.returncode == 0 and r.stdout.startswith("Usage:")
  text = script.read_text()
  parsed = set()
  for line in text.splitlines():  # the flags of the `case $flag in` parser
    line = line.strip()
    if line.startswith("--") and ")" in line and not line.startswith("--)"):
      parsed.update(f for f in line.split(")")[0].split("|") if f.startswith("--") and "*" not in f)
  assert len(parsed) > 10
  for flag in parsed:
    assert flag in r.stdout, f"{script.name} --help does not mention {flag}"


# ----------------------------------------------------------------------------------------------------------------
# tpu_pod.sh


def test_tpu_dry_run_prints_every_step(tmp_path):
  env = dict(os.environ, PATH=path_without(tmp_path, "gcloud"))  # a dry run needs no gcloud
  r = sh(TPU, "--dry-run", *TPU_BASE, "--spot", "--project", "my-proj", *TRICKY[:2],
         "--env", "ORCHESTRA_DATA_DIR=/mnt/my data", "--", *TRICKY[2:], env=env)
  assert r.returncode == 0, r.stderr
  cmds = commands(r.stdout)
  assert all(line.startswith(("+ ", "# ")) for line in r.stdout.splitlines()), r.stdout
  loc = ["--zone", "us-east5-a", "--project", "my-proj"]

  describe, create = cmds[0], cmds[1]
  assert describe[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "describe", "pod-1"] and describe[6:10] == loc
  assert create[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "create", "pod-1"]
  assert create[6:10] == loc
  assert create[create.index("--accelerator-type") + 1] == "v5p-64"
  assert create[create.index("--version") + 1] == "v2-alpha-tpuv5"
  assert "--spot" in create

  archive = next(c for c in cmds if c[0] == "git")
  assert archive[:3] == ["git", "-C", str(ROOT)] and "archive" in archive and archive[-1] == "HEAD"
  scp = next(c for c in cmds if c[4] == "scp" if c[0] == "gcloud")
  assert "--worker=all" in scp and scp[5] == archive[archive.index("-o") + 1]

  ssh = [c for c in cmds if c[0] == "gcloud" and c[4] == "ssh"]
  assert all(c[5] == "pod-1" for c in ssh)
  assert len(ssh) == 4 and all("--worker=all" in c for c in ssh)  # the pre-flight too: each worker checks itself
  unpack, install, check, train = (remote_command(c) for c in ssh)
  assert trainer_args(check) == ["--config", CONFIG, *TRICKY, "--check"]
  assert "ORCHESTRA_DISTRIBUTED=1" in check and "'ORCHESTRA_DATA_DIR=/mnt/my data'" in check
  assert "tar -xzf" in unpack
  assert "-m venv .venv" in install and "[ -f constraints.txt ]" in install
  # the exact tested set, shipped with the code; jax[tpu] follows its jax pin
  assert "pip install --quiet -c constraints.txt -e . 'jax[tpu]';" in install and "jax[tpu]==" not in install
  assert "ORCHESTRA_DISTRIBUTED=1" in train and "'ORCHESTRA_DATA_DIR=/mnt/my data'" in train
  assert 'tee "logs/worker-$(hostname).log"' in train
  assert trainer_args(train) == ["--config", CONFIG, *TRICKY]
  for code in (unpack, install, check, train):  # every remote command is valid shell
    assert subprocess.run(["bash", "-n", "-c", code]).returncode == 0, code


def test_tpu_trainer_args_survive_the_remote_shell(tmp_path):
  """Run the printed remote train command with bash, with a stub `orchestra`: it must see exactly our argv."""
  r = sh(TPU, "--dry-run", *TPU_BASE, "--skip-code", *TRICKY[:2], "--env", "X_Y=a 'b'", "--", *TRICKY[2:])
  assert r.returncode == 0, r.stderr
  check_cmd, train_cmd = [c for c in commands(r.stdout) if c[0] == "gcloud"][2:]  # describe, create, check, train
  assert "--worker=all" in check_cmd
  home = tmp_path / "home"
  stub = home / "orchestra-jax" / ".venv" / "bin" / "orchestra"
  stub.parent.mkdir(parents=True)
  stub.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                  "print(json.dumps([sys.argv[1:], os.environ['ORCHESTRA_DISTRIBUTED'], os.environ['X_Y']]))\n")
  stub.chmod(0o755)
  out = subprocess.run(["bash", "-c", remote_command(train_cmd)], cwd=home, capture_output=True, text=True,
                       env=dict(os.environ, HOME=str(home)), timeout=60)
  assert out.returncode == 0, out.stderr
  argv, flag, xy = json.loads(out.stdout)
  assert argv == ["train", "--config", CONFIG, *TRICKY] and flag == "1" and xy == "a 'b'"
  out = subprocess.run(["bash", "-c", remote_command(check_cmd)], cwd=home, capture_output=True, text=True,
                       env=dict(os.environ, HOME=str(home)), timeout=60)
  assert out.returncode == 0, out.stderr
  assert json.loads(unprefixed(out.stdout.strip()))[0] == [*argv, "--check"]  # each line names its worker
  logs = list((home / "orchestra-jax" / "logs").glob("worker-*.log"))
  assert len(logs) == 1 and json.loads(logs[0].read_text())[0] == argv


def test_tpu_repo_mode_and_detach(tmp_path):
  r = sh(TPU, "--dry-run", *TPU_BASE, "--repo", "https://github.com/me/orchestra-jax.git", "--ref", "v1.2",
         "--remote-dir", "~/code/orch", "--detach", "--kill-existing", "--version", "my-runtime")
  assert r.returncode == 0, r.stderr
  cmds = commands(r.stdout)
  assert not any(c[0] == "git" for c in cmds) and not any("scp" in c for c in cmds)
  assert cmds[1][cmds[1].index("--version") + 1] == "my-runtime"
  remote = [remote_command(c) for c in cmds if "--command" in c]
  clone, install, kill, check, train = remote
  assert "--check 2>&1" in check and "nohup" not in check
  assert "-c constraints.txt -e ." in install
  assert "git clone --quiet https://github.com/me/orchestra-jax.git code/orch" in clone
  assert "git fetch --quiet origin v1.2" in clone and "checkout --quiet --force FETCH_HEAD" in clone
  assert "cd code/orch" in install
  assert "pkill -f" in kill
  assert "nohup .venv/bin/orchestra train" in train and "< /dev/null &" in train
  assert "tpu_pod.sh --name pod-1 --zone us-east5-a --fetch-logs" in r.stdout


def test_tpu_other_actions(tmp_path):
  base = ["--dry-run", "--name", "pod-1", "--zone", "z1"]  # no --accelerator-type / --config needed
  fetch = commands(sh(TPU, *base, "--fetch-logs", "--logs-dir", str(tmp_path / "l")).stdout)
  assert fetch[0] == ["mkdir", "-p", str(tmp_path / "l")]
  assert fetch[1][4:7] == ["scp", "pod-1:orchestra-jax/logs/worker-*.log", f"{tmp_path / 'l'}/"]
  assert "--worker=all" in fetch[1]
  stop = commands(sh(TPU, *base, "--stop").stdout)
  assert len(stop) == 1 and "pkill" in remote_command(stop[0]) and "--worker=all" in stop[0]
  delete = commands(sh(TPU, *base, "--delete").stdout)
  assert delete == [["gcloud", "compute", "tpus", "tpu-vm", "delete", "pod-1", "--zone", "z1", "--quiet"]]
  r = sh(TPU, *base, "--stop", "--delete")
  assert r.returncode == 2 and "cannot be combined" in r.stderr


def test_tpu_without_gcloud_fails_clearly(tmp_path):
  env = dict(os.environ, PATH=path_without(tmp_path, "gcloud"))
  r = sh(TPU, *TPU_BASE, env=env)
  assert r.returncode != 0
  assert "gcloud not found" in r.stderr and "Google Cloud SDK" in r.stderr and "--dry-run" in r.stderr
  assert r.stdout == ""


@pytest.mark.parametrize("script", [TPU, GPU], ids=lambda p: p.name)
def test_unknown_flag_is_named(script):
  r = sh(script, "--dry-run", "--config", CONFIG, "--frobnicate", "3")
  assert r.returncode == 2
  assert "unknown flag: --frobnicate" in r.stderr and "Usage:" in r.stderr


@pytest.mark.parametrize("drop", ["--name", "--zone", "--accelerator-type", "--config"])
def test_tpu_missing_required_flag_is_named(drop):
  i = TPU_BASE.index(drop)
  r = sh(TPU, "--dry-run", *TPU_BASE[:i], *TPU_BASE[i + 2:])
  assert r.returncode == 2 and f"missing required flag {drop}" in r.stderr


def test_tpu_flag_errors():
  r = sh(TPU, "--dry-run", *TPU_BASE, "--zone")
  assert r.returncode == 2 and "flag --zone needs a value" in r.stderr
  r = sh(TPU, "--dry-run", *TPU_BASE, "--env", "no-equals")
  assert r.returncode == 2 and "--env wants KEY=VALUE" in r.stderr
  r = sh(TPU, "--dry-run", *TPU_BASE, "stray")
  assert r.returncode == 2 and "unexpected argument: 'stray'" in r.stderr
  r = sh(TPU, "--dry-run", *TPU_BASE[:-1], "configs/nope.py")
  assert r.returncode == 1 and "config file 'configs/nope.py' not found" in r.stderr
  r = sh(TPU, "--dry-run", *TPU_BASE[:4], "--accelerator-type", "tpu9-8", "--config", CONFIG)
  assert r.returncode == 2 and "--version" in r.stderr
  # --flag=value form works like --flag value
  r = sh(TPU, "--dry-run", "--name=pod-1", "--zone=z", "--accelerator-type=v4-32", f"--config={CONFIG}")
  assert r.returncode == 0 and "--version tpu-ubuntu2204-base" in r.stdout


def test_tpu_jax_version_keeps_the_other_pins():
  r = sh(TPU, "--dry-run", *TPU_BASE, "--repo", "https://example.com/o.git", "--jax-version", "0.10.9")
  assert r.returncode == 0, r.stderr
  install = [remote_command(c) for c in commands(r.stdout) if "--command" in c][1]
  assert "grep -vE '^(jax|jaxlib|libtpu)==' constraints.txt > .venv/constraints-jax.txt;" in install
  assert "-c .venv/constraints-jax.txt -e . 'jax[tpu]==0.10.9'" in install
  assert install.index("uv venv") < install.index("grep -vE")  # .venv exists before the file is written into it


FAKE_GCLOUD = textwrap.dedent("""\
    import glob, json, os, shutil, subprocess, sys
    args = sys.argv[1:]
    with open(os.environ["FAKE_GCLOUD_LOG"], "a") as f:
      f.write(json.dumps(args) + "\\n")
    home = os.environ["FAKE_WORKER_HOME"]
    verb = args[3]
    if verb == "describe":
      state = os.environ.get("FAKE_TPU_STATE", "")
      if not state:
        sys.stderr.write("ERROR: (gcloud.compute.tpus.tpu-vm.describe) NOT_FOUND: Resource not found\\n")
        sys.exit(1)
      print(state)
    elif verb == "scp":
      src, dst = args[4], args[5]
      if ":" in src:  # worker -> here
        for p in glob.glob(os.path.join(home, src.split(":", 1)[1])):
          shutil.copy(p, dst)
      else:
        shutil.copy(src, os.path.join(home, dst.split(":", 1)[1]))
    elif verb == "ssh":
      cmd = args[args.index("--command") + 1]
      status = subprocess.run(["bash", "-c", cmd], cwd=home, env=dict(os.environ, HOME=home)).returncode
      sys.exit(0 if os.environ.get("FAKE_SSH_STATUS_LOST") else status)
    """)


@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
def test_tpu_end_to_end_with_fake_gcloud(tmp_path):
  """A real (not dry) run against a fake gcloud whose one 'worker' is a temp dir: create, ship HEAD, train, logs."""
  src = tmp_path / "src"
  (src / "configs").mkdir(parents=True)
  (src / "configs" / "tiny.py").write_text("# config\n")
  (src / "README.md").write_text("hello\n")
  (src / "constraints.txt").write_text("jax==0.10.2\n")
  git = ["git", "-C", str(src), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
  for cmd in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "init"]):
    subprocess.run(git + cmd, check=True, capture_output=True)
  bin_dir, home = tmp_path / "bin", tmp_path / "worker"
  bin_dir.mkdir()
  home.mkdir()
  (bin_dir / "gcloud").write_text(f"#!{sys.executable}\n" + FAKE_GCLOUD)
  (bin_dir / "gcloud").chmod(0o755)
  stub = home / "orchestra-jax" / ".venv" / "bin" / "orchestra"
  stub.parent.mkdir(parents=True)
  stub.write_text(f"#!{sys.executable}\nimport json, os, sys\nprint(json.dumps(sys.argv[1:]))\n"
                  "sys.exit(2 if '--check' in sys.argv and os.environ.get('FAKE_CHECK_FAIL') else 0)\n")
  # The venv's python records each pip call and whether constraints.txt is there (the install runs in the checkout).
  pip_log = tmp_path / "pip.log"
  (stub.parent / "python").write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                                      f"open({str(pip_log)!r}, 'a').write(json.dumps([sys.argv[1:], "
                                      "os.path.isfile('constraints.txt')]) + '\\n')\n")
  for f in (stub, stub.parent / "python"):
    f.chmod(0o755)
  log = tmp_path / "gcloud.log"
  env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", FAKE_GCLOUD_LOG=str(log),
             FAKE_WORKER_HOME=str(home), TMPDIR=str(tmp_path))

  r = sh(TPU, *TPU_BASE, "--src", str(src), *TRICKY, env=env)
  assert r.returncode == 0, r.stdout + r.stderr
  calls = [json.loads(line) for line in log.read_text().splitlines()]
  # unpack, install, check, train: each on every worker
  assert [c[3] for c in calls] == ["describe", "create", "scp", "ssh", "ssh", "ssh", "ssh"]
  assert all("--worker=all" in c for c in calls[3:])
  assert (home / "orchestra-jax" / "README.md").read_text() == "hello\n"  # HEAD shipped and unpacked
  pips = [json.loads(line) for line in pip_log.read_text().splitlines()]
  assert pips == [[["-m", "pip", "install", "--quiet", "--upgrade", "pip"], True],
                  [["-m", "pip", "install", "--quiet", "-c", "constraints.txt", "-e", ".", "jax[tpu]"], True]]
  installed, check, train = r.stdout.strip().splitlines()
  assert installed == f"{hostname()}: installed"
  assert json.loads(unprefixed(check)) == ["train", "--config", CONFIG, *TRICKY, "--check"]
  assert json.loads(train) == ["train", "--config", CONFIG, *TRICKY]
  assert not (home / "orchestra-src.tar.gz").exists()
  assert "+ gcloud compute tpus tpu-vm create pod-1" in r.stderr  # commands are echoed while running
  assert not list(tmp_path.glob("tpu_pod*"))  # temp files cleaned up

  # A READY pod is reused; a different accelerator type or a preempted pod is refused with a hint.
  log.unlink()
  r = sh(TPU, *TPU_BASE, "--src", str(src), "--skip-code", env=dict(env, FAKE_TPU_STATE="READY\tv5p-64"))
  assert r.returncode == 0, r.stderr
  assert [json.loads(line)[3] for line in log.read_text().splitlines()] == ["describe", "ssh", "ssh"]
  # A failing pre-flight check stops the launch before any worker trains, naming the worker; --no-check skips it.
  failing = dict(env, FAKE_TPU_STATE="READY\tv5p-64", FAKE_CHECK_FAIL="1")
  log.unlink()
  r = sh(TPU, *TPU_BASE, "--src", str(src), "--skip-code", env=failing)
  assert r.returncode == 1 and f"pre-flight check failed on {hostname()} (tables above)" in r.stderr
  assert "--no-check" in r.stderr and f"[{hostname()}] pre-flight check FAILED" in r.stdout
  assert [json.loads(line)[3] for line in log.read_text().splitlines()] == ["describe", "ssh"]
  # ... also where gcloud does not pass a worker's exit status on: the worker's marker line stops it.
  log.unlink()
  r = sh(TPU, *TPU_BASE, "--src", str(src), "--skip-code", env=dict(failing, FAKE_SSH_STATUS_LOST="1"))
  assert r.returncode == 1 and f"pre-flight check failed on {hostname()}" in r.stderr
  assert [json.loads(line)[3] for line in log.read_text().splitlines()] == ["describe", "ssh"]
  log.unlink()
  r = sh(TPU, *TPU_BASE, "--src", str(src), "--skip-code", "--no-check", env=failing)
  assert r.returncode == 0, r.stderr
  assert [json.loads(line)[3] for line in log.read_text().splitlines()] == ["describe", "ssh"]
  assert json.loads(r.stdout.strip().splitlines()[-1])[-1] != "--check"
  r = sh(TPU, *TPU_BASE, "--src", str(src), "--skip-install", env=dict(env, FAKE_TPU_STATE="READY\tv4-64"))
  assert r.returncode == 1 and "exists with accelerator type v4-64, not v5p-64" in r.stderr
  r = sh(TPU, *TPU_BASE, "--src", str(src), "--skip-install", env=dict(env, FAKE_TPU_STATE="PREEMPTED\tv5p-64"))
  assert r.returncode == 1 and "PREEMPTED" in r.stderr and "--recreate" in r.stderr

  # The workers install from constraints.txt, and only committed files are shipped: refused before any gcloud call.
  subprocess.run(git + ["rm", "-q", "constraints.txt"], check=True, capture_output=True)
  subprocess.run(git + ["commit", "-q", "-m", "no constraints"], check=True, capture_output=True)
  log.unlink()
  r = sh(TPU, *TPU_BASE, "--src", str(src), env=env)
  assert r.returncode == 1 and f"constraints.txt is not committed in {src}" in r.stderr and not log.exists()
  r = sh(TPU, *TPU_BASE, "--src", str(src), "--skip-install", env=dict(env, FAKE_TPU_STATE="READY\tv5p-64"))
  assert r.returncode == 0, r.stderr  # nothing to install: nothing needs it
  r = sh(TPU, "--dry-run", *TPU_BASE, "--src", str(src), env=env)
  assert r.returncode == 0 and "# warning: constraints.txt is not committed" in r.stdout

  # --fetch-logs brings worker logs here.
  out_dir = tmp_path / "fetched"
  r = sh(TPU, "--name", "pod-1", "--zone", "z", "--fetch-logs", "--logs-dir", str(out_dir), env=env)
  assert r.returncode == 0, r.stderr
  (fetched,) = out_dir.glob("worker-*.log")
  assert json.loads(fetched.read_text())[0] == "train"


# ----------------------------------------------------------------------------------------------------------------
# gpu.sh


def test_gpu_ssh_dry_run_one_command_per_host():
  hosts = ["alice@gpu-a", "gpu-b", "gpu-c"]
  r = sh(GPU, "--dry-run", "--mode", "ssh", "--hosts", ",".join(hosts), "--port", "23456", "--gpus", "0,1",
         "--config", CONFIG, *TRICKY[:2], "--env", "NCCL_DEBUG=WARN", "--", *TRICKY[2:])
  assert r.returncode == 0, r.stderr
  cmds = commands(r.stdout)
  assert len(cmds) == 6
  checks, cmds = cmds[:3], cmds[3:]  # the pre-flight on every host first, each host for itself
  for check, host in zip(checks, hosts):
    assert check[:2] == ["ssh", host] and len(check) == 3
    assert trainer_args(check[2]) == ["--config", CONFIG, *TRICKY, "--check"]
    assert f"cd {ROOT} " in check[2] and " NCCL_DEBUG=WARN " in check[2] and "ORCHESTRA_" not in check[2]
  for i, (cmd, host) in enumerate(zip(cmds, hosts)):
    assert cmd[:2] == ["ssh", host] and len(cmd) == 3
    remote = cmd[2]
    for var in ("ORCHESTRA_COORDINATOR=gpu-a:23456", "ORCHESTRA_NUM_PROCESSES=3", f"ORCHESTRA_PROCESS_ID={i}",
                "CUDA_VISIBLE_DEVICES=0,1", "NCCL_DEBUG=WARN"):
      assert f" {var} " in remote, (var, remote)
    assert f"cd {ROOT} " in remote and 'tee "logs/worker-$(hostname).log"' in remote
    assert trainer_args(remote) == ["--config", CONFIG, *TRICKY]


def test_gpu_ssh_options():
  r = sh(GPU, "--dry-run", "--mode", "ssh", "--hosts", "h1,h2", "--coordinator", "10.0.0.5", "--remote-dir",
         "/srv/my repo", "--sync", "--config", CONFIG)
  assert r.returncode == 0, r.stderr
  cmds = commands(r.stdout)
  assert cmds[0] == ["ssh", "h1", "mkdir -p '/srv/my repo'"]
  assert cmds[1][0] == "rsync" and cmds[1][-2:] == [f"{ROOT}/", "h1:/srv/my repo/"]
  assert "ORCHESTRA_COORDINATOR=10.0.0.5:12355" in cmds[-1][2] and "cd '/srv/my repo'" in cmds[-1][2]
  stop = commands(sh(GPU, "--dry-run", "--mode", "ssh", "--hosts", "h1,h2", "--stop").stdout)
  assert [c[:2] for c in stop] == [["ssh", "h1"], ["ssh", "h2"]] and "pkill" in stop[0][2]


def test_gpu_slurm_prints_sbatch_script(tmp_path):
  r = sh(GPU, "--dry-run", "--mode", "slurm", "--nodes", "4", "--partition", "a100", "--time", "12:00:00",
         "--sbatch-arg=--exclusive", "--config", CONFIG, *TRICKY[:2], "--env", "A=b c", "--submit", "--",
         *TRICKY[2:])
  assert r.returncode == 0, r.stderr
  out = r.stdout
  for line in ("#!/bin/bash", "#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
               "#SBATCH --partition=a100", "#SBATCH --time=12:00:00", "#SBATCH --exclusive",
               f"#SBATCH --chdir={ROOT}",
               "head_node=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | awk 'NR == 1')",
               'export ORCHESTRA_COORDINATOR="$head_node:12355"', "export 'A=b c'"):
    assert line in out.splitlines(), line
  assert "srun " in out and "ORCHESTRA_PROCESS_ID=$SLURM_PROCID" in out
  assert out.index("--label") < out.index("--kill-on-bad-exit")  # the pre-flight step on every node comes first
  assert "ORCHESTRA_NUM_PROCESSES=$SLURM_NTASKS" in out
  assert f"+ sbatch {ROOT}/logs/orchestra.sbatch" in out
  script = out.split("):\n", 1)[1].rsplit("\n+ sbatch", 1)[0] + "\n"
  assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0

  # Run the generated script on "two nodes" with fake scontrol/srun: each task sees its id, count, coordinator, argv.
  fake = tmp_path / "bin"
  fake.mkdir()
  # Many nodes: a `| head -n 1` in the script would SIGPIPE scontrol and, with pipefail, fail the job.
  (fake / "scontrol").write_text("#!/bin/bash\nprintf 'node7\\nnode8\\n'; seq -f 'n%g' 100000\n")
  (fake / "srun").write_text(textwrap.dedent("""\
      #!/bin/bash
      while [[ $1 == --* ]]; do shift; done
      for t in 0 1; do SLURM_PROCID=$t SLURM_NTASKS=2 "$@" || exit 1; done
      """))
  stub = tmp_path / "job" / ".venv" / "bin" / "orchestra"
  stub.parent.mkdir(parents=True)
  stub.write_text(f"#!{sys.executable}\nimport json, os, sys\nprint(json.dumps([sys.argv[1:], "
                  "[os.environ.get(k) for k in ('ORCHESTRA_COORDINATOR', 'ORCHESTRA_NUM_PROCESSES', "
                  "'ORCHESTRA_PROCESS_ID', 'A')]]))\n"
                  "sys.exit(2 if '--check' in sys.argv and os.environ.get('FAKE_CHECK_FAIL') else 0)\n")
  for f in (fake / "scontrol", fake / "srun", stub):
    f.chmod(0o755)
  job_env = dict(os.environ, PATH=f"{fake}{os.pathsep}{os.environ['PATH']}", SLURM_NNODES="2",
                 SLURM_JOB_NODELIST="node[7-8]")
  run = subprocess.run(["bash", "-c", script], cwd=tmp_path / "job", capture_output=True, text=True, timeout=60,
                       env=job_env)
  assert run.returncode == 0, run.stderr
  tasks = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("[")]
  argv = ["train", "--config", CONFIG, *TRICKY]
  check = [argv + ["--check"], ["node7:12355", None, None, "b c"]]  # every node checks; no process ids yet
  assert tasks == [check, check, [argv, ["node7:12355", "2", "0", "b c"]], [argv, ["node7:12355", "2", "1", "b c"]]]
  # A node failing its check ends the job before the training step.
  run = subprocess.run(["bash", "-c", script], cwd=tmp_path / "job", capture_output=True, text=True, timeout=60,
                       env=dict(job_env, FAKE_CHECK_FAIL="1"))
  assert run.returncode == 2 and "the pre-flight check failed" in run.stderr and "--no-check" in run.stderr
  assert [json.loads(line)[0] for line in run.stdout.splitlines() if line.startswith("[")] == [argv + ["--check"]]
  r = sh(GPU, "--dry-run", "--mode", "slurm", "--nodes", "4", "--config", CONFIG, "--no-check")
  assert r.returncode == 0 and "--check" not in r.stdout and "srun " in r.stdout


def test_gpu_slurm_writes_script_file(tmp_path):
  repo, script = _fake_repo(tmp_path)  # writing creates logs/ in the repository: use a copy
  target = tmp_path / "job.sbatch"
  r = sh(script, "--mode", "slurm", "--nodes", "2", "--gpus-per-node", "0", "--script", str(target),
         "--config", CONFIG)
  assert r.returncode == 0, r.stderr
  text = target.read_text()
  assert "#SBATCH --nodes=2" in text and "gpus-per-node" not in text and "srun " in text
  assert f"sbatch {target}" in r.stderr  # tells how to submit
  env = dict(os.environ, PATH=path_without(tmp_path, "sbatch"))
  r = sh(script, "--mode", "slurm", "--nodes", "2", "--script", str(target), "--config", CONFIG, "--submit",
         env=env)
  assert r.returncode == 1 and "sbatch not found" in r.stderr


def test_gpu_local_modes():
  r = sh(GPU, "--dry-run", "--config", CONFIG, "--gpus", "0,1", *TRICKY)
  check, cmd = [line[2:] for line in r.stdout.splitlines() if line.startswith("+ ")]
  assert trainer_args(check) == ["--config", CONFIG, *TRICKY, "--check"] and f"cd {ROOT} " in check
  assert "ORCHESTRA_" not in cmd and "CUDA_VISIBLE_DEVICES=0,1" in cmd
  assert trainer_args(cmd) == ["--config", CONFIG, *TRICKY]
  r = sh(GPU, "--dry-run", "--config", CONFIG, "--no-check")
  assert r.returncode == 0 and len(commands(r.stdout)) == 1 and "--check" not in r.stdout

  r = sh(GPU, "--dry-run", "--config", CONFIG, "--num-processes", "2", "--gpus", "0,1,2,3", "--port", "4000")
  assert r.returncode == 0, r.stderr
  check, *cmds = [line[2:] for line in r.stdout.splitlines() if line.startswith("+ ")]
  assert check.endswith("--check") and "ORCHESTRA_" not in check  # one host: one check
  assert len(cmds) == 2
  for i, cmd in enumerate(cmds):
    assert "ORCHESTRA_COORDINATOR=127.0.0.1:4000 ORCHESTRA_NUM_PROCESSES=2" in cmd
    assert f"ORCHESTRA_PROCESS_ID={i} ORCHESTRA_LOCAL_DEVICE_IDS={'0,1' if i == 0 else '2,3'}" in cmd
    assert f"worker-$(hostname)-p{i}.log" in cmd
  r = sh(GPU, "--dry-run", "--config", CONFIG, "--num-processes", "3", "--gpus", "0,1,2,3")
  assert r.returncode == 2 and "does not divide" in r.stderr


def _fake_repo(tmp_path: Path) -> tuple[Path, Path]:
  """A copy of gpu.sh in a temporary 'repository' whose .venv/bin/orchestra is a stub that prints what it got.

  The stub exits 3 when its argv contains `fail-on-<process id>`, or `fail-check` and `--check`.
  """
  repo = tmp_path / "repo"
  (repo / "launch").mkdir(parents=True)
  (repo / "configs").mkdir()
  shutil.copy(GPU, repo / "launch" / "gpu.sh")
  (repo / "configs" / "tiny.py").write_text("# config\n")
  stub = repo / ".venv" / "bin" / "orchestra"
  stub.parent.mkdir(parents=True)
  stub.write_text(textwrap.dedent(f"""\
      #!{sys.executable}
      import json, os, sys
      pid = os.environ.get("ORCHESTRA_PROCESS_ID")
      print(json.dumps({{"argv": sys.argv[1:], "env": {{k: v for k, v in os.environ.items()
                                                      if k.startswith(("ORCHESTRA_", "CUDA_"))}}}}))
      sys.exit(3 if f"fail-on-{{pid}}" in sys.argv or {{"fail-check", "--check"}} <= set(sys.argv) else 0)
      """))
  stub.chmod(0o755)
  return repo, repo / "launch" / "gpu.sh"


def test_gpu_local_processes_run(tmp_path):
  repo, script = _fake_repo(tmp_path)
  r = sh(script, "--config", CONFIG, "--num-processes", "2", "--gpus", "4,5", *TRICKY)
  assert r.returncode == 0, r.stderr
  logs = sorted((repo / "logs").glob("worker-*-p*.log"))
  assert len(logs) == 2
  runs = [json.loads(p.read_text()) for p in logs]
  for i, run in enumerate(runs):
    assert run["argv"] == ["train", "--config", CONFIG, *TRICKY]
    assert run["env"] == {"CUDA_VISIBLE_DEVICES": "4,5", "ORCHESTRA_COORDINATOR": "127.0.0.1:12355",
                          "ORCHESTRA_NUM_PROCESSES": "2", "ORCHESTRA_PROCESS_ID": str(i),
                          "ORCHESTRA_LOCAL_DEVICE_IDS": str(i)}
  check, first = (json.loads(line) for line in r.stdout.strip().splitlines())
  assert check == {"argv": ["train", "--config", CONFIG, *TRICKY, "--check"], "env": {}}  # once, before any process
  assert first == runs[0]  # process 0 also prints to the terminal
  r = sh(script, "--config", CONFIG, "--num-processes", "2", "--", "fail-on-1")
  assert r.returncode == 1 and "at least one process failed" in r.stderr
  r = sh(script, "--config", CONFIG, "--config.x=1")  # one process: no distributed variables at all
  assert r.returncode == 0
  assert [json.loads(line) for line in r.stdout.splitlines()] == [
      {"argv": ["train", "--config", CONFIG, "--config.x=1", "--check"], "env": {}},
      {"argv": ["train", "--config", CONFIG, "--config.x=1"], "env": {}}]
  # A failed check starts no process; --no-check skips it.
  r = sh(script, "--config", CONFIG, "--num-processes", "2", "--", "fail-check")
  assert r.returncode == 1 and "pre-flight check failed" in r.stderr and "--no-check" in r.stderr
  assert len(r.stdout.splitlines()) == 1 and "+ cd" not in r.stderr.split("pre-flight check failed")[1]
  r = sh(script, "--config", CONFIG, "--no-check", "--", "fail-check")
  assert r.returncode == 0 and [json.loads(r.stdout)["argv"][-1]] == ["fail-check"]


def test_gpu_ssh_hosts_run(tmp_path):
  """A real (not dry) ssh-mode run against a fake `ssh` that runs the command here: all hosts, prefixed output."""
  repo, script = _fake_repo(tmp_path)
  fake = tmp_path / "bin"
  fake.mkdir()
  (fake / "ssh").write_text('#!/bin/bash\nexec bash -c "$2"\n')
  (fake / "ssh").chmod(0o755)
  env = dict(os.environ, PATH=f"{fake}{os.pathsep}{os.environ['PATH']}")
  r = sh(script, "--mode", "ssh", "--hosts", "hA,hB", "--config", CONFIG, *TRICKY, env=env)
  assert r.returncode == 0, r.stderr

  def by_host(out: str) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = {}
    for line in out.splitlines():
      host, _, rest = line.partition(" ")
      if rest.startswith("{"):
        runs.setdefault(host, []).append(json.loads(rest))
    return runs

  runs = by_host(r.stdout)
  assert set(runs) == {"[hA]", "[hB]"}
  for i, host in enumerate(["[hA]", "[hB]"]):
    check, train = runs[host]  # every host checks for itself, then trains
    assert check == {"argv": ["train", "--config", CONFIG, *TRICKY, "--check"], "env": {}}
    assert train["argv"] == ["train", "--config", CONFIG, *TRICKY]
    assert train["env"] == {"ORCHESTRA_COORDINATOR": "hA:12355", "ORCHESTRA_NUM_PROCESSES": "2",
                            "ORCHESTRA_PROCESS_ID": str(i)}
  r = sh(script, "--mode", "ssh", "--hosts", "hA,hB", "--config", CONFIG, "--", "fail-on-1", env=env)
  assert r.returncode == 1 and "training failed on: hB" in r.stderr
  r = sh(script, "--mode", "ssh", "--hosts", "hA,hB", "--config", CONFIG, "--", "fail-check", env=env)
  assert r.returncode == 1 and "pre-flight check failed on: hA hB (tables above)" in r.stderr
  assert all(len(v) == 1 for v in by_host(r.stdout).values())  # the checks ran; nothing trained


def test_gpu_errors(tmp_path):
  r = sh(GPU, "--dry-run", "--mode", "ssh", "--config", CONFIG)
  assert r.returncode == 2 and "missing required flag --hosts" in r.stderr
  r = sh(GPU, "--dry-run", "--mode", "slurm", "--config", CONFIG)
  assert r.returncode == 2 and "missing required flag --nodes" in r.stderr
  r = sh(GPU, "--dry-run", "--mode", "ssh", "--hosts", "a,b")
  assert r.returncode == 2 and "missing required flag --config" in r.stderr
  r = sh(GPU, "--dry-run", "--mode", "k8s", "--config", CONFIG)
  assert r.returncode == 2 and "--mode must be local, ssh or slurm" in r.stderr
  r = sh(GPU, "--dry-run", "--hosts", "a,b", "--config", CONFIG)
  assert r.returncode == 2 and "--hosts is only for --mode ssh" in r.stderr
  r = sh(GPU, "--dry-run", "--mode", "ssh", "--hosts", "a,,b", "--config", CONFIG)
  assert r.returncode == 2 and "empty entry" in r.stderr
  r = sh(GPU, "--dry-run", "--port", "99999", "--config", CONFIG)
  assert r.returncode == 2 and "--port" in r.stderr
  r = sh(GPU, "--dry-run", "--gpus", "0;1", "--config", CONFIG)
  assert r.returncode == 2 and "--gpus wants" in r.stderr
  r = sh(GPU, "--config", CONFIG, "--venv", str(tmp_path / "no-venv"))
  assert r.returncode == 1 and "not found: install first" in r.stderr and "pip install -c constraints.txt -e ." in r.stderr
  env = dict(os.environ, PATH=path_without(tmp_path, "ssh"))
  r = sh(GPU, "--mode", "ssh", "--hosts", "a,b", "--config", CONFIG, env=env)
  assert r.returncode == 1 and "ssh not found" in r.stderr


# ----------------------------------------------------------------------------------------------------------------
# orchestra_jax.distributed (environment validation only; no multi-process run is started)


def test_parse_env_pure():
  from orchestra_jax.distributed import parse_env
  assert parse_env({}) is None
  assert parse_env({"ORCHESTRA_DISTRIBUTED": "0"}) is None
  assert parse_env({"ORCHESTRA_DISTRIBUTED": "1"}) == {}  # JAX auto-detects (TPU pods, SLURM, ...)
  assert parse_env({"ORCHESTRA_COORDINATOR": "node0:1234", "ORCHESTRA_NUM_PROCESSES": "4",
                    "ORCHESTRA_PROCESS_ID": "3", "ORCHESTRA_LOCAL_DEVICE_IDS": "2, 3",
                    "ORCHESTRA_INIT_TIMEOUT": "60"}) == {
      "coordinator_address": "node0:1234", "num_processes": 4, "process_id": 3, "local_device_ids": [2, 3],
      "initialization_timeout": 60}
  assert parse_env({"ORCHESTRA_COORDINATOR": "[::1]:99", "ORCHESTRA_NUM_PROCESSES": "1",
                    "ORCHESTRA_PROCESS_ID": "0"})["coordinator_address"] == "[::1]:99"


BAD_ENVS = [
    ({"ORCHESTRA_DISTRIBUTED": "maybe"}, ["ORCHESTRA_DISTRIBUTED", "'maybe'"]),
    ({"ORCHESTRA_COORDINATOR": "node0:1234"}, ["ORCHESTRA_NUM_PROCESSES and ORCHESTRA_PROCESS_ID are not"]),
    ({"ORCHESTRA_COORDINATOR": "node0:1234", "ORCHESTRA_NUM_PROCESSES": "2"}, ["ORCHESTRA_PROCESS_ID is not"]),
    ({"ORCHESTRA_COORDINATOR": "node0", "ORCHESTRA_NUM_PROCESSES": "2", "ORCHESTRA_PROCESS_ID": "0"},
     ["ORCHESTRA_COORDINATOR", "HOST:PORT"]),
    ({"ORCHESTRA_COORDINATOR": "node0:http", "ORCHESTRA_NUM_PROCESSES": "2", "ORCHESTRA_PROCESS_ID": "0"},
     ["ORCHESTRA_COORDINATOR", "invalid port"]),
    ({"ORCHESTRA_COORDINATOR": "n:1", "ORCHESTRA_NUM_PROCESSES": "two", "ORCHESTRA_PROCESS_ID": "0"},
     ["ORCHESTRA_NUM_PROCESSES='two' is not an integer"]),
    ({"ORCHESTRA_COORDINATOR": "n:1", "ORCHESTRA_NUM_PROCESSES": "0", "ORCHESTRA_PROCESS_ID": "0"},
     ["ORCHESTRA_NUM_PROCESSES=0 must be >= 1"]),
    ({"ORCHESTRA_COORDINATOR": "n:1", "ORCHESTRA_NUM_PROCESSES": "2", "ORCHESTRA_PROCESS_ID": "2"},
     ["ORCHESTRA_PROCESS_ID=2 is out of range", "0..1"]),
    ({"ORCHESTRA_COORDINATOR": "n:1", "ORCHESTRA_NUM_PROCESSES": "2", "ORCHESTRA_PROCESS_ID": "-1"},
     ["ORCHESTRA_PROCESS_ID=-1 must be >= 0"]),
    ({"ORCHESTRA_DISTRIBUTED": "1", "ORCHESTRA_PROCESS_ID": "1"},
     ["ORCHESTRA_PROCESS_ID is set but ORCHESTRA_COORDINATOR is not"]),
    ({"ORCHESTRA_DISTRIBUTED": "1", "ORCHESTRA_LOCAL_DEVICE_IDS": "0,gpu1"}, ["ORCHESTRA_LOCAL_DEVICE_IDS", "0,1"]),
    ({"ORCHESTRA_DISTRIBUTED": "1", "ORCHESTRA_LOCAL_DEVICE_IDS": "1,1"}, ["ORCHESTRA_LOCAL_DEVICE_IDS", "distinct"]),
    ({"ORCHESTRA_DISTRIBUTED": "1", "ORCHESTRA_INIT_TIMEOUT": "soon"}, ["ORCHESTRA_INIT_TIMEOUT"]),
]

_SUBPROCESS_CHECKS = textwrap.dedent("""\
    import json, os, sys
    from orchestra_jax import distributed
    from orchestra_jax.errors import UserError
    out = {"errors": []}
    for env in json.loads(sys.argv[1]):
      for k in list(os.environ):
        if k.startswith("ORCHESTRA_"):
          del os.environ[k]
      os.environ.update(env)
      try:
        distributed.maybe_initialize()
        out["errors"].append(None)
      except UserError as e:
        out["errors"].append(str(e))
    out["jax_imported_by_bad_envs"] = "jax" in sys.modules  # validation happens before JAX is touched
    for k in list(os.environ):
      if k.startswith("ORCHESTRA_"):
        del os.environ[k]
    info = distributed.maybe_initialize()  # single process: nothing to initialize
    out["info"] = info
    out["again"] = distributed.maybe_initialize() == info and distributed.is_coordinator()
    print(json.dumps(out))
    """)


def test_maybe_initialize_errors_name_the_variable():
  env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRA_")}
  env.update(XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
  r = subprocess.run([sys.executable, "-c", _SUBPROCESS_CHECKS, json.dumps([e for e, _ in BAD_ENVS])],
                     capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
  assert r.returncode == 0, r.stderr
  out = json.loads(r.stdout.strip().splitlines()[-1])
  for (bad_env, needles), message in zip(BAD_ENVS, out["errors"]):
    assert message is not None, f"no error for {bad_env}"
    for needle in needles:
      assert needle in message, (bad_env, message)
  assert out["jax_imported_by_bad_envs"] is False
  assert out["info"] == {"distributed": False, "process_index": 0, "process_count": 1, "local_device_count": 8,
                         "global_device_count": 8, "platform": "cpu"}
  assert out["again"] is True


def test_maybe_initialize_after_jax_use_explains_the_order():
  code = textwrap.dedent("""\
      import os, jax
      jax.devices()  # JAX used first: joining a distributed run is no longer possible
      os.environ.update(ORCHESTRA_COORDINATOR="127.0.0.1:1", ORCHESTRA_NUM_PROCESSES="2", ORCHESTRA_PROCESS_ID="0")
      from orchestra_jax import distributed
      try:
        distributed.maybe_initialize()
      except RuntimeError as e:
        print("ERR", e)
      """)
  env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRA_")}
  env.update(JAX_PLATFORMS="cpu")
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
  assert r.returncode == 0, r.stderr
  assert "ERR orchestra_jax.distributed.maybe_initialize() must be called before any other JAX use" in r.stdout
