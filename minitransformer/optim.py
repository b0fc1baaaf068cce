"""Adam and the learning-rate schedule of the paper (section 5.3), NoamSchedule; and SGD and clip_grad_norm,
which the paper does not use.

An optimiser holds the list of Parameters and, for each, the state its update rule needs (Adam's two
moving averages, SGD's momentum buffer): layers never carry optimiser state. ``step()`` reads every
``p.grad`` and changes ``p.data`` in place. One training step:

    loss = loss_fn(model(src, tgt_in), tgt_out)
    model.backward(loss_fn.backward())
    clip_grad_norm(model.parameters(), max_norm=1.0)    # optional
    sched.step(); opt.step(); opt.zero_grad()

``state_dict()`` gives plain data, host NumPy arrays and Python numbers under string keys
({"step": 3, "lr": 1e-3, "m.0": array, ...}), so a checkpoint is an ``.npz`` file with no pickle.
"""

from __future__ import annotations

from . import backend, checks


class Optimizer:
    """Base class: the parameter list, the learning rate, the step count and the per-parameter state arrays
    ``state[name][i]`` for each name in ``state_names`` (e.g. ("m", "v")), allocated once."""

    state_names: tuple = ()
    hyper_names: tuple = ()       # scalar hyperparameters, shown by repr

    def __init__(self, params, lr: float):
        owner = type(self).__name__
        self.params = checks.parameter_list(owner, "params", params)
        self.lr = checks.positive_number(owner, "lr", lr)
        self.step_count = 0       # number of step() calls so far (Adam's t)
        self.state = {}           # {state name: [one array per parameter, same shape and dtype as p.data]}

    def allocate_state(self) -> None:
        self.state = {name: [backend.xp().zeros_like(p.data) for p in self.params] for name in self.state_names}

    def zero_grad(self) -> None:
        """Set every gradient to zero (backward adds into .grad, so this starts the next sum)."""
        for p in self.params:
            p.grad.fill(0)

    def step(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} must define step")

    def state_dict(self) -> dict:
        """{"step": int, "lr": float, "<state>.<i>": host array, ...}: plain data, ready for ``numpy.savez``.
        Hyperparameters (betas, eps, ...) are constructor arguments: they come back with the configuration."""
        out = {"step": self.step_count, "lr": self.lr}
        for name, arrays in self.state.items():
            for i, a in enumerate(arrays):
                out[f"{name}.{i}"] = backend.to_numpy(a).copy()   # a copy: the state keeps changing
        return out

    def load_state_dict(self, state: dict) -> None:
        """Restore what ``state_dict`` gave (also after ``numpy.savez``/``numpy.load``, where the numbers come
        back as 0-d arrays). Arrays are copied into the existing buffers; a state that does not fit raises."""
        owner = type(self).__name__
        if not isinstance(state, dict):
            raise TypeError(f"{owner}.load_state_dict: state must be a dict, as state_dict() gives, "
                            f"got {type(state).__name__}")
        needed = ["step", "lr"] + [f"{name}.{i}" for name in self.state_names for i in range(len(self.params))]
        missing, unexpected = [k for k in needed if k not in state], [k for k in state if k not in needed]
        if missing or unexpected:
            raise ValueError(f"{owner}.load_state_dict: state must have exactly the keys {needed[:6]}"
                             f"{'...' if len(needed) > 6 else ''} (this optimiser, {len(self.params)} parameters); "
                             f"missing {missing[:6]}, unexpected {unexpected[:6]}")
        where = f"{owner}.load_state_dict"                     # every entry is checked before anything changes
        shapes = {f"{name}.{i}": p.data.shape for name in self.state_names for i, p in enumerate(self.params)}
        arrays = {key: checks.weights(where, key, state[key], shape) for key, shape in shapes.items()}
        step = checks.integer(where, "step", checks.number(where, "step", state["step"]))
        lr = checks.positive_number(where, "lr", checks.number(where, "lr", state["lr"]))
        self.step_count, self.lr = step, lr
        for name in self.state_names:
            for i, a in enumerate(self.state[name]):
                a[...] = backend.asarray(arrays[f"{name}.{i}"], dtype=a.dtype)

    def __repr__(self):
        hyper = ", ".join(f"{name}={getattr(self, name)}" for name in ("lr", *self.hyper_names))
        return f"{type(self).__name__}({len(self.params)} parameters, {hyper}, step={self.step_count})"


