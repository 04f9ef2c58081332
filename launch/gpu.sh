#!/usr/bin/env bash
# Launch `orchestra train` on one or several GPU hosts with jax.distributed. See --help (or launch/README.md).
# Runs on bash 3.2+ (macOS) and Linux.
set -euo pipefail

PROG=gpu.sh
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$SCRIPT_DIR/.." && pwd)

usage() {
  cat <<'EOF'
Usage: launch/gpu.sh --config FILE [--mode local] [--gpus 0,1,..] [--num-processes N] [options]
       launch/gpu.sh --config FILE --mode ssh --hosts HOST1,HOST2,... [options]
       launch/gpu.sh --config FILE --mode slurm --nodes N [--submit] [options]
       (trainer arguments: [--config.KEY=VALUE ...] [-- EXTRA TRAINER ARGS...])

Runs `orchestra train --config FILE ...` as one JAX process per host (or per --num-processes on one host), after
the pre-flight `orchestra train ... --check` on every host (each host reaches the endpoints and the shared storage
on its own; a failed check stops the launch before anything trains; skip with --no-check). With more than one
process, every process gets
    ORCHESTRA_COORDINATOR=HOST0:PORT  ORCHESTRA_NUM_PROCESSES=N  ORCHESTRA_PROCESS_ID=i
and the trainer calls jax.distributed.initialize() with them (orchestra_jax/distributed.py). Each process logs to
logs/worker-<hostname>.log (logs/worker-<hostname>-p<i>.log with --num-processes) under the repository.

Modes:
  local  (default) this host. One process sees all (or --gpus) GPUs; --num-processes N > 1 starts N processes
         here with coordinator 127.0.0.1:PORT (with --gpus, process i gets the i-th equal share of them as
         ORCHESTRA_LOCAL_DEVICE_IDS; without, e.g. for CPU runs, each process keeps its own devices).
  ssh    `ssh HOST` into every host of --hosts at once; process i runs on the i-th host; the coordinator is the
         first host (without any user@) unless --coordinator says otherwise. The code must already be at
         --remote-dir on every host (shared filesystem or --sync) with its venv installed.
  slurm  writes an sbatch script (one task per node, `srun`; process id = SLURM_PROCID, count = SLURM_NTASKS,
         coordinator = first node of `scontrol show hostnames $SLURM_JOB_NODELIST`), and submits it with --submit.
         The job runs the pre-flight check on every node (one `srun` step) before the training step.

Required:
  --config FILE            trainer config, relative to the repository root (e.g. configs/orchestrator_8b.py).
  --hosts H1,H2,...        (ssh mode) hosts in process order; [user@]host, as you would pass to ssh.
  --nodes N                (slurm mode) number of nodes.

Trainer arguments:
  --config.KEY=VALUE       passed to `orchestra train` unchanged (also the two-token form --config.KEY VALUE).
  -- ARGS...               everything after `--` is passed to `orchestra train` unchanged.
  --env KEY=VALUE          extra environment variable for every process (repeatable).

Common options:
  --mode local|ssh|slurm   where to run (default: local).
  --port PORT              coordinator port on the first host (default: 12355).
  --coordinator ADDR       coordinator host or host:port others can reach (default: first host / first node /
                           127.0.0.1), e.g. an InfiniBand or internal IP.
  --gpus LIST              CUDA_VISIBLE_DEVICES for every process (local, ssh), e.g. 0,1,2,3.
  --venv DIR               virtual environment with `orchestra`, relative to the repository (default: .venv);
                           install it from the tested set: pip install -c constraints.txt -e .
  --no-check               skip the pre-flight `orchestra train --check` (config, starting checkpoint, workdir,
                           data and domains, every endpoint) on every host.
  --dry-run                print every command (one per line, prefixed "+ "; slurm: the sbatch script) and run
                           nothing.
  -h, --help               show this help.

local options:
  --num-processes N        processes on this host (default 1: no jax.distributed).

ssh options:
  --remote-dir DIR         the repository on every host (default: this repository's path, $REPO_DIR).
  --sync                   first rsync this repository (without .venv, .git, runs, logs) to --remote-dir on
                           every host.
  --stop                   stop `orchestra train` on every host of --hosts and exit (also done on Ctrl-C).

slurm options:
  --gpus-per-node G        GPUs per node to request (default: 8; 0 leaves it out, e.g. to use --sbatch-arg=--gres=..).
  --partition P            --account A            --time HH:MM:SS        --cpus-per-task C
  --job-name NAME          (default: orchestra)
  --sbatch-arg ARG         extra #SBATCH line, repeatable, e.g. --sbatch-arg=--exclusive.
  --script FILE            where to write the sbatch script (default: logs/<job-name>.sbatch).
  --submit                 run `sbatch FILE` after writing it.

Examples:
  launch/gpu.sh --config configs/demo.py --config.steps=10
  launch/gpu.sh --mode ssh --hosts gpu1,gpu2 --config configs/orchestrator_8b.py --env ORCHESTRA_DATA_DIR=/data
  launch/gpu.sh --mode slurm --nodes 4 --partition a100 --time 24:00:00 --config configs/orchestrator_8b.py --submit
EOF
}

die() { echo "$PROG: error: $*" >&2; exit 1; }
usage_error() { echo "$PROG: error: $*" >&2; echo >&2; usage >&2; exit 2; }

# quote WORD -> REPLY: WORD quoted for a POSIX shell (left bare when it is plainly safe).
quote() {
  local s=$1 q="'\\''"
  if [[ $s =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then REPLY=$s; else REPLY="'${s//\'/$q}'"; fi
}
# join_quoted WORDS... -> REPLY: a command line that a shell splits back into exactly WORDS.
join_quoted() {
  local out="" w
  for w in "$@"; do quote "$w"; out="$out${out:+ }$REPLY"; done
  REPLY=$out
}

DRY_RUN=0
# run CMD...: print it ("+ " prefix; stdout when dry-running, stderr otherwise), then run it unless dry-running.
run() {
  join_quoted "$@"
  if [[ $DRY_RUN == 1 ]]; then echo "+ $REPLY"; return 0; fi
  echo "+ $REPLY" >&2
  "$@"
}
note() { if [[ $DRY_RUN == 1 ]]; then echo "# $*"; else echo "$PROG: $*" >&2; fi; }
# kill_tree PID: stop a background job and everything it started (ssh, tee, the trainer).
kill_tree() {
  local c
  for c in $(pgrep -P "$1" 2>/dev/null || true); do kill_tree "$c"; done
  kill "$1" 2>/dev/null || true
}

# ---------------------------------------------------------------------------------------------------------------
# Flags
MODE=local CONFIG="" HOSTS="" PORT=12355 COORD="" GPUS="" VENV=.venv NUM_PROCS=1 REMOTE_DIR="" SYNC=0 STOP=0 CHECK=1
NODES="" GPUS_PER_NODE=8 PARTITION="" ACCOUNT="" TIME="" CPUS="" JOB_NAME=orchestra SCRIPT="" SUBMIT=0
TRAIN_ARGS=() ENV_ARGS=() SBATCH_ARGS=()

# need_value "$@": sets val from --flag=value or from the next argument (then 2 arguments are consumed).
need_value() {
  if [[ $has_val == 1 ]]; then return 0; fi
  if [[ $# -lt 2 ]]; then usage_error "flag $flag needs a value"; fi
  val=$2; shift_n=2
}
need_int() {  # need_int MIN: the current flag's value must be an integer >= MIN
  [[ $val =~ ^[0-9]+$ ]] && [[ $val -ge $1 ]] || usage_error "$flag wants an integer >= $1, got '$val'"
}

while [[ $# -gt 0 ]]; do
  arg=$1
  case $arg in
    --*=*) flag=${arg%%=*}; val=${arg#*=}; has_val=1 ;;
    *) flag=$arg; val=""; has_val=0 ;;
  esac
  shift_n=1
  case $flag in
    -h|--help) usage; exit 0 ;;
    --dry-run) DRY_RUN=1 ;;
    --mode)
      need_value "$@"
      case $val in local|ssh|slurm) MODE=$val ;; *) usage_error "--mode must be local, ssh or slurm, got '$val'" ;; esac ;;
    --config) need_value "$@"; CONFIG=$val ;;
    --config.*)
      if [[ $has_val == 1 ]]; then TRAIN_ARGS+=("$arg")
      elif [[ $# -ge 2 ]]; then TRAIN_ARGS+=("$arg" "$2"); shift_n=2
      else usage_error "override $arg needs a value (--config.KEY=VALUE)"; fi ;;
    --env)
      need_value "$@"
      [[ $val =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || usage_error "--env wants KEY=VALUE, got '$val'"
      ENV_ARGS+=("$val") ;;
    --hosts) need_value "$@"; HOSTS=$val ;;
    --port) need_value "$@"; need_int 1; [[ $val -le 65535 ]] || usage_error "--port must be 1..65535"; PORT=$val ;;
    --coordinator) need_value "$@"; COORD=$val ;;
    --gpus)
      need_value "$@"
      [[ $val =~ ^[0-9]+(,[0-9]+)*$ ]] || usage_error "--gpus wants comma-separated GPU ids like 0,1,2,3, got '$val'"
      GPUS=$val ;;
    --venv) need_value "$@"; VENV=$val ;;
    --no-check) CHECK=0 ;;
    --num-processes) need_value "$@"; need_int 1; NUM_PROCS=$val ;;
    --remote-dir) need_value "$@"; REMOTE_DIR=$val ;;
    --sync) SYNC=1 ;;
    --stop) STOP=1 ;;
    --nodes) need_value "$@"; need_int 1; NODES=$val ;;
    --gpus-per-node) need_value "$@"; need_int 0; GPUS_PER_NODE=$val ;;
    --partition) need_value "$@"; PARTITION=$val ;;
    --account) need_value "$@"; ACCOUNT=$val ;;
    --time) need_value "$@"; TIME=$val ;;
    --cpus-per-task) need_value "$@"; need_int 1; CPUS=$val ;;
    --job-name) need_value "$@"; JOB_NAME=$val ;;
    --sbatch-arg) need_value "$@"; SBATCH_ARGS+=("$val") ;;
    --script) need_value "$@"; SCRIPT=$val ;;
    --submit) SUBMIT=1 ;;
    --) shift; TRAIN_ARGS+=("$@"); shift_n=0; set -- ;;
    -*) usage_error "unknown flag: $flag" ;;
    *) usage_error "unexpected argument: '$arg' (trainer arguments go after --)" ;;
  esac
  if [[ $shift_n -gt 0 ]]; then shift "$shift_n"; fi
