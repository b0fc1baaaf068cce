"""Batches for translation: sentences grouped by length, padded, sized by a token budget.

The paper (§5.1): "Sentence pairs were batched together by approximate sequence length. Each training batch
contained a set of sentence pairs containing approximately 25000 source tokens and 25000 target tokens."
Here a batch holds as many pairs of similar length as fit: rows * longest side <= max_tokens, padding counted.
Teacher forcing ("output embeddings are offset by one position"): tgt_in = <bos> ein hund (what the decoder
reads), tgt_out = ein hund <eos> (what it must predict). Arrays are int64 NumPy on the host (the model moves them).
"""

import itertools
import sys
from dataclasses import dataclass

import numpy

from minitransformer import backend, checks, decoding
from minitransformer.budget import decoding_parts, memory_budget, parameter_count
from minitransformer.kit.data.vocab import BOS, EOS, PAD


@dataclass
class Batch:
    """One padded batch.   src (B,S), tgt_in (B,T), tgt_out (B,T): int64; indices (B,): rows of the dataset.
    num_src_tokens / num_tgt_tokens: the real (non-pad) tokens of src and tgt_out (the loss's count; tokens/s)."""

    src: numpy.ndarray
    tgt_in: numpy.ndarray
    tgt_out: numpy.ndarray
    indices: numpy.ndarray
    num_src_tokens: int
    num_tgt_tokens: int

    def __len__(self) -> int:
        return self.src.shape[0]


def _check_pairs(pairs, where: str) -> list:
    """pairs as a list of (source, target) int64 arrays; no source may be empty."""
    if isinstance(pairs, (str, bytes)) or not hasattr(pairs, "__len__"):
        raise TypeError(f"{where}: pairs must be a list of (src_ids, tgt_ids), got {type(pairs).__name__}")
    if len(pairs) == 0:
        raise ValueError(f"{where}: pairs must not be empty")
    checked = []
    for i, pair in enumerate(pairs):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(f"{where}: pairs[{i}] must be a (src_ids, tgt_ids) pair, got {type(pair).__name__}")
        src, tgt = (_token_ids(ids, f"{where}: pairs[{i}] {side}") for side, ids in zip(("source", "target"), pair))
        if len(src) == 0:
            raise ValueError(f"{where}: pairs[{i}] has an empty source; every source needs at least one token")
        checked.append((src, tgt))
    return checked


def _token_ids(ids, what: str) -> numpy.ndarray:
    """ids as a 1-D int64 array (L,); anything but a flat list of ints >= 0 is refused (a float would be truncated)."""
    try:
        array = None if isinstance(ids, (str, bytes)) else numpy.asarray(ids)     # (L,)
    except ValueError:                                                          # ragged nesting
        array = None
    if array is None or array.ndim != 1 or array.size and (array.dtype.kind not in "iu" or array.min() < 0):
        raise TypeError(f"{what} must be a flat list of int token ids >= 0, got {ids!r:.60}")
    return array.astype(numpy.int64)


def collate(pairs, indices=None, pad_id: int = PAD) -> Batch:
    """Pad a list of (src_ids, tgt_ids) into a Batch: tgt_in = <bos> + tgt, tgt_out = tgt + <eos>.
    indices: the pairs' positions in the dataset, one per pair (stored on the batch, default 0..B-1).
    pad_id: a model's own (``config.pad_id``) where its sources are padded for decoding."""
    pairs = _check_pairs(pairs, "collate")
    pad_id = checks.int_in("collate", "pad_id", pad_id, 0, sys.maxsize)
    if indices is not None and numpy.shape(indices) != (len(pairs),):
        raise ValueError(f"collate: indices must have one entry per pair, shape ({len(pairs)},), "
                         f"got shape {numpy.shape(indices)}")
    return _collate(pairs, indices, pad_id)


def _collate(pairs, indices=None, pad_id: int = PAD) -> Batch:
    """``collate`` on pairs already checked (a BucketBatcher's, once, not every batch) or generated (a task's)."""
    B = len(pairs)
    S = max(len(src) for src, _ in pairs)
    T = max(len(tgt) for _, tgt in pairs) + 1                   # one more for <bos> / <eos>
    src = numpy.full((B, S), pad_id, dtype=numpy.int64)          # (B,S)
    tgt_in = numpy.full((B, T), pad_id, dtype=numpy.int64)       # (B,T)
    tgt_out = numpy.full((B, T), pad_id, dtype=numpy.int64)      # (B,T)
    for row, (s, t) in enumerate(pairs):
        src[row, : len(s)] = s
        tgt_in[row, : len(t) + 1] = [BOS, *t]
        tgt_out[row, : len(t) + 1] = [*t, EOS]
    indices = numpy.asarray(numpy.arange(B) if indices is None else indices, dtype=numpy.int64)     # (B,)
    return Batch(src, tgt_in, tgt_out, indices, sum(len(s) for s, _ in pairs), sum(len(t) + 1 for _, t in pairs))


def plan_batches(src_lengths, tgt_lengths, max_tokens: int, rng: numpy.random.Generator | None = None) -> list:
    """Pair indices in batches of similar length within the token budget. -> list of index arrays.
    Pairs sorted by (source length, target length), ties broken by rng if given (batches mix differently each
    epoch), are taken in order; a batch closes when one more pair would push rows * longest side above max_tokens."""
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
    batches, start, longest = [], 0, 0          # longest: the longest side of the open batch
    for pos, n in enumerate(numpy.maximum(src_len, tgt_len)[order].tolist()):
        longest = max(longest, n)
        if pos > start and (pos - start + 1) * longest > max_tokens:
            batches.append(order[start:pos])               # close the batch before this pair
            start, longest = pos, n
    if start < len(order):
        batches.append(order[start:])
    return batches


