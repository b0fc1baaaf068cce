"""The array backend: the namespace that does the arithmetic (NumPy or CuPy), the dtype of new parameters, and the
random generators that make a run repeat. Code calls ``xp()`` when it runs, never ``import cupy as np``, so that
``set_backend("cupy")`` works after import. ``host_rng()`` (NumPy) draws initialisation and data order, the same on
every device; ``device_rng()`` (the active backend's) draws dropout masks where the activations live."""

import contextlib
import os
import sys
import threading
import types

import numpy

_state = types.SimpleNamespace(     # everything the backend switch holds
    xp=numpy, dtype=numpy.dtype("float32"), seed=None, host_rng=numpy.random.default_rng(),
    device_rng=None, device_types=())  # device_types: every device backend's array type chosen so far
_state.device_rng = _state.host_rng
_thread = threading.local()         # .device_rng: this thread's own dropout generator (thread_device_rng)


def _import_cupy():
    """CuPy, once it is known to reach a GPU: it imports without one (no driver, or one too old for its CUDA
    build), and would then fail at the first array from deep inside CUDA."""
    try:
        import cupy  # imported only on request
    except ImportError as err:
        raise ImportError("set_backend('cupy') needs CuPy, which is not installed. Install the build that matches "
                          "your NVIDIA driver: pip install 'minitransformer[gpu]' (cupy-cuda13x, for CUDA 13 "
                          "drivers), or pip install cupy-cuda12x for CUDA 12 drivers.") from err
    stay = "Stay on set_backend('numpy') on this machine."
    try:
        devices = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as err:
        raise RuntimeError(f"set_backend('cupy'): CuPy {cupy.__version__} is installed but cannot use a GPU: {err}. "
                           "It needs an NVIDIA GPU and a driver recent enough for its build's CUDA (cupy-cuda13x: "
                           f"CUDA 13; with a CUDA 12 driver, install cupy-cuda12x). {stay}") from err
    if devices < 1:
        raise RuntimeError(f"set_backend('cupy'): CuPy {cupy.__version__} is installed but sees no GPU "
                           f"(getDeviceCount() is 0). {stay}")
    return cupy


def set_backend(name: str | types.ModuleType) -> None:
    """Choose the array namespace: "numpy" (default), "cupy", or a module that mimics NumPy's API (tests use
    one that acts as CuPy does at the device boundary), named by its ``__backend_name__`` or ``__name__``.
    Parameters made before the switch stay where they were: build the model after choosing."""
    if not isinstance(name, types.ModuleType) and name not in ("numpy", "cupy"):
        raise ValueError(f"set_backend: name must be one of ('numpy', 'cupy'), got {name!r}")
    _state.xp = name if isinstance(name, types.ModuleType) else numpy if name == "numpy" else _import_cupy()
    if _state.xp is not numpy and _state.xp.ndarray not in _state.device_types:
        _state.device_types += (_state.xp.ndarray,)         # to_numpy still knows them after a switch back
    _state.device_rng = _new_device_rng(_state.seed)


def get_backend() -> str:
    """The active backend's name: "numpy" or "cupy" (a stand-in module's ``__backend_name__``)."""
    return getattr(_state.xp, "__backend_name__", _state.xp.__name__)


def xp() -> types.ModuleType:
    """The active array namespace (numpy or cupy). Call it inside functions, not at import."""
    return _state.xp


def set_default_dtype(dtype) -> None:
    """dtype of newly created parameters and buffers: "float32" (default) or "float64" (for gradient checks)."""
    if str(dtype) not in ("float32", "float64") and dtype not in (numpy.float32, numpy.float64):
        raise ValueError(f"set_default_dtype: dtype must be one of ('float32', 'float64'), got {dtype!r}")
    _state.dtype = numpy.dtype(dtype)


def get_default_dtype() -> numpy.dtype:
    return _state.dtype


def _new_device_rng(seed):
    if _state.xp is numpy:
        # two independent streams (seed and [seed, 1]): dropout draws do not shift the data order
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
    rngs = {}
    # a GPU generator's state cannot be read back: reseeded (reproducible, not bit-exact mid-run)
    for key in ("host", "device") if _state.xp is numpy and "device" in state else ("host",):
        rngs[key] = numpy.random.default_rng()
        try:
            rngs[key].bit_generator.state = state[key]
        except (TypeError, ValueError, KeyError) as err:
            raise ValueError(f"set_rng_state: state[{key!r}] is not the PCG64 state that get_rng_state gives "
                             f"({err})") from err
    device_rng = rngs.get("device") or _new_device_rng(state.get("seed"))
    _state.seed, _state.host_rng, _state.device_rng = state.get("seed"), rngs["host"], device_rng   # all, or none


def asarray(x, dtype=None):
    """Array in the active backend (copied to the device if needed)."""
    return _state.xp.asarray(x, dtype=dtype)


def to_numpy(x) -> numpy.ndarray:
    """The way back to the host: a NumPy array for any backend array (or scalar, list, ...)."""
    if isinstance(x, numpy.ndarray):
        return x
    cupy = sys.modules.get("cupy")     # imported by someone: its arrays too, besides every backend module chosen
    device = _state.device_types + ((cupy.ndarray,) if getattr(cupy, "ndarray", None) is not None else ())
    # a device array, known by its type (a dict or a pandas Series has a .get too), copies itself with .get()
    return x.get() if isinstance(x, device) else numpy.asarray(x)


def is_array(x) -> bool:
    """True for an array of NumPy or of the active backend."""
    return isinstance(x, (numpy.ndarray, _state.xp.ndarray))


def scatter_add(target, indices, values) -> None:
    """target[indices] += values, adding every repeat of an index (``target[idx] += v`` keeps only one).
    ``add.at`` in NumPy and in every CuPy the gpu extra installs (12 and later)."""
    _state.xp.add.at(target, indices, values)


if os.environ.get("MINITRANSFORMER_BACKEND"):
    set_backend(os.environ["MINITRANSFORMER_BACKEND"].strip().lower())
