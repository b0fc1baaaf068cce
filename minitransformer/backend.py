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
                   where the activations live (no host-to-device copy per step).

CPU threads: BLAS spreads each large matrix product over the cores by itself, but NumPy runs every
ufunc on one core. ``parallel_map`` gives independent pieces of such work to ``get_num_threads()``
threads where it is worth it (Adam's update); ``set_num_threads`` or the environment
(``MINITRANSFORMER_NUM_THREADS``, else ``OMP_NUM_THREADS`` / ``OPENBLAS_NUM_THREADS``) sets how many.
"""

from __future__ import annotations

import os
import sys
import threading
import types
from concurrent.futures import ThreadPoolExecutor

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
        self.num_threads = 1
        self.pool = None            # ThreadPoolExecutor, created on first use
        self.pool_lock = threading.Lock()


_state = _State()


# ----------------------------------------------------------------------------- namespace

def _import_cupy():
    """CuPy, once it is known to reach a GPU. CuPy imports without one (no driver, or too old a driver for
    its CUDA build), and would then fail at the first array with an error from deep inside CUDA."""
    try:
        import cupy  # imported only on request
    except ImportError as err:
        raise ImportError(
            "set_backend('cupy') needs CuPy, which is not installed. Install the build that matches "
            "your CUDA toolkit, for CUDA 12: pip install 'minitransformer[gpu]' (that is cupy-cuda12x)."
        ) from err
    try:
        devices = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as err:
        raise RuntimeError(
            f"set_backend('cupy'): CuPy {cupy.__version__} is installed but cannot use a GPU: {err}. It needs an "
            "NVIDIA GPU and a driver recent enough for the CUDA version of its build (cupy-cuda12x: CUDA 12). "
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
    """Generator of the active backend, for dropout masks."""
    return _state.device_rng


def random_uint16(shape):
    """Uniform random integers in [0, 65536), dtype uint16, drawn with ``device_rng()`` (dropout's masks).

    Speed: on the CPU they are cut from 64-bit draws, four from each word. NumPy hands out full-range 64-bit
    integers straight from its bit generator, and that is 1.7-1.9x faster per 16-bit number than asking
    it for uint16 (measured for 0.26-2.1 M numbers, the sizes dropout draws on the base model). Every 64-bit
    value is equally likely, so each 16-bit quarter is uniform and independent of the others.
    On a GPU: one plain call of the generator.
    """
    xp = _state.xp
    if xp is not numpy:
        return device_rng().integers(0, 1 << 16, size=shape, dtype=xp.uint16)
    n = int(numpy.prod(shape))
    words = device_rng().integers(0, 2**64 - 1, size=-(-n // 4), dtype=numpy.uint64, endpoint=True)
    return words.view(numpy.uint16)[:n].reshape(shape)         # four 16-bit integers per word


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


# ----------------------------------------------------------------------------- CPU threads

def set_num_threads(n: int) -> None:
    """How many CPU threads ``parallel_map`` uses (BLAS keeps its own setting)."""
    if isinstance(n, bool) or not isinstance(n, (int, numpy.integer)) or n < 1:
        raise ValueError(f"set_num_threads: n must be a positive int, got {n!r}")
    with _state.pool_lock:
        if _state.pool is not None:
            _state.pool.shutdown(wait=False)                  # its threads end after any work in hand
        _state.num_threads, _state.pool = int(n), None


def get_num_threads() -> int:
    return _state.num_threads


def _threads_from_env() -> int:
    for var in ("MINITRANSFORMER_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        value = os.environ.get(var, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


_POOL_NAME = "minitransformer-pool"


def _forget_pool_in_child() -> None:
    # A child made by os.fork has none of its parent's threads: a pool copied from the parent would queue
    # work that no thread ever runs. The child makes its own pool on first use.
    _state.pool, _state.pool_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_forget_pool_in_child)


def parallel_map(fn, items) -> list:
    """``[fn(item) for item in items]``, run on up to ``get_num_threads()`` threads at once.

    Why threads help with NumPy: each ufunc and each matrix product releases Python's GIL while it
    computes, so two threads calling NumPy on different slices really do run on two cores. The items
    must be independent (each writes only its own output). With one thread, on a GPU backend (whose
    kernels are asynchronous anyway), or when called from inside another parallel_map, it is the plain loop.
    """
    items = list(items)
    in_pool = threading.current_thread().name.startswith(_POOL_NAME)   # nested: the pool may be all busy
    if _state.num_threads == 1 or len(items) < 2 or _state.xp is not numpy or in_pool:
        return [fn(item) for item in items]
    with _state.pool_lock:
        if _state.pool is None:
            _state.pool = ThreadPoolExecutor(_state.num_threads, thread_name_prefix=_POOL_NAME)
        pool = _state.pool
    return list(pool.map(fn, items))


# ----------------------------------------------------------------------------- environment

def _init_from_env():
    _state.num_threads = _threads_from_env()
    name = os.environ.get("MINITRANSFORMER_BACKEND")
    if name:
        set_backend(name.strip().lower())


_init_from_env()
