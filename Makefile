# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# Both create (or reuse) the virtual environment at .venv.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench clean-venv

# constraints.txt pins the exact tested versions; pyproject.toml keeps ranges for other environments.
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[test]'
	touch $(STAMP)

# The main job: the CPU demo. A tiny random Qwen3 (real Qwen3 tokenizer) is warmed up on the tool-call format,
# then RL-trained to route questions to priced tools, once preferring cheap tools and once, from the same
# warm-up, preferring the expert. Writes runs/demo/{cheap,expert} (metrics, plots, checkpoints); a rerun
# resumes from the latest checkpoints.
demo: $(STAMP)
	$(BIN)/orchestra train --config demo --config.workdir=runs/demo/cheap
	$(BIN)/orchestra train --config demo --config.workdir=runs/demo/expert \
	  "--config.env.preferences=('expert',)" --config.init_checkpoint=runs/demo/cheap/reference --config.sft.steps=0

test: $(STAMP)
	XLA_FLAGS=--xla_force_host_platform_device_count=8 $(BIN)/python -m pytest -q -n 2 --dist loadfile tests

bench: $(STAMP)
	$(BIN)/python benchmarks/forward_throughput.py

clean-venv:
	rm -rf $(VENV)
