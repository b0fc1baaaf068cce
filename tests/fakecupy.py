"""A stand-in for CuPy that runs on the CPU: it behaves like CuPy at the device boundary, so that the
tests can prove, on machines without a GPU, that training, evaluation, decoding and gradcheck keep their
arrays on the device.

    import fakecupy
    mt.set_backend(fakecupy)          # a module object: backend.py reads __backend_name__ = "fakecupy"

Its ``ndarray`` wraps a NumPy array (the "device memory") and refuses, with a TypeError as CuPy does:
- implicit conversion to NumPy: ``numpy.asarray(x)``, ``numpy.array(x)``, ``x.__array__()``, and so
  everything that calls them (``numpy.testing.assert_allclose(x, ...)``, ``numpy.float64(x)``, ...);
- NumPy ufuncs and functions called on it: ``numpy.exp(x)``, ``numpy.sum(x)``, ``numpy.concatenate([x])``.
  Real CuPy dispatches some of these to itself (NEP 13/18) and fails on the rest; the fake refuses them
  all, because package code should say ``backend.xp().exp`` and never depend on which ones dispatch;
- host arrays mixed into device arithmetic: ``x + numpy_array``, ``numpy_array * x``,
  ``xp.where(numpy_mask, x, 0)``; and ``x[...] = numpy_array`` raises CuPy's ValueError ("non-scalar
  numpy.ndarray cannot be used for fill").
What works, as on CuPy: ``x.get()`` and ``fakecupy.asnumpy(x)`` (explicit copies to the host);
``float(x)``, ``int(x)``, ``bool(x)``, ``x.item()`` on one-element arrays (CuPy synchronises there);
Python and NumPy scalars in arithmetic; lists and NumPy integer arrays as indices (CuPy copies them to
the device); ``fakecupy.asarray(host_data)`` (an explicit copy to the device).

CuPy semantics it mirrors:
- reductions and scalar indexing return 0-d arrays, never NumPy scalars (``x.sum()`` stays on the device);
- ``random.default_rng(seed)`` gives a Generator with CuPy's smaller API: ``random``, ``uniform``,
  ``standard_normal``, ``integers`` (no ``normal``, ``choice``, ``permutation``, ``shuffle``);
- the scatter-add is ``add.at(a, indices, b)``, as on CuPy 12 and later (the only ufunc ``.at`` here: the
  one the package uses).

``transfers`` records the copies each way (``transfers.host_sizes``, ``transfers.to_device``), so a test
can check that a training step pulls only scalars to the host. Only the subset of CuPy's namespace the
package uses is here: a missing name raises AttributeError, and belongs here if CuPy has it (where CuPy is
installed, test_device_boundary.py checks every name here, and the Generator's parameters, against it).

Run the whole gradient-check suite on it:  MINITRANSFORMER_TEST_BACKEND=fakecupy python -m pytest
tests/test_layers_gradcheck.py  (conftest.py switches the session's backend).
"""

from __future__ import annotations

import operator
import sys
import types

import numpy

__backend_name__ = "fakecupy"

_IMPLICIT = ("Implicit conversion to a NumPy array is not allowed. Please use `.get()` to construct a NumPy "
             "array explicitly.")  # CuPy's own message


