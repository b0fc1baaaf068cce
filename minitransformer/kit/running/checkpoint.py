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
whole. ``files.atomic_write`` writes under a temporary name in the same folder, fsyncs, ``os.replace``s
over the old file (atomic on POSIX and Windows) and fsyncs the folder; it refuses a destination that is a
symbolic link.

Why a checksum of the whole file: the zip format's CRCs miss some damage (a flipped byte in a header field
that ``np.load`` does not read, an array rewritten with other values and a fresh CRC), and a truncated
file must not pass for a shorter one. The sha256 covers every byte, so any change, anywhere, is refused
with a message instead of training on garbage.

Why every field is checked on reading: checkpoints are shared, and the sha256 proves integrity, not origin
(anyone can compute it). ``load_checkpoint`` reads a file as untrusted input: every array header is checked
before the array is allocated, sizes are capped (``CONFIG_CAPS`` and the limits beside it), and each field is
checked with a message naming the file and the field (see ``load_checkpoint``).

Keeping the last K: ``CheckpointManager`` writes ``checkpoint-<step>.npz`` and a copy of it as
``checkpoint.npz`` (the latest), deleting the oldest beyond ``keep``, so that ``average_checkpoints`` can
average the weights of the last N as the paper does (§6.1: "averaging the last 5 checkpoints").
``checkpoint.npz`` is a file of its own, not a hard link: ``cp backup/checkpoint.npz run/checkpoint.npz``
writes into the existing file, and through a link it would silently rewrite ``checkpoint-<step>.npz`` too.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import struct
import zipfile
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy

from minitransformer.kit.running.files import (
    TEMP_PREFIX,
    TEMP_SUFFIX,
    atomic_write,
    open_regular,
    parse_json,
)

FORMAT_NAME = "minitransformer-checkpoint"
FORMAT_VERSION = 1
LATEST = "checkpoint.npz"
_STEP_FILE = re.compile(r"^checkpoint-(\d+)\.npz$")

# What a checkpoint of this project can hold. A file asking for more is refused before anything is allocated:
# the sizes are those of the paper's big model with room to spare, and the tables they imply (embeddings,
# positional encodings) must fit in memory.
CONFIG_CAPS = {"src_vocab_size": 1_000_000, "tgt_vocab_size": 1_000_000, "d_model": 8192, "num_heads": 1024,
               "d_k": 8192, "d_ff": 65536, "num_encoder_layers": 128, "num_decoder_layers": 128, "max_len": 8192}
MAX_POSITIONS = 1 << 24       # max_len * d_model: the sinusoidal table each side builds (not stored in the file)
MAX_COUNT = 10 ** 9           # steps, epochs, batch positions: far beyond any run (the paper's longest: 300,000 steps)
MAX_META_BYTES = 64 << 20     # the JSON metadata: vocabularies, merges and histories take a few MB
MAX_ENTRIES = 100_000         # arrays in one file (a model has hundreds, its optimiser twice as many)
MAX_NDIM = 8
MAX_INFLATION = 16            # numpy.savez stores arrays uncompressed; a deflated file may shrink, not 1000-fold


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


def _host_array(x) -> numpy.ndarray:
    if hasattr(x, "get") and not isinstance(x, (numpy.ndarray, numpy.generic)):
        x = x.get()  # CuPy -> host
    return numpy.asarray(x)


# ============================================================================ writing

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


def _check_digest(f, size: int, path: str) -> bool:
    """True if the open file (``size`` bytes) ends with a digest that matches its content; False if it has
    none. Raises ValueError if it has one that does not match."""
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


def atomic_write_arrays(path, arrays: dict) -> None:
    """Write ``arrays`` to ``path`` as .npz, atomically (``files.atomic_write``), with the sha256 trailer."""
    def write(f):
        _write_npz(f, arrays)
        _append_digest(f)

    atomic_write(path, write, "checkpoint")


def atomic_copy(source, path) -> None:
    """Copy the file ``source`` to ``path``, atomically (``files.atomic_write``): a new file, never a link."""
    def write(f):
        with open_regular(source, "checkpoint") as src:
            shutil.copyfileobj(src, f, _CHUNK)

    atomic_write(path, write, "checkpoint")


