"""The fast Transformer: the core model with its layers swapped for their fast twins, and the encoder and
decoder stacks run on the real tokens' rows only (``Packing``)."""

from __future__ import annotations

from .. import backend, checks
from .. import model as core
from . import layers
from .packing import Packing, pack, unpack


class EncoderLayer(core.EncoderLayer):
    """The core layer, with packing (a ``Packing`` of the source): x holds the real tokens' rows (N,D)."""

    def forward(self, x, mask=None, packing=None):             # x (B,S,D) or (N,D)
        x = self.sublayer_attn.forward(x, lambda h: self.self_attn.forward(h, h, h, mask, (packing, packing)))
        out = self.sublayer_ffn.forward(x, self.ffn.forward)
        self.save_for_backward(out)
        return out


class DecoderLayer(core.DecoderLayer):
    """The core layer, with packing=(target's, source's): y, resp. memory, as the real tokens' rows."""

    def forward(self, y, memory, tgt_mask=None, src_mask=None, packing=(None, None)):
        tgt_rows = packing[0]                                  # self-attention: the target on both sides
        y = self.sublayer_self.forward(y, lambda h: self.self_attn.forward(h, h, h, tgt_mask, (tgt_rows, tgt_rows)))
        y = self.sublayer_cross.forward(y, lambda h: self.cross_attn.forward(h, memory, memory, src_mask, packing))
        out = self.sublayer_ffn.forward(y, self.ffn.forward)
        self.save_for_backward(out)
        return out


class Encoder(core.Encoder):
    def forward(self, x, mask=None, packing=None):             # x (B,S,D) or (N,D)
        for layer in self.layers:
            x = layer.forward(x, mask, packing)
        out = self.norm.forward(x) if self.norm is not None else x
        self.save_for_backward(out)
        return out


class Decoder(core.Decoder):
    def forward(self, y, memory, tgt_mask=None, src_mask=None, packing=(None, None)):
        for layer in self.layers:
            y = layer.forward(y, memory, tgt_mask, src_mask, packing)
        out = self.norm.forward(y) if self.norm is not None else y
        self.save_for_backward(out)
        return out


class TiedProjection(core.TiedProjection):
    """logits = h E^T on the 2-D view (N,D) of h: one GEMM."""

    def forward(self, h):                                      # h (B,T,D)
        V, D = self.weight.data.shape
        h2d = h.reshape(-1, D)                                 # (N,D)
        logits = (h2d @ self.weight.data.T).reshape(*h.shape[:-1], V)   # (B,T,V)
        self.save_for_backward(logits, h=h2d)
        return logits

    def backward(self, dout):                                  # dout (B,T,V) -> dh (B,T,D)
        h2d = self.saved(dout).h
        V, D = self.weight.data.shape
        dout2d = dout.reshape(-1, V)                           # (N,V)
        self.weight.grad += dout2d.T @ h2d                     # dE += dlogits^T h   (V,D)
        return (dout2d @ self.weight.data).reshape(*dout.shape[:-1], D)


# Every fast class subclasses its core twin and adds no state of its own, so a core module becomes its fast
# twin by changing its class: the same Parameters, names and state_dict, only forward and backward differ.
FAST_TWINS = {cls.__bases__[0]: cls for cls in (
    layers.Linear, layers.Embedding, layers.Dropout, layers.ReLU, layers.Softmax, layers.LayerNorm,
    layers.ScaledDotProductAttention, layers.MultiHeadAttention, layers.PositionwiseFeedForward,
    EncoderLayer, DecoderLayer, Encoder, Decoder, TiedProjection)}
_CORE, _FAST, _FAST_SET = tuple(FAST_TWINS), tuple(FAST_TWINS.values()), set(FAST_TWINS.values())


def make_fast(module):
    """Give every part of module whose class is a core class in FAST_TWINS its twin's class, in place (the same
    objects, Parameters and state_dict), and return module: how ``mt.fast.Transformer`` is built. A subclass of
    such a core class is refused (TypeError naming it): its twin would drop what the subclass changes."""
    for m in module.modules():
        object.__setattr__(m, "__class__", FAST_TWINS.get(type(m), type(m)))
    check_fast(module, "mt.fast.make_fast")
    return module


def check_fast(module, owner: str) -> None:
    """A TypeError naming the first part of module that the fast tier cannot run as it is: a core class with a
    fast twin, or a subclass of one that is not a fast class. It runs at every pass: a walk without names first."""
    stack = [module]
    while stack:
        m = stack.pop()
        if type(m) not in _FAST_SET and isinstance(m, _CORE) and not isinstance(m, _FAST):
            break
        stack.extend(m._modules.values())
    else:
        return
    for name, m in module.named_modules():
        if isinstance(m, _CORE) and not isinstance(m, _FAST):
            base, where = next(c for c in type(m).__mro__ if c in FAST_TWINS), name or "the module"
            if type(m) is base:
                raise TypeError(f"{owner}: {where} is the core {base.__name__}, not its fast twin "
                                f"(mt.fast.make_fast(model) makes it one)")
            raise TypeError(f"{owner}: {where} is a {type(m).__name__}, a subclass of the core {base.__name__}; its "
                            f"fast twin would drop what it changes, so subclass "
                            f"{FAST_TWINS[base].__module__}.{base.__name__} instead")


