#!/usr/bin/env bash
# Launch `orchestra train` on every worker of a Cloud TPU VM pod slice. See --help (or launch/README.md).
# Runs on bash 3.2+ (macOS) and Linux; needs the Google Cloud SDK (`gcloud`) unless --dry-run.
set -euo pipefail

PROG=tpu_pod.sh
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

usage() {
  cat <<'EOF'
Usage: launch/tpu_pod.sh --name NAME --zone ZONE --accelerator-type TYPE --config FILE [options]
                         [--config.KEY=VALUE ...] [-- EXTRA TRAINER ARGS...]
       launch/tpu_pod.sh --name NAME --zone ZONE --fetch-logs [--logs-dir DIR]
       launch/tpu_pod.sh --name NAME --zone ZONE --stop | --delete

Creates (or reuses) a Cloud TPU VM pod slice, puts this code on every worker, installs it, and runs
`orchestra train --config FILE ...` on all workers at once with ORCHESTRA_DISTRIBUTED=1 (the trainer then calls
jax.distributed.initialize(); on TPU, JAX finds the coordinator itself). Every worker writes its output to
REMOTE_DIR/logs/worker-$(hostname).log (and the foreground run streams all of them to this terminal).

Steps (default action):
  1. gcloud compute tpus tpu-vm describe NAME: reuse it if READY; create it if it does not exist.
  2. Code: `git archive` of the local repository's HEAD (committed files only) copied to every worker with
     `tpu-vm scp --worker=all` and unpacked into REMOTE_DIR; or, with --repo, `git clone`/`fetch` on every worker.
  3. Install: REMOTE_DIR/.venv (python3 >= 3.11, else a uv-managed Python 3.11),
     `pip install -c constraints.txt -e . jax[tpu]`: the exact versions the tests pass with (constraints.txt at
     the repository root, shipped with the code), jax's TPU runtime on top.
  4. Check: `orchestra train ... --check` on every worker (config, starting checkpoint, workdir, data and domains,
     every endpoint), since each worker reaches the endpoints and the shared storage on its own; the launch stops
     there when a check fails on any worker, before the pod trains (skip with --no-check).
  5. Train: `tpu-vm ssh NAME --worker=all --command "... orchestra train ..."`.

Required:
  --name NAME              TPU VM (pod slice) name.
  --zone ZONE              zone, e.g. us-east5-a (v5p), us-central2-b (v4).
  --accelerator-type TYPE  e.g. v5p-64, v4-64, v5litepod-256, v6e-64. Used to create the pod and checked against
                           an existing one. (Not needed with --fetch-logs, --stop, --delete.)
  --config FILE            trainer config, a path relative to the repository root (e.g. configs/orchestrator_8b.py).
                           (Not needed with --fetch-logs, --stop, --delete.)

Trainer arguments:
  --config.KEY=VALUE       passed to `orchestra train` unchanged (also the two-token form --config.KEY VALUE).
  -- ARGS...               everything after `--` is passed to `orchestra train` unchanged.
  --env KEY=VALUE          extra environment variable for the trainer on every worker (repeatable),
                           e.g. --env ORCHESTRA_DATA_DIR=/mnt/data --env WANDB_API_KEY=...

Pod options:
  --project PROJECT        Google Cloud project (default: gcloud's configured project).
  --version RUNTIME        TPU software version (default by generation: v2/v3/v4 tpu-ubuntu2204-base,
                           v5litepod v2-alpha-tpuv5-lite, v5p v2-alpha-tpuv5, v6e v2-alpha-tpuv6e).
  --spot                   create a Spot pod (cheaper, can be preempted).
  --preemptible            create a preemptible pod (older form of --spot).
  --create-arg ARG         extra argument for `tpu-vm create`, repeatable (e.g. --create-arg=--network=my-net).
  --recreate               if the pod exists but was PREEMPTED/TERMINATED/STOPPED, delete and create it again.

Code and install options:
  --repo URL               instead of shipping local HEAD, `git clone URL` on every worker (needs git access there).
  --ref REF                branch, tag or commit to check out with --repo (default: the remote's HEAD).
  --src DIR                local git repository to ship (default: the repository containing this script).
  --remote-dir DIR         where the code lives on each worker, relative to the home directory or absolute
                           (default: orchestra-jax).
  --python PY              Python (>= 3.11) for the worker venv (default: python3 if >= 3.11, else uv's 3.11).
  --jax-version V          install jax[tpu]==V instead of constraints.txt's jax/jaxlib pins (the rest of the tested
                           set stays pinned; default: constraints.txt's jax).
  --skip-install           do not (re)create the venv or pip install (code is still shipped).
  --skip-code              do not ship code either (rerun what is already on the workers).

Run options:
  --detach                 start training in the background (nohup) and return; follow it with --fetch-logs.
  --kill-existing          first stop any `orchestra train` left running on the workers (it would hold the TPU).
  --no-check               skip the pre-flight `orchestra train --check` on every worker.

Other actions (each runs alone, then exits):
  --fetch-logs             copy REMOTE_DIR/logs/worker-*.log from every worker into --logs-dir.
  --logs-dir DIR           local folder for --fetch-logs (default: logs/tpu-NAME).
  --stop                   stop `orchestra train` on every worker.
  --delete                 delete the TPU VM.

General:
  --dry-run                print every command (one per line, prefixed "+ ") and run nothing; needs no gcloud.
  -h, --help               show this help.

Examples:
  launch/tpu_pod.sh --name orch-v5p --zone us-east5-a --accelerator-type v5p-64 --spot \
      --config configs/orchestrator_8b.py --config.steps=2000 --env ORCHESTRA_DATA_DIR=/mnt/data
  launch/tpu_pod.sh --name orch-v5p --zone us-east5-a --fetch-logs
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

# ---------------------------------------------------------------------------------------------------------------
# Flags
NAME="" ZONE="" PROJECT="" ACCEL="" VERSION="" CONFIG="" SPOT=0 PREEMPTIBLE=0 RECREATE=0
REPO="" REF="" SRC="" REMOTE_DIR="orchestra-jax" PYTHON="" JAX_VERSION="" SKIP_INSTALL=0 SKIP_CODE=0
DETACH=0 KILL_EXISTING=0 CHECK=1 ACTION=train LOGS_DIR=""
TRAIN_ARGS=() ENV_ARGS=() CREATE_ARGS=()

set_action() {
  if [[ $ACTION != train && $ACTION != "$1" ]]; then usage_error "--$ACTION and --$1 cannot be combined"; fi
  ACTION=$1
}

# need_value "$@": sets val from --flag=value or from the next argument (then 2 arguments are consumed).
need_value() {
  if [[ $has_val == 1 ]]; then return 0; fi
  if [[ $# -lt 2 ]]; then usage_error "flag $flag needs a value"; fi
  val=$2; shift_n=2
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
    --name) need_value "$@"; NAME=$val ;;
    --zone) need_value "$@"; ZONE=$val ;;
    --project) need_value "$@"; PROJECT=$val ;;
    --accelerator-type) need_value "$@"; ACCEL=$val ;;
    --version) need_value "$@"; VERSION=$val ;;
    --config) need_value "$@"; CONFIG=$val ;;
    --config.*)
      if [[ $has_val == 1 ]]; then TRAIN_ARGS+=("$arg")
      elif [[ $# -ge 2 ]]; then TRAIN_ARGS+=("$arg" "$2"); shift_n=2
      else usage_error "override $arg needs a value (--config.KEY=VALUE)"; fi ;;
    --env)
      need_value "$@"
      [[ $val =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || usage_error "--env wants KEY=VALUE, got '$val'"
      ENV_ARGS+=("$val") ;;
    --spot) SPOT=1 ;;
    --preemptible) PREEMPTIBLE=1 ;;
    --create-arg) need_value "$@"; CREATE_ARGS+=("$val") ;;
    --recreate) RECREATE=1 ;;
    --repo) need_value "$@"; REPO=$val ;;
    --ref) need_value "$@"; REF=$val ;;
    --src) need_value "$@"; SRC=$val ;;
    --remote-dir) need_value "$@"; REMOTE_DIR=$val ;;
    --python) need_value "$@"; PYTHON=$val ;;
    --jax-version) need_value "$@"; JAX_VERSION=$val ;;
    --skip-install) SKIP_INSTALL=1 ;;
    --skip-code) SKIP_CODE=1; SKIP_INSTALL=1 ;;
    --detach) DETACH=1 ;;
    --kill-existing) KILL_EXISTING=1 ;;
    --no-check) CHECK=0 ;;
    --fetch-logs) set_action fetch-logs ;;
    --logs-dir) need_value "$@"; LOGS_DIR=$val ;;
    --stop) set_action stop ;;
    --delete) set_action delete ;;
    --) shift; TRAIN_ARGS+=("$@"); shift_n=0; set -- ;;
    -*) usage_error "unknown flag: $flag" ;;
    *) usage_error "unexpected argument: '$arg' (trainer arguments go after --)" ;;
  esac
  if [[ $shift_n -gt 0 ]]; then shift "$shift_n"; fi
