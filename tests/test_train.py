"""The training loop: loss goes down, a stopped or killed run resumes bit for bit, and a NaN never
overwrites a good checkpoint."""

import doctest
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import minitransformer as mt
from minitransformer.kit import files
from minitransformer.kit.running import checkpoint as ck
from minitransformer.kit.data.batching import BucketBatcher
from minitransformer.kit.data.tasks import (
    SequenceTask,
    TaskBatches,
    exact_match,
)
from minitransformer.kit.running.trainer import NonFiniteError, Trainer
from minitransformer.loss import CrossEntropyLoss
from minitransformer.model import Transformer, TransformerConfig
from minitransformer.optim import Adam, NoamSchedule

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TASK = SequenceTask("copy", num_symbols=6, min_len=2, max_len=6)


def make_trainer(tmp_path=None, data="task", seed=0, dropout=0.1, **kw):
    """A fresh model, optimiser, schedule and data source, all from ``seed``: what a new process would build."""
    mt.manual_seed(seed)
    config = TransformerConfig(TASK.vocab_size, TASK.vocab_size, d_model=16, num_heads=2, num_encoder_layers=1,
                               num_decoder_layers=1, d_ff=24, dropout=dropout, max_len=16)
    model = Transformer(config)
    opt = Adam(model.parameters(), lr=1.0)
    sched = NoamSchedule(opt, config.d_model, warmup=10, factor=0.2)
    if data == "task":
        source = TaskBatches(TASK, batch_size=8, batches_per_epoch=7, seed=3)     # epochs roll over mid-run
    else:
        pairs = TASK.sample(np.random.default_rng(5), 60)
        source = BucketBatcher(pairs, max_tokens=40, seed=3)
    kw.setdefault("progress", False)
    return Trainer(model, CrossEntropyLoss(0, 0.1), opt, source, scheduler=sched, clip_norm=1.0,
                   checkpoint_dir=None if tmp_path is None else str(tmp_path), config=config.to_dict(), **kw)


def weights(trainer):
    return trainer.model.state_dict()


