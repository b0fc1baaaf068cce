"""What a checkpoint file may hold, checked before it costs anything: the header (``read_header``, no tensor read),
the metadata against the tensors and the config against the weights held (``check_meta``), the values read
(``check_finite``), and what a resume would load against the run's own state (``check_resumable``). Each refusal is
a one-line ValueError naming the file and the field; the bounds are ``minitransformer.kit.limits``'."""

from __future__ import annotations

import math
import numbers
import re

import numpy

from minitransformer import backend
from minitransformer.budget import parameter_count
from minitransformer.config import TransformerConfig
from minitransformer.kit import files, limits
from minitransformer.kit.data.tokenizers import check_size
from minitransformer.kit.limits import CONFIG_CAPS, MAX_COUNT
from minitransformer.kit.running.settings import check_saved_settings

FORMAT_NAME = "minitransformer-checkpoint"
FORMAT_VERSION = 2                         # 1 was the .npz format (``npz.convert_npz`` reads it)
DTYPES = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "U16": "uint16", "I16": "int16", "U32": "uint32",
          "I32": "int32", "U64": "uint64", "I64": "int64", "F16": "float16", "F32": "float32", "F64": "float64"}
_FLOAT32_MAX = float(numpy.finfo(numpy.float32).max)
_SECOND_MOMENT = re.compile(r"^v\.\d+$")   # Adam's running mean of squared gradients: never negative
COUNTERS = ("train_seconds", "train_cpu_seconds", "tokens_seen", "skipped")    # a Trainer's, saved and resumed


def check_sizes(where: str, meta_bytes: int, specs: dict) -> None:
    if meta_bytes > limits.MAX_META_BYTES:
        raise ValueError(f"{where}: its metadata is {meta_bytes:,} bytes, more than a checkpoint may hold "
                         f"(limits.MAX_META_BYTES = {limits.MAX_META_BYTES:,}): keep extra (histories) smaller")
    if len(specs) > limits.MAX_ENTRIES:
        raise ValueError(f"{where}: holds {len(specs):,} tensors, more than a checkpoint has "
                         f"(limits.MAX_ENTRIES = {limits.MAX_ENTRIES:,})")


def read_header(path: str, f, size: int) -> tuple:
    """(metadata, {name: (dtype code, shape)}) of the open file, no tensor read: what the limits or the file's size
    rule out is refused unread. The layout (each tensor's offsets, the file covered) is safetensors' to check as it
    loads; it reads the same header by the same rules (of a repeated name, the last counts in both)."""
    head = f.read(8)
    if head.startswith(b"PK\x03\x04"):
        raise ValueError(f"checkpoint {path} is in the .npz format of earlier versions: convert it once with "
                         f"`minitransformer convert {path}` (the old file is kept)")
    n, where = int.from_bytes(head, "little"), f"checkpoint {path}"
    if len(head) < 8 or n > limits.MAX_HEADER_BYTES or 8 + n > size:
        raise ValueError(f"{where}: not a safetensors file, or truncated (its first 8 bytes announce a header of "
                         f"{n:,} bytes, the file has {size:,}; at most {limits.MAX_HEADER_BYTES:,}): refused unread")
    header = files.parse_json(f.read(n), f"{where}: header")
    metadata = header.pop("__metadata__", None) if isinstance(header, dict) else None
    if not isinstance(metadata, dict) or sorted(metadata) != ["minitransformer", "run", "sha256"] or \
            not all(isinstance(v, str) for v in metadata.values()) or len(metadata["run"]) > 64:
        raise ValueError(f"{where}: not a minitransformer checkpoint (no minitransformer metadata in its header)")
    check_sizes(where, len(metadata["minitransformer"].encode("utf-8")), header)
    specs = {}
    for name, entry in header.items():
        code, shape = (entry.get("dtype"), entry.get("shape")) if isinstance(entry, dict) and len(entry) == 3 \
            else (None, None)
        if code not in DTYPES:
            raise ValueError(f"{where}: tensor {name!r:.60} holds {code!r:.20} values; a checkpoint holds only bool, "
                             f"integer and float arrays")
        axes = isinstance(shape, list) and len(shape) <= limits.MAX_NDIM and all(_is_count(d, 2 ** 62) for d in shape)
        if not axes or math.prod(d or 1 for d in shape) > limits.MAX_ELEMENTS or \
                math.prod(shape) * numpy.dtype(DTYPES[code]).itemsize > size:     # (0, 2**62): no tensor of ours
            raise ValueError(f"{where}: tensor {name!r:.60} has the shape {shape!r:.80}, which no tensor of a "
                             f"{size:,}-byte file has: refused before allocating")
        specs[name] = (code, shape)
    return metadata, specs