done

missing=()
[[ -n $NAME ]] || missing+=(--name)
[[ -n $ZONE ]] || missing+=(--zone)
if [[ $ACTION == train ]]; then
  [[ -n $ACCEL ]] || missing+=(--accelerator-type)
  [[ -n $CONFIG ]] || missing+=(--config)
fi
if [[ ${#missing[@]} -gt 0 ]]; then
  usage_error "missing required flag$([[ ${#missing[@]} -gt 1 ]] && echo s) ${missing[*]}"
fi
[[ $SPOT == 1 && $PREEMPTIBLE == 1 ]] && usage_error "--spot and --preemptible cannot be combined"
[[ -n $REF && -z $REPO ]] && usage_error "--ref needs --repo (without --repo the local HEAD is shipped)"
[[ -n $REPO && -n $SRC ]] && usage_error "--repo and --src cannot be combined"
# A "~/" as typed (quoted: it must not expand to the local home) is dropped: ssh and scp start in the home
# directory anyway.
# shellcheck disable=SC2088
[[ $REMOTE_DIR == "~/"* ]] && REMOTE_DIR=${REMOTE_DIR#"~/"}
[[ -n $REMOTE_DIR && $REMOTE_DIR != "~" ]] || usage_error "--remote-dir must name a folder"

if [[ $DRY_RUN == 0 ]] && ! command -v gcloud >/dev/null 2>&1; then
  die "gcloud not found: install the Google Cloud SDK (https://cloud.google.com/sdk/docs/install) and run" \
      "'gcloud auth login', or use --dry-run to only print the commands"
fi

LOC=(--zone "$ZONE")
[[ -n $PROJECT ]] && LOC+=(--project "$PROJECT")
TPU=(gcloud compute tpus tpu-vm)
quote "$REMOTE_DIR"; QDIR=$REPLY

remote_all() {  # remote_all COMMAND: run a shell command on every worker at once.
  run "${TPU[@]}" ssh "$NAME" "${LOC[@]}" --worker=all --command "$1"
}

# Leftover trainers keep the TPU chips busy ("TPU in use"); match the venv's entry point only.
STOP_CMD="pkill -f '[.]venv/bin/orchestra train' && echo \"stopped orchestra train on \$(hostname)\" || echo \"no orchestra train running on \$(hostname)\""

# ---------------------------------------------------------------------------------------------------------------
case $ACTION in
  fetch-logs)
    LOGS_DIR=${LOGS_DIR:-logs/tpu-$NAME}
    run mkdir -p "$LOGS_DIR"
    run "${TPU[@]}" scp "$NAME:$REMOTE_DIR/logs/worker-*.log" "$LOGS_DIR/" "${LOC[@]}" --worker=all
    note "logs are in $LOGS_DIR"
    exit 0 ;;
  stop) remote_all "$STOP_CMD"; exit 0 ;;
  delete) run "${TPU[@]}" delete "$NAME" "${LOC[@]}" --quiet; exit 0 ;;
esac

# Defaults that need the flags.
if [[ -z $VERSION ]]; then
  case $ACCEL in
    v2-*|v3-*|v4-*) VERSION=tpu-ubuntu2204-base ;;
    v5litepod-*|v5e-*) VERSION=v2-alpha-tpuv5-lite ;;
    v5p-*) VERSION=v2-alpha-tpuv5 ;;
    v6e-*) VERSION=v2-alpha-tpuv6e ;;
    *) usage_error "no default --version for accelerator type '$ACCEL': pass --version RUNTIME" ;;
  esac
