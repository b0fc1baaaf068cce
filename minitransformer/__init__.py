"""minitransformer: the Transformer of "Attention Is All You Need" in NumPy, every gradient by hand.

Shape letters used in every docstring and comment:
    B batch, S source length, T target length, D d_model, H heads, Dk head size (D / H), Dv a head's value
    size (Dk unless set apart), F d_ff, V vocabulary size, N rows of a flattened batch (B*T; in the fast tier,
    which skips padding, the real tokens' rows), Ns, Nt, Nq, Nk: the same for the source, target, query and key side.
    (The paper's N, the number of layers in each stack, appears as "×N" in model.py.)

The package has three parts, and its folders say which is which:
    the core, at this level: module, layers/, masks, config, model, loss, optim, decoding, gradcheck: the paper in code;
    fast/: the same model made fast, each piece tested equal to its core twin;
    kit/: data, training, checkpoints, plots and the command line, around both tiers.
"""

import importlib
import sys

from . import backend, decoding, fast, gradcheck, layers, masks, optim
from .backend import (
    get_backend,
    get_default_dtype,
    manual_seed,
    set_backend,
    set_default_dtype,
    to_numpy,
)
from .kit.data import batching, bleu, datasets, tasks, tokenizers, toy_grammar
from .kit.data.tokenizers import BOS, EOS, PAD, UNK, BPETokenizer, WordTokenizer
from .kit.running import checkpoint, files, train
from .kit.running.checkpoint import (
    average_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from .kit.running.train import NonFiniteError, Trainer
from .loss import CrossEntropyLoss
from .model import Transformer, TransformerConfig
from .module import Module, ModuleList, Parameter

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


# The kit's modules keep the names users reach them by: ``mt.tokenizers``, ``from minitransformer.train import
# Trainer``. Each name is the same module object as its home under kit/.
for _module in (batching, bleu, checkpoint, datasets, files, tasks, tokenizers, toy_grammar, train):
    sys.modules[f"{__name__}.{_module.__name__.rsplit('.', 1)[1]}"] = _module


def __getattr__(name):
    # ``mt.viz`` and ``mt.cli`` are imported on first use: matplotlib is slow to import and the training step
    # never needs it.
    if name in ("viz", "cli"):
        module = importlib.import_module(f".kit.{'running.' if name == 'viz' else ''}{name}", __name__)
        sys.modules[f"{__name__}.{name}"] = module
        return module
    raise AttributeError(f"module 'minitransformer' has no attribute {name!r}")
