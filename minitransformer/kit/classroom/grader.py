"""Grading a student's files, one exercise at a time, each in a sandbox of its own (sandbox.py, harness.py).

The student's code runs where the reference cannot be reached: a fresh interpreter, the student's own copy of the
core as check.py sees it (the assignment's handout, with every exercise not yet revealed a stub, and the student's
files laid over it), `minitransformer` refused, and when the grader is root a user of its own that cannot read the
package, signal the grader or write outside its folder. An exercise runs with the student's other classes, as
check.py runs it: when it fails because a class it runs fails its own exercise, the scorecard says so. What comes
back is data (JSON and arrays of known shapes); the verdict is computed here, against the reference's tensors
computed here, on the public cases (check.py's) and on hidden ones drawn from the teacher's seed: the forward, the
backward (.grad pre-filled, so "=" for "+=" shows), and on a failure the exercise's catalogue mutants on the same
inputs, to name the mistake."""

from __future__ import annotations

import ast
import inspect
import subprocess
import json
import secrets
import shutil
import tempfile
import time
from pathlib import Path

import numpy

import minitransformer
from minitransformer import backend

from . import sandbox, train_copy
from .cases import UNLOADED, Failed, prepare, run
from .exercises import CATALOGUE, EXERCISES, TRAIN, build
from .maker import PACKAGE, package, parts_of, withheld_of, write_package

MATCH = 1e-6                 # relative agreement with the reference (a pass) or with a mistake (a diagnosis)
STUDENT_BYTES = 16 << 20     # the most a submission's files may hold
HERE = Path(__file__).parent
IDENTICAL = "identical to the reference solution"


def failed(reason: str, forward: str = "FAIL") -> dict:         # an exercise that fails for one reason
    return {"forward": forward, "backward": "FAIL", "diagnosis": reason, "output": reason}


def copy_files(source: Path, target: Path) -> list:
    """Copy the student's .py files under source over target as plain files; returns those refused: a link is
    never followed, so no file outside the submission comes in under a student's name (the handout's stays)."""
    names = sorted(p.relative_to(source).as_posix() for p in source.rglob("*.py"))
    if sum((source / n).lstat().st_size for n in names) > STUDENT_BYTES:
        raise Failed(f"the submission holds more than {STUDENT_BYTES >> 20} MB of Python files")
    refused = []
    for name in names:
        path = source / name
        if any(p.is_symlink() for p in [path, *path.parents][:len(Path(name).parts) + 1]) or not path.is_file():
            refused.append(name)
            continue
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target / name)
    return refused


def normalised(source: str, cls_name: str, names) -> list:
    """The methods' bodies as syntax trees with docstrings dropped and local names numbered in order of use."""
    classes = [n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == cls_name]
    bodies = []
    for fn in [f for c in classes[-1:] for f in c.body if isinstance(f, ast.FunctionDef) and f.name in names]:
        seen = {}
        for node in ast.walk(fn):
            for field in ("id", "arg"):
                if isinstance(node, (ast.Name, ast.arg)) and hasattr(node, field):
                    setattr(node, field, seen.setdefault(getattr(node, field), f"v{len(seen)}"))
        body = fn.body[1:] if ast.get_docstring(fn) is not None else fn.body
        bodies.append((fn.name, [ast.dump(b, annotate_fields=False) for b in body]))
    return sorted(bodies)


def text(student: Path, file: str) -> str:
    """A student's file as text, read as a plain file (no link, no pipe), or '' if it is not one."""
    return (sandbox.read(student / Path(file).parent, Path(file).name, STUDENT_BYTES) or b"").decode()


def identical(exercise, student: Path) -> bool:
    """Whether the student's methods are the reference's own code, token for token after names and comments."""
    try:
        return all(normalised(text(student, file), cls.__name__, names) ==
                   normalised(inspect.getsource(inspect.getmodule(cls)), cls.__name__, names)
                   for file, cls, _, names in exercise.methods())
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError, UnicodeDecodeError):
        return False


