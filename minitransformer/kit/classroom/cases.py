"""The inputs every exercise is checked on, built with any copy of the core (the package or a student's).
Sizes are small, odd where they can be and all distinct, so that a transposed or mis-broadcast gradient cannot
pass by accident; token batches carry padding, one source is padding alone (its queries have no key)."""

from __future__ import annotations

B, S, T, D, H, F, V = 3, 7, 5, 6, 2, 11, 13


def cases(mt, name: str, rng) -> list:
    """[(label, module, inputs)] for the exercise ``name`` ('linear' also serves 'linear.forward'), built
    with the package ``mt``; call after ``mt.set_default_dtype("float64")``."""
    L, masks, model, wrap = mt.layers, mt.masks, mt.model, mt.gradcheck     # wrap: modules of one input

    def x(*shape):
        return rng.standard_normal(shape)

    def ids(rows, length, low=4, high=V):
        out = rng.integers(low, high, size=(rows, length))     # (rows, length)
        out[1, length - 2:] = 0                                # padding at the end of a sentence
        return out

    src, tgt = ids(B, S), ids(B, T)
    src[2, 1:] = 0                                             # a source that is one token and padding
    src_mask, keyless = masks.padding_mask(src, 0), masks.padding_mask(src, 0).copy()
    keyless[2] = False                                         # a sentence whose queries have no key at all
    tgt_mask = masks.padding_mask(tgt, 0) & masks.subsequent_mask(T)
    config = model.TransformerConfig(V, V, d_model=D, num_heads=H, num_encoder_layers=1, num_decoder_layers=2,
                                     d_ff=F, dropout=0.0, max_len=16, share_embeddings=True, tie_output=True)
    loss = mt.CrossEntropyLoss(ignore_index=0, label_smoothing=0.1)
    build = {
        "linear": lambda: [("Linear(6, 4)", L.Linear(D, 4), (x(B, T, D),))],
        "relu": lambda: [("ReLU", L.ReLU(), (x(B, T, D),))],
        "softmax": lambda: [("Softmax over keys", L.Softmax(axis=-1), (x(B, H, T, S),))],
        "dropout": lambda: [("Dropout(0.3), training", L.Dropout(0.3), (x(B, T, D),))],
        "embedding": lambda: [("Embedding(13, 6), repeated ids", L.Embedding(V, D, scale=True),
                               (rng.integers(0, 4, size=(B, T)),))],
        "feedforward": lambda: [("PositionwiseFeedForward(6, 11), dropout 0.2",
                                 L.PositionwiseFeedForward(D, F, dropout=0.2), (x(B, T, D),))],
        "layernorm": lambda: [("LayerNorm(6)", L.LayerNorm(D), (x(B, T, D) * 3 + 1,))],
        "attention": lambda: [
            ("cross-attention, padding, a keyless row", L.ScaledDotProductAttention(),
             (x(B, H, T, 3), x(B, H, S, 3), x(B, H, S, 4), keyless)),
            ("self-attention, causal, dropout 0.2", L.ScaledDotProductAttention(dropout=0.2),
             (x(B, H, T, 3), x(B, H, T, 3), x(B, H, T, 3), tgt_mask))],
        "multihead": lambda: [
            ("cross-attention", L.MultiHeadAttention(D, H), (x(B, T, D), x(B, S, D), x(B, S, D), src_mask)),
            ("self-attention, causal", wrap.SelfAttention(L.MultiHeadAttention(D, H)), (x(B, T, D), tgt_mask))],
        "sublayer": lambda: [("post-LN around an FFN", wrap.AroundFFN(D, F), (x(B, T, D),)),
                             ("pre-LN around an FFN", wrap.AroundFFN(D, F, norm_first=True), (x(B, T, D),))],
        "encoder_layer": lambda: [("EncoderLayer, dropout 0.1", model.EncoderLayer(D, H, F, dropout=0.1),
                                   (x(B, S, D), src_mask))],
        "decoder_layer": lambda: [("DecoderLayer", model.DecoderLayer(D, H, F),
                                   (x(B, T, D), x(B, S, D), tgt_mask, src_mask))],
        "transformer": lambda: [("Transformer, shared and tied embeddings", model.Transformer(config), (src, tgt))],
        "loss": lambda: [("CrossEntropyLoss, smoothing 0.1, padding", wrap.LossOfLogits(loss, ids(B, T, 0, V)),
                          (x(B, T, V),))],
    }
    built = build[name.split(".")[0]]()
    for _, module, _ in built:         # a bias of zeros or a gain of ones would hide a mistake that drops it
        for p in module.parameters():
            if (p.data == p.data.reshape(-1)[0]).all():
                p.data[...] = p.data + 0.1 * rng.standard_normal(p.data.shape)
    return built
