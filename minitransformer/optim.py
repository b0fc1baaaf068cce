"""Adam and the learning-rate schedule of the paper (section 5.3), NoamSchedule; and SGD and clip_grad_norm,
which the paper does not use.

An optimiser holds the list of Parameters and, for each, the state its update rule needs (Adam's two
moving averages, SGD's momentum buffer), keyed by the parameter's index in that list: layers never
carry optimiser state. ``step()`` reads every ``p.grad`` and changes ``p.data`` in place.

One training step:

    loss = loss_fn(model(src, tgt_in), tgt_out)
    model.backward(loss_fn.backward())
    clip_grad_norm(model.parameters(), max_norm=1.0)    # optional
    sched.step(); opt.step(); opt.zero_grad()

``state_dict()`` gives plain data, host NumPy arrays and Python numbers under string keys
({"step": 3, "lr": 1e-3, "m.0": array, ...}), so a checkpoint is an ``.npz`` file with no pickle.
"""

from __future__ import annotations

import math

import numpy

from . import backend

# ----------------------------------------------------------------------------------------- checks

def _is_number(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float, numpy.integer, numpy.floating))


def _check_positive(owner: str, name: str, value, allow_inf: bool = False) -> None:
    """A number > 0; finite unless allow_inf (an infinite lr would turn every weight into inf or nan)."""
    if not _is_number(value) or not value > 0 or (value == math.inf and not allow_inf):  # `not > 0`: nan too
        raise ValueError(f"{owner}: {name} must be a {'' if allow_inf else 'finite '}positive number, got {value!r}")


def _check_non_negative(owner: str, name: str, value) -> None:
    if not _is_number(value) or not 0 <= value < math.inf:
        raise ValueError(f"{owner}: {name} must be a finite number >= 0, got {value!r}")


def _check_unit_interval(owner: str, name: str, value) -> None:
    """A decay rate such as a momentum or a beta: a number in [0, 1)."""
    if not _is_number(value) or not 0.0 <= value < 1.0:
        raise ValueError(f"{owner}: {name} must be a number in [0, 1), got {value!r}")


def _check_positive_int(owner: str, name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, numpy.integer)) or value <= 0:
        raise ValueError(f"{owner}: {name} must be a positive int, got {value!r}")


def _parameter_list(owner: str, name: str, params) -> list:
    """The parameters as a list: non-empty, each with .data and .grad, none twice (it would be stepped twice)."""
    if hasattr(params, "data") and hasattr(params, "grad"):
        raise ValueError(f"{owner}: {name} must be an iterable of Parameters (e.g. model.parameters()), "
                         f"got a single {type(params).__name__}")
    try:
        params = list(params)
    except TypeError:
        raise ValueError(f"{owner}: {name} must be an iterable of Parameters (e.g. model.parameters()), "
                         f"got {type(params).__name__}") from None
    if not params:
        raise ValueError(f"{owner}: {name} must be a non-empty list of Parameters, got an empty list")
    for i, p in enumerate(params):
        if not (hasattr(p, "data") and hasattr(p, "grad")):
            raise TypeError(f"{owner}: {name}[{i}] must be a Parameter (with .data and .grad), "
                            f"got {type(p).__name__}")
    if len({id(p) for p in params}) != len(params):
        raise ValueError(f"{owner}: {name} lists a Parameter more than once; pass each once "
                         "(Module.parameters() already lists tied parameters once)")
    return params


# -------------------------------------------------------------------------------------- optimisers

# Adam's update on the CPU runs over slices of this many elements, small enough for its arrays to stay
# in the cache between its passes (see Adam.__init__).
CPU_CHUNK = 1 << 16