fi
if [[ -z $REPO ]]; then
  SRC=${SRC:-$SCRIPT_DIR/..}
  [[ -d $SRC ]] || die "--src $SRC is not a directory"
  SRC=$(cd "$SRC" && pwd)
  [[ -e $SRC/.git ]] || die "$SRC is not a git repository (the code shipped is 'git archive HEAD'); use --src or --repo"
  [[ -f $SRC/$CONFIG ]] || die "config file '$CONFIG' not found in $SRC (--config is relative to the repository root)"
fi
# The workers install from constraints.txt; `git archive HEAD` ships committed files only.
if [[ -z $REPO && $SKIP_INSTALL == 0 ]] && ! git -C "$SRC" cat-file -e HEAD:constraints.txt 2>/dev/null; then
  if [[ $DRY_RUN == 1 ]]; then
    note "warning: constraints.txt is not committed in $SRC: the install below would fail on the workers"
  else
    die "constraints.txt is not committed in $SRC: the workers install the exact tested versions from it and only" \
        "committed files are shipped; commit it, or use --skip-install"
  fi
fi

# 1. The pod: reuse or create. ------------------------------------------------------------------------------------
CREATE=("${TPU[@]}" create "$NAME" "${LOC[@]}" --accelerator-type "$ACCEL" --version "$VERSION")
[[ $SPOT == 1 ]] && CREATE+=(--spot)
[[ $PREEMPTIBLE == 1 ]] && CREATE+=(--preemptible)
CREATE+=(${CREATE_ARGS[@]+"${CREATE_ARGS[@]}"})
DESCRIBE=("${TPU[@]}" describe "$NAME" "${LOC[@]}" "--format=value(state,acceleratorType)")