def _is_count(value, top) -> bool:
    return isinstance(value, (int, numpy.integer)) and not isinstance(value, bool) and 0 <= value <= top


def count(value, what: str, where: str) -> int:
    """A step, epoch or position: an int in [0, MAX_COUNT]."""
    if not _is_count(value, MAX_COUNT):
        raise ValueError(f"{where}: {what} must be an integer in [0, {MAX_COUNT:,}], got {value!r:.60}")
    return int(value)


def unflatten(node, prefix: str, where: str, lookup):
    """The inverse of ``checkpoint._flatten``, checking the form; ``lookup(name, scalar)`` gives each tensor. One
    function checks and rebuilds, so the two cannot take different branches (depth: bounded by ``parse_json``)."""
    if isinstance(node, list):
        return [unflatten(v, prefix, where, lookup) for v in node]
    keys = set(node) if isinstance(node, dict) else None
    if keys is None or not any(k.startswith("__") for k in keys):
        return node if keys is None else {k: unflatten(v, prefix, where, lookup) for k, v in node.items()}
    if "__array__" in keys and keys <= {"__array__", "scalar"} and isinstance(node.get("scalar", False), bool):
        name = node["__array__"]
        if not isinstance(name, str) or not re.fullmatch(rf"{prefix}/\d{{1,9}}", name):
            raise ValueError(f"{where} names the tensor {name!r:.60}, which is not one of its own ({prefix}/<n>)")
        return lookup(name, node.get("scalar", False))
    raise ValueError(f"{where} holds a malformed entry (keys {sorted(keys)[:4]!r:.80})")


def check_meta(where: str, meta, specs: dict) -> None:
    """Check every metadata field against the tensors ``specs`` describes, filling the optional ones. Nothing is
    read: a refused file costs its header only."""
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        raise ValueError(f"{where}: not a minitransformer checkpoint (format "
                         f"{meta.get('format') if isinstance(meta, dict) else meta!r:.60})")
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{where}: format version {meta.get('format_version')!r:.20} is not supported "
                         f"(this minitransformer reads version {FORMAT_VERSION})")
    for key in ("step", "epoch", "batch", "param_names"):
        if key not in meta:
            raise ValueError(f"{where} is missing {key!r}")
    meta.update({key: count(meta[key], key, where) for key in ("step", "epoch", "batch")})
    names = meta["param_names"]
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
        raise ValueError(f"{where}: param_names must be a list of distinct str")
    used = [f"param/{n}" for n in names]
    for key, prefix in (("optimizer", "optim"), ("scheduler", "sched")):
        meta[key] = meta.get(key)
        unflatten(meta[key], prefix, f"{where}: {key}", lambda name, scalar: used.append(name))
    for key in ("rng", "config", "tokenizers", "extra"):
        value = meta.get(key)
        if value is not None and not isinstance(value, dict):
            raise ValueError(f"{where}: {key} must be an object, got {type(value).__name__}")
        meta[key] = {} if value is None and key in ("tokenizers", "extra") else value
    for side, text in meta["tokenizers"].items():           # parsed later, by whoever translates: bounded here
        if not isinstance(text, str):
            raise ValueError(f"{where}: tokenizers.{side:.20} must be a tokenizer's JSON as a string, got "
                             f"{type(text).__name__}")
        check_size(text, f"{where}: tokenizers.{side:.20}")
    if isinstance(meta["extra"].get("settings"), dict):    # a run's settings: checked here, for every command
        meta["extra"]["settings"] = check_saved_settings(meta["extra"]["settings"], None, where, complete=False)
    unknown, absent = sorted(set(specs) - set(used)), sorted(set(used) - set(specs))
    if unknown or absent:
        raise ValueError(f"{where}: holds tensors no checkpoint has ({unknown[:3]}): refused unread" if unknown else
                         f"{where}: the metadata lists tensors the file lacks ({absent[:3]})")
    weights = used[:len(names)]
    for name in weights:
        if not specs[name][0].startswith("F"):
            raise ValueError(f"{where}: weight {name[6:]!r} holds {DTYPES[specs[name][0]]} values; weights are floats")
    if meta["config"] is not None:
        needed = parameter_count(check_config(meta["config"], where))
        stored = sum(math.prod(specs[n][1]) for n in weights)
        if needed > stored:
            raise ValueError(f"{where}: its config describes {needed:,} weights but the file holds {stored:,}: "
                             f"refused before building the model")


