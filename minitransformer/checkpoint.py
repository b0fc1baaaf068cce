"""Training checkpoints: one ``.npz`` file holding everything a run needs to continue, and no pickle.

What one checkpoint holds (the names inside the archive):

    param/<name>        the model's weights, one array per ``state_dict`` entry
    optim/<i>           the optimiser's arrays (Adam's m and v ...); its scalars live in the JSON below
    sched/<i>           the learning-rate schedule's arrays, if it has any
    meta                UTF-8 JSON as a uint8 array: format version, step, epoch and batch position,
                        the random generators' states, the model config, the tokenisers' vocabularies,
                        and the optimiser/schedule skeletons (their scalars, and which array goes where)
    format_version      int64, FORMAT_VERSION

and, in the zip archive's comment at the very end of the file, ``minitransformer-sha256:<hex>``: the
sha256 of every byte before it (with the comment-length field read as 0).

Why not pickle: ``np.load(allow_pickle=True)`` on a file from the internet runs whatever code the file
says. Here everything is a plain array, loading uses ``allow_pickle=False``, and a file that needs
pickle is refused.

Why atomic writes: a run killed while saving (a laptop lid closing) must leave the previous checkpoint
whole. The file is written under a temporary name in the same folder, flushed and fsync'ed, then
``os.replace``'d over the old one - a rename is atomic on POSIX and Windows - and the folder is fsync'ed
so that the rename itself survives a power cut.

Why a checksum of the whole file: the zip format's CRCs miss some damage (a flipped byte in a header field
that ``np.load`` does not read, an array rewritten with other values and a fresh CRC), and a truncated
file must not pass for a shorter one. The sha256 covers every byte, so any change, anywhere, is refused
with a message instead of training on garbage.

Keeping the last K: ``CheckpointManager`` writes ``checkpoint-<step>.npz`` and a copy of it as
``checkpoint.npz`` (the latest), deleting the oldest beyond ``keep``, so that ``average_checkpoints`` can
average the weights of the last N as the paper does (§6.1: "averaging the last 5 checkpoints").
``checkpoint.npz`` is a file of its own, not a hard link: ``cp backup/checkpoint.npz run/checkpoint.npz``
writes into the existing file, and through a link it would silently rewrite ``checkpoint-<step>.npz`` too.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import struct
import zipfile
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy

FORMAT_NAME = "minitransformer-checkpoint"
FORMAT_VERSION = 1
LATEST = "checkpoint.npz"
_STEP_FILE = re.compile(r"^checkpoint-(\d+)\.npz$")


@dataclass
class Checkpoint:
    """Everything ``load_checkpoint`` read back from one file.

    weights     OrderedDict {parameter name: numpy array}, for ``model.load_state_dict``
    optimizer   the optimiser's ``state_dict()`` as it was saved (None if none was)
    scheduler   the schedule's ``state_dict()`` (None if none was)
    step        optimiser steps taken
    epoch       the epoch the next batch belongs to
    batch       how many batches of that epoch were already consumed
    rng         ``backend.get_rng_state()`` at the time of saving (None if not saved)
    config      the model config as a dict (``TransformerConfig.to_dict()``)
    tokenizers  {"src": tokenizer JSON string, "tgt": ...} or {} (vocabularies, for translation)
    extra       any other JSON-able data the trainer stored (task name, history, ...)
    path        the file it came from
    """

    weights: OrderedDict
    optimizer: dict | None = None
    scheduler: dict | None = None
    step: int = 0
    epoch: int = 0
    batch: int = 0
    rng: dict | None = None
    config: dict | None = None
    tokenizers: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    path: str | None = None


# ============================================================================ nested state <-> arrays + JSON

def _flatten(obj, prefix: str, arrays: dict):
    """A JSON-able skeleton of ``obj``; every array goes into ``arrays`` under ``prefix/<n>``.

    Plain Python scalars stay in the JSON (Python's json writes floats so that they read back to the same
    bits). NumPy arrays AND NumPy scalars become arrays, so that a float32 or float64 scalar comes back with
    its dtype - a NumPy float64 times a float32 array is float64, a Python float times it is float32,
    and exact resume needs the same arithmetic. Tuples and dicts with non-string keys are tagged so that
    they come back as they were.
    """
    if isinstance(obj, (numpy.ndarray, numpy.generic)) or hasattr(obj, "__cuda_array_interface__"):
        key = f"{prefix}/{len(arrays)}"
        arrays[key] = _host_array(obj)
        return {"__array__": key, "scalar": isinstance(obj, numpy.generic)}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, (list, tuple)):
        items = [_flatten(v, prefix, arrays) for v in obj]
        return {"__tuple__": items} if isinstance(obj, tuple) else items
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: _flatten(v, prefix, arrays) for k, v in obj.items()}
        for k in obj:
            if isinstance(k, bool) or not isinstance(k, (str, int)):
                raise TypeError(f"save_checkpoint: state dict keys must be str or int, got {k!r} under {prefix!r}")
        return {"__dict__": [[k, _flatten(v, prefix, arrays)] for k, v in obj.items()]}
    raise TypeError(f"save_checkpoint: cannot store a {type(obj).__name__} under {prefix!r}: "
                    "state must be arrays, numbers, strings, None, lists, tuples and dicts")


def _unflatten(obj, arrays: dict, path: str):
    """The inverse of ``_flatten``: the skeleton with its arrays put back."""
    if isinstance(obj, list):
        return [_unflatten(v, arrays, path) for v in obj]
    if isinstance(obj, dict):
        if "__array__" in obj:
            key = obj["__array__"]
            if key not in arrays:
                raise ValueError(f"checkpoint {path}: the metadata names an array {key!r} that the file lacks")
            return arrays[key][()] if obj.get("scalar") else arrays[key]
        if "__tuple__" in obj:
            return tuple(_unflatten(v, arrays, path) for v in obj["__tuple__"])
        if "__dict__" in obj:
            return {k: _unflatten(v, arrays, path) for k, v in obj["__dict__"]}
        return {k: _unflatten(v, arrays, path) for k, v in obj.items()}
    return obj


def _host_array(x) -> numpy.ndarray:
    if hasattr(x, "get") and not isinstance(x, (numpy.ndarray, numpy.generic)):
        x = x.get()  # CuPy -> host
    return numpy.asarray(x)


# ============================================================================ writing

def _fsync_directory(directory: str) -> None:
    """Make a rename inside ``directory`` durable. Not possible (nor needed) on Windows."""
    if os.name == "nt":  # pragma: no cover - Windows cannot open a directory
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_npz(f, arrays: dict) -> None:
    """The archive itself (a separate function so that tests can make it fail half-way)."""
    numpy.savez(f, **arrays)


_DIGEST_PREFIX = b"minitransformer-sha256:"
_TRAILER = len(_DIGEST_PREFIX) + 64          # the zip comment: prefix + 64 hex digits
_EOCD = 22                                   # a zip's end-of-central-directory record, without comment
_CHUNK = 1 << 20


def _sha256_of(f, size: int, tail: bytes = b"") -> str:
    """sha256 of the first ``size`` bytes of the open file ``f``, then of ``tail``."""
    h = hashlib.sha256()
    f.seek(0)
    left = size
    while left > 0:
        block = f.read(min(_CHUNK, left))
        if not block:
            break
        h.update(block)
        left -= len(block)
    h.update(tail)
    return h.hexdigest()


def _append_digest(f) -> None:
    """Put the sha256 of the archive into its zip comment (the last bytes of the file).

    A zip ends with a 22-byte record whose last two bytes are the comment's length. NumPy writes no
    comment, so the digest is taken over the file as written (length 0), then the length is set and
    the comment appended. ``np.load`` reads the archive as before: zip readers skip the comment.
    """
    f.seek(0, os.SEEK_END)
    size = f.tell()
    f.seek(size - _EOCD)
    if f.read(4) != b"PK\x05\x06":
        raise RuntimeError("save_checkpoint: unexpected archive layout (no zip end record where expected)")
    digest = _sha256_of(f, size)
    f.seek(size - 2)
    f.write(_TRAILER.to_bytes(2, "little") + _DIGEST_PREFIX + digest.encode("ascii"))


def _check_digest(path: str) -> bool:
    """True if the file ends with a digest that matches its content; False if it has none.
    Raises ValueError if it has one that does not match."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        if size < _EOCD + _TRAILER:
            return False
        f.seek(size - _TRAILER - 2)
        tail = f.read(_TRAILER + 2)
        if int.from_bytes(tail[:2], "little") != _TRAILER or not tail[2:].startswith(_DIGEST_PREFIX):
            return False
        stored = tail[2 + len(_DIGEST_PREFIX):].decode("ascii", errors="replace")
        actual = _sha256_of(f, size - _TRAILER - 2, b"\0\0")
    if stored != actual:
        raise ValueError(f"checkpoint {path}: checksum mismatch, the file was altered or damaged after it was "
                         f"written (stored sha256 {stored[:16]}..., content {actual[:16]}...)")
    return True


