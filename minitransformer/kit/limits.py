"""The one table of the kit's limits: what a run, a model, a file and a corpus may be. The command line, the
checkpoint writer and reader, resume and evaluate read their bounds here, so whatever ``train`` accepts and saves the
others accept too (the core guards its own entry points). The bounds sit far beyond the paper's big model (d_model
1024, 16 heads, 6+6 layers, d_ff 4096): they refuse a typo or a crafted file before any allocation."""

import argparse

from minitransformer.decoding import MAX_BEAM
from minitransformer.fast.parallel import MAX_WORKERS

# A count of steps, epochs or batches (not of tokens seen: see check_resumable).
MAX_COUNT = 10 ** 9

# The sizes a TransformerConfig may have.
CONFIG_CAPS = {"src_vocab_size": 1_000_000, "tgt_vocab_size": 1_000_000, "d_model": 8192, "num_heads": 1024,
               "d_k": 8192, "d_v": 8192, "d_ff": 65536, "num_encoder_layers": 128, "num_decoder_layers": 128,
               "max_len": 8192}
MAX_POSITIONS = 1 << 24       # max_len * d_model: the sinusoidal table each side builds (not stored in a file)

# Integer settings of a run, (lowest, highest): what the command line parses, a run saves and resume reads back
# (beam_size and workers: the bounds beam search and DataParallel hold themselves).
INT_SETTINGS = {
    "seed": (0, MAX_COUNT), "steps": (1, MAX_COUNT), "epochs": (1, MAX_COUNT), "warmup": (1, MAX_COUNT),
    "batch_size": (1, 65_536), "max_tokens": (1, 10 ** 7), "vocab_size": (1, CONFIG_CAPS["src_vocab_size"]),
    "eval_every": (1, MAX_COUNT), "save_every": (1, MAX_COUNT), "keep": (1, 10 ** 6), "average": (1, 10 ** 6),
    "heldout": (1, 100_000), "beam_size": (1, MAX_BEAM), "limit": (1, MAX_COUNT), "workers": (1, MAX_WORKERS),
    "max_entries": (1, 1_000_000),
}

# Real-valued settings of a run: (lowest, highest, which ends belong: "[]", "(]" or "[)"). Bounded on both sides so
# that no product of them (a learning rate, a length penalty, minutes in seconds) overflows or underflows to 0.
FLOAT_SETTINGS = {
    "max_minutes": (0.0, 1e7, "(]"), "target": (0.0, 100.0, "[]"), "lr_factor": (1e-6, 100.0, "[]"),
    "label_smoothing": (0.0, 1.0, "[)"), "clip_norm": (1e-6, 1e6, "[]"), "dropout": (0.0, 0.99, "[]"),
    "alpha": (0.0, 10.0, "[]"), "timeout": (0.0, 3600.0, "(]"),
}

# A run's history keeps this many rows (~80 bytes each); past it the older ones are thinned evenly, so a run of any
# length saves metadata far below MAX_META_BYTES.
MAX_HISTORY = 20_000

# Checkpoint files (safetensors): the most the reader walks, and so the most the writer writes.
MAX_META_BYTES = 64 << 20     # the JSON metadata: vocabularies, merges and a bounded history take a few MB
MAX_ENTRIES = 100_000         # tensors in one file (a model has hundreds, its optimiser twice as many)
MAX_HEADER_BYTES = MAX_META_BYTES + 200 * MAX_ENTRIES   # the whole header: metadata plus ~100 bytes per tensor
MAX_NDIM = 8
MAX_ELEMENTS = 1 << 40        # elements of one tensor, an empty axis counted as 1: (0, 2**62) is no tensor of ours
MAX_JSON_DEPTH = 64           # nesting in any JSON a file brings (metadata, tokenizers): ours is about 6 levels
MAX_INFLATION = 16            # earlier .npz checkpoints: numpy.savez stores arrays uncompressed, never 1000-fold
# One tokeniser's JSON (its vocabulary, and a BPE's merges), in a checkpoint or a file, refused above this before it
# is parsed: parsing costs about ten times the text in memory. Multi30k's shared BPE of 8,000 takes 0.23 MB, a million
# words of eight letters (the vocab_size cap) about 12 MB; a run's two tokenisers fit in MAX_META_BYTES.
MAX_TOKENIZER_BYTES = 16 << 20

# One side of one split of a corpus, counted as it streams in (a gzip that expands without end stops here):
# 64 times Multi30k's largest file (2 million characters, 29,000 lines), within about 1 GB of memory.
MAX_CORPUS_CHARS = 1 << 27
MAX_CORPUS_LINES = 1 << 22
# One line of a corpus, refused as soon as it passes this: a line is a sentence, and everything after reading
# (tokenising, learning BPE, batching) costs in proportion to its longest line. Multi30k's longest is 254 characters;
# 256 times that leaves room for any sentence while a line costs kilobytes, not the gigabytes of a 2^27 one.
MAX_LINE_CHARS = 1 << 16


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
    """Whether value is of the setting's kind (an int for an integer setting, never a bool) and in its range."""
    low, high, ends = bounds(name)
    kinds = (int, float) if name in FLOAT_SETTINGS else (int,)
    if isinstance(value, bool) or not isinstance(value, kinds):
        return False
    return (low < value if ends[0] == "(" else low <= value) and (value < high if ends[1] == ")" else value <= high)


def option(p, flag: str, help: str, setting: str | None = None, **kw) -> None:
    """Add to parser ``p`` a numeric option whose range is the setting's (by default the one the flag names:
    --max-tokens, max_tokens): the text as an int or float inside it, else an error saying what was expected and what
    came (argparse prints it, exit code 2)."""
    setting = setting or flag[2:].replace("-", "_")
    convert = float if setting in FLOAT_SETTINGS else int

    def parse(text: str):
        try:
            value = convert(text) if len(text) <= 40 else None    # no 400-digit number reaches any arithmetic
        except ValueError:
            value = None
        if value is None or not within(setting, value):
            raise argparse.ArgumentTypeError(f"expected {expected(setting)}, got {text[:60]!r}")
        return value
    parse.setting = setting                                   # which limit it reads: tests walk every one
    p.add_argument(flag, type=parse, metavar="N", help=f"{help}; {expected(setting)}", **kw)
