"""Synthetic sequence tasks: copy (The Annotated Transformer's first example) and reverse.

A source sentence is a random string of symbols; the target is the same string (copy) or the same string
backwards (reverse). No tokeniser, no corpus: the ids are the symbols. Copying is the smallest check that the
whole encoder-decoder learns at all; reversing needs attention that walks the source backwards while the
output walks forwards, a non-monotonic alignment, which the attention plot shows as an anti-diagonal.

Ids: 0 <pad>, 1 <bos>, 2 <eos>, 3 <unk> (as in the tokenisers; <unk> never appears here), then the
symbols 4 .. 4 + num_symbols - 1.

Data order is a pure function of the seed: batch ``i`` of epoch ``e`` is drawn from
``numpy.random.default_rng([seed, e, i])``. A resumed run therefore gets exactly the batches an
uninterrupted run would have seen, without replaying the ones before (see ``train.Trainer``).
The held-out set comes from a generator of its own (``HELDOUT_SEED``), the same for every training seed.
Short strings cannot be held out (there are only 10 + 100 + 1000 strings of length 1 to 3 over 10 symbols,
and training sees them all); from length 6 on, a held-out string is one of a million or more, which
training has almost surely never seen: exact match on them measures generalisation, not memory.

    >>> make_pairs("reverse", n=2, seed=0)   # doctest: +NORMALIZE_WHITESPACE
    [([9, 6, 7, 4, 4, 4, 5, 12, 10], [10, 12, 5, 4, 4, 4, 7, 6, 9]),
     ([9, 10, 13, 11, 10, 9, 9], [9, 9, 10, 11, 13, 10, 9])]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy

from minitransformer.kit.data.batching import Batch, ResumableBatches, collate
from minitransformer.kit.data.tokenizers import BOS, EOS, PAD

FIRST_SYMBOL = 4                      # after <pad>, <bos>, <eos>, <unk>
HELDOUT_SEED = 1_000_003
TASKS = ("copy", "reverse")


@dataclass(frozen=True)
class SequenceTask:
    """A synthetic task: a random symbol string in, a function of it out.

    name         "copy" (target = source) or "reverse" (target = source reversed)
    num_symbols  how many distinct symbols (ids FIRST_SYMBOL ..)
    min_len, max_len   source length, drawn uniformly in [min_len, max_len]
    """

    name: str = "copy"
    num_symbols: int = 10
    min_len: int = 1
    max_len: int = 10

    def __post_init__(self):
        if self.name not in TASKS:
            raise ValueError(f"SequenceTask: name must be one of {TASKS}, got {self.name!r}")
        for field in ("num_symbols", "min_len", "max_len"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, numpy.integer)) or value < 1:
                raise ValueError(f"SequenceTask: {field} must be a positive int, got {value!r}")
        if self.min_len > self.max_len:
            raise ValueError(f"SequenceTask: min_len must be <= max_len, got {self.min_len} > {self.max_len}")

    @property
    def vocab_size(self) -> int:
        """Specials plus symbols: the size of both the source and the target vocabulary."""
        return FIRST_SYMBOL + self.num_symbols

    def target(self, src: list) -> list:
        """The output the model must produce for ``src`` (ids, without <bos>/<eos>)."""
        return list(src) if self.name == "copy" else list(src)[::-1]

    def sample(self, rng: numpy.random.Generator, n: int) -> list:
        """``n`` random (src, tgt) pairs of id lists."""
        lengths = rng.integers(self.min_len, self.max_len + 1, size=n)                 # (n,)
        symbols = rng.integers(FIRST_SYMBOL, self.vocab_size, size=(n, self.max_len))  # (n, max_len)
        pairs = []
        for length, row in zip(lengths, symbols):
            src = [int(s) for s in row[:length]]
            pairs.append((src, self.target(src)))
        return pairs

    def batch(self, seed: int, epoch: int, index: int, batch_size: int) -> Batch:
        """Batch ``index`` of ``epoch``: a deterministic function of (seed, epoch, index)."""
        rng = numpy.random.default_rng([int(seed), int(epoch), int(index)])
        return collate(self.sample(rng, batch_size), pad_id=PAD, bos_id=BOS, eos_id=EOS)

    def heldout(self, n: int = 1000) -> list:
        """The held-out set: ``n`` (src, tgt) pairs, the same for every training seed."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"SequenceTask.heldout: n must be a positive int, got {n!r}")
        return self.sample(numpy.random.default_rng([HELDOUT_SEED, self.num_symbols, self.max_len]), n)

    def to_dict(self) -> dict:
        return {"name": self.name, "num_symbols": self.num_symbols, "min_len": self.min_len, "max_len": self.max_len}

    @classmethod
    def from_dict(cls, data: dict) -> SequenceTask:
        return cls(**{k: data[k] for k in ("name", "num_symbols", "min_len", "max_len") if k in data})