TEMP_PREFIX = ".checkpoint-"
TEMP_SUFFIX = ".tmp"


def _create_temp(directory: str):
    """A new, empty temporary file in ``directory``: (fd, path). Created with mode 0o666 minus the umask
    (``tempfile.mkstemp`` would make it 0o600, and the renamed checkpoint would keep that)."""
    for _ in range(100):
        tmp = os.path.join(directory, f"{TEMP_PREFIX}{os.getpid()}-{secrets.token_hex(6)}{TEMP_SUFFIX}")
        try:
            return os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"could not create a temporary file in {directory}")


def _write_atomically(path, write) -> None:
    """Make ``path`` the bytes ``write(f)`` puts into an open binary file, so that ``path`` is always either
    the old file or the whole new one.

    temp file in the same folder -> write -> flush -> fsync -> os.replace -> fsync the folder.
    If anything fails (or the process dies) before the rename, ``path`` is untouched and the temp file
    is removed (or, after a SIGKILL, left behind as ``.checkpoint-*.tmp``, which nothing ever reads).
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = _create_temp(directory)
    try:
        with os.fdopen(fd, "w+b") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        _remove_quietly(tmp)
        raise
    _publish(tmp, path, directory)


def atomic_write_arrays(path, arrays: dict) -> None:
    """Write ``arrays`` to ``path`` as .npz, atomically (see ``_write_atomically``), with the sha256 trailer."""
    def write(f):
        _write_npz(f, arrays)
        _append_digest(f)

    _write_atomically(path, write)


def atomic_copy(source, path) -> None:
    """Copy the file ``source`` to ``path``, atomically (see ``_write_atomically``): a new file, never a link."""
    def write(f):
        with open(source, "rb") as src:
            shutil.copyfileobj(src, f, _CHUNK)

    _write_atomically(path, write)


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _publish(tmp: str, path: str, directory: str) -> None:
    """os.replace(tmp, path), then fsync the folder so the rename itself survives a crash; on failure remove tmp."""
    try:
        os.replace(tmp, path)
    except BaseException:
        _remove_quietly(tmp)
        raise
    _fsync_directory(directory)


def pack_checkpoint(*, weights, optimizer=None, scheduler=None, step: int = 0, epoch: int = 0, batch: int = 0,
                    rng=None, config=None, tokenizers=None, extra=None) -> dict:
    """The dict of named arrays one checkpoint file holds (see the module docstring)."""
    arrays: dict = OrderedDict()
    for name, value in weights.items():
        arrays[f"param/{name}"] = _host_array(value)
    meta = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "step": int(step), "epoch": int(epoch), "batch": int(batch),
        "param_names": list(weights.keys()),
        "optimizer": None if optimizer is None else _flatten(optimizer, "optim", arrays),
        "scheduler": None if scheduler is None else _flatten(scheduler, "sched", arrays),
        "rng": rng,
        "config": config,
        "tokenizers": dict(tokenizers or {}),
        "extra": dict(extra or {}),
    }
    try:
        text = json.dumps(meta, allow_nan=True)
    except TypeError as err:
        raise TypeError(f"save_checkpoint: config, tokenizers, rng and extra must be JSON-able: {err}") from None
    arrays["meta"] = numpy.frombuffer(text.encode("utf-8"), dtype=numpy.uint8).copy()  # (bytes,)
    arrays["format_version"] = numpy.array(FORMAT_VERSION, dtype=numpy.int64)
    return arrays


def save_checkpoint(path, *, weights, optimizer=None, scheduler=None, step: int = 0, epoch: int = 0,
                    batch: int = 0, rng=None, config=None, tokenizers=None, extra=None) -> str:
    """Write one checkpoint file atomically. Returns the path.

    weights     {name: array}, usually ``model.state_dict()``
    optimizer   ``optimizer.state_dict()``: nested dicts/lists of arrays and scalars
    scheduler   ``scheduler.state_dict()``
    step, epoch, batch   where training is: steps taken, and the data position (epoch, batches consumed)
    rng         ``backend.get_rng_state()``
    config      the model config as a JSON-able dict
    tokenizers  {"src": json string, "tgt": json string} (or any JSON-able dict)
    extra       any JSON-able dict (task name, loss history, ...)
    """
    if not hasattr(weights, "items"):
        raise TypeError(f"save_checkpoint: weights must be a dict of arrays (model.state_dict()), "
                        f"got {type(weights).__name__}")
    arrays = pack_checkpoint(weights=weights, optimizer=optimizer, scheduler=scheduler, step=step, epoch=epoch,
                             batch=batch, rng=rng, config=config, tokenizers=tokenizers, extra=extra)
    atomic_write_arrays(path, arrays)
    return os.fspath(path)


# ============================================================================ reading

# Every way ``np.load`` can fail on a damaged zip (found by truncating and flipping bytes of real files).
_READ_ERRORS = (zipfile.BadZipFile, zlib.error, struct.error, EOFError, OSError, KeyError, IndexError,
                UnicodeDecodeError, NotImplementedError, RuntimeError, TypeError, ValueError)


def _read_arrays(path: str) -> dict:
    """Every array of the archive, read now (so that damage shows here, not later), without pickle."""
    with open(path, "rb") as f:
        magic = f.read(6)
    if magic.startswith(b"\x93NUMPY"):
        raise ValueError(f"checkpoint {path}: not a checkpoint archive (.npz): it is a single .npy array")
    if not magic.startswith(b"PK\x03\x04"):
        raise ValueError(f"checkpoint {path}: not a .npz archive (it starts with {magic!r}): a pickle, another "
                         f"format, or a file truncated to {os.path.getsize(path)} bytes. Refused without "
                         f"unpickling anything")
    try:
        with numpy.load(path, allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    except ValueError as err:
        if "pickle" in str(err):
            raise ValueError(f"checkpoint {path}: refused, the file holds pickled Python objects, which could run "
                             f"code when loaded; a minitransformer checkpoint never needs pickle ({err})") from None
        raise ValueError(f"checkpoint {path}: damaged or not a checkpoint ({err})") from None
    except _READ_ERRORS as err:
        raise ValueError(f"checkpoint {path}: damaged or truncated, cannot be read "
                         f"({type(err).__name__}: {err})") from None


def verify_checkpoint(path) -> dict:
    """Read a checkpoint's arrays after checking its sha256, format and version. Returns {name: array}.

    Raises ValueError naming the path and the problem (truncated, altered, pickled, wrong version),
    FileNotFoundError if there is no such file.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        raise IsADirectoryError(f"checkpoint {path} is a folder, not a .npz file "
                                f"(did you mean {os.path.join(path, LATEST)}?)")
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    has_digest = _check_digest(path)          # raises on a mismatch: truncated, flipped or edited
    arrays = _read_arrays(path)               # refuses pickle; catches what has no digest to check
    if not has_digest:
        raise ValueError(f"checkpoint {path}: no minitransformer checksum at the end of the file: it is truncated, "
                         f"or it was not written by minitransformer's save_checkpoint")
    for required in ("format_version", "meta"):
        if required not in arrays:
            raise ValueError(f"checkpoint {path}: not a minitransformer checkpoint (no {required!r} entry; "
                             f"it holds {sorted(arrays)[:6]})")
    version = arrays["format_version"]
    if version.shape != () or version.dtype.kind not in "iu":
        raise ValueError(f"checkpoint {path}: format_version must be an integer, got {version!r}")
    if int(version) != FORMAT_VERSION:
        raise ValueError(f"checkpoint {path}: format version {int(version)} is not supported "
                         f"(this minitransformer reads version {FORMAT_VERSION})")
    return arrays


