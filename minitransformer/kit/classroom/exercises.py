"""The exercises: which method bodies a student writes, in which part, and the hint each stub keeps.

A target's ``backward`` stands for every method of the class whose name holds "backward" (``self_attn_backward``
too), ``forward`` for the forward alone: ``linear`` is Linear's backward, ``linear.forward`` its forward. Part 3
ends with ``train``: the copy task, learned with everything the student wrote.
"""

from __future__ import annotations

from dataclasses import dataclass

PARTS = {1: "layers", 2: "attention and normalisation", 3: "the model, trained on the copy task"}


@dataclass(frozen=True)
class Exercise:
    name: str
    part: int
    targets: tuple          # ((file under the package, class, "backward" or "forward"), ...)
    sentence: str           # what the student writes, in one sentence
    hint: str               # kept in the stub, with the class docstring (equation, shapes) and the def line
    points: int = 10

    @property
    def base(self) -> str:  # the name of its inputs in cases.py
        return self.name.split(".")[0]


def _ex(name, part, file, cls, sentence, hint, method="backward", more=()):
    return Exercise(name, part, ((file, cls, method), *more), sentence, hint)


BACKWARD = [
    _ex("linear", 1, "layers/linear.py", "Linear", "The backward of out = x W + b: dx, and dW and db added into .grad.",
        "for C = A B, dA = dC B^T and dB = A^T dC; flatten (B,T,in) into N = B*T rows first, since every row "
        "adds its own share to dW and db. ADD (+=) into .grad."),
    _ex("relu", 1, "layers/activations.py", "ReLU", "The backward of max(0, x): the gradient passes where x > 0.",
        "the slope is 1 where x > 0 and 0 elsewhere; the cache says where."),
    _ex("softmax", 1, "layers/activations.py", "Softmax", "The backward of softmax along an axis, without "
        "building the Jacobian.", "dp_i/dx_j = p_i (delta_ij - p_j);"
        " summed against dout it needs one product and one sum along self.axis (keepdims=True), no matrix."),
    _ex("dropout", 1, "layers/dropout.py", "Dropout", "The backward of inverted dropout: through the mask the "
        "forward drew.", "forward's own scaled mask is in the cache; a new mask would be another function."),
    _ex("embedding", 1, "layers/embedding.py", "Embedding", "The backward of a lookup table: a scatter-add of "
        "each token's gradient into its row, repeated ids summed.",
        "a token that appears k times gets the sum of k rows: backend.scatter_add does that, while "
        "dE[ids] += rows keeps one of them. Forward multiplied by self.scale."),
    _ex("feedforward", 1, "layers/feedforward.py", "PositionwiseFeedForward", "The backward of "
        "FFN(x) = max(0, x W1 + b1) W2 + b2, through the four child layers in reverse.",
        "call each child's backward in the reverse order of forward: W2, dropout, ReLU, W1."),
    _ex("layernorm", 2, "layers/layernorm.py", "LayerNorm", "The backward of layer normalisation: dgamma, "
        "dbeta and dx through the mean and the variance.",
        "x_hat depends on x three ways: directly, through the mean and through the variance; follow each path "
        "from g = dL/dx_hat = dout * gamma and add. dgamma and dbeta sum over every position."),
    _ex("attention", 2, "layers/attention.py", "ScaledDotProductAttention", "The backward of "
        "softmax(Q K^T / sqrt(d_k)) V with masks and dropout, through each step in reverse.",
        "go back through forward's steps in reverse (A V, dropout, softmax, Mask, the scale, Q K^T), each child "
        "layer's backward in turn; for C = A B, dA = dC B^T and dB = A^T dC."),
    _ex("multihead", 2, "layers/attention.py", "MultiHeadAttention", "The backward of multi-head attention: "
        "W_o, the heads, attention and the three projections.",
        "split_heads undoes merge_heads and back: go through W_o, attention, then W_q, W_k, W_v; return "
        "(dquery, dkey, dvalue)."),
    _ex("sublayer", 2, "layers/sublayer.py", "SublayerConnection", "The backward of the residual connection "
        "with LayerNorm, post-LN (the paper) and pre-LN.",
        "the gradient goes around the sublayer (the identity) AND through it; the two add."),
    _ex("encoder_layer", 3, "model.py", "EncoderLayer", "The backward of an encoder layer: the FFN sublayer, "
        "then self-attention, whose input was query, key and value at once.",
        "x fed query, key and value: its gradient is dquery + dkey + dvalue."),
    _ex("decoder_layer", 3, "model.py", "DecoderLayer", "The backward of a decoder layer, returning the gradient "
        "of its input and of the encoder memory.",
        "self-attention: dquery + dkey + dvalue; cross-attention read the memory as key and value: "
        "dmemory = dkey + dvalue, while y was only the query."),
    _ex("transformer", 3, "model.py", "Transformer", "The whole model's backward: projection, decoder, "
        "embeddings and encoder, with shared and tied weights.",
        "the memory's gradient is the sum over decoder layers; a tied weight's .grad is the SUM of every use "
        "(+=, never =).", more=(("model.py", "TiedProjection", "backward"), ("model.py", "Encoder", "backward"),
                                ("model.py", "Decoder", "backward"))),
    _ex("loss", 3, "loss.py", "CrossEntropyLoss", "The backward of the label-smoothed cross-entropy, "
        "mean over the real tokens.",
        "d(-log p_t)/dlogits = p - one_hot(t); smoothing mixes one_hot(t) with the uniform eps / V; the mean "
        "over real tokens divides by their count, and padding gets nothing."),
]

FORWARD = [
    _ex(f"{e.name}.forward", e.part, e.targets[0][0], e.targets[0][1], f"The forward of {e.targets[0][1]}, "
        "saving in the cache what the backward reads.", "see the class docstring; save_for_backward(out, "
        "...) with the names the backward reads.", method="forward")
    for e in BACKWARD if e.name in ("linear", "relu", "softmax", "dropout", "embedding", "layernorm", "attention",
                                    "multihead", "feedforward", "loss")
]

# Part by part, each forward before its backward: the order a student works in.
EXERCISES = {e.name: e for b in BACKWARD for e in [*(f for f in FORWARD if f.base == b.name), b]}
DEFAULT = [e.name for e in BACKWARD]
TRAIN = Exercise("train", 3, (), "Train the model you wrote on the copy task (train_copy.py): it must learn "
                 "(90% exact match on new strings).", "", points=10)


def choose(names) -> list:
    """The exercises named (a list or a comma-separated string), in the table's order; all backward ones if None."""
    if names is None:
        return [EXERCISES[n] for n in DEFAULT]
    wanted = [n.strip() for n in (names.split(",") if isinstance(names, str) else names) if n.strip()]
    unknown = [n for n in wanted if n not in EXERCISES]
    if unknown or not wanted:
        raise ValueError(f"classroom: --exercises must name exercises among {', '.join(EXERCISES)}; "
                         f"got {', '.join(unknown) or 'none'}")
    return [e for e in EXERCISES.values() if e.name in wanted]
