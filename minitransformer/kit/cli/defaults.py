"""Each task's tuned settings, and the settings of a `train` run: those defaults with the options typed.

"model" overrides the preset's sizes when no --preset is given; every value can be changed on the command line.
The measurements behind the numbers are in benchmarks/RESULTS.md, "Why the task defaults are what they are".
"""

from __future__ import annotations

import argparse
import math

from minitransformer.kit.running.checkpoint import CONFIG_CAPS, MAX_COUNT

PRESETS = ("tiny", "small", "base")

# one encoder and one decoder layer of width 32: the symbol tasks need no more, and each step stays cheap
_SYMBOL_MODEL = {"d_model": 32, "num_heads": 2, "d_ff": 64, "dropout": 0.0, "num_encoder_layers": 1,
                 "num_decoder_layers": 1}

TASK_DEFAULTS = {
    # copy: the symbol model, batches of 64, stopping at 100% exact match, within seconds on a CPU
    "copy": {"preset": "tiny", "model": _SYMBOL_MODEL,
             "batch_size": 64, "steps": 3000, "lr_factor": 0.5, "warmup": 50, "clip_norm": 1.0,
             "label_smoothing": 0.0, "eval_every": 100, "save_every": 500, "target": 1.0},
    # reverse: the copy settings with more steps, since the alignment runs backwards
    "reverse": {"preset": "tiny", "model": _SYMBOL_MODEL,
                "batch_size": 64, "steps": 10000, "lr_factor": 0.5, "warmup": 50, "clip_norm": 1.0,
                "label_smoothing": 0.0, "eval_every": 200, "save_every": 1000, "target": 1.0},
    # toy English->German: the tiny preset with dropout, word vocabularies, stopping at BLEU 99, within minutes
    "toy": {"preset": "tiny", "model": {"dropout": 0.1},
            "max_tokens": 2000, "steps": 3000, "lr_factor": 1.0, "warmup": 200, "clip_norm": 1.0,
            "label_smoothing": 0.1, "eval_every": 250, "save_every": 250, "target": 99.0},
    # German->English Multi30k: the small preset, shared BPE 8000, 43 minutes on 2 CPU cores; a checkpoint every
    # 100 steps and the mean of the last 4 scored (paper §6.1), the count that scored best on the validation set
    "multi30k": {"preset": "small", "model": {},
                 "max_tokens": 4000, "epochs": 20, "steps": None, "lr_factor": 0.8, "warmup": 800, "clip_norm": 1.0,
                 "label_smoothing": 0.1, "eval_every": 500, "save_every": 100, "keep": 5, "average": 4,
                 "target": None, "vocab_size": 8000, "max_minutes": 43.0},
}
TASKS = tuple(TASK_DEFAULTS)

# The model options of `train` and the TransformerConfig field each one sets (--layers: both stacks).
MODEL_OPTIONS = {"dropout": "dropout", "d_model": "d_model", "heads": "num_heads", "layers": "num_encoder_layers",
                 "d_ff": "d_ff", "d_k": "d_k", "positional": "positional", "norm_first": "norm_first"}

# The other `train` options that become settings of the same name when given.
_SETTING_OPTIONS = ("seed", "max_minutes", "target", "batch_size", "max_tokens", "lr_factor", "warmup",
                    "label_smoothing", "clip_norm", "vocab_size", "eval_every", "save_every", "keep", "average",
                    "heldout", "beam_size", "data_dir", "on_nonfinite", "progress", "plots", "limit", "reference", "workers")

# Every task trains with the batch split across two worker threads (fast.DataParallel), one per core of the
# 2-core machines this project measures on (benchmarks/bench_parallel.py): the toy task's steps ~1.4x faster
# than on one model, the small and base presets' ~1.1-1.2x faster than one model with two BLAS threads. The
# reference tier trains on one, so that a run can be stepped through.
WORKERS = 2


def task_settings(args) -> dict:
    """The task's defaults, overridden by every option given on the command line."""
    d = TASK_DEFAULTS[args.task]
    s = {k: v for k, v in d.items() if k != "model"}
    s.update(task=args.task, seed=0, epochs=d.get("epochs"), max_minutes=d.get("max_minutes"),
             keep=d.get("keep", 5), average=d.get("average", 1),
             heldout=1000, beam_size=1, on_nonfinite="stop", progress=True, plots=True, preset=d["preset"],
             model=dict(d["model"]), data_dir=None, limit=None, reference=False, workers=None)
    if args.preset is not None:
        s["preset"], s["model"] = args.preset, {}
    for key in _SETTING_OPTIONS:
        value = getattr(args, key, None)
        if value is not None:
            s[key] = value
    if args.steps is not None:
        s["steps"], s["epochs"] = args.steps, None
    if args.epochs is not None:
        s["epochs"], s["steps"] = args.epochs, None
    for option, field in MODEL_OPTIONS.items():
        value = getattr(args, option)
        if value is not None:
            s["model"][field] = value
    if args.layers is not None:
        s["model"]["num_decoder_layers"] = args.layers            # --layers sets both stacks
    if s["workers"] is None:
        s["workers"] = 1 if s["reference"] else WORKERS
    return s


