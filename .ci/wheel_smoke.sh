#!/usr/bin/env bash
# The installed wheel, used from outside the repository: build it, install it (with the tested constraints) into a
# fresh virtualenv, then from / run the commands a new user starts with. Usage: wheel_smoke.sh REPO WORKDIR
set -euo pipefail
repo="$1"
work="$2"
mkdir -p "$work"
python3 -m venv "$work/venv"
py="$work/venv/bin/python"
"$py" -m pip install --quiet --upgrade pip
"$py" -m pip wheel --quiet --no-deps -w "$work/dist" "$repo"
"$py" -m pip install --quiet -c "$repo/constraints.txt" "$work"/dist/orchestra_jax-*.whl
bin="$work/venv/bin"
out="$work/out"
mkdir -p "$out"
cd /
unset ORCHESTRA_DATA_DIR
set -x
"$bin/orchestra" init-random --config tiny --config.model.num_layers=1 --out "$out/tiny"
test -f "$out/tiny/model_config.json"
"$bin/orchestra" data convert --source tau2-airline --out "$out/airline.jsonl"
"$bin/orchestra" data convert --source frames --limit 20 --out "$out/frames.jsonl"
"$bin/orchestra" data stats "$out/airline.jsonl" "$out/frames.jsonl"
"$bin/orchestra" train --config demo --quiet --config.workdir="$out/demo" --config.steps=1 \
  --config.sft.steps=1 --config.prompts_per_step=2 --config.group_size=2 --config.rollout.batch_size=4 \
  --config.env.num_train_tasks=16 --config.env.num_eval_tasks=2 --config.eval_every=100 --config.checkpoint_every=1
test -f "$out/demo/run_config.json"
"$py" - "$out/demo/metrics.jsonl" <<'PY'
import json, sys
records = [json.loads(line) for line in open(sys.argv[1])]
steps = [r["step"] for r in records if r["kind"] == "train"]
assert steps == [1], f"expected one training step, got {steps}"
PY
set +x
echo "wheel smoke test: ok"
