"""The training loop (``Trainer.fit``), with evaluation, early stopping and checkpoints.

Exact resume: a run killed at any moment and resumed from its last checkpoint computes the same steps, to the bit on
the CPU, as the run never stopped: the checkpoint holds every input of a later step (weights, optimiser moments,
counts, the data position, the random generators); evaluation draws no random numbers and time limits decide only
where a run stops. A non-finite loss or gradient stops the run before the update, and nothing is saved after it."""

import math
import numbers
import os
import time

import numpy
from tqdm import tqdm  # not tqdm.auto: it wants ipywidgets in Jupyter

from minitransformer import backend
from minitransformer.checks import one_of, positive_int, positive_number
from minitransformer.kit.data.batching import ResumableBatches
from minitransformer.kit.running import checkpoint
from minitransformer.kit.running import checkpoint_checks as checks
from minitransformer.kit.limits import MAX_HISTORY
from minitransformer.optim import clip_grad_norm


class Trainer:
    """Train a model on batches, with evaluation, early stopping, checkpoints and exact resume.

    train_data: a resumable source (``BucketBatcher``) or a list of batches (src (B,S), tgt_in (B,T), tgt_out
    (B,T)). Stops at the first of max_steps, max_epochs, max_seconds (this ``fit``'s wall clock) reached, or once
    metric_fn(model) reaches target at an evaluation (every eval_every steps and at the end). Saves every
    save_every steps and at the end into checkpoint_dir, keeping ``keep`` step files (another run's folder is
    refused unless resumed from). on_nonfinite: "stop" raises NonFiniteError at a NaN/inf loss or gradient,
    "skip" drops the step (up to max_skips in a row). parallel: a ``fast.DataParallel`` over model and loss_fn.
    After ``fit``: ``stop_reason``, ``history`` (step, loss, lr, tokens/s) and ``valid_history`` (step,
    valid_loss, metric) rows, thinned on long runs.
    """

    def __init__(self, model, loss_fn, optimizer, train_data, *, scheduler=None, valid_data=None,
                 clip_norm: float | None = None, max_steps: int | None = None, max_epochs: int | None = None,
                 max_seconds: float | None = None, eval_every: int | None = None, metric_fn=None,
                 target: float | None = None, checkpoint_dir=None, save_every: int | None = None, keep: int = 5,
                 on_nonfinite: str = "stop", progress: bool = True, config: dict | None = None,
                 tokenizers: dict | None = None, extra: dict | None = None, max_skips: int = 100,
                 metric_name: str = "metric", metric_format=None, parallel=None):
        counts = {"max_steps": max_steps, "max_epochs": max_epochs, "eval_every": eval_every, "save_every": save_every}
        self.max_steps, self.max_epochs, self.eval_every, self.save_every = (
            None if value is None else positive_int("Trainer", name, value) for name, value in counts.items())
        self.clip_norm, self.max_seconds = (None if value is None else positive_number("Trainer", name, value)
                                            for name, value in (("clip_norm", clip_norm), ("max_seconds", max_seconds)))
        self.max_skips = positive_int("Trainer", "max_skips", max_skips)
        one_of("Trainer", "on_nonfinite", on_nonfinite, ("stop", "skip"))
        if max_steps is None and max_epochs is None and max_seconds is None:
            raise ValueError("Trainer: give at least one of max_steps, max_epochs, max_seconds (when to stop)")
        if target is not None and (isinstance(target, bool) or not isinstance(target, numbers.Real)
                                   or not math.isfinite(target)):
            raise ValueError(f"Trainer: target must be a finite number (the metric to reach) or None, got {target!r}")
        if target is not None and (metric_fn is None or eval_every is None):
            raise ValueError("Trainer: target needs a metric_fn and eval_every (it is compared with the metric at "
                             "each evaluation)")
        if save_every is not None and checkpoint_dir is None:
            raise ValueError("Trainer: save_every needs a checkpoint_dir")
        if parallel is not None and (getattr(parallel, "model", None) is not model
                                     or getattr(parallel, "loss_fn", None) is not loss_fn):
            raise ValueError(f"Trainer: parallel must be a DataParallel over this trainer's model and loss_fn, "
                             f"got {parallel!r:.80}")
        for name, value in (("metric_fn", metric_fn), ("metric_format", metric_format)):
            if value is not None and not callable(value):
                raise TypeError(f"Trainer: {name} must be callable, got {type(value).__name__}")
        if valid_data is not None and not hasattr(valid_data, "__iter__"):
            raise TypeError(f"Trainer: valid_data must be a list of batches or None, got {type(valid_data).__name__}")
        if isinstance(train_data, (list, tuple)):
            train_data = ListBatches(train_data)
        elif not all(hasattr(train_data, a) for a in ("__iter__", "state_dict", "load_state_dict")):
            raise TypeError(f"Trainer: train_data must be a list of batches or a resumable source (e.g. "
                            f"batching.BucketBatcher), got {type(train_data).__name__}")
        self.model, self.loss_fn, self.optimizer, self.scheduler = model, loss_fn, optimizer, scheduler
        self.train_data, self.valid_data = train_data, None if valid_data is None else list(valid_data)
        self.metric_fn, self.target, self.metric_name = metric_fn, target, metric_name
        self.metric_format, self.on_nonfinite = metric_format or "{:.4f}".format, on_nonfinite
        self.progress, self.parallel = progress, parallel
        self.config, self.tokenizers, self.extra = config, dict(tokenizers or {}), dict(extra or {})
        self.checkpoints = None if checkpoint_dir is None else checkpoint.CheckpointManager(checkpoint_dir, keep)
        self._checkpoint_dir_is_ours = False   # True once this trainer resumed from checkpoint_dir or saved there
        self.pad_id, self.params = getattr(loss_fn, "ignore_index", 0), model.parameters()
        self.step, self.tokens_seen, self.skipped, self._skips_in_a_row = 0, 0, 0, 0    # the run so far (saved)
        self.history, self.valid_history = [], []        # (step, loss, lr, tokens/s), (step, valid_loss, metric)
        self.train_seconds = self.train_cpu_seconds = 0.0    # wall-clock and CPU time in steps (not evaluation)
        self.last_saved_step = self.stop_reason = None

    def fit(self) -> dict:
        """Train until a stop condition, evaluating and saving on the way, then save. Returns ``summary()``."""
        self._claim_checkpoint_dir()                     # before any step: a refused run changes nothing
        self.model.train()
        self._skips_in_a_row, self._smooth, self._started = 0, None, time.perf_counter()
        self.stop_reason = self._done()
        bar = tqdm(total=self.max_steps, initial=self.step, disable=not self.progress, unit="step",
                   dynamic_ncols=True, leave=True, mininterval=0.5)
        try:
            while self.stop_reason is None:
                epoch = self.train_data.epoch
                for batch in self.train_data:
                    src, tgt_in, tgt_out, tokens = unpack_batch(batch, self.pad_id)
                    clock = time.perf_counter(), time.process_time()
                    self.optimizer.zero_grad()                        # backward adds (+=): start from zero
                    if self.parallel is None:                         # forward, mean over non-pad target tokens
                        loss = self.loss_fn(self.model(src, tgt_in), tgt_out)
                    else:                                             # the same loss, the batch split in threads
                        loss = self.parallel.forward(src, tgt_in, tgt_out)
                    if not math.isfinite(loss):
                        self.model.train()                            # drop the forward's caches: no backward
                        self._nonfinite("loss", loss)                 # raises, or skips (on_nonfinite="skip")
                        continue
                    if self.parallel is None:
                        self.model.backward(self.loss_fn.backward())  # every Parameter.grad filled
                    else:
                        self.parallel.backward()
                    with numpy.errstate(invalid="ignore", over="ignore"):     # a NaN/inf norm is handled below
                        norm = clip_grad_norm(self.params, self.clip_norm or math.inf)    # inf: measure only
                    if not math.isfinite(norm):
                        self._nonfinite("gradient norm", norm, loss)
                        continue
                    if self.scheduler is not None:
                        self.scheduler.step()                         # this step's learning rate
                    self.optimizer.step()                             # the update
                    self._record(loss, tokens, clock, bar)            # step count, history, progress bar
                    if self.eval_every is not None and self.step % self.eval_every == 0:
                        self.evaluate(bar.write)                      # stop_reason "target" once it is reached
                    if self.save_every is not None and self.step % self.save_every == 0:
                        self.save()
                    self.stop_reason = self.stop_reason or self._done()
                    if self.stop_reason is not None:
                        break
                if self.stop_reason is None and self.train_data.epoch == epoch:
                    raise RuntimeError("Trainer: train_data served no batch and did not advance its epoch")
                self.stop_reason = self.stop_reason or self._done()
        finally:
            bar.close()
        if self.stop_reason != "target" and (self.metric_fn is not None or self.valid_data) and \
                (not self.valid_history or self.valid_history[-1][0] != self.step):
            self.evaluate()
        if self.checkpoints is not None and self.last_saved_step != self.step:
            self.save()
        return self.summary()

    def _record(self, loss: float, tokens: int, clock: tuple, bar) -> None:
        seconds = time.perf_counter() - clock[0]
        self.train_seconds += seconds
        self.train_cpu_seconds += time.process_time() - clock[1]
        self.step, self.tokens_seen, self._skips_in_a_row = self.step + 1, self.tokens_seen + tokens, 0
        lr, tps = float(self.optimizer.lr), tokens / seconds if seconds > 0 else math.inf
        _append_bounded(self.history, (self.step, float(loss), lr, tps))
        old = self._smooth or (loss, tps)                # running means for the bar: one step's figures are noisy
        self._smooth = (0.95 * old[0] + 0.05 * loss, 0.9 * old[1] + 0.1 * tps)
        bar.update(1)
        bar.set_postfix(loss=f"{self._smooth[0]:.3f}", tok_s=f"{self._smooth[1]:,.0f}", lr=f"{lr:.2e}", refresh=False)

    def _done(self) -> str | None:
        """The first limit reached (the stop reason), or None."""
        reached = {"max_steps": (self.step, self.max_steps), "max_epochs": (self.train_data.epoch, self.max_epochs),
                   "max_seconds": (time.perf_counter() - self._started, self.max_seconds)}
        return next((reason for reason, (now, limit) in reached.items() if limit is not None and now >= limit), None)

    def _nonfinite(self, what: str, value: float, loss: float | None = None) -> None:
        if self.on_nonfinite == "skip":
            self.skipped, self._skips_in_a_row = self.skipped + 1, self._skips_in_a_row + 1
            if self._skips_in_a_row <= self.max_skips:
                return
            what = f"{what} for {self._skips_in_a_row} steps in a row, the last"
        where = f"step {self.step + 1} (epoch {self.train_data.epoch}, batch {self.train_data.position})"
        kept = (f"the last checkpoint ({self.checkpoints.latest}, step {self.last_saved_step}) was left untouched"
                if self.checkpoints is not None and self.last_saved_step is not None else "no checkpoint was written")
        raise NonFiniteError(
            f"Training stopped: non-finite {what} {value} at {where}{'' if loss is None else f' (loss {loss:.6g})'}. "
            f"The optimiser step was not taken and {kept}. Try a lower learning rate, gradient clipping "
            f"(clip_norm), or on_nonfinite='skip'.")

    def validation_loss(self) -> float:
        """Mean loss over every non-pad target token of valid_data, in eval mode (no dropout)."""
        total, count = 0.0, 0
        self.model.eval()
        try:
            for batch in self.valid_data or ():
                src, tgt_in, tgt_out, _ = unpack_batch(batch, self.pad_id)
                loss = self.loss_fn(self.model(src, tgt_in), tgt_out)
                n = getattr(self.loss_fn, "num_tokens", 1)           # the non-pad tokens of this batch
                total, count = total + loss * n, count + n
        finally:
            self.model.train()                 # also when a batch is refused: training goes on in training mode
        return total / count if count else math.nan

    def evaluate(self, write=print) -> tuple:
        """(validation loss, metric) now: recorded in valid_history, written as one line, and stop_reason "target"
        once the metric reaches it. Leaves the model in training mode."""
        valid_loss, metric = self.validation_loss(), math.nan
        if self.metric_fn is not None:
            self.model.eval()
            try:
                metric = self.metric_fn(self.model)
            finally:
                self.model.train()
            if isinstance(metric, bool) or not isinstance(metric, numbers.Real):
                raise TypeError(f"Trainer: metric_fn must return a number, got {type(metric).__name__} ({metric!r})")
        metric = float(metric)
        _append_bounded(self.valid_history, (self.step, valid_loss, metric), self.eval_every or 1)
        parts = [f"step {self.step}"]
        if math.isfinite(valid_loss):
            smoothing = getattr(self.loss_fn, "label_smoothing", 0.0)    # the loss the run minimises, said so
            said = f" (with label smoothing {smoothing:g})" if smoothing else ""
            parts.append(f"valid loss {valid_loss:.4f}{said}")
        if math.isfinite(metric):
            parts.append(f"{self.metric_name} {self.metric_format(metric)}")
        write("  ".join(parts))                                  # with or without the progress bar
        if self.target is not None and math.isfinite(metric) and metric >= self.target:
            self.stop_reason = "target"
        return valid_loss, metric

    def stop_description(self) -> str:
        """Why the run stopped, in words ("step limit reached (3000 steps)", ...)."""
        if self.stop_reason == "target":
            metric, target = self.metric_format(self.valid_history[-1][2]), self.metric_format(self.target)
            return f"target reached at step {self.step} ({self.metric_name} {metric} >= {target})"
        return {"max_steps": f"step limit reached ({self.max_steps} steps)",
                "max_epochs": f"{self.max_epochs} epoch{'s' * (self.max_epochs != 1)} done (the epoch limit)",
                "max_seconds": f"time limit reached ({(self.max_seconds or 0) / 60:g} min) at step {self.step}",
                None: "not stopped yet"}.get(self.stop_reason, str(self.stop_reason))

    def summary(self) -> dict:
        """What the run did: steps, epochs, final loss (mean of the last 50 steps), times, stop reason."""
        recent = [h[1] for h in self.history[-50:]]
        last_valid = self.valid_history[-1] if self.valid_history else (self.step, math.nan, math.nan)
        return {"steps": self.step, "epoch": self.train_data.epoch, "loss": numpy.mean(recent) if recent else math.nan,
                "valid_loss": last_valid[1], "metric": last_valid[2], "train_seconds": self.train_seconds,
                "train_cpu_seconds": self.train_cpu_seconds, "skipped_steps": self.skipped,
                "tokens_per_second": self.tokens_seen / self.train_seconds if self.train_seconds > 0 else 0.0,
                "stop_reason": self.stop_reason}

    def _claim_checkpoint_dir(self) -> None:
        """Refuse to save into a folder holding another run's checkpoints (the two would mix; resume it first)."""
        if self.checkpoints is None or self._checkpoint_dir_is_ours:
            return
        folder = self.checkpoints.directory
        names = [os.path.basename(p) for p in reversed(checkpoint.checkpoint_files(folder))]  # latest, newest step..
        if names:
            raise ValueError(f"Trainer: checkpoint_dir {folder} already holds the checkpoints of another run "
                             f"({', '.join(names[:3])}{', ...' * (len(names) > 3)}): continue it with "
                             f"trainer.resume({folder!r}) before fit(), or choose an empty folder (a new run there "
                             f"would mix with it, and pruning would delete the new run's first checkpoints)")
        self._checkpoint_dir_is_ours = True

    def save(self) -> str:
        """Write this step's checkpoint and its latest copy into checkpoint_dir, atomically. -> the copy's path."""
        if self.checkpoints is None:
            raise ValueError("Trainer.save: no checkpoint_dir was given")
        self._claim_checkpoint_dir()
        trainer = {"data": self.train_data.state_dict(),
                   **{k: getattr(self, k) for k in (*checks.COUNTERS, "history", "valid_history")}}
        path = self.checkpoints.save(
            self.step, weights=self.model.state_dict(), optimizer=self.optimizer.state_dict(),
            scheduler=None if self.scheduler is None else self.scheduler.state_dict(), epoch=self.train_data.epoch,
            batch=self.train_data.position, rng=backend.get_rng_state(), config=self.config,
            tokenizers=self.tokenizers, extra={**self.extra, "trainer": trainer})
        self.last_saved_step = self.step
        return path

    def resume(self, source) -> None:
        """Restore the whole run to continue exactly. source: a checkpoint file, a run folder (its latest
        checkpoint), or a ``Checkpoint`` already loaded. A refused one (ValueError naming the file and the field)
        changes nothing."""
        ck = source if isinstance(source, checkpoint.Checkpoint) else checkpoint.load_checkpoint(
            checkpoint.resolve_checkpoint(source))
        state = checks.check_resumable(self, ck)
        if ck.rng is not None:                 # first: it changes nothing when it fails, and nothing after it fails
            try:
                backend.set_rng_state(ck.rng)
            except (TypeError, ValueError, KeyError, IndexError, OverflowError) as err:
                raise ValueError(f"checkpoint {ck.path}: rng is not a random generator state ({err})") from None
        self.model.load_state_dict(ck.weights)
        self.optimizer.load_state_dict(ck.optimizer)
        if self.scheduler is not None:
            self.scheduler.load_state_dict(ck.scheduler)
        self.train_data.load_state_dict(state["data"])
        self.step = self.last_saved_step = ck.step
        self.history, self.valid_history = ([tuple(r) for r in state[k]] for k in ("history", "valid_history"))
        for key in checks.COUNTERS:
            setattr(self, key, type(getattr(self, key))(state[key]))           # float seconds, int counts
        if self.checkpoints is not None and os.path.samefile(os.path.dirname(ck.path) or ".",
                                                             self.checkpoints.directory):
            self._checkpoint_dir_is_ours = True                       # resumed from checkpoint_dir: its files are ours


