"""Data parallelism: one training step's batch split across worker threads, one model replica each.

NumPy releases Python's GIL inside every matrix product and ufunc, so threads that run different sentences
through the same weights keep several cores busy; everything in between (a step is hundreds of small
operations) overlaps too, except the Python bookkeeping itself, which one thread at a time runs.
"""

from __future__ import annotations

import copy
import itertools

import numpy

from .. import backend, budget, checks
from ..module import Module
from .optim import CPU_CHUNK
from .threads import get_num_threads, parallel_map


# Far beyond any machine's cores; a count past it is a typo, refused before a replica is made.
MAX_WORKERS = 1024


class DataParallel:
    """The forward and backward of a training step on B sentences, split across ``workers`` model replicas
    that run at once, with the same loss and gradients as the one model on the whole batch.

        parallel = DataParallel(model, loss_fn, workers=2)
        loss = parallel.forward(src, tgt_in, tgt_out)   # == loss_fn(model(src, tgt_in), tgt_out)
        parallel.backward()                             # == model.backward(loss_fn.backward()): model's .grad

    Replica k runs sentences [c_k, c_k+1) of the batch (contiguous parts with about equal numbers of real
    tokens; fewer parts when B < workers). Replica 0 is ``model`` itself; the others are copies whose
    Parameters share ``model``'s weight arrays (no copies of weights: the optimiser's in-place update is
    seen by all) but have a .grad of their own, which ``backward`` adds into ``model``'s .grad and clears.
    Each part drops the columns that hold only padding in its rows: they change nothing but the work.

    The loss is a mean over the batch's n non-pad target tokens. Part k's loss_fn gives the mean over its
    own n_k tokens and the gradient of that mean, so the whole batch's loss is sum_k loss_k n_k / n and its
    gradient is part k's scaled by n_k / n (backward is linear in dlogits): the whole-batch step, up to the
    rounding of sums taken in another order (~1e-16 relative in float64).

    Dropout: each step draws one seed from ``backend.device_rng()``, and part k draws its masks from a
    generator seeded with (seed, k) (``backend.thread_device_rng``). A run is reproducible, and resumes
    exactly, for a given number of workers; another number of workers draws other (equally random) masks.

    Threads: the parts run on ``parallel_map``'s pool (at most ``get_num_threads()`` at once). Each part's
    matrix products should use one BLAS thread (``threads.set_blas_threads(1)``): the workers already keep
    the cores busy, and more BLAS threads than cores wait for each other. Off the CPU (CuPy) the parts run
    one after another, drawing from the backend's generator in turn: the same step, no gain.
    """

    def __init__(self, model, loss_fn, workers: int = 2):
        self.workers = checks.int_in("DataParallel", "workers", workers, 1, MAX_WORKERS)
        if not isinstance(model, Module):
            raise TypeError(f"DataParallel: model must be a Module (forward(src, tgt_in) -> logits), "
                            f"got {type(model).__name__}")
        if not all(callable(getattr(loss_fn, name, None)) for name in ("forward", "backward")) or \
                not hasattr(loss_fn, "ignore_index"):
            raise TypeError(f"DataParallel: loss_fn must be a CrossEntropyLoss (forward, backward, ignore_index), "
                            f"got {type(loss_fn).__name__}")
        grads = sum(int(p.data.nbytes) for p in model.parameters())        # each extra replica has its own
        budget.check("DataParallel", {"the replicas' gradients": (self.workers - 1) * grads},
                     f"{self.workers} model replicas")
        self.model, self.loss_fn = model, loss_fn
        self.replicas = [model] + [self._replicate(model) for _ in range(self.workers - 1)]
        self.params = model.parameters()
        self.replica_params = [r.parameters() for r in self.replicas[1:]]   # in the order of self.params
        self.num_tokens = 0                # the non-pad target tokens of the last forward's batch
        self._parts = None                 # what the last forward left for backward: [(replica, loss_fn, n_k / n)]

    @staticmethod
    def _replicate(model):
        """A copy of model whose Parameters share model's weight arrays, with zeroed grads of their own."""
        memo = {id(p.data): p.data for p in model.parameters()}           # deepcopy hands these back as they are
        memo.update({id(m._cache): None for m in model.modules() if m._cache is not None})  # no activations
        replica = copy.deepcopy(model, memo)
        replica.zero_grad()
        return replica

    def __repr__(self):
        return f"DataParallel({type(self.model).__name__}, workers={self.workers})"

    # ------------------------------------------------------------------------------------- the step
    def forward(self, src, tgt_in, tgt_out) -> float:
        """The loss of the batch (mean over its non-pad target tokens), each part on its own replica.
        src (B,S), tgt_in (B,T), tgt_out (B,T) int ids -> a float; backward() must follow in training mode."""
        self._parts = None
        src, tgt_in, tgt_out = self._check_batch(src, tgt_in, tgt_out)
        pad = self.loss_fn.ignore_index
        bounds = split_points((src != pad).sum(axis=1) + (tgt_out != pad).sum(axis=1), self.workers)
        parts = [trim_padding(src[a:b], tgt_in[a:b], tgt_out[a:b], pad) for a, b in itertools.pairwise(bounds)]
        self._sync_replicas()
        on_cpu = backend.xp() is numpy
        seed = int(backend.device_rng().integers(0, 2 ** 63)) if on_cpu else None

        def forward_part(k):
            model, loss_fn = self.replicas[k], copy.copy(self.loss_fn)
            src_k, tgt_in_k, tgt_out_k = parts[k]
            rng = numpy.random.default_rng([seed, k]) if on_cpu else backend.device_rng()
            with backend.thread_device_rng(rng):
                loss = loss_fn(model(src_k, tgt_in_k), tgt_out_k)
            return model, loss_fn, loss, loss_fn.num_tokens

        try:
            results = parallel_map(forward_part, range(len(parts)))   # one after another off the CPU
        except BaseException:
            for replica in self.replicas:                      # no part waits for a backward that never comes
                replica.clear_caches()
            raise
        self.num_tokens = total = sum(n for *_, n in results)
        self._parts = [(model, loss_fn, n / max(total, 1)) for model, loss_fn, _, n in results]
        return sum(loss * n for _, _, loss, n in results) / max(total, 1)

    def backward(self) -> None:
        """Every part's backward, then the replicas' gradients added into model's .grad (+=, as backward does)."""
        if self._parts is None:
            raise RuntimeError("DataParallel.backward: call forward first (each forward allows one backward)")
        parts, self._parts = self._parts, None

        def backward_part(part):
            model, loss_fn, share = part
            dlogits = loss_fn.backward()                       # d(mean over the part's tokens)/dlogits, fresh
            dlogits *= dlogits.dtype.type(share)               # d(mean over the batch's tokens)/dlogits
            model.backward(dlogits)

        try:
            parallel_map(backward_part, parts)
            self._reduce_grads(len(parts) - 1)
        except BaseException:
            for params in self.replica_params:                 # the next step starts from zero again
                for p in params:
                    p.zero_grad()
            raise

    # ------------------------------------------------------------------------------------- helpers
    def _check_batch(self, src, tgt_in, tgt_out) -> tuple:
        arrays = []
        for name, ids in (("src", src), ("tgt_in", tgt_in), ("tgt_out", tgt_out)):
            ids = numpy.asarray(backend.to_numpy(ids))
            if ids.ndim != 2 or ids.dtype.kind not in "iu":
                raise ValueError(f"DataParallel.forward: {name} must be a 2-D integer array (B, length) of token "
                                 f"ids, got {ids.dtype} of shape {ids.shape}")
            arrays.append(ids)
        src, tgt_in, tgt_out = arrays
        if tgt_in.shape != tgt_out.shape or src.shape[0] != tgt_in.shape[0]:
            raise ValueError(f"DataParallel.forward: src (B,S), tgt_in (B,T) and tgt_out (B,T) must agree, got "
                             f"{src.shape}, {tgt_in.shape} and {tgt_out.shape}")
        if src.shape[0] == 0:
            raise ValueError("DataParallel.forward: the batch must hold at least one sentence, got B = 0")
        return src, tgt_in, tgt_out

    def _sync_replicas(self) -> None:
        """Each replica in model's mode, without activations, reading model's current weight arrays (the same
        arrays unless someone replaced one: then the replicas follow)."""
        for replica, params in zip(self.replicas[1:], self.replica_params):
            replica.train(self.model.training)                 # also forgets any cache a failed step left
            for p, rp in zip(self.params, params):
                rp.data = p.data

    def _reduce_grads(self, used: int) -> None:
        """model.grad += the grads of replicas 1..used, which are cleared for the next step. In slices of
        CPU_CHUNK elements shared among the threads, as Adam's update, each cleared while it is in the cache."""
        if used == 0:
            return
        replica_params = self.replica_params[:used]
        slices = []
        for i, p in enumerate(self.params):
            grads = [p.grad] + [params[i].grad for params in replica_params]
            if not all(g.flags.c_contiguous for g in grads):  # whole: reshape(-1) would copy, not view
                slices.append(grads)
                continue
            flats = [g.reshape(-1) for g in grads]             # (n,) views
            slices += [[f[start:start + CPU_CHUNK] for f in flats] for start in range(0, p.grad.size, CPU_CHUNK)]
        threads = min(get_num_threads(), len(slices))

        def reduce_share(k):
            for total, *others in slices[k::threads]:
                for g in others:
                    total += g
                    g.fill(0)

        parallel_map(reduce_share, range(threads))