class Transformer(core.Transformer):
    """``mt.Transformer`` made fast: the same config, parameter names and state_dict (a checkpoint loads into
    either), with dropout 0 the same logits at every real target position and the same gradients.
    Built as the core model turned fast by ``make_fast``; a pass checks that no core layer was put in since.

    The encoder and decoder stacks skip padded positions: they run on the rows of the real tokens only.
    What changes is the output at padded positions of tgt_in, which no loss reads: their logits are those
    of a zero vector (0 with the tied projection, the bias without); ``encode`` gives zero memory rows at
    padded source positions. The gradients equal the core's when dlogits is 0 wherever tgt_in is padding,
    as the loss makes it when tgt_out is padding there too (true of right-padded batches,
    tgt_in = tgt[:, :-1] and tgt_out = tgt[:, 1:]).
    Cache: held by the children, plus the two Packings (target, source).
    """

    def __init__(self, config):
        super().__init__(config)
        make_fast(self)

    def packed(self, owner: str, name: str, ids, vocab_size: int):
        """Checked ids -> (ids on the active backend, their Packing), the Packing built from the host ids
        before they move: a GPU step copies ids to the device, never back."""
        ids = checks.token_ids(owner, name, ids, vocab_size, ndim=2, max_len=self.config.max_len)
        return backend.asarray(ids), Packing(ids, self.config.pad_id)

    def forward(self, src, tgt_in):                            # src (B,S), tgt_in (B,T) -> logits (B,T,V)
        c = self.config
        src, src_rows = self.packed("Transformer", "src", src, c.src_vocab_size)
        tgt_in, tgt_rows = self.packed("Transformer", "tgt_in", tgt_in, c.tgt_vocab_size)
        if src.shape[0] != tgt_in.shape[0]:
            raise ValueError(f"Transformer: src and tgt_in must have the same batch size, got src "
                             f"{tuple(src.shape)} and tgt_in {tuple(tgt_in.shape)}")
        src_mask = self.src_mask(src)                          # (B,1,1,S)
        memory = self.run_encoder(src, src_mask, src_rows)     # (Ns,D)
        logits = self.run_decoder(tgt_in, memory, src_mask, tgt_rows, src_rows)   # (B,T,V)
        self.save_for_backward(logits, packing=(tgt_rows, src_rows))
        return logits

    def run_encoder(self, src, src_mask, src_rows=None):      # -> (Ns,D) with packing, else (B,S,D)
        check_fast(self, "mt.fast.Transformer")                # a core layer put in since would get packed rows
        x = self.src_dropout.forward(self.src_pos.forward(self.src_embed.forward(src)))   # (B,S,D)
        return self.encoder.forward(pack(src_rows, x), src_mask, src_rows)

    def run_decoder(self, tgt_in, memory, src_mask, tgt_rows=None, src_rows=None):   # -> logits (B,T,V)
        check_fast(self, "mt.fast.Transformer")
        y = self.tgt_dropout.forward(self.tgt_pos.forward(self.tgt_embed.forward(tgt_in)))   # (B,T,D)
        y = self.decoder.forward(pack(tgt_rows, y), memory, self.tgt_mask(tgt_in), src_mask, (tgt_rows, src_rows))
        return self.projection.forward(unpack(tgt_rows, y))    # (B,T,V); zero rows in, at the padding

    def backward(self, dlogits):                               # dlogits (B,T,V) -> None
        checks.float_array("Transformer.backward", "dlogits", dlogits)
        tgt_rows, src_rows = self.saved(dlogits).packing
        dy = pack(tgt_rows, self.projection.backward(dlogits))  # (Nt,D): the padded rows' gradient goes nowhere
        dy, dmemory = self.decoder.backward(dy)                # (Nt,D), (Ns,D)
        self.tgt_embed.backward(self.tgt_pos.backward(self.tgt_dropout.backward(unpack(tgt_rows, dy))))
        dx = unpack(src_rows, self.encoder.backward(dmemory))  # (B,S,D), 0 at the padding
        self.src_embed.backward(self.src_pos.backward(self.src_dropout.backward(dx)))

    def encode(self, src):
        """memory (B,S,D), with zero rows at padded source positions. Inference only: ``model.eval()`` first."""
        self.check_eval("encode")
        src, src_rows = self.packed("Transformer.encode", "src", src, self.config.src_vocab_size)
        return unpack(src_rows, self.run_encoder(src, self.src_mask(src), src_rows))