# ============================================================================ the settings a checkpoint holds

def _int(low: int, high: int):
    return (lambda v: isinstance(v, int) and not isinstance(v, bool) and low <= v <= high,
            f"an integer in [{low:,}, {high:,}]")


def _number(accept, expected: str):
    return (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and accept(v), expected)


_POSITIVE = _number(lambda v: 0 < v < math.inf, "a positive number")
_BOOL = (lambda v: isinstance(v, bool), "true or false")


def _one_of(choices):
    return (lambda v: v in choices, f"one of {', '.join(choices)}")


# What each setting of a saved run may be (a checkpoint may come from anyone). The bounds are the parser's,
# plus caps on what would otherwise exhaust memory or time before the first step (held-out set, batch,
# beam): no run of this project comes near them. None is allowed for the settings in CAN_BE_NONE.
SETTING_RULES = {
    "task": _one_of(TASKS), "preset": _one_of(PRESETS), "on_nonfinite": _one_of(("stop", "skip")),
    "seed": _int(0, 2 ** 63 - 1), "steps": _int(1, MAX_COUNT), "epochs": _int(1, MAX_COUNT),
    "max_minutes": _POSITIVE, "target": _number(math.isfinite, "a finite number"),
    "batch_size": _int(1, 65_536), "max_tokens": _int(1, 10 ** 7), "lr_factor": _POSITIVE,
    "warmup": _int(1, MAX_COUNT), "label_smoothing": _number(lambda v: 0 <= v < 1, "a number in [0, 1)"),
    "clip_norm": _POSITIVE, "vocab_size": _int(1, CONFIG_CAPS["src_vocab_size"]), "eval_every": _int(1, MAX_COUNT),
    "save_every": _int(1, MAX_COUNT), "keep": _int(1, 10 ** 6), "average": _int(1, 10 ** 6),
    "heldout": _int(1, 100_000),
    "beam_size": _int(1, 100), "limit": _int(1, MAX_COUNT), "data_dir": (lambda v: isinstance(v, str), "a path"),
    "progress": _BOOL, "plots": _BOOL, "reference": _BOOL, "workers": _int(1, 1024),
}
CAN_BE_NONE = ("steps", "epochs", "max_minutes", "target", "clip_norm", "vocab_size", "eval_every", "save_every",
               "limit", "data_dir")
MODEL_FIELDS = (*MODEL_OPTIONS.values(), "num_decoder_layers")
# Runs saved before these settings existed: fast-tier runs (reference) on the whole batch (workers 1), scored
# on their last model (average 1).
OPTIONAL_SAVED = ("reference", "workers", "average")


def saved_setting_names(task: str) -> set:
    """The settings a `train --task <task>` run saves: those of ``task_settings`` with nothing typed."""
    untyped = argparse.Namespace(task=task, **dict.fromkeys(("preset", "steps", "epochs", *_SETTING_OPTIONS,
                                                            *MODEL_OPTIONS)))
    return set(task_settings(untyped))


def check_saved_settings(saved, task: str, where: str, complete: bool) -> dict:
    """The settings a checkpoint holds, checked against SETTING_RULES (ValueError naming ``where`` and the
    setting). complete: every setting a run of ``task`` saves must be there (to resume it); else only those
    present are checked. Unknown names are dropped."""
    if not isinstance(saved, dict):
        raise ValueError(f"{where}: settings must be an object, got {type(saved).__name__}")  # noqa: TRY004
    if complete:
        missing = sorted(saved_setting_names(task) - set(saved) - set(OPTIONAL_SAVED))
        if missing:
            raise ValueError(f"{where} is missing settings.{missing[0]}"
                             + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    checked = {}
    for name, value in saved.items():
        if name == "model":
            checked[name] = _check_model_settings(value, where)
        elif name in SETTING_RULES:
            accept, expected = SETTING_RULES[name]
            if not (value is None and name in CAN_BE_NONE) and not accept(value):
                raise ValueError(f"{where}: settings.{name} must be {expected}, got {value!r:.60}")
            checked[name] = value
    if complete and all(checked.get(k) is None for k in ("steps", "epochs", "max_minutes")):
        raise ValueError(f"{where}: settings give no end to the run (steps, epochs and max_minutes are all null)")
    return checked


def _check_model_settings(model, where: str) -> dict:
    if not isinstance(model, dict) or not set(model) <= set(MODEL_FIELDS):
        raise ValueError(f"{where}: settings.model must be an object with keys among {MODEL_FIELDS}, got {model!r:.80}")
    for name, value in model.items():
        accept, expected = {"dropout": _number(lambda v: 0 <= v < 1, "a number in [0, 1)"),
                            "positional": (lambda v: v in ("sinusoidal", "learned"), '"sinusoidal" or "learned"'),
                            "norm_first": _BOOL}.get(name) or _int(1, CONFIG_CAPS[name])
        if not accept(value):
            raise ValueError(f"{where}: settings.model.{name} must be {expected}, got {value!r:.60}")
    return dict(model)