def _parse_meta(path: str, arrays: dict) -> dict:
    try:
        meta = json.loads(bytes(arrays["meta"].astype(numpy.uint8)).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"checkpoint {path}: metadata is not valid JSON ({err})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        raise ValueError(f"checkpoint {path}: not a minitransformer checkpoint (format {meta.get('format')!r})"
                         if isinstance(meta, dict) else f"checkpoint {path}: metadata is not a JSON object")
    return meta


def load_checkpoint(path) -> Checkpoint:
    """Read and verify one checkpoint file (see ``verify_checkpoint``). Returns a ``Checkpoint``."""
    path = os.fspath(path)
    arrays = verify_checkpoint(path)
    meta = _parse_meta(path, arrays)
    names = meta.get("param_names", [])
    missing = [n for n in names if f"param/{n}" not in arrays]
    if missing:
        raise ValueError(f"checkpoint {path}: weights {missing[:5]} are listed but missing")
    weights = OrderedDict((n, arrays[f"param/{n}"]) for n in names)
    optimizer = None if meta.get("optimizer") is None else _unflatten(meta["optimizer"], arrays, path)
    scheduler = None if meta.get("scheduler") is None else _unflatten(meta["scheduler"], arrays, path)
    return Checkpoint(weights=weights, optimizer=optimizer, scheduler=scheduler, step=int(meta["step"]),
                      epoch=int(meta["epoch"]), batch=int(meta["batch"]), rng=meta.get("rng"),
                      config=meta.get("config"), tokenizers=meta.get("tokenizers") or {},
                      extra=meta.get("extra") or {}, path=path)


