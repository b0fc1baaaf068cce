"""Batches for translation: sentences grouped by length, padded, sized by a token budget.

The paper (§5.1): "Sentence pairs were batched together by approximate sequence length. Each training batch
contained a set of sentence pairs containing approximately 25000 source tokens and 25000 target tokens."

Here a batch holds as many pairs of similar length as fit in ``max_tokens`` on each side, counting padding:
rows * longest source <= max_tokens and rows * (longest target + 1) <= max_tokens (the target gains
<bos> / <eos>). Sorting by length first keeps the
padding small; shuffling the order of the batches (with a seed) keeps training stochastic.

The decoder is trained with teacher forcing: it reads the target shifted right by one and predicts the next
token at every position (the paper's "output embeddings are offset by one position"):

    target        ein hund
    tgt_in   <bos> ein hund            what the decoder reads   (B,T)
    tgt_out  ein   hund <eos>          what it must predict     (B,T)

All arrays are int64 NumPy arrays on the host; the model and the loss move them to the device. Padding (id 0) only
ever appears at the end of a row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy

from minitransformer import backend
from minitransformer.kit.data.tokenizers import BOS, EOS, PAD


@dataclass
class Batch:
    """One padded batch.   src (B,S), tgt_in (B,T), tgt_out (B,T): int64; indices (B,): rows of the dataset.

    num_src_tokens / num_tgt_tokens count the real (non-pad) tokens of src and tgt_out; the loss averages
    over num_tgt_tokens, and tokens per second is measured with them.
    """

    src: numpy.ndarray
    tgt_in: numpy.ndarray
    tgt_out: numpy.ndarray
    indices: numpy.ndarray
    num_src_tokens: int
    num_tgt_tokens: int

    def __len__(self) -> int:
        return self.src.shape[0]


def _check_pairs(pairs, where: str) -> list:
    if isinstance(pairs, (str, bytes)) or not hasattr(pairs, "__len__"):
        raise TypeError(f"{where}: pairs must be a list of (src_ids, tgt_ids), got {type(pairs).__name__}")
    for i, pair in enumerate(pairs):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(f"{where}: pairs[{i}] must be a (src_ids, tgt_ids) pair, got {type(pair).__name__}")
        for side, ids in zip(("source", "target"), pair):
            if isinstance(ids, (str, bytes)) or not hasattr(ids, "__len__"):
                raise TypeError(f"{where}: pairs[{i}] {side} must be a list of int token ids, got {type(ids).__name__}")
        if len(pair[0]) == 0:
            raise ValueError(f"{where}: pairs[{i}] has an empty source; every source needs at least one token")
    return pairs


def _row_ids(ids, row: int, indices, side: str) -> numpy.ndarray:
    """One sentence's ids as a 1-D integer array.   Shapes: (L,) int"""
    try:
        ids = numpy.asarray(ids)                                # (L,)
    except ValueError:                                          # ragged nesting
        ids = numpy.asarray(ids, dtype=object)
    if ids.size == 0:
        return ids.astype(numpy.int64)                         # an empty target is fine: it becomes <eos> alone
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        where = f"pairs[{row}]" if indices is None else f"pairs[{row}] (dataset row {indices[row]})"
        raise TypeError(f"collate: {where} {side} must be a flat list of int token ids, "
                        f"got shape {ids.shape} dtype {ids.dtype}")
    return ids


