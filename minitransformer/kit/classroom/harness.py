"""The student's side of grading: ``python -I -S harness.py JOB`` in a fresh interpreter that never imports
minitransformer. JOB is a folder the grader filled with all this process may see: job.json, cases.py, and
``transformer/``, the student's own copy as check.py sees it: the assignment's handout (every exercise not yet
revealed a stub, the reference bodies of revealed parts and of the forwards handed out) with the student's files
laid over it, helpers of their own included. No reference body of an exercise not yet revealed is in this process
or in a file it may open. Before any student code runs, it sets the limits, becomes a user of its own (when started
as root), and refuses ``minitransformer``; then it imports the student's package, runs the exercise's cases on it
as check.py does and writes what they gave as data alone: out/result.json and a .npy per tensor. It never decides a
grade: the grader reads those files and judges them against a reference it computed where the student's code never
ran."""

import importlib
import json
import os
import resource
import struct
import sys
from pathlib import Path

# Loaded before the user switch: afterwards the interpreter's own folders may be closed to this user.
PRELOAD = ("__future__", "numpy", "numpy.random", "numpy.linalg", "numpy.lib.format", "ctypes", "signal", "math",
           "json", "copy", "functools", "itertools", "collections", "dataclasses", "typing", "types", "re",
           "operator", "contextlib", "warnings", "threading", "inspect", "traceback", "pathlib", "string",
           "textwrap", "numbers", "enum", "abc", "random", "statistics")


class Refuse:
    """First on sys.meta_path: importing minitransformer fails, whichever way (import, importlib, find_spec, runpy)."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "minitransformer":
            raise ImportError("the reference (minitransformer) is not available while grading: your code runs with "
                              "your own transformer/ package, as in check.py")


def landlock(libc, job: Path, readable: list) -> bool:
    """Linux's Landlock, where the kernel has it: from here on this process and its children open files only in
    readable (to read) and in job/work and job/out (to write), signal no process outside, connect nowhere."""
    abi = libc.syscall(444, None, 0, 1)                     # landlock_create_ruleset(..., VERSION)
    if abi < 1:
        return False
    every = (1 << 13) - 1 | (abi >= 2) << 13 | (abi >= 3) << 14 | (abi >= 5) << 15
    attr = struct.pack("QQQ", every, 3 if abi >= 4 else 0, 3 if abi >= 6 else 0)[:8 * (1 + (abi >= 4) + (abi >= 6))]
    ruleset, read, on_files = libc.syscall(444, attr, len(attr), 0), 1 << 2 | 1 << 3, 1 | 1 << 1 | 1 << 2 | 3 << 14
    for path, rights in [*((p, read) for p in readable), (job / "work", every), (job / "out", every)]:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:                                     # gone, or closed to the grader: nothing to allow
            continue
        libc.syscall(445, ruleset, 1, struct.pack("=Qi", rights & (every if path.is_dir() else on_files), fd), 0)
        os.close(fd)
    libc.prctl(38, 1, 0, 0, 0)                              # PR_SET_NO_NEW_PRIVS, which Landlock requires
    return libc.syscall(446, ruleset, 0) == 0               # landlock_restrict_self


def owned(path: Path) -> bool:
    try:
        return path.stat().st_uid == os.getuid()
    except OSError:
        return False


def confine(limits: dict, uid, job: Path, readable: list) -> None:
    """Limits of memory, file size (the output included) and processes; Landlock; then a user of its own (as root):
    the student's code starts with no way to the reference, the grader or other students."""
    import ctypes
    import signal

    resource.setrlimit(resource.RLIMIT_AS, (limits["memory"],) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["output"],) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # The count is per user: a user of its own starts from none, the grader's user from the tasks it runs already.
    mine = sum(1 for p in Path("/proc").glob("[0-9]*/task/*") if uid is None and owned(p))
    resource.setrlimit(resource.RLIMIT_NPROC, (limits["processes"] + mine,) * 2)
    libc = ctypes.CDLL(None)
    landlock(libc, job, [job, *readable])                 # while the paths can still be opened
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)      # PR_SET_PDEATHSIG: when the grader goes, this process goes
    libc.prctl(38, 1, 0, 0, 0)                        # PR_SET_NO_NEW_PRIVS: no setuid program restores privileges


def main(job: Path) -> None:
    spec = json.loads((job / "job.json").read_text())
    sys.path[:] = [str(job), *spec["path"]]           # this folder, the standard library, numpy's: no reference
    sys.meta_path.insert(0, Refuse())
    sys.dont_write_bytecode = True
    for name in PRELOAD:
        importlib.import_module(name)
    os.chdir(job / "work")
    confine(spec["limits"], spec["uid"], job, [Path(p) for p in spec["readable"]])
    import numpy

    out, result = job / "out", {"cases": []}

    def save(name: str, array) -> None:
        numpy.save(out / f"{name}.npy", numpy.asarray(array), allow_pickle=False)

    import cases

    root = str(job / "transformer")
    try:
        try:
            import transformer
        except BaseException as err:  # noqa: BLE001 - whatever the student's files raise as they load
            raise cases.Failed(f"{cases.UNLOADED}: {cases.describe(err, root)}") from None
        transformer.set_default_dtype("float64")
        if spec["exercise"] == "train":
            import train_copy

            figures = train_copy.train(transformer, seed=spec["seed"], log=lambda line: None)
            for name, array in figures.pop("model").state_dict().items():
                save(name, array)
            result["figures"] = figures
        else:
            k = 0
            for run in spec["runs"]:
                for label, module, inputs, trial in cases.prepare(transformer, spec["exercise"], **run):
                    got = cases.run(transformer.backend, module, inputs, {}, trial, root, [0, 0])
                    if "error" not in got:
                        for name, array in got.items():
                            save(f"{k}-{name}", array)
                        got = {"tensors": sorted(got)}
                    result["cases"].append(got)
                    k += 1
    except BaseException as err:  # noqa: BLE001 - whatever the student's code raises ends this exercise
        result["failed"] = cases.describe(err, root)
    (out / "result.json").write_text(json.dumps(result))
    os._exit(0)                     # no finalizer of the student's runs after the result


if __name__ == "__main__":
    main(Path(sys.argv[1]))
