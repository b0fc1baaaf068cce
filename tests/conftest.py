"""Shared fixtures: every test starts on the NumPy backend in float32 with a fixed seed, and any
change a test makes to the backend state is undone afterwards."""

import numpy as np
import pytest

import minitransformer as mt


@pytest.fixture(autouse=True)
def _restore_backend():
    backend, dtype = mt.get_backend(), mt.get_default_dtype()
    mt.manual_seed(0)
    yield
    if mt.get_backend() != backend:
        mt.set_backend(backend)
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
