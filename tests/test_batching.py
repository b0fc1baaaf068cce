"""Batching: every token once per epoch, right padding only, budgets kept, seeded order, exact resume."""

from collections import Counter

import numpy as np
import pytest

from minitransformer.kit.data.batching import (
    Batch,
    BucketBatcher,
    collate,
    plan_batches,
)
from minitransformer.kit.data.vocab import BOS, EOS, PAD


def random_pairs(n=300, seed=0, max_len=30):
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(n):
        s, t = rng.integers(1, max_len + 1, size=2)
        # ids >= 4 so no real token collides with a special id
        pairs.append((rng.integers(4, 50, size=s).tolist(), rng.integers(4, 50, size=t).tolist()))
    return pairs


def strip_row(row):
    """The tokens of a right-padded row, checking that padding is one block at the end."""
    nonpad = np.flatnonzero(row != PAD)
    n = 0 if len(nonpad) == 0 else nonpad[-1] + 1
    assert np.all(row[:n] != PAD), f"padding inside a row: {row}"
    assert np.all(row[n:] == PAD)
    return row[:n].tolist()


def test_collate_shift_and_padding():
    batch = collate([([5, 6, 7], [8, 9]), ([5], [8, 9, 10, 11])], indices=[10, 3])
    assert isinstance(batch, Batch) and len(batch) == 2
    np.testing.assert_array_equal(batch.src, [[5, 6, 7], [5, PAD, PAD]])
    np.testing.assert_array_equal(batch.tgt_in, [[BOS, 8, 9, PAD, PAD], [BOS, 8, 9, 10, 11]])
    np.testing.assert_array_equal(batch.tgt_out, [[8, 9, EOS, PAD, PAD], [8, 9, 10, 11, EOS]])
    np.testing.assert_array_equal(batch.indices, [10, 3])
    assert batch.num_src_tokens == 4 and batch.num_tgt_tokens == 8     # tgt_out tokens, <eos> included
    for arr in (batch.src, batch.tgt_in, batch.tgt_out, batch.indices):
        assert arr.dtype == np.int64


@pytest.mark.parametrize("indices", [[0], [0, 1, 2], [[0, 1]], 7])
def test_collate_needs_one_index_per_pair(indices):
    with pytest.raises(ValueError, match=r"collate: indices must have one entry per pair, shape \(2,\), got shape"):
        collate([([5], [6]), ([7], [8])], indices=indices)


def test_epoch_covers_every_pair_once_without_losing_tokens():
    pairs = random_pairs()
    batcher = BucketBatcher(pairs, max_tokens=200, seed=1)
    seen = Counter()
    for batch in batcher:
        for row, idx in enumerate(batch.indices.tolist()):
            seen[idx] += 1
            src, tgt = pairs[idx]
            assert strip_row(batch.src[row]) == src
            assert strip_row(batch.tgt_in[row]) == [BOS] + tgt
            assert strip_row(batch.tgt_out[row]) == tgt + [EOS]
        assert batch.num_src_tokens == int((batch.src != PAD).sum())
        assert batch.num_tgt_tokens == int((batch.tgt_out != PAD).sum())
    assert seen == Counter(range(len(pairs)))                   # no pair lost, none twice
    assert batcher.epoch == 1 and batcher.position == 0


@pytest.mark.parametrize("max_tokens", [31, 64, 200, 1000])
def test_token_budget_is_respected(max_tokens):
    pairs = random_pairs()
    for batch in BucketBatcher(pairs, max_tokens=max_tokens, seed=0):
        assert batch.src.size <= max_tokens and batch.tgt_in.size <= max_tokens
        assert batch.tgt_in.shape == batch.tgt_out.shape
        # no wasted column: some row fills the last position
        assert np.any(batch.src[:, -1] != PAD) and np.any(batch.tgt_out[:, -1] != PAD)


def test_batches_group_similar_lengths():
    pairs = random_pairs(n=1000, max_len=40)
    batches = list(BucketBatcher(pairs, max_tokens=400, seed=0))
    padded = sum(b.src.size for b in batches)
    real = sum(b.num_src_tokens for b in batches)
    assert padded / real < 1.1                                 # sorting by length keeps padding small
    assert sum(b.num_src_tokens for b in batches) == sum(len(s) for s, _ in pairs)


