"""A study too long for one sitting: each finished run stored as a file of its own, skipped when run again.

A study lists its runs as (key, job) pairs. ``run_pending`` trains those whose DIR/finished/<key>.json is
missing, one after another, and writes each result there as soon as it is done (a temporary file renamed, so an
interrupted write leaves no half file); a second invocation with the same list picks up where the first stopped.
``collect`` reads back what is finished. The study's results.json is then computed from these files alone, so
it can be rebuilt at any time, however far the runs have got.

Several invocations may share one study (one per core): each claims a run before it starts it (DIR/claimed/<key>,
created only if absent, holding the process id) and passes over runs another live process has claimed; a claim
left by a process that died is taken over.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

FINISHED, CLAIMED = "finished", "claimed"
_KEY = re.compile(r"^[A-Za-z0-9_.=+-]+$")


def key_path(folder: Path, key: str) -> Path:
    if not _KEY.match(key):
        raise ValueError(f"run key {key!r}: expected letters, digits and _.=+- only")
    return Path(folder) / FINISHED / f"{key}.json"


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (POSIX; elsewhere a claim is taken to be live: delete DIR/claimed/)."""
    if os.name != "posix":
        return True
    try:
        os.kill(pid, 0)               # signal 0: no signal sent, only the check that the process exists
    except ProcessLookupError:
        return False
    except PermissionError:           # a live process of another user
        pass
    return True


def claim(folder: Path, key: str) -> Path | None:
    """Claim run ``key`` for this process: the claim file, or None while another live process holds it."""
    path = Path(folder) / CLAIMED / key_path(folder, key).name
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(2):                # a second try after clearing a dead process's claim
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            holder = path.read_text(encoding="utf-8").strip()
            if holder.isdigit() and int(holder) != os.getpid() and _alive(int(holder)):
                return None
            path.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(str(os.getpid()))
        return path
    return None


def run_pending(jobs: list, fn, folder: Path, log=print, limit: int | None = None, after=None) -> int:
    """Run fn(job) for every (key, job) of ``jobs`` whose result file is missing, in order, writing each result
    (a dict, JSON-serialisable) as it finishes, then calling after() if given; at most ``limit`` runs.
    -> how many ran."""
    (Path(folder) / FINISHED).mkdir(parents=True, exist_ok=True)
    done = 0
    for key, job in jobs:
        path = key_path(folder, key)
        if path.exists():
            continue
        if limit is not None and done >= limit:
            break
        claimed = claim(folder, key)
        if claimed is None:
            log(f"{time.strftime('%H:%M:%S')} skip {key}: another process runs it")
            continue
        if path.exists():                         # finished by another process meanwhile
            claimed.unlink(missing_ok=True)
            continue
        started = time.time()
        log(f"{time.strftime('%H:%M:%S')} start {key}")
        result = fn(job)
        result = {"key": key, **result, "wall_seconds": round(time.time() - started, 1),
                  "finished": time.strftime("%Y-%m-%d %H:%M:%S")}
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)
        claimed.unlink(missing_ok=True)
        log(f"{time.strftime('%H:%M:%S')} done {key} in {result['wall_seconds']:.0f} s")
        done += 1
        if after is not None:
            after()
    return done


def collect(folder: Path, keys: list) -> dict:
    """{key: result} of the finished runs among ``keys``."""
    found = {}
    for key in keys:
        path = key_path(folder, key)
        if path.exists():
            found[key] = json.loads(path.read_text(encoding="utf-8"))
    return found


def wall_seconds(folder: Path) -> float:
    """The wall time of every finished run in the folder, added up: what the study has cost so far."""
    return round(sum(json.loads(path.read_text(encoding="utf-8")).get("wall_seconds", 0.0)
                     for path in (Path(folder) / FINISHED).glob("*.json")), 1)