def assert_same_weights(a, b):
    assert list(a) == list(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_tasks_are_deterministic_and_correct():
    def pairs(name, n, seed):
        return SequenceTask(name).sample(np.random.default_rng(seed), n)

    assert pairs("copy", 5, seed=1) == pairs("copy", 5, seed=1) != pairs("copy", 5, seed=2)
    for src, tgt in pairs("reverse", 20, seed=0):
        assert tgt == src[::-1] and 1 <= len(src) <= 10 and min(src) >= 4 and max(src) < 14
    assert SequenceTask("copy").heldout(50) == SequenceTask("copy").heldout(50)
    batch = TASK.batch(seed=3, epoch=2, index=5, batch_size=4)
    again = TaskBatches(TASK, batch_size=4, batches_per_epoch=7, seed=3)
    again.load_state_dict({"seed": 3, "epoch": 2, "position": 5})
    np.testing.assert_array_equal(next(iter(again)).src, batch.src)             # resumes at (epoch, position)
    with pytest.raises(ValueError, match="name must be one of"):
        SequenceTask("sort")
    with pytest.raises(ValueError, match="min_len must be <= max_len"):
        SequenceTask("copy", min_len=5, max_len=3)


def test_the_tasks_docstring_example_is_true():
    from minitransformer.kit.data import tasks

    results = doctest.testmod(tasks)
    assert results.attempted >= 1 and results.failed == 0


def test_exact_match_counts_whole_sequences(monkeypatch):
    from minitransformer import decoding

    def fake_greedy(model, src, max_len=None):
        """Right (the copy) when the first symbol is even, else the copy minus its last symbol."""
        rows = [[int(i) for i in row if i != 0] for row in src]
        return [r if r[0] % 2 == 0 else r[:-1] for r in rows]

    monkeypatch.setattr(decoding, "greedy_decode", fake_greedy)
    pairs = SequenceTask("copy").heldout(40)
    expected = sum(src[0] % 2 == 0 for src, _ in pairs) / len(pairs)
    assert 0 < expected < 1
    trainer = make_trainer(max_steps=1)
    assert exact_match(trainer.model, pairs, batch_size=7) == expected
    assert not trainer.model.training
    with pytest.raises(ValueError, match="at least one"):
        exact_match(trainer.model, [])


def test_short_run_lowers_the_loss():
    trainer = make_trainer(dropout=0.0, max_steps=100)
    summary = trainer.fit()
    losses = [h[1] for h in trainer.history]
    assert summary["steps"] == 100 and len(losses) == 100
    assert np.mean(losses[-5:]) < 0.6 * np.mean(losses[:5])
    step, _, lr, tps = trainer.history[-1]
    assert step == 100 and lr > 0 and tps > 0
    assert summary["tokens_per_second"] > 0 and summary["stop_reason"] == "max_steps"


@pytest.mark.parametrize("data", ["task", "bucket"])
def test_resume_after_a_stop_continues_bit_for_bit(tmp_path, data):
    # uninterrupted: 23 steps (three epochs of 7 batches and a bit, dropout on)
    full = make_trainer(tmp_path / "full", data=data, max_steps=23)
    full.fit()
    # stopped after 10 steps, then a NEW process state (other seed!) resumes from the checkpoint to 23
    first = make_trainer(tmp_path / "split", data=data, max_steps=10)
    first.fit()
    second = make_trainer(tmp_path / "split", data=data, seed=99, max_steps=23)
    second.resume(tmp_path / "split")
    assert second.step == 10
    second.fit()
    assert [h[1] for h in second.history] == [h[1] for h in full.history]       # same losses, every step
    assert [h[2] for h in second.history] == [h[2] for h in full.history]       # same learning rates
    assert_same_weights(weights(second), weights(full))
    assert second.train_data.state_dict() == full.train_data.state_dict()


def test_resume_refuses_another_config(tmp_path):
    first = make_trainer(tmp_path, max_steps=2, save_every=1)
    first.fit()
    other = make_trainer(tmp_path / "other", dropout=0.2, max_steps=4)
    with pytest.raises(ValueError, match=r"another model config \(differs in \['dropout'\]\)"):
        other.resume(tmp_path)


def test_fresh_trainer_refuses_a_folder_with_another_runs_checkpoints(tmp_path):
    """Saving into it would mix two runs, and pruning (oldest steps first) would delete the new run's files."""
    make_trainer(tmp_path, max_steps=6, save_every=2, keep=3).fit()
    before = {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)}
    fresh = make_trainer(tmp_path, max_steps=4, save_every=1, keep=3)
    with pytest.raises(ValueError, match=r"checkpoint_dir .* already holds the checkpoints of another run "
                                         r"\(checkpoint\.safetensors, checkpoint-6\.safetensors, checkpoint-4\.safetensors, \.\.\.\): "
                                         r"continue it with trainer\.resume"):
        fresh.fit()
    with pytest.raises(ValueError, match="checkpoint_dir"):
        fresh.save()
    assert fresh.step == 0
    assert {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)} == before
    # resuming that run is what the folder is for; and a trainer goes on saving where it saved before
    again = make_trainer(tmp_path, max_steps=8, save_every=2, keep=3)
    again.resume(tmp_path)
    again.fit()
    again.max_steps = 10
    again.fit()
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-10.safetensors", "checkpoint-6.safetensors", "checkpoint-8.safetensors",
                                            "checkpoint.safetensors"]


def test_resume_of_a_folder_without_the_latest_checkpoint_takes_the_newest_step_file(tmp_path):
    make_trainer(tmp_path, max_steps=4, save_every=2).fit()
    os.remove(tmp_path / "checkpoint.safetensors")
    trainer = make_trainer(tmp_path, max_steps=6, save_every=2)
    trainer.resume(tmp_path)
    assert trainer.step == 4
    trainer.fit()
    assert ck.load_checkpoint(tmp_path / "checkpoint.safetensors").step == 6
    with pytest.raises(FileNotFoundError, match="no checkpoint in"):
        make_trainer(tmp_path / "empty", max_steps=1).resume(tmp_path / "empty")


