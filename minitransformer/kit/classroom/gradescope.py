"""Gradescope's autograder in one zip: `setup.sh` installs this package from the wheel inside it, `run_autograder`
grades the student's upload (their files found wherever they put them) against the fresh, stubbed assignment inside,
with the teacher's hidden seed, and always writes results/results.json. The paths are Gradescope's, under
/autograder, or under $MINITRANSFORMER_AUTOGRADER_ROOT (tests lay out a root of their own)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import minitransformer
from minitransformer.kit.files import atomic_write, write_json

from . import batch
from .maker import make

ROOT = "MINITRANSFORMER_AUTOGRADER_ROOT"
WHEN = {"visible": "at once", "after_due_date": "after the due date", "after_published": "once grades are published",
        "hidden": "to the teacher alone"}

SETUP = """#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder: this package from its wheel (beside this
# file), its dependencies (numpy, ...) from pip's index. PIP_BREAK_SYSTEM_PACKAGES lets pip install into a system
# Python that calls itself externally managed; older pips ignore it.
set -euo pipefail
cd "$(dirname "$0")"
if ! python3 -m pip --version >/dev/null 2>&1; then
    apt-get update && apt-get install -y python3 python3-pip
fi
PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install ./{wheel}
chmod 600 config.json                # the hidden seed: for the grader (root), not for code it runs as another user
"""

RUN = """#!/usr/bin/env bash
# Gradescope runs this for each submission: grade it and write results/results.json, whatever happens.
ROOT="${{{root}:-/autograder}}"
python3 -I -m minitransformer.kit.classroom.gradescope     # -I: no module of the current folder shadows it
if [ ! -s "$ROOT/results/results.json" ]; then        # Python itself could not run
    mkdir -p "$ROOT/results"
    echo '{{"score": 0, "tests": [], "output": "The autograder failed before grading anything: tell your teacher."}}' \\
        > "$ROOT/results/results.json"
fi
"""


def build_wheel(folder: Path) -> Path:
    """A wheel of this package, built from the source tree it was imported from (pip wheel --no-deps, no
    network: the build tools installed are used)."""
    tree = Path(minitransformer.__file__).resolve().parent.parent
    if not (tree / "pyproject.toml").is_file():
        raise FileNotFoundError(f"classroom autograder: no source tree beside the installed package ({tree}); build "
                                f"a wheel (pip wheel --no-deps minitransformer) and give it with --wheel")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                           str(folder), str(tree)], capture_output=True, text=True)
    wheels = sorted(folder.glob("minitransformer-*.whl"))
    if done.returncode or not wheels:
        raise RuntimeError(f"classroom autograder: pip wheel {tree} failed: {done.stderr.strip()[-400:]}")
    return wheels[0]


def build(assignment, output, seed=None, visibility="visible", diagnoses="what", time_limit=None, wheel=None) -> dict:
    """Write Gradescope's autograder zip for the assignment folder `make` wrote; returns its config (the seed,
    drawn when None, among it). visibility: when students see the diagnoses (scores show at once)."""
    if visibility not in WHEN:
        raise ValueError(f"classroom autograder: --visibility must be one of {', '.join(WHEN)}, got {visibility!r}")
    if not str(output).endswith(".zip"):
        raise ValueError(f"classroom autograder: -o must name a .zip file, got {output!r}")
    exercises, reveal = batch.manifest(assignment)
    config = {"seed": secrets.randbelow(10**9) if seed is None else seed, "visibility": visibility,
              "diagnoses": diagnoses, "time_limit": time_limit}
    with tempfile.TemporaryDirectory(prefix="minitransformer-autograder-") as tmp:
        fresh = Path(tmp) / "assignment"
        make(fresh, [e.name for e in exercises], reveal=reveal)
        wheel = Path(wheel) if wheel else build_wheel(Path(tmp) / "wheel")
        if not wheel.is_file() or wheel.suffix != ".whl":
            raise FileNotFoundError(f"classroom autograder: --wheel must be a .whl file, got {wheel}")

        def write(f) -> None:
            with zipfile.ZipFile(f, "w", zipfile.ZIP_DEFLATED) as z:
                scripts = {"setup.sh": SETUP.format(wheel=wheel.name), "run_autograder": RUN.format(root=ROOT)}
                for name, text in scripts.items():
                    info = zipfile.ZipInfo(name)
                    info.external_attr = 0o100755 << 16                  # executable, as Gradescope runs them
                    z.writestr(info, text)
                z.write(wheel, wheel.name)
                z.writestr("config.json", json.dumps(config, indent=1))
                for path in sorted(p for p in fresh.rglob("*") if p.is_file() and p.suffix != ".ipynb"):
                    z.write(path, f"assignment/{path.relative_to(fresh).as_posix()}")
        atomic_write(output, write, "autograder zip")
    return config


def for_students(results: dict, visibility: str) -> dict:
    """Gradescope's results.json: scores shown at once, each diagnosis when `visibility` says (a test of no points
    beside the exercise's), the seed, flags and files kept for the teacher (extra_data, a hidden test)."""
    tests = []
    for t in results["tests"]:
        test = {k: t.get(k) for k in ("name", "score", "max_score", "status", "output")} | {"visibility": "visible"}
        if visibility == "visible" or t["score"] == t["max_score"]:
            tests.append(test)
        else:
            tests += [{**test, "output": f"failed; the diagnosis shows {WHEN[visibility]}"},
                      {**test, "name": f"{t['name']}: diagnosis", "score": 0, "max_score": 0,
                       "visibility": visibility}]
    flags = batch.flagged(results)
    if flags:
        tests.append({"name": "for the teacher", "score": 0, "max_score": 0, "status": "failed",
                      "output": "\n".join(flags), "visibility": "hidden"})
    files = results.get("files", {})
    output = [results["output"]] if not files else \
        ["Your files graded: " + ", ".join(f"{f} (from {w})" for f, w in files.items())]
    return {"score": results["score"], "output": "\n".join(output + results.get("notes", [])), "tests": tests,
            "stdout_visibility": "hidden", "extra_data": {"seed": results.get("seed"), "flags": flags,
                                                          "files": files}}


def run(root=None) -> dict:
    """Grade root/submission against root/source (the unpacked zip); write root/results/results.json, a zero
    that says why when anything fails."""
    root, started = Path(root or os.environ.get(ROOT, "/autograder")), time.monotonic()
    try:
        config = json.loads((root / "source" / "config.json").read_text())
        assignment = root / "source" / "assignment"
        exercises, _ = batch.manifest(assignment)
        found, where, notes = batch.collect(root / "submission", batch.graded_files(exercises))
        results = for_students(batch.grade_files(
            assignment, assignment, exercises, found, where, notes, seed=config["seed"],
            diagnoses=config["diagnoses"], time_limit=config["time_limit"]), config["visibility"])
    except BaseException as err:  # noqa: BLE001 - a results file whatever happens
        results = {"score": 0, "tests": [], "output": f"The autograder failed ({type(err).__name__}: {err}); your "
                                                      "submission was not graded: tell your teacher."}
    results["execution_time"] = round(time.monotonic() - started, 1)
    (root / "results").mkdir(parents=True, exist_ok=True)
    write_json(root / "results" / "results.json", results, "Gradescope results")
    return results


if __name__ == "__main__":
    run()