done

# Flags that belong to one mode only: say so rather than ignore them.
only_for() {  # only_for MODE FLAG SET
  if [[ $3 == 1 && $MODE != "$1" ]]; then usage_error "$2 is only for --mode $1"; fi
}
only_for ssh --hosts "$([[ -n $HOSTS ]] && echo 1 || echo 0)"
only_for ssh --remote-dir "$([[ -n $REMOTE_DIR ]] && echo 1 || echo 0)"
only_for ssh --sync "$SYNC"
only_for ssh --stop "$STOP"
only_for local --num-processes "$([[ $NUM_PROCS != 1 ]] && echo 1 || echo 0)"
only_for slurm --nodes "$([[ -n $NODES ]] && echo 1 || echo 0)"
only_for slurm --submit "$SUBMIT"
only_for slurm --script "$([[ -n $SCRIPT ]] && echo 1 || echo 0)"
if [[ $MODE == slurm && -n $GPUS ]]; then usage_error "--gpus is not for --mode slurm (use --gpus-per-node)"; fi

missing=()
[[ -n $CONFIG || $STOP == 1 ]] || missing+=(--config)
[[ $MODE != ssh || -n $HOSTS ]] || missing+=(--hosts)
[[ $MODE != slurm || -n $NODES ]] || missing+=(--nodes)
if [[ ${#missing[@]} -gt 0 ]]; then
  usage_error "missing required flag$([[ ${#missing[@]} -gt 1 ]] && echo s) ${missing[*]} (for --mode $MODE)"
fi
if [[ -n $CONFIG && ! -f $REPO_DIR/$CONFIG && ! -f $CONFIG ]]; then
  die "config file '$CONFIG' not found in $REPO_DIR (--config is relative to the repository root)"
fi

# The coordinator address: ADDR or ADDR:PORT from --coordinator, else a default host with --port.
coordinator_for() {  # coordinator_for DEFAULT_HOST -> REPLY
  local c=${COORD:-$1}
  if [[ $c =~ :[0-9]+$ ]]; then REPLY=$c; else REPLY=$c:$PORT; fi
}

ORCH=$VENV/bin/orchestra
join_quoted "$ORCH" train --config "$CONFIG" ${TRAIN_ARGS[@]+"${TRAIN_ARGS[@]}"}; TRAIN_CMD=$REPLY

# shell_env VAR=VALUE... -> REPLY: "export A=1 B=2" (or nothing); the user's --env values come last.
shell_env() {
  if [[ $# -eq 0 && ${#ENV_ARGS[@]} -eq 0 ]]; then REPLY=""; return 0; fi
  join_quoted "$@" ${ENV_ARGS[@]+"${ENV_ARGS[@]}"}; REPLY="export $REPLY && "
}

# ---------------------------------------------------------------------------------------------------------------
if [[ $MODE == local ]]; then
  if [[ $ORCH == /* ]]; then orch_path=$ORCH; else orch_path=$REPO_DIR/$ORCH; fi
  [[ $DRY_RUN == 1 || -x $orch_path ]] || \
    die "$orch_path not found: install first (make, or python3 -m venv .venv && .venv/bin/pip install -c constraints.txt -e .), or pass --venv"
  ngpus=0
  if [[ -n $GPUS ]]; then ngpus=$(( $(echo "$GPUS" | tr -cd ',' | wc -c) + 1 )); fi
  if [[ $NUM_PROCS -gt 1 && $ngpus -gt 0 && $((ngpus % NUM_PROCS)) -ne 0 ]]; then
    usage_error "--gpus lists $ngpus GPUs, which --num-processes $NUM_PROCS does not divide"
  fi
  quote "$REPO_DIR"; qrepo=$REPLY
  coordinator_for 127.0.0.1; coord=$REPLY
  cmds=()
  i=0
  while [[ $i -lt $NUM_PROCS ]]; do
    envs=()
    if [[ -n $GPUS ]]; then envs+=("CUDA_VISIBLE_DEVICES=$GPUS"); fi
    if [[ $NUM_PROCS -gt 1 ]]; then
      envs+=("ORCHESTRA_COORDINATOR=$coord" "ORCHESTRA_NUM_PROCESSES=$NUM_PROCS" "ORCHESTRA_PROCESS_ID=$i")
      if [[ $ngpus -gt 0 ]]; then
        per=$((ngpus / NUM_PROCS)); ids=""; j=0
        while [[ $j -lt $per ]]; do ids="$ids${ids:+,}$((i * per + j))"; j=$((j + 1)); done
        envs+=("ORCHESTRA_LOCAL_DEVICE_IDS=$ids")
      fi
      log="\"logs/worker-\$(hostname)-p$i.log\""
    else
      log='"logs/worker-$(hostname).log"'
    fi
    shell_env ${envs[@]+"${envs[@]}"}; exports=$REPLY
    cmds+=("cd $qrepo && mkdir -p logs && ${exports}set -o pipefail && $TRAIN_CMD 2>&1 | tee $log")
    i=$((i + 1))
  done
  shell_env; check_cmd="cd $qrepo && ${REPLY}$TRAIN_CMD --check"  # one host: one check, whatever the process count
  if [[ $DRY_RUN == 1 ]]; then
    if [[ $CHECK == 1 ]]; then echo "+ $check_cmd"; fi
    for c in "${cmds[@]}"; do echo "+ $c"; done
    exit 0
  fi
  if [[ $CHECK == 1 ]]; then
    echo "+ $check_cmd" >&2
    bash -c "$check_cmd" || die "the pre-flight check failed (table above); fix it, or skip the check with --no-check"
  fi
  if [[ $NUM_PROCS -eq 1 ]]; then
    echo "+ ${cmds[0]}" >&2
    exec bash -c "${cmds[0]}"
  fi
  pids=()
  cleanup() { for p in ${pids[@]+"${pids[@]}"}; do kill_tree "$p"; done; }
  trap 'cleanup; exit 130' INT TERM
  i=0
  for c in "${cmds[@]}"; do
    echo "+ $c" >&2
    # Every process writes its log file; only process 0's output also comes to this terminal.
    if [[ $i -eq 0 ]]; then bash -c "$c" & else bash -c "$c" > /dev/null & fi
    pids+=("$!")
    i=$((i + 1))
  done
  note "started $NUM_PROCS processes; logs in $REPO_DIR/logs/"
  status=0
  for p in "${pids[@]}"; do wait "$p" || status=1; done
  [[ $status == 0 ]] || die "at least one process failed; see $REPO_DIR/logs/worker-*-p*.log"
  exit 0
fi

# ---------------------------------------------------------------------------------------------------------------
if [[ $MODE == ssh ]]; then
  IFS=, read -r -a HOST_LIST <<< "$HOSTS"
  for h in "${HOST_LIST[@]}"; do [[ -n $h ]] || usage_error "--hosts has an empty entry: '$HOSTS'"; done
  n=${#HOST_LIST[@]}
  [[ $DRY_RUN == 1 ]] || command -v ssh >/dev/null 2>&1 || die "ssh not found: install an OpenSSH client, or use --dry-run"
  REMOTE_DIR=${REMOTE_DIR:-$REPO_DIR}
  quote "$REMOTE_DIR"; qdir=$REPLY
  first=${HOST_LIST[0]}; first=${first#*@}
  coordinator_for "$first"; coord=$REPLY
  STOP_CMD="pkill -f '[.]venv/bin/orchestra train' && echo \"stopped orchestra train on \$(hostname)\" || echo \"no orchestra train running on \$(hostname)\""
  stop_all() {
    local h
    for h in "${HOST_LIST[@]}"; do run ssh "$h" "$STOP_CMD" || true; done
  }
  if [[ $STOP == 1 ]]; then stop_all; exit 0; fi

  if [[ $SYNC == 1 ]]; then
    [[ $DRY_RUN == 1 ]] || command -v rsync >/dev/null 2>&1 || die "rsync not found (needed by --sync)"
    for h in "${HOST_LIST[@]}"; do
      run ssh "$h" "mkdir -p $qdir"
      run rsync -a --exclude=.venv --exclude=.git --exclude=/runs --exclude=/logs --exclude=__pycache__ \
        "$REPO_DIR/" "$h:$REMOTE_DIR/"
    done
  fi

  cmds=()
  i=0
  for h in "${HOST_LIST[@]}"; do
    envs=()
    if [[ -n $GPUS ]]; then envs+=("CUDA_VISIBLE_DEVICES=$GPUS"); fi
    if [[ $n -gt 1 ]]; then
      envs+=("ORCHESTRA_COORDINATOR=$coord" "ORCHESTRA_NUM_PROCESSES=$n" "ORCHESTRA_PROCESS_ID=$i")
    fi
    shell_env ${envs[@]+"${envs[@]}"}; exports=$REPLY
    cmds+=("cd $qdir && mkdir -p logs && ${exports}set -o pipefail && $TRAIN_CMD 2>&1 | tee \"logs/worker-\$(hostname).log\"")
    i=$((i + 1))
  done
  # Every host reaches the endpoints and the shared storage on its own, so each checks for itself.
  shell_env; check_cmd="cd $qdir && ${REPLY}$TRAIN_CMD --check"
  if [[ $DRY_RUN == 1 ]]; then
    if [[ $CHECK == 1 ]]; then
      note "pre-flight check on every host; training starts only when all pass"
      for h in "${HOST_LIST[@]}"; do run ssh "$h" "$check_cmd"; done
    fi
    note "$n process(es), coordinator $coord; all started at once"
    i=0
    for h in "${HOST_LIST[@]}"; do run ssh "$h" "${cmds[$i]}"; i=$((i + 1)); done
    exit 0
  fi
  pids=()
  on_signal() {
    trap - INT TERM
    for p in ${pids[@]+"${pids[@]}"}; do kill_tree "$p"; done
    note "interrupted: stopping orchestra train on every host"
    stop_all
    exit 130
  }
  trap on_signal INT TERM
  if [[ $CHECK == 1 ]]; then
    for h in "${HOST_LIST[@]}"; do
      ( run ssh "$h" "$check_cmd" 2>&1 | while IFS= read -r line; do printf '[%s] %s\n' "$h" "$line"; done ) &
      pids+=("$!")
    done
    failed=()
    i=0
    for p in "${pids[@]}"; do wait "$p" || failed+=("${HOST_LIST[$i]}"); i=$((i + 1)); done
    if [[ ${#failed[@]} -gt 0 ]]; then
      die "the pre-flight check failed on: ${failed[*]} (tables above); fix it, or skip the check with --no-check"
    fi
    pids=()
  fi
  i=0
  for h in "${HOST_LIST[@]}"; do
    ( run ssh "$h" "${cmds[$i]}" 2>&1 | while IFS= read -r line; do printf '[%s] %s\n' "$h" "$line"; done ) &
    pids+=("$!")
    i=$((i + 1))
  done
  failed=()
  i=0
  for p in "${pids[@]}"; do wait "$p" || failed+=("${HOST_LIST[$i]}"); i=$((i + 1)); done
  if [[ ${#failed[@]} -gt 0 ]]; then die "training failed on: ${failed[*]} (logs: $REMOTE_DIR/logs/ on each host)"; fi
  exit 0
fi

# ---------------------------------------------------------------------------------------------------------------
# slurm
SCRIPT=${SCRIPT:-logs/$JOB_NAME.sbatch}
coordinator_for '$head_node'; coord=$REPLY
quote "$coord"; [[ $coord == '$head_node'* ]] && REPLY="\"$coord\""; qcoord=$REPLY
join_quoted --config "$CONFIG" ${TRAIN_ARGS[@]+"${TRAIN_ARGS[@]}"}; qargs=$REPLY
quote "$ORCH"; qorch=$REPLY
sbatch_line() { quote "$1"; echo "#SBATCH $REPLY"; }
write_sbatch() {
  echo "#!/bin/bash"
  echo "# Generated by launch/gpu.sh: $NODES node(s), one JAX process per node (all its GPUs)."
  sbatch_line "--job-name=$JOB_NAME"
  sbatch_line "--nodes=$NODES"
  sbatch_line "--ntasks-per-node=1"
  if [[ $GPUS_PER_NODE -gt 0 ]]; then sbatch_line "--gpus-per-node=$GPUS_PER_NODE"; fi
  if [[ -n $CPUS ]]; then sbatch_line "--cpus-per-task=$CPUS"; fi
  if [[ -n $PARTITION ]]; then sbatch_line "--partition=$PARTITION"; fi
  if [[ -n $ACCOUNT ]]; then sbatch_line "--account=$ACCOUNT"; fi
  if [[ -n $TIME ]]; then sbatch_line "--time=$TIME"; fi
  sbatch_line "--chdir=$REPO_DIR"
  sbatch_line "--output=logs/slurm-%x-%j.out"
  for a in ${SBATCH_ARGS[@]+"${SBATCH_ARGS[@]}"}; do sbatch_line "$a"; done
  echo "set -euo pipefail"
  echo "mkdir -p logs"
  echo '# Process 0 (the first node) hosts the jax.distributed coordinator.'
  echo '# (awk, not head: head would close the pipe early and pipefail would fail the job on SIGPIPE)'
  echo 'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | awk '"'"'NR == 1'"'"')'
  echo "export ORCHESTRA_COORDINATOR=$qcoord"
  if [[ ${#ENV_ARGS[@]} -gt 0 ]]; then join_quoted "${ENV_ARGS[@]}"; echo "export $REPLY"; fi
  echo "TRAIN_ARGS=($qargs)"
  echo 'echo "orchestra: $SLURM_NNODES node(s), coordinator $ORCHESTRA_COORDINATOR"'
  if [[ $CHECK == 1 ]]; then
    echo '# Pre-flight on every node (seconds, no GPU use): each node reaches the endpoints and shared storage itself.'
    echo 'srun --ntasks="$SLURM_NNODES" --ntasks-per-node=1 --label \'
    echo "  bash -c 'exec \"\$0\" train \"\$@\" --check' $qorch \"\${TRAIN_ARGS[@]}\" || {"
    echo '  echo "orchestra: the pre-flight check failed (tables above); fix it, or submit without it (launch/gpu.sh --no-check)" >&2'
    echo '  exit 2'
    echo '}'
  fi
  echo '# One task per node; each maps SLURM_PROCID/SLURM_NTASKS to the process id/count; logs per task.'
  echo 'srun --ntasks="$SLURM_NNODES" --ntasks-per-node=1 --kill-on-bad-exit=1 --output="logs/worker-%j-%t.log" \'
  echo "  bash -c 'export ORCHESTRA_PROCESS_ID=\$SLURM_PROCID ORCHESTRA_NUM_PROCESSES=\$SLURM_NTASKS; exec \"\$0\" train \"\$@\"' \\"
  echo "  $qorch \"\${TRAIN_ARGS[@]}\""
}
body=$(write_sbatch)

if [[ $DRY_RUN == 1 ]]; then
  echo "# sbatch script (would be written to $REPO_DIR/$SCRIPT):"
  echo "$body"
  if [[ $SUBMIT == 1 ]]; then echo "+ sbatch $REPO_DIR/$SCRIPT"; fi
  exit 0
fi
[[ $SUBMIT == 0 ]] || command -v sbatch >/dev/null 2>&1 || \
  die "sbatch not found: run this on a SLURM login node, or drop --submit and copy $SCRIPT there"
cd "$REPO_DIR"
mkdir -p "$(dirname "$SCRIPT")" logs
printf '%s\n' "$body" > "$SCRIPT"
note "wrote $REPO_DIR/$SCRIPT"
if [[ $SUBMIT == 1 ]]; then
  run sbatch "$SCRIPT"
else
  note "submit it with: sbatch $SCRIPT"
fi
