"""The training loop: batches in, loss down, checkpoints out, and a run that can be killed and resumed.

One training step, nothing hidden:

    logits = model(src, tgt_in)                 forward, caches what backward needs      (B,T,V)
    loss = loss_fn(logits, tgt_out)             mean over the non-pad target tokens
    model.backward(loss_fn.backward())          every Parameter.grad filled (+=)
                                                (with ``parallel``: the same two lines, the batch split
                                                across worker threads, see ``fast.DataParallel``)
    clip_grad_norm(params, clip_norm)           optional; the norm is also the non-finite check
    scheduler.step(); optimizer.step()          lr for this step, then the update

Exact resume. A run killed at any moment (SIGKILL, a laptop lid) and resumed from its last checkpoint
computes the same steps, to the bit on the CPU, as the run that was never stopped (so a run that stops
after a number of steps or epochs ends with the same weights; a time limit counts from each ``fit``).
That needs every input of every later step to be restored exactly:
- the weights and the optimiser's moments (saved as raw arrays), its step count and the schedule's;
- the data order: batch i of epoch e is a fixed function of (seed, e) (``BucketBatcher``, ``TaskBatches``),
  and the checkpoint stores (epoch, position), so the resumed run reads the very next batch;
- the random generators (dropout masks): ``backend.get_rng_state()`` goes into the checkpoint.
Nothing else may influence the arithmetic: evaluation runs in eval mode (no dropout draws), and time
limits only decide where a run stops, never what it computes.

Checkpoints are written atomically (see ``checkpoint.py``), so a kill while saving leaves the previous
one whole. A non-finite loss or gradient stops the run before the optimiser step, and nothing is saved
after it: the last good checkpoint stays as it was.
"""

from __future__ import annotations

import math
import os
import time

import numpy

from minitransformer import backend
from minitransformer.checks import positive_int
from minitransformer.config import TransformerConfig
from minitransformer.kit.running.checkpoint import (
    MAX_COUNT,
    CheckpointManager,
    check_state,
    checkpoint_files,
    latest_checkpoint,
    load_checkpoint,
    resolve_checkpoint,
)
from minitransformer.limits import MAX_HISTORY
from minitransformer.optim import clip_grad_norm

ON_NONFINITE = ("stop", "skip")


class NonFiniteError(FloatingPointError):
    """Training met a loss or gradient that is NaN or infinite (the optimiser step was not taken)."""


class ListBatches:
    """A fixed list of batches as a resumable source: every epoch serves the same list, in order."""

    def __init__(self, batches):
        self.batches = list(batches)
        if not self.batches:
            raise ValueError("ListBatches: batches must hold at least one batch, got none")
        self.epoch, self.position = 0, 0

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        while self.position < len(self.batches):
            self.position += 1
            yield self.batches[self.position - 1]
        self.epoch, self.position = self.epoch + 1, 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        if not isinstance(state, dict) or any(k not in state for k in ("epoch", "position")):
            raise ValueError(f"ListBatches.load_state_dict: state must be a dict with epoch and position, "
                             f"got {state!r:.80}")
        for key, top in (("epoch", MAX_COUNT), ("position", len(self.batches))):
            value = state[key]
            if isinstance(value, bool) or not isinstance(value, (int, numpy.integer)) or not 0 <= value <= top:
                raise ValueError(f"ListBatches.load_state_dict: {key} must be an int in [0, {top}], got {value!r:.40}")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


def _as_source(data, name: str):
    """A resumable batch source: anything with __iter__, state_dict and load_state_dict, or a list."""
    if all(hasattr(data, a) for a in ("__iter__", "state_dict", "load_state_dict")):
        return data
    if isinstance(data, (list, tuple)):
        return ListBatches(data)
    raise TypeError(f"Trainer: {name} must be a list of batches or a resumable batch source (an iterable with "
                    f"state_dict/load_state_dict, such as batching.BucketBatcher), got {type(data).__name__}")