def test_target_metric_stops_early():
    calls = []

    def metric(model):
        calls.append(model.training)
        return 0.5 if len(calls) < 2 else 1.0

    trainer = make_trainer(max_steps=100, eval_every=3, metric_fn=metric, target=1.0)
    summary = trainer.fit()
    assert summary["stop_reason"] == "target" and summary["steps"] == 6
    assert calls == [False, False]                      # the metric runs in eval mode
    assert trainer.model.training                       # and training mode comes back
    assert trainer.stop_description() == "target reached at step 6 (metric 1.0000 >= 1.0000)"


def test_progress_lines_name_the_metric_and_the_stop_says_why(capsys):
    """The evaluation lines say what the metric is ("valid BLEU 72.50", not "metric 72.5037"), and
    stop_description says why each kind of run stopped."""
    scores = iter([72.50371, 99.2])
    trainer = make_trainer(max_steps=100, eval_every=2, metric_fn=lambda model: next(scores), target=99.0,
                           metric_name="valid BLEU", metric_format="{:.2f}".format, progress=True)
    trainer.fit()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert lines == ["step 2  valid BLEU 72.50", "step 4  valid BLEU 99.20"]     # no valid_data: no valid loss
    assert trainer.stop_description() == "target reached at step 4 (valid BLEU 99.20 >= 99.00)"

    trainer = make_trainer(max_steps=3)
    trainer.fit()
    assert trainer.stop_description() == "step limit reached (3 steps)"
    trainer = make_trainer(max_epochs=1)                # 7 batches to an epoch
    trainer.fit()
    assert trainer.stop_reason == "max_epochs" and trainer.stop_description() == "1 epoch done (the epoch limit)"
    trainer = make_trainer(max_seconds=1e-9)
    trainer.fit()
    assert trainer.stop_description() == f"time limit reached ({1e-9 / 60:g} min) at step 0"
    with pytest.raises(TypeError, match="metric_format must be callable"):
        make_trainer(max_steps=1, metric_format="{:.2f}")


# ------------------------------------------------------------------------------------------ non-finite

class NaNAt:
    """A loss function that returns NaN at its n-th call (1-based), like a diverging run."""

    def __init__(self, n):
        self.inner, self.n, self.calls = CrossEntropyLoss(0, 0.1), n, 0
        self.ignore_index = 0

    def __call__(self, logits, target):
        self.calls += 1
        loss = self.inner(logits, target)
        return float("nan") if self.calls == self.n else loss

    def backward(self):
        return self.inner.backward()


def test_nonfinite_loss_stops_and_leaves_the_checkpoint_untouched(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=20, save_every=5)
    trainer.loss_fn = NaNAt(8)
    before = None

    original_save = trainer.save

    def save_and_remember():
        nonlocal before
        path = original_save()
        before = Path(path).read_bytes()
        return path

    trainer.save = save_and_remember
    with pytest.raises(NonFiniteError, match=r"non-finite loss nan at step 8 .*was not taken.*"
                                             r"checkpoint\.safetensors, step 5\) was left untouched"):
        trainer.fit()
    assert Path(tmp_path / "checkpoint.safetensors").read_bytes() == before
    assert ck.load_checkpoint(tmp_path / "checkpoint.safetensors").step == 5
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-5.safetensors", "checkpoint.safetensors"]


def test_nonfinite_gradient_stops(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=5)
    model = trainer.model
    inner_backward = model.backward

    def poisoned_backward(dlogits):
        inner_backward(dlogits)
        model.parameters()[0].grad[0, 0] = np.inf

    model.backward = poisoned_backward
    with pytest.raises(NonFiniteError, match="non-finite gradient norm .* no checkpoint was written"):
        trainer.fit()
    assert not os.path.exists(tmp_path / "checkpoint.safetensors")


