"""The encoder-decoder Transformer of "Attention Is All You Need": its configuration, the encoder and
decoder layers, their stacks, and the whole model with its forward and backward pass.

    src (B,S) ─ Embedding·√D ─ +PE ─ Dropout ─ Encoder ×N ─────────────────────┐ memory (B,S,D)
    tgt_in (B,T) ─ Embedding·√D ─ +PE ─ Dropout ─ Decoder ×N (self, cross, FFN) ─ Projection ─ logits (B,T,V)

The stacks skip padded positions: they run on the real tokens' rows, (N,D), see ``masks.Packing``.

``backward`` runs the same chain in reverse. The encoder output ("memory") is read by the
cross-attention of every decoder layer, so its gradient is the sum of what each of them sends back.

For inference, ``decode_step`` runs the decoder for the newest target position only, reading the keys
and values of earlier positions from a cache (see ``decoding.py``) instead of recomputing them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import numpy

from . import backend
from .layers import (
    Dropout,
    Embedding,
    LayerNorm,
    Linear,
    MultiHeadAttention,
    PositionalEncoding,
    PositionwiseFeedForward,
    SublayerConnection,
)
from .layers.linear import stacked_linear
from .masks import Packing, padding_mask, subsequent_mask
from .module import Module, ModuleList, Parameter

# ------------------------------------------------------------------------------------------- config

_PRESETS = {
    # The copy/reverse tasks: small enough to train in seconds on a laptop CPU.
    "tiny": {"d_model": 64, "num_heads": 4, "num_encoder_layers": 2, "num_decoder_layers": 2, "d_ff": 128,
             "dropout": 0.0},
    # Multi30k size.
    "small": {"d_model": 256, "num_heads": 8, "num_encoder_layers": 3, "num_decoder_layers": 3, "d_ff": 1024,
              "dropout": 0.1},
    # The paper's base model (Table 3).
    "base": {"d_model": 512, "num_heads": 8, "num_encoder_layers": 6, "num_decoder_layers": 6, "d_ff": 2048,
             "dropout": 0.1},
}


def _is_int(value) -> bool:
    return isinstance(value, (int, numpy.integer)) and not isinstance(value, bool)


@dataclass
class TransformerConfig:
    """Every size and switch of a Transformer, checked when it is made.

    src_vocab_size, tgt_vocab_size   V of the source and target vocabularies
    d_model, num_heads, d_ff         D, H and F (D must be divisible by H, and even for the sinusoids)
    num_encoder_layers, ..._decoder_  N of each stack
    dropout                          P_drop of §5.4, in [0, 1)
    max_len                          the longest source or target sequence (rows of the PE table)
    pad_id, bos_id, eos_id           special token ids, distinct, inside both vocabularies
    share_embeddings                 source embedding = target embedding (needs one shared vocabulary)
    tie_output                       the output projection is the target embedding's transpose (§3.4)
    norm_first                       pre-LN sublayers (x + Sublayer(LayerNorm(x))) plus a final LayerNorm per
                                     stack, instead of the paper's post-LN
    ``to_dict()`` / ``from_dict()`` convert to and from plain JSON-able data (checkpoints).
    """

    src_vocab_size: int
    tgt_vocab_size: int
    d_model: int = 512
    num_heads: int = 8
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    d_ff: int = 2048
    dropout: float = 0.1
    max_len: int = 512
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    share_embeddings: bool = False
    tie_output: bool = True
    norm_first: bool = False

    def __post_init__(self):
        for name in ("src_vocab_size", "tgt_vocab_size", "d_model", "num_heads", "num_encoder_layers",
                     "num_decoder_layers", "d_ff", "max_len"):
            value = getattr(self, name)
            if not _is_int(value) or value <= 0:
                raise ValueError(f"TransformerConfig: {name} must be a positive int, got {value!r}")
            setattr(self, name, int(value))
        if self.d_model % self.num_heads:
            raise ValueError(f"TransformerConfig: d_model must be divisible by num_heads, "
                             f"got d_model={self.d_model}, num_heads={self.num_heads}")
        if self.d_model % 2:
            raise ValueError(f"TransformerConfig: d_model must be even (the positional encoding pairs sin and "
                             f"cos), got {self.d_model}")
        if (isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float, numpy.floating))
                or not 0.0 <= self.dropout < 1.0):
            raise ValueError(f"TransformerConfig: dropout must be a float in [0, 1), got {self.dropout!r}")
        self.dropout = float(self.dropout)
        smallest_vocab = min(self.src_vocab_size, self.tgt_vocab_size)
        for name in ("pad_id", "bos_id", "eos_id"):
            value = getattr(self, name)
            if not _is_int(value) or not 0 <= value < smallest_vocab:
                raise ValueError(f"TransformerConfig: {name} must be an int in [0, {smallest_vocab}) (inside both "
                                 f"vocabularies), got {value!r}")
            setattr(self, name, int(value))
        if len({self.pad_id, self.bos_id, self.eos_id}) < 3:
            raise ValueError(f"TransformerConfig: pad_id, bos_id and eos_id must be distinct, got "
                             f"{self.pad_id}, {self.bos_id}, {self.eos_id}")
        for name in ("share_embeddings", "tie_output", "norm_first"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"TransformerConfig: {name} must be a bool, got {getattr(self, name)!r}")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError(f"TransformerConfig: share_embeddings needs src_vocab_size == tgt_vocab_size, "
                             f"got {self.src_vocab_size} and {self.tgt_vocab_size}")

    @classmethod
    def preset(cls, name: str, **overrides) -> TransformerConfig:
        """A named size ("tiny", "small", "base"); the vocabulary sizes (and anything else) go in overrides."""
        if not isinstance(name, str) or name not in _PRESETS:
            raise ValueError(f"TransformerConfig.preset: name must be one of {sorted(_PRESETS)}, got {name!r}")
        missing = [k for k in ("src_vocab_size", "tgt_vocab_size") if k not in overrides]
        if missing:
            raise TypeError(f"TransformerConfig.preset({name!r}): pass {' and '.join(missing)} as keyword "
                            f"arguments (a preset fixes the sizes, not the vocabularies)")
        return cls(**{**_PRESETS[name], **overrides})

    @classmethod
    def presets(cls) -> list:
        return sorted(_PRESETS)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> TransformerConfig:
        if not isinstance(data, dict):
            raise TypeError(f"TransformerConfig.from_dict: data must be a dict (what to_dict returned), "
                            f"got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"TransformerConfig.from_dict: unknown keys {unknown}; expected keys among {sorted(known)}")
        return cls(**data)


# ------------------------------------------------------------------------- attention with given keys

def project_kv(attention: MultiHeadAttention, x):
    """The keys and values a MultiHeadAttention computes from x, split into heads.
                                                           Shapes: x (B,T,D) -> k, v (B,H,T,Dk)
    Inference only (no backward). The decoder caches them: the encoder memory is projected once per
    sentence, and each new target position adds one row to the self-attention's keys and values.
    """
    k, v = stacked_linear(x, (attention.W_k, attention.W_v))  # (B,T,D) each, from one matmul (speed)
    return attention.split_heads(k), attention.split_heads(v)  # (B,H,T,Dk) each


def attend(attention: MultiHeadAttention, query, k, v, mask=None):
    """MultiHeadAttention's forward with keys and values already projected (by ``project_kv``).
                                     Shapes: query (B,Tq,D), k, v (B,H,Tk,Dk), mask (B|1,1,Tq|1,Tk) -> (B,Tq,D)
    The same arithmetic as ``attention(query, key, value, mask)``; inference only (no backward).
    """
    q = attention.split_heads(attention.W_q(query))           # (B,H,Tq,Dk)
    heads = attention.attention(q, k, v, mask)                # (B,H,Tq,Dk)
    return attention.W_o(attention.merge_heads(heads))        # (B,Tq,D)


# ------------------------------------------------------------------------------------------- layers

class EncoderLayer(Module):
    """x = Sublayer(x, SelfAttention(x, x, x)), then x = Sublayer(x, FFN(x))   (§3.1, Figure 1 left)
    with Sublayer = LayerNorm(x + Dropout(f(x))) (post-LN) or x + Dropout(f(LayerNorm(x))) (norm_first).
                                                            Shapes: x (B,S,D), mask (B,1,1,S) -> (B,S,D)
    With packing (a ``masks.Packing`` of the source), x holds the rows of the real tokens only, (N,D) -> (N,D).
    Cache: held by the children. Self-attention reads x three times (query, key, value), so its input
    gradient is dquery + dkey + dvalue.
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.0, norm_first: bool = False):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout)
        self.sublayer_attn = SublayerConnection(d_model, dropout, norm_first)
        self.ffn = PositionwiseFeedForward(d_model, d_ff, dropout)
        self.sublayer_ffn = SublayerConnection(d_model, dropout, norm_first)

    def forward(self, x, mask=None, packing=None):             # x (B,S,D) or (N,D)
        x = self.sublayer_attn(x, lambda h: self.self_attn(h, h, h, mask, (packing, packing)))  # (B,S,D) or (N,D)
        return self.sublayer_ffn(x, self.ffn)                  # (B,S,D) or (N,D)

    def backward(self, dout):                                  # dout (B,S,D) -> dx (B,S,D)  (or (N,D) each)
        dx = self.sublayer_ffn.backward(dout, self.ffn.backward)
        return self.sublayer_attn.backward(dx, self._self_attn_backward)

    def _self_attn_backward(self, dout):
        dquery, dkey, dvalue = self.self_attn.backward(dout)
        return dquery + dkey + dvalue                          # x was query, key and value (B,S,D) or (N,D)


