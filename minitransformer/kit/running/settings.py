"""A training run's settings: each task's tuned defaults (in the command line's units: copy/reverse ``target`` in
percent), those with the options typed (``task_settings``), and the check of the settings a checkpoint holds. Ranges:
``minitransformer.kit.limits``; why the defaults: benchmarks/RESULTS.md, "Why the task defaults are what they are"."""

from __future__ import annotations

import textwrap

from minitransformer import config
from minitransformer.kit import limits
from minitransformer.kit.data.tasks import TASKS as SEQUENCE_TASKS

PRESETS = tuple(config.PRESETS)

# copy: one encoder and one decoder layer of width 32 (the symbol tasks need no more, and each step stays cheap),
# batches of 64, stopping at 100% exact match, within seconds on a CPU
_COPY = {"preset": "tiny", "model": {"d_model": 32, "num_heads": 2, "d_ff": 64, "dropout": 0.0,
                                    "num_encoder_layers": 1, "num_decoder_layers": 1},
         "batch_size": 64, "steps": 3000, "lr_factor": 0.5, "warmup": 50, "clip_norm": 1.0, "label_smoothing": 0.0,
         "eval_every": 100, "save_every": 500, "target": 100}

TASK_DEFAULTS = {
    "copy": _COPY,
    # reverse: the copy settings with more steps, since the alignment runs backwards
    "reverse": {**_COPY, "steps": 10000, "eval_every": 200, "save_every": 1000},
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

# Every task trains with the batch split across two worker threads (fast.DataParallel), one per core of the
# 2-core machines this project measures on (benchmarks/bench_parallel.py); the reference tier on one, so that
# a run can be stepped through.
WORKERS = 2

# What every task's run holds besides its table entry.
_COMMON = {"seed": 0, "epochs": None, "max_minutes": None, "keep": 5, "average": 1, "heldout": 1000,
           "beam_size": 1, "on_nonfinite": "stop", "progress": True, "plots": True, "data_dir": None,
           "limit": None, "reference": False, "workers": None}

# The model options of `train` and the TransformerConfig field each one sets (--layers: both stacks).
MODEL_OPTIONS = {"dropout": "dropout", "d_model": "d_model", "heads": "num_heads", "layers": "num_encoder_layers",
                 "d_ff": "d_ff", "d_k": "d_k", "d_v": "d_v", "positional": "positional", "norm_first": "norm_first"}


def task_settings(task: str, typed: dict | None = None) -> dict:
    """The settings of a run of ``task``: its defaults, replaced by the options ``typed`` (as the parser gives them)."""
    typed = typed or {}
    d = TASK_DEFAULTS[task]
    s = {**_COMMON, **{k: v for k, v in d.items() if k != "model"}, "task": task, "model": dict(d["model"])}
    if "preset" in typed:
        s["model"] = {}                                    # a preset replaces the task's model
    if "steps" in typed or "epochs" in typed:              # exclusive options: one replaces the other
        s["steps"] = s["epochs"] = None
    s.update((option, value) for option, value in typed.items() if option not in MODEL_OPTIONS)
    s["model"].update((MODEL_OPTIONS[option], value) for option, value in typed.items() if option in MODEL_OPTIONS)
    if "layers" in typed:
        s["model"]["num_decoder_layers"] = typed["layers"]
    if task in SEQUENCE_TASKS and s["target"] is not None:
        s["target"] = s["target"] / 100                   # exact match is a fraction
    if s["workers"] is None:
        s["workers"] = 1 if s["reference"] else WORKERS
    return s


def defaults_table() -> str:
    """Each task's defaults as the options that set them, for ``train --help``."""
    names = {field: option for option, field in MODEL_OPTIONS.items()}
    lines = ["each task's defaults (an option given replaces its value; --preset replaces the model options):"]
    for task, d in TASK_DEFAULTS.items():
        model = {names.get(k): v for k, v in d["model"].items() if k != "num_decoder_layers"}
        options = {"preset": d["preset"], **model, **{k: v for k, v in d.items() if k not in ("preset", "model")}}
        text = " ".join(f"--{k.replace('_', '-')}\xa0{v}" for k, v in options.items() if v is not None)
        lines.append(textwrap.fill(text, 110, initial_indent=f"  {task:<9} ", subsequent_indent=" " * 12,
                                   break_on_hyphens=False))              # nor inside an option, at its \xa0
    return "\n".join(lines).replace("\xa0", " ")


_CHOICES = {"task": TASKS, "preset": PRESETS, "on_nonfinite": ("stop", "skip"), "positional": config.POSITIONAL}
_BOOLS = ("progress", "plots", "reference", "norm_first")
CAN_BE_NONE = ("steps", "epochs", "max_minutes", "target", "clip_norm", "vocab_size", "eval_every", "save_every",
               "limit", "data_dir")
MODEL_FIELDS = (*MODEL_OPTIONS.values(), "num_decoder_layers")
# Runs saved before these settings existed: fast-tier runs (reference) on the whole batch (workers 1), scored
# on their last model (average 1).
OPTIONAL_SAVED = {"reference": False, "workers": 1, "average": 1}


def _expected(name: str, value):
    """None if ``value`` is one the setting may have, else the words for what it must be."""
    if name in _CHOICES:
        return None if value in _CHOICES[name] else f"one of {', '.join(_CHOICES[name])}"
    if name in _BOOLS:
        return None if isinstance(value, bool) else "true or false"
    if name == "data_dir":
        return None if isinstance(value, str) else "a path"
    return None if limits.within(name, value) else limits.expected(name)


def check_saved_settings(saved: dict, task: str | None, where: str, complete: bool) -> dict:
    """The one schema of a run's settings, checked against the ranges ``train`` accepts (ValueError naming ``where``
    and the setting) by ``train`` and wherever a checkpoint is read or written (``check_meta``); complete:
    ``check_complete`` too. -> the settings, unknown names dropped."""
    if complete:
        check_complete(saved, task, where)
    known = set(limits.INT_SETTINGS) | set(limits.FLOAT_SETTINGS) | set(_CHOICES) | set(_BOOLS) | {"data_dir"}
    checked = {name: value for name, value in saved.items() if name in known or name == "model"}
    model = checked.get("model", {})
    if not isinstance(model, dict) or not set(model) <= set(MODEL_FIELDS):
        raise ValueError(f"{where}: settings.model must be an object with keys among {MODEL_FIELDS}, got {model!r:.80}")
    fields = [(n, n, v) for n, v in checked.items() if n != "model" and (v is not None or n not in CAN_BE_NONE)]
    for field, key, got in fields + [(f"model.{k}", k, v) for k, v in model.items()]:
        if expected := _expected(key, got):
            raise ValueError(f"{where}: settings.{field} must be {expected}, got {got!r:.60}")
    return checked


def check_complete(saved: dict, task: str, where: str) -> None:
    """All that a run of ``task`` saves is there, and the run has an end: what a resume needs beyond valid values."""
    missing = sorted(set(task_settings(task)) - set(saved) - set(OPTIONAL_SAVED))
    if missing:
        raise ValueError(f"{where} is missing settings.{missing[0]}"
                         + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    if all(saved.get(k) is None for k in ("steps", "epochs", "max_minutes")):
        raise ValueError(f"{where}: settings give no end to the run (steps, epochs and max_minutes are all null)")
