"""What the tests that run on a device backend share: switching backends, and the tolerance against NumPy."""

import fakecupy

import minitransformer as mt

# The fake computes with NumPy underneath, so exactly equal; CuPy runs float64 on a GPU in another summation order.
TOLERANCE = {"fakecupy": {"rtol": 0, "atol": 0}, "cupy": {"rtol": 1e-9, "atol": 1e-12}}


def use(name):
    """Switch the backend: "numpy", "cupy", or "fakecupy" (the module; set_backend knows no such name)."""
    mt.set_backend(fakecupy if name == "fakecupy" else name)
    return mt.backend.xp()
