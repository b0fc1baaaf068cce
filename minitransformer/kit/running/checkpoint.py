"""Training checkpoints: one safetensors file holding everything a run needs to continue, and no pickle.

One file holds tensors (``param/<name>``: the weights, one per ``state_dict`` entry; ``optim/<i>`` and
``sched/<i>``: the optimiser's and the schedule's arrays, Adam's m and v) and, in the header's string metadata,
``minitransformer``: JSON with the format version, the run's id, step, epoch and batch position, the random
generators' states, the model config, the tokenisers, extra data (histories) and the optimiser/schedule
skeletons (their scalars, and which tensor goes where); ``sha256``: the digest of all of it (see ``_digest``).

Why safetensors: the format was made for files strangers send each other: a JSON header of bounded size, then
raw little-endian bytes, no code run on loading (``numpy.load(allow_pickle=True)`` would run whatever a crafted
file says), and PyTorch, JAX and the Hugging Face tools open it directly (``safetensors.torch.load_file``).

Why every field is checked on reading: checkpoints are shared, and the digest proves integrity, not origin
(anyone can compute it). ``load_checkpoint`` reads the 8-byte header length itself and refuses it above
``MAX_HEADER_BYTES`` before reading more; checks every tensor's dtype (bool, integer, float), shape and size
against the file, the metadata's every field and the config's sizes against the weights the file holds, all
before the tensors are read; then the digest and finiteness. Each refusal is one line naming the file and field.
The writer runs the same checks on what it is about to write, so a run never saves a file it cannot read.

Writes are atomic (``files.atomic_write``): a run killed while saving leaves the previous file whole.
``CheckpointManager`` writes ``checkpoint-<step>.safetensors`` and the same bytes as ``checkpoint.safetensors``
(a file of its own, not a link: ``cp backup/checkpoint.safetensors run/`` must not rewrite a step file too),
keeps the last ``keep`` step files of its run, and holds the folder's lock (``files.lock_folder``): one run per
folder. ``average_checkpoints`` averages the last N, as the paper does (§6.1).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import secrets
import sys
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy
import safetensors
import safetensors.numpy

from minitransformer.kit.running.files import (
    TEMP_PREFIX,  # noqa: F401 - where the temporary files of a save are named
    TEMP_SUFFIX,  # noqa: F401
    atomic_write,
    lock_folder,
    open_regular,
    parse_json,
    remove_stale_temps,
)
from minitransformer.limits import (
    CONFIG_CAPS,
    MAX_COUNT,
    MAX_ELEMENTS,
    MAX_ENTRIES,
    MAX_HEADER_BYTES,
    MAX_META_BYTES,
    MAX_NDIM,
    MAX_POSITIONS,
)

FORMAT_NAME = "minitransformer-checkpoint"
FORMAT_VERSION = 2                         # 1 was the .npz format (``npz.convert_npz`` reads it)
SUFFIX = ".safetensors"
LATEST = "checkpoint" + SUFFIX
_STEP_FILE = re.compile(r"^checkpoint-(\d+)\.safetensors$")
_DTYPES = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "U16": "uint16", "I16": "int16", "U32": "uint32",
           "I32": "int32", "U64": "uint64", "I64": "int64", "F16": "float16", "F32": "float32", "F64": "float64"}
_CODES = {numpy.dtype(name): code for code, name in _DTYPES.items()}


@dataclass
class Checkpoint:
    """Everything ``load_checkpoint`` read back from one file: weights (OrderedDict name -> array, for
    ``model.load_state_dict``), the optimiser's and schedule's ``state_dict()`` (None if not saved), step
    (optimiser steps taken), epoch and batch (the data position), rng (``backend.get_rng_state()``), config
    (``TransformerConfig.to_dict()``), tokenizers ({"src": JSON, "tgt": JSON} or {}), extra (task, histories),
    path (the file) and run (the id of the run that wrote it)."""

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
    run: str | None = None


# ============================================================================ writing

def _flatten(obj, prefix: str, tensors: dict):
    """A JSON-able skeleton of ``obj``; every array goes into ``tensors`` under ``prefix/<n>``.

    NumPy scalars become tensors too, so that a float32 scalar comes back a float32 (a NumPy float64 times a
    float32 array is float64, a Python float times it float32: exact resume needs the same arithmetic). Tuples
    and dicts with non-string keys (or keys starting with "__") are tagged so that they come back as they were.
    """
    if isinstance(obj, (numpy.ndarray, numpy.generic)) or hasattr(obj, "__cuda_array_interface__"):
        key = f"{prefix}/{len(tensors)}"
        tensors[key] = obj.get() if hasattr(obj, "__cuda_array_interface__") else numpy.asarray(obj)
        return {"__array__": key, "scalar": isinstance(obj, numpy.generic)}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, (list, tuple)):
        items = [_flatten(v, prefix, tensors) for v in obj]
        return {"__tuple__": items} if isinstance(obj, tuple) else items
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: _flatten(v, prefix, tensors) for k, v in obj.items()}
        if any(isinstance(k, bool) or not isinstance(k, (str, int)) for k in obj):
            raise TypeError(f"save_checkpoint: state dict keys must be str or int, under {prefix!r}")
        return {"__dict__": [[k, _flatten(v, prefix, tensors)] for k, v in obj.items()]}
    raise TypeError(f"save_checkpoint: cannot store a {type(obj).__name__} under {prefix!r}: "
                    "state must be arrays, numbers, strings, None, lists, tuples and dicts")


def _digest(metadata: dict, tensors: dict) -> str:
    """sha256 of the metadata and of every tensor's name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256(json.dumps(metadata, sort_keys=True).encode("utf-8"))
    for name in sorted(tensors):
        a = tensors[name]
        h.update(f"\0{name}\0{a.dtype.str}\0{a.shape}\0".encode())
        h.update(a.reshape(-1).view(numpy.uint8))
    return h.hexdigest()


