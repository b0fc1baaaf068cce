"""Bad input gets a ValueError/TypeError that names the argument and says what was expected and what came."""

import numpy as np
import pytest

import minitransformer as mt
from minitransformer import layers as L


def test_heads_must_divide_d_model():
    with pytest.raises(ValueError, match=r"d_model must be divisible by num_heads.*d_model=10, num_heads=3"):
        L.MultiHeadAttention(10, 3)


def test_sinusoidal_pe_needs_even_d_model():
    with pytest.raises(ValueError, match=r"d_model must be even.*got 7"):
        L.PositionalEncoding(7)


def test_mismatched_query_key_value_sizes(rng):
    mha = L.MultiHeadAttention(8, 2)
    x = rng.standard_normal((2, 3, 8)).astype(np.float32)
    with pytest.raises(ValueError, match=r"key must have shape \(B, T, d_model=8\), got \(2, 3, 6\)"):
        mha(x, x[..., :6], x)
    mha.train()
    with pytest.raises(ValueError, match=r"key and value must have the same \(B, Tk\)"):
        mha(x, x, x[:, :2])
    mha.train()
    with pytest.raises(ValueError, match=r"query and key must have the same batch size, got 2 and 1"):
        mha(x, x[:1], x[:1])


def test_mask_that_does_not_broadcast(rng):
    mha = L.MultiHeadAttention(8, 2)
    x = rng.standard_normal((2, 3, 8)).astype(np.float32)
    bad = np.ones((2, 1, 1, 5), dtype=bool)
    with pytest.raises(ValueError, match=r"mask must broadcast.*\(2, 2, 3, 3\).*got mask shape \(2, 1, 1, 5\)"):
        mha(x, x, x, bad)


def test_mask_must_be_boolean(rng):
    x = rng.standard_normal((1, 1, 2, 2))
    with pytest.raises(TypeError, match="mask must be a boolean array"):
        L.Mask()(x, np.ones((1, 1, 2, 2)))


@pytest.mark.parametrize("layer", [lambda: L.PositionalEncoding(4, max_len=5),
                                   lambda: L.LearnedPositionalEmbedding(5, 4)])
def test_sequence_longer_than_max_len(layer):
    with pytest.raises(ValueError, match=r"within max_len=5.*length 6"):
        layer()(np.zeros((1, 6, 4), dtype=np.float32))


def test_embedding_ids_checked():
    emb = L.Embedding(5, 4)
    with pytest.raises(ValueError, match=r"ids must be token ids in \[0, 5\), got values in \[0, 5\]"):
        emb(np.array([[0, 5]]))
    emb.train()
    with pytest.raises(ValueError, match=r"got values in \[-1, 2\]"):
        emb(np.array([[-1, 2]]))
    emb.train()
    with pytest.raises(TypeError, match="ids must hold integer token ids, got dtype float64"):
        emb(np.array([[1.0, 2.0]]))


@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5, "0.1"])
def test_dropout_rate_checked(p):
    with pytest.raises(ValueError, match=r"Dropout: p must be a float in \[0, 1\)"):
        L.Dropout(p)


def test_wrong_feature_size():
    with pytest.raises(ValueError, match=r"Linear: x must have last dimension 4, got shape \(2, 3\)"):
        L.Linear(4, 2)(np.zeros((2, 3), dtype=np.float32))
    with pytest.raises(ValueError, match=r"LayerNorm: x must have last dimension 4"):
        L.LayerNorm(4)(np.zeros((2, 3), dtype=np.float32))


@pytest.mark.parametrize("make", [lambda: L.Linear(0, 3), lambda: L.Embedding(5, -1), lambda: L.LayerNorm(2.5)])
def test_sizes_must_be_positive_ints(make):
    with pytest.raises(ValueError, match="must be a positive int"):
        make()


def test_mask_helpers_check_their_arguments():
    with pytest.raises(ValueError, match=r"subsequent_mask: T must be a positive int, got 0"):
        mt.masks.subsequent_mask(0)
    with pytest.raises(ValueError, match=r"padding_mask: ids must be a 2-D array"):
        mt.masks.padding_mask(np.array([1, 2, 0]), 0)
