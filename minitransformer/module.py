"""Parameter and Module: the two classes every layer is built from.

A ``Parameter`` is a pair of arrays, ``data`` and ``grad``, of the same shape.
A ``Module`` has ``forward`` (computes the output and caches what backward needs) and ``backward``
(takes dL/d(output), returns dL/d(input) and ADDS into the ``grad`` of its parameters).

Why add (+=) and never assign: a Parameter used twice (the target embedding tied to the output
projection, or one embedding shared by source and target) receives one gradient from each use, and the
sum is the total. ``zero_grad()`` clears the sums before the next step. Activations used twice (a
residual branch, the encoder output read by every decoder layer) follow the same rule, written out as
explicit sums in backward (``dx = dout + sublayer.backward(dout)``).
"""

from __future__ import annotations

from collections import OrderedDict
from types import SimpleNamespace

import numpy

from . import backend, checks


def _cast(owner: str, name: str, value, dtype, shape=None):
    """``value`` (checked: real, finite numbers of ``shape``) as an array of ``dtype`` in the active backend,
    refused if the cast makes a number infinite (1e300 is finite in float64, inf in float32)."""
    value = checks.weights(owner, name, value, shape)
    with numpy.errstate(over="ignore"):                                    # an overflow is refused just below
        out = backend.asarray(value, dtype=dtype)
    if out.dtype.kind == "f" and out.size and not bool(backend.xp().isfinite(out).all()):
        raise ValueError(f"{owner}: {name} holds values beyond the range of {out.dtype}, which would become "
                         f"infinite in it")
    return out


class Parameter:
    """A trainable array and its gradient.     data, grad: same shape, active backend, default dtype."""

    def __init__(self, data, dtype=None):
        # New parameters take the default dtype (float32, or float64 for gradient checks) unless told otherwise.
        self.data = _cast("Parameter", "data", data, backend.get_default_dtype() if dtype is None else dtype)
        self.grad = backend.xp().zeros_like(self.data)

    @property
    def shape(self):
        return self.data.shape

    def zero_grad(self):
        self.grad.fill(0)  # in place: no cache holds a reference to a gradient buffer

    def __repr__(self):
        return f"Parameter(shape={tuple(self.data.shape)}, dtype={self.data.dtype})"


