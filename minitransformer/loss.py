"""Cross-entropy loss over the vocabulary, with padding ignored and label smoothing (paper, section 5.4).

This is where the backward pass starts: ``loss_fn.backward()`` returns dL/dlogits, which the model's
``backward`` takes from there.
"""

from __future__ import annotations

import numpy

from . import backend, checks


class CrossEntropyLoss:
    """Mean cross-entropy of softmax(logits) against target ids, over the tokens that are not padding.

        log p = log_softmax(logits)                           (over the last axis, V classes)
        loss_n = (1 - eps) * (-log p[n, t_n]) + eps * mean_v(-log p[n, v])
        loss = sum over kept n of loss_n / (number of kept n)        kept: t_n != ignore_index

    With eps > 0 the target is the "smoothed" distribution (1 - eps) * one_hot(t) + eps / V, exactly as
    ``torch.nn.functional.cross_entropy(logits, target, ignore_index=..., label_smoothing=eps)`` computes
    it (torch wants the classes on axis 1 for >2-D input; here they are on the last axis).
    The gradient, written out (no Jacobian, no one-hot matrix):

        dL/dlogits[n, v] = (p[n, v] - (1 - eps) * 1[v = t_n] - eps / V) / count    for kept rows, 0 for the others

    Shapes: logits (..., V) float, target (...) int -> a Python float.   backward() -> (..., V).
    Cache: the probabilities p (N,V), the target ids and the keep mask (N,).
    If every token is ignored the loss is 0.0 and the gradient zero (torch gives nan, 0/0: a batch of pure
    padding should not poison a training run). ``num_tokens``: the kept tokens of the last forward.
    """

    def __init__(self, ignore_index: int = 0, label_smoothing: float = 0.0):
        self.ignore_index = checks.integer("CrossEntropyLoss", "ignore_index", ignore_index)
        self.label_smoothing = checks.fraction("CrossEntropyLoss", "label_smoothing", label_smoothing)
        self.num_tokens = 0
        self.cache = None

    def __call__(self, logits, target) -> float:
        return self.forward(logits, target)

    def __repr__(self):
        return f"CrossEntropyLoss(ignore_index={self.ignore_index}, label_smoothing={self.label_smoothing})"

    def forward(self, logits, target) -> float:
        xp = backend.xp()
        logits, target = self.check_inputs(logits, target)
        V, eps = logits.shape[-1], self.label_smoothing
        x = logits.reshape(-1, V)                              # (N,V)
        t = target.reshape(-1)                                 # (N,)
        keep = t != self.ignore_index                          # (N,) bool: padding leaves the sum and the count
        t = xp.where(keep, t, 0)                               # (N,) ignored rows pick any valid class
        # Stable log-softmax: log p = z - log(sum_v exp(z)) with z = x - max(x), every z <= 0.
        z = x - x.max(axis=-1, keepdims=True)                  # (N,V)
        log_p = z - xp.log(xp.exp(z).sum(axis=-1, keepdims=True))   # (N,V)
        nll = -log_p[xp.arange(len(t)), t]                     # -log p[n, t_n], picked by index   (N,)
        smooth = -log_p.mean(axis=-1)                          # mean_v(-log p[n, v])             (N,)
        loss_n = (1.0 - eps) * nll + eps * smooth              # (N,)
        count = int(keep.sum())
        loss = float((loss_n * keep).sum()) / max(count, 1)
        self.num_tokens = count
        self.cache = (xp.exp(log_p), t, keep, logits.shape)
        return loss

    def backward(self):
        """dL/dlogits, of the logits' shape: (p - (1 - eps) * one_hot(t) - eps / V) / count, 0 on ignored rows."""
        if self.cache is None:
            raise RuntimeError("CrossEntropyLoss.backward: call forward first (each forward allows one backward)")
        (p, t, keep, shape), self.cache = self.cache, None
        N, V = p.shape
        eps = self.label_smoothing
        target = backend.xp().zeros_like(p)                    # the smoothed target distribution   (N,V)
        target += eps / V
        target[backend.xp().arange(N), t] += 1.0 - eps
        dlogits = (p - target) * keep[:, None] / max(self.num_tokens, 1)   # (N,V)
        return dlogits.reshape(shape)                          # (..., V)

    def check_inputs(self, logits, target):
        """The logits (..., V) float and target (...) int, as arrays of the active backend; refuses target
        ids outside [0, V) that are not ignore_index."""
        xp = backend.xp()
        checks.float_array("CrossEntropyLoss", "logits", logits)
        if logits.ndim < 1 or logits.shape[-1] < 1:
            raise ValueError(f"CrossEntropyLoss: logits must have shape (..., V) with V >= 1, got {tuple(logits.shape)}")
        target = xp.asarray(target)
        if target.dtype.kind not in "iu":
            raise ValueError(f"CrossEntropyLoss: target must hold integer class ids, got dtype {target.dtype}")
        if tuple(target.shape) != tuple(logits.shape[:-1]):
            raise ValueError(f"CrossEntropyLoss: target must have shape {tuple(logits.shape[:-1])} (the logits' shape "
                             f"{tuple(logits.shape)} without the class axis), got {tuple(target.shape)}")
        bad = (target != self.ignore_index) & ((target < 0) | (target >= logits.shape[-1]))
        if bad.any():
            where = numpy.flatnonzero(backend.to_numpy(bad))
            raise ValueError(f"CrossEntropyLoss: target must hold class ids in [0, {logits.shape[-1]}) or ignore_index="
                             f"{self.ignore_index}, got {len(where)} other value(s), e.g. "
                             f"{int(backend.to_numpy(target).reshape(-1)[where[0]])} at flat position {int(where[0])}")
        return xp.asarray(logits), target
