"""A layer called directly, ``layer(x)``, refuses what its forward cannot take: one case per kind of check,
each a TypeError (not an array, wrong dtype) or ValueError (wrong shape or value) that names the layer and
the argument. (Inside the model the layers call each other's ``forward`` and are not checked again; the
constructors' refusals are in test_input_validation.py.)"""

import numpy as np
import pytest

from minitransformer import layers as L

X = np.zeros((2, 3, 4), dtype=np.float32)                      # (B,T,D) with D = 4
Q = np.zeros((1, 2, 3, 4))                                     # (B,H,T,Dk)

# (id, call, exception, the message must match)
CASES = [
    ("not an array", lambda: L.Linear(4, 2)([[0.0] * 4]), TypeError, r"Linear: x must be a float array, got list"),
    ("integer dtype", lambda: L.LayerNorm(4)(np.zeros((2, 4), dtype=np.int64)), TypeError,
     r"LayerNorm: x must be a float array, got dtype int64"),
    ("last dimension", lambda: L.Linear(4, 2)(np.zeros((2, 3), dtype=np.float32)), ValueError,
     r"Linear: x must have last dimension 4, got shape \(2, 3\)"),
    ("number of axes", lambda: L.MultiHeadAttention(4, 2)(X[0], X, X), ValueError,
     r"MultiHeadAttention: query must have 3 axes, got shape \(3, 4\)"),
    ("key and value differ", lambda: L.MultiHeadAttention(4, 2)(X, X, X[:, :2]), ValueError,
     r"MultiHeadAttention: key and value must have the same shape .*key \(2, 3, 4\), value \(2, 2, 4\)"),
    ("batch differs", lambda: L.MultiHeadAttention(4, 2)(X, X[:1], X[:1]), ValueError,
     r"MultiHeadAttention: .*query the same B, got query \(2, 3, 4\), key \(1, 3, 4\)"),
    ("q and k head sizes", lambda: L.ScaledDotProductAttention()(Q, Q[..., :3], Q[..., :3]), ValueError,
     r"ScaledDotProductAttention: q, k and v must have shapes .*got q \(1, 2, 3, 4\), k \(1, 2, 3, 3\)"),
    ("mask not an array", lambda: L.MultiHeadAttention(4, 2)(X, X, X, [[True]]), TypeError,
     r"MultiHeadAttention: mask must be a boolean array \(True = may attend\), got list"),
    ("mask dtype", lambda: L.Mask()(Q, np.ones((1, 1, 3, 3))), TypeError,
     r"Mask: mask must be a boolean array .*got dtype float64"),
    ("mask shape", lambda: L.MultiHeadAttention(4, 2)(X, X, X, np.ones((2, 1, 1, 5), dtype=bool)), ValueError,
     r"mask must broadcast to the attention scores' shape \(2, 2, 3, 3\).*got mask shape \(2, 1, 1, 5\)"),
    ("ids dtype", lambda: L.Embedding(5, 4)(np.array([[1.0, 2.0]])), TypeError,
     r"Embedding: ids must hold integer token ids, got dtype float64"),
    ("ids range", lambda: L.Embedding(5, 4)(np.array([[-1, 5]])), ValueError,
     r"Embedding: ids must hold token ids in \[0, 5\), got values in \[-1, 5\]"),
    ("ragged ids", lambda: L.Embedding(5, 4)([[1, 2], [3]]), ValueError,
     r"Embedding: ids must be a rectangular table of token ids"),
    ("beyond max_len", lambda: L.LearnedPositionalEmbedding(5, 4)(np.zeros((1, 6, 4), dtype=np.float32)), ValueError,
     r"LearnedPositionalEmbedding: the positions of x must be within max_len=5, got positions 0..5 \(length 6"),
    ("negative offset", lambda: L.PositionalEncoding(4, max_len=8)(X, offset=-1), ValueError,
     r"PositionalEncoding: the positions of x must be within max_len=8, got positions -1..1"),
    ("offset not an int", lambda: L.PositionalEncoding(4)(X, offset=1.5), TypeError,
     r"PositionalEncoding: offset must be an int, got 1.5"),
    ("softmax axis", lambda: L.Softmax(axis=3)(np.zeros((2, 2))), ValueError,
     r"Softmax: axis=3 does not exist in x of shape \(2, 2\)"),
]


@pytest.mark.parametrize("call,exc,match", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_direct_call_refuses_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_a_refused_call_leaves_the_layer_usable():
    """The check runs before forward: nothing is cached, so the next training forward and its backward run."""
    mha = L.MultiHeadAttention(4, 2)
    with pytest.raises(ValueError, match="mask must broadcast"):
        mha(X, X, X, np.ones((2, 1, 1, 5), dtype=bool))
    out = mha(X, X, X, np.ones((2, 1, 1, 3), dtype=bool))
    dquery, dkey, dvalue = mha.backward(np.ones_like(out))
    assert dquery.shape == dkey.shape == dvalue.shape == X.shape
