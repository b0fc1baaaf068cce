"""Training checkpoints: one safetensors file holding everything a run needs to continue, and no pickle.

Tensors: ``param/<name>`` (the weights), ``optim/<i>`` and ``sched/<i>`` (the optimiser's and schedule's arrays).
Header metadata: ``minitransformer`` (JSON: format, step, data position, rng, config, tokenizers, extra and the
optimiser/schedule skeletons), ``run`` (the writing run's id) and ``sha256`` (of both and of every tensor).
Safetensors because strangers send each other these files: nothing runs on loading, and PyTorch, JAX and the
Hugging Face tools open it directly. The digest proves integrity, not origin, so the reader checks every field
(``checkpoint_checks``) before it reads a tensor; the writer runs the same checks, so a run never saves what it
cannot read."""

from __future__ import annotations

import hashlib
import json
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

from minitransformer import backend
from minitransformer.checks import positive_int
from minitransformer.kit import files
from minitransformer.kit.running import checkpoint_checks as checks

SUFFIX = ".safetensors"
LATEST = "checkpoint" + SUFFIX
_STEP_FILE = re.compile(r"^checkpoint-(\d+)\.safetensors$")
OLD_NAME = re.compile(r"^checkpoint(-\d+)?\.npz$")               # the .npz files of earlier versions
CODES = {numpy.dtype(name): code for code, name in checks.DTYPES.items()}


@dataclass
class Checkpoint:
    """What ``load_checkpoint`` read: the ``pack_checkpoint`` arguments, the file's path and the run's id."""

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


def _flatten(obj, prefix: str, tensors: dict):
    """A JSON-able skeleton of ``obj``, its arrays in ``tensors`` as ``prefix/<n>``. NumPy scalars too: a float32
    must come back a float32 for exact resume. What a state_dict() holds: lists, and dicts with str keys."""
    if isinstance(obj, (numpy.ndarray, numpy.generic)) or hasattr(obj, "__cuda_array_interface__"):
        key = f"{prefix}/{len(tensors)}"
        tensors[key] = backend.to_numpy(obj)
        return {"__array__": key, "scalar": isinstance(obj, numpy.generic)}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, list):
        return [_flatten(v, prefix, tensors) for v in obj]
    if isinstance(obj, dict) and all(isinstance(k, str) and not k.startswith("__") for k in obj):
        return {k: _flatten(v, prefix, tensors) for k, v in obj.items()}
    raise TypeError(f"save_checkpoint: cannot store a {type(obj).__name__} under {prefix!r}: state must be arrays, "
                    "numbers, strings, None, lists and dicts whose keys are str (not starting with '__')")


def _digest(metadata: dict, tensors: dict) -> str:
    """sha256 of the metadata (but its sha256) and of every tensor's name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256(json.dumps({k: v for k, v in metadata.items() if k != "sha256"}, sort_keys=True).encode())
    for name in sorted(tensors):
        a = tensors[name]
        h.update(f"\0{name}\0{a.dtype.str}\0{a.shape}\0".encode())
        h.update(a.reshape(-1).view(numpy.uint8))
    return h.hexdigest()


def pack_checkpoint(*, weights, optimizer=None, scheduler=None, step: int = 0, epoch: int = 0, batch: int = 0,
                    rng=None, config=None, tokenizers=None, extra=None, run=None) -> bytes:
    """The bytes of one checkpoint file (see the module docstring), checked as the reader will check them.
    weights, optimizer, scheduler: ``state_dict()``s; epoch, batch: the data position; rng:
    ``backend.get_rng_state()``; config, tokenizers, extra: JSON-able dicts; run: the writing run's id."""
    if not hasattr(weights, "items"):
        raise TypeError(f"save_checkpoint: weights must be a dict of arrays (model.state_dict()), "
                        f"got {type(weights).__name__}")
    tensors: dict = OrderedDict((f"param/{n}", backend.to_numpy(v)) for n, v in weights.items())
    if run is not None and not (isinstance(run, str) and 0 < len(run) <= 64):
        raise ValueError(f"save_checkpoint: run must be a short non-empty str (the run's id), got {run!r:.60}")
    meta = {"format": checks.FORMAT_NAME, "format_version": checks.FORMAT_VERSION, "param_names": list(weights),
            **{k: checks.count(v, k, "save_checkpoint") for k, v in dict(step=step, epoch=epoch, batch=batch).items()},
            "optimizer": None if optimizer is None else _flatten(optimizer, "optim", tensors),
            "scheduler": None if scheduler is None else _flatten(scheduler, "sched", tensors),
            "rng": rng, "config": config, "tokenizers": dict(tokenizers or {}), "extra": dict(extra or {})}
    try:
        text = json.dumps(meta)
    except (TypeError, ValueError) as err:                 # a set, an object; an int of more than 4,300 digits
        raise TypeError(f"save_checkpoint: config, tokenizers, rng and extra must be JSON-able: {err}") from None
    for name, a in tensors.items():
        if a.dtype.newbyteorder("=") not in CODES:
            raise TypeError(f"save_checkpoint: {name} is a {a.dtype} array; a checkpoint holds bool, int and float")
        tensors[name] = numpy.require(a, a.dtype.newbyteorder("<"), ["C"])    # 0-d stays 0-d
    specs = {name: (CODES[a.dtype.newbyteorder("=")], list(a.shape)) for name, a in tensors.items()}
    checks.check_sizes("save_checkpoint", len(text.encode("utf-8")), specs)
    meta = files.parse_json(text, "save_checkpoint: metadata")            # as the reader will parse it
    checks.check_meta("save_checkpoint", meta, specs)
    checks.check_finite("save_checkpoint", tensors)
    metadata = {"minitransformer": text, "run": run or ""}
    metadata["sha256"] = _digest(metadata, tensors)
    return safetensors.numpy.save(tensors, metadata=metadata)


