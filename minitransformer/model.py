"""The encoder-decoder Transformer of "Attention Is All You Need": the encoder and decoder layers, their
stacks, and the whole model with its forward and backward pass.

    src (B,S) ─ Embedding·√D ─ +PE ─ Dropout ─ Encoder ×N ─────────────────────┐ memory (B,S,D)
    tgt_in (B,T) ─ Embedding·√D ─ +PE ─ Dropout ─ Decoder ×N (self, cross, FFN) ─ Projection ─ logits (B,T,V)

``backward`` runs the same chain in reverse. The encoder output ("memory") is read by the
cross-attention of every decoder layer, so its gradient is the sum of what each of them sends back.
"""

from __future__ import annotations

from . import backend, budget, checks
from .config import TransformerConfig
from .layers import (
    Dropout,
    Embedding,
    LayerNorm,
    LearnedPositionalEmbedding,
    Linear,
    MultiHeadAttention,
    PositionalEncoding,
    PositionwiseFeedForward,
    SublayerConnection,
)
from .masks import padding_mask, subsequent_mask
from .module import Module, ModuleList, Parameter


class EncoderLayer(Module):
    """x = Sublayer(x, SelfAttention(x, x, x)), then x = Sublayer(x, FFN(x))   (§3.1, Figure 1 left)
    with Sublayer = LayerNorm(x + Dropout(f(x))) (post-LN) or x + Dropout(f(LayerNorm(x))) (norm_first).
                                                            Shapes: x (B,S,D), mask (B,1,1,S) -> (B,S,D)
    Self-attention reads x three times (query, key, value), so its input gradient is dquery + dkey + dvalue.
    Cache: held by the children.
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.0, norm_first: bool = False,
                 d_k: int | None = None, d_v: int | None = None):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout, d_k, d_v)
        self.sublayer_attn = SublayerConnection(d_model, dropout, norm_first)
        self.ffn = PositionwiseFeedForward(d_model, d_ff, dropout)
        self.sublayer_ffn = SublayerConnection(d_model, dropout, norm_first)

    def forward(self, x, mask=None):                           # x (B,S,D)
        x = self.sublayer_attn.forward(x, lambda h: self.self_attn.forward(h, h, h, mask))  # (B,S,D)
        out = self.sublayer_ffn.forward(x, self.ffn.forward)   # (B,S,D)
        self.save_for_backward(out)
        return out

    def backward(self, dout):                                  # dout (B,S,D) -> dx (B,S,D)
        self.saved(dout)
        dx = self.sublayer_ffn.backward(dout, self.ffn.backward)
        return self.sublayer_attn.backward(dx, self.self_attn_backward)

    def self_attn_backward(self, dout):                        # (B,S,D) -> (B,S,D)
        dquery, dkey, dvalue = self.self_attn.backward(dout)
        return dquery + dkey + dvalue                          # x was query, key and value: the three add


class DecoderLayer(Module):
    """y = Sublayer(y, MaskedSelfAttention(y, y, y)); y = Sublayer(y, CrossAttention(y, memory, memory));
    y = Sublayer(y, FFN(y))                                                  (§3.1, Figure 1 right)
        Shapes: y (B,T,D), memory (B,S,D), tgt_mask (B,1,T,T), src_mask (B,1,1,S) -> (B,T,D)
    backward(dout) -> (dy, dmemory): memory is the cross-attention's key and value, so dmemory = dkey + dvalue.
    Cache: held by the children.
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.0, norm_first: bool = False,
                 d_k: int | None = None, d_v: int | None = None):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout, d_k, d_v)
        self.sublayer_self = SublayerConnection(d_model, dropout, norm_first)
        self.cross_attn = MultiHeadAttention(d_model, num_heads, dropout, d_k, d_v)
        self.sublayer_cross = SublayerConnection(d_model, dropout, norm_first)
        self.ffn = PositionwiseFeedForward(d_model, d_ff, dropout)
        self.sublayer_ffn = SublayerConnection(d_model, dropout, norm_first)

    def forward(self, y, memory, tgt_mask=None, src_mask=None):  # y (B,T,D), memory (B,S,D)
        y = self.sublayer_self.forward(y, lambda h: self.self_attn.forward(h, h, h, tgt_mask))             # (B,T,D)
        y = self.sublayer_cross.forward(y, lambda h: self.cross_attn.forward(h, memory, memory, src_mask))  # (B,T,D)
        out = self.sublayer_ffn.forward(y, self.ffn.forward)   # (B,T,D)
        self.save_for_backward(out)
        return out

    def backward(self, dout):                                  # dout (B,T,D) -> dy (B,T,D), dmemory (B,S,D)
        self.saved(dout)
        dy = self.sublayer_ffn.backward(dout, self.ffn.backward)
        dy, dmemory = self.sublayer_cross.backward(dy, self.cross_attn_backward)
        return self.sublayer_self.backward(dy, self.self_attn_backward), dmemory

    def self_attn_backward(self, dout):                        # (B,T,D) -> (B,T,D)
        dquery, dkey, dvalue = self.self_attn.backward(dout)
        return dquery + dkey + dvalue                          # y was query, key and value: the three add

    def cross_attn_backward(self, dout):                       # (B,T,D) -> dy (B,T,D), dmemory (B,S,D)
        dquery, dkey, dvalue = self.cross_attn.backward(dout)
        return dquery, dkey + dvalue                           # y was the query; memory key and value: they add