def test_nonfinite_skip_drops_the_step_and_goes_on():
    trainer = make_trainer(max_steps=6, on_nonfinite="skip")
    trainer.loss_fn = NaNAt(3)
    summary = trainer.fit()
    assert summary["skipped_steps"] == 1 and summary["steps"] == 6
    assert all(np.isfinite(h[1]) for h in trainer.history)
    assert trainer.train_data.state_dict()["position"] == 7       # 6 steps and the skipped one used 7 batches


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="on_nonfinite must be one of"):
        make_trainer(max_steps=1, on_nonfinite="ignore")
    with pytest.raises(ValueError, match="at least one of max_steps"):
        make_trainer()
    with pytest.raises(ValueError, match="max_steps must be a positive int"):
        make_trainer(max_steps=0)
    with pytest.raises(ValueError, match="target needs a metric_fn"):
        make_trainer(max_steps=1, target=1.0)
    metric = lambda model: 0.5
    for bad, match in [({"max_skips": 0}, "max_skips must be a positive int"),   # 0: "skip" would stop at once
                       ({"max_skips": 2.5}, "max_skips must be a positive int"),
                       ({"max_skips": "3"}, "max_skips must be a positive int"),
                       ({"target": "0.9", "eval_every": 1}, "target must be a finite number"),
                       ({"target": float("nan"), "eval_every": 1}, "target must be a finite number"),
                       ({"target": 0.9}, "target needs a metric_fn and eval_every"),  # never compared before the end
                       ({"valid_data": 5}, "valid_data must be a list of batches")]:
        with pytest.raises((ValueError, TypeError), match=match):
            make_trainer(max_steps=1, metric_fn=metric, **bad)
    trainer = make_trainer(max_steps=np.int64(2), eval_every=np.int64(1))        # NumPy integers count too
    assert type(trainer.max_steps) is int and trainer.max_steps == 2


def test_bad_training_data_is_named():
    """The data a Trainer is handed, refused in one line: before the run, or at the batch that is wrong."""
    model = Transformer(TransformerConfig(8, 8, d_model=8, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                                          d_ff=8, max_len=8))
    opt, loss = Adam(model.parameters(), lr=1e-3), CrossEntropyLoss(0)
    batch = (np.array([[4, 5]]), np.array([[1, 4]]), np.array([[4, 2]]))
    for data, kw, error, match in [
            (5, {}, TypeError, "train_data must be a list of batches or a resumable source .*got int"),
            ([], {}, ValueError, "train_data must hold at least one batch, got none"),
            ([batch], {"save_every": 1}, ValueError, "save_every needs a checkpoint_dir")]:
        with pytest.raises(error, match=match):
            Trainer(model, loss, opt, data, max_steps=1, progress=False, **kw)

    class Empty(TaskBatches):                     # a source whose epoch serves nothing and never ends
        def __iter__(self):
            return iter(())

    trainers = [Trainer(model, loss, opt, [(batch[0], batch[1])], max_steps=1, progress=False),
                Trainer(model, loss, opt, Empty(TASK, batch_size=2, batches_per_epoch=1, seed=0), max_steps=1,
                        progress=False)]
    for trainer, match in zip(trainers, [r"a batch must have src, tgt_in and tgt_out .*got tuple",
                                         "train_data served no batch and did not advance its epoch"]):
        with pytest.raises((TypeError, RuntimeError), match=match):
            trainer.fit()


@pytest.mark.parametrize("metric_fn, error", [(lambda model: {}["missing"], KeyError),
                                              (lambda model: None, TypeError)])
def test_a_failing_metric_leaves_the_model_in_training_mode(metric_fn, error):
    trainer = make_trainer(max_steps=2, eval_every=1, metric_fn=metric_fn)
    with pytest.raises(error, match="metric_fn must return a number" if error is TypeError else "missing"):
        trainer.fit()
    assert trainer.model.training


# ------------------------------------------------------------------------------------------ SIGKILL

def _env():
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    env.pop("MINITRANSFORMER_BACKEND", None)
    return env


TRAIN = [sys.executable, "-m", "minitransformer", "train", "--task", "copy", "--steps", "150", "--save-every", "10",
         "--eval-every", "1000", "--heldout", "10", "--no-plots", "--no-progress", "--d-model", "16", "--heads", "2",
         "--layers", "1", "--d-ff", "24", "--dropout", "0.1", "--batch-size", "16", "--seed", "4"]


