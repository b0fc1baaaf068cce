"""A class at once: every submission graded against a fresh copy of the assignment.

A submission is a student's folder or zip holding their `transformer/` folder or its loose files, wherever they sit.
The files of the assignment's exercises, and the other modules of the folder they came from, are taken: read as
bytes (zips never extracted, links never followed, each file at most MAX_FILE) into a fresh, stubbed copy of the
assignment, so an edited assignment.json or cases.py, or a file left out that the handout stubs, never counts.
Students are graded `workers` at a time, each in a process group of its own with a deadline; each result is stored
as it comes (an interrupted batch resumes where it stopped), then a CSV gradebook and a Markdown feedback each."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import multiprocessing.connection
import os
import re
import secrets
import shutil
import signal
import stat
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from tqdm import tqdm

import minitransformer
from minitransformer.kit.files import atomic_write, lock_folder, open_regular, parse_json, write_json

from . import grader
from .exercises import EXERCISES, TRAIN, choose
from .maker import PACKAGE, make, parts_of

MAX_FILE = 1 << 20          # bytes of one file taken from a submission (the core's largest is under 40 KB)
MAX_ENTRIES = 20_000        # files and zip members looked at in one submission
MAX_ZIP = 64 << 20          # bytes of a zip opened at all (its member list is read whole)
MAX_RESULT = 16 << 20       # bytes of one stored result read back
UNSAFE = re.compile(r"^([/\\]|[A-Za-z]:)|(^|[/\\])\.\.([/\\]|$)")      # an absolute path or a '..' in a zip member
NO_FILES = "no files found"
IGNORED = re.compile(r"(^|/)(__MACOSX|\.[^/]*)(/|$)")                  # macOS's resource forks, hidden files


def manifest(assignment) -> tuple[list, tuple]:
    """(exercises, revealed parts) of the teacher's assignment folder, from its assignment.json."""
    path = Path(assignment) / "assignment.json"
    if not path.is_file():
        raise FileNotFoundError(f"classroom: --assignment {assignment} holds no assignment.json (expected the "
                                f"folder `minitransformer classroom make` wrote)")
    data = parse_json(path.read_text(encoding="utf-8"), str(path))
    names = data.get("exercises") if isinstance(data, dict) else None
    if not isinstance(names, list) or len(set(map(str, names))) != len(names):
        raise ValueError(f"classroom: {path} must list each exercise once under 'exercises', got {names!r:.200}")
    return choose(names), parts_of(data.get("reveal", ()))


def flagged(results: dict) -> list:
    """The grader's flags for the teacher ({exercise: [flag]}) as lines: 'linear: identical to the reference'."""
    return [f"{name}: {flag}" for name, flags in results.get("flags", {}).items() for flag in flags]


def tested(exercises: list) -> list:
    """The exercises graded: those handed out, and `train` with part 3."""
    return exercises + [TRAIN] * any(e.part == 3 for e in exercises)


def graded_files(exercises: list) -> list:
    """The files under transformer/ that hold the exercises: those looked for wherever they sit in a submission."""
    return sorted({file for e in exercises for file, _, _ in e.targets})