if [[ $DRY_RUN == 1 ]]; then
  run "${DESCRIBE[@]}"
  note "create only if describe reports NOT_FOUND (with --recreate, also delete+create a PREEMPTED/TERMINATED pod):"
  run "${CREATE[@]}"
else
  errf=$(mktemp "${TMPDIR:-/tmp}/tpu_pod.XXXXXX")
  trap 'rm -f "$errf"' EXIT
  waited=0
  while :; do
    join_quoted "${DESCRIBE[@]}"; echo "+ $REPLY" >&2
    if desc=$("${DESCRIBE[@]}" 2>"$errf"); then
      state=$(echo "$desc" | awk '{print $1}')
      type=$(echo "$desc" | awk '{print $2}')
    elif grep -qiE 'NOT_FOUND|not found' "$errf"; then
      state=NOT_FOUND type=""
    else
      cat "$errf" >&2
      die "gcloud could not describe TPU '$NAME' (see above): check --zone/--project and 'gcloud auth login'"
    fi
    case $state in
      READY)
        if [[ -n $type && ${type##*/} != "$ACCEL" ]]; then
          die "TPU '$NAME' exists with accelerator type ${type##*/}, not $ACCEL: pass --accelerator-type ${type##*/}," \
              "or use another --name (or --delete it first)"
        fi
        note "reusing READY TPU '$NAME' ($ACCEL)"
        break ;;
      NOT_FOUND)
        note "creating TPU '$NAME' ($ACCEL, $VERSION)"
        run "${CREATE[@]}"
        break ;;
      PREEMPTED|TERMINATED|STOPPED|SUSPENDED)
        if [[ $RECREATE == 1 ]]; then
          note "TPU '$NAME' is $state: deleting and creating it again (--recreate)"
          run "${TPU[@]}" delete "$NAME" "${LOC[@]}" --quiet
          run "${CREATE[@]}"
          break
        fi
        die "TPU '$NAME' is $state: rerun with --recreate to delete and create it again, or --delete it" ;;
      CREATING|STARTING|RESTARTING|REPAIRING|PROVISIONING|"")
        if [[ $waited -ge 1800 ]]; then die "TPU '$NAME' still $state after 30 minutes"; fi
        note "TPU '$NAME' is ${state:-in an unknown state}; waiting"
        sleep 30; waited=$((waited + 30)) ;;
      *) die "TPU '$NAME' is in state $state; cannot use it" ;;
    esac
  done
fi

# 2. Code on every worker. ----------------------------------------------------------------------------------------
if [[ $SKIP_CODE == 0 ]]; then
  if [[ -n $REPO ]]; then
    join_quoted git clone --quiet "$REPO" "$REMOTE_DIR"; clone=$REPLY
    quote "${REF:-HEAD}"; qref=$REPLY
    remote_all "set -e; if [ ! -d $QDIR/.git ]; then $clone; fi; cd $QDIR; git fetch --quiet origin $qref; git checkout --quiet --force FETCH_HEAD; echo \"\$(hostname): \$(git rev-parse --short HEAD)\""
  else
    if [[ $DRY_RUN == 0 ]]; then
      dirty=$(GIT_OPTIONAL_LOCKS=0 git -C "$SRC" status --porcelain --untracked-files=no 2>/dev/null || true)
      [[ -z $dirty ]] || note "warning: $SRC has uncommitted changes; only the committed HEAD is shipped"
      tarball=$(mktemp -d "${TMPDIR:-/tmp}/tpu_pod_src.XXXXXX")/orchestra-src.tar.gz
      trap 'rm -f "$errf" "$tarball"; rmdir "$(dirname "$tarball")" 2>/dev/null || true' EXIT
    else
      tarball=${TMPDIR:-/tmp}/tpu_pod_src/orchestra-src.tar.gz
    fi
    run git -C "$SRC" archive --format=tar.gz -o "$tarball" HEAD
    run "${TPU[@]}" scp "$tarball" "$NAME:orchestra-src.tar.gz" "${LOC[@]}" --worker=all
    remote_all "set -e; mkdir -p $QDIR; tar -xzf orchestra-src.tar.gz -C $QDIR; rm -f orchestra-src.tar.gz"
  fi