def pack_checkpoint(*, weights, optimizer=None, scheduler=None, step: int = 0, epoch: int = 0, batch: int = 0,
                    rng=None, config=None, tokenizers=None, extra=None) -> dict:
    """The dict of named arrays one checkpoint file holds (see the module docstring)."""
    for name, value in (("step", step), ("epoch", epoch), ("batch", batch)):
        if isinstance(value, bool) or not isinstance(value, (int, numpy.integer)) or not 0 <= value <= MAX_COUNT:
            raise ValueError(f"save_checkpoint: {name} must be an int in [0, {MAX_COUNT:,}], got {value!r}")
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


# ============================================================================ reading untrusted files

# Every way reading a damaged zip can fail (found by truncating and flipping bytes of real files).
_READ_ERRORS = (zipfile.BadZipFile, zlib.error, struct.error, EOFError, OSError, KeyError, IndexError,
                UnicodeDecodeError, NotImplementedError, RuntimeError, TypeError, ValueError)


class _Archive:
    """A checkpoint file opened for reading, with its sha256, its zip directory and every array header
    checked, and no array data read yet: ``read(name)`` then allocates only what a header announced and
    the file holds.

    Checked here: a regular file (``files.open_regular``); a zip; the entries are .npy arrays, none twice,
    stored or deflated, inside the file, decompressing to at most ``MAX_INFLATION`` times the file's size;
    each header's dtype is a plain bool, integer or float (no objects, so no pickle; no complex, no
    records), its shape has at most ``MAX_NDIM`` axes, and its byte count is exactly what the entry holds.
    """

    def __init__(self, path: str):
        self.path = path
        self.file = open_regular(path, "checkpoint")
        try:
            self._open()
        except BaseException:
            self.file.close()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()

    def _error(self, what: str) -> ValueError:
        return ValueError(f"checkpoint {self.path}: {what}")

    def _open(self) -> None:
        path, f = self.path, self.file
        size = os.fstat(f.fileno()).st_size
        magic = f.read(6)
        if magic.startswith(b"\x93NUMPY"):
            raise self._error("not a checkpoint archive (.npz): it is a single .npy array")
        if not magic.startswith(b"PK\x03\x04"):
            raise self._error(f"not a .npz archive (it starts with {magic!r}): a pickle, another format, or a file "
                       f"truncated to {size} bytes. Refused without unpickling anything")
        try:
            self.has_digest = _check_digest(f, size, path)   # raises on a mismatch: truncated, flipped or edited
            self.zip = zipfile.ZipFile(f)
            infos = self.zip.infolist()
        except _READ_ERRORS as err:
            raise self._error(f"damaged or truncated, cannot be read ({type(err).__name__}: {err})") from None
        if len(infos) > MAX_ENTRIES:
            raise self._error(f"holds {len(infos)} entries, more than a checkpoint has (at most {MAX_ENTRIES})")
        packed = unpacked = 0
        self.headers = {}
        for info in infos:
            name = info.filename[:-4] if info.filename.endswith(".npy") else None
            if name is None or name in self.headers:
                raise self._error(f"entry {info.filename!r} is {'not a .npy array' if name is None else 'there twice'}")
            if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED) or \
                    (info.compress_type == zipfile.ZIP_STORED and info.file_size != info.compress_size):
                raise self._error(f"entry {info.filename!r} is damaged or compressed in a way numpy never writes")
            packed += info.compress_size
            unpacked += info.file_size
            self.headers[name] = (info, *self._header(info))
        if packed > size:
            raise self._error("damaged: its entries claim more bytes than the file has")
        if unpacked > MAX_INFLATION * size + (1 << 20):
            raise self._error(f"its entries decompress to {unpacked:,} bytes from a file of {size:,} bytes (more than "
                       f"{MAX_INFLATION} times its size): refused before decompressing")

    def _header(self, info) -> tuple:
        """(dtype, shape, fortran_order) of an entry, checked against the bytes it holds."""
        where = f"entry {info.filename!r}"
        readers = {(1, 0): numpy.lib.format.read_array_header_1_0, (2, 0): numpy.lib.format.read_array_header_2_0}
        try:
            with self.zip.open(info) as fp:
                version = numpy.lib.format.read_magic(fp)
                header = readers[version](fp) if version in readers else None
                offset = fp.tell()
        except (*_READ_ERRORS, SyntaxError, RecursionError) as err:
            raise self._error(f"damaged, {where} has no valid array header ({type(err).__name__}: {err})") from None
        if header is None:
            raise self._error(f"{where} has .npy format version {version}, which a checkpoint never has")
        shape, fortran_order, dtype = header
        if dtype.hasobject:
            raise self._error(f"refused, {where} holds pickled Python objects, which could run code when loaded; a "
                       f"minitransformer checkpoint never needs pickle")
        if dtype.kind not in "biuf" or dtype.fields is not None or dtype.subdtype is not None:
            raise self._error(f"{where} holds {dtype} values; a checkpoint holds only bool, integer and float arrays")
        if len(shape) > MAX_NDIM or any(d < 0 for d in shape):
            raise self._error(f"{where} has the shape {shape}, which no checkpoint array has")
        nbytes = math.prod(shape) * dtype.itemsize
        if offset + nbytes != info.file_size:
            raise self._error(f"{where} claims {nbytes:,} bytes of data (shape {shape}, {dtype}) but holds "
                       f"{info.file_size - offset:,}: refused before allocating")
        return dtype, shape, fortran_order

    def size_of(self, name: str) -> int:
        """The number of elements of an entry, from its header."""
        return math.prod(self.headers[name][2])

    def read(self, name: str) -> numpy.ndarray:
        """The entry's array: exactly the bytes its checked header announced, read into a buffer of that size."""
        info, dtype, shape, fortran_order = self.headers[name]
        buffer = bytearray(math.prod(shape) * dtype.itemsize)
        try:
            with self.zip.open(info) as fp:
                fp.read(info.file_size - len(buffer))                   # the header, already read
                view, filled = memoryview(buffer), 0
                while filled < len(buffer):
                    n = fp.readinto(view[filled:])
                    if not n:
                        raise EOFError(f"{len(buffer) - filled} bytes missing")
                    filled += n
        except MemoryError:
            raise self._error(f"entry {info.filename!r} ({info.file_size:,} bytes) does not fit in memory") from None
        except _READ_ERRORS as err:
            raise self._error(f"damaged or truncated, entry {info.filename!r} cannot be read "
                              f"({type(err).__name__}: {err})") from None
        return numpy.frombuffer(buffer, dtype=dtype).reshape(shape, order="F" if fortran_order else "C")