def pack_checkpoint(*, weights, optimizer=None, scheduler=None, step: int = 0, epoch: int = 0, batch: int = 0,
                    rng=None, config=None, tokenizers=None, extra=None, run=None) -> bytes:
    """The bytes of one checkpoint file (see the module docstring), checked as the reader will check them."""
    if not hasattr(weights, "items"):
        raise TypeError(f"save_checkpoint: weights must be a dict of arrays (model.state_dict()), "
                        f"got {type(weights).__name__}")
    for name, value in (("step", step), ("epoch", epoch), ("batch", batch)):
        if isinstance(value, bool) or not isinstance(value, (int, numpy.integer)) or not 0 <= value <= MAX_COUNT:
            raise ValueError(f"save_checkpoint: {name} must be an int in [0, {MAX_COUNT:,}], got {value!r}")
    tensors: dict = OrderedDict((f"param/{n}", numpy.asarray(v.get() if hasattr(v, "__cuda_array_interface__")
                                                              else v)) for n, v in weights.items())
    meta = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "run": run,
            "step": int(step), "epoch": int(epoch), "batch": int(batch), "param_names": list(weights.keys()),
            "optimizer": None if optimizer is None else _flatten(optimizer, "optim", tensors),
            "scheduler": None if scheduler is None else _flatten(scheduler, "sched", tensors),
            "rng": rng, "config": config, "tokenizers": dict(tokenizers or {}), "extra": dict(extra or {})}
    try:
        text = json.dumps(meta)
    except TypeError as err:
        raise TypeError(f"save_checkpoint: config, tokenizers, rng and extra must be JSON-able: {err}") from None
    for name, a in tensors.items():
        if a.dtype.newbyteorder("=") not in _CODES:
            raise TypeError(f"save_checkpoint: {name} is a {a.dtype} array; a checkpoint holds bool, int and float")
        tensors[name] = numpy.require(a, a.dtype.newbyteorder("<"), ["C"])    # 0-d stays 0-d
    specs = {name: (_CODES[a.dtype.newbyteorder("=")], list(a.shape)) for name, a in tensors.items()}
    _check_sizes("save_checkpoint", len(text.encode("utf-8")), specs)
    arrays = _check_meta("save_checkpoint", json.loads(text), specs)
    _check_finite("save_checkpoint", arrays, tensors)
    metadata = {"minitransformer": text}
    metadata["sha256"] = _digest(metadata, tensors)
    return safetensors.numpy.save(tensors, metadata=metadata)


