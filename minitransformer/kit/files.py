"""Files from elsewhere, and files written so that neither a crash nor a planted link can do harm.

Students swap checkpoints and run folders, so any file read may be crafted and any folder written may hold traps: a
FIFO that blocks forever, a metrics.json linked to ~/.bashrc, JSON nested until the parser overflows its stack.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import stat
import sys
import threading

from minitransformer.kit.limits import MAX_JSON_DEPTH

TEMP_PREFIX = ".minitransformer-"  # every temporary file of an atomic write: .minitransformer-<pid>-<12 hex>.tmp
TEMP_SUFFIX = ".tmp"
_TEMP_NAME = re.compile(r"^\.(?:minitransformer|checkpoint)-(\d{1,10})-[0-9a-f]{12}\.tmp$")   # and earlier versions'


def open_regular(path, what: str):
    """``path`` opened for binary reading if it is a regular file (or a link to one), else an error naming
    ``what`` ("checkpoint", ...) and the path. The type is checked on the opened descriptor, opened without
    blocking: a FIFO would wait forever for a writer, /dev/zero never ends."""
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {path} does not exist") from None
    except PermissionError:
        raise PermissionError(f"{what} {path}: permission denied") from None
    except OSError as err:
        raise ValueError(f"{what} {path} cannot be opened ({err.strerror or err})") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(f"{what} {path} is a folder, not a file")
        if not stat.S_ISREG(mode):
            raise ValueError(f"{what} {path} is not a regular file (a FIFO, device or socket): refused")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def check_writable(path, what: str = "file") -> None:
    """Refuse to write ``path`` if it is a symbolic link or exists as something other than a regular file."""
    path = os.fspath(path)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISLNK(mode):
        raise ValueError(f"{path} is a symbolic link: refusing to write the {what} through it (it may point "
                         f"anywhere); remove the link or choose another folder")
    if not stat.S_ISREG(mode):
        raise ValueError(f"{path} exists and is not a regular file: refusing to write the {what} there")


def remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def atomic_write(path, write, what: str = "file") -> None:
    """Make ``path`` the bytes ``write(f)`` puts into an open binary file: always the old file or the whole new
    one, whatever kills the write (temp file in the same folder, fsync, ``os.replace``, fsync the folder). The temp
    file: mode 0o666 less the umask (``mkstemp``'s 0o600 would stay with the renamed file), O_EXCL so that it is
    never an existing file or a planted link; removed on failure, by ``remove_stale_temps`` after a SIGKILL."""
    path = os.fspath(path)
    check_writable(path, what)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"cannot write {path}: the folder {directory} does not exist")
    tmp = os.path.join(directory, f"{TEMP_PREFIX}{os.getpid()}-{secrets.token_hex(6)}{TEMP_SUFFIX}")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, "w+b") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        remove_quietly(tmp)
        raise
    if os.name != "nt":                 # make the rename durable (Windows can neither open a folder nor needs to)
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_json(path, obj, what: str = "file") -> None:
    """``obj`` as indented JSON (UTF-8), written atomically."""
    data = json.dumps(obj, indent=2).encode("utf-8")
    atomic_write(path, lambda f: f.write(data), what)


def remove_stale_temps(directory) -> None:
    """Delete the regular files named exactly as ``atomic_write`` names its temp files whose process is gone."""
    if os.name == "nt":  # pragma: no cover - no cheap check whether a process lives: keep the files
        return
    for name in os.listdir(directory):
        match = _TEMP_NAME.match(name)
        if not match or int(match.group(1)) == os.getpid():
            continue
        try:
            os.kill(int(match.group(1)), 0)
        except ProcessLookupError:                 # its writer is gone
            path = os.path.join(directory, name)
            if stat.S_ISREG(os.lstat(path).st_mode):
                remove_quietly(path)
        except (PermissionError, OverflowError):   # another user's process; a pid no system has: kept
            pass


_LOCKS: dict = {}                 # (device, inode) of a folder -> [open descriptor, holders in this process]
_LOCKS_GUARD = threading.Lock()


def lock_folder(directory, what: str = "run folder"):
    """Take ``directory``'s exclusive ``flock``, which the OS releases however the process ends -> a function
    that releases it (call it once); ValueError naming the folder if another process holds it. Shared within one
    process (a second ``Trainer`` resuming the run it just stopped is the same owner). Windows: no lock."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        return lambda: None
    directory = os.fspath(directory)
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    key = (os.fstat(fd).st_dev, os.fstat(fd).st_ino)
    with _LOCKS_GUARD:
        if key in _LOCKS:
            os.close(fd)
            _LOCKS[key][1] += 1
        else:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise ValueError(f"{what} {directory} is in use by another run (another process holds its lock): "
                                 f"wait for that run to end, or choose another folder") from None
            except OSError as err:                 # a file system without locks (some network ones): go on
                print(f"{what} {directory} cannot be locked ({err.strerror or err}): nothing keeps a second run "
                      f"out of it", file=sys.stderr)
            _LOCKS[key] = [fd, 1]

    def release() -> None:
        with _LOCKS_GUARD:
            _LOCKS[key][1] -= 1
            if _LOCKS[key][1] == 0:
                os.close(_LOCKS.pop(key)[0])          # closing the descriptor releases the flock
    return release


def parse_json(text, where: str):
    """json.loads, refusing bad JSON and nesting deeper than ``MAX_JSON_DEPTH`` (ValueError naming ``where``)."""
    too_deep = f"{where}: JSON nested too deeply (more than {MAX_JSON_DEPTH} levels)"
    try:
        obj = json.loads(text)
    except RecursionError:
        raise ValueError(too_deep) from None
    except (ValueError, TypeError) as err:            # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"{where}: not valid JSON ({err})") from None
    level, nodes = 0, [obj]
    while nodes := [n for n in nodes if isinstance(n, (dict, list))]:       # one level at a time: no recursion
        level += 1
        if level > MAX_JSON_DEPTH:
            raise ValueError(too_deep)
        nodes = [c for n in nodes for c in (n.values() if isinstance(n, dict) else n)]
    return obj