def make_pairs(name: str, n: int, seed: int = 0, **task_options) -> list:
    """``n`` random (src, tgt) pairs of the task ``name`` ("copy" | "reverse"), a function of ``seed``."""
    return SequenceTask(name, **task_options).sample(numpy.random.default_rng(seed), n)


class TaskBatches(ResumableBatches):
    """The training stream of a task: ``batches_per_epoch`` batches of ``batch_size`` pairs per epoch.

    The resumable protocol of ``batching.ResumableBatches``: state_dict() = {seed, epoch, position}.
    Each batch is generated on demand from (seed, epoch, index), so resuming mid-epoch costs nothing.
    """

    def __init__(self, task: SequenceTask, batch_size: int = 64, batches_per_epoch: int = 100, seed: int = 0):
        for name, value in (("batch_size", batch_size), ("batches_per_epoch", batches_per_epoch)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"TaskBatches: {name} must be a positive int, got {value!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"TaskBatches: seed must be a non-negative int, got {seed!r}")
        self.task, self.batch_size, self.batches_per_epoch, self.seed = task, batch_size, batches_per_epoch, seed
        self.epoch, self.position = 0, 0

    def __len__(self) -> int:
        return self.batches_per_epoch

    def batch_at(self, epoch: int, k: int) -> Batch:
        """Batch k of an epoch, generated from (seed, epoch, k)."""
        return self.task.batch(self.seed, epoch, k, self.batch_size)


def heldout_batches(pairs: list, batch_size: int = 250) -> list:
    """The held-out pairs as padded batches (in order), e.g. for a validation loss."""
    return [collate(pairs[i:i + batch_size], pad_id=PAD, bos_id=BOS, eos_id=EOS)
            for i in range(0, len(pairs), batch_size)]


def exact_match(model, pairs: list, batch_size: int = 250, max_len: int | None = None, beam_size: int = 1,
                alpha: float = 0.6) -> float:
    """Fraction of pairs whose decoding equals the target exactly (in [0, 1]): greedy, or beam search
    with ``beam_size`` > 1 and length penalty ``alpha``.

    Sources are sorted by length before batching, so batches carry little padding. The model is put in eval mode
    (and left there).
    """
    from minitransformer.decoding import beam_search, greedy_decode

    if not pairs:
        raise ValueError("exact_match: pairs must hold at least one (src, tgt) pair, got none")
    model.eval()
    order = sorted(range(len(pairs)), key=lambda i: len(pairs[i][0]))
    correct = 0
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        length = max(len(pairs[i][0]) for i in idx)
        src = numpy.full((len(idx), length), PAD, dtype=numpy.int64)                   # (B,S)
        for row, i in enumerate(idx):
            src[row, :len(pairs[i][0])] = pairs[i][0]
        limit = max_len if max_len is not None else length + 2
        hyps = (beam_search(model, src, beam_size=beam_size, alpha=alpha, max_len=limit) if beam_size > 1
                else greedy_decode(model, src, max_len=limit))
        correct += sum(list(h) == list(pairs[i][1]) for h, i in zip(hyps, idx))
    return correct / len(pairs)