class _Transfers:
    """What crossed the device boundary since ``reset()``: ``host_sizes`` holds the number of elements of
    each device-to-host copy (``to_host`` is how many), ``to_device`` counts host-to-device copies."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.host_sizes = []
        self.to_device = 0

    @property
    def to_host(self) -> int:
        return len(self.host_sizes)


transfers = _Transfers()


# ------------------------------------------------------------------------------------- the boundary

def _unsupported(x):
    # CuPy's ufuncs raise this for any operand that is neither a cupy.ndarray nor a scalar.
    return TypeError(f"Unsupported type {type(x)}")


def _operand(x):
    """An operand of arithmetic: device arrays and scalars only (CuPy refuses host arrays and lists)."""
    if isinstance(x, ndarray):
        return x._a
    if isinstance(x, (bool, int, float, complex, numpy.generic)):
        return x
    raise _unsupported(x)


def _arg(x):
    """An argument of a function or method: device arrays are unwrapped, host arrays refused, and
    everything else (axes, shapes, dtypes, scalars, None) passed on; lists and tuples item by item."""
    if isinstance(x, ndarray):
        return x._a
    if isinstance(x, numpy.ndarray):
        raise _unsupported(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_arg(v) for v in x)
    return x


def _index(key):
    """An index: device arrays unwrapped; lists and NumPy integer/bool arrays allowed (CuPy copies them
    to the device, counted in ``transfers.to_device``)."""
    if isinstance(key, tuple):
        return tuple(_index(k) for k in key)
    if isinstance(key, ndarray):
        return key._a
    if isinstance(key, (list, numpy.ndarray)):
        transfers.to_device += 1
    return key


def _wrap(r):
    """Results back on the "device"; NumPy scalars become 0-d arrays, as CuPy's results are."""
    if isinstance(r, numpy.ndarray):
        return ndarray(r)
    if isinstance(r, numpy.generic):
        return ndarray(numpy.asarray(r))
    if isinstance(r, tuple):
        return tuple(_wrap(v) for v in r)
    return r


def _host_value(x):
    """The host copy behind float(x), int(x), bool(x), x.item(): counted as a transfer (a sync on CuPy)."""
    transfers.host_sizes.append(x._a.size)
    return x._a


# ------------------------------------------------------------------------------------------ ndarray

class ndarray:
    """A device array: a NumPy array behind a wall that only ``.get()`` (and scalar reads) cross."""

    __slots__ = ("_a",)
    __array_ufunc__ = None   # numpy.exp(x) raises; numpy_array + x falls back to x.__radd__, which refuses
    __hash__ = None

    def __init__(self, a):
        if not isinstance(a, numpy.ndarray):
            raise TypeError("fakecupy.ndarray wraps a numpy.ndarray; make arrays with fakecupy.asarray")
        self._a = a

    # -- the boundary ------------------------------------------------------------------------------
    def __array__(self, dtype=None, copy=None):
        raise TypeError(_IMPLICIT)

    def __array_function__(self, func, types, args, kwargs):
        raise TypeError(f"numpy.{func.__name__} was called on a fakecupy (device) array; call it through "
                        f"the backend namespace (backend.xp().{func.__name__}) or copy to the host with .get()")

    def get(self, stream=None):
        transfers.host_sizes.append(self._a.size)
        return self._a.copy()

    def item(self):
        return _host_value(self).item()

    def tolist(self):
        return _host_value(self).tolist()

    def __float__(self):
        return float(_host_value(self))

    def __int__(self):
        return int(_host_value(self))

    def __bool__(self):
        return bool(_host_value(self))

    def __complex__(self):
        return complex(_host_value(self))

    def __format__(self, spec):
        return format(_host_value(self), spec)

    def __repr__(self):
        return "fakecupy." + repr(self._a)

    def __str__(self):
        return str(self._a)

    # -- attributes ---------------------------------------------------------------------------------
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    itemsize = property(lambda self: self._a.itemsize)
    nbytes = property(lambda self: self._a.nbytes)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)
    T = property(lambda self: ndarray(self._a.T))
    device = property(lambda self: "fakecupy:0")

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        if self._a.ndim == 0:
            raise TypeError("iteration over a 0-d array")
        return (ndarray(numpy.asarray(self._a[i])) for i in range(len(self._a)))

    # -- indexing -----------------------------------------------------------------------------------
    def __getitem__(self, key):
        return _wrap(self._a[_index(key)])

    def __setitem__(self, key, value):
        self._a[_index(key)] = _fill_value(value)

    def fill(self, value):
        self._a.fill(_fill_value(value))

    # -- unary operators ----------------------------------------------------------------------------
    def __neg__(self):
        return ndarray(-self._a)

    def __pos__(self):
        return ndarray(+self._a)

    def __abs__(self):
        return ndarray(abs(self._a))

    def __invert__(self):
        return ndarray(~self._a)


