"""Synthetic sequence tasks: copy (The Annotated Transformer's first example) and reverse. The source is a random
string of symbols (ids 4 .. 4 + num_symbols - 1, after the tokenisers' specials), the target the same string or
reversed. Copying is the smallest check that the encoder-decoder learns at all; reversing needs a non-monotonic
alignment, an anti-diagonal in the attention plot.

Batch ``i`` of epoch ``e`` is drawn from ``numpy.random.default_rng([seed, e, i])``, so a resumed run gets exactly
the batches an uninterrupted run would have seen. The held-out set has a generator of its own, the same for every
seed; from length 6 on a held-out string is one of a million or more that training has almost surely never seen:
exact match on them measures generalisation.

    >>> SequenceTask("reverse").sample(numpy.random.default_rng(0), 2)   # doctest: +NORMALIZE_WHITESPACE
    [([9, 6, 7, 4, 4, 4, 5, 12, 10], [10, 12, 5, 4, 4, 4, 7, 6, 9]),
     ([9, 10, 13, 11, 10, 9, 9], [9, 9, 10, 11, 13, 10, 9])]
"""

from dataclasses import dataclass

import numpy

from minitransformer import checks
from minitransformer.kit.data.batching import Batch, ResumableBatches, collate, translate_ids

FIRST_SYMBOL = 4                      # after <pad>, <bos>, <eos>, <unk>
HELDOUT_SEED = 1_000_003
TASKS = ("copy", "reverse")


@dataclass(frozen=True)
class SequenceTask:
    """A synthetic task: name "copy" or "reverse"; num_symbols distinct symbols (ids FIRST_SYMBOL ..); a source
    length drawn uniformly in [min_len, max_len]."""

    name: str = "copy"
    num_symbols: int = 10
    min_len: int = 1
    max_len: int = 10

    def __post_init__(self):
        checks.one_of("SequenceTask", "name", self.name, TASKS)
        for field in ("num_symbols", "min_len", "max_len"):
            checks.positive_int("SequenceTask", field, getattr(self, field))
        if self.min_len > self.max_len:
            raise ValueError(f"SequenceTask: min_len must be <= max_len, got {self.min_len} > {self.max_len}")

    @property
    def vocab_size(self) -> int:
        """Specials plus symbols: the size of both the source and the target vocabulary."""
        return FIRST_SYMBOL + self.num_symbols

    def sample(self, rng: numpy.random.Generator, n: int) -> list:
        """``n`` random (src, tgt) pairs of id lists."""
        lengths = rng.integers(self.min_len, self.max_len + 1, size=n)                 # (n,)
        symbols = rng.integers(FIRST_SYMBOL, self.vocab_size, size=(n, self.max_len))  # (n, max_len)
        sources = [row[:k].tolist() for k, row in zip(lengths, symbols)]
        return [(src, list(src) if self.name == "copy" else src[::-1]) for src in sources]

    def batch(self, seed: int, epoch: int, index: int, batch_size: int) -> Batch:
        """Batch ``index`` of ``epoch``: a deterministic function of (seed, epoch, index)."""
        return collate(self.batch_pairs(seed, epoch, index, batch_size))

    def batch_pairs(self, seed: int, epoch: int, index: int, batch_size: int) -> list:
        """The (src, tgt) pairs of that batch."""
        return self.sample(numpy.random.default_rng([int(seed), int(epoch), int(index)]), batch_size)

    def heldout(self, n: int = 1000) -> list:
        """The held-out set: ``n`` (src, tgt) pairs, the same for every training seed."""
        checks.positive_int("SequenceTask.heldout", "n", n)
        return self.sample(numpy.random.default_rng([HELDOUT_SEED, self.num_symbols, self.max_len]), n)


class TaskBatches(ResumableBatches):
    """A task's resumable training stream (``batching.ResumableBatches``): ``batches_per_epoch`` batches of
    ``batch_size`` pairs per epoch, each generated on demand from (seed, epoch, index)."""

    def __init__(self, task: SequenceTask, batch_size: int = 64, batches_per_epoch: int = 100, seed: int = 0):
        self.task, self.seed = task, checks.int_in("TaskBatches", "seed", seed, 0, 2**63 - 1)
        self.batch_size = checks.positive_int("TaskBatches", "batch_size", batch_size)
        self.batches_per_epoch = checks.positive_int("TaskBatches", "batches_per_epoch", batches_per_epoch)

    def __len__(self) -> int:
        return self.batches_per_epoch

    def pairs_at(self, epoch: int, k: int) -> list:
        return self.task.batch_pairs(self.seed, epoch, k, self.batch_size)


def heldout_batches(pairs: list, batch_size: int = 250) -> list:
    """The held-out pairs as padded batches (in order), e.g. for a validation loss."""
    return [collate(pairs[i:i + batch_size]) for i in range(0, len(pairs), batch_size)]


def exact_match(model, pairs: list, batch_size: int = 250, max_len: int | None = None, beam_size: int = 1,
                alpha: float = 0.6) -> float:
    """Fraction of pairs whose decoding (greedy, or beam search if beam_size > 1) equals the target exactly, at most
    max_len tokens (default: source length + 2) decoded per pair; the model is left in eval mode."""
    if not pairs:
        raise ValueError("exact_match: pairs must hold at least one (src, tgt) pair, got none")
    model.eval()
    limit = (lambda S: S + 2) if max_len is None else (lambda S: max_len)
    hyps = translate_ids(model, [src for src, _ in pairs], beam_size, alpha, batch_size, length_limit=limit)
    return sum(list(h) == list(tgt) for h, (_, tgt) in zip(hyps, pairs)) / len(pairs)
