"""The small commands: ``minitransformer gradcheck``, the table of every layer's largest relative gradient error, for
class; ``minitransformer convert``, checkpoints of earlier versions (.npz) rewritten once as safetensors;
``minitransformer download``, the Multi30k files."""

import numpy

from minitransformer import backend, gradcheck, layers, masks, model
from minitransformer.gradcheck import AroundFFN, LossOfLogits, SelfAttention
from minitransformer.loss import CrossEntropyLoss
from minitransformer.kit.data.datasets import download_multi30k
from minitransformer.kit.running.npz import convert_npz
from minitransformer.module import Parameter


def gradcheck_cases(rng: numpy.random.Generator):
    """(label, module, inputs) for every layer class and model block, to build with the default dtype float64;
    small, distinct sizes, so that a transposed index cannot go unnoticed."""
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
        ("SublayerConnection (around an FFN)", AroundFFN(D, F), (x(B, T, D),)),
        ("ScaledDotProductAttention", layers.ScaledDotProductAttention(),
         (x(B, H, T, 3), x(B, H, S, 3), x(B, H, S, 3), src_mask)),
        ("MultiHeadAttention (self, causal)", SelfAttention(layers.MultiHeadAttention(D, H)),
         (x(B, T, D), tgt_mask)),
        ("MultiHeadAttention (cross)", layers.MultiHeadAttention(D, H), (x(B, T, D), x(B, S, D), x(B, S, D), src_mask)),
        ("EncoderLayer", model.EncoderLayer(D, H, F), (x(B, S, D), src_mask)),
        ("DecoderLayer", model.DecoderLayer(D, H, F), (x(B, T, D), x(B, S, D), tgt_mask, src_mask)),
        ("Encoder (2 layers)", model.Encoder(2, D, H, F), (x(B, S, D), src_mask)),
        ("Decoder (2 layers)", model.Decoder(2, D, H, F), (x(B, T, D), x(B, S, D), tgt_mask, src_mask)),
        ("TiedProjection", model.TiedProjection(Parameter(x(V, D))), (x(B, T, D),)),
        ("MultiHeadAttention (self, restricted r=1)", SelfAttention(layers.MultiHeadAttention(D, H)),
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
    cases.append(("CrossEntropyLoss", LossOfLogits(CrossEntropyLoss(ignore_index=0, label_smoothing=0.1), target),
                  (x(B, T, V),)))
    return cases


def cmd_gradcheck(args) -> int:
    previous = backend.get_default_dtype()
    backend.set_default_dtype("float64")                  # finite differences in float32 are noise
    backend.manual_seed(args.seed)
    try:
        rows = []
        for label, module, inputs in gradcheck_cases(numpy.random.default_rng(args.seed)):
            report = gradcheck.check(module, *inputs, max_entries=args.max_entries, seed=args.seed)
            rows.append((label, len(report.rows), report.max_error, report.ok))
            if args.verbose:
                print(report.table(), end="\n\n")
    finally:
        backend.set_default_dtype(previous)
    width = max(len(r[0]) for r in rows)
    print(f"{'layer':<{width}}  {'tensors':>7}  {'max rel. error':>14}  result")
    print("-" * (width + 35))
    for label, n, err, ok in rows:
        print(f"{label:<{width}}  {n:>7}  {err:>14.2e}  {'ok' if ok else 'FAIL'}")
    failed = [r[0] for r in rows if not r[3]]
    print(f"float64, central differences on up to {args.max_entries} entries per tensor, "
          f"bound {gradcheck.DEFAULT_TOLERANCE:.0e}: "
          + ("all passed" if not failed else f"FAILED: {', '.join(failed)}"))
    return 0 if not failed else 1


def cmd_convert(args) -> int:
    for path in convert_npz(args.path, args.to):
        print(f"wrote {path}")
    return 0


def cmd_download(args) -> int:
    print(f"Multi30k files are in {download_multi30k(args.dir)}")
    return 0
