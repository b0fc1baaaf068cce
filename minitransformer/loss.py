"""Cross-entropy loss over the vocabulary, with padding ignored and label smoothing (paper, section 5.4).

This is where the backward pass starts: ``loss_fn.backward()`` returns dL/dlogits, which the model's
``backward`` takes from there.
"""

from __future__ import annotations

import numpy

from . import backend


class CrossEntropyLoss:
    """Mean cross-entropy of softmax(logits) against target ids, over the tokens that are not padding.

        p = softmax(logits)                                   (over the last axis, V classes)
        loss_n = (1 - eps) * (-log p[n, t_n]) + eps * mean_v(-log p[n, v])
        loss = sum over kept n of loss_n / (number of kept n)        kept: t_n != ignore_index

    With eps = 0 this is plain cross-entropy; with eps > 0 the target is the "smoothed" distribution
    (1 - eps) * one_hot(t) + eps / V, exactly as ``torch.nn.functional.cross_entropy(logits, target,
    ignore_index=..., label_smoothing=eps)`` computes it (for >2-D input torch wants the classes on axis 1,
    here they are on the last axis: compare with torch on ``logits.reshape(-1, V)``).

    The gradient, written out (no Jacobian, no one-hot matrix):

        dL/dlogits[n, v] = (p[n, v] - (1 - eps) * 1[v = t_n] - eps / V) / count    for kept rows
                         = 0                                                    for ignored rows

    Shapes: logits (..., V) float, target (...) int  ->  a Python float.   backward() -> (..., V).
    Usually (B,T,V) and (B,T), or (N,V) and (N,).

    Cache: the probabilities p (N,V), the target ids and the keep mask (N,). backward turns p into the
    gradient in place and releases it, so one forward pays for one (N,V) buffer in all; a second
    backward needs a new forward.

    If every token is ignored there is nothing to average: the loss is 0.0 and the gradient is zero.
    (torch returns nan there, 0/0; a batch of pure padding should not poison a training run.)

    ``num_tokens`` holds the number of kept tokens of the last forward (for token-weighted averages).
    """

    def __init__(self, ignore_index: int = 0, label_smoothing: float = 0.0):
        if isinstance(ignore_index, bool) or not isinstance(ignore_index, (int, numpy.integer)):
            raise TypeError(f"CrossEntropyLoss: ignore_index must be an int (the padding id), got {ignore_index!r}")
        if (isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float, numpy.floating))
                or not 0.0 <= label_smoothing < 1.0):
            raise ValueError(f"CrossEntropyLoss: label_smoothing must be a float in [0, 1), got {label_smoothing!r}")
        self.ignore_index = int(ignore_index)
        self.label_smoothing = float(label_smoothing)
        self.num_tokens = 0
        self._probs = None     # (N,V) softmax of the last forward; becomes dlogits in backward
        self._target = None    # (N,) target ids, ignored ones replaced by 0 so that they index safely
        self._keep = None      # (N,) bool, False where the target is ignore_index
        self._shape = None     # the logits' shape, to give the gradient the same one

    def __call__(self, logits, target) -> float:
        return self.forward(logits, target)

    def __repr__(self):
        return f"CrossEntropyLoss(ignore_index={self.ignore_index}, label_smoothing={self.label_smoothing})"

    # ------------------------------------------------------------------------------------------ forward
    def forward(self, logits, target) -> float:
        xp = backend.xp()
        self._probs = None  # free the last batch's (N,V) buffer before this batch allocates its own
        logits, target = self._check(logits, target)
        V = logits.shape[-1]
        eps = self.label_smoothing

        x = logits.reshape(-1, V)                                   # (N,V)  a view when logits are contiguous
        t = target.reshape(-1).astype(xp.int64, copy=False)         # (N,)   int64: comparisons with any ignore_index
        N = x.shape[0]
        keep = t != self.ignore_index                               # (N,)   bool
        valid = (t >= 0) & (t < V)                                  # (N,)   bool
        n_bad = (keep & ~valid).sum()                               # ()     checked after the one host sync below
        t_safe = xp.where(keep & valid, t, 0)                       # (N,)   any valid index will do on ignored rows
        rows = xp.arange(N)                                         # (N,)

        # Stable log-softmax: log p = z - log(sum_v exp(z)) with z = x - max(x). Every z <= 0, so exp(z)
        # cannot overflow, and the largest term is exp(0) = 1, so the sum is >= 1 and its log is finite.
        # z is the ONE V-wide array this forward creates: everything else is a per-row (N,) vector.
        # It stays in the logits' dtype (float32 in training): half the memory traffic of float64,
        # and the per-row sums over V use NumPy's/CuPy's pairwise summation, accurate to ~1e-7 relative.
        z = x - x.max(axis=-1, keepdims=True)                       # (N,V)
        z_t = z[rows, t_safe]                                       # (N,)   picked by index: no one-hot matrix
        if eps > 0:
            z_mean = z.mean(axis=-1)                                # (N,)   for mean_v(-log p) = log_Z - mean_v(z)
        xp.exp(z, out=z)                                            # (N,V)  in place: z is ours, now exp(z)
        sum_exp = z.sum(axis=-1)                                    # (N,)
        z /= sum_exp[:, None]                                       # (N,V)  in place: the probabilities p
        log_Z = xp.log(sum_exp)                                     # (N,)
        loss_n = log_Z - z_t                                        # (N,)   -log p[t] = log_Z - z_t
        if eps > 0:
            loss_n = (1.0 - eps) * loss_n + eps * (log_Z - z_mean)  # (N,)
        loss_sum = xp.where(keep, loss_n, 0).sum()                  # ()     ignored rows leave the sum ...
        count = keep.sum()                                          # ()     ... and the count

        # The one device -> host transfer of the call (it waits for the GPU): the loss, the count and the
        # number of out-of-range targets travel together as three numbers.
        packed = xp.stack([loss_sum.astype(xp.float64), count.astype(xp.float64), n_bad.astype(xp.float64)])
        loss_sum, count, n_bad = (float(v) for v in backend.to_numpy(packed))
        if n_bad:
            self._raise_bad_target(t, keep & ~valid, V)

        self.num_tokens = int(count)
        self._probs, self._target, self._keep, self._shape = z, t_safe, keep, logits.shape
        return loss_sum / count if count else 0.0

    # ----------------------------------------------------------------------------------------- backward
    def backward(self):
        """dL/dlogits, of the logits' shape: (p - (1 - eps) * one_hot(t) - eps / V) / count, zero on ignored rows."""
        if self._probs is None:
            raise RuntimeError("CrossEntropyLoss.backward: call forward first (each forward allows one backward)")
        xp = backend.xp()
        dx, self._probs = self._probs, None                         # (N,V)  p becomes the gradient, in place
        N, V = dx.shape
        eps = self.label_smoothing
        if eps > 0:
            dx -= eps / V                                           # (N,V)  the smoothed target's uniform part
        dx[xp.arange(N), self._target] -= 1.0 - eps                 # (N,V)  its one-hot part, by index
        # One factor per row: 1/count on kept rows, 0 on ignored ones (this also clears the -(1-eps)
        # written at the placeholder index 0 of ignored rows). Made in the gradient's dtype so that the
        # in-place multiply stays float32 when the logits are.
        row_scale = self._keep.astype(dx.dtype) * (1.0 / max(self.num_tokens, 1))  # (N,)
        dx *= row_scale[:, None]                                    # (N,V)
        shape = self._shape
        self._target = self._keep = self._shape = None
        return dx.reshape(shape)                                    # (..., V)

    # ------------------------------------------------------------------------------------------- checks
    @staticmethod
    def _check(logits, target):
        xp = backend.xp()
        if not hasattr(logits, "dtype") or not hasattr(logits, "shape"):
            raise ValueError(f"CrossEntropyLoss: logits must be a float array of shape (..., V), "
                             f"got {type(logits).__name__}")
        logits = xp.asarray(logits)
        if logits.dtype.kind != "f":
            raise ValueError(f"CrossEntropyLoss: logits must be a float array, got dtype {logits.dtype}")
        if logits.ndim < 1 or logits.shape[-1] < 1:
            raise ValueError(f"CrossEntropyLoss: logits must have shape (..., V) with V >= 1, "
                             f"got shape {tuple(logits.shape)}")
        target = xp.asarray(target)
        if target.dtype.kind not in "iu":
            raise ValueError(f"CrossEntropyLoss: target must hold integer class ids, got dtype {target.dtype}")
        if tuple(target.shape) != tuple(logits.shape[:-1]):
            raise ValueError(f"CrossEntropyLoss: target must have shape {tuple(logits.shape[:-1])} "
                             f"(the logits' shape {tuple(logits.shape)} without the class axis), "
                             f"got {tuple(target.shape)}")
        return logits, target

    def _raise_bad_target(self, t, bad, V):
        # Error path only, so a second host transfer is fine here.
        positions = numpy.flatnonzero(backend.to_numpy(bad))
        values = backend.to_numpy(t)[positions]
        raise ValueError(f"CrossEntropyLoss: target must hold class ids in [0, {V}) or ignore_index="
                         f"{self.ignore_index}, got {len(positions)} other value(s), e.g. {int(values[0])} "
                         f"at flat position {int(positions[0])}")