def unpack_batch(batch, pad_id: int = 0):
    """(src, tgt_in, tgt_out, number of real tokens) of a Batch or a (src, tgt_in, tgt_out) tuple."""
    if hasattr(batch, "src"):
        src, tgt_in, tgt_out = batch.src, batch.tgt_in, batch.tgt_out
    elif isinstance(batch, (tuple, list)) and len(batch) == 3:
        src, tgt_in, tgt_out = batch
    else:
        raise TypeError(f"Trainer: a batch must have src, tgt_in and tgt_out (a batching.Batch or a 3-tuple), "
                        f"got {type(batch).__name__}")
    if hasattr(batch, "num_src_tokens"):
        tokens = int(batch.num_src_tokens) + int(batch.num_tgt_tokens)
    else:
        tokens = int((numpy.asarray(backend.to_numpy(src)) != pad_id).sum()
                     + (numpy.asarray(backend.to_numpy(tgt_out)) != pad_id).sum())
    return src, tgt_in, tgt_out, tokens


def _int(value):
    """A count given as a NumPy integer becomes a plain int (it goes into checkpoints as JSON); None stays."""
    return None if value is None else int(value)


def _grad_norm(params) -> float:
    xp = backend.xp()
    return float(xp.sqrt(sum(xp.vdot(p.grad.ravel(), p.grad.ravel()) for p in params)))