def begin(exercise, student: Path, seeds, folder: Path, time_limit: float, uid, handout: dict) -> dict:
    """Compute the reference on the cases of each seed (the first public), then start the student's process on the
    student's copy: the handout ({file: text}) with the student's files over it."""
    job = {"exercise": exercise, "folder": folder, "seeds": list(seeds), "runs": [], "classes": set()}
    folder.mkdir()
    shutil.copyfile(HERE / "harness.py", folder / "harness.py")
    try:
        write_package(folder / PACKAGE, handout)
        refused = [n for n in copy_files(student, folder / PACKAGE)
                   if exercise is TRAIN or n in {file for file, _, _ in exercise.targets}]
        if refused:
            raise Failed(f"{refused[0]} is a link or not a file: hand in the file itself")
        if exercise is TRAIN:
            shutil.copyfile(HERE / "train_copy.py", folder / "train_copy.py")
            spec = {"exercise": "train", "seed": job["seeds"][-1]}
        else:
            backend.set_backend("numpy")           # the grader's checks read host arrays
            backend.set_default_dtype("float64")
            given = []
            for seed in job["seeds"]:
                built = prepare(minitransformer, exercise.name, seed)
                job["runs"] += [(*case, run(backend, *case[1:3], {}, case[3])) for case in built]
                given.append({"seed": seed, "given": [{k: t[k] for k in ("before", "after", "out_shape")}
                                                      for *_, t in built]})
                job["classes"] |= {type(p) for _, module, *_ in built for m in module.modules()
                                   for p in (m, getattr(m, "loss_fn", None))}
            spec = {"exercise": exercise.name, "runs": given}
    except (Failed, OSError) as err:                # the submission's files, as they came
        job["result"] = failed(str(err) if isinstance(err, Failed) else f"the submission's files cannot be read "
                               f"({type(err).__name__}: {err.strerror})", "-" if exercise is TRAIN else "FAIL")
        return job
    shutil.copyfile(HERE / "cases.py", folder / "cases.py")
    job["process"], job["printed"] = sandbox.start(folder, spec, uid)
    job["uid"], job["limit"], job["deadline"] = uid, time_limit, time.monotonic() + time_limit
    return job


def differs(mine: dict, expected: dict, only=None):
    """The worst disagreement (tensor, index, yours, expected, relative error) over the tensors of both, or None."""
    worst = None
    for name in [n for n in expected if n in mine and n != "error" and (only is None or n in only)]:
        a, b = mine[name], expected[name]
        diff = numpy.abs(a - b)
        err = float(diff.max(initial=0)) / max(1e-8, float(numpy.abs(a).max(initial=0) + numpy.abs(b).max(initial=0)))
        if err >= MATCH and (worst is None or err > worst[4]):
            i = numpy.unravel_index(int(numpy.argmax(diff)), a.shape)
            worst = (name, [int(j) for j in i], float(a[i]), float(b[i]), err)
    return worst


def same(a: dict, b: dict) -> bool:
    return a.get("error") == b.get("error") and ("error" in a or differs(a, b) is None)


def received(job: dict, got: dict) -> list:
    """The student's result per case, read as data: {tensor: array} of the reference's names and shapes, or
    {"error": (stage, text), "shown": text, "type": name}."""
    mines = []
    for k, (*_, reference) in enumerate(job["runs"]):
        case = got["cases"][k] if isinstance(got.get("cases"), list) and k < len(got["cases"]) else None
        error = case.get("error") if isinstance(case, dict) else None
        if isinstance(error, list) and len(error) == 2 and all(isinstance(e, str) for e in error):
            mines.append({"error": (error[0][:20], error[1][:300]), "shown": str(case.get("shown", ""))[:400],
                          "type": str(case.get("type", ""))[:40]})
            continue
        mine = {n: sandbox.array(job["folder"] / "out", f"{k}-{n}", r.shape) for n, r in reference.items()}
        if case is None or any(v is None for v in mine.values()):
            missing = next((n for n, v in mine.items() if v is None), "its result")
            raise Failed(f"no result for case {k + 1}: {missing} missing, or not an array of the expected shape")
        mines.append(mine)
    return mines