def save_checkpoint(path, *, weights, optimizer=None, scheduler=None, step: int = 0, epoch: int = 0,
                    batch: int = 0, rng=None, config=None, tokenizers=None, extra=None, run=None) -> str:
    """Write one checkpoint file atomically. Returns the path.

    weights     {name: array}, usually ``model.state_dict()``
    optimizer   ``optimizer.state_dict()``: nested dicts/lists of arrays and scalars; scheduler likewise
    step, epoch, batch   where training is: steps taken, and the data position (epoch, batches consumed)
    rng         ``backend.get_rng_state()``; config: the model config as a dict; run: the run's id (a str)
    tokenizers  {"src": json string, "tgt": json string}; extra: any JSON-able dict (task name, histories, ...)
    """
    data = pack_checkpoint(weights=weights, optimizer=optimizer, scheduler=scheduler, step=step, epoch=epoch,
                           batch=batch, rng=rng, config=config, tokenizers=tokenizers, extra=extra, run=run)
    atomic_write(path, lambda f: _write_file(f, data), "checkpoint")
    return os.fspath(path)


def _write_file(f, data: bytes) -> None:
    """The file's bytes into the open temporary file (a function of its own so that tests can fail it half-way)."""
    f.write(data)


# ============================================================================ reading untrusted files

def _check_sizes(where: str, meta_bytes: int, specs: dict) -> None:
    if meta_bytes > MAX_META_BYTES:
        raise ValueError(f"{where}: its metadata is {meta_bytes:,} bytes, more than a checkpoint may hold "
                         f"(limits.MAX_META_BYTES = {MAX_META_BYTES:,}): keep extra (histories) smaller")
    if len(specs) > MAX_ENTRIES:
        raise ValueError(f"{where}: holds {len(specs):,} tensors, more than a checkpoint has "
                         f"(limits.MAX_ENTRIES = {MAX_ENTRIES:,})")


def _read_header(path: str, f, size: int) -> tuple:
    """(metadata, {name: (dtype code, shape)}) of the open file, its sizes checked; no tensor read yet."""
    head = f.read(8)
    if head.startswith(b"PK\x03\x04"):
        raise ValueError(f"checkpoint {path} is in the .npz format of earlier versions: convert it once with "
                         f"`minitransformer convert {path}` (the old file is kept)")
    n = int.from_bytes(head, "little")
    if len(head) < 8 or n > MAX_HEADER_BYTES or 8 + n > size:
        raise ValueError(f"checkpoint {path}: not a safetensors file, or truncated (its first 8 bytes announce a "
                         f"header of {n:,} bytes, the file has {size:,}; at most {MAX_HEADER_BYTES:,}): refused unread")
    header = parse_json(f.read(n), f"checkpoint {path}: header", object_pairs_hook=_no_duplicates)
    if not isinstance(header, dict) or not isinstance(header.get("__metadata__"), dict):
        raise ValueError(f"checkpoint {path}: not a minitransformer checkpoint (no metadata in its header)")  # noqa: TRY004
    metadata = header.pop("__metadata__")
    text = metadata.get("minitransformer")
    if not isinstance(text, str) or not isinstance(metadata.get("sha256"), str) or set(metadata) != \
            {"minitransformer", "sha256"}:
        raise ValueError(f"checkpoint {path}: not a minitransformer checkpoint (metadata keys {sorted(metadata)[:4]})")
    _check_sizes(f"checkpoint {path}", len(text.encode("utf-8")), header)
    specs, stored = {}, 0
    for name, entry in header.items():
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            raise ValueError(f"checkpoint {path}: tensor {name!r:.60} is not described by dtype, shape, data_offsets")
        code, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if code not in _DTYPES:
            raise ValueError(f"checkpoint {path}: tensor {name!r:.60} holds {code!r:.20} values; a checkpoint holds "
                             f"only bool, integer and float arrays")
        if not isinstance(shape, list) or len(shape) > MAX_NDIM or not all(_is_count(d, 2 ** 62) for d in shape) or \
                math.prod(d or 1 for d in shape) > MAX_ELEMENTS:
            raise ValueError(f"checkpoint {path}: tensor {name!r:.60} has the shape {shape!r:.80}, which no "
                             f"checkpoint tensor has")
        nbytes = math.prod(shape) * numpy.dtype(_DTYPES[code]).itemsize
        if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(o, size) for o in offsets) or \
                offsets[1] - offsets[0] != nbytes:
            raise ValueError(f"checkpoint {path}: tensor {name!r:.60} claims {nbytes:,} bytes (shape {shape}, "
                             f"{code}) but its offsets {offsets!r:.60} say otherwise: refused before allocating")
        specs[name], stored = (code, shape), stored + nbytes
    if stored != size - 8 - n:
        raise ValueError(f"checkpoint {path}: truncated or damaged: its tensors take {stored:,} bytes, the file holds "
                         f"{size - 8 - n:,} after the header")
    return metadata, specs