def _path_of_checkpoint(path) -> str:
    path = os.fspath(path)
    if os.path.isdir(path):
        raise IsADirectoryError(f"checkpoint {path} is a folder, not a .npz file "
                                f"(did you mean {os.path.join(path, LATEST)}?)")
    if not os.path.lexists(path):
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    return path


def _require(meta: dict, key: str, path: str):
    if key not in meta:
        raise ValueError(f"checkpoint {path} is missing {key!r}")
    return meta[key]


def _count(value, where: str, path: str) -> int:
    """A step, epoch or position: an int in [0, MAX_COUNT]."""
    if isinstance(value, bool) or not isinstance(value, (int, numpy.integer)) or not 0 <= value <= MAX_COUNT:
        raise ValueError(f"checkpoint {path}: {where} must be an integer in [0, {MAX_COUNT:,}], got {value!r:.60}")
    return int(value)


def _array_refs(skeleton, prefix: str, where: str, path: str) -> list:
    """The array names an optimiser or schedule skeleton refers to (each ``prefix/<n>``), checking its form.
    Iterative: the depth was bounded when the JSON was parsed, but no recursion is needed to find them."""
    refs, stack = [], [skeleton]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            if "__array__" in node:
                key = node["__array__"]
                if not isinstance(key, str) or not re.fullmatch(rf"{prefix}/\d+", key):
                    raise ValueError(f"checkpoint {path}: {where} names the array {key!r:.60}, which is not one of "
                                     f"its own ({prefix}/<n>)")
                refs.append(key)
            elif "__dict__" in node:
                items = node["__dict__"]
                if not isinstance(items, list) or not all(
                        isinstance(kv, list) and len(kv) == 2 and isinstance(kv[0], (str, int))
                        and not isinstance(kv[0], bool) for kv in items):
                    raise ValueError(f"checkpoint {path}: {where} holds a malformed dict (__dict__ must list "
                                     f"[key, value] pairs with str or int keys)")
                stack.extend(kv[1] for kv in items)
            elif "__tuple__" in node:
                if not isinstance(node["__tuple__"], list):
                    raise ValueError(f"checkpoint {path}: {where} holds a malformed tuple (__tuple__ must be a list)")
                stack.extend(node["__tuple__"])
            else:
                stack.extend(node.values())
    return refs