class SGD(Optimizer):
    """Stochastic gradient descent, with optional momentum and L2 weight decay; the update of torch.optim.SGD.

        g = grad + weight_decay * p
        b = momentum * b + g                  (b starts at 0, so the first b is g, as in torch)
        p = p - lr * b                        (p = p - lr * g without momentum)

    State: the momentum buffer b, one per parameter (only when momentum > 0).
    """

    hyper_names = ("momentum", "weight_decay")

    def __init__(self, params, lr: float, momentum: float = 0.0, weight_decay: float = 0.0):
        super().__init__(params, lr)
        self.momentum = checks.fraction("SGD", "momentum", momentum)
        self.weight_decay = checks.non_negative("SGD", "weight_decay", weight_decay)
        self.state_names = ("momentum_buffer",) if self.momentum > 0 else ()
        self.allocate_state()

    def step(self) -> None:
        self.step_count += 1
        for i, p in enumerate(self.params):
            g = p.grad + self.weight_decay * p.data             # L2: the gradient of wd/2 * |p|^2
            if self.momentum:
                b = self.state["momentum_buffer"][i]
                b[...] = self.momentum * b + g
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

    State: m and v, one each per parameter; t = step_count is shared by all parameters.
    """

    state_names = ("m", "v")
    hyper_names = ("beta1", "beta2", "eps", "weight_decay")

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.98), eps: float = 1e-9, weight_decay: float = 0.0):
        super().__init__(params, lr)
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"Adam: betas must be a pair (beta1, beta2) of numbers in [0, 1), got {betas!r}")
        self.beta1 = checks.fraction("Adam", "betas[0]", betas[0])
        self.beta2 = checks.fraction("Adam", "betas[1]", betas[1])
        self.eps = checks.non_negative("Adam", "eps", eps)
        self.weight_decay = checks.non_negative("Adam", "weight_decay", weight_decay)
        self.allocate_state()

    @property
    def betas(self) -> tuple:
        return (self.beta1, self.beta2)

    def step(self) -> None:
        xp = backend.xp()
        self.step_count += 1
        t = self.step_count
        for p, m, v in zip(self.params, self.state["m"], self.state["v"]):
            g = p.grad + self.weight_decay * p.data
            m[...] = self.beta1 * m + (1 - self.beta1) * g
            v[...] = self.beta2 * v + (1 - self.beta2) * g * g
            m_hat = m / (1 - self.beta1 ** t)
            v_hat = v / (1 - self.beta2 ** t)
            p.data -= self.lr * m_hat / (xp.sqrt(v_hat) + self.eps)   # in place: the only write to the weights


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
        self.optimizer = optimizer
        self.d_model = checks.positive_int("NoamSchedule", "d_model", d_model)
        self.warmup = checks.positive_int("NoamSchedule", "warmup", warmup)
        self.factor = checks.positive_number("NoamSchedule", "factor", factor)
        self.step_num = 0

    def lr_at(self, k: int) -> float:
        """The learning rate of step k (k >= 1)."""
        k = checks.positive_int("NoamSchedule.lr_at", "k", k)
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


def clip_grad_norm(parameters, max_norm: float) -> float:
    """Rescale all gradients together so that their joint L2 norm is at most max_norm; torch's clip_grad_norm_.

        total = sqrt(sum over parameters of sum(grad^2))
        if max_norm / (total + 1e-6) < 1:  every grad *= max_norm / (total + 1e-6)

    Returns ``total``, the norm before clipping, as a Python float (worth logging: spikes show instability).
    max_norm=inf measures without clipping.
    """
    params = checks.parameter_list("clip_grad_norm", "parameters", parameters)
    max_norm = checks.positive_number("clip_grad_norm", "max_norm", max_norm, allow_inf=True)
    total = float(backend.xp().sqrt(sum((p.grad * p.grad).sum() for p in params)))   # one copy to the host
    clip_coef = min(max_norm / (total + 1e-6), 1.0)             # 1.0 leaves grads unchanged
    for p in params:
        p.grad *= p.grad.dtype.type(clip_coef)                  # in place
    return total
