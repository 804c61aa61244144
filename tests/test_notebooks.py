"""The notebooks run headless, top to bottom, on the demo model; they are stored without outputs."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path):
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "strip outputs before committing"
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    figures = [o for o in outputs if o.get("output_type") in ("execute_result", "display_data")
               and any("plotly" in k or k == "text/html" for k in o.get("data", {}))]
    assert figures, "the notebook drew no figure"
    from workbench.browser import have_chromium

    if have_chromium():  # outside live Jupyter (nbconvert HTML, GitHub) only a static image shows
        assert all("image/svg+xml" in o["data"] for o in figures if any("plotly" in k for k in o["data"])), \
            "a figure has no static image beside its interactive one"