def save_checkpoint(path, **state) -> str:
    """Write one checkpoint file (``state``: the arguments of ``pack_checkpoint``) atomically -> its path."""
    data = pack_checkpoint(**state)
    files.atomic_write(path, lambda f: _write_file(f, data), "checkpoint")
    return os.fspath(path)


def _write_file(f, data: bytes) -> None:
    """The bytes into the open temporary file (a function of its own so that tests can fail it half-way)."""
    f.write(data)


def load_checkpoint(path) -> Checkpoint:
    """Read and check one checkpoint file -> a ``Checkpoint``; whatever ``checkpoint_checks`` refuses, a wrong
    digest or a NaN/inf float is a one-line ValueError naming the file and the field."""
    path = os.fspath(path)
    with files.open_regular(path, "checkpoint") as f:
        size = os.fstat(f.fileno()).st_size
        metadata, specs = checks.read_header(path, f, size)
        meta = files.parse_json(metadata["minitransformer"], f"checkpoint {path}: metadata")
        checks.check_meta(f"checkpoint {path}", meta, specs)
        f.seek(0)
        data = f.read(size + 1)
    try:
        tensors = safetensors.numpy.load(data)
    except (safetensors.SafetensorError, ValueError, KeyError) as err:      # its tensors do not tile the file
        raise ValueError(f"checkpoint {path}: truncated or damaged, not a readable safetensors file ({err})") from None
    del data
    if _digest(metadata, tensors) != metadata["sha256"]:
        raise ValueError(f"checkpoint {path}: checksum mismatch, the file was altered or damaged after it was "
                         f"written (stored sha256 {metadata['sha256']:.16}...)")
    checks.check_finite(f"checkpoint {path}", tensors)
    return Checkpoint(**restore(meta, tensors), path=path, run=metadata["run"] or None)


def restore(meta: dict, tensors: dict) -> dict:
    """The ``pack_checkpoint`` arguments (but run) of metadata ``check_meta`` passed and its tensors."""
    def tensor(name, scalar):
        return tensors[name][()] if scalar and tensors[name].shape == () else tensors[name]

    return {"weights": OrderedDict((n, tensors[f"param/{n}"]) for n in meta["param_names"]),
            "optimizer": checks.unflatten(meta["optimizer"], "optim", "", tensor),
            "scheduler": checks.unflatten(meta["scheduler"], "sched", "", tensor),
            **{k: meta[k] for k in ("step", "epoch", "batch", "rng", "config", "tokenizers", "extra")}}


def run_of(path) -> str | None:
    """The id of the run that wrote a checkpoint, from its header alone (None: no id, no file, no readable header)."""
    try:
        with files.open_regular(path, "checkpoint") as f:
            return checks.read_header(os.fspath(path), f, os.fstat(f.fileno()).st_size)[0]["run"] or None
    except (OSError, ValueError, TypeError):                     # TypeError: no path (None)
        return None


# ----------------------------------------------------------------------------- a run folder's checkpoints

def step_of_file(path) -> int | None:
    """The step in a ``checkpoint-<step>.safetensors`` file name; None for any other name."""
    m = _STEP_FILE.match(os.path.basename(os.fspath(path)))
    return int(m.group(1)) if m else None


def list_checkpoints(directory) -> list:
    """The ``checkpoint-<step>.safetensors`` files of a folder, oldest step first (whoever wrote them)."""
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"checkpoint folder {directory} does not exist")
    return [os.path.join(directory, name) for _, name in
            sorted((step_of_file(name), name) for name in os.listdir(directory) if step_of_file(name) is not None)]


def checkpoint_files(directory) -> list:
    """A folder's step files (oldest first), then its checkpoint.safetensors; empty if there is no such folder."""
    latest = os.path.join(directory, LATEST)
    return list_checkpoints(directory) + [latest] * os.path.isfile(latest) if os.path.isdir(directory) else []


def latest_checkpoint(directory) -> str | None:
    """The file to continue a folder's run from: checkpoint.safetensors, or, if that is missing (deleted by hand),
    the newest step file; None if the folder holds neither (and no .npz checkpoints of an earlier version)."""
    found = checkpoint_files(directory)
    if not found and os.path.isdir(directory) and any(OLD_NAME.match(name) for name in os.listdir(directory)):
        raise ValueError(f"checkpoint folder {directory} holds checkpoints of an earlier version (.npz): convert them "
                         f"once with `minitransformer convert {directory}` (the old files are kept)")
    return found[-1] if found else None


