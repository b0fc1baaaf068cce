"""The array backend: which namespace does the arithmetic (NumPy or CuPy), which dtype new
parameters get, and the random generators that make a run reproducible.

Layers never ``import cupy as np``. They ask for the active namespace when they run::

    xp = backend.xp()          # numpy, or cupy after set_backend("cupy")
    out = xp.exp(x)

so that ``mt.set_backend("cupy")`` works after import and tests can run both backends.

Two generators, both seeded by ``manual_seed``:
- ``host_rng()``   a NumPy Generator on the CPU. Parameter initialisation and data shuffling use it,
                   so the same seed gives the same weights on NumPy and on CuPy.
- ``device_rng()`` a Generator of the active backend. Dropout masks are drawn with it, on the device
                   where the activations live (no host-to-device copy per step). A thread inside
                   ``thread_device_rng(gen)`` draws from gen instead: threads that run parts of one step
                   at once (``fast.DataParallel``) each draw from their own, so the masks do not depend
                   on which thread happens to draw first.

"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import types

import numpy

_BACKENDS = ("numpy", "cupy")
_DTYPES = ("float32", "float64")


class _State:
    """Everything the backend switch holds, in one place."""

    def __init__(self):
        self.name = "numpy"
        self.xp = numpy
        self.dtype = numpy.dtype("float32")
        self.seed = None
        self.host_rng = numpy.random.default_rng()
        self.device_rng = self.host_rng
        self.device_types = ()      # the array types of every device backend chosen so far (cupy.ndarray, ...)


_state = _State()
_thread = threading.local()         # .device_rng: this thread's own dropout generator (thread_device_rng)


# ----------------------------------------------------------------------------- namespace

def _import_cupy():
    """CuPy, once it is known to reach a GPU. CuPy imports without one (no driver, or too old a driver for
    its CUDA build), and would then fail at the first array with an error from deep inside CUDA."""
    try:
        import cupy  # imported only on request
    except ImportError as err:
        raise ImportError(
            "set_backend('cupy') needs CuPy, which is not installed. Install the build that matches your NVIDIA "
            "driver: pip install 'minitransformer[gpu]' (that is cupy-cuda13x, for CUDA 13 drivers), or "
            "pip install cupy-cuda12x for older (CUDA 12) drivers."
        ) from err
    try:
        devices = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as err:
        raise RuntimeError(
            f"set_backend('cupy'): CuPy {cupy.__version__} is installed but cannot use a GPU: {err}. It needs an "
            "NVIDIA GPU and a driver recent enough for the CUDA version of its build (cupy-cuda13x: CUDA 13; "
            "with a CUDA 12 driver, install cupy-cuda12x instead). "
            "Stay on set_backend('numpy') on this machine."
        ) from err
    if devices < 1:
        raise RuntimeError(f"set_backend('cupy'): CuPy {cupy.__version__} is installed but sees no GPU "
                           "(getDeviceCount() is 0). Stay on set_backend('numpy') on this machine.")
    return cupy


def set_backend(name: str | types.ModuleType) -> None:
    """Choose the array namespace: "numpy" (default) or "cupy".

    A module object that mimics NumPy's API may also be passed (the test suite uses one that behaves
    like CuPy at the device boundary, tests/fakecupy.py): its ``__backend_name__`` (else ``__name__``)
    becomes the backend's name, and its ``random.default_rng(seed)`` makes the dropout generator.
    Parameters created before the switch stay where they were: build the model after choosing the backend.
    """
    if isinstance(name, types.ModuleType):
        _state.name, _state.xp = getattr(name, "__backend_name__", name.__name__), name
    elif name == "numpy":
        _state.name, _state.xp = "numpy", numpy
    elif name == "cupy":
        _state.name, _state.xp = "cupy", _import_cupy()
    else:
        raise ValueError(f"set_backend: name must be one of {_BACKENDS}, got {name!r}")
    if _state.xp is not numpy and _state.xp.ndarray not in _state.device_types:
        _state.device_types += (_state.xp.ndarray,)         # to_numpy still knows them after a switch back
    _state.device_rng = _new_device_rng(_state.seed)


def get_backend() -> str:
    """The active backend's name: "numpy" or "cupy"."""
    return _state.name


def xp() -> types.ModuleType:
    """The active array namespace (numpy or cupy). Call it inside functions, not at import."""
    return _state.xp


# ----------------------------------------------------------------------------- dtype

def set_default_dtype(dtype) -> None:
    """dtype of newly created parameters and buffers: "float32" (default) or "float64" (for gradient checks)."""
    dt = numpy.dtype(dtype) if str(dtype) in _DTYPES or dtype in (numpy.float32, numpy.float64) else None
    if dt is None:
        raise ValueError(f"set_default_dtype: dtype must be one of {_DTYPES}, got {dtype!r}")
    _state.dtype = dt


def get_default_dtype() -> numpy.dtype:
    return _state.dtype


# ----------------------------------------------------------------------------- randomness