def _no_duplicates(pairs):
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("a key appears twice")
    return out


def _is_count(value, top) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= top


def _count(value, where: str, path: str) -> int:
    """A step, epoch or position: an int in [0, MAX_COUNT]."""
    if not _is_count(value, MAX_COUNT) and not (isinstance(value, numpy.integer) and 0 <= value <= MAX_COUNT):
        raise ValueError(f"{path}: {where} must be an integer in [0, {MAX_COUNT:,}], got {value!r:.60}")
    return int(value)


def _unflatten(node, prefix: str, where: str, lookup):
    """The inverse of ``_flatten``, checking the form as it goes; ``lookup(name, scalar)`` gives each tensor.
    Every tagged form has exactly its own keys, so the check and the rebuild cannot take different branches.
    The recursion is bounded: ``parse_json`` refused nesting deeper than MAX_JSON_DEPTH."""
    if isinstance(node, list):
        return [_unflatten(v, prefix, where, lookup) for v in node]
    if not isinstance(node, dict):
        return node
    keys = set(node)
    if not any(k.startswith("__") for k in keys):
        return {k: _unflatten(v, prefix, where, lookup) for k, v in node.items()}
    if "__array__" in keys and keys <= {"__array__", "scalar"} and isinstance(node.get("scalar", False), bool):
        name = node["__array__"]
        if not isinstance(name, str) or not re.fullmatch(rf"{prefix}/\d{{1,9}}", name):
            raise ValueError(f"{where} names the tensor {name!r:.60}, which is not one of its own ({prefix}/<n>)")
        return lookup(name, node.get("scalar", False))
    if keys == {"__tuple__"} and isinstance(node["__tuple__"], list):
        return tuple(_unflatten(v, prefix, where, lookup) for v in node["__tuple__"])
    if keys == {"__dict__"} and isinstance(node["__dict__"], list) and all(
            isinstance(kv, list) and len(kv) == 2 and isinstance(kv[0], (str, int)) and not isinstance(kv[0], bool)
            for kv in node["__dict__"]):
        return {k: _unflatten(v, prefix, where, lookup) for k, v in node["__dict__"]}
    raise ValueError(f"{where} holds a malformed entry (keys {sorted(keys)[:4]!r:.80})")


