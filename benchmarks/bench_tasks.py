"""Train the copy, reverse and toy tasks from scratch with the command line's defaults and print what each
reached and how long it trained: the figures the README's "Results" table reports.

    python benchmarks/bench_tasks.py [--tasks copy,reverse,toy] [--seeds 0,1] [--out runs/bench]

Targets: copy 100% exact match in under 30 s of training, reverse >= 99% in under 3 minutes, toy test
BLEU >= 95 within 5 minutes, on 2 CPU cores. Each run is a fresh ``minitransformer train`` subprocess; the
times are read from its metrics.json (``train_seconds`` is the time inside training steps, ``wall_seconds``
the whole command).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

TARGETS = {"copy": ("exact_match", 1.0, 30), "reverse": ("exact_match", 0.99, 180), "toy": ("bleu", 95.0, 300)}


ROOT = Path(__file__).resolve().parents[1]          # this checkout: its package is the one benchmarked


def run(task: str, seed: int, out: Path) -> dict:
    """One fresh ``minitransformer train`` of this checkout -> its metrics.json. --overwrite replaces only an
    earlier run's own files in that folder."""
    folder = out / f"{task}-seed{seed}"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    subprocess.run([sys.executable, "-m", "minitransformer", "train", "--task", task, "--seed", str(seed),
                    "--out", str(folder), "--overwrite", "--no-progress", "--no-plots"], check=True, env=env)
    return json.loads((folder / "metrics.json").read_text())


def _names(text: str) -> list:
    tasks = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in tasks if t not in TARGETS]
    if not tasks or unknown:
        raise argparse.ArgumentTypeError(f"expected tasks among {', '.join(TARGETS)}, comma-separated, got {text!r}")
    return tasks


def _seeds(text: str) -> list:
    try:
        seeds = [int(s) for s in text.split(",")]
    except ValueError:
        seeds = []
    if not seeds or min(seeds) < 0:
        raise argparse.ArgumentTypeError(f"expected non-negative integers, comma-separated, got {text!r}")
    return seeds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=_names, default="copy,reverse,toy",
                        help=f"comma-separated, from {','.join(TARGETS)} (default: all)")
    parser.add_argument("--seeds", type=_seeds, default="0", help="comma-separated seeds, one run each (default 0)")
    parser.add_argument("--out", default="runs/bench", help="folder for the runs, one subfolder each (default runs/bench)")
    parser.add_argument("--json", default=None, help="write the rows here as JSON")
    args = parser.parse_args(argv)
    rows = []
    print(f"{'task':<8} {'seed':>4}  {'metric':<12} {'value':>8}  {'target':>8}  {'train s':>8}  {'limit s':>7}  met")
    for task in args.tasks:
        name, target, limit = TARGETS[task]
        for seed in args.seeds:
            m = run(task, seed, Path(args.out))
            value, seconds = m[name], m["train_seconds"]
            met = value >= target and seconds <= limit
            rows.append({"task": task, "seed": seed, name: value, "train_seconds": seconds, "met": met,
                         "wall_seconds": m.get("wall_seconds"), "tokens_per_second": m.get("tokens_per_second"),
                         "steps": m.get("steps")})
            print(f"{task:<8} {seed:>4}  {name:<12} {value:>8.3f}  {target:>8}  {seconds:>8.1f}  {limit:>7}  "
                  f"{'yes' if met else 'NO'}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    missed = [f"{r['task']} seed {r['seed']}" for r in rows if not r["met"]]
    print("every target met" if not missed else f"targets missed: {', '.join(missed)}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