def load_weights(path) -> OrderedDict:
    """Only the weights of a checkpoint (verified like ``load_checkpoint``)."""
    return load_checkpoint(path).weights


# ============================================================================ keeping the last K, averaging

def resolve_checkpoint(path) -> str:
    """A checkpoint file from a file or a run folder (-> folder/checkpoint.npz). Names the path if absent."""
    path = os.fspath(path)
    if os.path.isdir(path):
        candidate = os.path.join(path, LATEST)
        if not os.path.exists(candidate):
            raise FileNotFoundError(f"no checkpoint in {path}: {candidate} does not exist")
        return candidate
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    return path


def step_of_file(path) -> int | None:
    """The step in a ``checkpoint-<step>.npz`` file name; None for any other name (``checkpoint.npz``, ...)."""
    m = _STEP_FILE.match(os.path.basename(os.fspath(path)))
    return int(m.group(1)) if m else None


def list_checkpoints(directory) -> list:
    """The ``checkpoint-<step>.npz`` files of a folder, oldest step first."""
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"checkpoint folder {directory} does not exist")
    found = []
    for name in os.listdir(directory):
        step = step_of_file(name)
        if step is not None:
            found.append((step, os.path.join(directory, name)))
    return [p for _, p in sorted(found)]


def checkpoint_files(directory) -> list:
    """Every checkpoint file a ``CheckpointManager`` writes that a folder holds: its checkpoint-<step>.npz files
    (oldest step first), then checkpoint.npz. Empty if the folder does not exist."""
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        return []
    latest = os.path.join(directory, LATEST)
    return list_checkpoints(directory) + ([latest] if os.path.isfile(latest) else [])