def judge(job: dict, got: dict, diagnoses: str) -> dict:
    """{forward, backward, diagnosis, output} from the student's data: passes when every case agrees everywhere."""
    exercise, public = job["exercise"], len(job["runs"]) // len(job["seeds"])
    if "failed" in got:
        return failed(str(got["failed"])[:400])
    forward = "ok" if exercise.targets[0][2] == "forward" else "given"
    mines = received(job, got)
    for k, ((label, module, inputs, trial, reference), mine) in enumerate(zip(job["runs"], mines)):
        hidden = k >= public                  # what the student reads never holds the hidden inputs
        stage, reason = mine.get("error", (None, None))
        reason = f"{stage} raised {mine['type'] or 'an error'}" if stage and hidden else mine.get("shown", reason)
        worst = stage is None and (differs(mine, reference, only=("out",)) or differs(mine, reference))
        if worst:
            stage = "forward" if worst[0] == "out" else "backward"
            reason = ("{}{}: relative error {:.1e}".format(worst[0], worst[1], worst[4]) if hidden else
                      "{}{}: yours {:.6g}, expected {:.6g} (relative error {:.1e})".format(*worst))
        if stage is None:
            continue
        # A mistake is named when it gives what the student's code gives (tensors or error) on every case.
        named = next((m for m in CATALOGUE if m.exercise == exercise.name and m.visible and
                      all(same(mn, run(backend, r[1], r[2], build(m), r[3])) for r, mn in zip(job["runs"], mines))),
                     None)
        says = named and named.says + (f"; the fix: {named.fix}" if diagnoses == "fix" and named.fix else "")
        where = f"case '{label}'" + (", hidden inputs" if hidden else "")
        output = [f"{where}: {stage} fails: {reason}", says and f"this looks like: {says}"]
        return {"forward": "FAIL" if stage == "forward" else forward, "backward": "FAIL",
                "diagnosis": says or reason, "output": "\n".join(filter(None, output))}
    return {"forward": forward, "backward": "ok", "diagnosis": "",
            "output": f"every case agrees with the reference ({public} public, {len(mines) - public} hidden)"}


def judge_training(job: dict, got: dict) -> dict:
    """Part 3's finale: the weights the student's package trained, copied into the reference model and asked to
    copy 100 new strings here."""
    if "failed" in got:
        return failed(str(got["failed"])[:400], "-")
    backend.set_default_dtype("float64")
    model = minitransformer.Transformer(train_copy.config(minitransformer))
    state = {n: sandbox.array(job["folder"] / "out", n, a.shape) for n, a in model.state_dict().items()}
    if any(a is None for a in state.values()):
        return failed("the training run gave back no model of the copy task's shapes", "-")
    model.load_state_dict(state)
    exact = train_copy.exact_match(minitransformer, model, job["seeds"][-1])
    figures = got.get("figures") if isinstance(got.get("figures"), dict) else {}
    losses = [f"{figures[k]:.3f}" if isinstance(figures.get(k), float) else "?" for k in ("first_loss", "final_loss")]
    learned = exact >= train_copy.LEARNS
    text = (f"{'learned' if learned else 'did not learn'}: exact match {exact:.0%} on 100 new strings "
            f"(needs {train_copy.LEARNS:.0%}), loss {losses[0]} -> {losses[1]}")
    return {"forward": "-", "backward": "ok", "diagnosis": "", "output": text} if learned else failed(text, "-")