def _fill_value(value):
    """A value written into a device array: as CuPy's fill, a NumPy array must be a scalar."""
    if isinstance(value, numpy.ndarray):
        if value.ndim:
            raise ValueError("non-scalar numpy.ndarray cannot be used for fill")  # CuPy's message
        return value.item()
    return _operand(value)


def _binary(op):
    def forward(self, other):
        return _wrap(op(self._a, _operand(other)))

    def reflected(self, other):
        return _wrap(op(_operand(other), self._a))

    return forward, reflected


def _inplace(op):
    def method(self, other):
        op(self._a, _operand(other))   # NumPy's in-place operator writes into self._a itself
        return self

    return method


for _name, _op, _iop in [
    ("add", operator.add, operator.iadd), ("sub", operator.sub, operator.isub),
    ("mul", operator.mul, operator.imul), ("truediv", operator.truediv, operator.itruediv),
    ("floordiv", operator.floordiv, operator.ifloordiv), ("mod", operator.mod, operator.imod),
    ("pow", operator.pow, operator.ipow), ("matmul", operator.matmul, operator.imatmul),
    ("and", operator.and_, operator.iand), ("or", operator.or_, operator.ior),
    ("xor", operator.xor, operator.ixor),
]:
    _forward, _reflected = _binary(_op)
    setattr(ndarray, f"__{_name}__", _forward)
    setattr(ndarray, f"__r{_name}__", _reflected)
    setattr(ndarray, f"__i{_name}__", _inplace(_iop))

for _name, _op in [("eq", operator.eq), ("ne", operator.ne), ("lt", operator.lt), ("le", operator.le),
                   ("gt", operator.gt), ("ge", operator.ge)]:
    setattr(ndarray, f"__{_name}__", _binary(_op)[0])


def _method(name):
    def method(self, *args, **kwargs):
        out = kwargs.get("out")
        result = getattr(self._a, name)(*_arg(args), **{k: _arg(v) for k, v in kwargs.items()})
        return out if isinstance(out, ndarray) else _wrap(result)

    method.__name__ = name
    return method


for _name in ("sum", "mean", "max", "min", "prod", "any", "all", "argmax", "argmin", "var", "std", "cumsum",
              "reshape", "transpose", "swapaxes", "ravel", "flatten", "squeeze", "copy", "astype", "view",
              "repeat", "take", "clip", "dot", "nonzero", "argsort", "round"):
    setattr(ndarray, _name, _method(_name))


# ---------------------------------------------------------------------------------------- namespace

def _function(f, name=None):
    def function(*args, **kwargs):
        out = kwargs.get("out")
        result = f(*_arg(args), **{k: _arg(v) for k, v in kwargs.items()})
        return out if isinstance(out, ndarray) else _wrap(result)

    function.__name__ = name or f.__name__
    return function


def asarray(a, dtype=None, order=None):
    """Device array of ``a``: a device array is returned as it is (or cast); host data is copied over."""
    if isinstance(a, ndarray):
        return a if dtype is None or a.dtype == dtype else ndarray(a._a.astype(dtype))
    transfers.to_device += 1
    return ndarray(numpy.array(a, dtype=dtype, order=order or "K"))


def array(a, dtype=None, copy=True, order="K"):
    if isinstance(a, ndarray):
        return ndarray(a._a.astype(dtype or a.dtype, copy=copy))
    transfers.to_device += 1
    return ndarray(numpy.array(a, dtype=dtype, order=order))


def asnumpy(a, stream=None):
    """The explicit copy to the host (``cupy.asnumpy``)."""
    return a.get() if isinstance(a, ndarray) else numpy.asarray(a)


def get_array_module(*args):
    return sys.modules[__name__] if any(isinstance(a, ndarray) for a in args) else numpy