def latest_checkpoint(directory) -> str | None:
    """The file to continue the run of a folder from: checkpoint.npz, or, if that is missing (deleted by
    hand), the newest checkpoint-<step>.npz; None if the folder holds neither."""
    files = checkpoint_files(directory)
    if not files:
        return None
    return files[-1]          # checkpoint.npz comes last when it exists, else the newest step file


def _process_alive(pid: int) -> bool:
    if os.name == "nt":  # pragma: no cover - no cheap check: keep the file
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class CheckpointManager:
    """Saves ``checkpoint-<step>.npz`` in a folder, keeps the last ``keep`` of them, and makes
    ``checkpoint.npz`` a copy of the newest.

    Both files are replaced atomically, so at every moment ``checkpoint.npz`` is a whole checkpoint:
    the previous one until the new one is complete. The copy is a file of its own (not a hard link, which
    would cost nothing but let a write into checkpoint.npz change the step file as well). The folder is
    meant for one run: pruning keeps the ``keep`` highest steps, whoever wrote them (``Trainer`` refuses to
    start a new run in a folder that holds another's checkpoints).
    """

    def __init__(self, directory, keep: int = 5):
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"CheckpointManager: keep must be a positive int, got {keep!r}")
        self.directory = os.fspath(directory)
        self.keep = keep
        os.makedirs(self.directory, exist_ok=True)
        self._remove_stale_temps()

    def _remove_stale_temps(self) -> None:
        """Delete temporary files left by a writer that died mid-save (its process no longer exists)."""
        for name in os.listdir(self.directory):
            if not (name.startswith(TEMP_PREFIX) and name.endswith(TEMP_SUFFIX)):
                continue
            pid = name[len(TEMP_PREFIX):].split("-", 1)[0]
            if pid.isdigit() and int(pid) != os.getpid() and not _process_alive(int(pid)):
                try:
                    os.unlink(os.path.join(self.directory, name))
                except OSError:
                    pass

    @property
    def latest(self) -> str:
        return os.path.join(self.directory, LATEST)

    def save(self, step: int, **state) -> str:
        """Write checkpoint-<step>.npz, then checkpoint.npz as a copy of it (``state`` as for
        ``save_checkpoint``), then delete the oldest step files beyond ``keep``."""
        arrays = pack_checkpoint(step=step, **state)
        step_path = os.path.join(self.directory, f"checkpoint-{int(step)}.npz")
        atomic_write_arrays(step_path, arrays)
        atomic_copy(step_path, self.latest)   # the same bytes, already checksummed: copied, not packed again
        self._prune()
        return self.latest

    def _prune(self) -> None:
        for old in list_checkpoints(self.directory)[:-self.keep]:
            try:
                os.unlink(old)
            except OSError:
                pass

    def checkpoints(self) -> list:
        return list_checkpoints(self.directory)