def test_sigkill_mid_run_then_resume_is_bit_identical(tmp_path):
    full, killed = str(tmp_path / "full"), str(tmp_path / "killed")
    subprocess.run(TRAIN + ["--out", full], env=_env(), check=True, capture_output=True, timeout=120)

    proc = subprocess.Popen(TRAIN + ["--out", killed], env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while not os.path.exists(os.path.join(killed, "checkpoint-30.safetensors")) and time.time() < deadline:
        if proc.poll() is not None:
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)                       # no cleanup, no final save
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    step_at_kill = ck.load_checkpoint(os.path.join(killed, "checkpoint.safetensors")).step
    assert 20 <= step_at_kill < 150     # 20 if killed between writing checkpoint-30 and copying it to checkpoint.safetensors

    resumed = subprocess.run(TRAIN + ["--out", killed, "--resume"], env=_env(), capture_output=True, text=True,
                             timeout=120, check=False)
    assert resumed.returncode == 0, resumed.stderr
    a = ck.load_checkpoint(os.path.join(full, "checkpoint.safetensors"))
    b = ck.load_checkpoint(os.path.join(killed, "checkpoint.safetensors"))
    assert a.step == b.step == 150
    assert_same_weights(a.weights, b.weights)
    for name in a.optimizer:
        np.testing.assert_array_equal(a.optimizer[name], b.optimizer[name], err_msg=name)
    assert [h[1] for h in a.extra["trainer"]["history"]] == [h[1] for h in b.extra["trainer"]["history"]]