def _unflatten(obj, arrays: dict):
    """The inverse of ``_flatten``: the skeleton with its arrays put back (its form was checked by
    ``_array_refs``, its depth when the JSON was parsed)."""
    if isinstance(obj, list):
        return [_unflatten(v, arrays) for v in obj]
    if isinstance(obj, dict):
        if "__array__" in obj:
            array = arrays[obj["__array__"]]
            return array[()] if obj.get("scalar") is True and array.shape == () else array
        if "__tuple__" in obj:
            return tuple(_unflatten(v, arrays) for v in obj["__tuple__"])
        if "__dict__" in obj:
            return {k: _unflatten(v, arrays) for k, v in obj["__dict__"]}
        return {k: _unflatten(v, arrays) for k, v in obj.items()}
    return obj


def check_config(config, where: str):
    """The ``TransformerConfig`` of a config dict read from a file, or ValueError naming ``where`` and the field:
    not a valid config, or a size beyond ``CONFIG_CAPS`` / ``MAX_POSITIONS`` (sizes no model of this project
    has, and whose tables alone would exhaust memory)."""
    from minitransformer.config import TransformerConfig

    if not isinstance(config, dict):
        raise ValueError(f"{where}: config must be an object, got {type(config).__name__}")  # noqa: TRY004
    for name, cap in CONFIG_CAPS.items():
        value = config.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > cap:
            raise ValueError(f"{where}: config {name} = {value} is beyond the sizes this project supports "
                             f"(at most {cap:,})")
    try:
        cfg = TransformerConfig.from_dict(config)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: config is not a valid model config ({err})") from None
    if cfg.max_len * cfg.d_model > MAX_POSITIONS:
        raise ValueError(f"{where}: config max_len * d_model = {cfg.max_len * cfg.d_model:,} is beyond the "
                         f"sizes this project supports (at most {MAX_POSITIONS:,} positional-table entries)")
    return cfg


