"""The fast Adam: the core's update rule, operation for operation, written for speed."""

from __future__ import annotations

import math

from .. import backend
from .. import optim as core
from .threads import get_num_threads, parallel_map

# Adam's update on the CPU runs over slices of this many elements, small enough for its arrays to stay
# in the cache between its passes.
CPU_CHUNK = 1 << 16


class Adam(core.Adam):
    """``mt.optim.Adam`` with the same state and state_dict, and the update written in place into work buffers
    reused at every step (no temporary arrays per parameter per step).

    On the CPU the update runs over slices of CPU_CHUNK elements, so that its dozen passes stay in the
    cache instead of streaming whole arrays (the embeddings are tens of MB) from memory a dozen times, and
    the slices are shared out among the CPU threads (they are independent; see ``parallel_map``).
    On a GPU every array operation is a kernel launch, which costs microseconds of host time whatever the
    array's size: more than the arithmetic of most parameters. So m and v of all the parameters of one dtype
    are ONE flat array each (``state`` holds per-parameter views of them), the gradients are gathered into
    one flat buffer, and the formulas run once over the flat arrays.
    """

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.98), eps: float = 1e-9, weight_decay: float = 0.0):
        super().__init__(params, lr, betas, eps, weight_decay)
        self.on_cpu = backend.get_backend() == "numpy"
        self.work = {}                                         # CPU: dtype -> (threads, CPU_CHUNK) buffers
        self.flat = [] if self.on_cpu else self.allocate_flat_state()

    def allocate_flat_state(self) -> list:
        """Per dtype: flat m and v (of which self.state holds per-parameter views), a flat gradient buffer and
        a flat work buffer, each as long as all the parameters of that dtype together."""
        xp, flat, by_dtype = backend.xp(), [], {}
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
            flat.append((indices, spans, m, v, g, work))
        return flat

    def step(self) -> None:
        xp = backend.xp()
        self.step_count += 1
        t = self.step_count
        beta1, beta2 = self.beta1, self.beta2
        step_size = self.lr / (1.0 - beta1 ** t)                # lr / bias_correction1
        sqrt_bias_correction2 = math.sqrt(1.0 - beta2 ** t)

        def adam_step(g, m, v, work):
            # The core's formulas, each written in place into m, v or the work buffer (all of one shape).
            # Returns the step lr m_hat / (sqrt(v_hat) + eps), in `work`, for the caller to subtract.
            m *= beta1
            m += xp.multiply(g, 1.0 - beta1, out=work)          # m = beta1 m + (1 - beta1) g
            v *= beta2
            g2 = xp.multiply(g, g, out=work)
            g2 *= 1.0 - beta2
            v += g2                                             # v = beta2 v + (1 - beta2) g^2
            denom = xp.sqrt(v, out=work)
            denom /= sqrt_bias_correction2                      # sqrt(v_hat)
            denom += self.eps
            step = xp.divide(m, denom, out=work)                # m / (sqrt(v_hat) + eps)
            step *= step_size
            return step

        if not self.on_cpu:                                     # a GPU: the flat arrays
            for indices, spans, m, v, g, work in self.flat:
                xp.concatenate([self.params[i].grad.reshape(-1) for i in indices], out=g)    # (total,) every grad
                if self.weight_decay:                           # g + weight_decay * p, p.grad untouched
                    xp.concatenate([self.params[i].data.reshape(-1) for i in indices], out=work)
                    work *= self.weight_decay
                    g += work
                step = adam_step(g, m, v, work)                 # (total,)
                for i, span in zip(indices, spans):
                    p = self.params[i].data
                    p -= step[span].reshape(p.shape)
            return

        slices = []                                             # (p, g, m, v) slices of CPU_CHUNK elements
        for i, p in enumerate(self.params):
            m, v = self.state["m"][i], self.state["v"][i]
            g = p.grad + self.weight_decay * p.data if self.weight_decay else p.grad   # p.grad stays as it was
            arrays, n = (p.data, g, m, v), p.data.size
            if all(a.flags.c_contiguous for a in arrays):
                flat = [a.reshape(-1) for a in arrays]          # (n,) views
                slices += [tuple(a[start:start + CPU_CHUNK] for a in flat) for start in range(0, n, CPU_CHUNK)]
            else:                                               # a non-contiguous parameter: whole, own buffer
                p.data -= adam_step(g, m, v, xp.empty_like(p.data))
        if not slices:
            return
        # Thread k updates slices k, k + threads, k + 2 threads, ... with its own row of the work buffers.
        threads = min(get_num_threads(), len(slices))
        work = {dtype: self.work_buffers(dtype, threads) for dtype in {s[0].dtype for s in slices}}

        def update_share(k):
            for p, g, m, v in slices[k::threads]:
                p -= adam_step(g, m, v, work[p.dtype][k, :p.size])

        parallel_map(update_share, range(threads))

    def work_buffers(self, dtype, rows: int):
        """At least `rows` CPU work buffers of CPU_CHUNK elements, as one (rows, CPU_CHUNK) array kept between steps."""
        buf = self.work.get(dtype)
        if buf is None or buf.shape[0] < rows:
            buf = self.work[dtype] = backend.xp().empty((rows, CPU_CHUNK), dtype=dtype)
        return buf