class DecoderLayer(Module):
    """y = Sublayer(y, MaskedSelfAttention(y, y, y)); y = Sublayer(y, CrossAttention(y, memory, memory));
    y = Sublayer(y, FFN(y))                                                  (§3.1, Figure 1 right)
        Shapes: y (B,T,D), memory (B,S,D), tgt_mask (B,1,T,T), src_mask (B,1,1,S) -> (B,T,D)
    packing=(target's, source's) ``masks.Packing`` (either may be None): y, resp. memory, holds the rows of
    the real tokens only, (Nt,D), resp. (Ns,D); the output is then (Nt,D).
    backward(dout) -> (dy, dmemory): memory is the cross-attention's key and value, so dmemory = dkey + dvalue.
    Cache: held by the children.
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.0, norm_first: bool = False):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout)
        self.sublayer_self = SublayerConnection(d_model, dropout, norm_first)
        self.cross_attn = MultiHeadAttention(d_model, num_heads, dropout)
        self.sublayer_cross = SublayerConnection(d_model, dropout, norm_first)
        self.ffn = PositionwiseFeedForward(d_model, d_ff, dropout)
        self.sublayer_ffn = SublayerConnection(d_model, dropout, norm_first)

    def forward(self, y, memory, tgt_mask=None, src_mask=None, packing=(None, None)):  # y (B,T,D), memory (B,S,D)
        tgt_rows = packing[0]                                  # self-attention: the target on both sides
        y = self.sublayer_self(y, lambda h: self.self_attn(h, h, h, tgt_mask, (tgt_rows, tgt_rows)))  # (B,T,D)
        y = self.sublayer_cross(y, lambda h: self.cross_attn(h, memory, memory, src_mask, packing))  # (B,T,D)
        return self.sublayer_ffn(y, self.ffn)                  # (B,T,D)   (or (Nt,D), each of the three)

    def backward(self, dout):                  # dout (B,T,D) -> dy (B,T,D), dmemory (B,S,D); or (Nt,D), (Ns,D)
        dy = self.sublayer_ffn.backward(dout, self.ffn.backward)
        dy = self.sublayer_cross.backward(dy, self._cross_attn_backward)
        dy = self.sublayer_self.backward(dy, self._self_attn_backward)
        dmemory, self._dmemory = self._dmemory, None
        return dy, dmemory

    def _cross_attn_backward(self, dout):
        dquery, dkey, dvalue = self.cross_attn.backward(dout)
        self._dmemory = dkey + dvalue                          # memory was key and value (B,S,D) or (Ns,D)
        return dquery                                          # y was the query (B,T,D) or (Nt,D)

    def _self_attn_backward(self, dout):
        dquery, dkey, dvalue = self.self_attn.backward(dout)
        return dquery + dkey + dvalue                          # (B,T,D) or (Nt,D)

    # -- inference, one new position at a time -----------------------------------------------------
    def project_memory(self, memory):
        """The cross-attention's keys and values of the encoder memory, computed once per sentence.
                                                              Shapes: memory (B,S,D) -> k, v (B,H,S,Dk)"""
        return project_kv(self.cross_attn, memory)

    def step(self, y, cache, i: int):
        """forward for the newest position only.         Shapes: y (B,1,D) -> (B,1,D)

        ``cache.self_k[i]``, ``cache.self_v[i]`` (B,H,t,Dk) hold the keys and values of the t earlier
        positions; this step appends the new position's row. ``cache.cross_k[i]``, ``cache.cross_v[i]``
        (B,H,S,Dk) hold the projected memory. No causal mask is needed: the prefix is all there is.
        """
        xp = backend.xp()

        def self_attention(h):                                 # h (B,1,D), the sublayer's input
            k, v = project_kv(self.self_attn, h)               # (B,H,1,Dk)
            cache.self_k[i] = k if cache.self_k[i] is None else xp.concatenate([cache.self_k[i], k], axis=2)
            cache.self_v[i] = v if cache.self_v[i] is None else xp.concatenate([cache.self_v[i], v], axis=2)
            return attend(self.self_attn, h, cache.self_k[i], cache.self_v[i])   # (B,1,D)

        y = self.sublayer_self(y, self_attention)              # (B,1,D)
        y = self.sublayer_cross(y, lambda h: attend(self.cross_attn, h, cache.cross_k[i], cache.cross_v[i],
                                                    cache.src_mask))  # (B,1,D)
        return self.sublayer_ffn(y, self.ffn)                  # (B,1,D)


class Encoder(Module):
    """N EncoderLayers in sequence (plus a final LayerNorm when norm_first).
                                                            Shapes: x (B,S,D), mask (B,1,1,S) -> (B,S,D)
    With packing (a ``masks.Packing``), x and the output are the real tokens' rows (N,D), see EncoderLayer.
    Cache: held by the layers.
    """

    def __init__(self, num_layers: int, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.0,
                 norm_first: bool = False):
        super().__init__()
        self.layers = ModuleList(EncoderLayer(d_model, num_heads, d_ff, dropout, norm_first)
                                 for _ in range(num_layers))
        self.norm = LayerNorm(d_model) if norm_first else None

    def forward(self, x, mask=None, packing=None):             # x (B,S,D) or (N,D)
        for layer in self.layers:
            x = layer(x, mask, packing)                        # (B,S,D) or (N,D)
        return self.norm(x) if self.norm is not None else x    # (B,S,D) or (N,D)

    def backward(self, dout):                                  # dout (B,S,D) -> dx (B,S,D), or (N,D) each
        dx = self.norm.backward(dout) if self.norm is not None else dout
        for layer in reversed(list(self.layers)):
            dx = layer.backward(dx)
        return dx


class Decoder(Module):
    """N DecoderLayers in sequence, each reading the same memory (plus a final LayerNorm when norm_first).
        Shapes: y (B,T,D), memory (B,S,D), tgt_mask (B,1,T,T), src_mask (B,1,1,S) -> (B,T,D)
    packing=(target's, source's): y, memory and the output as the real tokens' rows, see DecoderLayer.
    backward(dout) -> (dy, dmemory) with dmemory = the sum over layers of each cross-attention's dkey + dvalue.
    Cache: held by the layers.
    """

    def __init__(self, num_layers: int, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.0,
                 norm_first: bool = False):
        super().__init__()
        self.layers = ModuleList(DecoderLayer(d_model, num_heads, d_ff, dropout, norm_first)
                                 for _ in range(num_layers))
        self.norm = LayerNorm(d_model) if norm_first else None

    def forward(self, y, memory, tgt_mask=None, src_mask=None, packing=(None, None)):  # y (B,T,D), memory (B,S,D)
        for layer in self.layers:
            y = layer(y, memory, tgt_mask, src_mask, packing)  # (B,T,D) or (Nt,D)
        return self.norm(y) if self.norm is not None else y    # (B,T,D) or (Nt,D)

    def backward(self, dout):                                  # dout (B,T,D) -> dy (B,T,D), dmemory (B,S,D)
        dy = self.norm.backward(dout) if self.norm is not None else dout
        dmemory = None
        for layer in reversed(list(self.layers)):
            dy, dmem_layer = layer.backward(dy)
            dmemory = dmem_layer if dmemory is None else dmemory + dmem_layer  # every layer read memory
        return dy, dmemory

    def step(self, y, cache):                                  # y (B,1,D) -> (B,1,D)
        for i, layer in enumerate(self.layers):
            y = layer.step(y, cache, i)                        # (B,1,D)
        return self.norm(y) if self.norm is not None else y    # (B,1,D)


class TiedProjection(Module):
    """logits = h E^T: the output projection that reuses the target embedding matrix E (§3.4).
                                                                      Shapes: h (B,T,D) -> logits (B,T,V)
    It holds the embedding's Parameter itself, so backward ADDS dE = dlogits^T h into the same .grad the
    embedding's backward adds its rows into: the tied weight's gradient is the sum of both uses.
    Cache: h (as its 2-D view).
    """

    def __init__(self, weight: Parameter):
        super().__init__()
        self.weight = weight                                   # E (V,D), shared with the Embedding

    def forward(self, h):                                      # h (B,T,D)
        V, D = self.weight.data.shape
        self.h2d = h.reshape(-1, D)                            # (N,D)
        logits = self.h2d @ self.weight.data.T                 # (N,V)
        return logits.reshape(*h.shape[:-1], V)                # (B,T,V)

    def backward(self, dout):                                  # dout (B,T,V) -> dh (B,T,D)
        V, D = self.weight.data.shape
        dout2d = dout.reshape(-1, V)                           # (N,V)
        self.weight.grad += dout2d.T @ self.h2d                # dE += dlogits^T h   (V,D)
        dh = dout2d @ self.weight.data                         # (N,D)
        self.h2d = None
        return dh.reshape(*dout.shape[:-1], D)                 # (B,T,D)

    def extra_repr(self):
        return f"tied to weight of shape {tuple(self.weight.data.shape)}"


# -------------------------------------------------------------------------------------------- model

def as_token_ids(owner: str, name: str, ids, vocab_size: int, max_len: int):
    """Check a batch of token ids.                                       Shapes: (B,T) int -> (B,T) int
    Accepts NumPy (host) arrays on any backend, arrays of the active backend, and nested lists; returns a
    NumPy array for host data (the caller builds the Packing there, then moves the ids to the backend)."""
    if isinstance(ids, (list, tuple)):
        try:
            ids = numpy.asarray(ids)
        except ValueError:
            raise ValueError(f"{owner}: {name} must be a rectangular (B, T) table of token ids (pad the shorter "
                             f"sentences), got rows of different lengths") from None
        if ids.size == 0:
            ids = ids.astype(numpy.int64)                     # [] or [[]] is empty, not a float array
    if not backend.is_array(ids):
        raise TypeError(f"{owner}: {name} must be a 2-D integer array (B, T) of token ids, got {type(ids).__name__}")
    if ids.dtype.kind not in "iu":
        raise TypeError(f"{owner}: {name} must hold integer token ids, got dtype {ids.dtype}")
    if ids.ndim != 2:
        raise ValueError(f"{owner}: {name} must be a 2-D array (B, T) of token ids, got shape {tuple(ids.shape)}")
    if ids.shape[0] == 0 or ids.shape[1] == 0:
        raise ValueError(f"{owner}: {name} must be non-empty, got shape {tuple(ids.shape)}")
    if ids.shape[1] > max_len:
        raise ValueError(f"{owner}: {name} has length {ids.shape[1]}, longer than the config's max_len={max_len}")
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab_size:
        raise ValueError(f"{owner}: {name} must hold token ids in [0, {vocab_size}), got values in [{low}, {high}]")
    return ids


class Transformer(Module):
    """The encoder-decoder Transformer.          Shapes: src (B,S) int, tgt_in (B,T) int -> logits (B,T,V)

        memory = Encoder(Dropout(Embed_src(src)·√D + PE))                       (B,S,D)
        logits = Projection(Decoder(Dropout(Embed_tgt(tgt_in)·√D + PE), memory)) (B,T,V)

    Masks come from ``config.pad_id``: the encoder's self-attention and the cross-attention ignore padded
    source positions; the decoder's self-attention ignores padded target positions and later positions.
    Padding is skipped, not computed: the encoder and decoder stacks run on the rows of the real tokens
    only (see ``masks.Packing``). The loss and every gradient are those of the padded computation; what
    changes is the output at padded positions of tgt_in, which no loss reads: their logits are those of a
    zero vector (0 with the tied projection, the bias without), and their dlogits reach no weight (only an
    untied projection's bias, as in the padded computation); ``encode``
    gives zero memory rows at padded source positions. So the gradients equal those of the padded
    computation when dlogits is 0 wherever tgt_in is padding, as the loss makes it when tgt_out is padding
    there too (true of right-padded batches, tgt_in = tgt[:, :-1] and tgt_out = tgt[:, 1:]).
    Weight tying: ``tie_output`` makes the projection E_tgt^T (no bias); ``share_embeddings`` makes the
    source embedding the same Parameter as the target one. A tied Parameter is listed once by
    ``parameters()`` and its .grad is the sum of all its uses.
    Dropout (config.dropout) sits where the paper puts it (§5.4: each sublayer's output, the embedding
    sums) and, as in torch.nn.Transformer and the Annotated Transformer, on the attention weights and
    the feed-forward hidden layer.
    ``backward(dlogits)`` fills every parameter's .grad and returns None (token ids have no gradient).
    For inference: ``encode(src)`` -> memory, ``decode(tgt_in, memory, src_mask)`` -> logits, and
    ``decode_step`` (one new position, with a key/value cache; see decoding.py).
    Cache: held by the children, plus the forward's two Packings (target, source) for backward.
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        if not isinstance(config, TransformerConfig):
            raise TypeError(f"Transformer: config must be a TransformerConfig, got {type(config).__name__}")
        self.config = config
        c = config
        self.src_embed = Embedding(c.src_vocab_size, c.d_model, scale=True)
        self.tgt_embed = Embedding(c.tgt_vocab_size, c.d_model, scale=True)
        if c.share_embeddings:
            self.tgt_embed.weight = self.src_embed.weight     # one Parameter, two lookups (one per call site)
        self.src_pos = PositionalEncoding(c.d_model, c.max_len)
        self.tgt_pos = PositionalEncoding(c.d_model, c.max_len)
        self.src_dropout = Dropout(c.dropout)
        self.tgt_dropout = Dropout(c.dropout)
        self.encoder = Encoder(c.num_encoder_layers, c.d_model, c.num_heads, c.d_ff, c.dropout, c.norm_first)
        self.decoder = Decoder(c.num_decoder_layers, c.d_model, c.num_heads, c.d_ff, c.dropout, c.norm_first)
        if c.tie_output:
            self.projection = TiedProjection(self.tgt_embed.weight)
        else:
            self.projection = Linear(c.d_model, c.tgt_vocab_size)

    # -- masks ----------------------------------------------------------------------------------------
    def src_mask(self, src):
        """True where a source key may be attended.           Shapes: src (B,S) -> (B,1,1,S) bool"""
        return padding_mask(src, self.config.pad_id)

    def tgt_mask(self, tgt_in):
        """Not padding and not in the future.                 Shapes: tgt_in (B,T) -> (B,1,T,T) bool"""
        return padding_mask(tgt_in, self.config.pad_id) & subsequent_mask(tgt_in.shape[1])  # (B,1,T,T)

    # -- forward ------------------------------------------------------------------------------------
    def forward(self, src, tgt_in):                            # src (B,S), tgt_in (B,T) -> logits (B,T,V)
        c = self.config
        src = as_token_ids("Transformer", "src", src, c.src_vocab_size, c.max_len)
        tgt_in = as_token_ids("Transformer", "tgt_in", tgt_in, c.tgt_vocab_size, c.max_len)
        if src.shape[0] != tgt_in.shape[0]:
            raise ValueError(f"Transformer: src and tgt_in must have the same batch size, got src "
                             f"{tuple(src.shape)} and tgt_in {tuple(tgt_in.shape)}")
        (src, src_rows), (tgt_in, tgt_rows) = self._packed(src), self._packed(tgt_in)
        src_mask = self.src_mask(src)                          # (B,1,1,S)
        memory = self._encode(src, src_mask, src_rows)         # (Ns,D) rows of the real source tokens
        logits = self._decode(tgt_in, memory, src_mask, (tgt_rows, src_rows))  # (B,T,V)
        self._packing = (tgt_rows, src_rows)
        return logits

    def encode(self, src):
        """memory = Encoder(Dropout(Embed(src)·√D + PE)).     Shapes: src (B,S) int -> (B,S,D)
        Zero rows at padded positions (the encoder skips them; every attention masks them).
        Inference only (it has no backward): call ``model.eval()`` first."""
        c = self.config
        src, src_rows = self._packed(as_token_ids("Transformer.encode", "src", src, c.src_vocab_size, c.max_len))
        self._check_inference("encode")
        return src_rows.unpack(self._encode(src, self.src_mask(src), src_rows))   # (B,S,D)

    def decode(self, tgt_in, memory, src_mask=None):
        """logits for every target position, given the encoder memory.
                            Shapes: tgt_in (B,T) int, memory (B,S,D), src_mask (B,1,1,S) bool -> (B,T,V)
        Inference only (it has no backward): call ``model.eval()`` first."""
        c = self.config
        tgt_in, tgt_rows = self._packed(as_token_ids("Transformer.decode", "tgt_in", tgt_in, c.tgt_vocab_size,
                                                     c.max_len))
        if not backend.is_array(memory) or memory.dtype.kind != "f":
            raise TypeError(f"Transformer.decode: memory must be a float array (B, S, d_model), as encode returns, "
                            f"got {getattr(memory, 'dtype', type(memory).__name__)}")
        if memory.ndim != 3 or memory.shape[0] != tgt_in.shape[0] or memory.shape[2] != c.d_model:
            raise ValueError(f"Transformer.decode: memory must have shape (B={tgt_in.shape[0]}, S, "
                             f"d_model={c.d_model}), got {tuple(memory.shape)}")
        self._check_inference("decode")
        return self._decode(tgt_in, memory, src_mask, (tgt_rows, None))  # memory as given, (B,S,D)

    def _check_inference(self, method):
        # In training mode every layer would cache its activations for a backward that never comes, and the
        # next training step would stop at "forward was called twice"; dropout would make the result random.
        if self.training:
            raise RuntimeError(f"Transformer.{method} is for inference: call model.eval() first")

    def _packed(self, ids):
        """Checked ids -> (ids on the active backend, their Packing). The Packing is built before the ids
        move, from host ids when they came from the host: a GPU step copies ids to the device, never back."""
        return backend.asarray(ids), Packing(ids, self.config.pad_id)

    def _encode(self, src, src_mask, src_rows):                # -> (Ns,D) rows of the real source tokens
        x = self.src_dropout(self.src_pos(self.src_embed(src, check_range=False)))  # (B,S,D)
        return self.encoder(src_rows.pack(x), src_mask, src_rows)  # (Ns,D)

    def _decode(self, tgt_in, memory, src_mask, packing):      # packing = (tgt_rows, src_rows or None)
        y = self.tgt_dropout(self.tgt_pos(self.tgt_embed(tgt_in, check_range=False)))  # (B,T,D)
        tgt_rows = packing[0]
        y = self.decoder(tgt_rows.pack(y), memory, self.tgt_mask(tgt_in), src_mask, packing)  # (Nt,D)
        return self.projection(tgt_rows.unpack(y))             # (B,T,V); zero rows in, at the padding

    # -- backward -----------------------------------------------------------------------------------
    def backward(self, dlogits):                               # dlogits (B,T,V) -> None
        # Module checked that a forward came first and that dlogits has the logits' shape.
        if not hasattr(dlogits, "dtype") or dlogits.dtype.kind != "f":
            raise TypeError(f"Transformer.backward: dlogits must be a float array of the logits' shape, "
                            f"got {getattr(dlogits, 'dtype', type(dlogits).__name__)}")
        (tgt_rows, src_rows), self._packing = self._packing, None
        dy = tgt_rows.pack(self.projection.backward(dlogits))  # (Nt,D): the padded rows' gradient goes nowhere
        dy, dmemory = self.decoder.backward(dy)                # (Nt,D), (Ns,D) summed over decoder layers
        dy = tgt_rows.unpack(dy)                               # (B,T,D), 0 at the padding
        self.tgt_embed.backward(self.tgt_pos.backward(self.tgt_dropout.backward(dy)))
        dx = src_rows.unpack(self.encoder.backward(dmemory))   # (B,S,D), 0 at the padding
        self.src_embed.backward(self.src_pos.backward(self.src_dropout.backward(dx)))

    # -- incremental decoding -----------------------------------------------------------------------
    def decode_step(self, last_ids, cache):
        """logits for the next token, running the decoder for the newest position only.
                                                         Shapes: last_ids (B,1) int -> logits (B,V)
        ``cache`` (a ``decoding.KVCache``) holds the projected memory, the source mask, and the keys and
        values of the ``cache.length`` earlier positions; this call appends one position to it.
        Inference only: call ``model.eval()`` first.
        """
        self._check_inference("decode_step")
        y = self.tgt_pos(self.tgt_embed(last_ids), offset=cache.length)  # (B,1,D), dropout is off in eval
        y = self.decoder.step(y, cache)                        # (B,1,D)
        cache.length += 1
        return self.projection(y)[:, -1]                       # (B,V)

    # -- inspection ---------------------------------------------------------------------------------
    def attention_maps(self) -> dict:
        """The attention weights of the last forward (or decoding step), as NumPy arrays for plots.
        {'encoder': [(B,H,S,S) per layer], 'decoder_self': [(B,H,T,T)], 'decoder_cross': [(B,H,T,S)]}; after
        a decoding step, decoder_self (B,H,1,t) and decoder_cross (B,H,1,S), t the positions decoded so far
        and B the rows still decoding (B*beam_size in beam search)."""
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
           "TransformerConfig", "attend", "project_kv"]
