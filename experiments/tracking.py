"""Counting sequential operations: the length of the longest chain of array operations, each waiting for the last.

Table 1's "sequential operations" is the number of steps that cannot run at the same time however many
processors there are. Here every array operation (a matmul, an add, a tanh, a sum over an axis) counts as one
step, whatever its size, since all its elements could be computed at once; an operation can start only when
its inputs exist. So an array produced by an operation has depth = 1 + the largest depth of its inputs, and
the depth of a layer's output is its count of sequential operations.

    with tracked_backend():
        layer.forward(track(x)).depth

Tracked carries that depth through NumPy's ufuncs (``@`` included), its functions (np.pad, np.where, ...),
views (slices, reshapes), and writes into an array (``h[:, t] = ...`` makes h at least as deep as what was
written). One depth per array, not per element: a write deepens the whole array, which overcounts only
where a layer reads an early slice of an array after writing a later one (none of the layers measured here).
"""

from __future__ import annotations

import contextlib
import types

import numpy

import minitransformer as mt


class Tracked(numpy.ndarray):
    """A NumPy array with ``depth``: the number of operations, one after another, that produced it."""

    def __array_finalize__(self, obj):
        self.depth = getattr(obj, "depth", 0)                  # a view is as deep as the array it views

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        depth = 1 + _deepest(inputs)
        out = kwargs.get("out")
        if out is not None:
            kwargs["out"] = tuple(_plain(o) for o in out)
        result = getattr(ufunc, method)(*(_plain(x) for x in inputs), **kwargs)
        if out is not None:
            for o in out:
                if isinstance(o, Tracked):
                    o.depth = max(o.depth, depth)
        return _wrap(result, depth)

    def __array_function__(self, func, types_, args, kwargs):
        depth = 1 + max(_deepest(args), _deepest(kwargs.values()))
        return _wrap(func(*_plain_all(args), **{k: _plain_all(v) for k, v in kwargs.items()}), depth)

    def __setitem__(self, key, value):
        super().__setitem__(key, _plain(value))
        self.depth = max(self.depth, getattr(value, "depth", 0))


def _deepest(items) -> int:
    best = 0
    for x in items:
        if isinstance(x, Tracked):
            best = max(best, x.depth)
        elif isinstance(x, (list, tuple)):
            best = max(best, _deepest(x))
    return best


def _plain(x):
    return x.view(numpy.ndarray) if isinstance(x, Tracked) else x


def _plain_all(x):
    if isinstance(x, (list, tuple)):
        return type(x)(_plain_all(i) for i in x)
    return _plain(x)


def _wrap(result, depth):
    if isinstance(result, tuple):
        return tuple(_wrap(r, depth) for r in result)
    if isinstance(result, numpy.ndarray):
        out = result.view(Tracked)
        out.depth = depth
        return out
    return result


def track(x) -> Tracked:
    """x as a Tracked array of depth 0 (an input: nothing had to happen before it)."""
    out = numpy.asarray(x).view(Tracked)
    out.depth = 0
    return out


class _TrackedNumpy(types.ModuleType):
    """NumPy, except that the arrays a layer creates to write into (zeros, empty, ...) are Tracked."""

    def __getattr__(self, name):
        value = getattr(numpy, name)
        if name in ("zeros", "zeros_like", "empty", "empty_like", "ones", "ones_like", "full", "full_like"):
            return lambda *a, **k: track(value(*_plain_all(a), **k))
        return value


@contextlib.contextmanager
def tracked_backend():
    """Run the package on the tracking namespace, then go back to the backend that was active."""
    before = mt.backend.xp()
    mt.set_backend(_TrackedNumpy("tracked_numpy"))
    try:
        yield
    finally:
        mt.set_backend(before)


def sequential_operations(layer, x, *extra) -> int:
    """The depth of ``layer.forward(x, *extra)``'s output: its count of sequential operations."""
    with tracked_backend():
        layer.eval()
        return int(layer.forward(track(x), *extra).depth)
