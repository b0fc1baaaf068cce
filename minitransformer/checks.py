"""Argument checks for the public entry points, one small helper per kind of argument: each error names the
caller, the argument, what was expected and what came, never a NumPy error from deep inside. Constructors,
``layer(x)``, ``Transformer.forward`` and the command line use them; the model's layers trust what it checked."""

import math

import numpy

from . import backend


def _is_int(value) -> bool:
    return isinstance(value, (int, numpy.integer)) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float, numpy.integer, numpy.floating)) and not isinstance(value, bool)


def number(owner: str, name: str, value):
    """A Python number, from a number or a 0-d array (what numpy.load gives back for a saved number)."""
    if hasattr(value, "ndim") and value.ndim == 0 and hasattr(value, "item"):
        value = value.item()
    if not _is_number(value):
        raise TypeError(f"{owner}: {name} must be a number, got {value!r}")
    return value


def integer(owner: str, name: str, value) -> int:
    """An int (a bool or a float is refused)."""
    if not _is_int(value):
        raise TypeError(f"{owner}: {name} must be an int, got {value!r}")
    return int(value)


def positive_int(owner: str, name: str, value) -> int:
    return int_in(owner, name, value, 1, math.inf)


def int_in(owner: str, name: str, value, low: int, high: int) -> int:
    """An int in [low, high] (bounds from ``limits``: a count that would exhaust the machine is refused)."""
    if not _is_int(value) or value < low:
        kind = "a positive int" if low == 1 else f"an int >= {low:,}"
        raise ValueError(f"{owner}: {name} must be {kind}, got {value!r}")
    if value > high:
        raise ValueError(f"{owner}: {name} must be at most {high:,}, got {value!r}")
    return int(value)


def fraction(owner: str, name: str, value) -> float:
    """A number in [0, 1): a dropout rate, a label smoothing, a decay rate such as Adam's betas."""
    if not _is_number(value) or not 0.0 <= value < 1.0:
        raise ValueError(f"{owner}: {name} must be a number in [0, 1), got {value!r}")
    return float(value)


def positive_number(owner: str, name: str, value, allow_inf: bool = False) -> float:
    """A number > 0, finite unless allow_inf (nan is refused: `not value > 0` is True for it)."""
    if not _is_number(value) or not value > 0 or (value == math.inf and not allow_inf):
        raise ValueError(f"{owner}: {name} must be a {'' if allow_inf else 'finite '}number > 0, got {value!r}")
    return float(value)


def non_negative(owner: str, name: str, value) -> float:
    if not _is_number(value) or not 0 <= value < math.inf:
        raise ValueError(f"{owner}: {name} must be a finite number >= 0, got {value!r}")
    return float(value)


def boolean(owner: str, name: str, value) -> bool:
    if not isinstance(value, (bool, numpy.bool_)):
        raise TypeError(f"{owner}: {name} must be a bool, got {value!r}")
    return bool(value)


def one_of(owner: str, name: str, value, choices) -> None:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{owner}: {name} must be one of {sorted(choices)}, got {value!r}")


def float_array(owner: str, name: str, x, ndim: int | None = None, last_dim: int | None = None) -> None:
    """Activations: an array (NumPy or the active backend) of a floating dtype, optionally of a given
    number of axes and size of the last axis."""
    if not hasattr(x, "dtype") or not hasattr(x, "shape"):
        raise TypeError(f"{owner}: {name} must be a float array, got {type(x).__name__}")
    if x.dtype.kind != "f":
        raise TypeError(f"{owner}: {name} must be a float array, got dtype {x.dtype}")
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"{owner}: {name} must have {ndim} axes, got shape {tuple(x.shape)}")
    if last_dim is not None and (x.ndim < 1 or x.shape[-1] != last_dim):
        raise ValueError(f"{owner}: {name} must have last dimension {last_dim}, got shape {tuple(x.shape)}")