# The histories go into every checkpoint's metadata, which the reader caps (limits.MAX_META_BYTES): past
# HISTORY_ROWS rows a history keeps only rows on a doubling stride (the curve still spans the run evenly) and the
# newest RECENT_ROWS. The rule reads only the rows and the step, so a resumed run keeps the very same rows.
HISTORY_ROWS, RECENT_ROWS = MAX_HISTORY, 50


def _stride(step, every: int) -> int:                            # in steps, for rows written every ``every``
    return every << max(0, math.ceil(math.log2(max(step // every, 1) / HISTORY_ROWS)))


def _append_bounded(rows: list, row: tuple, every: int = 1) -> None:
    """Append ``row`` (its step first) to a history written every ``every`` steps, thinning it (see above)."""
    stride = _stride(row[0], every)
    grew = bool(rows) and _stride(rows[-1][0], every) < stride
    rows.append(row)
    if grew:                                                     # thin the older rows to the new stride
        rows[:-RECENT_ROWS] = [r for r in rows[:-RECENT_ROWS] if r[0] % stride == 0]
    elif len(rows) > RECENT_ROWS and rows[-RECENT_ROWS - 1][0] % stride:
        del rows[-RECENT_ROWS - 1]                               # no longer among the newest, and off the stride


class NonFiniteError(FloatingPointError):
    """Training met a loss or gradient that is NaN or infinite (the optimiser step was not taken)."""


class ListBatches(ResumableBatches):
    """A fixed list of batches as a resumable source: every epoch serves the same list, in order."""

    state_keys = ("epoch", "position")                   # no seed: every epoch is the same

    def __init__(self, batches):
        self.batches = list(batches)
        if not self.batches:
            raise ValueError("Trainer: train_data must hold at least one batch, got none")

    def __len__(self) -> int:
        return len(self.batches)

    def batch_at(self, epoch: int, k: int):
        return self.batches[k]


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
        return src, tgt_in, tgt_out, int(batch.num_src_tokens) + int(batch.num_tgt_tokens)
    return src, tgt_in, tgt_out, sum(int((backend.to_numpy(a) != pad_id).sum()) for a in (src, tgt_out))
