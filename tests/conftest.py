"""Shared fixtures: every test starts on the session's backend in float32 with a fixed seed, and any
change a test makes to the backend state (or to the fast tier's thread count) is undone afterwards.

The session's backend is NumPy, unless MINITRANSFORMER_BACKEND=cupy (benchmarks/gpu.sh runs the gradient
checks so on a GPU) or MINITRANSFORMER_TEST_BACKEND=fakecupy (the same on tests/fakecupy.py, the CPU
stand-in for CuPy that refuses implicit device-to-host conversions).
"""

import os

import numpy as np
import pytest

import minitransformer as mt

if os.environ.get("MINITRANSFORMER_TEST_BACKEND") == "fakecupy":
    import fakecupy

    mt.set_backend(fakecupy)


@pytest.fixture(autouse=True)
def _restore_backend():
    backend, xp, dtype = mt.get_backend(), mt.backend.xp(), mt.get_default_dtype()
    threads = mt.fast.get_num_threads()
    mt.manual_seed(0)
    yield
    if mt.fast.get_num_threads() != threads:
        mt.fast.set_num_threads(threads)
    if mt.get_backend() != backend:
        mt.set_backend(xp)          # the module itself: the fake has no name set_backend knows
    mt.set_default_dtype(dtype)


@pytest.fixture
def float64():
    """Build parameters in float64, as gradient checks need."""
    mt.set_default_dtype("float64")
    yield
    mt.set_default_dtype("float32")


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture
def cupy_gpu():
    """The real CuPy, for the tests that need a GPU; skipped where CuPy or a CUDA device is missing."""
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("CuPy is installed but sees no GPU")
    except cupy.cuda.runtime.CUDARuntimeError:
        pytest.skip("CuPy is installed but sees no GPU")
    return cupy


@pytest.fixture(params=["fakecupy", "cupy"])
def device(request):
    """The device backend's name; a test switches to it with ``fakecupy.use(device)`` (NumPy stays the reference)."""
    if request.param == "cupy":
        request.getfixturevalue("cupy_gpu")                    # skips without a GPU
    return request.param
