"""The one table of limits: what a run, a model, a file and a piece of work may be.

Every place that accepts a value from outside reads its bounds here: the command line's parser, the API's
constructors, the checkpoint writer and reader, resume and evaluate. So whatever ``train`` accepts and saves,
``--resume``, ``evaluate`` and ``translate`` accept too, by construction. The bounds sit far beyond any model or run
this project makes (the paper's big model: d_model 1024, 16 heads, 6+6 layers, d_ff 4096, 300,000 steps); they exist
so that a typo or a crafted file is refused in one line before any arithmetic or allocation, never after.
"""

from __future__ import annotations

# A count of steps, epochs, batches or tokens seen.
MAX_COUNT = 10 ** 9

# The sizes a TransformerConfig may have.
CONFIG_CAPS = {"src_vocab_size": 1_000_000, "tgt_vocab_size": 1_000_000, "d_model": 8192, "num_heads": 1024,
               "d_k": 8192, "d_ff": 65536, "num_encoder_layers": 128, "num_decoder_layers": 128, "max_len": 8192}
MAX_POSITIONS = 1 << 24       # max_len * d_model: the sinusoidal table each side builds (not stored in a file)

# Integer settings of a run: (lowest, highest). The command line parses into these ranges, a run saves only values
# inside them, and resume / evaluate / translate read the same ranges back.
INT_SETTINGS = {
    "seed": (0, MAX_COUNT), "steps": (1, MAX_COUNT), "epochs": (1, MAX_COUNT), "warmup": (1, MAX_COUNT),
    "batch_size": (1, 65_536), "max_tokens": (1, 10 ** 7), "vocab_size": (1, CONFIG_CAPS["src_vocab_size"]),
    "eval_every": (1, MAX_COUNT), "save_every": (1, MAX_COUNT), "keep": (1, 10 ** 6), "average": (1, 10 ** 6),
    "heldout": (1, 100_000), "beam_size": (1, 100), "limit": (1, MAX_COUNT), "workers": (1, 1024),
    "max_entries": (1, 1_000_000),
}

# Real-valued settings of a run: (lowest, highest, which ends belong: "[]", "(]" or "[)"). Bounded on both sides so
# that no product of them (a learning rate, a length penalty, minutes in seconds) overflows or underflows to 0.
FLOAT_SETTINGS = {
    "max_minutes": (0.0, 1e7, "(]"), "target": (0.0, 100.0, "[]"), "lr_factor": (1e-6, 100.0, "[]"),
    "label_smoothing": (0.0, 1.0, "[)"), "clip_norm": (1e-6, 1e6, "[]"), "dropout": (0.0, 0.99, "[]"),
    "alpha": (0.0, 10.0, "[]"),
}

# A run's history (one row per step, one per evaluation) keeps at most this many rows: past it, the older rows
# are thinned evenly, so a run of any length saves metadata far below MAX_META_BYTES (a row takes ~80 bytes).
MAX_HISTORY = 100_000

# Checkpoint files: what the reader walks at most before it refuses.
MAX_META_BYTES = 64 << 20     # the JSON metadata: vocabularies, merges and a bounded history take a few MB
MAX_ENTRIES = 100_000         # tensors in one file (a model has hundreds, its optimiser twice as many)
MAX_NDIM = 8


def bounds(name: str) -> tuple:
    """(lowest, highest, which ends belong) of a setting of INT_SETTINGS, FLOAT_SETTINGS, or a size of CONFIG_CAPS."""
    if name in FLOAT_SETTINGS:
        return FLOAT_SETTINGS[name]
    if name in INT_SETTINGS:
        return (*INT_SETTINGS[name], "[]")
    return (2 if name == "d_model" else 1, CONFIG_CAPS[name], "[]")     # d_model even: sines and cosines in pairs


def expected(name: str) -> str:
    """The range of a setting in words: "an integer in [1, 1,000,000,000]", "a number in (0, 100]"."""
    low, high, ends = bounds(name)
    if name in FLOAT_SETTINGS:
        return f"a number in {ends[0]}{low:g}, {high:g}{ends[1]}"
    return f"an integer in [{low:,}, {high:,}]"


def within(name: str, value) -> bool:
    """Whether a value (from a command line, a file or a caller) is one the setting may have: the right kind of
    number (an int for an integer setting, never a bool) inside its range. NaN is never inside."""
    low, high, ends = bounds(name)
    kinds = (int, float) if name in FLOAT_SETTINGS else (int,)
    if isinstance(value, bool) or not isinstance(value, kinds):
        return False
    return (low < value if ends[0] == "(" else low <= value) and (value < high if ends[1] == ")" else value <= high)
