"""Train the copy, reverse and toy tasks from scratch with the command line's defaults and print what each
reached and how long it trained: the figures the README's "Results" table reports.

    python benchmarks/bench_tasks.py [--tasks copy,reverse,toy] [--seeds 0,1] [--out runs/bench]

Targets (issues #3 and #4): copy 100% exact match in under 30 s of training, reverse >= 99% in under
3 minutes, toy test BLEU >= 95 within 5 minutes, on 2 CPU cores. Each run is a fresh
``minitransformer train`` subprocess; the times are read from its metrics.json (``train_seconds`` is
the time inside training steps, ``wall_seconds`` the whole command).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

TARGETS = {"copy": ("exact_match", 1.0, 30), "reverse": ("exact_match", 0.99, 180), "toy": ("bleu", 95.0, 300)}


def run(task: str, seed: int, out: Path) -> dict:
    folder = out / f"{task}-seed{seed}"
    shutil.rmtree(folder, ignore_errors=True)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "minitransformer", "train", "--task", task, "--seed", str(seed),
                    "--out", str(folder), "--no-progress", "--no-plots"], check=True, env=os.environ.copy())
    metrics = json.loads((folder / "metrics.json").read_text())
    metrics["command_seconds"] = time.perf_counter() - started
    return metrics


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="copy,reverse,toy")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--out", default="runs/bench")
    parser.add_argument("--json", default=None, help="write the rows here as JSON")
    args = parser.parse_args(argv)
    rows = []
    print(f"{'task':<8} {'seed':>4}  {'metric':<12} {'value':>8}  {'target':>8}  {'train s':>8}  {'limit s':>7}  met")
    for task in args.tasks.split(","):
        name, target, limit = TARGETS[task]
        for seed in map(int, args.seeds.split(",")):
            m = run(task, seed, Path(args.out))
            value, seconds = m[name], m["train_seconds"]
            met = value >= target and seconds <= limit
            rows.append({"task": task, "seed": seed, name: value, "train_seconds": seconds, "met": met,
                         "tokens_per_second": m.get("tokens_per_second"), "steps": m.get("steps")})
            print(f"{task:<8} {seed:>4}  {name:<12} {value:>8.3f}  {target:>8}  {seconds:>8.1f}  {limit:>7}  "
                  f"{'yes' if met else 'NO'}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
