"""The time to grade a class: N copies of the solutions graded as `classroom grade SUBMISSIONS/ --assignment hw/`
grades them, `--workers` students at a time.

    python benchmarks/bench_class.py [--students 200] [--workers 2] [--exercises linear,relu,...] [--timeout 30]

Every exercise by default (all three parts, `train` among them). Prints the wall time, the processor time of every
grading process (on a machine others share, CPU seconds / workers is the wall time the same cores would take
alone), the load average at the start and the end, and checks that every copy got full marks.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from minitransformer.kit.classroom import batch  # noqa: E402
from minitransformer.kit.classroom.maker import make  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--students", type=int, default=200)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--exercises", default=None, help="comma-separated (default: every backward exercise)")
    p.add_argument("--timeout", type=float, default=30.0)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        make(tmp / "hw", args.exercises)
        make(tmp / "solutions", args.exercises, solutions=True)
        for i in range(args.students):
            shutil.copytree(tmp / "solutions" / "transformer", tmp / "class" / f"student{i:03d}" / "transformer")
        load, started = os.getloadavg(), time.monotonic()
        graded = batch.grade_class(tmp / "class", tmp / "hw", tmp / "store", workers=args.workers, seed=0,
                                   time_limit=args.timeout, progress=False)
        wall = time.monotonic() - started
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        full = sum(r["results"]["score"] == sum(t["max_score"] for t in r["results"]["tests"])
                   for r in graded.values())
    cpu = usage.ru_utime + usage.ru_stime
    print(f"{args.students} copies of the solutions ({args.exercises or 'every exercise'}), {args.workers} workers, "
          f"{os.cpu_count()} cores: {wall:.0f} s wall ({wall / args.students:.2f} s a student), {cpu:.0f} CPU s "
          f"({cpu / args.workers:.0f} s on {args.workers} free cores); {full}/{args.students} full marks; "
          f"load average {load[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