def test_too_small_budget_is_an_error():
    pairs = random_pairs(max_len=30)
    with pytest.raises(ValueError, match="max_tokens"):
        BucketBatcher(pairs, max_tokens=20)
    with pytest.raises(ValueError, match="empty source"):
        BucketBatcher([([], [5])], max_tokens=10)
    with pytest.raises(TypeError, match="pairs"):
        BucketBatcher([[1, 2, 3]], max_tokens=10)
    with pytest.raises(ValueError, match="seed"):
        BucketBatcher(pairs, max_tokens=100, seed=-1)


def order_of(batcher):
    return [b.indices.tolist() for b in batcher]


def test_seed_gives_reproducible_order():
    pairs = random_pairs()
    a, b = BucketBatcher(pairs, max_tokens=150, seed=7), BucketBatcher(pairs, max_tokens=150, seed=7)
    assert order_of(a) == order_of(b)                           # epoch 0
    assert order_of(a) == order_of(b)                           # epoch 1
    c = BucketBatcher(pairs, max_tokens=150, seed=8)
    assert order_of(BucketBatcher(pairs, max_tokens=150, seed=7)) != order_of(c)
    # successive epochs differ
    d = BucketBatcher(pairs, max_tokens=150, seed=7)
    assert order_of(d) != order_of(d)
    # a Generator gives the same batches as the seed drawn from an equal Generator
    g1, g2 = BucketBatcher(pairs, 150, seed=np.random.default_rng(3)), BucketBatcher(pairs, 150, seed=np.random.default_rng(3))
    assert order_of(g1) == order_of(g2)


def test_manual_seed_drives_the_default():
    import minitransformer as mt

    pairs = random_pairs()
    mt.manual_seed(11)
    a = order_of(BucketBatcher(pairs, max_tokens=150))
    mt.manual_seed(11)
    assert order_of(BucketBatcher(pairs, max_tokens=150)) == a


def test_no_shuffle_is_sorted_and_fixed():
    pairs = random_pairs()
    batcher = BucketBatcher(pairs, max_tokens=150, shuffle=False)
    first = order_of(batcher)
    assert order_of(batcher) == first
    lengths = [len(pairs[i][0]) for batch in first for i in batch]
    assert lengths == sorted(lengths)


def test_resume_mid_epoch_is_exact():
    pairs = random_pairs()
    full = BucketBatcher(pairs, max_tokens=150, seed=5)
    reference = order_of(full) + order_of(full)                 # epochs 0 and 1

    run = BucketBatcher(pairs, max_tokens=150, seed=5)
    served = []
    for k, batch in enumerate(run):
        served.append(batch.indices.tolist())
        if k == 4:
            break                                               # "crash" after five batches
    state = run.state_dict()
    assert state["epoch"] == 0 and state["position"] == 5

    resumed = BucketBatcher(pairs, max_tokens=150, seed=999)    # the state brings the seed back
    resumed.load_state_dict(state)
    served += order_of(resumed) + order_of(resumed)
    assert served == reference
    with pytest.raises(ValueError, match="position"):
        resumed.load_state_dict({"seed": 1, "epoch": 0})


def test_len_counts_batches():
    batcher = BucketBatcher(random_pairs(), max_tokens=150, seed=2)
    assert len(batcher) == len(order_of(batcher)) == len(batcher.batches_for_epoch(3))


def test_plan_batches_sorted_greedy():
    # lengths (src, tgt): budget 6 tokens per side; tgt counts one more for <bos>/<eos>
    plan = plan_batches([1, 1, 2, 3, 3], [1, 1, 1, 1, 5], max_tokens=6)
    assert [p.tolist() for p in plan] == [[0, 1, 2], [3], [4]]
    # rows 0,1,2: src 3*2=6, tgt 3*2=6; adding row 3 would need src 4*3=12
    with pytest.raises(ValueError, match="equal length"):
        plan_batches([1, 2], [1], max_tokens=10)
