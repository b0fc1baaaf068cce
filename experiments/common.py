"""What every experiment script shares: its command line, where its results go, the machine it ran on, the
progress bar, and the BLAS thread count.

Each script is ``python experiments/NAME.py [--quick] [--out DIR]``: it writes DIR/results.json (every figure it
measured, with the settings and the machine) and DIR/*.png. The default DIR is experiments/results/NAME, or
experiments/results/NAME-quick with --quick (ignored by git, so a quick run never overwrites a full run's figures).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

# One BLAS thread unless the caller says otherwise. Set before NumPy is imported: the layers here multiply
# small matrices, where a second OpenBLAS thread mostly adds synchronisation, and timings with one thread
# compare the layers' own work rather than how well each one splits over two cores.
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import numpy  # after the thread settings

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
PROTOCOLS = HERE / "protocols"


def protocol(name: str) -> dict:
    """A study's protocol, protocols/NAME.json, fixed before its runs: the arms, seeds, tuning rule, metrics,
    margins and verdict rule, and under "settings" what the study runs. Its "sha256" (of the file's bytes) names
    the run: results.json stores it, and a resumable study keeps its runs under it, so that a run under a changed
    protocol is a new run."""
    raw = (PROTOCOLS / f"{name}.json").read_bytes()
    return {**json.loads(raw), "sha256": hashlib.sha256(raw).hexdigest()}


def digest(settings: dict) -> str:
    """The sha256 of a settings dict (its JSON, keys sorted): what names a quick run's store."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def parser(doc: str) -> argparse.ArgumentParser:
    """The options every experiment takes; a script adds its own."""
    p = argparse.ArgumentParser(description=doc.strip().splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="tiny settings that finish in seconds (what the tests run); the figures mean little")
    p.add_argument("--out", type=Path, default=None,
                   help="folder for results.json and the plots (default experiments/results/NAME[-quick])")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--replot", action="store_true",
                   help="only redraw the plots from the results.json already in the output folder")
    return p


def main(module, argv=None) -> None:
    """A script's command line: run its settings (or --quick ones), save results.json, draw its plots."""
    args = parser(module.__doc__).parse_args(argv)
    started = time.perf_counter()
    out = out_dir(args, module.NAME)
    path = out / "results.json"
    if not args.replot:
        settings = module.QUICK if args.quick else module.SETTINGS
        sha = digest(settings) if args.quick or not hasattr(module, "PROTOCOL") else module.PROTOCOL["sha256"]
        kwargs = {"folder": out / f"runs-{sha[:12]}"} if getattr(module, "RESUMABLE", False) else {}
        results = module.run(settings, progress=not args.no_progress, **kwargs)
        path = save(out, module.NAME, settings, results, started, args.quick,
                    None if args.quick else getattr(module, "PROTOCOL", None))
    for name, fig in module.figures(load(path)).items():
        save_figure(fig, out, f"{module.NAME}_{name}")
    print(f"wrote {path if not args.replot else 'the plots'} in {out} in {time.perf_counter() - started:.0f} s")


def out_dir(args, name: str) -> Path:
    out = args.out if args.out is not None else RESULTS / (f"{name}-quick" if args.quick else name)
    out.mkdir(parents=True, exist_ok=True)
    return out


def machine() -> dict:
    """The CPU model, the cores this process may use, and the library versions: the context of every timing."""
    model = platform.processor() or platform.machine()
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10, check=False).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": model, "cores": cores, "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
            "python": platform.python_version(), "numpy": numpy.__version__, "platform": platform.platform()}


def save(out: Path, name: str, settings: dict, results: dict, started: float, quick: bool,
         protocol_: dict | None = None) -> Path:
    """Write results.json: the settings, the protocol's file and sha256, the machine, the wall time and the
    figures."""
    payload = {"experiment": name, "quick": quick, "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
               "date": time.strftime("%Y-%m-%d %H:%M:%S"), "seconds": round(time.perf_counter() - started, 1),
               "machine": machine(), "settings": settings, "results": results}
    if protocol_ is not None:
        payload["protocol"] = {"file": f"protocols/{name}.json", "sha256": protocol_["sha256"]}
    path = out / "results.json"
    path.write_text(json.dumps(payload, indent=1, default=_plain) + "\n", encoding="utf-8")
    return path