def collate(pairs, indices=None, pad_id: int = PAD, bos_id: int = BOS, eos_id: int = EOS) -> Batch:
    """Pad a list of (src_ids, tgt_ids) into a Batch: tgt_in = <bos> + tgt, tgt_out = tgt + <eos>.

    indices: the pairs' positions in the dataset, one per pair (stored on the batch, default 0..B-1).
    """
    pairs = _check_pairs(pairs, "collate")
    if len(pairs) == 0:
        raise ValueError("collate: pairs must not be empty")
    for name, value in (("pad_id", pad_id), ("bos_id", bos_id), ("eos_id", eos_id)):
        if isinstance(value, bool) or not isinstance(value, (int, numpy.integer)) or value < 0:
            raise ValueError(f"collate: {name} must be an int >= 0, got {value!r}")
    B = len(pairs)
    if indices is not None:
        indices = numpy.asarray(indices, dtype=numpy.int64)    # (B,)
        if indices.shape != (B,):
            raise ValueError(f"collate: indices must have one entry per pair, shape ({B},), got shape {indices.shape}")
    S = max(len(src) for src, _ in pairs)
    T = max(len(tgt) for _, tgt in pairs) + 1                   # one more for <bos> / <eos>
    src = numpy.full((B, S), pad_id, dtype=numpy.int64)          # (B,S)
    tgt_in = numpy.full((B, T), pad_id, dtype=numpy.int64)       # (B,T)
    tgt_out = numpy.full((B, T), pad_id, dtype=numpy.int64)      # (B,T)
    for row, (s, t) in enumerate(pairs):
        s, t = _row_ids(s, row, indices, "source"), _row_ids(t, row, indices, "target")  # a float would be truncated
        src[row, : len(s)] = s
        tgt_in[row, 0] = bos_id
        tgt_in[row, 1: len(t) + 1] = t
        tgt_out[row, : len(t)] = t
        tgt_out[row, len(t)] = eos_id
    if min(int(src.min()), int(tgt_out.min())) < 0:
        raise ValueError(f"collate: pairs must hold token ids >= 0, got a negative id in source or target "
                         f"(rows {numpy.flatnonzero((src < 0).any(axis=1) | (tgt_out < 0).any(axis=1)).tolist()[:5]})")
    indices = numpy.arange(B, dtype=numpy.int64) if indices is None else indices  # (B,)
    num_src = sum(len(s) for s, _ in pairs)
    num_tgt = sum(len(t) + 1 for _, t in pairs)
    return Batch(src, tgt_in, tgt_out, indices, int(num_src), int(num_tgt))


def plan_batches(src_lengths, tgt_lengths, max_tokens: int, rng: numpy.random.Generator | None = None) -> list:
    """Split pair indices into batches of similar length within the token budget. -> list of index arrays.

    Pairs are sorted by (source length, target length); rng (if given) breaks ties at random, so batches mix
    differently from epoch to epoch. Then pairs are taken in that order, and a batch is closed when one more
    pair would push rows * longest source, or rows * (longest target + 1), above max_tokens.
    """
    src_len = numpy.asarray(src_lengths, dtype=numpy.int64)     # (N,)
    tgt_len = numpy.asarray(tgt_lengths, dtype=numpy.int64) + 1  # (N,) with <bos> / <eos>
    if src_len.shape != tgt_len.shape or src_len.ndim != 1:
        raise ValueError(f"plan_batches: src_lengths and tgt_lengths must be 1-D of equal length, "
                         f"got {src_len.shape} and {tgt_len.shape}")
    longest = int(max(src_len.max(initial=0), tgt_len.max(initial=0)))
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, (int, numpy.integer)) or max_tokens < longest:
        raise ValueError(f"plan_batches: max_tokens must be an int at least as large as the longest sequence "
                         f"({longest} tokens, counting <bos>/<eos>), got {max_tokens!r}; raise it or drop long pairs")
    tiebreak = rng.random(len(src_len)) if rng is not None else numpy.arange(len(src_len))  # (N,)
    order = numpy.lexsort((tiebreak, tgt_len, src_len))         # (N,) last key sorts first
    batches, start, max_s, max_t = [], 0, 0, 0
    for pos, (s_i, t_i) in enumerate(zip(src_len[order].tolist(), tgt_len[order].tolist())):
        s, t = max(max_s, s_i), max(max_t, t_i)
        rows = pos - start + 1
        if rows > 1 and (rows * s > max_tokens or rows * t > max_tokens):
            batches.append(order[start:pos])               # close the batch before this pair
            start, s, t = pos, s_i, t_i
        max_s, max_t = s, t
    if start < len(order):
        batches.append(order[start:])
    return batches