def _check_meta(where: str, meta, specs: dict) -> list:
    """Check every metadata field ``load_checkpoint`` uses against the tensors ``specs`` describes, filling the
    optional ones -> the names of the float tensors. Nothing is read: a refused file costs its header only."""
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        raise ValueError(f"{where}: not a minitransformer checkpoint (format {meta.get('format')!r:.60})"
                         if isinstance(meta, dict) else f"{where}: metadata is not a JSON object")
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise ValueError(f"{where}: format version {version!r:.20} is not supported "
                         f"(this minitransformer reads version {FORMAT_VERSION})")
    for key in ("step", "epoch", "batch", "param_names"):
        if key not in meta:
            raise ValueError(f"{where} is missing {key!r}")
    for key in ("step", "epoch", "batch"):
        meta[key] = _count(meta[key], key, where)
    names = meta["param_names"]
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
        raise ValueError(f"{where}: param_names must be a list of distinct str")
    used = [f"param/{n}" for n in names]
    for key, prefix in (("optimizer", "optim"), ("scheduler", "sched")):
        meta[key] = meta.get(key)
        _unflatten(meta[key], prefix, f"{where}: {key}", lambda name, scalar: used.append(name))
    for key in ("rng", "config", "tokenizers", "extra"):
        value = meta.get(key)
        if value is not None and not isinstance(value, dict):
            raise ValueError(f"{where}: {key} must be an object, got {type(value).__name__}")
        meta[key] = {} if value is None and key in ("tokenizers", "extra") else value
    if meta.get("run") is not None and not (isinstance(meta["run"], str) and len(meta["run"]) <= 64):
        raise ValueError(f"{where}: run must be a short string (the run's id), got {meta['run']!r:.60}")
    unknown, absent = sorted(set(specs) - set(used)), sorted(set(used) - set(specs))
    if unknown or absent:
        raise ValueError(f"{where}: holds tensors no checkpoint has ({unknown[:3]}): refused unread" if unknown else
                         f"{where}: the metadata lists tensors the file lacks ({absent[:3]})")
    for name in used[:len(names)]:
        if not specs[name][0].startswith("F"):
            raise ValueError(f"{where}: weight {name[6:]!r} holds {_DTYPES[specs[name][0]]} values; weights are floats")
    if meta["config"] is not None:
        cfg = check_config(meta["config"], where)
        needed, stored = parameter_count(cfg), sum(math.prod(specs[n][1]) for n in used[:len(names)])
        if needed > stored:
            raise ValueError(f"{where}: its config describes {needed:,} weights but the file holds "
                             f"{stored:,}: refused before building the model")
    return [n for n in dict.fromkeys(used) if specs[n][0].startswith("F")]


def _check_finite(where: str, names: list, tensors: dict) -> None:
    for name in names:
        a = tensors[name]
        if a.size and not (math.isfinite(a.min()) and math.isfinite(a.max())):    # min and max carry any NaN
            what = f"weight {name[6:]!r}" if name.startswith("param/") else f"optimiser tensor {name!r}"
            raise ValueError(f"{where}: {what} holds NaN or infinite values (the run had diverged, or the file "
                             f"was crafted)")


def check_config(config, where: str):
    """The ``TransformerConfig`` of a config dict read from a file, or ValueError naming ``where`` and the field:
    not a valid config, or a size beyond ``CONFIG_CAPS`` / ``MAX_POSITIONS`` (tables that alone would exhaust
    memory)."""
    from minitransformer.config import TransformerConfig

    if not isinstance(config, dict):
        raise ValueError(f"{where}: config must be an object, got {type(config).__name__}")  # noqa: TRY004
    for name, cap in CONFIG_CAPS.items():
        value = config.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > cap:
            raise ValueError(f"{where}: config {name} = {value!r:.40} is beyond the sizes this project supports "
                             f"(at most {cap:,})")
    try:
        cfg = TransformerConfig.from_dict(config)
    except (TypeError, ValueError, OverflowError) as err:
        raise ValueError(f"{where}: config is not a valid model config ({err})") from None
    if cfg.max_len * cfg.d_model > MAX_POSITIONS:
        raise ValueError(f"{where}: config max_len * d_model = {cfg.max_len * cfg.d_model:,} is beyond the "
                         f"sizes this project supports (at most {MAX_POSITIONS:,} positional-table entries)")
    return cfg


def parameter_count(cfg) -> int:
    """How many numbers the weights of ``Transformer(cfg)`` hold, computed without building it (a test pins it
    to ``num_parameters()``), so that a config is refused before its model is allocated."""
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