def _new_device_rng(seed):
    if _state.xp is numpy:
        # On the CPU backend, host_rng and device_rng are two independent streams (seed and [seed, 1]),
        # so that dropout draws do not shift the data order.
        return numpy.random.default_rng(None if seed is None else [seed, 1])
    return _state.xp.random.default_rng(None if seed is None else seed + 1)


def manual_seed(seed: int) -> None:
    """Seed parameter initialisation, data shuffling and dropout, so that a run repeats exactly."""
    if isinstance(seed, bool) or not isinstance(seed, (int, numpy.integer)) or seed < 0:
        raise ValueError(f"manual_seed: seed must be a non-negative int, got {seed!r}")
    _state.seed = int(seed)
    _state.host_rng = numpy.random.default_rng(int(seed))
    _state.device_rng = _new_device_rng(int(seed))


def host_rng() -> numpy.random.Generator:
    """NumPy Generator for initialisation and data order (always on the CPU)."""
    return _state.host_rng


def device_rng():
    """Generator of the active backend, for dropout masks: this thread's own inside ``thread_device_rng``."""
    return getattr(_thread, "device_rng", None) or _state.device_rng


@contextlib.contextmanager
def thread_device_rng(rng):
    """Inside the block, ``device_rng()`` in this thread returns rng (other threads are not affected)."""
    before = getattr(_thread, "device_rng", None)
    _thread.device_rng = rng
    try:
        yield rng
    finally:
        _thread.device_rng = before


def get_rng_state() -> dict:
    """The host generator's state and the seed, plus the device generator's state on NumPy (a GPU's cannot be
    read back: set_rng_state reseeds it), as plain JSON-able data (for checkpoints and exact resume)."""
    state = {"host": _state.host_rng.bit_generator.state, "seed": _state.seed}
    if _state.xp is numpy:
        state["device"] = _state.device_rng.bit_generator.state
    return state


def set_rng_state(state: dict) -> None:
    """Restore what ``get_rng_state`` returned. A state that cannot be restored raises and changes nothing."""
    if not isinstance(state, dict) or "host" not in state:
        got = f"a dict with keys {sorted(state)}" if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"set_rng_state: state must be a dict as get_rng_state returns, with a 'host' entry, "
                         f"got {got}")
    seed = state.get("seed")
    host_rng = _generator_from_state(state["host"], "host")
    if _state.xp is numpy and "device" in state:
        device_rng = _generator_from_state(state["device"], "device")
    else:
        # CuPy's generator state cannot be read back: re-derive it from the seed (reproducible,
        # but not bit-exact mid-run).
        device_rng = _new_device_rng(seed)
    _state.seed, _state.host_rng, _state.device_rng = seed, host_rng, device_rng   # all three, or none


def _generator_from_state(bit_generator_state, key: str) -> numpy.random.Generator:
    rng = numpy.random.default_rng()
    try:
        rng.bit_generator.state = bit_generator_state
    except (TypeError, ValueError, KeyError) as err:
        raise ValueError(f"set_rng_state: state[{key!r}] is not the {type(rng.bit_generator).__name__} state "
                         f"that get_rng_state gives ({err})") from err
    return rng


# ----------------------------------------------------------------------------- moving arrays

def asarray(x, dtype=None):
    """Array in the active backend (copied to the device if needed)."""
    return _state.xp.asarray(x, dtype=dtype)


def to_numpy(x) -> numpy.ndarray:
    """The way back to the host: a NumPy array for any backend array (or scalar, list, ...)."""
    if isinstance(x, numpy.ndarray):
        return x
    # A device array copies itself to the host with .get(). Recognised by its type, not by having a .get
    # method: a dict or a pandas Series has one too, with another meaning.
    if isinstance(x, _device_array_types()):
        return x.get()
    return numpy.asarray(x)


def _device_array_types() -> tuple:
    """cupy.ndarray once CuPy is imported, and the array type of every backend module given to set_backend."""
    cupy = sys.modules.get("cupy")
    return _state.device_types + ((cupy.ndarray,) if getattr(cupy, "ndarray", None) is not None else ())


def is_array(x) -> bool:
    """True for an array of NumPy or of the active backend."""
    return isinstance(x, (numpy.ndarray, _state.xp.ndarray))


def scatter_add(target, indices, values) -> None:
    """target[indices] += values, adding every repeat of an index (``target[idx] += v`` would keep only one).

    ``add.at`` in NumPy and in CuPy 12 and later; CuPy's own older spelling, ``cupyx.scatter_add``, runs the
    same kernel and is what CuPy before v12 has.
    """
    xp = _state.xp
    if hasattr(xp.add, "at"):
        xp.add.at(target, indices, values)
    else:                                                   # CuPy before v12: its ufuncs have no .at
        import cupyx

        cupyx.scatter_add(target, indices, values)


# ----------------------------------------------------------------------------- environment

def _init_from_env():
    name = os.environ.get("MINITRANSFORMER_BACKEND")
    if name:
        set_backend(name.strip().lower())


_init_from_env()