class Optimizer:
    """Base class: the parameter list, the learning rate, the step count and the per-parameter state arrays.

    Subclasses name their state arrays in ``_state_names`` (e.g. ("m", "v")), allocate them once with
    ``_allocate_state`` and define ``step()``. state_dict/load_state_dict then need nothing more.
    """

    _state_names: tuple = ()
    _hyper_names: tuple = ()      # scalar hyperparameters, shown by repr

    def __init__(self, params, lr: float):
        owner = type(self).__name__
        self.params = _parameter_list(owner, "params", params)
        _check_positive(owner, "lr", lr)
        self.lr = float(lr)
        self.step_count = 0       # number of step() calls so far (Adam's t)
        self.state = {}           # {state name: [one array per parameter, same shape and dtype as p.data]}

    def _allocate_state(self) -> None:
        xp = backend.xp()
        self.state = {name: [xp.zeros_like(p.data) for p in self.params] for name in self._state_names}

    def zero_grad(self) -> None:
        """Set every gradient to zero (backward adds into .grad, so this starts the next sum)."""
        for p in self.params:
            p.grad.fill(0)

    def step(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} must define step")

    # -- saving -------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """{"step": int, "lr": float, "<state>.<i>": host array, ...}: plain data, ready for ``numpy.savez``.

        Hyperparameters (betas, eps, momentum, weight decay) are not in it: they are constructor
        arguments, so they come back with the configuration that rebuilds the optimiser.
        """
        out = {"step": self.step_count, "lr": self.lr}
        for name, arrays in self.state.items():
            for i, a in enumerate(arrays):
                out[f"{name}.{i}"] = backend.to_numpy(a).copy()   # a copy: the state keeps changing
        return out

    def load_state_dict(self, state: dict) -> None:
        """Restore what ``state_dict`` gave (also after a round trip through ``numpy.savez``/``numpy.load``,
        where the numbers come back as 0-d arrays). Arrays are copied into the existing buffers."""
        owner = type(self).__name__
        needed = ["step", "lr"] + [f"{name}.{i}" for name in self._state_names for i in range(len(self.params))]
        missing = [k for k in needed if k not in state]
        unexpected = [k for k in state if k not in needed]
        if missing or unexpected:
            raise ValueError(f"{owner}.load_state_dict: state must have exactly the keys {needed[:6]}"
                             f"{'...' if len(needed) > 6 else ''} (this optimiser, {len(self.params)} parameters); "
                             f"missing {missing[:6]}, unexpected {unexpected[:6]}")
        for name in self._state_names:
            for i, p in enumerate(self.params):
                value = state[f"{name}.{i}"]
                if tuple(numpy.shape(value)) != tuple(p.data.shape):
                    raise ValueError(f"{owner}.load_state_dict: {name}.{i} must have shape {tuple(p.data.shape)} "
                                     f"(parameter {i}), got {tuple(numpy.shape(value))}")
        self.step_count = int(state["step"])
        self.lr = float(state["lr"])
        for name in self._state_names:
            for i, a in enumerate(self.state[name]):
                a[...] = backend.asarray(state[f"{name}.{i}"], dtype=a.dtype)

    def __repr__(self):
        hyper = ", ".join(f"{name}={getattr(self, name)}" for name in ("lr", *self._hyper_names))
        return f"{type(self).__name__}({len(self.params)} parameters, {hyper}, step={self.step_count})"


class SGD(Optimizer):
    """Stochastic gradient descent, with optional momentum and L2 weight decay; the update of torch.optim.SGD.

        g = grad + weight_decay * p
        b = momentum * b + g                  (b starts at 0, so the first b is g, as in torch)
        p = p - lr * b                        (p = p - lr * g without momentum)

    State: the momentum buffer b, one per parameter (only when momentum > 0).
    """

    _hyper_names = ("momentum", "weight_decay")

    def __init__(self, params, lr: float, momentum: float = 0.0, weight_decay: float = 0.0):
        super().__init__(params, lr)
        _check_unit_interval("SGD", "momentum", momentum)
        _check_non_negative("SGD", "weight_decay", weight_decay)
        self.momentum = float(momentum)
        self.weight_decay = float(weight_decay)
        self._state_names = ("momentum_buffer",) if self.momentum > 0 else ()
        self._allocate_state()

    def step(self) -> None:
        self.step_count += 1
        for i, p in enumerate(self.params):
            g = p.grad
            if self.weight_decay:
                g = g + self.weight_decay * p.data              # L2: the gradient of wd/2 * |p|^2
            if self.momentum:
                b = self.state["momentum_buffer"][i]
                b *= self.momentum
                b += g                                          # in place: b = momentum * b + g
                g = b
            p.data -= self.lr * g                               # in place: the only write to the weights


class Adam(Optimizer):
    """Adam (Kingma & Ba), with the defaults of the paper: betas (0.9, 0.98), eps 1e-9. The update of torch.optim.Adam.

        g = grad + weight_decay * p                   (L2 penalty added to the gradient, as torch.optim.Adam;
                                                       AdamW's decoupled decay is a different rule)
        m = beta1 * m + (1 - beta1) * g               first moment, running mean of g
        v = beta2 * v + (1 - beta2) * g^2             second moment, running mean of g^2
        m_hat = m / (1 - beta1^t),  v_hat = v / (1 - beta2^t)     bias correction: m and v start at 0
        p = p - lr * m_hat / (sqrt(v_hat) + eps)

    eps is added after the square root, and torch computes sqrt(v_hat) as sqrt(v) / sqrt(1 - beta2^t);
    this code follows the same order of operations so the two agree to rounding.
    State: m and v, one each per parameter, allocated once; t = step_count is shared by all parameters.
    """

    _state_names = ("m", "v")
    _hyper_names = ("beta1", "beta2", "eps", "weight_decay")

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.98), eps: float = 1e-9, weight_decay: float = 0.0):
        super().__init__(params, lr)
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"Adam: betas must be a pair (beta1, beta2) of numbers in [0, 1), got {betas!r}")
        _check_unit_interval("Adam", "betas[0]", betas[0])
        _check_unit_interval("Adam", "betas[1]", betas[1])
        _check_non_negative("Adam", "eps", eps)
        _check_non_negative("Adam", "weight_decay", weight_decay)
        self.beta1, self.beta2 = float(betas[0]), float(betas[1])
        self.eps = float(eps)
        self.weight_decay = float(weight_decay)
        # Speed. The update writes its intermediates into work buffers (out=...), reused at every step,
        # instead of creating five temporary arrays per parameter per step.
        # On the CPU it runs over slices of CPU_CHUNK elements, so that its twelve passes stay in the cache
        # instead of streaming whole arrays (the embeddings are tens of MB) from memory twelve times (measured
        # 1.2-1.5x faster on the base model), and the slices are shared out among the CPU threads (they are
        # independent; see backend.parallel_map): one work buffer of one slice per thread.
        # On a GPU every array operation is a kernel launch, which costs microseconds of host time whatever
        # the array's size: more than the arithmetic of most parameters (biases, LayerNorm's gamma and beta).
        # So m and v of all the parameters of one dtype are ONE flat array each (self.state holds per-parameter
        # views of them), the gradients are gathered into one flat buffer, and the formulas run once over the
        # flat arrays: 13 launches (16 with weight decay) plus one subtraction per parameter, instead of 13
        # per parameter (the base model has 254 parameters: 267 launches a step instead of 3302).
        self._on_cpu = backend.get_backend() == "numpy"
        if self._on_cpu:
            self._allocate_state()
            self._work = {}   # dtype -> (threads, CPU_CHUNK) work buffers
        else:
            self._allocate_flat_state()

    def _allocate_flat_state(self) -> None:
        """On a GPU: per dtype, flat m and v (of which self.state holds per-parameter views), a flat gradient
        buffer and a flat work buffer, each as long as all the parameters of that dtype together."""
        xp = backend.xp()
        self.state = {"m": [None] * len(self.params), "v": [None] * len(self.params)}
        self._flat = []   # (indices of the parameters, their slices of the flat arrays, m, v, g, work) per dtype
        by_dtype = {}
        for i, p in enumerate(self.params):
            by_dtype.setdefault(p.data.dtype, []).append(i)
        for dtype, indices in by_dtype.items():
            spans, start = [], 0
            for i in indices:
                spans.append(slice(start, start + self.params[i].data.size))
                start += self.params[i].data.size
            m, v, g, work = (xp.zeros(start, dtype=dtype) for _ in range(4))   # (total,)
            for i, span in zip(indices, spans):
                shape = self.params[i].data.shape
                self.state["m"][i], self.state["v"][i] = m[span].reshape(shape), v[span].reshape(shape)  # views
            self._flat.append((indices, spans, m, v, g, work))

    @property
    def betas(self) -> tuple:
        return (self.beta1, self.beta2)

    def step(self) -> None:
        xp = backend.xp()
        self.step_count += 1
        t = self.step_count
        beta1, beta2 = self.beta1, self.beta2
        step_size = self.lr / (1.0 - beta1 ** t)                # lr / bias_correction1
        sqrt_bias_correction2 = math.sqrt(1.0 - beta2 ** t)

        def adam_step(g, m, v, work):
            # The formulas above, operation for operation in the same order (so the result is unchanged),
            # each written in place into m, v or the work buffer. All arguments have the same shape.
            # Returns the step lr_t m_hat / (sqrt(v_hat) + eps), in `work`, for the caller to subtract.
            m *= beta1
            m += xp.multiply(g, 1.0 - beta1, out=work)          # m = beta1 m + (1 - beta1) g
            v *= beta2
            g2 = xp.multiply(g, g, out=work)                    # g^2
            g2 *= 1.0 - beta2
            v += g2                                             # v = beta2 v + (1 - beta2) g^2
            denom = xp.sqrt(v, out=work)
            denom /= sqrt_bias_correction2                      # sqrt(v_hat)
            denom += self.eps
            step = xp.divide(m, denom, out=work)                # m / (sqrt(v_hat) + eps)
            step *= step_size
            return step

        if not self._on_cpu:                                    # a GPU: the flat arrays
            for indices, spans, m, v, g, work in self._flat:
                xp.concatenate([self.params[i].grad.reshape(-1) for i in indices], out=g)    # (total,) every grad
                if self.weight_decay:                           # g + weight_decay * p, p.grad untouched
                    xp.concatenate([self.params[i].data.reshape(-1) for i in indices], out=work)
                    work *= self.weight_decay
                    g += work
                step = adam_step(g, m, v, work)                 # (total,)
                for i, span in zip(indices, spans):
                    p = self.params[i].data
                    p -= step[span].reshape(p.shape)            # in place: the only write to the weights
            return

        slices = []                                             # (p, g, m, v) slices of CPU_CHUNK elements
        for i, p in enumerate(self.params):
            m, v = self.state["m"][i], self.state["v"][i]
            g = p.grad
            if self.weight_decay:
                g = g + self.weight_decay * p.data              # (shape of p) a new array: p.grad stays as it was
            arrays, n = (p.data, g, m, v), p.data.size
            if all(a.flags.c_contiguous for a in arrays):
                flat = [a.reshape(-1) for a in arrays]          # (n,) views
                slices += [tuple(a[start:start + CPU_CHUNK] for a in flat) for start in range(0, n, CPU_CHUNK)]
            else:                                               # a non-contiguous parameter: whole, own buffer
                p.data -= adam_step(g, m, v, xp.empty_like(p.data))
        if not slices:
            return
        # Thread k updates slices k, k + threads, k + 2 threads, ... with its own row of the work buffers.
        threads = min(backend.get_num_threads(), len(slices))
        work = {dtype: self._work_buffers(dtype, threads) for dtype in {s[0].dtype for s in slices}}

        def update_share(k):
            for p, g, m, v in slices[k::threads]:
                p -= adam_step(g, m, v, work[p.dtype][k, :p.size])  # in place: the only write to the weights

        backend.parallel_map(update_share, range(threads))

    def _work_buffers(self, dtype, rows: int):
        """At least `rows` CPU work buffers of CPU_CHUNK elements, as one (rows, CPU_CHUNK) array kept between steps."""
        buf = self._work.get(dtype)
        if buf is None or buf.shape[0] < rows:
            buf = self._work[dtype] = backend.xp().empty((rows, CPU_CHUNK), dtype=dtype)
        return buf


# ----------------------------------------------------------------------------------------- schedule

class NoamSchedule:
    """The learning rate of the paper (section 5.3): linear warmup, then decay as 1/sqrt(step).

        lr(k) = factor * d_model^-0.5 * min(k^-0.5, k * warmup^-1.5)

    The two terms meet at k = warmup, where lr peaks at factor / sqrt(d_model * warmup).
    Counts steps from 0: the k-th ``step()`` (k = 1, 2, ...) sets ``optimizer.lr = lr(k)``, so call it
    just before ``optimizer.step()``.
    """

    def __init__(self, optimizer, d_model: int, warmup: int = 4000, factor: float = 1.0):
        if not hasattr(optimizer, "lr"):
            raise ValueError(f"NoamSchedule: optimizer must be an optimiser with an lr attribute, "
                             f"got {type(optimizer).__name__}")
        _check_positive_int("NoamSchedule", "d_model", d_model)
        _check_positive_int("NoamSchedule", "warmup", warmup)
        _check_positive("NoamSchedule", "factor", factor)
        self.optimizer = optimizer
        self.d_model, self.warmup, self.factor = int(d_model), int(warmup), float(factor)
        self.step_num = 0

    def lr_at(self, k: int) -> float:
        """The learning rate of step k (k >= 1)."""
        _check_positive_int("NoamSchedule.lr_at", "k", k)
        return self.factor * self.d_model ** -0.5 * min(k ** -0.5, k * self.warmup ** -1.5)

    def step(self) -> float:
        """Advance one step, set the optimiser's lr and return it."""
        self.step_num += 1
        self.optimizer.lr = self.lr_at(self.step_num)
        return self.optimizer.lr

    def state_dict(self) -> dict:
        return {"step": self.step_num, "d_model": self.d_model, "warmup": self.warmup, "factor": self.factor}

    def load_state_dict(self, state: dict) -> None:
        """Restore the step count (and the hyperparameters); the optimiser's lr is set to that step's."""
        missing = [k for k in ("step", "d_model", "warmup", "factor") if k not in state]
        if missing:
            raise ValueError(f"NoamSchedule.load_state_dict: state must have the keys step, d_model, warmup, "
                             f"factor; missing {missing}")
        self.step_num = int(state["step"])
        self.d_model, self.warmup, self.factor = int(state["d_model"]), int(state["warmup"]), float(state["factor"])
        if self.step_num > 0:
            self.optimizer.lr = self.lr_at(self.step_num)

    def __repr__(self):
        return f"NoamSchedule(d_model={self.d_model}, warmup={self.warmup}, factor={self.factor}, step={self.step_num})"


# ------------------------------------------------------------------------------------------ clipping

def clip_grad_norm(parameters, max_norm: float) -> float:
    """Rescale all gradients together so that their joint L2 norm is at most max_norm; torch's clip_grad_norm_.

        total = sqrt(sum over parameters of sum(grad^2))
        if max_norm / (total + 1e-6) < 1:  every grad *= max_norm / (total + 1e-6)

    Returns ``total``, the norm before clipping, as a Python float (worth logging: spikes show instability).
    The scaling is decided on the device; the returned float is the one host transfer.
    """
    params = _parameter_list("clip_grad_norm", "parameters", parameters)
    _check_positive("clip_grad_norm", "max_norm", max_norm, allow_inf=True)   # inf: measure, never clip
    xp = backend.xp()
    # Speed on a GPU, where each array operation is a kernel launch: the per-parameter squares are summed
    # by one reduction over their stack (not one addition per parameter), and the factor is cast once per
    # dtype (not once per parameter).
    squares = xp.stack([xp.vdot(p.grad.ravel(), p.grad.ravel()) for p in params])  # (P,)  vdot: no g*g temporary
    total = xp.sqrt(squares.sum())                                           # ()
    clip_coef = xp.minimum(max_norm / (total + 1e-6), 1.0)                   # ()  1.0 leaves grads unchanged
    coef = {dtype: clip_coef.astype(dtype) for dtype in {p.grad.dtype for p in params}}
    for p in params:
        p.grad *= coef[p.grad.dtype]                                         # in place
    return float(total)