def listing(root: Path, notes: list) -> list:
    """(shown name, file, zip member or None) of every file under root (a folder, a zip, zips in the folder); links,
    and zip members with an absolute path or '..', refused with a note."""
    found = []

    def add_zip(path: Path, shown: str) -> None:
        if path.stat().st_size > MAX_ZIP:
            notes.append(f"{shown}: a zip larger than {MAX_ZIP >> 20} MB, not opened")
            return
        try:
            with zipfile.ZipFile(path) as z:
                members = z.infolist()[:MAX_ENTRIES]
        except (OSError, zipfile.BadZipFile, ValueError) as err:
            notes.append(f"{shown}: not a zip that can be read ({err})")
            return
        for info in (m for m in members if not m.is_dir()):
            if stat.S_ISLNK(info.external_attr >> 16) or UNSAFE.search(info.filename):
                notes.append(f"refused {shown}/{info.filename[:120]}: a link, an absolute path or '..'")
            elif not IGNORED.search(info.filename):
                found.append((f"{shown}/{info.filename}", path, info))

    if root.is_symlink() or not root.exists():
        notes.append(f"{root.name}: {'a link, refused' if root.is_symlink() else 'does not exist'}")
        return found
    if root.is_file():
        add_zip(root, root.name)
        return found
    for folder, dirs, files in os.walk(root):          # links to folders are listed, never walked into
        here = Path(folder).relative_to(root).as_posix()
        dirs[:] = [d for d in dirs if not IGNORED.search(d)]        # .git, .venv, __MACOSX: not walked
        for name in sorted(dirs + [f for f in files if not IGNORED.search(f)]):
            path, shown = Path(folder) / name, f"{here}/{name}".removeprefix("./")
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode) and (name.endswith(".py") or "." not in name):      # a module, or a folder
                notes.append(f"refused {shown}: a link (only files count)")
            elif stat.S_ISREG(mode) and name.lower().endswith(".zip"):
                add_zip(path, shown)
            elif stat.S_ISREG(mode):
                found.append((shown, path, None))
        if len(found) > MAX_ENTRIES:
            notes.append(f"more than {MAX_ENTRIES} files: the rest not looked at")
            break
    return found


def read(entry) -> bytes:
    shown, path, member = entry
    if member is None:
        with open_regular(path, "submitted file") as f:
            data = f.read(MAX_FILE + 1)
    else:
        with zipfile.ZipFile(path) as z, z.open(member) as f:
            data = f.read(MAX_FILE + 1)         # however large the member says it unpacks to
    if len(data) > MAX_FILE:
        raise ValueError(f"{shown} is larger than {MAX_FILE >> 10} KB: not taken")
    return data


def collect(source, files: list) -> tuple[dict, dict, list]:
    """({file: its bytes}, {file: where it was found}, notes): for each of `files` (e.g. layers/linear.py) the file of
    that name in the submission whose path ends most like it (transformer/layers/linear.py before a loose
    linear.py), a second candidate noted; and the other .py files of the package folder the first came from."""
    notes, found, where = [], {}, {}
    entries = listing(Path(source), notes)

    def take(file, entry) -> bool:                 # the file's bytes into found, or a note
        try:
            found[file] = read(entry)
        except (OSError, ValueError, RuntimeError, zipfile.BadZipFile, EOFError) as err:
            notes.append(f"{entry[0]} could not be read: {err}")
        return file in found

    for file in files:
        want = file.split("/")[::-1]

        def suffix(entry):                      # how many trailing path parts agree with the wanted file's
            got = entry[0].split("/")[::-1]
            return next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        matches = sorted((e for e in entries if e[0].rsplit("/", 1)[-1] == want[0]),
                         key=lambda e: (-suffix(e), PACKAGE not in e[0].split("/"), e[0].count("/"), e[0]))
        if len(matches) > 1:
            notes.append(f"{len(matches)} files named {want[0]}: graded {matches[0][0]}")
        if matches and take(file, matches[0]):
            where[file] = matches[0][0]
    # The student's other modules in the folder the first file came from (a helper of their own, an edited core
    # file): their package as check.py sees it. Loose files have no such folder.
    folder = next((where[f][:-len(f)] for f in files if f in where and f"/{where[f]}".endswith(f"/{f}")), None)
    for entry in (e for e in entries if folder is not None and e[0].startswith(folder) and e[0].endswith(".py")
                  and e[0][len(folder):] not in found):
        if sum(map(len, found.values())) > grader.STUDENT_BYTES:
            notes.append(f"more than {grader.STUDENT_BYTES >> 20} MB of Python files: the rest not taken")
            break
        take(entry[0][len(folder):], entry)
    return found, where, notes