def finish(job: dict, diagnoses: str, timed_out: bool) -> dict:
    """The exercise's result once its process has ended or run out of time; the sandbox cleared."""
    if "result" in job:
        return job["result"]
    process, printed = job["process"], job["printed"]
    sandbox.stop(process, job["uid"])
    note = sandbox.printed(printed)
    printed.close()
    train = job["exercise"] is TRAIN
    if timed_out:
        result = failed(f"stopped after {job['limit']:g} s: an infinite loop, or far too slow (a numerical "
                        "backward?)", "-" if train else "FAIL")
    else:
        got = sandbox.result(job["folder"] / "out")
        try:
            result = (judge_training(job, got) if train else judge(job, got, diagnoses)) if got else None
        except Failed as err:
            result = failed(str(err), "-" if train else "FAIL")
        code = process.returncode
        reason = {-25: "wrote more than the output limit", -9: "killed: out of memory, or too many processes"}
        result = result or failed(f"the exercise's process ended without a result (exit code {code}"
                                  f"{': ' + reason[code] if code in reason else ''})", "-" if train else "FAIL")
    if note:
        result["output"] += f"\n({note})"
    return result


def passed(result: dict) -> bool:
    return result["backward"] == "ok" and result["forward"] != "FAIL"


def blames(e, d, results: dict, classes: set) -> bool:
    """Whether exercise d's failure explains e's: the cases of e use the class of d (train: every class), and d's own
    failure comes at a stage e reached (0 the forward, or the whole process; 1 the backward). A forward exercise's
    failure counts at its forward alone, and e, a forward exercise of d's class, blames d once its forward passed.
    A package that does not load, or a submission that cannot be taken, fails every exercise alike: no blame."""
    r, s = results[e.name], results[d.name]
    runs = e is TRAIN or classes & {cls for _, cls, _, _ in d.methods()}
    if d is e or passed(s) or not runs or r["diagnosis"].startswith((UNLOADED, "the submission")):
        return False
    stage_e, stage_d = int(r["forward"] != "FAIL"), int(s["forward"] != "FAIL")
    if d.targets[0][2] == "forward":
        return stage_d == 0
    same_class = e.targets and e.targets[0][2] == "forward" and e.targets[0][:2] in [t[:2] for t in d.targets]
    return stage_e == 1 if same_class else stage_d <= stage_e


def explain(exercises: list, results: dict, classes: dict) -> None:
    """An exercise that fails because a class it runs fails its own exercise says so, first: 'runs your Linear,
    which fails 'linear': fix that first', naming the failures at the root."""
    blamed = {e.name: [d for d in exercises if d is not TRAIN and blames(e, d, results, classes.get(e.name, set()))]
              for e in exercises if not passed(results[e.name])}
    for e in exercises:
        roots = [d for d in blamed.get(e.name, []) if not blamed[d.name]] or blamed.get(e.name, [])
        if roots:
            note = (f"runs your {', '.join(dict.fromkeys(d.targets[0][1] for d in roots))}, which "
                    f"fail{'s' * (len(roots) == 1)} {', '.join(repr(d.name) for d in roots)}: fix "
                    f"th{'at' if len(roots) == 1 else 'ose'} first")
            results[e.name] = {**results[e.name], "diagnosis": note, "output": f"{note}\n{results[e.name]['output']}"}


def grade_exercise(exercise, student, seeds=(0,), time_limit: float = 60.0, diagnoses: str = "what") -> dict:
    """One exercise of the student's files (a folder laid out like transformer/) on the cases of seeds."""
    handout = package([exercise], False, withheld_of([exercise]))
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as root:
        job = begin(exercise, Path(student), seeds, Path(root) / "job", time_limit, sandbox.user(), handout)
        if "process" in job:
            try:
                job["process"].wait(time_limit)
            except subprocess.TimeoutExpired:
                return finish(job, diagnoses, True)
        return finish(job, diagnoses, False)


