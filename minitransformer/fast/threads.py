"""A pool of CPU threads for the fast tier's elementwise work.

BLAS spreads each large matrix product over the cores by itself, but NumPy runs every ufunc on one core.
Each ufunc releases Python's GIL while it computes, so two threads calling NumPy on different slices of
an array really do run on two cores. ``parallel_map`` gives independent pieces of such work (Adam's
update) to ``get_num_threads()`` threads; ``set_num_threads`` or the environment
(``MINITRANSFORMER_NUM_THREADS``, else ``OMP_NUM_THREADS`` / ``OPENBLAS_NUM_THREADS``, else the cores this
process may use) sets how many.

BLAS has its own threads, and its own count: ``blas_threads`` reads it and ``set_blas_threads`` changes it
while the program runs (OpenBLAS only, the library NumPy ships on Linux and Windows; found through
/proc/self/maps and called with ctypes). A second BLAS thread pays only on large products: on a model of
width 64 it gains little on an idle machine, and when another process keeps a core busy, OpenBLAS's threads,
which spin while they wait for each other, make every product several times slower. ``use_blas_threads``
is what the command line calls: the count chosen for the model, unless the user's environment names one.
"""

from __future__ import annotations

import ctypes
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy

from .. import backend, checks

_POOL_NAME = "minitransformer-pool"


def _threads_from_env() -> int:
    for var in ("MINITRANSFORMER_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        value = os.environ.get(var, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


class _Pool:
    def __init__(self):
        self.num_threads = _threads_from_env()
        self.executor = None        # ThreadPoolExecutor, created on first use
        self.lock = threading.Lock()


_pool = _Pool()


def _forget_pool_in_child() -> None:
    # A child made by os.fork has none of its parent's threads: a pool copied from the parent would queue
    # work that no thread ever runs. The child makes its own pool on first use.
    _pool.executor, _pool.lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_forget_pool_in_child)


def set_num_threads(n: int) -> None:
    """How many CPU threads ``parallel_map`` uses (BLAS keeps its own setting)."""
    n = checks.positive_int("set_num_threads", "n", n)
    with _pool.lock:
        if _pool.executor is not None:
            _pool.executor.shutdown(wait=False)                # its threads end after any work in hand
        _pool.num_threads, _pool.executor = n, None


def get_num_threads() -> int:
    return _pool.num_threads


def parallel_map(fn, items) -> list:
    """``[fn(item) for item in items]``, run on up to ``get_num_threads()`` threads at once.

    The items must be independent (each writes only its own output). With one thread, on a GPU backend
    (whose kernels are asynchronous anyway), or when called from inside another parallel_map (the pool
    may be all busy), it is the plain loop.
    """
    items = list(items)
    in_pool = threading.current_thread().name.startswith(_POOL_NAME)
    if _pool.num_threads == 1 or len(items) < 2 or backend.xp() is not numpy or in_pool:
        return [fn(item) for item in items]
    with _pool.lock:
        if _pool.executor is None:
            _pool.executor = ThreadPoolExecutor(_pool.num_threads, thread_name_prefix=_POOL_NAME)
        executor = _pool.executor
    return list(executor.map(fn, items))


# ----------------------------------------------------------------------------- BLAS threads

# What OpenBLAS reads when it starts; a count the user put there wins over the one the program would choose.
BLAS_ENV_VARS = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")

# The entry points, as OpenBLAS spells them: plain, or with the scipy-openblas prefix and the suffix of its
# 64-bit-integer builds (NumPy's wheels ship libscipy_openblas64_: scipy_openblas_set_num_threads64_).
_SPELLINGS = [(prefix, suffix) for prefix in ("scipy_", "") for suffix in ("64_", "_64", "")]


class _Blas:
    def __init__(self):
        self.libraries = None       # [(set_num_threads, get_num_threads)], found on first use
        self.initial = None         # the count the library started with: its own default


_blas = _Blas()


def _openblas_paths() -> list:
    """The OpenBLAS libraries mapped into this process (NumPy's, and any other a module brought)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            paths = [line.split(None, 5)[-1].strip() for line in maps if "openblas" in line.lower()]
    except OSError:                 # no /proc (macOS, Windows): the library's own setting stays
        return []
    return list(dict.fromkeys(p for p in paths if p.startswith("/") and ".so" in os.path.basename(p)))


def _openblas_functions(path: str):
    """(set_num_threads, get_num_threads) of the library at path, already loaded (RTLD_NOLOAD: never a second
    copy); None where it has no such entry points."""
    try:
        library = ctypes.CDLL(path, mode=getattr(os, "RTLD_NOLOAD", 0))
    except OSError:
        return None
    for prefix, suffix in _SPELLINGS:
        setter = getattr(library, f"{prefix}openblas_set_num_threads{suffix}", None)
        getter = getattr(library, f"{prefix}openblas_get_num_threads{suffix}", None)
        if setter is not None and getter is not None:
            setter.argtypes, setter.restype = [ctypes.c_int], None
            getter.argtypes, getter.restype = [], ctypes.c_int
            return setter, getter
    return None


def _blas_libraries() -> list:
    if _blas.libraries is None:
        found = [_openblas_functions(path) for path in _openblas_paths()]
        _blas.libraries = [f for f in found if f is not None]
        if _blas.libraries:
            _blas.initial = int(_blas.libraries[0][1]())
    return _blas.libraries


def blas_threads() -> int | None:
    """The threads NumPy's BLAS uses for a product now; None where it cannot be read (not OpenBLAS)."""
    libraries = _blas_libraries()
    return int(libraries[0][1]()) if libraries else None


def default_blas_threads() -> int | None:
    """The count OpenBLAS started with (its environment variables, else the cores); None where not OpenBLAS."""
    _blas_libraries()
    return _blas.initial


def set_blas_threads(n: int) -> bool:
    """Use n BLAS threads from now on. -> True if it was set, False where the BLAS is not one this can reach
    (Apple's Accelerate, MKL): then the library keeps its own setting, silently."""
    n = checks.positive_int("set_blas_threads", "n", n)
    libraries = _blas_libraries()
    for setter, _ in libraries:
        setter(n)
    return bool(libraries)


def blas_threads_from_env() -> tuple | None:
    """(variable, count) of the first BLAS_ENV_VARS entry that names a positive count; None if none does."""
    for var in BLAS_ENV_VARS:
        value = os.environ.get(var, "").strip()
        if value.isdigit() and int(value) > 0:
            return var, int(value)
    return None


def use_blas_threads(n: int | None) -> tuple:
    """Set the BLAS threads for the work ahead, unless the user chose: -> (count now in force or None, why).

    n     the count wanted; None: the library's default (the cores), restored if an earlier call changed it
    why   "OPENBLAS_NUM_THREADS" (or the variable that set it): the user's count, left alone;
          "chosen": this call set it; "default": the library's own count; "unknown": not OpenBLAS, untouched
    """
    from_env = blas_threads_from_env()
    if from_env is not None:
        return blas_threads() or from_env[1], from_env[0]
    wanted = default_blas_threads() if n is None else n
    if wanted is None or not set_blas_threads(wanted):
        return None, "unknown"
    return blas_threads(), "default" if n is None else "chosen"