def average_checkpoints(paths) -> OrderedDict:
    """The element-wise mean of the weights of several checkpoints (paper §6.1). -> {name: array}

    Every file is verified; all must hold the same parameter names and shapes. The mean is taken in
    float64 and returned in each parameter's saved dtype.
    """
    paths = [os.fspath(p) for p in paths]
    if not paths:
        raise ValueError("average_checkpoints: paths must name at least one checkpoint, got none")
    total = None
    reference = None
    for path in paths:
        weights = load_checkpoint(path).weights
        if total is None:
            reference = {k: (v.shape, v.dtype) for k, v in weights.items()}
            total = OrderedDict((k, v.astype(numpy.float64)) for k, v in weights.items())
            continue
        if list(weights) != list(reference):
            raise ValueError(f"average_checkpoints: {path} holds other parameters than {paths[0]} "
                             f"(different models cannot be averaged)")
        for k, v in weights.items():
            if v.shape != reference[k][0]:
                raise ValueError(f"average_checkpoints: parameter {k!r} has shape {v.shape} in {path} "
                                 f"but {reference[k][0]} in {paths[0]}")
            total[k] += v
    n = float(len(paths))
    return OrderedDict((k, (v / n).astype(reference[k][1])) for k, v in total.items())


def last_checkpoints(directory, n: int, up_to_step: int | None = None) -> list:
    """The newest ``n`` checkpoint-<step>.npz files of a folder (fewer if fewer exist), oldest first;
    with ``up_to_step``, the newest ``n`` whose step is at most that (the ``n`` ending at that step)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"last_checkpoints: n must be a positive int, got {n!r}")
    files = list_checkpoints(directory)
    if up_to_step is not None:
        files = [p for p in files if step_of_file(p) <= up_to_step]
    return files[-n:]