def resolve_checkpoint(path) -> str:
    """The checkpoint file ``path`` names: itself, or a run folder's ``latest_checkpoint`` (FileNotFoundError: none)."""
    path = os.fspath(path)
    file = latest_checkpoint(path) if os.path.isdir(path) else path
    if file is None:
        raise FileNotFoundError(f"no checkpoint in {path}")
    return file


def _of_run(paths: list, run, folder: str, doing: str) -> list:
    """The files written by ``run``; each other one is named on stderr (one line) and left out."""
    runs = {path: run_of(path) for path in paths}
    for path in [p for p in paths if runs[p] != run]:
        print(f"checkpoint folder {folder}: {os.path.basename(path)} was not written by this run (run "
              f"{runs[path]}, not {run}): left out of {doing}", file=sys.stderr)
    return [p for p in paths if runs[p] == run]


class CheckpointManager:
    """Saves ``checkpoint-<step>.safetensors`` and the same bytes as ``checkpoint.safetensors`` (a file of its own,
    never a link: copying a backup over it must not rewrite a step file), atomically, and keeps its run's last
    ``keep`` step files. Holds the folder's lock until ``close()`` or the process ends, and deletes dead writers'
    temp files. Its run id is that of the folder's latest checkpoint (a resumed run), else new; step files of other
    ids are never pruned nor averaged: each is named on stderr and left as it is."""

    def __init__(self, directory, keep: int = 5):
        self.directory, self.run = os.fspath(directory), None
        self.latest = os.path.join(self.directory, LATEST)
        self._seen = {}                # step file -> whether this run wrote it, from its header read once
        self.keep = positive_int("CheckpointManager", "keep", keep)
        os.makedirs(self.directory, exist_ok=True)
        self.close = weakref.finalize(self, files.lock_folder(self.directory, "checkpoint folder"))
        files.remove_stale_temps(self.directory)

    def save(self, step: int, **state) -> str:
        """Write both files (``state``: the arguments of ``pack_checkpoint``), then prune. -> the latest's path."""
        if self.run is None:
            self.run = run_of(latest_checkpoint(self.directory)) or secrets.token_hex(8)
        data = pack_checkpoint(step=step, run=self.run, **state)
        step_file = os.path.join(self.directory, f"checkpoint-{int(step)}{SUFFIX}")
        for path in (step_file, self.latest):
            files.atomic_write(path, lambda f: _write_file(f, data), "checkpoint")
        self._seen[step_file] = True
        found = list_checkpoints(self.directory)
        new = [p for p in found if p not in self._seen]                       # each header is read once
        ours = _of_run(new, self.run, self.directory, "pruning")
        self._seen.update((p, p in ours) for p in new)
        for old in [p for p in found if self._seen[p]][:-self.keep]:
            files.remove_quietly(old)
            del self._seen[old]
        return self.latest


def average_checkpoints(paths) -> OrderedDict:
    """The element-wise mean of the weights of checkpoints of one run (paper §6.1), each verified, taken in
    float64 and returned in each parameter's saved dtype. -> {name: array}"""
    paths = [os.fspath(p) for p in paths]
    if not paths:
        raise ValueError("average_checkpoints: paths must name at least one checkpoint, got none")
    first = load_checkpoint(paths[0])
    total = OrderedDict((k, v.astype(numpy.float64)) for k, v in first.weights.items())
    for path in paths[1:]:
        loaded = load_checkpoint(path)
        if loaded.run != first.run:
            raise ValueError(f"average_checkpoints: {path} was written by another run than {paths[0]} "
                             f"(run {loaded.run}, not {first.run}): the weights of different runs cannot be averaged")
        if [(k, v.shape) for k, v in loaded.weights.items()] != [(k, v.shape) for k, v in total.items()]:
            raise ValueError(f"average_checkpoints: {path} holds other parameters or shapes than {paths[0]} "
                             f"(different models cannot be averaged)")
        for k, v in loaded.weights.items():
            total[k] += v
    return OrderedDict((k, (v / len(paths)).astype(first.weights[k].dtype)) for k, v in total.items())


def last_checkpoints(directory, n: int, up_to_step: int | None = None) -> list:
    """The newest ``n`` step files of a folder's run (fewer if fewer exist), oldest first; with ``up_to_step``,
    the newest ``n`` whose step is at most that. The run is that of checkpoint-<up_to_step>, else of the
    folder's latest checkpoint; step files of other runs are named on stderr and left out."""
    positive_int("last_checkpoints", "n", n)
    found = [p for p in list_checkpoints(directory) if up_to_step is None or step_of_file(p) <= up_to_step]
    named = os.path.join(os.fspath(directory), f"checkpoint-{up_to_step}{SUFFIX}")
    reference = named if up_to_step is not None and os.path.isfile(named) else latest_checkpoint(directory)
    return [] if reference is None else _of_run(found, run_of(reference), os.fspath(directory), "averaging")[-n:]
