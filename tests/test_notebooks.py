"""Every notebook in notebooks/ runs top to bottom in a fresh python3 kernel, as a student would run it.

One test per notebook: nbclient starts a new kernel with notebooks/ as the working directory and runs every
cell in order, in memory (the file on disk is left as it is); a cell that raises fails the test with that cell's
source and error. Notebooks 7 and 8 train for a minute or two each, so the whole file takes a few minutes
(deselect with ``-m "not slow"``).

The kernel imports this checkout's package (the repository root goes first on PYTHONPATH), and runs with one
BLAS thread unless the environment says otherwise: the models here multiply small matrices, where OpenBLAS
threads competing for a shared CPU made training steps several times slower, not faster.

Also checked, cheaply: notebooks are stored with their outputs, as notebooks/run_all.py writes them (every code
cell run once, in order, without errors or timestamps, figures included, small enough to render where the
repository is browsed), and notebooks/README.md lists each of them.
"""

import os
import re
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")  # provides the python3 kernel

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = REPO / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
CELL_TIMEOUT = 300      # seconds per cell; the longest cells train for at most a minute and a half
MAX_BYTES = 1024 * 1024         # one notebook with its outputs; larger ones may not render online
MAX_TOTAL_BYTES = 8_000_000     # all of them together
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def test_notebooks_exist():
    numbers = [int(p.name[:2]) for p in NOTEBOOKS]
    assert numbers[:10] == list(range(1, 11)), \
        f"expected notebooks 01..10 in {NOTEBOOK_DIR}, found {[p.name for p in NOTEBOOKS]}"
    assert numbers == list(range(1, len(numbers) + 1)), f"notebooks are not numbered 01, 02, ... without gaps: {numbers}"


def _failed_cell(nb):
    """Index of the first code cell with an error output (None if there is none)."""
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and any(o.get("output_type") == "error" for o in cell.get("outputs", [])):
            return index
    return None


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, monkeypatch, record_property):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(name, os.environ.get(name, "1"))
    monkeypatch.delenv("MINITRANSFORMER_BACKEND", raising=False)   # notebooks choose their backend themselves

    stored = path.read_bytes()
    nb = nbformat.reads(stored.decode("utf-8"), as_version=4)
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
    started = time.perf_counter()
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as err:
        index = _failed_cell(nb)
        error = f"{getattr(err, 'ename', type(err).__name__)}: {getattr(err, 'evalue', '')}"
        pytest.fail(f"{path.name}, cell {index}: {error}\n\n{ANSI.sub('', str(err))}", pytrace=False)
    except nbclient.exceptions.CellTimeoutError as err:
        pytest.fail(f"{path.name}: a cell ran longer than {CELL_TIMEOUT} s\n{ANSI.sub('', str(err))}", pytrace=False)
    record_property("seconds", round(time.perf_counter() - started, 1))
    assert path.read_bytes() == stored, f"{path.name} changed on disk while the test ran it (only run_all.py writes it)"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_stored_with_its_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3", f"{path.name}: kernelspec must be python3"
    code = [(index, cell) for index, cell in enumerate(nb.cells) if cell.cell_type == "code" and cell.source.strip()]
    counts = [cell.execution_count for _, cell in code]
    assert counts == list(range(1, len(code) + 1)), \
        f"{path.name}: execution counts {counts}; run the notebook top to bottom once: python notebooks/run_all.py"
    for index, cell in code:
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert not errors, f"{path.name}, cell {index}: stored with an error ({errors[0].ename}: {errors[0].evalue})"
        assert "execution" not in cell.metadata, \
            f"{path.name}, cell {index}: stored with execution timestamps, which change on every run"
    figures = sum("image/png" in o.get("data", {}) for _, cell in code for o in cell.outputs)
    assert figures > 0, f"{path.name}: no figure among the stored outputs"
    size = path.stat().st_size
    assert size < MAX_BYTES, f"{path.name}: {size / 1024:.0f} KiB with its outputs; keep it under 1 MiB " \
                             "(fewer or smaller figures)"


def test_notebooks_together_stay_small():
    total = sum(p.stat().st_size for p in NOTEBOOKS)
    assert total < MAX_TOTAL_BYTES, f"the notebooks take {total / 1e6:.1f} MB with their outputs, over 8 MB"


def test_readme_lists_every_notebook_in_order():
    readme = (NOTEBOOK_DIR / "README.md").read_text(encoding="utf-8")
    positions = [readme.find(f"({p.name})") for p in NOTEBOOKS]
    missing = [p.name for p, at in zip(NOTEBOOKS, positions) if at < 0]
    assert not missing, f"notebooks/README.md does not link {missing}"
    assert positions == sorted(positions), "notebooks/README.md lists the notebooks out of order"