def split_points(costs, parts: int) -> list:
    """[0, c_1, ..., B]: the bounds of at most `parts` contiguous, non-empty runs of the B items whose summed
    costs come as close to equal as whole items allow."""
    cum = numpy.cumsum(costs)                                  # (B,)
    bounds = [0]
    for k in range(1, parts):
        goal = cum[-1] * k / parts
        i = int(numpy.searchsorted(cum, goal))                 # the first item whose end reaches the goal
        end = i + 1 if i < len(cum) and cum[i] - goal <= goal - (cum[i - 1] if i > 0 else 0) else i
        if bounds[-1] < end < len(cum):
            bounds.append(end)
    return bounds + [len(cum)]


def trim_padding(src, tgt_in, tgt_out, pad_id: int) -> tuple:
    """The batch without its trailing columns of padding only (in tgt_in and tgt_out alike, for the target):
    the same sentences, with no position anyone reads removed."""
    def width(*grids):
        used = numpy.flatnonzero(numpy.any([(g != pad_id).any(axis=0) for g in grids], axis=0))
        return int(used[-1]) + 1 if len(used) else 1          # one column at least: an empty grid has no shape
    S, T = width(src), width(tgt_in, tgt_out)
    return src[:, :S], tgt_in[:, :T], tgt_out[:, :T]
