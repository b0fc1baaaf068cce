"""TransformerConfig: every size and switch of a Transformer, checked once when it is made."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from . import checks

PRESETS = {
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
POSITIONAL = ("sinusoidal", "learned")


@dataclass
class TransformerConfig:
    """Every size and switch of a Transformer.

    src_vocab_size, tgt_vocab_size   V of the source and target vocabularies
    d_model, num_heads, d_ff         D, H and F (D even for the sinusoids)
    d_k                              the size of each head's queries and keys; None: D / H (which must then divide)
    d_v                              the size of each head's values; None: d_k (the paper's d_v = d_k)
    num_encoder_layers, ..._decoder_  N of each stack
    dropout                          P_drop of §5.4, in [0, 1)
    max_len                          the longest source or target sequence (rows of the position table)
    pad_id, bos_id, eos_id           special token ids, distinct, inside both vocabularies
    share_embeddings                 source embedding = target embedding (needs one shared vocabulary)
    tie_output                       the output projection is the target embedding's transpose (§3.4)
    norm_first                       pre-LN sublayers (x + Sublayer(LayerNorm(x))) plus a final LayerNorm per
                                     stack, instead of the paper's post-LN
    positional                       "sinusoidal" (§3.5) or "learned" (the row (E) of Table 3)
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
    positional: str = "sinusoidal"
    d_k: int | None = None
    d_v: int | None = None

    def __post_init__(self):
        owner = "TransformerConfig"
        for name in ("src_vocab_size", "tgt_vocab_size", "d_model", "num_heads", "num_encoder_layers",
                     "num_decoder_layers", "d_ff", "max_len"):
            setattr(self, name, checks.positive_int(owner, name, getattr(self, name)))
        if self.d_k is not None:
            self.d_k = checks.positive_int(owner, "d_k", self.d_k)
        elif self.d_model % self.num_heads:
            raise ValueError(f"{owner}: d_model must be divisible by num_heads (or give d_k), "
                             f"got d_model={self.d_model}, num_heads={self.num_heads}")
        if self.d_v is not None:
            self.d_v = checks.positive_int(owner, "d_v", self.d_v)
        if self.d_model % 2:
            raise ValueError(f"{owner}: d_model must be even (the positional encoding pairs sin and cos), "
                             f"got {self.d_model}")
        self.dropout = checks.fraction(owner, "dropout", self.dropout)
        smallest_vocab = min(self.src_vocab_size, self.tgt_vocab_size)
        for name in ("pad_id", "bos_id", "eos_id"):
            value = checks.integer(owner, name, getattr(self, name))
            if not 0 <= value < smallest_vocab:
                raise ValueError(f"{owner}: {name} must be an int in [0, {smallest_vocab}) (inside both "
                                 f"vocabularies), got {value!r}")
            setattr(self, name, value)
        if len({self.pad_id, self.bos_id, self.eos_id}) < 3:
            raise ValueError(f"{owner}: pad_id, bos_id and eos_id must be distinct, got "
                             f"{self.pad_id}, {self.bos_id}, {self.eos_id}")
        for name in ("share_embeddings", "tie_output", "norm_first"):
            setattr(self, name, checks.boolean(owner, name, getattr(self, name)))
        checks.one_of(owner, "positional", self.positional, POSITIONAL)
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError(f"{owner}: share_embeddings needs src_vocab_size == tgt_vocab_size, "
                             f"got {self.src_vocab_size} and {self.tgt_vocab_size}")

    @classmethod
    def preset(cls, name: str, **overrides) -> TransformerConfig:
        """A named size ("tiny", "small", "base"); the vocabulary sizes (and anything else) go in overrides."""
        checks.one_of("TransformerConfig.preset", "name", name, PRESETS)
        missing = [k for k in ("src_vocab_size", "tgt_vocab_size") if k not in overrides]
        if missing:
            raise TypeError(f"TransformerConfig.preset({name!r}): pass {' and '.join(missing)} as keyword "
                            f"arguments (a preset fixes the sizes, not the vocabularies)")
        return cls(**{**PRESETS[name], **overrides})

    @classmethod
    def presets(cls) -> list:
        return sorted(PRESETS)

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
