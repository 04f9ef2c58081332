import os
import sys
from pathlib import Path

# Tests see 8 CPU devices (the Makefile sets this too); must happen before jax is imported.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
sys.path.insert(0, os.path.dirname(__file__))

# Test files live in folders that mirror the package; these anchors do not depend on a file's depth.
REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"

import jax  # noqa: E402
import pytest  # noqa: E402

from hf_reference import SMALL_CONFIGS, random_hf_model, save_hf  # noqa: E402


def max_rel_err(a, b) -> float:
  """max |a - b| / max |b|: relative to the reference's scale, so near-zero entries do not blow it up."""
  import numpy as np
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.fixture(scope="session")
def hf_dirs(tmp_path_factory):
  """name -> (torch model, saved HF dir) for each small reference config."""
  out = {}
  for name in SMALL_CONFIGS:
    model = random_hf_model(name)
    out[name] = (model, save_hf(model, tmp_path_factory.mktemp(f"hf_{name}")))
  return out


@pytest.fixture
def highest_precision():
  with jax.default_matmul_precision("highest"):
    yield


@pytest.fixture(scope="session")
def synth_bank_dir(tmp_path_factory):
  """A domain directory written by a real `orchestra synth` run against the scripted LLM (scripted_synth_llm.py)."""
  from orchestra_jax import cli
  from orchestra_jax.tools.scripted_server import ScriptedServer
  from scripted_synth_llm import MODEL, script
  out = tmp_path_factory.mktemp("synth") / "bank"
  with ScriptedServer(script()) as srv:
    assert cli.main(["synth", "--endpoint", srv.base_url + "/v1", "--model", MODEL, "--domain", "bank", "--out",
                     str(out), "--num-tasks", "7", "--seed", "3", "--rows-per-table", "4", "--max-retries", "1"]) == 0
  return out