class Encoder(Module):
    """N EncoderLayers in sequence (plus a final LayerNorm when norm_first).
                                                            Shapes: x (B,S,D), mask (B,1,1,S) -> (B,S,D)"""

    def __init__(self, num_layers: int, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.0,
                 norm_first: bool = False, d_k: int | None = None, d_v: int | None = None):
        super().__init__()
        self.layers = ModuleList(EncoderLayer(d_model, num_heads, d_ff, dropout, norm_first, d_k, d_v)
                                 for _ in range(num_layers))
        self.norm = LayerNorm(d_model) if norm_first else None

    def forward(self, x, mask=None):                           # x (B,S,D)
        for layer in self.layers:
            x = layer.forward(x, mask)                         # (B,S,D)
        out = self.norm.forward(x) if self.norm is not None else x
        self.save_for_backward(out)
        return out

    def backward(self, dout):                                  # dout (B,S,D) -> dx (B,S,D)
        self.saved(dout)
        dx = self.norm.backward(dout) if self.norm is not None else dout
        for layer in reversed(list(self.layers)):
            dx = layer.backward(dx)
        return dx


class Decoder(Module):
    """N DecoderLayers in sequence, each reading the same memory (plus a final LayerNorm when norm_first).
        Shapes: y (B,T,D), memory (B,S,D), tgt_mask (B,1,T,T), src_mask (B,1,1,S) -> (B,T,D)
    backward(dout) -> (dy, dmemory), dmemory the sum over layers of each cross-attention's dkey + dvalue."""

    def __init__(self, num_layers: int, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.0,
                 norm_first: bool = False, d_k: int | None = None, d_v: int | None = None):
        super().__init__()
        self.layers = ModuleList(DecoderLayer(d_model, num_heads, d_ff, dropout, norm_first, d_k, d_v)
                                 for _ in range(num_layers))
        self.norm = LayerNorm(d_model) if norm_first else None

    def forward(self, y, memory, tgt_mask=None, src_mask=None):  # y (B,T,D), memory (B,S,D)
        for layer in self.layers:
            y = layer.forward(y, memory, tgt_mask, src_mask)   # (B,T,D)
        out = self.norm.forward(y) if self.norm is not None else y
        self.save_for_backward(out)
        return out

    def backward(self, dout):                                  # dout (B,T,D) -> dy (B,T,D), dmemory (B,S,D)
        self.saved(dout)
        dy = self.norm.backward(dout) if self.norm is not None else dout
        dmemory = 0.0
        for layer in reversed(list(self.layers)):
            dy, dmemory_of_layer = layer.backward(dy)
            dmemory = dmemory + dmemory_of_layer               # every layer read the memory   (B,S,D)
        return dy, dmemory


class TiedProjection(Module):
    """logits = h E^T: the output projection that reuses the target embedding matrix E (§3.4).
                                                                      Shapes: h (B,T,D) -> logits (B,T,V)
    It holds the embedding's Parameter itself, so backward ADDS dE = dlogits^T h into the same .grad the
    embedding's backward adds its rows into: the tied weight's gradient is the sum of both uses.
    Cache: h.
    """

    def __init__(self, weight: Parameter):
        super().__init__()
        self.weight = weight                                   # E (V,D), shared with the Embedding

    def forward(self, h):                                      # h (B,T,D)
        logits = h @ self.weight.data.T                        # (B,T,V)
        self.save_for_backward(logits, h=h)
        return logits

    def backward(self, dout):                                  # dout (B,T,V) -> dh (B,T,D)
        h = self.saved(dout).h
        V, D = self.weight.data.shape
        self.weight.grad += dout.reshape(-1, V).T @ h.reshape(-1, D)   # dE += dlogits^T h   (V,D)
        return dout @ self.weight.data                         # dh = dlogits E   (B,T,D)

    def extra_repr(self):
        return f"tied to weight of shape {tuple(self.weight.data.shape)}"


