"""The layers, one family per file, each with forward and backward side by side."""

from .activations import ReLU, Softmax
from .attention import Mask, MultiHeadAttention, ScaledDotProductAttention
from .dropout import Dropout
from .embedding import Embedding
from .feedforward import PositionwiseFeedForward
from .layernorm import LayerNorm
from .linear import Linear
from .positional import LearnedPositionalEmbedding, PositionalEncoding
from .sublayer import SublayerConnection

__all__ = ["Dropout", "Embedding", "LayerNorm", "LearnedPositionalEmbedding", "Linear", "Mask", "MultiHeadAttention",
           "PositionalEncoding", "PositionwiseFeedForward", "ReLU", "ScaledDotProductAttention", "Softmax",
           "SublayerConnection"]

# COMPARISONS: the layers the paper measures self-attention against (§3.2.1, Table 1), for experiments/; no part of
# the Transformer, so the classroom's copy of the core stops above this line.
from .additive import AdditiveAttention  # noqa: E402
from .convolution import Conv1d  # noqa: E402
from .recurrent import RNN  # noqa: E402

__all__ += ["AdditiveAttention", "Conv1d", "RNN"]