class Trainer:
    """Train a model on batches, with evaluation, early stopping, checkpoints and exact resume.

    model        a Module whose forward(src, tgt_in) gives logits and backward(dlogits) fills the grads
    loss_fn      a CrossEntropyLoss (forward(logits, target) -> float, backward() -> dlogits)
    optimizer    an optimiser with step(), zero_grad(), lr, state_dict(), load_state_dict()
    train_data   a resumable batch source (``BucketBatcher``, ``tasks.TaskBatches``) or a list of batches;
                 a batch has src (B,S), tgt_in (B,T), tgt_out (B,T) int arrays
    scheduler    e.g. ``NoamSchedule``: step() before every optimiser step (None: constant lr)
    valid_data   a list of batches for the validation loss (None: no validation loss)
    clip_norm    clip the gradients' joint L2 norm to this (None: no clipping)
    max_steps, max_epochs, max_seconds   when to stop (the first reached); at least one must be given.
                 max_seconds is wall-clock time of this ``fit`` call (evaluation included); it decides only
                 where the run stops, never what it computes
    eval_every   evaluate every so many steps (validation loss and metric); None: only at the end
    metric_fn    metric_fn(model) -> float, e.g. exact match or BLEU, computed in eval mode
    metric_name, metric_format   how the progress lines and ``stop_description`` name and write the metric:
                 e.g. "valid BLEU" and ``"{:.2f}".format`` (default "metric", 4 decimals)
    target       stop as soon as metric_fn reaches this value (needs metric_fn and eval_every)
    checkpoint_dir, save_every, keep   write checkpoint-<step>.npz every save_every steps and at the end,
                 keep the last ``keep``, and checkpoint.npz = the latest (None: no checkpoints). A folder that
                 already holds another run's checkpoints is refused when training starts (ValueError):
                 continue that run with ``resume(checkpoint_dir)`` first, or choose an empty folder
    on_nonfinite "stop": raise NonFiniteError at a NaN/inf loss or gradient; "skip": drop that step
    max_skips    with "skip": raise NonFiniteError after this many dropped steps in a row (default 100)
    progress     show a tqdm progress bar with loss, tokens/s and lr (the evaluation lines are printed either way)
    parallel     a ``fast.DataParallel(model, loss_fn, workers)``: each step's forward and backward run with
                 the batch split across its workers (the same loss and gradients); None: on the whole batch
    config, tokenizers, extra   JSON-able data stored in every checkpoint (model config, vocabularies, ...)

    After ``fit``: ``stop_reason`` says why it stopped ("target", "max_steps", "max_epochs", "max_seconds"),
    ``stop_description()`` the same in words; ``history`` is a list of (step, loss, lr, tokens_per_second), one per optimiser step,
    and ``valid_history`` a list of (step, valid_loss, metric) (NaN where not computed). Tokens per second
    counts the real (non-pad) source and target tokens of a step over its wall-clock time.
    """

    def __init__(self, model, loss_fn, optimizer, train_data, *, scheduler=None, valid_data=None,
                 clip_norm: float | None = None, max_steps: int | None = None, max_epochs: int | None = None,
                 max_seconds: float | None = None, eval_every: int | None = None, metric_fn=None,
                 target: float | None = None, checkpoint_dir=None, save_every: int | None = None, keep: int = 5,
                 on_nonfinite: str = "stop", progress: bool = True, config: dict | None = None,
                 tokenizers: dict | None = None, extra: dict | None = None, max_skips: int = 100,
                 metric_name: str = "metric", metric_format=None, parallel=None):
        for name, value in (("max_steps", max_steps), ("max_epochs", max_epochs), ("eval_every", eval_every),
                            ("save_every", save_every)):
            if value is not None:
                positive_int("Trainer", name, value)
        positive_int("Trainer", "max_skips", max_skips)
        if target is not None and (isinstance(target, bool) or not isinstance(target, (int, float, numpy.floating))
                                   or not math.isfinite(target)):
            raise ValueError(f"Trainer: target must be a finite number (the metric to reach) or None, got {target!r}")
        for name, value in (("clip_norm", clip_norm), ("max_seconds", max_seconds)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not value > 0 or not math.isfinite(value)):
                raise ValueError(f"Trainer: {name} must be a positive number or None, got {value!r}")
        if max_steps is None and max_epochs is None and max_seconds is None:
            raise ValueError("Trainer: give at least one of max_steps, max_epochs, max_seconds (when to stop)")
        if on_nonfinite not in ON_NONFINITE:
            raise ValueError(f"Trainer: on_nonfinite must be one of {ON_NONFINITE}, got {on_nonfinite!r}")
        if target is not None and metric_fn is None:
            raise ValueError("Trainer: target needs a metric_fn to compare it with")
        if target is not None and eval_every is None:
            raise ValueError("Trainer: target needs eval_every: the metric is compared with it at each evaluation "
                             "(without eval_every there is only the final one, after the last step)")
        if not isinstance(metric_name, str) or not metric_name:
            raise TypeError(f"Trainer: metric_name must be a non-empty str, got {metric_name!r:.60}")
        if metric_format is not None and not callable(metric_format):
            raise TypeError(f"Trainer: metric_format must be callable(float) -> str, got {type(metric_format).__name__}")
        if metric_fn is not None and not callable(metric_fn):
            raise TypeError(f"Trainer: metric_fn must be callable(model) -> float, got {type(metric_fn).__name__}")
        if save_every is not None and checkpoint_dir is None:
            raise ValueError("Trainer: save_every needs a checkpoint_dir to save into")
        if parallel is not None and (getattr(parallel, "model", None) is not model
                                     or getattr(parallel, "loss_fn", None) is not loss_fn):
            raise ValueError(f"Trainer: parallel must be a DataParallel over this trainer's model and loss_fn "
                             f"(DataParallel(model, loss_fn, workers)), got {parallel!r:.80}")
        self.model, self.loss_fn, self.optimizer, self.scheduler = model, loss_fn, optimizer, scheduler
        self.train_data = _as_source(train_data, "train_data")
        if valid_data is not None and not hasattr(valid_data, "__iter__"):
            raise TypeError(f"Trainer: valid_data must be a list of batches or None, got {type(valid_data).__name__}")
        self.valid_data = None if valid_data is None else list(valid_data)
        self.clip_norm = clip_norm
        self.max_steps, self.max_epochs, self.max_seconds = _int(max_steps), _int(max_epochs), max_seconds
        self.eval_every, self.metric_fn, self.target = _int(eval_every), metric_fn, target
        self.metric_name, self.metric_format = metric_name, metric_format or "{:.4f}".format
        self.save_every, self.on_nonfinite, self.max_skips = _int(save_every), on_nonfinite, int(max_skips)
        self.progress, self.parallel = progress, parallel
        self.config, self.tokenizers, self.extra = config, dict(tokenizers or {}), dict(extra or {})
        self.checkpoints = None if checkpoint_dir is None else CheckpointManager(checkpoint_dir, keep=keep)
        # True once this trainer resumed from checkpoint_dir or saved into it: its checkpoints are then this run's
        self._checkpoint_dir_is_ours = False
        self.pad_id = getattr(loss_fn, "ignore_index", 0)
        self.params = model.parameters()
        # progress of the run; all of it goes into checkpoints
        self.step = 0
        self.history: list = []          # (step, loss, lr, tokens_per_second)
        self.valid_history: list = []    # (step, valid_loss, metric)
        self.train_seconds = 0.0         # wall-clock time inside training steps (not evaluation, not saving)
        self.train_cpu_seconds = 0.0     # CPU time of this process in those steps (all its threads)
        self.tokens_seen = 0
        self.skipped = 0
        self.last_saved_step = None
        self.stop_reason = None
        self._consecutive_skips = 0

    # ------------------------------------------------------------------------------------- one step
    def train_step(self, batch) -> float | None:
        """One optimiser step on one batch. Returns the loss, or None if the step was skipped (non-finite)."""
        src, tgt_in, tgt_out, _ = unpack_batch(batch, self.pad_id)
        self.optimizer.zero_grad()
        if self.parallel is None:
            logits = self.model(src, tgt_in)                   # (B,T,V)
            loss = self.loss_fn(logits, tgt_out)
        else:
            loss = self.parallel.forward(src, tgt_in, tgt_out)    # the same loss, the batch split across workers
        if not math.isfinite(loss):
            self.model.train()                                 # drop the forward's caches (no backward follows)
            return self._nonfinite("loss", loss)
        if self.parallel is None:
            self.model.backward(self.loss_fn.backward())       # fills every .grad
        else:
            self.parallel.backward()                           # fills every .grad of model
        with numpy.errstate(invalid="ignore", over="ignore"):     # a NaN/inf norm is reported just below
            norm = clip_grad_norm(self.params, self.clip_norm) if self.clip_norm else _grad_norm(self.params)
        if not math.isfinite(norm):
            self.optimizer.zero_grad()
            return self._nonfinite("gradient norm", norm, loss)
        if self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.step()
        return loss

    def _nonfinite(self, what: str, value: float, loss: float | None = None):
        where = f"step {self.step + 1} (epoch {self.train_data.epoch}, batch {self.train_data.position})"
        if self.on_nonfinite == "skip":
            self.skipped += 1
            self._consecutive_skips += 1
            if self._consecutive_skips <= self.max_skips:
                return
            what = f"{what} for {self._consecutive_skips} steps in a row, the last"
        last = (f"the last checkpoint ({self.checkpoints.latest}, step {self.last_saved_step}) was left untouched"
                if self.checkpoints is not None and self.last_saved_step is not None
                else "no checkpoint was written")
        extra = "" if loss is None else f" (loss {loss:.6g})"
        raise NonFiniteError(
            f"Training stopped: non-finite {what} {value} at {where}{extra}. The optimiser step was not taken "
            f"and {last}. Try a lower learning rate, gradient clipping (clip_norm), or on_nonfinite='skip'.")

    # ------------------------------------------------------------------------------------- evaluation
    def validation_loss(self) -> float:
        """Mean loss over every non-pad target token of valid_data, in eval mode (no dropout)."""
        if not self.valid_data:
            return float("nan")
        self.model.eval()
        total, count = 0.0, 0
        try:
            for batch in self.valid_data:
                src, tgt_in, tgt_out, _ = unpack_batch(batch, self.pad_id)
                loss = self.loss_fn(self.model(src, tgt_in), tgt_out)
                n = getattr(self.loss_fn, "num_tokens", 1)
                total += loss * n
                count += n
        finally:
            self.model.train()                 # also when a batch is refused: training goes on in training mode
        return total / count if count else float("nan")

    def evaluate(self) -> tuple:
        """(validation loss, metric) now; recorded in valid_history. Leaves the model in training mode."""
        valid_loss = self.validation_loss()
        metric = float("nan")
        if self.metric_fn is not None:
            self.model.eval()
            try:
                value = self.metric_fn(self.model)
            finally:
                self.model.train()
            if isinstance(value, bool) or not isinstance(value, (int, float, numpy.number)):
                raise TypeError(f"Trainer: metric_fn must return a number, got {type(value).__name__} ({value!r})")
            metric = float(value)
        self.valid_history.append((self.step, valid_loss, metric))
        if len(self.valid_history) > MAX_HISTORY:
            self.valid_history = _thinned(self.valid_history, self.step)
        return valid_loss, metric

    def _target_reached(self, metric: float) -> bool:
        return self.target is not None and math.isfinite(metric) and metric >= self.target

    # ------------------------------------------------------------------------------------- the loop
    def _done(self, started: float) -> str | None:
        if self.max_steps is not None and self.step >= self.max_steps:
            return "max_steps"
        if self.max_epochs is not None and self.train_data.epoch >= self.max_epochs:
            return "max_epochs"
        if self.max_seconds is not None and time.perf_counter() - started >= self.max_seconds:
            return "max_seconds"
        return None

    def fit(self) -> dict:
        """Train until a stop condition; save a final checkpoint. Returns ``summary()``."""
        # The plain bar: tqdm.auto wants ipywidgets in Jupyter and warns without them.
        from tqdm import tqdm

        self._claim_checkpoint_dir()              # before any step: a refused run changes nothing
        self.model.train()
        self._consecutive_skips = 0
        started = time.perf_counter()
        bar = tqdm(total=self.max_steps, initial=self.step, disable=not self.progress, unit="step",
                   dynamic_ncols=True, leave=True, mininterval=0.5)
        smooth_loss, smooth_tps = None, None
        self.stop_reason = self._done(started)
        try:
            while self.stop_reason is None:
                epoch_before = self.train_data.epoch
                for batch in self.train_data:
                    t0, c0 = time.perf_counter(), time.process_time()
                    loss = self.train_step(batch)
                    dt = time.perf_counter() - t0
                    self.train_cpu_seconds += time.process_time() - c0
                    if loss is None:                           # skipped (on_nonfinite="skip")
                        continue
                    self._consecutive_skips = 0
                    tokens = unpack_batch(batch, self.pad_id)[3]
                    self.step += 1
                    self.train_seconds += dt
                    self.tokens_seen += tokens
                    tps = tokens / dt if dt > 0 else float("inf")
                    lr = float(self.optimizer.lr)
                    self.history.append((self.step, float(loss), lr, tps))
                    if len(self.history) > MAX_HISTORY:
                        self.history = _thinned(self.history, self.step)
                    smooth_loss = loss if smooth_loss is None else 0.95 * smooth_loss + 0.05 * loss
                    smooth_tps = tps if smooth_tps is None else 0.9 * smooth_tps + 0.1 * tps
                    bar.update(1)
                    bar.set_postfix(loss=f"{smooth_loss:.3f}", tok_s=f"{smooth_tps:,.0f}", lr=f"{lr:.2e}",
                                    refresh=False)
                    if self.eval_every is not None and self.step % self.eval_every == 0:
                        valid_loss, metric = self.evaluate()
                        bar.write(self._eval_line(valid_loss, metric))
                        if self._target_reached(metric):
                            self.stop_reason = "target"
                    if self.save_every is not None and self.step % self.save_every == 0:
                        self.save()
                    self.stop_reason = self.stop_reason or self._done(started)
                    if self.stop_reason is not None:
                        break
                if self.stop_reason is None and self.train_data.epoch == epoch_before:
                    raise RuntimeError("Trainer: train_data served no batch and did not advance its epoch")
                self.stop_reason = self.stop_reason or self._done(started)
        finally:
            bar.close()
        if self.stop_reason != "target" and (self.metric_fn is not None or self.valid_data) and \
                (not self.valid_history or self.valid_history[-1][0] != self.step):
            valid_loss, metric = self.evaluate()
            print(self._eval_line(valid_loss, metric))
        if self.checkpoints is not None and self.last_saved_step != self.step:
            self.save()
        return self.summary()

    def _eval_line(self, valid_loss, metric) -> str:
        parts = [f"step {self.step}"]
        if math.isfinite(valid_loss):
            smoothing = getattr(self.loss_fn, "label_smoothing", 0.0)
            parts.append(f"valid loss {valid_loss:.4f}" + (f" (with label smoothing {smoothing:g})" if smoothing else ""))
        if math.isfinite(metric):
            parts.append(f"{self.metric_name} {self.metric_format(metric)}")
        return "  ".join(parts)

    def stop_description(self) -> str:
        """Why the run stopped, in words: "target reached at step 1000 (valid BLEU 99.20 >= 99.00)",
        "step limit reached (3000 steps)", "time limit reached (43 min)", "20 epochs done"."""
        reason = self.stop_reason
        if reason == "target":
            metric = self.valid_history[-1][2] if self.valid_history else float("nan")
            return (f"target reached at step {self.step} ({self.metric_name} {self.metric_format(metric)} >= "
                    f"{self.metric_format(self.target)})")
        if reason == "max_steps":
            return f"step limit reached ({self.max_steps} steps)"
        if reason == "max_epochs":
            return f"{self.max_epochs} epoch{'s' if self.max_epochs != 1 else ''} done (the epoch limit)"
        if reason == "max_seconds":
            minutes = self.max_seconds / 60
            return f"time limit reached ({minutes:g} min) at step {self.step}"
        return "not stopped yet" if reason is None else str(reason)

    def summary(self) -> dict:
        """What the run did: steps, epochs, final loss (mean of the last 50 steps), times, stop reason."""
        recent = [h[1] for h in self.history[-50:]]
        last_valid = self.valid_history[-1] if self.valid_history else (self.step, float("nan"), float("nan"))
        return {
            "steps": self.step,
            "epoch": self.train_data.epoch,
            "loss": float(numpy.mean(recent)) if recent else float("nan"),
            "valid_loss": last_valid[1],
            "metric": last_valid[2],
            "train_seconds": self.train_seconds,
            "train_cpu_seconds": self.train_cpu_seconds,
            "tokens_per_second": self.tokens_seen / self.train_seconds if self.train_seconds > 0 else 0.0,
            "skipped_steps": self.skipped,
            "stop_reason": self.stop_reason,
        }

    # ------------------------------------------------------------------------------------- checkpoints
    def state(self) -> dict:
        """The keyword arguments of ``save_checkpoint`` for the run as it is now."""
        data_state = self.train_data.state_dict()
        return {
            "weights": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": None if self.scheduler is None else self.scheduler.state_dict(),
            "epoch": data_state.get("epoch", 0), "batch": data_state.get("position", 0),
            "rng": backend.get_rng_state(),
            "config": self.config,
            "tokenizers": self.tokenizers,
            "extra": {**self.extra, "trainer": {
                "data": data_state, "history": [list(h) for h in self.history],
                "valid_history": [list(v) for v in self.valid_history], "train_seconds": self.train_seconds,
                "train_cpu_seconds": self.train_cpu_seconds, "tokens_seen": self.tokens_seen, "skipped": self.skipped}},
        }

    def _claim_checkpoint_dir(self) -> None:
        """Refuse to save this run into a folder that holds the checkpoints of another run.

        The two would mix, and pruning keeps the highest steps whoever wrote them: a new run's first
        checkpoints (low steps) would be the ones deleted, and checkpoint.npz would no longer match the
        step files that averaging reads. Resuming from the folder makes its checkpoints this run's own.
        """
        if self.checkpoints is None or self._checkpoint_dir_is_ours:
            return
        directory = self.checkpoints.directory
        others = checkpoint_files(directory)
        if others:
            names = [os.path.basename(p) for p in reversed(others)]       # checkpoint.npz, then newest step first
            shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
            raise ValueError(f"Trainer: checkpoint_dir {directory} already holds the checkpoints of another run "
                             f"({shown}): continue it with trainer.resume({directory!r}) before fit(), or choose "
                             f"an empty folder (a new run there would mix with it, and pruning would delete "
                             f"the new run's first checkpoints)")
        self._checkpoint_dir_is_ours = True

    def save(self) -> str:
        """Write checkpoint-<step>.npz and checkpoint.npz in checkpoint_dir (atomically)."""
        if self.checkpoints is None:
            raise ValueError("Trainer.save: no checkpoint_dir was given")
        self._claim_checkpoint_dir()
        path = self.checkpoints.save(self.step, **self.state())
        self.last_saved_step = self.step
        return path

    def resume(self, path) -> None:
        """Restore everything from a checkpoint (a file or a run folder): weights, optimiser, schedule,
        step, data position, random generators and histories. Training then continues exactly.

        A folder resumes from its checkpoint.npz, or from its newest checkpoint-<step>.npz when that is missing.
        Resuming from a file in checkpoint_dir makes the checkpoints there this run's own (see ``fit``).
        The checkpoint may come from anyone: everything is checked first (``_check_resumable``), so a refused
        one (ValueError naming the file and the field) leaves this trainer, its model, optimiser, schedule,
        data position and the random generators exactly as they were.
        """
        if os.path.isdir(path):
            folder, path = path, latest_checkpoint(path)
            if path is None:
                raise FileNotFoundError(f"Trainer.resume: no checkpoint in {folder} (neither checkpoint.npz "
                                        f"nor any checkpoint-<step>.npz)")
        path = resolve_checkpoint(path)
        ck = load_checkpoint(path)
        state = self._check_resumable(ck)
        if ck.rng is not None:                 # first: it changes nothing when it fails, and nothing after it fails
            try:
                backend.set_rng_state(ck.rng)
            except (TypeError, ValueError, KeyError, IndexError, OverflowError) as err:
                raise ValueError(f"checkpoint {path}: rng is not a random generator state ({err})") from None
        self.model.load_state_dict(ck.weights)
        self.optimizer.load_state_dict(ck.optimizer)
        if self.scheduler is not None:
            self.scheduler.load_state_dict(ck.scheduler)
        self.train_data.load_state_dict(state["data"])
        self.step = ck.step
        self.history = [tuple(h) for h in state["history"]]
        self.valid_history = [tuple(v) for v in state["valid_history"]]
        self.train_seconds = float(state["train_seconds"])
        self.train_cpu_seconds = float(state.get("train_cpu_seconds", 0.0))
        self.tokens_seen = int(state["tokens_seen"])
        self.skipped = int(state["skipped"])
        self.last_saved_step = self.step
        if self.checkpoints is not None and _same_folder(os.path.dirname(os.path.abspath(path)),
                                                         self.checkpoints.directory):
            self._checkpoint_dir_is_ours = True
        self.model.train()

    def _check_resumable(self, ck) -> dict:
        """Refuse (ValueError naming the file and the field) a checkpoint this trainer cannot continue from,
        changing nothing. -> its training state (``state()["extra"]["trainer"]``)."""
        path = ck.path
        saved, ours = full_config(ck.config), full_config(self.config)
        if ours is not None and saved is not None and saved != ours:
            changed = sorted(k for k in set(saved) | set(ours) if saved.get(k) != ours.get(k))
            raise ValueError(f"Trainer.resume: checkpoint {path} was trained with another model config "
                             f"(differs in {changed}); build the model from the checkpoint's config to resume")
        state = ck.extra.get("trainer")
        if state is None:
            raise ValueError(f"Trainer.resume: checkpoint {path} holds no training state (was it written by Trainer?)")
        if ck.optimizer is None:
            raise ValueError(f"Trainer.resume: checkpoint {path} holds no optimiser state")
        if self.scheduler is not None and ck.scheduler is None:
            raise ValueError(f"Trainer.resume: checkpoint {path} holds no scheduler state, but a scheduler was given")
        check_state(path, "weights", ck.weights, {name: p.data for name, p in self.model.named_parameters()})
        template = self.optimizer.state_dict()
        if "lr" in template:
            template["lr"] = float(template["lr"])        # a number: lr=1 given as an int is still a rate
        check_state(path, "optimizer", ck.optimizer, template)
        if self.scheduler is not None:
            check_state(path, "scheduler", ck.scheduler, self.scheduler.state_dict())
            bad = [k for k, v in ck.scheduler.items() if k != "step" and isinstance(v, (int, float)) and not v > 0]
            if bad:
                raise ValueError(f"checkpoint {path}: scheduler[{bad[0]!r}] must be positive, "
                                 f"got {ck.scheduler[bad[0]]}")
        if not isinstance(state, dict):
            raise ValueError(f"checkpoint {path}: the training state must be an object, "  # noqa: TRY004
                             f"got {type(state).__name__}")
        for key in ("data", "history", "valid_history", "train_seconds", "tokens_seen", "skipped"):
            if key not in state:
                raise ValueError(f"checkpoint {path} is missing the training state's {key!r}")
        check_state(path, "the training state's data position", state["data"], self.train_data.state_dict())
        if hasattr(self.train_data, "__len__") and state["data"].get("position", 0) > len(self.train_data):
            raise ValueError(f"checkpoint {path}: the data position {state['data']['position']} is beyond the "
                             f"{len(self.train_data)} batches of an epoch of this run's data")
        for key, width in (("history", 4), ("valid_history", 3)):
            rows = state[key]
            if not isinstance(rows, list) or not all(isinstance(r, list) and len(r) == width and all(map(_number, r))
                                                     for r in rows):
                raise ValueError(f"checkpoint {path}: the training state's {key} must be a list of "
                                 f"[{width} numbers] rows")
        for key in ("train_seconds", "train_cpu_seconds"):
            value = state.get(key, 0.0)
            if not _number(value) or not 0 <= value < math.inf:
                raise ValueError(f"checkpoint {path}: the training state's {key} must be a number >= 0, "
                                 f"got {value!r:.40}")
        for key in ("tokens_seen", "skipped"):
            value = state[key]
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2 ** 63:
                raise ValueError(f"checkpoint {path}: the training state's {key} must be an int >= 0, "
                                 f"got {value!r:.40}")
        return state


def _thinned(rows: list, step: int) -> list:
    """A history past MAX_HISTORY rows, thinned: the rows whose step is a multiple of the smallest power of two that
    keeps at most half of MAX_HISTORY of them, and the last row. Evenly spaced over the whole run, and decided by
    the step alone, so a resumed run thins exactly as the uninterrupted one; its metadata stays bounded."""
    stride = 1
    while stride * MAX_HISTORY < 2 * step:
        stride *= 2
    return [row for row in rows[:-1] if row[0] % stride == 0] + rows[-1:]


def full_config(config):
    """A model config dict with every field, defaults filled in: a checkpoint saved before a field existed
    (d_k, positional) holds the model that field's default gives. Any other dict (or None) as it is."""
    try:
        return TransformerConfig.from_dict(config).to_dict()
    except (TypeError, ValueError):
        return config


def _number(value) -> bool:
    """A JSON number that converts to a float (NaN and infinity included: a history may hold them)."""
    return isinstance(value, float) or (isinstance(value, int) and not isinstance(value, bool)
                                        and abs(value) <= 2 ** 53)


def _same_folder(a, b) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)