class ResumableBatches:
    """The stream protocol the Trainer reads: iterating serves the rest of the current epoch from ``position`` on,
    then moves to the next epoch. Batch k of epoch e is a fixed function of (seed, e, k), so ``state_dict()`` =
    {seed, epoch, position} resumes exactly. Subclasses define ``__len__``, and ``pairs_at(epoch, k)`` (the
    (src_ids, tgt_ids) pairs that ``batch_at`` pads, made and so trusted by the subclass) or ``batch_at`` itself."""

    seed: int
    epoch: int = 0
    position: int = 0
    state_keys = ("seed", "epoch", "position")           # what state_dict() holds: all a resume needs

    def __iter__(self):
        while self.position < len(self):
            k = self.position
            self.position += 1                     # counted before yield: a checkpoint taken now resumes after it
            yield self.batch_at(self.epoch, k)
        self.epoch, self.position = self.epoch + 1, 0

    def batch_at(self, epoch: int, k: int) -> Batch:
        return _collate(self.pairs_at(epoch, k))

    def state_dict(self) -> dict:
        return {key: getattr(self, key) for key in self.state_keys}

    def load_state_dict(self, state: dict) -> None:
        if missing := [key for key in self.state_keys if key not in state]:
            raise ValueError(f"{type(self).__name__}.load_state_dict: state is missing {missing}, got {sorted(state)}")
        for key in self.state_keys:
            setattr(self, key, int(state[key]))


class BucketBatcher(ResumableBatches):
    """Length-bucketed, token-budgeted, shuffled batches over a list of (src_ids, tgt_ids) pairs. Epoch e's
    tie-breaking and batch order both come from ``numpy.random.default_rng([seed, e])``; ``for batch in batcher``
    serves one epoch. seed: an int, a NumPy Generator (one seed drawn from it), or None (from
    ``backend.host_rng()``, which ``mt.manual_seed`` sets). shuffle=False: sorted by length, every epoch alike."""

    def __init__(self, pairs, max_tokens: int, seed=None, shuffle: bool = True):
        self.pairs = _check_pairs(pairs, "BucketBatcher")       # checked once: every batch is made of these
        if seed is None or isinstance(seed, numpy.random.Generator):
            seed = int((backend.host_rng() if seed is None else seed).integers(0, 2**63 - 1))
        self.seed = checks.int_in("BucketBatcher", "seed", seed, 0, 2**63 - 1)
        self.max_tokens, self.shuffle = max_tokens, bool(shuffle)
        self.src_lengths = numpy.array([len(s) for s, _ in self.pairs], dtype=numpy.int64)  # (N,)
        self.tgt_lengths = numpy.array([len(t) for _, t in self.pairs], dtype=numpy.int64)  # (N,)
        self._plan_key, self._plan = None, None
        self.batches_for_epoch(0)                  # checks max_tokens now rather than mid-training

    def batches_for_epoch(self, epoch: int) -> list:
        """The index arrays of every batch of an epoch, in the order they are served."""
        if self._plan_key != (self.seed, epoch):                 # a resume may bring another seed
            rng = numpy.random.default_rng([self.seed, epoch]) if self.shuffle else None
            plan = plan_batches(self.src_lengths, self.tgt_lengths, self.max_tokens, rng)
            if rng is not None:
                plan = [plan[k] for k in rng.permutation(len(plan))]
            self._plan_key, self._plan = (self.seed, epoch), plan
        return self._plan

    def __len__(self) -> int:                     # the same every epoch: the lengths do not change
        return len(self.batches_for_epoch(self.epoch))

    def batch(self, indices) -> Batch:
        return _collate([self.pairs[i] for i in indices], indices)

    def batch_at(self, epoch: int, k: int) -> Batch:
        return self.batch(self.batches_for_epoch(epoch)[k])


def translate_ids(model, encoded, beam_size: int = 1, alpha: float = 0.6, batch_size: int = 100,
                  length_limit=None) -> list:
    """The output ids of each source id list (batched, sorted by length), in input order.
    length_limit(S) -> the most tokens generated for a source of S tokens (the batches then hold sources of one
    length each); None: decoding's default, S + decoding.EXTRA_LENGTH (the paper's, §6.1)."""
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    if encoded:                           # as many sentences at once as the memory budget lets the longest take
        longest = len(encoded[order[-1]])
        out_len = longest + decoding.EXTRA_LENGTH if length_limit is None else length_limit(longest)
        batch_size = max(1, min(batch_size, largest_batch(model, longest, out_len, beam_size)))
    out = {}
    groups = [list(g) for _, g in itertools.groupby(order, lambda i: len(encoded[i]))] if length_limit else [order]
    for idx in (group[k:k + batch_size] for group in groups for k in range(0, len(group), batch_size)):
        src = collate([(encoded[i], []) for i in idx], pad_id=model.config.pad_id).src           # (B,S)
        max_len = None if length_limit is None else length_limit(src.shape[1])
        hyps = (decoding.beam_search(model, src, beam_size=beam_size, alpha=alpha, max_len=max_len) if beam_size > 1
                else decoding.greedy_decode(model, src, max_len=max_len))
        out.update(zip(idx, hyps))
    return [out[i] for i in range(len(encoded))]


def largest_batch(model, src_len: int, out_len: int, beam: int = 1, budget=None) -> int:
    """The most sources of src_len tokens ``budget.check_decoding`` lets through at once (0: not one); every part
    but the weights grows in proportion to the batch."""
    itemsize = model.parameters()[0].data.dtype.itemsize
    weights = 2 * parameter_count(model.config) * itemsize
    per_source = sum(decoding_parts(model.config, 1, src_len, out_len, beam, itemsize=itemsize).values())
    return max(0, (memory_budget(budget) - weights) // per_source)
