"""Token embedding: a lookup table of learned vectors, one row per vocabulary entry."""

from __future__ import annotations

import math

from .. import backend
from ..module import Module, Parameter
from ._checks import check_ids, check_positive_int


class Embedding(Module):
    """out = E[ids] (* sqrt(d_model) when scale=True, as in the paper's §3.4).   Shapes: (B,T) int -> (B,T,D)

    E is initialised from a normal with mean 0 and standard deviation d_model^-0.5, so that with the
    sqrt(d_model) scale the embedded vectors have unit-size entries, comparable to the positional
    encodings added to them.
    Backward is a scatter-add: a token that appears k times in the batch receives the sum of its k
    gradients. (``dE[ids] += dout`` would keep only one of them - a classic silent bug.)
    Cache: the ids.
    """

    def __init__(self, num_embeddings: int, d_model: int, scale: bool = False):
        super().__init__()
        check_positive_int("Embedding", "num_embeddings", num_embeddings)
        check_positive_int("Embedding", "d_model", d_model)
        self.num_embeddings, self.d_model = num_embeddings, d_model
        self.scale = math.sqrt(d_model) if scale else 1.0
        init = backend.host_rng().normal(0.0, d_model**-0.5, size=(num_embeddings, d_model))
        self.weight = Parameter(init)                          # E (V, D)

    def forward(self, ids, check_range: bool = True):          # ids (B,T) int
        """check_range=False skips checking that every id is in [0, V). On a GPU that check waits for the
        device and copies two numbers to the host; the Transformer's forward, encode and decode pass False
        because they have checked the ids on the host already, before moving them to the device."""
        if check_range:
            check_ids("Embedding", "ids", ids, self.num_embeddings)
        self.ids = ids
        out = self.weight.data[ids]                            # (B,T,D), a gathered copy
        if self.scale != 1.0:
            out *= self.scale                                  # in place on the fresh copy
        return out

    def backward(self, dout):                                  # dout (B,T,D) -> None (ids have no gradient)
        dE_rows = dout.reshape(-1, self.d_model)               # (B*T, D)
        if self.scale != 1.0:
            dE_rows = dE_rows * self.scale
        backend.scatter_add(self.weight.grad, self.ids.reshape(-1), dE_rows)  # dE[id] += row, repeats summed
        self.ids = None
        # ids are integers: they have no gradient, so this backward returns None

    def extra_repr(self):
        return f"num_embeddings={self.num_embeddings}, d_model={self.d_model}, scale={self.scale != 1.0}"