def parameter_count(cfg) -> int:
    """How many numbers the weights of ``Transformer(cfg)`` hold, computed without building it (a test pins
    it to ``num_parameters()``), so that a config is refused before its model is allocated."""
    d, f, inner = cfg.d_model, cfg.d_ff, cfg.num_heads * (cfg.d_k or cfg.d_model // cfg.num_heads)

    def linear(n_in, n_out):
        return n_in * n_out + n_out

    attention = 3 * linear(d, inner) + linear(inner, d)
    ffn, norm = linear(d, f) + linear(f, d), 2 * d
    total = cfg.num_encoder_layers * (attention + ffn + 2 * norm)
    total += cfg.num_decoder_layers * (2 * attention + ffn + 3 * norm)
    total += 2 * norm if cfg.norm_first else 0                              # each stack's final LayerNorm
    total += cfg.src_vocab_size * d + (0 if cfg.share_embeddings else cfg.tgt_vocab_size * d)
    total += 2 * cfg.max_len * d if cfg.positional == "learned" else 0
    total += 0 if cfg.tie_output else linear(d, cfg.tgt_vocab_size)
    return total


def _read(path):
    """(arrays, meta) of a checkpoint file, everything checked (see ``load_checkpoint``)."""
    path = _path_of_checkpoint(path)
    with _Archive(path) as archive:
        if not archive.has_digest:            # refused before any array is read
            raise ValueError(f"checkpoint {path}: no minitransformer checksum at the end of the file: it is "
                             f"truncated, or it was not written by minitransformer's save_checkpoint")
        for required in ("format_version", "meta"):
            if required not in archive.headers:
                raise ValueError(f"checkpoint {path}: not a minitransformer checkpoint (no {required!r} entry; "
                                 f"it holds {sorted(archive.headers)[:6]})")
        version = archive.read("format_version")
        if version.shape != () or version.dtype.kind not in "iu":
            raise ValueError(f"checkpoint {path}: format_version must be an integer, got {version!r}")
        if int(version) != FORMAT_VERSION:
            raise ValueError(f"checkpoint {path}: format version {int(version)} is not supported "
                             f"(this minitransformer reads version {FORMAT_VERSION})")
        _, dtype, shape, _ = archive.headers["meta"]
        if dtype != numpy.uint8 or len(shape) != 1 or shape[0] > MAX_META_BYTES:
            raise ValueError(f"checkpoint {path}: meta must be UTF-8 bytes (at most {MAX_META_BYTES:,}), "
                             f"got {dtype} of shape {shape}")
        meta = _parse_meta(path, archive.read("meta"))
        names = _check_meta(path, meta)
        unknown = sorted(set(archive.headers) - set(names) - {"meta", "format_version"})
        if unknown:
            raise ValueError(f"checkpoint {path}: holds entries no checkpoint has ({unknown[:3]}"
                             f"{' ...' if len(unknown) > 3 else ''}): refused unread")
        absent = [n for n in names if n not in archive.headers]
        if absent:
            raise ValueError(f"checkpoint {path}: the metadata lists arrays the file lacks ({absent[:3]})")
        params = [n for n in names if n.startswith("param/")]
        for name in params:
            if archive.headers[name][1].kind != "f":
                raise ValueError(f"checkpoint {path}: weight {name[6:]!r} holds {archive.headers[name][1]} "
                                 f"values; weights are floats")
        if meta["config"] is not None:
            cfg = check_config(meta["config"], f"checkpoint {path}")
            needed, stored = parameter_count(cfg), sum(archive.size_of(n) for n in params)
            if needed > stored:
                raise ValueError(f"checkpoint {path}: its config describes {needed:,} weights but the file holds "
                                 f"{stored:,}: refused before building the model")
        arrays = {}
        for name in names:
            arrays[name] = array = archive.read(name)
            if array.dtype.kind == "f" and not numpy.isfinite(array).all():
                what = f"weight {name[6:]!r}" if name.startswith("param/") else f"optimiser array {name!r}"
                raise ValueError(f"checkpoint {path}: {what} holds NaN or infinite values (the run had diverged, "
                                 f"or the file was crafted)")
    return arrays, meta


def _parse_meta(path: str, raw: numpy.ndarray) -> dict:
    try:
        text = bytes(raw).decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"checkpoint {path}: metadata is not UTF-8 ({err})") from None
    meta = parse_json(text, f"checkpoint {path}: metadata")
    if not isinstance(meta, dict):
        raise ValueError(f"checkpoint {path}: metadata is not a JSON object")  # noqa: TRY004
    if meta.get("format") != FORMAT_NAME:
        raise ValueError(f"checkpoint {path}: not a minitransformer checkpoint (format {meta.get('format')!r:.60})")
    return meta


def _check_meta(path: str, meta: dict) -> list:
    """Check every field ``load_checkpoint`` uses; fill the optional ones. -> the array names the file must hold."""
    for key in ("step", "epoch", "batch"):
        meta[key] = _count(_require(meta, key, path), key, path)
    names = _require(meta, "param_names", path)
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
        raise ValueError(f"checkpoint {path}: param_names must be a list of distinct str")
    arrays = [f"param/{n}" for n in names]
    for key, prefix in (("optimizer", "optim"), ("scheduler", "sched")):
        meta[key] = meta.get(key)
        if meta[key] is not None:
            arrays += _array_refs(meta[key], prefix, key, path)
    for key in ("rng", "config", "tokenizers", "extra"):
        value = meta.get(key)
        if value is not None and not isinstance(value, dict):
            raise ValueError(f"checkpoint {path}: {key} must be an object, got {type(value).__name__}")
        meta[key] = {} if value is None and key in ("tokenizers", "extra") else value
    return list(dict.fromkeys(arrays))


def verify_checkpoint(path) -> dict:
    """Read a checkpoint's arrays after checking its sha256, format, version and contents (see
    ``load_checkpoint``). Returns {name: array}."""
    return _read(path)[0]