# Functions that make arrays from a shape, and those that read device arrays. Each refuses host arrays
# among its arguments (``xp.where(numpy_mask, ...)`` is an error on CuPy) and returns device arrays.
for _name in (
    # creation
    "zeros", "ones", "empty", "full", "arange", "linspace", "eye", "zeros_like", "ones_like", "empty_like",
    "full_like",
    # elementwise (ufuncs; add.at below)
    "add", "subtract", "multiply", "divide", "true_divide", "negative", "power", "exp", "log", "log1p",
    "expm1", "sqrt", "square", "abs", "absolute", "tanh", "sin", "cos", "maximum", "minimum", "isfinite",
    "isnan", "isinf", "sign", "logical_and", "logical_or", "logical_not", "equal", "not_equal", "less",
    "greater", "where", "clip",
    # reductions and the rest
    "sum", "mean", "max", "min", "amax", "amin", "prod", "any", "all", "argmax", "argmin", "cumsum",
    "var", "std", "count_nonzero", "matmul", "dot", "vdot", "einsum", "tensordot", "outer", "concatenate",
    "stack", "take", "take_along_axis", "broadcast_to", "expand_dims", "squeeze", "reshape", "transpose",
    "swapaxes", "tril", "triu", "sort", "argsort", "nonzero", "flatnonzero", "repeat", "tile",
    "ascontiguousarray", "allclose", "array_equal",
):
    globals()[_name] = _function(getattr(numpy, _name), _name)


def _add_at(a, indices, b=None):
    """a[indices] += b with every repeated index added: CuPy's ``ufunc.at(a, indices, b=None)``."""
    if not isinstance(a, ndarray):
        raise _unsupported(a)
    numpy.add.at(a._a, _index(indices), _operand(b))


globals()["add"].at = _add_at                               # add, like the names above, is made in the loop

# dtypes and constants: CuPy uses NumPy's.
dtype, iinfo, finfo = numpy.dtype, numpy.iinfo, numpy.finfo
float16, float32, float64 = numpy.float16, numpy.float32, numpy.float64
int8, int16, int32, int64, intp = numpy.int8, numpy.int16, numpy.int32, numpy.int64, numpy.intp
uint8, uint16, uint32, uint64, bool_ = numpy.uint8, numpy.uint16, numpy.uint32, numpy.uint64, numpy.bool_
inf, nan, pi, e, newaxis = numpy.inf, numpy.nan, numpy.pi, numpy.e, numpy.newaxis


# ------------------------------------------------------------------------------------------- random

class Generator:
    """CuPy's ``cupy.random.Generator``: the methods the fake keeps are those CuPy has.

    NumPy's Generator also has normal, choice, permutation, shuffle, ...; CuPy's does not, so neither
    does this one: code that draws on the device must use these. (Draw on the host with NumPy and copy,
    ``backend.host_rng()``, for the others.) The stream differs from NumPy's for the same seed, as CuPy's does.
    """

    def __init__(self, seed=None):
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, numpy.integer))):
            raise TypeError(f"fakecupy.random.default_rng: seed must be None or an int, got {seed!r}")
        # A NumPy stream that is not the one numpy.random.default_rng(seed) gives: as on CuPy.
        self._rng = numpy.random.default_rng(None if seed is None else [int(seed), 0xC0FFEE])

    def random(self, size=None, dtype=numpy.float64, out=None):
        return self._fill(out, self._rng.random(size, dtype=dtype))

    def uniform(self, low=0.0, high=1.0, size=None, dtype=numpy.float64):
        return ndarray(numpy.asarray(self._rng.uniform(low, high, size)).astype(dtype, copy=False))

    def standard_normal(self, size=None, dtype=numpy.float64, out=None):
        return self._fill(out, self._rng.standard_normal(size, dtype=dtype))

    def integers(self, low, high=None, size=None, dtype=numpy.int64, endpoint=False):
        return ndarray(numpy.asarray(self._rng.integers(low, high, size, dtype=dtype, endpoint=endpoint)))

    @staticmethod
    def _fill(out, values):
        if out is None:
            return ndarray(numpy.asarray(values))
        out._a[...] = values
        return out


def _default_rng(seed=None):
    return Generator(seed)


random = types.SimpleNamespace(default_rng=_default_rng, Generator=Generator)