KILL_DURING_SAVE = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {tests!r})
    from minitransformer.kit.running import checkpoint as ck
    import test_train

    calls = []
    real = ck._write_file

    def write_then_die(f, data):
        calls.append(1)
        if len(calls) == 3:                  # the second save's step file: half of it, then the machine "dies"
            f.write(data[:len(data) // 2])
            f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        real(f, data)

    ck._write_file = write_then_die
    trainer = test_train.make_trainer({out!r}, max_steps=20, save_every=5)
    trainer.fit()
""")


def test_sigkill_during_a_save_leaves_the_previous_checkpoint_loadable(tmp_path):
    out = str(tmp_path / "run")
    script = KILL_DURING_SAVE.format(tests=os.path.join(REPO, "tests"), out=out)
    proc = subprocess.run([sys.executable, "-c", script], env=_env(), capture_output=True, timeout=120, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    names = sorted(os.listdir(out))
    assert any(n.endswith(files.TEMP_SUFFIX) for n in names)          # the half-written file, never renamed
    latest = ck.load_checkpoint(os.path.join(out, "checkpoint.safetensors"))
    assert latest.step == 5
    # a new run in the same folder resumes from it and clears the dead writer's temporary file
    trainer = make_trainer(out, max_steps=7)
    trainer.resume(out)
    trainer.fit()
    assert trainer.step == 7
    assert not any(n.endswith(files.TEMP_SUFFIX) for n in os.listdir(out))


# ------------------------------------------------------------------------------------------ what a run records

def test_validation_loss_weighs_every_target_token_alike():
    """The mean over every non-pad target token of valid_data, not the mean of the batches' means."""
    batches = [TASK.batch(seed=1, epoch=0, index=0, batch_size=2), TASK.batch(seed=1, epoch=0, index=1, batch_size=7)]
    trainer = make_trainer(dropout=0.0, max_steps=1, valid_data=batches)
    trainer.model.eval()
    loss_fn, losses, counts = CrossEntropyLoss(0, 0.1), [], []
    for b in batches:
        losses.append(loss_fn(trainer.model(b.src, b.tgt_in), b.tgt_out))
        counts.append(int((b.tgt_out != 0).sum()))
    expected = float(np.dot(losses, counts) / sum(counts))
    assert counts[0] != counts[1] and abs(expected - np.mean(losses)) > 1e-4      # the two means differ here
    assert trainer.validation_loss() == pytest.approx(expected, rel=1e-12)
    assert trainer.model.training                        # back in training mode


def test_a_long_run_keeps_its_history_within_the_metadata_cap(tmp_path):
    """1.5 million steps, and evaluations every 10: every step's row would take the metadata past the reader's cap;
    the kept rows span the run evenly, the newest rows whole, and the checkpoint writes and reads back."""
    from minitransformer.kit.running import trainer as train
    from minitransformer.kit.limits import MAX_META_BYTES

    steps, every = 1_500_000, 10
    trainer = make_trainer(tmp_path, max_steps=1)
    rng = np.random.default_rng(0)
    losses = rng.uniform(1.0, 9.0, steps)
    for step in range(1, steps + 1):
        train._append_bounded(trainer.history, (step, float(losses[step - 1]), 1e-3 / step ** 0.5, 12345.678 + step))
        if step % every == 0:
            train._append_bounded(trainer.valid_history, (step, float(losses[step - 1]), float("nan")), every)
    recent, cap = train.RECENT_ROWS, train.HISTORY_ROWS + train.RECENT_ROWS
    for rows, spacing in ((trainer.history, 1), (trainer.valid_history, every)):
        kept = [r[0] for r in rows]
        assert cap // 2 < len(rows) <= cap
        assert kept[-recent:] == list(range(steps - spacing * (recent - 1), steps + 1, spacing))   # the newest whole
        (gap,) = set(np.diff(kept[:-recent]))                                             # one stride ...
        assert kept[0] == gap and kept[-recent - 1] > steps - spacing * recent - gap     # ... over the whole run
        assert all(r[1] == losses[r[0] - 1] for r in rows)                                 # rows kept, not changed
    row_bytes = len(json.dumps(trainer.history)) / len(trainer.history)
    assert steps * row_bytes > MAX_META_BYTES                  # every row kept would not fit
    trainer.step = steps
    trainer.save()
    saved = ck.load_checkpoint(os.path.join(tmp_path, ck.LATEST)).extra["trainer"]
    assert saved["history"] == [list(r) for r in trainer.history]
    assert len(json.dumps(saved)) < MAX_META_BYTES // 8


def test_a_thinned_history_is_the_same_after_a_resume(tmp_path, monkeypatch):
    """The thinning reads only the rows and the step: a run stopped and resumed keeps the very rows of one that
    was never stopped (here with a cap of 4 rows and 3 newest, so 23 steps thin it three times)."""
    from minitransformer.kit.running import trainer as train

    monkeypatch.setattr(train, "HISTORY_ROWS", 4)
    monkeypatch.setattr(train, "RECENT_ROWS", 3)
    full = make_trainer(tmp_path / "full", max_steps=23, eval_every=2, metric_fn=lambda model: 0.5)
    full.fit()
    first = make_trainer(tmp_path / "split", max_steps=9, eval_every=2, metric_fn=lambda model: 0.5)
    first.fit()
    second = make_trainer(tmp_path / "split", seed=99, max_steps=23, eval_every=2, metric_fn=lambda model: 0.5)
    second.resume(tmp_path / "split")
    second.fit()
    assert [h[0] for h in full.history] == [8, 16, 21, 22, 23]       # stride 8 by step 23, and the newest 3
    assert [h[:3] for h in second.history] == [h[:3] for h in full.history]     # tokens/s is a timing
    assert [v[0] for v in second.valid_history] == [v[0] for v in full.valid_history] == [8, 16, 20, 22, 23]
    assert_same_weights(weights(second), weights(full))


def test_resume_refuses_a_history_whose_steps_are_not_steps(tmp_path):
    """The thinning divides the rows' steps: a saved row whose step is not a whole count is refused at resume."""
    first = make_trainer(tmp_path, max_steps=3)
    first.fit()
    first.history[0] = (1.5, *first.history[0][1:])
    first.save()
    with pytest.raises(ValueError, match=r"history must be a list of \[4 numbers\] rows, a step first"):
        make_trainer(tmp_path, max_steps=5).resume(tmp_path)
