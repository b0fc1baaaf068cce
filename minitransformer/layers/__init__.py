"""The layers, one family per file, each with forward and backward side by side."""

from .activations import ReLU, Softmax
from .additive import AdditiveAttention
from .attention import Mask, MultiHeadAttention, ScaledDotProductAttention
from .convolution import Conv1d
from .dropout import Dropout
from .embedding import Embedding
from .feedforward import PositionwiseFeedForward
from .layernorm import LayerNorm
from .linear import Linear
from .positional import LearnedPositionalEmbedding, PositionalEncoding
from .recurrent import RNN
from .sublayer import SublayerConnection

__all__ = [
    "RNN",
    "AdditiveAttention",
    "Conv1d",
    "Dropout",
    "Embedding",
    "LayerNorm",
    "LearnedPositionalEmbedding",
    "Linear",
    "Mask",
    "MultiHeadAttention",
    "PositionalEncoding",
    "PositionwiseFeedForward",
    "ReLU",
    "ScaledDotProductAttention",
    "Softmax",
    "SublayerConnection",
]
