"""Grading an assignment, one exercise at a time, each in a process of its own with a time limit.

The methods an exercise names go on a subclass of the reference class and the rest of the model stays the
reference, so one mistake costs one exercise. On each case (cases.py), in float64: the forward against the
reference; the backward (.grad pre-filled, so "=" for "+=" shows) against the reference and central differences;
on a failure, the exercise's catalogue mutants on the same inputs, to name the mistake."""

from __future__ import annotations

import contextlib
import copy
import importlib
import inspect
import io
import json
import multiprocessing.connection
import sys
import time
import traceback
from pathlib import Path

import numpy

from minitransformer import backend, gradcheck

from . import train_copy
from .cases import cases
from .exercises import CATALOGUE, EXERCISES, TRAIN, build

PACKAGE = "transformer"      # DIR/transformer/: the student's copy of the core
MATCH = 1e-6                 # relative agreement with the reference (a pass) or with a mistake (a diagnosis)
FD_ENTRIES = 12              # entries per tensor checked by central differences (the reference check sees all)
LEARNS = 0.9                 # exact match on new strings that counts as learning the copy task


class Failed(Exception):
    """A one-line reason an exercise fails."""


def describe(err: BaseException, root: str = "") -> str:
    """'ValueError: ... (layers/linear.py line 47)': the error's first line and, given the student's folder (root),
    the last line of their code it passed through; a Failed is its reason, a stub's NotImplementedError work not
    written yet."""
    if isinstance(err, Failed):
        return str(err)
    if isinstance(err, NotImplementedError):
        return f"not written yet ({err})"
    text = (str(err).strip().splitlines() or [""])[0]
    where = [f for f in traceback.extract_tb(err.__traceback__) if root and f.filename.startswith(root)]
    place = f" ({Path(where[-1].filename).relative_to(root)} line {where[-1].lineno})" if where else ""
    return f"{type(err).__name__}: {text.replace(f'{root}/', '') if root else text}"[:300] + place


def failed(reason: str, forward: str = "FAIL") -> dict:         # an exercise that fails for one reason
    return {"forward": forward, "backward": "FAIL", "diagnosis": reason, "output": reason}


def load(exercise, package_dir: Path) -> dict:
    """{reference class: its subclass carrying the student's methods} for the exercise's targets."""
    subs = {}
    for file, reference, _, names in exercise.methods():
        path = package_dir / file
        # The student's file runs as a sibling of the reference module: its relative imports reach the reference.
        namespace = {"__name__": f"{PACKAGE}.{file[:-3].replace('/', '.')}", "__file__": str(path),
                     "__package__": reference.__module__.rpartition(".")[0]}
        try:
            exec(compile(path.read_text(), str(path), "exec"), namespace)  # noqa: S102 - running it is the point
        except (Exception, SystemExit) as err:  # noqa: BLE001 - whatever a student's file raises
            raise Failed(f"{file} does not load: {describe(err, str(package_dir))}") from None
        mine = namespace.get(reference.__name__)
        if not isinstance(mine, type) or any(n not in vars(mine) for n in names):
            raise Failed(f"{file}: class {reference.__name__} with the methods {', '.join(names)} is missing")
        own = {n: v for n, v in vars(mine).items() if n in names or callable(v) and not hasattr(reference, n)}
        subs[reference] = type(reference.__name__, (reference,), own)     # the methods, and helpers of their own
    return subs


def swap(module, subs: dict):
    """The module with every part whose class is in subs switched to its subclass (the loss inside a wrapper too)."""
    for m in module.modules():
        for part in (m, getattr(m, "loss_fn", None)):
            if type(part) in subs:
                part.__class__ = subs[type(part)]
    return module


