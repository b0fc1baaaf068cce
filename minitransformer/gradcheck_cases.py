"""The cases of ``minitransformer gradcheck``: one module per layer class and model block, with inputs.

Each case is (label, module, inputs) with small, distinct sizes, so that a transposed index cannot go
unnoticed. Build them with the default dtype set to float64: finite differences in float32 are noise.
Self-attention (one input used as query, key and value) and the loss (not a module of its input) are wrapped
in small modules of their own below, so that ``gradcheck.check`` treats them like any layer.
"""

from __future__ import annotations

import numpy

from .module import Module


def gradcheck_cases(rng: numpy.random.Generator):
    """(label, module, inputs) for every layer class, built in float64 with small, distinct sizes."""
    from . import layers, masks, model
    from .loss import CrossEntropyLoss
    from .module import Parameter

    B, S, T, D, H, F, V = 2, 5, 4, 6, 2, 10, 7

    def x(*shape):
        return rng.standard_normal(shape)

    src = numpy.array([[4, 5, 6, 3, 5], [6, 4, 3, 0, 0]])                      # (B,S) padded
    tgt = numpy.array([[1, 4, 6, 5], [1, 3, 4, 0]])                            # (B,T) padded
    src_mask = masks.padding_mask(src, 0)                                      # (B,1,1,S)
    tgt_mask = masks.padding_mask(tgt, 0) & masks.subsequent_mask(T)           # (B,1,T,T)
    cases = [
        ("Linear", layers.Linear(D, 3), (x(B, T, D),)),
        ("Embedding", layers.Embedding(V, D, scale=True), (numpy.array([[1, 2, 2, 6], [0, 6, 3, 1]]),)),
        ("PositionalEncoding", layers.PositionalEncoding(D, max_len=16), (x(B, T, D),)),
        ("LearnedPositionalEmbedding", layers.LearnedPositionalEmbedding(16, D), (x(B, T, D),)),
        ("Dropout", layers.Dropout(0.3), (x(B, T, D),)),
        ("ReLU", layers.ReLU(), (x(B, T, D),)),
        ("Softmax", layers.Softmax(axis=-1), (x(B, T, D),)),
        ("Mask", layers.Mask(), (x(B, H, T, S), src_mask)),
        ("LayerNorm", layers.LayerNorm(D), (x(B, T, D),)),
        ("PositionwiseFeedForward", layers.PositionwiseFeedForward(D, F), (x(B, T, D),)),
        ("SublayerConnection (around an FFN)", _Residual(D, F), (x(B, T, D),)),
        ("ScaledDotProductAttention", layers.ScaledDotProductAttention(),
         (x(B, H, T, 3), x(B, H, S, 3), x(B, H, S, 3), src_mask)),
        ("MultiHeadAttention (self, causal)", _SelfAttention(layers.MultiHeadAttention(D, H)),
         (x(B, T, D), tgt_mask)),
        ("MultiHeadAttention (cross)", layers.MultiHeadAttention(D, H), (x(B, T, D), x(B, S, D), x(B, S, D), src_mask)),
        ("EncoderLayer", model.EncoderLayer(D, H, F), (x(B, S, D), src_mask)),
        ("DecoderLayer", model.DecoderLayer(D, H, F), (x(B, T, D), x(B, S, D), tgt_mask, src_mask)),
        ("Encoder (2 layers)", model.Encoder(2, D, H, F), (x(B, S, D), src_mask)),
        ("Decoder (2 layers)", model.Decoder(2, D, H, F), (x(B, T, D), x(B, S, D), tgt_mask, src_mask)),
        ("TiedProjection", model.TiedProjection(Parameter(x(V, D))), (x(B, T, D),)),
        ("MultiHeadAttention (self, restricted r=1)", _SelfAttention(layers.MultiHeadAttention(D, H)),
         (x(B, T, D), masks.padding_mask(tgt, 0) & masks.local_mask(T, 1))),
        ("ScaledDotProductAttention (unscaled)", layers.ScaledDotProductAttention(scale=False),
         (x(B, H, T, 3), x(B, H, S, 3), x(B, H, S, 3), src_mask)),
        ("AdditiveAttention", layers.AdditiveAttention(3, 5), (x(B, H, T, 3), x(B, H, S, 3), x(B, H, S, 4), src_mask)),
        ("RNN", layers.RNN(D), (x(B, T, D),)),
        ("Conv1d (kernel 3)", layers.Conv1d(D, 3), (x(B, T, D),)),
    ]
    config = model.TransformerConfig(V, V, d_model=D, num_heads=H, num_encoder_layers=2, num_decoder_layers=2,
                                     d_ff=F, dropout=0.0, max_len=16, share_embeddings=True)
    cases.append(("Transformer", model.Transformer(config), (src, tgt)))
    target = numpy.array([[4, 6, 5, 2], [3, 4, 2, 0]])                         # (B,T)
    cases.append(("CrossEntropyLoss", _LossModule(CrossEntropyLoss(ignore_index=0, label_smoothing=0.1), target),
                  (x(B, T, V),)))
    return cases


class _SelfAttention(Module):
    """Self-attention as a module of one input: forward(x, mask) = MHA(x, x, x, mask); dx = dq + dk + dv."""

    def __init__(self, mha):
        super().__init__()
        self.mha = mha

    def forward(self, x, mask=None):
        out = self.mha(x, x, x, mask)                                          # (B,T,D)
        self.save_for_backward(out)
        return out

    def backward(self, dout):
        self.saved(dout)
        dq, dk, dv = self.mha.backward(dout)
        return dq + dk + dv                                                    # (B,T,D)


class _Residual(Module):
    """The paper's sublayer connection around a feed-forward network, as EncoderLayer uses it:
    forward(x) = LayerNorm(x + Dropout(FFN(x))) (or x + Dropout(FFN(LayerNorm(x))) with norm_first);
    backward adds the path around the FFN to the path through it."""

    def __init__(self, d_model, d_ff, norm_first=False):
        from . import layers

        super().__init__()
        self.ffn = layers.PositionwiseFeedForward(d_model, d_ff)
        self.sublayer = layers.SublayerConnection(d_model, dropout=0.3, norm_first=norm_first)

    def forward(self, x):
        out = self.sublayer(x, self.ffn)                                       # (B,T,D)
        self.save_for_backward(out)
        return out

    def backward(self, dout):
        self.saved(dout)
        return self.sublayer.backward(dout, self.ffn.backward)                 # (B,T,D)


class _LossModule(Module):
    """CrossEntropyLoss as a module of the logits, so that gradcheck treats it like a layer."""

    def __init__(self, loss_fn, target):
        super().__init__()
        self.loss_fn, self.target = loss_fn, target

    def forward(self, logits):
        out = numpy.asarray(self.loss_fn(logits, self.target))                 # () the loss
        self.save_for_backward(out)
        return out

    def backward(self, dout):
        self.saved(dout)
        return self.loss_fn.backward() * dout                                  # (B,T,V)