def nothing_found(exercises: list, files: list, notes: list) -> dict:
    """A zero, said loudly: none of the assignment's files is in the submission."""
    text = (f"NO FILE OF THE ASSIGNMENT FOUND in the submission: expected {', '.join(files)} (in a transformer/ "
            f"folder or loose); nothing was graded")
    tests = [{"name": f"part {e.part}: {e.name}", "score": 0, "max_score": e.points, "status": "failed",
              "output": text, "visibility": "visible"} for e in tested(exercises)]
    return {"score": 0, "execution_time": 0, "output": text, "tests": tests, "flags": {"submission": [NO_FILES]},
            "notes": notes}


def grade_files(assignment, base: Path, exercises: list, found: dict, where: dict, notes: list, *, seed=None,
                diagnoses="what", time_limit=None, workers=2) -> dict:
    """The grader's results for the student's files `found` written into a fresh copy of the stubbed handout (base),
    with "files" (where each came from) and "notes" (what was refused or chosen) added."""
    if not found:
        return nothing_found(exercises, graded_files(exercises), notes)
    with tempfile.TemporaryDirectory(prefix="minitransformer-grade-") as work:
        submission = Path(work) / PACKAGE
        shutil.copytree(base / PACKAGE, submission)
        for file, data in found.items():
            (submission / file).parent.mkdir(parents=True, exist_ok=True)
            (submission / file).write_bytes(data)
        results = grader.grade(assignment, submission, seed=seed, diagnoses=diagnoses, time_limit=time_limit,
                               workers=workers)
    return {**results, "files": where, "notes": notes}


def grade_one(source, assignment, **options) -> dict:
    """One student's submission (a folder, a zip, a transformer/ folder, loose files) graded against a fresh copy
    of the assignment; options: seed, diagnoses, time_limit, workers."""
    exercises, reveal = manifest(assignment)
    with tempfile.TemporaryDirectory(prefix="minitransformer-base-") as base:
        make(Path(base) / "hw", [e.name for e in exercises], reveal=reveal)
        found, where, notes = collect(source, graded_files(exercises))
        return grade_files(assignment, Path(base) / "hw", exercises, found, where, notes, **options)


def students(folder: Path) -> tuple[dict, list]:
    """({student: submission}, ignored names): each folder or zip directly under `folder`, named by it."""
    found, ignored = {}, []
    for path in sorted(folder.iterdir()):
        zipped = path.suffix.lower() == ".zip" and path.is_file()
        if path.name.startswith(".") or path.name == "__MACOSX" or not (zipped or path.is_dir()) or path.is_symlink():
            ignored.append(path.name)
        else:
            found[path.name if path.stem in found or not zipped else path.stem] = path
    return found, ignored


def safe(name: str) -> str:
    return re.sub(r"[^\w.@+-]", "_", name)[:120]


def load(path: Path, holding: str = "results") -> dict | None:
    """A stored result (a dict holding `holding`), or None when there is none or it cannot be read: graded again."""
    try:
        with open_regular(path, "stored result") as f:
            data = parse_json(f.read(MAX_RESULT).decode("utf-8", "replace"), str(path))
        return data if isinstance(data, dict) and holding in data else None
    except (OSError, ValueError):
        return None


def _child(job: dict, store: str, assignment: str, base: str, exercises: list, options: dict) -> None:
    """One student in a process group of its own (the parent kills the group at the deadline), its printing
    dropped; writes the stored result."""
    if hasattr(os, "setsid"):
        os.setsid()
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    try:
        results = grade_files(assignment, Path(base), [EXERCISES[n] for n in exercises], job["found"],
                              job["where"], job["notes"], **options)
        write_json(Path(store) / f"{safe(job['student'])}.json", {"student": job["student"], "key": job["key"],
                                                                  "results": results})
    except BaseException as err:  # noqa: BLE001 - the parent records a failure for a result that never came
        with open(Path(store) / f"{safe(job['student'])}.error", "w") as f:
            f.write(f"{type(err).__name__}: {err}"[:500])