class ResumableBatches:
    """The stream protocol the Trainer reads, shared by every training source.

    Iterating serves the rest of the current epoch from ``position`` on, then moves to the next epoch.
    Batch k of epoch e is a fixed function of (seed, e, k), so ``state_dict()`` = {seed, epoch, position}
    is all a checkpoint needs to resume exactly. Subclasses define ``__len__`` (batches per epoch) and
    ``batch_at(epoch, k)``.
    """

    seed: int
    epoch: int = 0
    position: int = 0

    def __iter__(self):
        """Serve the rest of the current epoch, then move to the next one (position 0)."""
        while self.position < len(self):
            k = self.position
            self.position += 1                     # counted before yield: a checkpoint taken now resumes after it
            yield self.batch_at(self.epoch, k)
        self.epoch, self.position = self.epoch + 1, 0

    def state_dict(self) -> dict:
        return {"seed": self.seed, "epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        for key in ("seed", "epoch", "position"):
            if key not in state:
                raise ValueError(f"{type(self).__name__}.load_state_dict: state is missing {key!r}, "
                                 f"got keys {sorted(state)}")
        self.seed, self.epoch, self.position = int(state["seed"]), int(state["epoch"]), int(state["position"])


class BucketBatcher(ResumableBatches):
    """Length-bucketed, token-budgeted, shuffled batches over a list of (src_ids, tgt_ids) pairs.

    The batches of epoch e are a fixed function of (seed, e): the tie-breaking among equal lengths and the
    order of the batches both come from ``numpy.random.default_rng([seed, e])``. So training resumes exactly
    from ``state_dict()`` = {seed, epoch, position}.

        batcher = BucketBatcher(pairs, max_tokens=4000, seed=0)
        for epoch in range(10):
            for batch in batcher:         # one epoch, from batcher.position on; then batcher.epoch += 1
                ...

    seed: an int, a NumPy Generator (one seed is drawn from it), or None (drawn from ``backend.host_rng()``,
    so ``mt.manual_seed`` makes it reproducible). shuffle=False: sorted by length, the same every epoch.
    """

    def __init__(self, pairs, max_tokens: int, seed=None, shuffle: bool = True,
                 pad_id: int = PAD, bos_id: int = BOS, eos_id: int = EOS):
        self.pairs = _check_pairs(pairs, "BucketBatcher")
        if len(self.pairs) == 0:
            raise ValueError("BucketBatcher: pairs must not be empty")
        if seed is None:
            seed = backend.host_rng()
        if isinstance(seed, numpy.random.Generator):
            seed = int(seed.integers(0, 2**63 - 1))
        if isinstance(seed, bool) or not isinstance(seed, (int, numpy.integer)) or seed < 0:
            raise ValueError(f"BucketBatcher: seed must be a non-negative int, a numpy Generator or None, got {seed!r}")
        self.seed = int(seed)
        self.max_tokens = max_tokens
        self.shuffle = bool(shuffle)
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        self.src_lengths = numpy.array([len(s) for s, _ in self.pairs], dtype=numpy.int64)  # (N,)
        self.tgt_lengths = numpy.array([len(t) for _, t in self.pairs], dtype=numpy.int64)  # (N,)
        self.epoch, self.position = 0, 0
        self._plan_epoch, self._plan = None, None
        self.batches_for_epoch(0)                  # checks max_tokens now rather than mid-training

    def batches_for_epoch(self, epoch: int) -> list:
        """The index arrays of every batch of an epoch, in the order they are served."""
        if self._plan_epoch != epoch:
            rng = numpy.random.default_rng([self.seed, epoch]) if self.shuffle else None
            plan = plan_batches(self.src_lengths, self.tgt_lengths, self.max_tokens, rng)
            if rng is not None:
                plan = [plan[k] for k in rng.permutation(len(plan))]
            self._plan_epoch, self._plan = epoch, plan
        return self._plan

    def __len__(self) -> int:
        """Batches per epoch (the same every epoch: the sorted lengths do not change)."""
        return len(self.batches_for_epoch(self.epoch))

    def batch(self, indices) -> Batch:
        """The Batch of the given pair indices."""
        return collate([self.pairs[i] for i in indices], indices, self.pad_id, self.bos_id, self.eos_id)

    def batch_at(self, epoch: int, k: int) -> Batch:
        """Batch k of an epoch."""
        return self.batch(self.batches_for_epoch(epoch)[k])

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._plan_epoch, self._plan = None, None  # the seed may have changed: plan again