class Transformer(Module):
    """The encoder-decoder Transformer.          Shapes: src (B,S) int, tgt_in (B,T) int -> logits (B,T,V)

        memory = Encoder(Dropout(Embed_src(src)·√D + PE))                         (B,S,D)
        logits = Projection(Decoder(Dropout(Embed_tgt(tgt_in)·√D + PE), memory))  (B,T,V)

    Masks come from ``config.pad_id``: the encoder's self-attention and the cross-attention ignore padded
    source positions; the decoder's self-attention ignores padded target positions and later positions.
    Weight tying: ``tie_output`` makes the projection E_tgt^T (no bias); ``share_embeddings`` makes the
    source embedding the same Parameter as the target one. A tied Parameter is listed once by
    ``parameters()`` and its .grad is the sum of all its uses.
    Dropout sits where the paper puts it (§5.4: each sublayer's output, the embedding sums) and, as in
    torch.nn.Transformer, on the attention weights and the feed-forward hidden layer.
    For inference (eval mode): ``encode(src)`` -> memory, ``decode(tgt_in, memory, src_mask)`` -> logits.
    Cache: held by the children.
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        if not isinstance(config, TransformerConfig):
            raise TypeError(f"Transformer: config must be a TransformerConfig, got {type(config).__name__}")
        budget.check_model(config)                            # a model too big for memory is refused unbuilt
        self.config = c = config
        self.src_embed = Embedding(c.src_vocab_size, c.d_model, scale=True)
        self.tgt_embed = Embedding(c.tgt_vocab_size, c.d_model, scale=True)
        if c.share_embeddings:
            self.tgt_embed.weight = self.src_embed.weight     # one Parameter, two lookups (one per call site)
        if c.positional == "sinusoidal":
            self.src_pos, self.tgt_pos = PositionalEncoding(c.d_model, c.max_len), PositionalEncoding(c.d_model, c.max_len)
        else:
            self.src_pos = LearnedPositionalEmbedding(c.max_len, c.d_model)
            self.tgt_pos = LearnedPositionalEmbedding(c.max_len, c.d_model)
        self.src_dropout = Dropout(c.dropout)
        self.tgt_dropout = Dropout(c.dropout)
        sizes = (c.d_model, c.num_heads, c.d_ff, c.dropout, c.norm_first, c.d_k, c.d_v)
        self.encoder = Encoder(c.num_encoder_layers, *sizes)
        self.decoder = Decoder(c.num_decoder_layers, *sizes)
        self.projection = TiedProjection(self.tgt_embed.weight) if c.tie_output else Linear(c.d_model, c.tgt_vocab_size)

    # -- inputs and masks -----------------------------------------------------------------------------
    def token_ids(self, owner: str, name: str, ids, vocab_size: int):
        """Checked (B,T) token ids, on the active backend."""
        return backend.asarray(checks.token_ids(owner, name, ids, vocab_size, ndim=2, max_len=self.config.max_len))

    def src_mask(self, src):
        """True where a source key may be attended.           Shapes: src (B,S) -> (B,1,1,S) bool"""
        return padding_mask(src, self.config.pad_id)

    def tgt_mask(self, tgt_in):
        """Not padding and not in the future.                 Shapes: tgt_in (B,T) -> (B,1,T,T) bool"""
        return padding_mask(tgt_in, self.config.pad_id) & subsequent_mask(tgt_in.shape[1])

    # -- forward ----------------------------------------------------------------------------------------
    def forward(self, src, tgt_in):                            # src (B,S), tgt_in (B,T) -> logits (B,T,V)
        src = self.token_ids("Transformer", "src", src, self.config.src_vocab_size)           # (B,S)
        tgt_in = self.token_ids("Transformer", "tgt_in", tgt_in, self.config.tgt_vocab_size)  # (B,T)
        if src.shape[0] != tgt_in.shape[0]:
            raise ValueError(f"Transformer: src and tgt_in must have the same batch size, got src "
                             f"{tuple(src.shape)} and tgt_in {tuple(tgt_in.shape)}")
        src_mask = self.src_mask(src)                          # (B,1,1,S)
        memory = self.run_encoder(src, src_mask)               # (B,S,D)
        logits = self.run_decoder(tgt_in, memory, src_mask)    # (B,T,V)
        self.save_for_backward(logits)
        return logits

    def run_encoder(self, src, src_mask):                      # src (B,S) -> memory (B,S,D)
        x = self.src_dropout.forward(self.src_pos.forward(self.src_embed.forward(src)))      # (B,S,D)
        return self.encoder.forward(x, src_mask)               # (B,S,D)

    def run_decoder(self, tgt_in, memory, src_mask):           # tgt_in (B,T), memory (B,S,D) -> logits (B,T,V)
        y = self.tgt_dropout.forward(self.tgt_pos.forward(self.tgt_embed.forward(tgt_in)))  # (B,T,D)
        y = self.decoder.forward(y, memory, self.tgt_mask(tgt_in), src_mask)                 # (B,T,D)
        return self.projection.forward(y)                      # (B,T,V)

    # -- backward -----------------------------------------------------------------------------------
    def backward(self, dlogits):                               # dlogits (B,T,V) -> None (ids have no gradient)
        checks.float_array("Transformer.backward", "dlogits", dlogits)
        self.saved(dlogits)
        dy = self.projection.backward(dlogits)                 # (B,T,D)
        dy, dmemory = self.decoder.backward(dy)                # (B,T,D), (B,S,D) summed over decoder layers
        self.tgt_embed.backward(self.tgt_pos.backward(self.tgt_dropout.backward(dy)))
        dx = self.encoder.backward(dmemory)                    # (B,S,D)
        self.src_embed.backward(self.src_pos.backward(self.src_dropout.backward(dx)))

    # -- inference ----------------------------------------------------------------------------------
    def encode(self, src):
        """memory = Encoder(Dropout(Embed(src)·√D + PE)).     Shapes: src (B,S) int -> (B,S,D)
        Inference only (no backward): call ``model.eval()`` first."""
        self.check_eval("encode")
        src = self.token_ids("Transformer.encode", "src", src, self.config.src_vocab_size)
        return self.run_encoder(src, self.src_mask(src))

    def decode(self, tgt_in, memory, src_mask=None):
        """logits for every target position, given the encoder memory.
                            Shapes: tgt_in (B,T) int, memory (B,S,D), src_mask (B,1,1,S) bool -> (B,T,V)
        Inference only (no backward): call ``model.eval()`` first."""
        self.check_eval("decode")
        tgt_in = self.token_ids("Transformer.decode", "tgt_in", tgt_in, self.config.tgt_vocab_size)
        checks.float_array("Transformer.decode", "memory", memory, ndim=3, last_dim=self.config.d_model)
        if memory.shape[0] != tgt_in.shape[0]:
            raise ValueError(f"Transformer.decode: memory must have the batch size of tgt_in ({tgt_in.shape[0]}), "
                             f"got {tuple(memory.shape)}")
        return self.run_decoder(tgt_in, memory, src_mask)

    def check_eval(self, method: str) -> None:
        # In training mode every layer would keep its activations for a backward that never comes, and
        # dropout would make the result random.
        if self.training:
            raise RuntimeError(f"Transformer.{method} is for inference: call model.eval() first")

    def attention_maps(self) -> dict:
        """The attention weights of the last forward (or decoding step), as NumPy arrays for plots.
        {'encoder': [(B,H,S,S) per layer], 'decoder_self': [(B,H,T,T)], 'decoder_cross': [(B,H,T,S)]}; after
        a decoding step, decoder_self (B,H,1,t) and decoder_cross (B,H,1,S)."""
        def weights(attention):
            return None if attention.attn is None else backend.to_numpy(attention.attn)
        return {
            "encoder": [weights(layer.self_attn) for layer in self.encoder.layers],
            "decoder_self": [weights(layer.self_attn) for layer in self.decoder.layers],
            "decoder_cross": [weights(layer.cross_attn) for layer in self.decoder.layers],
        }

    def extra_repr(self):
        c = self.config
        return (f"d_model={c.d_model}, num_heads={c.num_heads}, layers={c.num_encoder_layers}+"
                f"{c.num_decoder_layers}, d_ff={c.d_ff}, parameters={self.num_parameters():,}")


__all__ = ["Decoder", "DecoderLayer", "Encoder", "EncoderLayer", "TiedProjection", "Transformer",
           "TransformerConfig"]
