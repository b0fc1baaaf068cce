"""A pool of CPU threads for the fast tier's elementwise work.

BLAS spreads each large matrix product over the cores by itself, but NumPy runs every ufunc on one core.
Each ufunc releases Python's GIL while it computes, so two threads calling NumPy on different slices of
an array really do run on two cores. ``parallel_map`` gives independent pieces of such work (Adam's
update) to ``get_num_threads()`` threads; ``set_num_threads`` or the environment
(``MINITRANSFORMER_NUM_THREADS``, else ``OMP_NUM_THREADS`` / ``OPENBLAS_NUM_THREADS``, else the cores this
process may use) sets how many.
"""

from __future__ import annotations

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