def failure(job: dict, exercises: list, why: str) -> dict:
    """The stored result of a student whose grading did not finish: zero, flagged, graded again on the next run."""
    results = nothing_found(exercises, graded_files(exercises), job["notes"])
    text = f"GRADING FAILED for this submission: {why}; the teacher will look at it"
    for test in results["tests"]:
        test["output"] = text
    return {"student": job["student"], "key": None,
            "results": {**results, "output": text, "flags": {"submission": [text]}, "files": job["where"]}}


def grade_class(submissions, assignment, store=None, *, workers=2, only=None, seed=None, diagnoses="what",
                time_limit=None, progress=True) -> dict:
    """{student: stored result} for every submission under `submissions`, each graded unless `store` (default:
    SUBMISSIONS-graded/) already holds its result for the same files, seed and options; `only` regrades one."""
    submissions, (exercises, reveal) = Path(submissions), manifest(assignment)
    roster, ignored = students(submissions)
    if only is not None and only not in roster:
        raise ValueError(f"classroom grade: --only must name a submission under {submissions}, got {only!r} "
                         f"(there: {', '.join(list(roster)[:10]) or 'none'})")
    for name in ignored:
        print(f"classroom grade: {submissions / name} is not a student's folder or zip: ignored", file=sys.stderr)
    store = Path(store or submissions.with_name(submissions.name + "-graded"))
    store.mkdir(parents=True, exist_ok=True)
    release = lock_folder(store, "results folder")
    try:
        state = load(store / "seed.json", "seed") or {}
        seed = state.get("seed") if seed is None and isinstance(state.get("seed"), int) else seed
        seed = secrets.randbelow(10**9) if seed is None else seed        # one seed for the whole class, kept
        write_json(store / "seed.json", {"seed": seed, "assignment": str(Path(assignment).resolve())})
        options = {"seed": seed, "diagnoses": diagnoses, "time_limit": time_limit, "workers": 1}
        todo = []
        for student, path in roster.items():
            if only is not None and student != only:
                continue
            try:
                found, where, notes = collect(path, graded_files(exercises))
            except (OSError, ValueError) as err:
                found, where, notes = {}, {}, [f"the submission could not be read: {err}"]
            digest = hashlib.sha256(json.dumps([sorted(found), options, [e.name for e in exercises],
                                                minitransformer.__version__]).encode())
            for file in sorted(found):
                digest.update(found[file])
            job = {"student": student, "found": found, "where": where, "notes": notes, "key": digest.hexdigest()}
            stored = load(store / f"{safe(student)}.json")
            if only is not None or not stored or stored.get("key") != job["key"]:
                todo.append(job)
        print(f"{len(todo)} of {len(roster)} submissions to grade (seed {seed}, kept in {store}); the others' "
              f"results are stored from an earlier run", file=sys.stderr)
        with tempfile.TemporaryDirectory(prefix="minitransformer-base-") as base:
            make(Path(base) / "hw", [e.name for e in exercises], reveal=reveal)
            run_jobs(todo, store, str(assignment), str(Path(base) / "hw"), exercises, options, workers, progress)
        return {s: r for s in roster if (r := load(store / f"{safe(s)}.json"))}
    finally:
        release()


