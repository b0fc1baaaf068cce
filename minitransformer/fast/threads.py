"""A pool of CPU threads for the fast tier's elementwise work.

BLAS spreads each large matrix product over the cores by itself, but NumPy runs every ufunc on one core.
Each ufunc releases Python's GIL while it computes, so two threads calling NumPy on different slices of
an array really do run on two cores. ``parallel_map`` gives independent pieces of such work (Adam's
update) to ``get_num_threads()`` threads; ``set_num_threads`` or the environment
(``MINITRANSFORMER_NUM_THREADS``, else ``OMP_NUM_THREADS`` / ``OPENBLAS_NUM_THREADS``, else the cores this
process may use) sets how many.

BLAS has its own threads, and its own count: ``blas_threads`` reads it and ``set_blas_threads`` changes it
while the program runs, through threadpoolctl (OpenBLAS, MKL, BLIS; Apple's Accelerate offers no such setting,
and NO_BLAS_CONTROL is the line that says so). A second BLAS thread pays only on large products: on a model
of width 64 it gains little on an idle machine, and when another process keeps a core busy, OpenBLAS's threads,
which spin while they wait for each other, make every product several times slower. ``use_blas_threads``
is what the command line calls: the count chosen for the model, unless the user's environment names one.
"""

from __future__ import annotations

import functools
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy
import threadpoolctl

from .. import backend, checks

_POOL_NAME = "minitransformer-pool"


def count_from_env(variables) -> tuple | None:
    """(variable, count) of the first of the environment variables that names a positive count; None if none does."""
    for var in variables:
        value = os.environ.get(var, "").strip()
        if value.isdigit() and int(value) > 0:
            return var, int(value)
    return None


def _threads_from_env() -> int:
    found = count_from_env(("MINITRANSFORMER_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"))
    if found is not None:
        return found[1]
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

# What a BLAS reads when it starts (OpenBLAS, MKL, BLIS, Apple's Accelerate, and the OpenMP runtime some of them
# run on): a count the user put there wins over the one the program would choose.
BLAS_ENV_VARS = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
                 "VECLIB_MAXIMUM_THREADS", "OMP_NUM_THREADS")

NO_BLAS_CONTROL = ("BLAS threads: the library's own count (threadpoolctl finds no BLAS here whose threads it can set, "
                   "as with Apple's Accelerate; VECLIB_MAXIMUM_THREADS or OMP_NUM_THREADS, set before the start, set it)")


@functools.cache
def _blas_controller() -> tuple:
    """(threadpoolctl's controller of every BLAS in this process, NumPy's and any other a module brought; the count
    they started with, from their variables or else the cores, None where there is none), found once."""
    controller = threadpoolctl.ThreadpoolController().select(user_api="blas")
    info = controller.info()
    return controller, (int(info[0]["num_threads"]) if info else None)


def blas_threads() -> int | None:
    """The threads NumPy's BLAS uses for a product now; None where it cannot be read (NO_BLAS_CONTROL)."""
    info = _blas_controller()[0].info()
    return int(info[0]["num_threads"]) if info else None


def set_blas_threads(n: int) -> bool:
    """Use n BLAS threads from now on (every BLAS of the process). -> True if it was set, False where no BLAS's
    threads can be set (NO_BLAS_CONTROL): then the library keeps its own setting."""
    n = checks.positive_int("set_blas_threads", "n", n)
    controller = _blas_controller()[0]
    if not controller.lib_controllers:
        return False
    controller.limit(limits=n)      # applied now; the returned limiter would restore it only when asked to
    return True


def use_blas_threads(n: int | None) -> tuple:
    """Set the BLAS threads for the work ahead, unless the user chose: -> (count now in force or None, why).

    n     the count wanted; None: the library's default (the cores), restored if an earlier call changed it
    why   "OPENBLAS_NUM_THREADS" (or the variable that set it): the user's count, left alone;
          "chosen": this call set it; "default": the library's own count; "unknown": no BLAS whose threads can
          be set (NO_BLAS_CONTROL says so in one line), untouched
    """
    from_env = count_from_env(BLAS_ENV_VARS)
    if from_env is not None:
        return blas_threads() or from_env[1], from_env[0]
    wanted = _blas_controller()[1] if n is None else n
    if wanted is None or not set_blas_threads(wanted):
        return None, "unknown"
    return blas_threads(), "default" if n is None else "chosen"
