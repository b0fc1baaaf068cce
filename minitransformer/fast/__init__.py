"""The fast tier: every speed trick of minitransformer, each piece a subclass of its core twin that
overrides only what it speeds up, and each tested equal to it (tests/test_fast.py).

    model = mt.fast.Transformer(cfg)     # a drop-in for mt.Transformer(cfg): same parameters, state_dict,
                                         # logits and gradients (dropout 0), faster
    loss_fn = mt.fast.CrossEntropyLoss(ignore_index=0, label_smoothing=0.1)
    opt = mt.fast.Adam(model.parameters(), lr=...)
    parallel = mt.fast.DataParallel(model, loss_fn, workers=2)   # a step's batch split across threads

What each trick buys, measured, is in benchmarks/RESULTS.md; notebook 10 walks through them.
"""

from . import layers
from .layers import random_uint16, stacked_linear, stacked_linear_backward
from .loss import CrossEntropyLoss
from .model import FAST_TWINS, Transformer, make_fast
from .optim import Adam
from .packing import Packing
from .parallel import DataParallel
from .threads import get_num_threads, parallel_map, set_num_threads

__all__ = ["FAST_TWINS", "Adam", "CrossEntropyLoss", "DataParallel", "Packing", "Transformer", "get_num_threads", "layers",
           "make_fast", "parallel_map", "random_uint16", "set_num_threads", "stacked_linear", "stacked_linear_backward"]