def run(module, inputs, subs, trial, root="") -> dict:
    """One forward and one backward of a copy of module with subs swapped in, as trial fixes them (rng states,
    dout, pre-filled .grad). Returns the tensors {name: array}, or {"error": (stage, text)}."""
    m = swap(copy.deepcopy(module), subs)
    names = list(inspect.signature(type(module).forward).parameters)[1:]
    xs = [x.copy() if isinstance(x, numpy.ndarray) else x for x in inputs]

    def check(stage, labels, values, shapes):     # the inputs left as they came, each value an array of its shape
        for name, x, y in zip(names, xs, inputs):
            if isinstance(y, numpy.ndarray) and not numpy.array_equal(x, y):
                raise Failed(f"{stage} changed the input {name} in place (the caller still holds it)")
        for label, value, shape in zip(labels, values, shapes):
            if shape and (not isinstance(value, numpy.ndarray) or value.shape != shape):
                got = getattr(value, "shape", type(value).__name__)
                raise Failed(f"{stage} returned {got} for {label}, expected an array of shape {shape}")

    stage = "forward"
    try:
        backend.set_rng_state(trial["before"])
        out = m(*xs)
        check(stage, ["out"], [out], [trial["out_shape"]])
        tensors, stage = {"out": out.copy()}, "backward"
        backend.set_rng_state(trial.setdefault("after", backend.get_rng_state()))
        for name, p in m.named_parameters():
            p.grad[...] = trial["grad"][name]
        dout = trial["dout"].copy()
        grads = m.backward(dout)
        if not numpy.array_equal(dout, trial["dout"]):
            raise Failed("backward changed dout in place (write dout * 2, not dout *= 2: the caller still needs it)")
        floats = [x.shape if isinstance(x, numpy.ndarray) and x.dtype.kind == "f" else None for x in inputs]
        grads = [*(grads if isinstance(grads, (tuple, list)) else [grads]), *[None] * len(names)]
        check(stage, [f"d{name}" for name in names], grads, floats)
        unused = [name or "the module" for name, part in m.named_modules()
                  if part._cache is not None or getattr(getattr(part, "loss_fn", None), "cache", None) is not None]
        if unused:      # the next forward in training would raise: each forward is followed by one backward
            raise Failed(f"backward left the forward's cache of {unused[0]} unused (each backward takes it back "
                         "once)")
        tensors.update((f"d{name}", g.copy()) for name, g, shape in zip(names, grads, floats) if shape)
        tensors.update((f"{name}.grad", p.grad.copy()) for name, p in m.named_parameters())
        bad = [n for n, t in tensors.items() if not numpy.isfinite(t).all()]
        if bad:
            raise Failed(f"{stage} gave NaN or inf in {bad[0]}")
        return tensors
    except Exception as err:  # noqa: BLE001 - whatever a student's code raises costs this exercise
        # The message alone is compared with the mistakes', the student reads where it came from.
        return {"error": (stage, describe(err)), "shown": describe(err, root)}


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


def grade_exercise(exercise, package_dir: Path, seed: int, entries: int = FD_ENTRIES) -> dict:
    """{forward, backward, diagnosis, output} for one exercise; passes when every case agrees everywhere.
    entries: how many entries per tensor the central differences check (the reference sees every entry)."""
    subs = load(exercise, package_dir)     # a file that does not load raises Failed: the exercise fails
    forward = "ok" if exercise.targets[0][2] == "forward" else "given"
    backend.set_backend("numpy")           # the grader's checks read host arrays
    backend.set_default_dtype("float64")
    backend.manual_seed(seed)
    rng = numpy.random.default_rng([seed, 1])
    runs = []                      # (label, module, inputs, trial, the reference's tensors, the student's)
    for label, module, inputs in cases(importlib.import_module("minitransformer"), exercise.name, rng):
        trial = {"before": backend.get_rng_state(), "out_shape": module.forward(*inputs).shape}
        module.clear_caches()
        trial.update(dout=rng.standard_normal(trial["out_shape"]),
                     grad={n: rng.standard_normal(p.data.shape) for n, p in module.named_parameters()})
        runs.append((label, module, inputs, trial, run(module, inputs, {}, trial),
                     run(module, inputs, subs, trial, str(package_dir))))
    for label, module, inputs, trial, reference, mine in runs:
        stage, reason = mine.get("error", (None, None))
        reason, table = mine.get("shown", reason), ""
        worst = stage is None and (differs(mine, reference, only=("out",)) or differs(mine, reference))
        if worst:
            stage = "forward" if worst[0] == "out" else "backward"
            reason = "{}{}: yours {:.6g}, expected {:.6g} (relative error {:.1e})".format(*worst)
        if stage is None:
            backend.set_rng_state(trial["before"])
            report = gradcheck.check(swap(copy.deepcopy(module), subs), *inputs, max_entries=entries, seed=seed)
            if not report.ok:
                stage, table = "backward", report.table()
                reason = "central differences disagree: " + "; ".join(r.name + r.worst_entry()
                                                                        for r in report.failures())
        if stage is None:
            continue
        # A mistake is named when it gives what the student's code gives (tensors or error) on every case.
        named = next((m.says for m in CATALOGUE if m.exercise == exercise.name and m.visible and
                      all(same(r[5], run(r[1], r[2], build(m), r[3])) for r in runs)), None)
        output = [f"case '{label}': {stage} fails: {reason}", named and f"this looks like: {named}", table]
        return {"forward": "FAIL" if stage == "forward" else forward, "backward": "FAIL",
                "diagnosis": named or reason, "output": "\n".join(filter(None, output))}
    return {"forward": forward, "backward": "ok", "diagnosis": "",
            "output": "every case agrees with the reference and with central differences"}


