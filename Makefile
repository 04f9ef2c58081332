# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# Both create (or reuse) the virtual environment at .venv.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_DIR := runs/tiny-random

.PHONY: demo test bench clean-venv

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# The main job (for now): make a tiny random Qwen3 with the real tokenizer and generate from it.
demo: $(STAMP)
	test -d $(DEMO_DIR)/params || $(BIN)/orchestra init-random --preset tiny --out $(DEMO_DIR)
	$(BIN)/orchestra generate --model $(DEMO_DIR) --prompt "What is 17 * 23?" --chat --max-new-tokens 24

test: $(STAMP)
	XLA_FLAGS=--xla_force_host_platform_device_count=8 $(BIN)/python -m pytest -q -n 2 --dist loadfile tests

bench: $(STAMP)
	$(BIN)/python benchmarks/forward_throughput.py

clean-venv:
	rm -rf $(VENV)