def load(path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def stored_or_quick(module) -> tuple:
    """For the notebooks: the stored full run of an experiment script if there is one, else its quick settings
    run now. Returns (payload, a sentence saying which)."""
    path = RESULTS / module.NAME / "results.json"
    if path.exists():
        payload = load(path)
        return payload, (f"the stored full run: {path.relative_to(HERE.parent)}, {payload['date']}, "
                         f"{payload['machine']['cpu']} ({payload['machine']['cores']} cores), {payload['seconds']:.0f} s")
    payload = {"settings": module.QUICK, "results": module.run(module.QUICK, progress=False), "quick": True}
    return payload, f"no stored full run at {path.relative_to(HERE.parent)}: the quick settings, run just now"


def _plain(x):
    """NumPy scalars and arrays as JSON numbers and lists."""
    if isinstance(x, numpy.generic):
        return x.item()
    if isinstance(x, numpy.ndarray):
        return x.tolist()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def progress(total: int, desc: str, disable: bool = False):
    # The plain bar: tqdm.auto wants ipywidgets in Jupyter and warns without them.
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, disable=disable, unit="step", dynamic_ncols=True, mininterval=0.5)


def save_figure(fig, out: Path, name: str) -> str:
    path = out / f"{name}.png"
    fig.savefig(path, dpi=80)
    return path.name


def new_figure(ncols: int = 1, nrows: int = 1, width: float = 5.0, height: float = 3.6):
    """A matplotlib Figure without pyplot: scripts save it with no display, notebooks show it with display()."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * ncols, height * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, axes.ravel()


def markdown_table(title: str, header: list, rows: list) -> str:
    """A title line, then a Markdown table: the header's names, the separator, a line of cells per row."""
    lines = [title, "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def mean_std(summary_: dict, fmt: str = ".2f", sign: str = "") -> str:
    """A summary's mean +- sample standard deviation, as the studies' tables print it."""
    return f"{summary_['mean']:{sign}{fmt}} +- {summary_['std']:{fmt}}"


def summary(values) -> dict:
    """Mean, sample standard deviation (ddof = 1; 0 for one value), min and max over seeds."""
    a = numpy.asarray(values, dtype=float)
    std = float(a.std(ddof=1)) if a.size > 1 else 0.0
    return {"mean": float(a.mean()), "std": std, "min": float(a.min()), "max": float(a.max())}


def comparison_table(comparisons: dict, fmt: str = "+.2f") -> str:
    """Every comparison of a study, a line each: what it compares, the claim, for each metric its mean paired
    difference with the 95% interval (Student's t), the sample SD and the per-seed differences, the verdict
    (experiments/stats.py), the Holm-adjusted p over the study's comparisons and the verdict it leaves. A
    comparison still missing seeds shows its status instead of a verdict."""
    import stats

    metrics = list(dict.fromkeys(m for c in comparisons.values() for m in c["metrics"]))
    header = ["comparison", "claim"]
    for m in metrics:
        header += [f"d {m} [95% CI]", "SD", "per seed"]
    rows = []
    for name, c in comparisons.items():
        row = [name, c.get("claim", "")]
        for m in metrics:
            p = c["metrics"].get(m)
            if p is None:
                row += ["", "", ""]
                continue
            f = c.get("formats", {}).get(m, fmt)
            expected = {1: "+", -1: "-", 0: f"0 +-{p['margin']:g}"}[p["expected"]]
            row += [f"{stats.fmt_diff(p, f)} (claim: {expected})",
                    "-" if p["sd"] is None else f"{p['sd']:{f.lstrip('+')}}",
                    ", ".join(f"{d:{f}}" for d in p["diffs"])]
        if c.get("status", "complete") != "complete":
            row += [c["status"], "", ""]
        else:
            tested = "p_holm" in c and c["verdict"] in ("reproduced", "opposite", "inconclusive")
            row += [stats.shown(c["verdict"], c), f"{c['p_holm']:.2g}" if tested else "-",
                    stats.shown(c["verdict_holm"], c) if "verdict_holm" in c else "-"]
        rows.append(row)
    return markdown_table("", header + ["verdict", "p, Holm", "verdict, Holm-corrected"], rows).lstrip("\n")
