"""Each task's tuned settings, and the settings of a `train` run: those defaults with the options typed.

"model" overrides the preset's sizes when no --preset is given; every value can be changed on the command line.
The measurements behind the numbers are in benchmarks/RESULTS.md, "Why the task defaults are what they are".
"""

from __future__ import annotations

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
    # German->English Multi30k: the small preset, shared BPE 8000, 85 minutes on 2 CPU cores
    "multi30k": {"preset": "small", "model": {},
                 "max_tokens": 4000, "epochs": 20, "steps": None, "lr_factor": 0.8, "warmup": 800, "clip_norm": 1.0,
                 "label_smoothing": 0.1, "eval_every": 500, "save_every": 1000, "target": None, "vocab_size": 8000,
                 "max_minutes": 85.0},
}
TASKS = tuple(TASK_DEFAULTS)

# The model options of `train` and the TransformerConfig field each one sets (--layers: both stacks).
MODEL_OPTIONS = {"dropout": "dropout", "d_model": "d_model", "heads": "num_heads", "layers": "num_encoder_layers",
                 "d_ff": "d_ff"}

# The other `train` options that become settings of the same name when given.
_SETTING_OPTIONS = ("seed", "max_minutes", "target", "batch_size", "max_tokens", "lr_factor", "warmup",
                    "label_smoothing", "clip_norm", "vocab_size", "eval_every", "save_every", "keep", "heldout",
                    "beam_size", "data_dir", "on_nonfinite", "progress", "plots", "limit", "reference")


def task_settings(args) -> dict:
    """The task's defaults, overridden by every option given on the command line."""
    d = TASK_DEFAULTS[args.task]
    s = {k: v for k, v in d.items() if k != "model"}
    s.update(task=args.task, seed=0, epochs=d.get("epochs"), max_minutes=d.get("max_minutes"), keep=5,
             heldout=1000, beam_size=1, on_nonfinite="stop", progress=True, plots=True, preset=d["preset"],
             model=dict(d["model"]), data_dir=None, limit=None, reference=False)
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
    return s
