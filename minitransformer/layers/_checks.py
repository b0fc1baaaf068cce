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


def check_positive_number(owner: str, name: str, value) -> None:
    """A finite number > 0, such as an epsilon or a tolerance (nan and inf are refused)."""
    if (isinstance(value, bool) or not isinstance(value, (int, float, numpy.integer, numpy.floating))
            or not 0.0 < value < float("inf")):
        raise ValueError(f"{owner}: {name} must be a finite number > 0, got {value!r}")


def check_float_array(owner: str, name: str, x) -> None:
    """Activations: an array (NumPy or the active backend) of a floating dtype."""
    if not hasattr(x, "dtype") or not hasattr(x, "shape"):
        raise TypeError(f"{owner}: {name} must be a float array, got {type(x).__name__}")
    if x.dtype.kind != "f":
        raise TypeError(f"{owner}: {name} must be a float array, got dtype {x.dtype}")


def check_last_dim(owner: str, name: str, x, expected: int) -> None:
    check_float_array(owner, name, x)
    if x.ndim < 1 or x.shape[-1] != expected:
        raise ValueError(f"{owner}: {name} must have last dimension {expected}, got shape {tuple(x.shape)}")


def check_mask(owner: str, mask, scores_shape: tuple) -> None:
    """An attention mask: boolean (True = may attend), broadcastable to the scores' shape (B, H, Tq, Tk)."""
    if not hasattr(mask, "dtype") or not hasattr(mask, "shape"):
        raise TypeError(f"{owner}: mask must be a boolean array (True = may attend), got {type(mask).__name__}")
    if mask.dtype != bool:
        raise TypeError(f"{owner}: mask must be a boolean array (True = may attend), got dtype {mask.dtype}")
    try:
        shape = numpy.broadcast_shapes(tuple(mask.shape), tuple(scores_shape))
    except ValueError:
        shape = None
    if shape != tuple(scores_shape):
        raise ValueError(f"{owner}: mask must broadcast to the attention scores' shape {tuple(scores_shape)} "
                         f"(B, H, Tq, Tk), got mask shape {tuple(mask.shape)}")