class Module:
    """Base class of every layer and model.

    Subclasses define ``forward(*inputs)`` and ``backward(dout)``. Assigning a Parameter or a Module to
    an attribute registers it, so ``parameters()`` finds it (the idea comes from minitorch / PyTorch).

    ``module(x)`` checks the inputs (``check_inputs``, what a caller outside the model may get wrong), then
    runs ``forward(x)``. Inside the model, layers call each other's ``forward`` directly: the model checked
    its token ids once, and everything after that is its own arithmetic.

    The cache: forward ends with ``self.save_for_backward(out, x=x, ...)``, and backward begins with
    ``self.saved(dout)``, which hands back what forward saved, once. That one pair keeps the rules of a
    layer with a cache:
      - one instance per call site: a second forward in training mode before the backward raises
        (it would overwrite the activations the backward needs); in eval mode forward may run any
        number of times (inference);
      - a backward with no forward before it, or a second backward for one forward, raises;
      - ``dout`` must have the shape of the forward's output.
    ``keep_dout = True`` keeps the gradient each backward receives as ``.dout``, to look at: how it changes
    from layer to layer, which attention heads it reaches (as ``.attn`` keeps attention weights for plots).
    """

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)
        object.__setattr__(self, "_cache", None)                 # what the last forward saved for backward
        object.__setattr__(self, "keep_dout", False)

    # -- registration ------------------------------------------------------------------
    def __setattr__(self, name, value):
        if "_parameters" not in self.__dict__:
            raise RuntimeError(f"{type(self).__name__}.__init__ must call super().__init__() before setting {name!r}")
        self._parameters.pop(name, None)
        self._modules.pop(name, None)
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        object.__setattr__(self, name, value)

    # -- calling -----------------------------------------------------------------------
    def __call__(self, *inputs, **kwargs):
        self.check_inputs(*inputs, **kwargs)
        return self.forward(*inputs, **kwargs)

    def check_inputs(self, *inputs, **kwargs) -> None:
        """Raise a clear error for inputs that forward cannot take. Layers override it."""

    def forward(self, *inputs):
        raise NotImplementedError(f"{type(self).__name__} must define forward")

    def backward(self, dout):
        raise NotImplementedError(f"{type(self).__name__} must define backward")

    # -- the cache between forward and backward ------------------------------------------
    def save_for_backward(self, out, **saved) -> None:
        """Keep ``saved`` (by name) for backward, and the shape of ``out`` to check dout against."""
        if self.training and self._cache is not None:
            raise RuntimeError(
                f"{type(self).__name__}: forward was called twice in training mode without a backward in between, "
                "which would overwrite the activations its backward needs. Use one instance per call site, "
                "call backward after each forward, or switch to .eval() for inference.")
        object.__setattr__(self, "_cache", SimpleNamespace(out_shape=tuple(out.shape), **saved))

    def saved(self, dout) -> SimpleNamespace:
        """What forward saved, handed out once; raises if there is no forward to go back through or if
        ``dout`` does not have the shape of that forward's output."""
        cache = self._cache
        if cache is None:
            raise RuntimeError(f"{type(self).__name__}.backward: there is no forward to go back through. Call the "
                               f"module first (module(x)); each forward allows one backward.")
        if not hasattr(dout, "shape") or tuple(dout.shape) != cache.out_shape:
            raise ValueError(f"{type(self).__name__}.backward: dout must have the shape of the forward's output "
                             f"{cache.out_shape}, got {getattr(dout, 'shape', type(dout).__name__)}")
        if self.keep_dout:                                       # a copy: a backward may write into its dout
            object.__setattr__(self, "dout", dout.copy())
        object.__setattr__(self, "_cache", None)
        return cache

    def clear_caches(self) -> None:
        """Forget every saved forward of this module and its children (train/eval and gradcheck use it)."""
        for m in self.modules():
            object.__setattr__(m, "_cache", None)

    # -- traversal -----------------------------------------------------------------------
    def named_modules(self, prefix: str = ""):
        """(dotted name, module) for this module and every descendant, each instance once."""
        seen = set()
        stack = [(prefix, self)]
        while stack:
            name, mod = stack.pop(0)
            if id(mod) in seen:
                continue
            seen.add(id(mod))
            yield name, mod
            for child_name, child in mod._modules.items():
                stack.append((f"{name}.{child_name}" if name else child_name, child))

    def modules(self):
        return [m for _, m in self.named_modules()]

    def named_parameters(self, prefix: str = ""):
        """(dotted name, Parameter) pairs; a parameter shared by several modules appears once, under its first name."""
        seen = set()
        out = []
        for mod_name, mod in self.named_modules(prefix):
            for p_name, p in mod._parameters.items():
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append((f"{mod_name}.{p_name}" if mod_name else p_name, p))
        return out

    def parameters(self):
        """Every Parameter once (tied ones too), so an optimiser steps each exactly once."""
        return [p for _, p in self.named_parameters()]

    def num_parameters(self) -> int:
        return int(sum(p.data.size for p in self.parameters()))

    def zero_grad(self):
        for p in self.parameters():
            p.zero_grad()

    def train(self, mode: bool = True):
        """Training mode (dropout active) for this module and its children. Returns self."""
        for m in self.modules():
            object.__setattr__(m, "training", bool(mode))
        self.clear_caches()
        return self

    def eval(self):
        """Inference mode (dropout is the identity). Returns self."""
        return self.train(False)

    # -- saving ----------------------------------------------------------------------------
    def state_dict(self) -> OrderedDict[str, numpy.ndarray]:
        """{dotted name: host copy of the weights}; tied parameters are stored once."""
        return OrderedDict((name, backend.to_numpy(p.data).copy()) for name, p in self.named_parameters())

    def load_state_dict(self, state: dict, strict: bool = True) -> None:
        """Copy weights in, all or nothing: every entry is checked (name, shape, real numbers finite in the
        parameter's dtype: 1e300 is finite in float64 and inf in float32) before any weight changes. With
        strict=True the names must match exactly."""
        if not isinstance(state, dict):
            raise TypeError(f"load_state_dict: state must be a dict of arrays, as state_dict() gives, "
                            f"got {type(state).__name__}")
        params = OrderedDict(self.named_parameters())
        missing = [k for k in params if k not in state]
        unexpected = [k for k in state if k not in params]
        if strict and (missing or unexpected):
            raise ValueError(
                f"load_state_dict: state does not match {type(self).__name__}: "
                f"missing keys {missing[:5]}{'...' if len(missing) > 5 else ''}, "
                f"unexpected keys {unexpected[:5]}{'...' if len(unexpected) > 5 else ''}"
            )
        cast = {name: _cast("load_state_dict", f"parameter {name!r}", state[name], p.data.dtype, p.data.shape)
                for name, p in params.items() if name in state}
        for name, value in cast.items():
            params[name].data[...] = value

    def __repr__(self):
        lines = [f"{type(self).__name__}("]
        for name, mod in self._modules.items():
            sub = repr(mod).replace("\n", "\n  ")
            lines.append(f"  ({name}): {sub}")
        extra = self.extra_repr()
        if len(lines) == 1:
            return f"{type(self).__name__}({extra})"
        if extra:
            lines.insert(1, f"  {extra}")
        lines.append(")")
        return "\n".join(lines)

    def extra_repr(self) -> str:
        return ""


class ModuleList(Module):
    """A list of modules, registered as children named "0", "1", ..."""

    def __init__(self, modules=()):
        super().__init__()
        for i, m in enumerate(modules):
            setattr(self, str(i), m)

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def __getitem__(self, i):
        return list(self._modules.values())[i]
