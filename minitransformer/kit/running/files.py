"""Files from elsewhere, and files written so that neither a crash nor a planted link can do harm.

Students download checkpoints and run folders from classmates and course pages, so every file the kit reads
may have been crafted, and every folder it writes into may hold traps. The rules, in one place:

Reading (``open_regular``). The path is opened without blocking and refused unless it is a regular file:
a FIFO blocks its reader until someone writes (forever), a device such as /dev/zero never ends. The check is
made on the opened descriptor (``fstat``), so the file cannot be swapped between the check and the read.

Writing (``atomic_write``). Temporary file in the same folder -> write -> flush -> fsync -> ``os.replace``
-> fsync the folder. The destination is always the old file or the whole new one: a run killed mid-write,
a full disk or a file-size limit leave the previous copy whole. A destination that is a symbolic link is
refused with a message: a downloaded run folder whose metrics.json points at ~/.bashrc must not make the
next run write there. (Were the check raced, ``os.replace`` would still replace the link itself, never
its target.)

JSON (``parse_json``). Nesting deeper than ``MAX_JSON_DEPTH`` is refused: Python's parser and every
recursive walk over the result would otherwise end in a RecursionError thousands of lines long.

One run per folder (``lock_folder``). Two runs writing one folder would mix their checkpoints and prune each
other's. A run holds an exclusive lock on its folder (``flock`` on the folder itself, so no lock file is left
behind); the operating system releases it when the process ends, however it ends, so a killed run's folder is
free at once. Temporary files left by a killed writer are deleted only when their name is exactly the pattern
``atomic_write`` makes and the process it names no longer exists.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
import sys
import threading

from minitransformer.limits import MAX_JSON_DEPTH

TEMP_PREFIX = ".minitransformer-"  # every temporary file of an atomic write: .minitransformer-<pid>-<12 hex>.tmp
TEMP_SUFFIX = ".tmp"
_TEMP_NAME = re.compile(r"^\.(?:minitransformer|checkpoint)-(\d{1,10})-[0-9a-f]{12}\.tmp$")   # and earlier versions'


# ============================================================================ reading

def open_regular(path, what: str):
    """``path`` opened for binary reading, if it is a regular file (a link to one is fine); else ValueError.

    what: how messages call the file ("checkpoint", "Multi30k file", ...). FileNotFoundError and
    PermissionError keep their types; every error names the path.
    """
    path = os.fspath(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)         # O_NONBLOCK: opening a FIFO returns at once instead of waiting
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {path} does not exist") from None
    except IsADirectoryError:
        raise IsADirectoryError(f"{what} {path} is a folder, not a file") from None
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


# ============================================================================ writing

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


def fsync_directory(directory: str) -> None:
    """Make a rename inside ``directory`` durable. Not possible (nor needed) on Windows."""
    if os.name == "nt":  # pragma: no cover - Windows cannot open a directory
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def create_temp(directory: str):
    """A new, empty temporary file in ``directory``: (fd, path). Created with mode 0o666 minus the umask
    (``tempfile.mkstemp`` would make it 0o600, and the renamed file would keep that). O_EXCL: never an
    existing file, and never through a link planted under the same name."""
    for _ in range(100):
        tmp = os.path.join(directory, f"{TEMP_PREFIX}{os.getpid()}-{secrets.token_hex(6)}{TEMP_SUFFIX}")
        try:
            return os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"could not create a temporary file in {directory}")


def remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):       # another user's process; a pid no system has: keep the file
        return True
    return True


def remove_stale_temps(directory) -> None:
    """Delete the temporary files of writers that died mid-write: regular files named exactly as
    ``create_temp`` names them, whose process no longer exists. Anything else is left alone."""
    if os.name == "nt":  # pragma: no cover - no cheap check whether a process lives: keep the files
        return
    for name in os.listdir(directory):
        match = _TEMP_NAME.match(name)
        if match and int(match.group(1)) != os.getpid() and not _process_alive(int(match.group(1))):
            path = os.path.join(directory, name)
            if stat.S_ISREG(os.lstat(path).st_mode):
                remove_quietly(path)


_LOCKS: dict = {}                 # (device, inode) of a folder -> [open descriptor, holders in this process]
_LOCKS_GUARD = threading.Lock()


def lock_folder(directory, what: str = "run folder"):
    """Take the exclusive lock of ``directory`` for this process (see the module docstring) -> a function that
    releases it. ValueError naming the folder if another process holds it. Within one process the lock is
    shared: a second ``Trainer`` on the folder in the same program (resuming a run it just stopped) is the same
    owner. Where the system has no ``flock`` (Windows), nothing is locked."""
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
    released = []

    def release() -> None:
        with _LOCKS_GUARD:
            if released or key not in _LOCKS:
                return
            released.append(True)
            _LOCKS[key][1] -= 1
            if _LOCKS[key][1] == 0:
                os.close(_LOCKS.pop(key)[0])          # closing the descriptor releases the flock
    return release


def atomic_write(path, write, what: str = "file") -> None:
    """Make ``path`` the bytes ``write(f)`` puts into an open binary file, so that ``path`` is always either
    the old file or the whole new one (see the module docstring). If anything fails (or the process dies)
    before the rename, ``path`` is untouched and the temp file is removed (or, after a SIGKILL, left
    behind as ``.minitransformer-<pid>-*.tmp``, which nothing reads and ``remove_stale_temps`` deletes)."""
    path = os.fspath(path)
    check_writable(path, what)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"cannot write {path}: the folder {directory} does not exist")
    fd, tmp = create_temp(directory)
    try:
        with os.fdopen(fd, "w+b") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        remove_quietly(tmp)
        raise
    fsync_directory(directory)


def write_json(path, obj, what: str = "file") -> None:
    """``obj`` as indented JSON (UTF-8), written atomically."""
    data = json.dumps(obj, indent=2).encode("utf-8")
    atomic_write(path, lambda f: f.write(data), what)


# ============================================================================ JSON

def json_depth(obj) -> int:
    """How deeply lists and dicts nest in ``obj`` (a scalar: 0), without recursion."""
    deepest, stack = 0, [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children)
    return deepest


def parse_json(text, where: str, max_depth: int = MAX_JSON_DEPTH, **options):
    """json.loads (with ``options``), refusing (ValueError naming ``where``) bad JSON and nesting deeper than
    ``max_depth``."""
    try:
        obj = json.loads(text, **options)
    except RecursionError:
        raise ValueError(f"{where}: JSON nested too deeply (more than {max_depth} levels)") from None
    except (ValueError, TypeError) as err:            # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"{where}: not valid JSON ({err})") from None
    if json_depth(obj) > max_depth:
        raise ValueError(f"{where}: JSON nested too deeply (more than {max_depth} levels)")
    return obj
