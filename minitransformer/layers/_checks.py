"""Input checks shared by the layers: each raises a ValueError/TypeError that names the argument,
what was expected and what came, instead of a NumPy broadcasting error from deep inside."""

from __future__ import annotations

import numpy


def check_positive_int(owner: str, name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, numpy.integer)) or value <= 0:
        raise ValueError(f"{owner}: {name} must be a positive int, got {value!r}")


def check_probability(owner: str, name: str, value) -> None:
    """A dropout rate: a float in [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, numpy.floating)) or not 0.0 <= value < 1.0:
        raise ValueError(f"{owner}: {name} must be a float in [0, 1), got {value!r}")


def check_ids(owner: str, name: str, ids, vocab_size: int) -> None:
    """Token ids: an integer array with values in [0, vocab_size)."""
    if not hasattr(ids, "dtype") or not hasattr(ids, "shape"):
        raise TypeError(f"{owner}: {name} must be an integer array of token ids, got {type(ids).__name__}")
    if ids.dtype.kind not in "iu":
        raise TypeError(f"{owner}: {name} must hold integer token ids, got dtype {ids.dtype}")
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise ValueError(f"{owner}: {name} must be token ids in [0, {vocab_size}), "
                         f"got values in [{int(ids.min())}, {int(ids.max())}]")


def check_last_dim(owner: str, name: str, x, expected: int) -> None:
    if x.ndim < 1 or x.shape[-1] != expected:
        raise ValueError(f"{owner}: {name} must have last dimension {expected}, got shape {tuple(x.shape)}")