def stop(process) -> None:
    """Kill a student's grading process and every process of its group."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (AttributeError, OSError):        # no process groups (Windows), or the child has not made its own yet
        process.kill()


def run_jobs(todo, store, assignment, base, exercises, options, workers, progress) -> None:
    """Each job in a process of its own, `workers` at a time, killed (with its whole group) past its deadline or
    when the batch is interrupted."""
    ctx = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    deadline = (options["time_limit"] or 30.0) * (len(exercises) + 2) + 60
    running, names = {}, [e.name for e in exercises]
    with tqdm(total=len(todo), unit="student", disable=not progress, desc="grading") as bar:
        try:
            while todo or running:
                while todo and len(running) < workers:
                    job = todo.pop(0)
                    (store / f"{safe(job['student'])}.error").unlink(missing_ok=True)
                    process = ctx.Process(target=_child, args=(job, str(store), assignment, base, names, options))
                    process.start()
                    running[job["student"]] = (process, time.monotonic() + deadline, job)
                multiprocessing.connection.wait([p.sentinel for p, _, _ in running.values()], timeout=1)
                for student, (process, ends, job) in list(running.items()):
                    if process.exitcode is None and time.monotonic() < ends:
                        continue
                    late = process.exitcode is None
                    if late:
                        stop(process)
                    process.join()
                    stored = load(store / f"{safe(student)}.json")
                    if not stored or stored.get("key") != job["key"]:
                        error = store / f"{safe(student)}.error"
                        why = error.read_text()[:500] if error.is_file() else f"stopped after {deadline:.0f} s" \
                            if late else f"the grading process ended without a result (exit code {process.exitcode})"
                        write_json(store / f"{safe(student)}.json", failure(job, exercises, why))
                    del running[student]
                    bar.update()
        finally:                             # interrupted: no grading outlives the batch
            for process, _, _ in running.values():
                stop(process)


def points(results: dict, columns: list) -> list:
    """Points per exercise column, from the tests named 'part N: NAME'."""
    return [sum(t["score"] for t in results["tests"] if t["name"].rsplit(": ", 1)[-1] == c) for c in columns]


def cell(text: str) -> str:
    """A text a spreadsheet will not read as a formula (a name or a flag may come from a student's file names)."""
    return f"'{text}" if text[:1] in ("=", "+", "-", "@") else text


def gradebook(path, graded: dict, exercises: list) -> None:
    """The CSV an LMS imports: student, total, max, the points of each exercise, flags."""
    columns = [e.name for e in tested(exercises)]
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["student", "total", "max", *columns, "flags"])
    for student, record in graded.items():
        r = record["results"]
        flags = "; ".join([*flagged(r), *r.get("notes", [])])
        writer.writerow([cell(student), r["score"], sum(t["max_score"] for t in r["tests"]), *points(r, columns),
                         cell(flags)])
    atomic_write(path, lambda f: f.write(out.getvalue().encode("utf-8")), "gradebook")


def fenced(text: str) -> str:
    """Text in a Markdown code block that no run of backticks inside it can close."""
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", text)), default=0))
    return f"{fence}text\n{text}\n{fence}"


def feedback(student: str, results: dict) -> str:
    """A student's feedback in Markdown: total, the files graded, a row per exercise, then each diagnosis."""
    total = sum(t["max_score"] for t in results["tests"])
    lines = [f"# Feedback for {student}", "", f"**{results['score']} / {total} points**", ""]
    if results.get("files"):
        lines += ["Your files graded: " + ", ".join(f"`{f}` (from `{w}`)" for f, w in results["files"].items()), ""]
    lines += [f"- {note}" for note in results.get("notes", [])] + [""] * bool(results.get("notes"))
    lines += ["| exercise | points | status |", "|---|---:|---|"]
    lines += [f"| {t['name']} | {t['score']} / {t['max_score']} | {t.get('status', '')} |" for t in results["tests"]]
    for t in (t for t in results["tests"] if t["score"] < t["max_score"]):
        lines += ["", f"## {t['name']}: {t['score']} / {t['max_score']}", "", fenced(t["output"])]
    return "\n".join(lines) + "\n"


def write_feedback(folder, graded: dict) -> None:
    Path(folder).mkdir(parents=True, exist_ok=True)
    for student, record in graded.items():
        text = feedback(student, record["results"]).encode("utf-8")
        atomic_write(Path(folder) / f"{safe(student)}.md", lambda f, text=text: f.write(text), "feedback")
