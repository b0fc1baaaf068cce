"""minitransformer: the Transformer of "Attention Is All You Need" in NumPy, every gradient by hand.

Shape letters used in every docstring and comment:
    B batch, S source length, T target length, D d_model, H heads, Dk head size (D / H), Dv a head's value
    size (Dk unless set apart), F d_ff, V vocabulary size, N rows of a flattened batch (B*T; in the fast tier,
    which skips padding, the real tokens' rows), Ns, Nt, Nq, Nk: the same for the source, target, query and key side.
    (The paper's N, the number of layers in each stack, appears as "×N" in model.py.)

The package has three parts, and its folders say which is which:
    the core, at this level: module, layers/, masks, config, model, loss, optim, decoding, gradcheck: the paper in code;
    fast/: the same model made fast, each piece tested equal to its core twin;
    kit/: data, training, checkpoints, plots, the viewer, the command line and the classroom, around both tiers.
``import minitransformer`` loads the core alone, which needs nothing but NumPy; ``mt.fast`` (threads: threadpoolctl)
and the kit load when first used.
"""

import importlib

from . import backend, decoding, gradcheck, layers, masks, optim
from .backend import get_backend, get_default_dtype, manual_seed, set_backend, set_default_dtype, to_numpy
from .config import TransformerConfig
from .loss import CrossEntropyLoss
from .model import Transformer
from .module import Module, ModuleList, Parameter

__version__ = "0.1.0"

__all__ = ["CrossEntropyLoss", "Module", "ModuleList", "Parameter", "Transformer", "TransformerConfig", "backend",
           "decoding", "get_backend", "get_default_dtype", "gradcheck", "layers", "manual_seed", "masks", "optim",
           "set_backend", "set_default_dtype", "to_numpy"]

# Loaded on first use, so that the core imports with NumPy alone: the fast tier, the kit, and the two kit modules
# the contract names at the top (``mt.bleu.corpus_bleu``, ``mt.viz``).
_ON_FIRST_USE = {"fast": ".fast", "kit": ".kit", "bleu": ".kit.data.bleu", "viz": ".kit.running.viz"}


def __getattr__(name):
    if name in _ON_FIRST_USE:
        return importlib.import_module(_ON_FIRST_USE[name], __name__)
    raise AttributeError(f"module 'minitransformer' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_ON_FIRST_USE])
