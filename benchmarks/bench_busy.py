"""The main job on a machine that is doing something else: ``minitransformer train --task toy``, idle and with
other processes keeping cores busy (``yes > /dev/null``, as a laptop in a classroom always runs something),
with the BLAS threads the program chooses ("new") and with the BLAS library's default, one per core ("old").

    python benchmarks/bench_busy.py                        # the whole main job, 4 runs: idle/busy x old/new
    python benchmarks/bench_busy.py --steps 300 --limit 100 --repeats 2     # a short measurement

"old" runs with OPENBLAS_NUM_THREADS set to the cores this process may use, which is the count OpenBLAS takes
by itself (and the count the package's own thread pool takes); "new" runs with no BLAS variable set, so the
program chooses (``minitransformer.kit.running.runs.choose_blas_threads``). Each run is a fresh subprocess of this
checkout; the old and new runs of a condition alternate, so a change in the machine's load reaches both.
Target of the whole job: test BLEU >= 95 in under 3 minutes of wall time on 2 cores with one of them kept busy.
Each row also gives the job's CPU seconds and the mean 1-minute load average while it ran (sampled every 5 s):
on a machine that other work shares, a wall time means little without them.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]          # this checkout: its package is the one measured
# minitransformer.fast.threads.BLAS_ENV_VARS: a "new" run sets none of them, so that the program chooses
BLAS_VARS = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
             "OMP_NUM_THREADS")
TARGET_BLEU, TARGET_WALL_S = 95.0, 180.0


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


def environment(behaviour: str) -> dict:
    """The variables of a run: "old" pins the BLAS default (one thread per core), "new" lets the program choose."""
    env = {k: v for k, v in os.environ.items() if k not in BLAS_VARS}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    if behaviour == "old":
        env["OPENBLAS_NUM_THREADS"] = str(cores())
    return env


def start_busy(n: int) -> list:
    """n processes that each keep a core busy (``yes`` writing to /dev/null)."""
    return [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(n)]


def stop_busy(processes: list) -> None:
    for p in processes:
        p.kill()
        p.wait()


def sample_load(loads: list, done: threading.Event, every: float = 5.0) -> None:
    """The 1-minute load average, every `every` seconds until done is set: what else ran during a job."""
    while not done.wait(every):
        loads.append(os.getloadavg()[0])


def run(folder: Path, behaviour: str, args) -> dict:
    """One ``minitransformer train --task toy`` -> its metrics.json, with the wall time measured around it."""
    command = [sys.executable, "-m", "minitransformer", "train", "--task", args.task, "--out", str(folder),
               "--overwrite", "--no-progress", "--no-plots", "--seed", str(args.seed)]
    if args.steps is not None:
        command += ["--steps", str(args.steps)]
    if args.limit is not None:
        command += ["--limit", str(args.limit)]
    loads, done = [], threading.Event()
    sampler = threading.Thread(target=sample_load, args=(loads, done), daemon=True)
    started, used = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    sampler.start()
    try:
        subprocess.run(command, check=True, env=environment(behaviour), stdout=subprocess.DEVNULL)
    finally:
        done.set()
    wall, now = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
    metrics = json.loads((folder / "metrics.json").read_text())
    # CPU seconds of the job alone (the busy processes are reaped later): threads that spin while they wait
    # for each other show here, whatever else the machine runs.
    cpu = now.ru_utime + now.ru_stime - used.ru_utime - used.ru_stime
    return {"wall_s": wall, "cpu_s": cpu, "load": sum(loads) / len(loads) if loads else os.getloadavg()[0],
            "train_s": metrics["train_seconds"], "steps": metrics["steps"],
            "bleu": metrics.get("bleu"), "stopped": metrics.get("stopped", metrics.get("stop_reason")),
            "blas_threads": metrics.get("blas_threads"), "set_by": metrics.get("blas_threads_set_by")}


def _names(allowed):
    def parse(text: str) -> list:
        names = [t.strip() for t in text.split(",") if t.strip()]
        if not names or any(n not in allowed for n in names):
            raise argparse.ArgumentTypeError(f"expected names among {', '.join(allowed)}, comma-separated, got {text!r}")
        return names
    return parse


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="toy", choices=("toy", "copy", "reverse"), help="default toy, the main job")
    parser.add_argument("--steps", type=int, default=None, help="train this many steps (default: the task's own "
                                                                "stop, the whole job)")
    parser.add_argument("--limit", type=int, default=None, help="score only the first N test sentences")
    parser.add_argument("--conditions", type=_names(("idle", "busy")), default="idle,busy")
    parser.add_argument("--behaviours", type=_names(("old", "new")), default="old,new")
    parser.add_argument("--busy", type=int, default=1, help="processes keeping a core busy in 'busy' (default 1)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each condition and behaviour (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/bench-busy", help="folder for the runs (default runs/bench-busy)")
    parser.add_argument("--json", default=None, help="write the rows here as JSON")
    args = parser.parse_args(argv)

    print(f"{cores()} cores; load average at the start {os.getloadavg()[0]:.2f} "
          f"(an 'idle' figure means little above ~0.3); busy = {args.busy} x `yes > /dev/null`")
    print(f"{'condition':<9} {'BLAS':<4} {'threads':>7}  {'set by':<22} {'steps':>5}  {'train s':>7}  {'wall s':>7}  "
          f"{'cpu s':>7}  {'ms/step':>7}  {'BLEU':>6}  {'load':>5}  stopped")
    rows = []
    for condition in args.conditions:
        for repeat in range(args.repeats):
            for behaviour in args.behaviours:
                folder = Path(args.out) / f"{condition}-{behaviour}-{repeat}"
                busy = start_busy(args.busy) if condition == "busy" else []
                try:
                    row = run(folder, behaviour, args)
                finally:
                    stop_busy(busy)
                row.update(condition=condition, behaviour=behaviour, repeat=repeat)
                rows.append(row)
                bleu = "" if row["bleu"] is None else f"{row['bleu']:.2f}"
                print(f"{condition:<9} {behaviour:<4} {row['blas_threads']!s:>7}  {row['set_by']!s:<22} "
                      f"{row['steps']:>5}  {row['train_s']:>7.1f}  {row['wall_s']:>7.1f}  {row['cpu_s']:>7.1f}  "
                      f"{1000 * row['train_s'] / max(row['steps'], 1):>7.1f}  {bleu:>6}  {row['load']:>5.2f}  "
                      f"{row['stopped']}", flush=True)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    for condition in args.conditions:
        walls = {b: [r["wall_s"] for r in rows if r["condition"] == condition and r["behaviour"] == b]
                 for b in args.behaviours}
        if all(walls.values()) and len(walls) == 2:
            old, new = min(walls["old"]), min(walls["new"])
            print(f"{condition}: old {old:.1f} s, new {new:.1f} s of wall time (best of {args.repeats}): "
                  f"new/old = {new / old:.2f}")
    judged = [r for r in rows if r["condition"] == "busy" and r["behaviour"] == "new"]
    if args.task == "toy" and args.steps is None and args.limit is None and judged:
        missed = [r for r in judged if not (r["bleu"] >= TARGET_BLEU and r["wall_s"] < TARGET_WALL_S)]
        print(f"busy target (BLEU >= {TARGET_BLEU:g} in under {TARGET_WALL_S:g} s of wall time): "
              + (f"met by all {len(judged)} run(s)" if not missed else f"missed by {len(missed)} of {len(judged)}"))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