def load_checkpoint(path) -> Checkpoint:
    """Read and check one checkpoint file (see the module docstring). Returns a ``Checkpoint``.

    The file may come from anyone: it is refused with a ValueError naming the path and the field, before
    anything beyond its header is read, when it is not a regular file, is truncated or altered, is another
    format or version, holds a tensor no checkpoint has or one of another dtype than bool/int/float, a header
    beyond ``MAX_HEADER_BYTES``, nesting deeper than ``MAX_JSON_DEPTH``, a step or position outside
    [0, ``MAX_COUNT``], or a config beyond ``CONFIG_CAPS`` or describing more weights than the file holds; after
    reading, when its digest does not match or a float tensor holds NaN or inf. FileNotFoundError if there is no
    such file, IsADirectoryError for a folder.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        raise IsADirectoryError(f"checkpoint {path} is a folder, not a file (did you mean "
                                f"{os.path.join(path, LATEST)}?)")
    with open_regular(path, "checkpoint") as f:
        size = os.fstat(f.fileno()).st_size
        metadata, specs = _read_header(path, f, size)
        meta = parse_json(metadata["minitransformer"], f"checkpoint {path}: metadata")
        floats = _check_meta(f"checkpoint {path}", meta, specs)
        f.seek(0)
        data = f.read(size + 1)
    try:
        tensors = safetensors.numpy.load(data)
    except (safetensors.SafetensorError, ValueError, KeyError) as err:
        raise ValueError(f"checkpoint {path}: damaged, not a readable safetensors file ({err})") from None
    del data
    if any(str(tensors[n].dtype) != _DTYPES[c] or list(tensors[n].shape) != s for n, (c, s) in specs.items()):
        raise ValueError(f"checkpoint {path}: damaged, its tensors are not what its header describes")
    if _digest({"minitransformer": metadata["minitransformer"]}, tensors) != metadata["sha256"]:
        raise ValueError(f"checkpoint {path}: checksum mismatch, the file was altered or damaged after it was "
                         f"written (stored sha256 {metadata['sha256'][:16]:.16}...)")
    _check_finite(f"checkpoint {path}", floats, tensors)

    def tensor(name, scalar):
        return tensors[name][()] if scalar and tensors[name].shape == () else tensors[name]

    return Checkpoint(weights=OrderedDict((n, tensors[f"param/{n}"]) for n in meta["param_names"]),
                      optimizer=_unflatten(meta["optimizer"], "optim", "", tensor),
                      scheduler=_unflatten(meta["scheduler"], "sched", "", tensor), step=meta["step"],
                      epoch=meta["epoch"], batch=meta["batch"], rng=meta["rng"], config=meta["config"],
                      tokenizers=meta["tokenizers"], extra=meta["extra"], path=path, run=meta.get("run"))


def load_weights(path) -> OrderedDict:
    """Only the weights of a checkpoint (verified like ``load_checkpoint``)."""
    return load_checkpoint(path).weights


def run_of(path) -> str | None:
    """The id of the run that wrote a checkpoint, from its header alone (None: no id, or no readable header)."""
    try:
        with open_regular(path, "checkpoint") as f:
            metadata, _ = _read_header(os.fspath(path), f, os.fstat(f.fileno()).st_size)
        run = parse_json(metadata["minitransformer"], "metadata").get("run")
    except (OSError, ValueError, AttributeError):
        return None
    return run if isinstance(run, str) else None


_FLOAT32_MAX = float(numpy.finfo(numpy.float32).max)
_SECOND_MOMENT = re.compile(r"^v\.\d+$")     # Adam's running mean of squared gradients: never negative


def check_state(path, what: str, state, template) -> None:
    """Refuse (ValueError naming the file and the entry) a state read from a checkpoint that does not fit
    ``template``, the ``state_dict()`` of the object it is about to be loaded into, so that a refused load
    changes nothing: the same keys; where the template has an array, an array of its shape and kind whose values
    stay finite in the template's dtype (Adam's second moments ``v.<i>`` also >= 0); an int in [0, MAX_COUNT]
    where it has an int; a number >= 0 finite in float32 (the narrowest dtype a run uses) where it has a float;
    the same rule inside nested dicts and lists."""
    where = f"checkpoint {path}: {what}"
    if isinstance(template, dict):
        if not isinstance(state, dict):
            raise ValueError(f"{where} must be an object, got {type(state).__name__}")  # noqa: TRY004
        missing, unexpected = [k for k in template if k not in state], [k for k in state if k not in template]
        if missing:
            raise ValueError(f"checkpoint {path} is missing {what}[{missing[0]!r}]"
                             + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
        if unexpected:
            raise ValueError(f"{where} has entries this run does not have ({unexpected[:3]!r:.80})")
        for k, ref in template.items():
            check_state(path, f"{what}[{k!r}]", state[k], ref)
            if isinstance(k, str) and _SECOND_MOMENT.match(k) and state[k].size and state[k].min() < 0:
                raise ValueError(f"{where}[{k!r}] holds negative values; Adam's second moments are squares")
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
        if state.dtype.kind == "f" and state.size and \
                max(-float(state.min()), float(state.max())) > float(numpy.finfo(template.dtype).max):
            raise ValueError(f"{where} holds values beyond the range of {template.dtype}, the dtype it runs in "
                             f"(largest magnitude {max(-float(state.min()), float(state.max())):.3g})")
    elif isinstance(template, bool):
        if not isinstance(state, (bool, numpy.bool_)):
            raise ValueError(f"{where} must be true or false, got {state!r:.60}")  # noqa: TRY004
    elif isinstance(template, (int, numpy.integer)):
        _count(state, what, f"checkpoint {path}")
    elif isinstance(template, (float, numpy.floating)):
        real = (int, float, numpy.integer, numpy.floating)
        if isinstance(state, (bool, numpy.bool_)) or not isinstance(state, real) or \
                not 0 <= float(min(abs(state), 2 ** 1000)) <= _FLOAT32_MAX:
            raise ValueError(f"{where} must be a finite number >= 0 (at most {_FLOAT32_MAX:.4g}: finite in float32), "
                             f"got {state!r:.60}")
    elif template is None and state is not None:
        raise ValueError(f"{where} must be null, got {type(state).__name__}")


# ============================================================================ a run's folder: the last K, averaging

def resolve_checkpoint(path) -> str:
    """A checkpoint file from a file or a run folder (-> folder/checkpoint.safetensors). Names the path if absent."""
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
    """The step in a ``checkpoint-<step>.safetensors`` file name; None for any other name."""
    m = _STEP_FILE.match(os.path.basename(os.fspath(path)))
    return int(m.group(1)) if m else None


def list_checkpoints(directory) -> list:
    """The ``checkpoint-<step>.safetensors`` files of a folder, oldest step first (whoever wrote them)."""
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"checkpoint folder {directory} does not exist")
    found = sorted((step_of_file(name), name) for name in os.listdir(directory) if step_of_file(name) is not None)
    return [os.path.join(directory, name) for _, name in found]


def checkpoint_files(directory) -> list:
    """Every checkpoint file a ``CheckpointManager`` writes that a folder holds: its step files (oldest first),
    then checkpoint.safetensors. Empty if the folder does not exist."""
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        return []
    latest = os.path.join(directory, LATEST)
    return list_checkpoints(directory) + ([latest] if os.path.isfile(latest) else [])


def latest_checkpoint(directory) -> str | None:
    """The file to continue a folder's run from: checkpoint.safetensors, or, if that is missing (deleted by hand),
    the newest step file; None if the folder holds neither."""
    files = checkpoint_files(directory)
    return files[-1] if files else None


def _of_run(files: list, run, folder: str, doing: str) -> list:
    """The files written by ``run``; each other one is named on stderr (one line) and left out."""
    ours = []
    for path in files:
        other = run_of(path)
        if other == run:
            ours.append(path)
        else:
            print(f"checkpoint folder {folder}: {os.path.basename(path)} was not written by this run (run "
                  f"{other}, not {run}): left out of {doing}", file=sys.stderr)
    return ours


class CheckpointManager:
    """Saves ``checkpoint-<step>.safetensors`` in a folder and the same bytes as ``checkpoint.safetensors``, both
    atomically (so the latest is always a whole checkpoint), and keeps the last ``keep`` step files of its run.

    It holds the folder's lock from construction until ``close()`` or the end of the process (``files.lock_folder``:
    a second run on the folder is refused), and deletes temporary files of dead writers. Each file records the run's
    id: the id of the folder's latest checkpoint (a resumed run: ``Trainer`` refuses to save into a folder of
    another run it did not resume), else a new one. Step files of other ids are never pruned (nor averaged by
    ``last_checkpoints``): each is named on stderr and left as it is.
    """

    def __init__(self, directory, keep: int = 5):
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"CheckpointManager: keep must be a positive int, got {keep!r}")
        self.directory = os.fspath(directory)
        self.keep = keep
        self.run = None
        os.makedirs(self.directory, exist_ok=True)
        self.close = weakref.finalize(self, lock_folder(self.directory, "checkpoint folder"))
        remove_stale_temps(self.directory)

    @property
    def latest(self) -> str:
        return os.path.join(self.directory, LATEST)

    def save(self, step: int, **state) -> str:
        """Write checkpoint-<step>.safetensors and checkpoint.safetensors (``state`` as for ``save_checkpoint``),
        then delete this run's oldest step files beyond ``keep``. -> the latest's path."""
        if self.run is None:
            previous = latest_checkpoint(self.directory)
            self.run = (run_of(previous) if previous else None) or secrets.token_hex(8)
        data = pack_checkpoint(step=step, run=self.run, **state)
        for path in (os.path.join(self.directory, f"checkpoint-{int(step)}{SUFFIX}"), self.latest):
            atomic_write(path, lambda f: _write_file(f, data), "checkpoint")
        for old in _of_run(list_checkpoints(self.directory), self.run, self.directory, "pruning")[:-self.keep]:
            try:
                os.unlink(old)
            except OSError:
                pass
        return self.latest

    def checkpoints(self) -> list:
        return list_checkpoints(self.directory)


def average_checkpoints(paths) -> OrderedDict:
    """The element-wise mean of the weights of several checkpoints of one run (paper §6.1). -> {name: array}

    Every file is verified; all must come from one run, with the same parameter names and shapes. The mean is
    taken in float64 and returned in each parameter's saved dtype.
    """
    paths = [os.fspath(p) for p in paths]
    if not paths:
        raise ValueError("average_checkpoints: paths must name at least one checkpoint, got none")
    total, reference, run = None, None, None
    for path in paths:
        loaded = load_checkpoint(path)
        if total is None:
            reference = {k: (v.shape, v.dtype) for k, v in loaded.weights.items()}
            total, run = OrderedDict((k, v.astype(numpy.float64)) for k, v in loaded.weights.items()), loaded.run
            continue
        if loaded.run != run:
            raise ValueError(f"average_checkpoints: {path} was written by another run than {paths[0]} "
                             f"(run {loaded.run}, not {run}): the weights of different runs cannot be averaged")
        if list(loaded.weights) != list(reference):
            raise ValueError(f"average_checkpoints: {path} holds other parameters than {paths[0]} "
                             f"(different models cannot be averaged)")
        for k, v in loaded.weights.items():
            if v.shape != reference[k][0]:
                raise ValueError(f"average_checkpoints: parameter {k!r} has shape {v.shape} in {path} "
                                 f"but {reference[k][0]} in {paths[0]}")
            total[k] += v
    return OrderedDict((k, (v / len(paths)).astype(reference[k][1])) for k, v in total.items())


def last_checkpoints(directory, n: int, up_to_step: int | None = None) -> list:
    """The newest ``n`` step files of a folder's run (fewer if fewer exist), oldest first; with ``up_to_step``,
    the newest ``n`` whose step is at most that. The run is that of checkpoint-<up_to_step>, else of the
    folder's latest checkpoint; step files of other runs are named on stderr and left out."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"last_checkpoints: n must be a positive int, got {n!r}")
    files = list_checkpoints(directory)
    if up_to_step is not None:
        files = [p for p in files if step_of_file(p) <= up_to_step]
    named = os.path.join(os.fspath(directory), f"checkpoint-{up_to_step}{SUFFIX}")
    reference = named if up_to_step is not None and os.path.isfile(named) else latest_checkpoint(directory)
    if reference is None:
        return []
    return _of_run(files, run_of(reference), os.fspath(directory), "averaging")[-n:]
