"""Re-execute the notebooks in place, in order, so that the stored outputs (figures included) are current.

    python notebooks/run_all.py                    # every notebook, 01 first
    python notebooks/run_all.py 04 07              # only those whose name starts with 04 or 07

Each notebook runs top to bottom in a fresh python3 kernel, with notebooks/ as its working directory,
as tests/test_notebooks.py runs it. Each notebook seeds itself in its first code cell; this script
fixes what is left: the hash seed, one BLAS thread (small matrices, where threads fighting over a shared CPU
only slow things down; an OPENBLAS_NUM_THREADS already set wins) and the NumPy backend unless a notebook
chooses another. Outputs are written without execution timestamps and with the notebook's metadata as it
was, so a re-run changes only what the code printed or drew. A notebook that fails is left untouched.

The time each notebook took is printed here, never stored in it.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import nbclient
import nbformat

NOTEBOOK_DIR = Path(__file__).resolve().parent
REPO = NOTEBOOK_DIR.parent
CELL_TIMEOUT = 300          # seconds per cell; the longest cells train for about a minute
MAX_BYTES = 1024 * 1024     # one notebook, outputs included, stays under 1 MiB so that it renders online
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")   # the colours of a traceback


def notebooks(prefixes: list[str]) -> list[Path]:
    paths = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
    if prefixes:
        paths = [p for p in paths if any(p.name.startswith(prefix) for prefix in prefixes)]
    return paths


def kernel_environment() -> None:
    """The environment every kernel inherits: this checkout's package first, one BLAS thread, a fixed hash seed."""
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(name, "1")
    os.environ["PYTHONHASHSEED"] = "0"
    os.environ.pop("MINITRANSFORMER_BACKEND", None)


def merge_streams(nb) -> None:
    """Join each run of consecutive stdout (or stderr) outputs into one, as Jupyter shows them.

    How a kernel cuts its output into messages depends on timing; merged, a re-run stores the same text the same
    way. Only neighbours are joined, so text printed after a figure stays after it.
    """
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        merged = []
        for output in cell.outputs:
            previous = merged[-1] if merged else None
            if (output.output_type == "stream" and previous is not None and previous.output_type == "stream"
                    and previous.name == output.name):
                previous.text += output.text
            else:
                merged.append(output)
        cell.outputs = merged


def execute(path: Path, timeout: int) -> tuple[bool, float, str]:
    """Run one notebook; write it back with its outputs if every cell ran. Returns (ok, seconds, message)."""
    nb = nbformat.read(path, as_version=4)
    metadata = nbformat.from_dict(dict(nb.metadata))      # kernelspec and language_info as stored
    client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                                     resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
    started = time.perf_counter()
    try:
        client.execute(stderr=subprocess.DEVNULL)   # the kernel's own log, not the cells' stderr
    except (nbclient.exceptions.CellExecutionError, nbclient.exceptions.CellTimeoutError) as err:
        text = ANSI.sub("", str(err)).strip()
        last_line = text.splitlines()[-1] if text else type(err).__name__
        return False, time.perf_counter() - started, f"failed, left as it was: {last_line}"
    seconds = time.perf_counter() - started
    merge_streams(nb)
    nb.metadata = metadata          # the kernel would write its Python version here: churn, not content
    nbformat.validate(nb)
    nbformat.write(nb, path)
    size = path.stat().st_size
    note = "" if size < MAX_BYTES else f"  (over {MAX_BYTES // 1024} KiB: shrink its figures)"
    return True, seconds, f"{size / 1024:6.0f} KiB{note}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prefixes", nargs="*", help="run only the notebooks whose name starts with one of these")
    parser.add_argument("--timeout", type=int, default=CELL_TIMEOUT, help="seconds allowed per cell")
    args = parser.parse_args(argv)

    paths = notebooks(args.prefixes)
    if not paths:
        print(f"no notebook in {NOTEBOOK_DIR} matches {args.prefixes}", file=sys.stderr)
        return 2
    kernel_environment()
    failed, total = [], 0.0
    for path in paths:
        print(f"{path.name:42s} ", end="", flush=True)
        ok, seconds, message = execute(path, args.timeout)
        total += seconds
        print(f"{seconds:6.1f} s   {message}", flush=True)
        if not ok:
            failed.append(path.name)
    sizes = sum(p.stat().st_size for p in notebooks([]))
    print(f"{len(paths)} notebooks in {total:.0f} s; all notebooks together {sizes / 1024 / 1024:.2f} MiB")
    if failed:
        print("failed:", ", ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