def token_ids(owner: str, name: str, ids, vocab_size: int, ndim: int | None = None, max_len: int | None = None):
    """Token ids: an integer array (a nested list is converted) with values in [0, vocab_size); with ndim=2,
    a non-empty (B, T) table, T at most max_len. Returns the ids (NumPy for host data)."""
    if isinstance(ids, (list, tuple)):
        try:
            ids = numpy.asarray(ids)
        except ValueError:
            raise ValueError(f"{owner}: {name} must be a rectangular table of token ids (pad the shorter "
                             f"sentences), got rows of different lengths") from None
        if ids.size == 0:
            ids = ids.astype(numpy.int64)                      # [] or [[]] is empty, not a float array
    if not hasattr(ids, "dtype") or not hasattr(ids, "shape"):
        raise TypeError(f"{owner}: {name} must be an integer array of token ids, got {type(ids).__name__}")
    if ids.dtype.kind not in "iu":
        raise TypeError(f"{owner}: {name} must hold integer token ids, got dtype {ids.dtype}")
    if ndim is not None and ids.ndim != ndim:
        raise ValueError(f"{owner}: {name} must be a {ndim}-D array (B, T) of token ids, got shape {tuple(ids.shape)}")
    if ndim is not None and 0 in ids.shape:
        raise ValueError(f"{owner}: {name} must be non-empty, got shape {tuple(ids.shape)}")
    if max_len is not None and ids.shape[-1] > max_len:
        raise ValueError(f"{owner}: {name} has length {ids.shape[-1]}, longer than the config's max_len={max_len}")
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise ValueError(f"{owner}: {name} must hold token ids in [0, {vocab_size}), "
                         f"got values in [{int(ids.min())}, {int(ids.max())}]")
    return ids


def weights(owner: str, name: str, value, shape=None):
    """Numbers to store in a Parameter or an optimiser's state: an array (NumPy or device) or nested list of
    real numbers (bool, int or float), all finite, of ``shape`` when given. Returns it as an array."""
    if not hasattr(value, "dtype") and not isinstance(value, (list, tuple, int, float)):     # None, str, dict, ...
        raise TypeError(f"{owner}: {name} must be an array of real numbers, got {type(value).__name__}")
    if not hasattr(value, "dtype"):
        try:
            value = numpy.asarray(value)
        except ValueError:
            raise ValueError(f"{owner}: {name} must be a rectangular array of numbers, got ragged lists") from None
    if value.dtype.kind not in "biuf":
        raise TypeError(f"{owner}: {name} must hold real numbers (bool, int or float), got dtype {value.dtype}")
    if shape is not None and tuple(value.shape) != tuple(shape):
        raise ValueError(f"{owner}: {name} must have shape {tuple(shape)}, got {tuple(value.shape)}")
    xp = numpy if isinstance(value, numpy.ndarray) else backend.xp()     # a device array is checked there
    if value.dtype.kind == "f" and value.size and not bool(xp.isfinite(value).all()):
        raise ValueError(f"{owner}: {name} must hold finite numbers, got nan or inf")
    return value


def mask(owner: str, mask, scores_shape: tuple) -> None:
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


def parameter_list(owner: str, name: str, params) -> list:
    """Parameters as a list: non-empty, each with .data and .grad, none twice (it would be stepped twice)."""
    if hasattr(params, "data") and hasattr(params, "grad"):
        raise ValueError(f"{owner}: {name} must be an iterable of Parameters (e.g. model.parameters()), "
                         f"got a single {type(params).__name__}")
    try:
        params = list(params)
    except TypeError:
        raise ValueError(f"{owner}: {name} must be an iterable of Parameters (e.g. model.parameters()), "
                         f"got {type(params).__name__}") from None
    if not params:
        raise ValueError(f"{owner}: {name} must be a non-empty list of Parameters, got an empty list")
    for i, p in enumerate(params):
        if not (hasattr(p, "data") and hasattr(p, "grad")):
            raise TypeError(f"{owner}: {name}[{i}] must be a Parameter (with .data and .grad), got {type(p).__name__}")
    if len({id(p) for p in params}) != len(params):
        raise ValueError(f"{owner}: {name} lists a Parameter more than once; pass each once "
                         "(Module.parameters() already lists tied parameters once)")
    return params