def grade(assignment, submission=None, *, seed=None, diagnoses="what", time_limit=None, workers: int = 2) -> dict:
    """Grade the student's files in `submission` (a folder laid out like transformer/; the assignment's own
    transformer/ if None) on the exercises of `assignment` (as `classroom make` wrote it), on the public cases and
    on hidden ones drawn from `seed` (one drawn if None); `diagnoses`: "what" names the mistake and where it is,
    "fix" adds the fix. Returns Gradescope's results.json (score, execution_time, output, tests, each with name,
    score, max_score, status, output, visibility), plus "seed", "flags" {exercise: [flag]} and "scorecard"."""
    assignment = Path(assignment)
    manifest = assignment / "assignment.json"
    student = Path(submission) if submission is not None else assignment / PACKAGE
    if not student.is_dir() or not manifest.is_file():
        raise FileNotFoundError(f"classroom grade: {assignment} holds no assignment (expected assignment.json, and "
                                f"the student's files in {student}, as `minitransformer classroom make` writes them)")
    try:
        names = json.loads(manifest.read_text())["exercises"]
        exercises = [EXERCISES[n] for n in names]
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"classroom grade: {manifest} must list known exercises under 'exercises', "
                         f"got {err}") from None
    if len(set(names)) != len(names):
        raise ValueError(f"classroom grade: {manifest} lists {next(n for n in names if names.count(n) > 1)} twice; "
                         "each exercise counts once")
    if diagnoses not in ("what", "fix"):
        raise ValueError(f"classroom grade: diagnoses must be 'what' or 'fix', got {diagnoses!r}")
    seed = secrets.randbelow(10**9) if seed is None else seed         # within what --seed takes
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"classroom grade: seed must be a non-negative int, got {seed!r}")
    time_limit = 30.0 if time_limit is None else float(time_limit)
    handout = package(exercises, False, withheld_of(exercises, parts_of(json.loads(manifest.read_text()).get(
        "reveal", ()))))
    exercises += [TRAIN] if any(e.part == 3 for e in exercises) else []
    for folder in (Path(minitransformer.__file__).parent, assignment, student):
        sandbox.lock(folder)
    started, results, classes = time.monotonic(), {}, {}
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as root:
        pending, running = list(exercises), []
        while pending or running:
            while pending and len(running) < workers:
                e = pending.pop(0)
                running.append(begin(e, student, [0, seed], Path(root) / e.name, time_limit, sandbox.user(),
                                     handout))
            time.sleep(0.02)
            for job in list(running):
                late = "process" in job and job["process"].poll() is None and time.monotonic() > job["deadline"]
                if "process" not in job or job["process"].poll() is not None or late:
                    results[job["exercise"].name] = finish(job, diagnoses, late)
                    classes[job["exercise"].name] = job["classes"]
                    running.remove(job)
    explain(exercises, results, classes)
    flags = {e.name: [IDENTICAL] for e in exercises if e is not TRAIN and identical(e, student)}
    head = f"{'exercise':<20} {'part':>4}  {'forward':<7}  {'backward':<8}  {'points':>6}  diagnosis"
    table, tests = [head, "-" * len(head)], []
    for e in exercises:
        r = results[e.name]
        points = e.points if passed(r) else 0
        flag = "".join(f" [{f}]" for f in flags.get(e.name, []))
        table.append(f"{e.name:<20} {e.part:>4}  {r['forward']:<7}  {r['backward']:<8}  {points:>6}  "
                     f"{r['diagnosis'][:160]}{flag}")
        tests.append({"name": f"part {e.part}: {e.name}", "score": points, "max_score": e.points,
                      "status": "passed" if points else "failed", "visibility": "visible",
                      "output": r["output"] + "".join(f"\nflagged: {f}" for f in flags.get(e.name, []))})
    seconds = time.monotonic() - started
    return {"score": sum(t["score"] for t in tests), "execution_time": round(seconds), "tests": tests,
            "output": f"graded with seed {seed} in {seconds:.1f} s", "seed": seed, "flags": flags,
            "scorecard": "\n".join(table)}