fi

# 3. Install. -----------------------------------------------------------------------------------------------------
if [[ $SKIP_INSTALL == 0 ]]; then
  # constraints.txt pins every package (jax included) to the tested set; jax[tpu] adds the TPU runtime at that jax.
  guard="[ -f constraints.txt ] || { echo \"\$(hostname): no constraints.txt in \$(pwd):"
  guard="$guard ship a commit that has it (the exact tested versions)\" >&2; exit 1; };"
  if [[ -n $JAX_VERSION ]]; then
    quote "jax[tpu]==$JAX_VERSION"; qjax=$REPLY
    # Another jax: drop the pins that would contradict it, keep the rest of the tested set.
    pins=.venv/constraints-jax.txt
    filter="grep -vE '^(jax|jaxlib|libtpu)==' constraints.txt > $pins;"
  else
    qjax="'jax[tpu]'" pins=constraints.txt filter=""
  fi
  if [[ -n $PYTHON ]]; then
    quote "$PYTHON"; mkvenv="$REPLY -m venv .venv"
  else
    # TPU VM images ship Ubuntu 22.04's Python 3.10; the package needs >= 3.11, so fall back to uv's Python 3.11.
    mkvenv="if python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null;"
    mkvenv="$mkvenv then python3 -m venv .venv;"
    mkvenv="$mkvenv else export PATH=\$HOME/.local/bin:\$HOME/.cargo/bin:\$PATH;"
    mkvenv="$mkvenv command -v uv >/dev/null || curl -LsSf https://astral.sh/uv/install.sh | sh;"
    mkvenv="$mkvenv uv venv --seed --python 3.11 .venv; fi"
  fi
  remote_all "set -e; cd $QDIR; $guard if [ ! -x .venv/bin/python ]; then $mkvenv; fi; $filter .venv/bin/python -m pip install --quiet --upgrade pip; .venv/bin/python -m pip install --quiet -c $pins -e . $qjax; echo \"\$(hostname): installed\""
fi

# 4. Check on every worker (seconds; no TPU use), 5. train on all workers at once. -------------------------------
[[ $KILL_EXISTING == 1 ]] && remote_all "$STOP_CMD"
join_quoted ORCHESTRA_DISTRIBUTED=1 ${ENV_ARGS[@]+"${ENV_ARGS[@]}"}; exports=$REPLY
join_quoted .venv/bin/orchestra train --config "$CONFIG" ${TRAIN_ARGS[@]+"${TRAIN_ARGS[@]}"}; train=$REPLY
if [[ $CHECK == 1 ]]; then
  # Every worker reaches the endpoints and the shared storage on its own, so each checks for itself. Its lines
  # carry its hostname (the workers' output interleaves; shown once all have finished), and a failure ends in a
  # marker line: the launch stops on it even where gcloud does not pass a worker's exit status on.
  failed_marker="pre-flight check FAILED"
  check="{ $train --check 2>&1 || { echo '$failed_marker'; exit 2; }; } | sed \"s/^/[\$(hostname)] /\""
  check_status=0
  check_out=$(remote_all "cd $QDIR && export $exports && set -o pipefail && $check") || check_status=$?
  [[ -z $check_out ]] || printf '%s\n' "$check_out"
  failed_on=$(printf '%s\n' "$check_out" | tr -d '\r' | sed -n "s/^\[\(.*\)\] $failed_marker\$/\1/p" | tr '\n' ' ')
  failed_on=${failed_on% }
  if [[ $check_status != 0 || -n $failed_on ]]; then
    die "the pre-flight check failed${failed_on:+ on $failed_on} (tables above); fix it, or skip the check with --no-check"
  fi
fi
log='"logs/worker-$(hostname).log"'
if [[ $DETACH == 1 ]]; then
  remote_all "set -e; cd $QDIR; mkdir -p logs; export $exports; nohup $train > $log 2>&1 < /dev/null & echo \"\$(hostname): started, logging to $REMOTE_DIR/logs/worker-\$(hostname).log\""
  note "training runs in the background; fetch logs with: $0 --name $NAME --zone $ZONE${PROJECT:+ --project $PROJECT} --fetch-logs"
else
  remote_all "cd $QDIR && mkdir -p logs && export $exports && set -o pipefail && $train 2>&1 | tee $log"
fi
