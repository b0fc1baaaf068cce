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
    "alpha": (0.0, 10.0, "[]"), "timeout": (0.0, 3600.0, "(]"),
}

# A run's history (one row per step, one per evaluation) keeps every row up to this many: past it, the older rows
# are thinned evenly (kit/running/train.py), so a run of any length saves metadata far below MAX_META_BYTES
# (a row takes ~80 bytes).
MAX_HISTORY = 20_000

# Checkpoint files (safetensors): what the reader walks at most before it refuses, and so what the writer refuses
# to write, so that a run never saves a file it cannot read back.
MAX_META_BYTES = 64 << 20     # the JSON metadata: vocabularies, merges and a bounded history take a few MB
MAX_ENTRIES = 100_000         # tensors in one file (a model has hundreds, its optimiser twice as many)
MAX_HEADER_BYTES = MAX_META_BYTES + 200 * MAX_ENTRIES   # the whole header: metadata plus ~100 bytes per tensor
MAX_NDIM = 8
MAX_ELEMENTS = 1 << 40        # elements of one tensor, an empty axis counted as 1: (0, 2**62) is no tensor of ours
MAX_JSON_DEPTH = 64           # nesting in any JSON a file brings (metadata, tokenizers): ours is about 6 levels
MAX_INFLATION = 16            # earlier .npz checkpoints: numpy.savez stores arrays uncompressed, never 1000-fold

# ----------------------------------------------------------------------------- what a piece of work may cost
# Text and work whose cost grows with what a stranger hands over: bounded before (or while) it is read.

# One side of one split of a corpus, counted in decoded characters and lines as it streams in (a gzip that
# expands without end is refused at the limit). Multi30k's largest file holds 2 million characters in 29,000
# lines; these bounds hold 64 times that and keep the lines read within about 1 GB of memory.
MAX_CORPUS_CHARS = 1 << 27
MAX_CORPUS_LINES = 1 << 22

# The memory one call may plan to use (``minitransformer.budget``): building a model, decoding, a training step.
# A fixed default, so that a call is accepted or refused alike on every machine; the environment variable
# MINITRANSFORMER_MEMORY_BUDGET ("16G") or a check's budget= argument raises or lowers it.
MEMORY_BUDGET = 4 << 30

# Beams of beam search, and DataParallel's workers: the API takes what the command line's --beam-size, --workers take.
MAX_BEAM_SIZE = INT_SETTINGS["beam_size"][1]
MAX_WORKERS = INT_SETTINGS["workers"][1]


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