def check_finite(where: str, tensors: dict) -> None:
    for name, a in tensors.items():                          # min and max carry any NaN
        if a.dtype.kind == "f" and a.size and not (math.isfinite(a.min()) and math.isfinite(a.max())):
            what = f"weight {name[6:]!r}" if name.startswith("param/") else f"optimiser tensor {name!r}"
            raise ValueError(f"{where}: {what} holds NaN or infinite values (the run had diverged, or the file "
                             f"was crafted)")


def check_config(config, where: str):
    """The ``TransformerConfig`` of a config dict read from a file (a dict: ``check_meta`` saw to it); ValueError
    naming ``where`` and the field for an invalid one or a size beyond ``CONFIG_CAPS`` / ``MAX_POSITIONS``."""
    for name, cap in CONFIG_CAPS.items():
        value = config.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > cap:
            raise ValueError(f"{where}: config {name} = {value!r:.40} is beyond the sizes this project supports "
                             f"(at most {cap:,})")
    try:
        cfg = TransformerConfig.from_dict(config)
    except (TypeError, ValueError, OverflowError) as err:
        raise ValueError(f"{where}: config is not a valid model config ({err})") from None
    if cfg.max_len * cfg.d_model > limits.MAX_POSITIONS:
        raise ValueError(f"{where}: config max_len * d_model = {cfg.max_len * cfg.d_model:,} is beyond the sizes "
                         f"this project supports (at most {limits.MAX_POSITIONS:,} positional-table entries)")
    return cfg


def full_config(config):
    """A config dict with every field's default filled in (older checkpoints lack d_k, positional); else as it is."""
    try:
        return TransformerConfig.from_dict(config).to_dict()
    except (TypeError, ValueError):
        return config


def check_state(path, what: str, state, template) -> None:
    """Refuse a state that does not fit ``template``, the ``state_dict()`` it will be loaded into, before anything
    changes: the same keys; arrays of the template's shape and kind, finite in its dtype (Adam's ``v.<i>`` >= 0);
    ints in [0, MAX_COUNT]; floats >= 0 finite in float32; any other value of the template's type."""
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
    elif backend.is_array(template):                          # weights on the device too
        if not isinstance(state, numpy.ndarray) or state.shape != tuple(template.shape):
            got = state.shape if isinstance(state, numpy.ndarray) else type(state).__name__
            raise ValueError(f"{where} must be an array of shape {tuple(template.shape)}, got {got}")
        if (state.dtype.kind == "f") != (template.dtype.kind == "f"):
            raise ValueError(f"{where} holds {state.dtype} values, this run {template.dtype}")
        narrower = state.dtype.kind == template.dtype.kind == "f" and state.dtype.itemsize > template.dtype.itemsize
        largest = max(-float(state.min()), float(state.max())) if narrower and state.size else 0.0   # finite: read
        if largest > float(numpy.finfo(template.dtype).max if narrower else math.inf):
            raise ValueError(f"{where} holds values beyond the range of {template.dtype}, the dtype it runs in "
                             f"(largest magnitude {largest:.3g})")
    elif isinstance(template, (float, numpy.floating)):
        real = isinstance(state, numbers.Real) and not isinstance(state, bool)      # numpy's bool is no Real
        if not (real and 0 <= float(min(state, 2 ** 1000)) <= _FLOAT32_MAX):        # min: a huge int stays finite
            raise ValueError(f"{where} must be a finite number >= 0 (at most {_FLOAT32_MAX:.4g}: finite in float32), "
                             f"got {state!r:.60}")
    elif isinstance(template, (int, numpy.integer)) and not isinstance(template, bool):
        count(state, what, f"checkpoint {path}")
    elif type(state) is not type(template):      # a bool, str or None; a list by its type (no state_dict() holds one)
        raise ValueError(f"{where} must be a {type(template).__name__}, got {type(state).__name__}")