def load_checkpoint(path) -> Checkpoint:
    """Read and check one checkpoint file. Returns a ``Checkpoint``.

    The file may come from anyone (the sha256 proves integrity, not origin), so it is refused with a
    ValueError naming the path and the problem - nothing allocated beyond what the file holds, nothing
    else read - when it is not a regular file, is truncated, altered or pickled, has another version,
    holds an entry no checkpoint has, an array whose header claims more than its bytes, a dtype other
    than bool/int/float, NaN or infinite values, metadata nested deeper than ``MAX_JSON_DEPTH``, a step
    or position outside [0, ``MAX_COUNT``], or a config beyond ``CONFIG_CAPS`` or describing more weights
    than the file holds. FileNotFoundError if there is no such file, IsADirectoryError for a folder.
    """
    arrays, meta = _read(path)
    path = os.fspath(path)
    weights = OrderedDict((n, arrays[f"param/{n}"]) for n in meta["param_names"])
    optimizer = None if meta["optimizer"] is None else _unflatten(meta["optimizer"], arrays)
    scheduler = None if meta["scheduler"] is None else _unflatten(meta["scheduler"], arrays)
    return Checkpoint(weights=weights, optimizer=optimizer, scheduler=scheduler, step=meta["step"],
                      epoch=meta["epoch"], batch=meta["batch"], rng=meta["rng"], config=meta["config"],
                      tokenizers=meta["tokenizers"], extra=meta["extra"], path=path)


def check_state(path, what: str, state, template) -> None:
    """Refuse (ValueError naming the file and the entry) a state read from a checkpoint that does not fit
    ``template``, the ``state_dict()`` of the object it is about to be loaded into, so that a refused load
    changes nothing: the same keys; where the template has an array, an array of its shape and kind (float
    or integer; ``load_checkpoint`` refused non-finite ones); an int (not a bool) in [0, MAX_COUNT] where it
    has an int; a finite number >= 0 where it has a float; the same rule inside nested dicts and lists."""
    where = f"checkpoint {path}: {what}"
    if isinstance(template, dict):
        if not isinstance(state, dict):
            raise ValueError(f"{where} must be an object, got {type(state).__name__}")  # noqa: TRY004
        missing = [k for k in template if k not in state]
        if missing:
            raise ValueError(f"checkpoint {path} is missing {what}[{missing[0]!r}]"
                             + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
        unexpected = [k for k in state if k not in template]
        if unexpected:
            raise ValueError(f"{where} has entries this run does not have ({unexpected[:3]})")
        for k, ref in template.items():
            check_state(path, f"{what}[{k!r}]", state[k], ref)
    elif isinstance(template, (list, tuple)):
        if not isinstance(state, (list, tuple)) or len(state) != len(template):
            raise ValueError(f"{where} must be a list of {len(template)}, got {type(state).__name__}")
        for i, (v, ref) in enumerate(zip(state, template)):
            check_state(path, f"{what}[{i}]", v, ref)
    elif isinstance(template, numpy.ndarray) or hasattr(template, "__cuda_array_interface__"):
        if not isinstance(state, numpy.ndarray) or state.shape != tuple(template.shape):
            got = state.shape if isinstance(state, numpy.ndarray) else type(state).__name__
            raise ValueError(f"{where} must be an array of shape {tuple(template.shape)}, got {got}")
        if (state.dtype.kind == "f") != (template.dtype.kind == "f"):
            raise ValueError(f"{where} holds {state.dtype} values, this run {template.dtype}")
    elif isinstance(template, bool):
        if not isinstance(state, (bool, numpy.bool_)):
            raise ValueError(f"{where} must be true or false, got {state!r:.60}")  # noqa: TRY004
    elif isinstance(template, (int, numpy.integer)):
        _count(state, what, path)
    elif isinstance(template, (float, numpy.floating)):
        real = (int, float, numpy.integer, numpy.floating)
        if isinstance(state, (bool, numpy.bool_)) or not isinstance(state, real) or abs(state) > 2 ** 1000 or \
                not (math.isfinite(state) and state >= 0):
            raise ValueError(f"{where} must be a finite number >= 0, got {state!r:.60}")
    elif template is None and state is not None:
        raise ValueError(f"{where} must be null, got {type(state).__name__}")


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
