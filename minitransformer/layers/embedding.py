"""Token embedding: a lookup table of learned vectors, one row per vocabulary entry."""

from __future__ import annotations

import math

from .. import backend, checks
from ..module import Module, Parameter


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
        self.num_embeddings = checks.positive_int("Embedding", "num_embeddings", num_embeddings)
        self.d_model = checks.positive_int("Embedding", "d_model", d_model)
        self.scale = math.sqrt(d_model) if checks.boolean("Embedding", "scale", scale) else 1.0
        self.weight = Parameter(backend.host_rng().normal(0.0, d_model**-0.5, size=(num_embeddings, d_model)))  # E (V,D)

    def check_inputs(self, ids):
        checks.token_ids("Embedding", "ids", ids, self.num_embeddings)

    def forward(self, ids):                                    # ids (B,T) int
        out = self.weight.data[ids] * self.scale               # E[ids] * scale   (B,T,D)
        self.save_for_backward(out, ids=ids)
        return out

    def backward(self, dout):                                  # dout (B,T,D) -> None (ids have no gradient)
        ids = self.saved(dout).ids                             # (B,T)
        dE_rows = dout.reshape(-1, self.d_model) * self.scale  # (B*T, D) one gradient row per token
        backend.scatter_add(self.weight.grad, ids.reshape(-1), dE_rows)  # dE[id] += row, repeats summed
        # ids are integers: they have no gradient, so backward returns nothing

    def extra_repr(self):
        return f"num_embeddings={self.num_embeddings}, d_model={self.d_model}, scale={self.scale != 1.0}"