def grade_training(package_dir: Path, seed: int) -> dict:
    """Part 3's finale: the copy task, trained with the student's whole package."""
    sys.path.insert(0, str(package_dir.parent))
    figures = train_copy.train(importlib.import_module(PACKAGE), seed=seed, log=lambda line: None)
    learned = figures["exact_match"] >= LEARNS
    text = (f"{'learned' if learned else 'did not learn'}: exact match {figures['exact_match']:.0%} on 100 new "
            f"strings (needs {LEARNS:.0%}), loss {figures['first_loss']:.2f} -> {figures['final_loss']:.3f}")
    return {"forward": "-", "backward": "ok", "diagnosis": "", "output": text} if learned else failed(text, "-")


def _child(conn, name: str, package_dir: str, seed: int) -> None:
    """One exercise in a process of its own: its printouts are caught, its result sent back."""
    from minitransformer.fast.threads import set_blas_threads

    set_blas_threads(1)            # two exercises at a time on two cores, each with one BLAS thread
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        try:
            result = grade_training(Path(package_dir), seed) if name == TRAIN.name else \
                grade_exercise(EXERCISES[name], Path(package_dir), seed)
        except BaseException as err:  # noqa: BLE001 - whatever a student's code raises costs this exercise only
            result = failed(describe(err, package_dir), "-" if name == TRAIN.name else "FAIL")
    lines = printed.getvalue().count("\n")
    if lines:
        result["output"] += f"\n(your code printed {lines} line{'s' * (lines != 1)}; printing costs nothing, but " \
                            "slows a run)"
    conn.send(result)


def isolated(names: list, package_dir: Path, seed: int, timeout: float, workers: int) -> dict:
    """{name: result}, each exercise in a process of its own, `workers` at a time, killed after `timeout` seconds."""
    # Forking is quick (the reference is imported once) and safe on Linux; elsewhere each child starts afresh.
    ctx = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    pending, running, results = list(names), {}, {}
    while pending or running:
        while pending and len(running) < workers:
            name = pending.pop(0)
            receive, send = ctx.Pipe(duplex=False)
            process = ctx.Process(target=_child, args=(send, name, str(package_dir), seed), daemon=True)
            process.start()
            send.close()
            running[name] = (process, receive, time.monotonic() + timeout)
        multiprocessing.connection.wait([receive for _, receive, _ in running.values()], timeout=0.2)
        for name, (process, receive, deadline) in list(running.items()):
            if receive.poll():                 # a result, or the end of a process that died without one
                with contextlib.suppress(EOFError, OSError):
                    results[name] = receive.recv()
            elif time.monotonic() > deadline:
                process.kill()
                results[name] = failed(f"stopped after {timeout:g} s: an infinite loop, or far too slow")
            else:
                continue
            process.join(5)
            if name not in results:
                results[name] = failed(f"the exercise's process ended without a result (exit code {process.exitcode})")
            del running[name]
    return results


def grade(directory, seed: int = 0, timeout: float = 30.0, workers: int = 2) -> dict:
    """Grade the assignment in `directory` (as `classroom make` wrote it): Gradescope's results.json (score,
    execution_time, output, and tests, each with name, score, max_score, output), plus "scorecard", a table."""
    directory = Path(directory)
    manifest = directory / "assignment.json"
    if not (directory / PACKAGE).is_dir() or not manifest.is_file():
        raise FileNotFoundError(f"classroom grade: {directory} holds no assignment (expected {PACKAGE}/ and "
                                f"assignment.json, as `minitransformer classroom make` writes them)")
    try:
        exercises = [EXERCISES[n] for n in json.loads(manifest.read_text())["exercises"]]
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"classroom grade: {manifest} must list known exercises under 'exercises', "
                         f"got {err}") from None
    exercises += [TRAIN] if any(e.part == 3 for e in exercises) else []
    started = time.monotonic()
    results = isolated([e.name for e in exercises], (directory / PACKAGE).resolve(), seed, timeout, workers)
    head = f"{'exercise':<20} {'part':>4}  {'forward':<7}  {'backward':<8}  {'points':>6}  diagnosis"
    table, tests = [head, "-" * len(head)], []
    for e in exercises:
        r = results[e.name]
        points = e.points if r["backward"] == "ok" and r["forward"] != "FAIL" else 0
        table.append(f"{e.name:<20} {e.part:>4}  {r['forward']:<7}  {r['backward']:<8}  {points:>6}  "
                     f"{r['diagnosis'][:160]}")
        tests.append({"name": f"part {e.part}: {e.name}", "score": points, "max_score": e.points,
                      "output": r["output"]})
    seconds = time.monotonic() - started
    return {"score": sum(t["score"] for t in tests), "execution_time": round(seconds), "tests": tests,
            "output": f"graded with seed {seed} in {seconds:.1f} s", "scorecard": "\n".join(table)}