def check_resumable(trainer, ck) -> dict:
    """Refuse a checkpoint ``trainer`` cannot continue exactly: another config, or any state unfit for this run's
    ``state_dict()``s; all checked before anything loads, so a refused resume changes nothing. -> the training state."""
    path, state = ck.path, ck.extra.get("trainer")
    saved, ours = full_config(ck.config), full_config(trainer.config)
    if saved is not None and ours is not None and saved != ours:
        changed = sorted(k for k in set(saved) | set(ours) if saved.get(k) != ours.get(k))
        raise ValueError(f"Trainer.resume: checkpoint {path} was trained with another model config "
                         f"(differs in {changed}); build the model from the checkpoint's config to resume")
    if not isinstance(state, dict):
        raise ValueError(f"Trainer.resume: checkpoint {path} holds no training state (was it written by Trainer?)")
    check_state(path, "weights", ck.weights, {name: p.data for name, p in trainer.model.named_parameters()})
    check_state(path, "optimizer", ck.optimizer, {**trainer.optimizer.state_dict(), "lr": 0.0})      # lr: any rate >= 0
    if trainer.scheduler is not None:
        check_state(path, "scheduler", ck.scheduler, trainer.scheduler.state_dict())
        for key, value in ck.scheduler.items():
            if key != "step" and isinstance(value, (int, float)) and not value > 0:
                raise ValueError(f"checkpoint {path}: scheduler[{key!r}] must be positive, got {value}")
    state = {"train_cpu_seconds": 0.0, **state}                     # a field that older checkpoints lack
    for key in ("data", "history", "valid_history", *COUNTERS):
        if key not in state:
            raise ValueError(f"checkpoint {path} is missing the training state's {key!r}")
    check_state(path, "the training state's data position", state["data"], trainer.train_data.state_dict())
    if hasattr(trainer.train_data, "__len__") and state["data"].get("position", 0) > len(trainer.train_data):
        raise ValueError(f"checkpoint {path}: the data position {state['data']['position']} is beyond the "
                         f"{len(trainer.train_data)} batches of an epoch of this run's data")
    # tokens_seen as a number, not a count: a long run reads more tokens than limits.MAX_COUNT
    check_state(path, "the training state", {k: state[k] for k in COUNTERS}, dict(zip(COUNTERS, (0.0, 0.0, 0.0, 0))))
    for key, width in (("history", 4), ("valid_history", 3)):
        rows = state[key]
        if not isinstance(rows, list) or not all(isinstance(r, list) and len(r) == width and all(map(_number, r))
                                                 and type(r[0]) is int and 0 <= r[0] <= MAX_COUNT for r in rows):
            raise ValueError(f"checkpoint {path}: the training state's {key} must be a list of [{width} numbers] rows, "
                             f"a step first")
    return state


def _number(value) -> bool:
    """A JSON number that converts to a float (NaN and infinity included: a history may hold them)."""
    return isinstance(value, float) or (type(value) is int and abs(value) <= 2 ** 53)
