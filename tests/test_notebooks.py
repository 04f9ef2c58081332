"""The notebooks under notebooks/ run headless from top to bottom without a cell error."""

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (pip install nbformat)")
nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed (pip install nbclient)")
pytest.importorskip("ipykernel", reason="ipykernel is not installed; no python3 kernel to run notebooks")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


@pytest.mark.parametrize("name", ["reward_variants.ipynb"])
def test_notebook_runs(name, monkeypatch):
  monkeypatch.setenv("MPLBACKEND", "Agg")  # no display; the notebook's %matplotlib inline still renders
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  path = NOTEBOOKS / name
  nb = nbformat.read(path, as_version=4)
  client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                   resources={"metadata": {"path": str(NOTEBOOKS)}})
  client.execute()  # raises CellExecutionError on the first failing cell
  errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
  assert not errors, errors
