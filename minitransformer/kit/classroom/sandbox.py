"""The grader's side of the student's process: started in a session of its own from a fresh interpreter (harness.py),
as a user of its own when the grader is root, killed whole at the time limit, and read back as data alone (JSON and
.npy files of known names and sizes, opened without following links, never unpickled)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import numpy

LIMITS = {"memory": 3 << 30, "output": 64 << 20, "processes": 32, "shown": 64 << 10}   # bytes, bytes, tasks, bytes
SHARED = ("/tmp", "/var/tmp", "/dev/shm")          # where any user may write: cleared of the student user's files


def user() -> int | None:
    """A user id no one has and nothing runs as (when the grader is root on Linux), else None: the student's
    processes are then exactly that user's, and none of them can signal the grader or read its folders."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        return None
    import pwd

    while True:
        uid = 100_000 + secrets.randbelow(1 << 30)
        try:
            pwd.getpwuid(uid)
        except KeyError:
            if not processes(uid):
                return uid


def lock(path) -> None:
    """As root, the folder closed to other users: the student's user cannot read the reference or the teacher's
    files. A folder others could not enter already is left alone."""
    mode = os.stat(path).st_mode
    if os.geteuid() == 0 and mode & 0o077:
        os.chmod(path, mode & ~0o077)


def start(job: Path, spec: dict, uid) -> tuple:
    """Write job.json, hand the folder to the student's user, start the harness; returns (process, printed file)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    readable = [p for p in stdlib.iterdir() if p.name not in ("site-packages", "dist-packages")]
    spec = {**spec, "uid": uid, "limits": LIMITS, "path": [str(stdlib), str(stdlib / "lib-dynload"),
                                                           str(Path(numpy.__file__).parent.parent)],
            "readable": [str(p) for p in [*readable, Path(numpy.__file__).parent]]}
    (job / "job.json").write_text(json.dumps(spec))
    for folder in ("work", "out"):
        (job / folder).mkdir()
    if uid is not None:
        os.chmod(job.parent, 0o711)                     # the way in, not the list of what is there
        for path in [job, *job.rglob("*")]:
            os.lchown(path, uid, uid)
    printed = open(job.parent / f"{job.name}.printed", "w+b")  # noqa: SIM115 - closed by finish()
    adopt_orphans()
    if not STARTED:
        BEFORE.clear()
        BEFORE.update(p for p, parent in _parents().items() if parent == os.getpid())
    env = {"PATH": "/usr/bin:/bin", "HOME": str(job / "work"), "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1", "LC_ALL": "C.UTF-8"}
    process = subprocess.Popen([sys.executable, "-I", "-S", "-u", str(job / "harness.py"), str(job)], cwd=job, env=env,
                               stdin=subprocess.DEVNULL, stdout=printed, stderr=printed, start_new_session=True)
    STARTED.add(process.pid)
    return process, printed


def adopt_orphans() -> None:
    """On Linux, make the grader the child subreaper: a process the student's code starts and leaves behind (in a
    session of its own, its parent gone) comes to the grader instead of to init, so ``stop`` still finds it when no
    user of its own marks the student's processes."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)         # PR_SET_CHILD_SUBREAPER


def _parents() -> dict:
    """{pid: parent pid} of the live processes (a zombie has ended)."""
    parents = {}
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            state, parent = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
            if state != "Z":
                parents[int(entry.name)] = int(parent)
    return parents


# The student processes started and not yet stopped, and what was the grader's child before any of them: an
# adopted orphan is a child of the grader that is neither.
STARTED, BEFORE = set(), set()


def adopted() -> list:
    """The grader's children that it did not start: what the student's processes left behind."""
    parents = _parents()
    return [p for p, parent in parents.items() if parent == os.getpid() and p not in STARTED | BEFORE]


def descendants(pid: int) -> list:
    """The live processes whose chain of parents reaches ``pid``."""
    parents, found, frontier = _parents(), set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier and p not in found}
        found |= frontier
    return sorted(found)


def processes(uid) -> list:
    """The ids of the live processes of user uid."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            status = dict(line.split(":", 1) for line in (entry / "status").read_text().splitlines() if ":" in line)
            if int(status["Uid"].split()[0]) == uid and not status["State"].strip().startswith("Z"):
                found.append(int(entry.name))
    return found


def stop(process, uid) -> None:
    """The student's processes ended, all of them: the session, and (as root) every process of its user, stopped
    first so that none forks a new one; then that user's files in the shared folders removed."""
    left = descendants(process.pid)                     # before the harness dies and they pass to the grader
    with contextlib.suppress(OSError):
        os.killpg(process.pid, signal.SIGKILL)
    for _ in range(100):
        if uid is not None:
            alive = processes(uid)
        else:                                           # without a user of its own: the session's, and the adopted
            alive = sorted(({*left, *descendants(process.pid)} & set(_parents()))
                           | {q for p in adopted() for q in [p, *descendants(p)]})
        if not alive:
            break
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in alive:
                with contextlib.suppress(OSError):
                    os.kill(pid, sig)
        time.sleep(0.01)
        for pid in alive:                               # those the grader adopted are its to reap
            with contextlib.suppress(OSError):
                os.waitpid(pid, os.WNOHANG)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(5)
    STARTED.discard(process.pid)
    for shared in [Path(p) for p in SHARED if uid is not None and Path(p).is_dir()]:
        for entry in shared.iterdir():
            with contextlib.suppress(OSError):
                if entry.lstat().st_uid == uid:
                    shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()


def read(folder: Path, name: str, limit: int) -> bytes | None:
    """The bytes of folder/name if it is a plain file (no link followed, neither for it nor its folder) of at most
    limit bytes, else None."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        where = os.open(folder, flags | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        fd = os.open(name, flags, dir_fd=where)
    except OSError:
        return None
    finally:
        os.close(where)
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(fd)
        return file.read(limit + 1) if stat.S_ISREG(info.st_mode) and info.st_size <= limit else None


def result(folder: Path) -> dict:
    """out/result.json as plain JSON (at most 1 MB), or {} when it is missing, too big or not JSON."""
    data = read(folder, "result.json", 1 << 20)
    with contextlib.suppress(ValueError, RecursionError):
        value = json.loads(data) if data else {}
        return value if isinstance(value, dict) else {}
    return {}


def array(folder: Path, name: str, shape: tuple):
    """The array folder/name.npy as float64 if it holds numbers of that shape (no pickle), else None."""
    data = read(folder, f"{name}.npy", 8 * int(numpy.prod(shape)) + 4096)
    try:
        value = numpy.load(io.BytesIO(data), allow_pickle=False) if data else None
    except (ValueError, OSError, EOFError):
        return None
    ok = isinstance(value, numpy.ndarray) and value.shape == tuple(shape) and value.dtype.kind in "fiub"
    return value.astype(numpy.float64) if ok else None


def printed(file) -> str:
    """A note on what the student's code printed (lines counted in the first LIMITS['shown'] bytes), or ''."""
    file.seek(0)
    lines, size = file.read(LIMITS["shown"]).count(b"\n"), os.fstat(file.fileno()).st_size
    if size >= LIMITS["output"]:
        return f"your code printed more than the {LIMITS['output'] >> 20} MB allowed: writing beyond it fails"
    return f"your code printed {lines} line{'s' * (lines != 1)}; printing costs nothing, but slows a run" * bool(size)
