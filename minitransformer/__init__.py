"""minitransformer: the Transformer of "Attention Is All You Need" in NumPy, every gradient by hand.

Shape letters used in every docstring and comment:
    B batch, S source length, T target length, D d_model, H heads, Dk head size (D / H),
    F d_ff, V vocabulary size, N rows of a flattened batch (B*T; in the fast tier, which skips padding,
    the real tokens' rows), Ns, Nt, Nq, Nk: the same for the source, target, query and key side.
    (The paper's N, the number of layers in each stack, appears as "×N" in model.py.)

The core (module, layers/, masks, model, loss, optim, decoding, gradcheck) is the paper in code;
``minitransformer.fast`` holds the same model made fast, each piece tested equal to its core twin.
"""

from . import (
    backend,
    batching,
    bleu,
    checkpoint,
    datasets,
    decoding,
    fast,
    gradcheck,
    layers,
    masks,
    optim,
    tasks,
    tokenizers,
    toy_grammar,
    train,
)
from .backend import (
    get_backend,
    get_default_dtype,
    manual_seed,
    set_backend,
    set_default_dtype,
    to_numpy,
)
from .checkpoint import average_checkpoints, load_checkpoint, save_checkpoint
from .loss import CrossEntropyLoss
from .model import Transformer, TransformerConfig
from .module import Module, ModuleList, Parameter
from .tokenizers import BOS, EOS, PAD, UNK, BPETokenizer, WordTokenizer
from .train import NonFiniteError, Trainer

__version__ = "0.1.0"

__all__ = [
    "BOS",
    "EOS",
    "PAD",
    "UNK",
    "BPETokenizer",
    "CrossEntropyLoss",
    "Module",
    "ModuleList",
    "NonFiniteError",
    "Parameter",
    "Trainer",
    "Transformer",
    "TransformerConfig",
    "WordTokenizer",
    "average_checkpoints",
    "backend",
    "batching",
    "bleu",
    "checkpoint",
    "datasets",
    "decoding",
    "fast",
    "get_backend",
    "get_default_dtype",
    "gradcheck",
    "layers",
    "load_checkpoint",
    "manual_seed",
    "masks",
    "optim",
    "save_checkpoint",
    "set_backend",
    "set_default_dtype",
    "tasks",
    "to_numpy",
    "tokenizers",
    "toy_grammar",
    "train",
    "viz",
]


def __getattr__(name):
    # ``mt.viz`` is imported on first use: matplotlib is slow to import and the training step never needs it.
    if name == "viz":
        import importlib

        return importlib.import_module(".viz", __name__)
    raise AttributeError(f"module 'minitransformer' has no attribute {name!r}")
