"""Data parallelism (mt.fast.DataParallel): a step split across worker threads is the whole-batch step.

- the loss and every gradient equal the one model's on the whole batch (float64, dropout 0), for odd batch
  sizes, fewer sentences than workers, uneven padding, both tiers;
- the replicas share the weights (an update is seen by all) and add into the model's .grad as backward does;
- dropout draws depend on the step's seed and the part, never on which thread runs first: the same run with
  one thread and with two is the same, and a run resumes bit for bit;
- the split and the trimming of padding-only columns;
- the Trainer and the command line (--workers, kept by --resume), and the errors that name bad arguments.
"""

import itertools
import json
import os
import threading

import numpy as np
import pytest

import minitransformer as mt
from minitransformer.fast import DataParallel
from minitransformer.fast.parallel import split_points, trim_padding
from minitransformer.kit.cli import main
from minitransformer.kit.data.tasks import SequenceTask, TaskBatches
from minitransformer.kit.running.trainer import Trainer

PAD = 0
REL_TOL = 1e-10         # float64: the same sums taken in another order (seen: ~1e-15)
ON_DEVICE = mt.get_backend() != "numpy"
cpu_only = pytest.mark.skipif(ON_DEVICE, reason="threads and their generators run on the CPU backend only")


def config(dropout=0.0, **changes):
    return mt.TransformerConfig(**{"src_vocab_size": 23, "tgt_vocab_size": 19, "d_model": 16, "num_heads": 2,
                                   "num_encoder_layers": 2, "num_decoder_layers": 2, "d_ff": 24, "dropout": dropout,
                                   "max_len": 40, **changes})


def perturbed(model, seed=7):
    """Every weight moved off its initial value (biases off 0, gamma off 1), so none hides a bug."""
    rng = np.random.default_rng(seed)
    for p in model.parameters():
        p.data += mt.backend.asarray(0.3 * rng.standard_normal(p.data.shape))
    return model


def batch(rng, B, S=9, T=8):
    """Right-padded src (B,S) and tgt_in, tgt_out (B,T) = tgt[:, :-1], tgt[:, 1:], each sentence its own length."""
    src = rng.integers(3, 23, (B, S))
    tgt = rng.integers(3, 19, (B, T + 1))
    for b in range(B):
        src[b, rng.integers(1, S + 1):] = PAD
        tgt[b, rng.integers(2, T + 2):] = PAD
    return src, tgt[:, :-1], tgt[:, 1:]


def whole_batch_step(model, loss_fn, src, tgt_in, tgt_out):
    model.zero_grad()
    loss = loss_fn(model(src, tgt_in), tgt_out)
    model.backward(loss_fn.backward())
    return loss, {name: mt.to_numpy(p.grad).copy() for name, p in model.named_parameters()}


def parallel_step(parallel, src, tgt_in, tgt_out):
    parallel.model.zero_grad()
    loss = parallel.forward(src, tgt_in, tgt_out)
    parallel.backward()
    return loss, {name: mt.to_numpy(p.grad).copy() for name, p in parallel.model.named_parameters()}


def assert_same_step(got, want):
    (loss, grads), (want_loss, want_grads) = got, want
    assert abs(loss - want_loss) <= REL_TOL * abs(want_loss), (loss, want_loss)
    scale = max(np.abs(g).max() for g in want_grads.values())
    for name, g in want_grads.items():
        err = np.abs(grads[name] - g).max()
        assert err <= REL_TOL * scale, f"{name}: max |difference| {err:.3g} (largest gradient {scale:.3g})"


# ============================================================================ the step is the whole-batch step

@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("B", [1, 2, 5, 7])
def test_the_split_step_is_the_whole_batch_step(float64, workers, B):
    """Loss and every gradient, with label smoothing and tied embeddings; B < workers leaves workers idle. The
    parts hold different numbers of tokens, so an unweighted mean of the parts' losses would fail here."""
    rng = np.random.default_rng(B)
    model = perturbed(mt.fast.Transformer(config(share_embeddings=True, tgt_vocab_size=23)))
    loss_fn = mt.fast.CrossEntropyLoss(ignore_index=PAD, label_smoothing=0.1)
    parallel = DataParallel(model, loss_fn, workers=workers)
    for _ in range(2):                                        # the second step reuses the replicas
        src, tgt_in, tgt_out = batch(rng, B)
        tgt_out[0, :] = PAD if B > 1 else tgt_out[0, :]       # a sentence with no target token at all
        want = whole_batch_step(model, loss_fn, src, tgt_in, tgt_out)
        assert_same_step(parallel_step(parallel, src, tgt_in, tgt_out), want)


def test_uneven_padding_and_the_core_tier(float64):
    """The core's model and loss split the same way: one long sentence among short ones (the parts then have
    different widths once their padding-only columns are dropped), pre-LN, learned positions, no tying."""
    rng = np.random.default_rng(5)
    model = perturbed(mt.Transformer(config(norm_first=True, positional="learned", tie_output=False)))
    loss_fn = mt.CrossEntropyLoss(ignore_index=PAD, label_smoothing=0.1)
    src, tgt_in, tgt_out = batch(rng, 6, S=14, T=12)
    src[1:, 4:] = PAD
    tgt_in[1:, 3:] = PAD
    tgt_out[1:, 2:] = PAD
    src[0], tgt_in[0, :] = rng.integers(3, 23, 14), rng.integers(3, 19, 12)
    want = whole_batch_step(model, loss_fn, src, tgt_in, tgt_out)
    assert_same_step(parallel_step(DataParallel(model, loss_fn, workers=2), src, tgt_in, tgt_out), want)


def test_the_replicas_share_the_weights_and_the_grads_add_up(float64):
    """No copies of weights: an in-place update of model's weights (what Adam does) is the replicas' too, and so
    is a weight array replaced by another; the gradient adds into model's .grad (+=, as every backward does)
    and the replicas' grads are left at zero."""
    rng = np.random.default_rng(3)
    model = perturbed(mt.fast.Transformer(config()))
    loss_fn = mt.fast.CrossEntropyLoss(ignore_index=PAD)
    parallel = DataParallel(model, loss_fn, workers=3)
    for replica in parallel.replicas[1:]:
        for p, rp in zip(model.parameters(), replica.parameters()):
            assert rp.data is p.data and rp.grad is not p.grad
    src, tgt_in, tgt_out = batch(rng, 6)
    opt = mt.fast.Adam(model.parameters(), lr=1e-2)
    _, once = parallel_step(parallel, src, tgt_in, tgt_out)
    opt.step()                                                # the weights change in place ...
    want = whole_batch_step(model, loss_fn, src, tgt_in, tgt_out)
    model.zero_grad()
    parallel.forward(src, tgt_in, tgt_out)
    parallel.backward()
    parallel.forward(src, tgt_in, tgt_out)                    # ... every replica sees them; no zero_grad between
    parallel.backward()
    twice = {name: mt.to_numpy(p.grad) for name, p in model.named_parameters()}
    assert_same_step((0.0, twice), (0.0, {name: 2 * g for name, g in want[1].items()}))
    assert not np.allclose(twice["src_embed.weight"], 2 * once["src_embed.weight"])   # the update mattered
    for replica in parallel.replicas[1:]:
        assert all(not mt.to_numpy(p.grad).any() for p in replica.parameters())
    model.src_embed.weight.data = model.src_embed.weight.data * 1.5   # a new array, not an in-place change
    want = whole_batch_step(model, loss_fn, src, tgt_in, tgt_out)
    assert_same_step(parallel_step(parallel, src, tgt_in, tgt_out), want)


def test_a_failing_part_leaves_nothing_behind(float64):
    """An id out of range in one part raises its error; the next step is exactly right (no stale activations
    in a replica, no half-summed gradients)."""
    rng = np.random.default_rng(4)
    model = perturbed(mt.fast.Transformer(config()))
    loss_fn = mt.fast.CrossEntropyLoss(ignore_index=PAD)
    parallel = DataParallel(model, loss_fn, workers=2)
    src, tgt_in, tgt_out = batch(rng, 6)
    bad = src.copy()
    bad[-1, 0] = 99                                           # beyond the source vocabulary, in the last part
    with pytest.raises(ValueError, match="src"):
        parallel.forward(bad, tgt_in, tgt_out)
    with pytest.raises(RuntimeError, match="call forward first"):
        parallel.backward()
    want = whole_batch_step(model, loss_fn, src, tgt_in, tgt_out)
    assert_same_step(parallel_step(parallel, src, tgt_in, tgt_out), want)


# ============================================================================ dropout and threads

@cpu_only
def test_dropout_masks_depend_on_the_seed_and_part_not_on_the_threads(float64):
    """The same step on one thread (parts one after another) and on two (at once) is the same to the bit, and
    the global generator advances by one draw per step whatever the split."""
    rng = np.random.default_rng(6)
    src, tgt_in, tgt_out = batch(rng, 7)
    results = {}
    for threads in (1, 2):
        mt.fast.set_num_threads(threads)
        mt.manual_seed(11)
        model = mt.fast.Transformer(config(dropout=0.3))
        parallel = DataParallel(model, mt.fast.CrossEntropyLoss(ignore_index=PAD), workers=2)
        steps = [parallel_step(parallel, src, tgt_in, tgt_out) for _ in range(2)]
        results[threads] = (steps, mt.backend.device_rng().integers(0, 2 ** 62))
    (steps_1, next_1), (steps_2, next_2) = results[1], results[2]
    assert next_1 == next_2
    for (loss_1, grads_1), (loss_2, grads_2) in zip(steps_1, steps_2):
        assert loss_1 == loss_2
        for name in grads_1:
            np.testing.assert_array_equal(grads_1[name], grads_2[name], err_msg=name)
    assert steps_1[0][0] != steps_1[1][0]                     # dropout is on: each step draws new masks


def test_a_thread_draws_from_its_own_generator_inside_the_block():
    mine = np.random.default_rng(1)
    seen = {}

    def other_thread():
        seen["other"] = mt.backend.device_rng()

    with mt.backend.thread_device_rng(mine):
        assert mt.backend.device_rng() is mine
        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join()
    assert seen["other"] is mt.backend.device_rng() and mt.backend.device_rng() is not mine


# ============================================================================ the split

@pytest.mark.parametrize("costs, parts, want", [
    ([5, 5, 5, 5], 2, [0, 2, 4]),
    ([10, 1, 1, 1, 1, 1, 1], 2, [0, 1, 7]),                   # the first sentence alone weighs as much as the rest
    ([3, 3, 3], 5, [0, 1, 2, 3]),                             # fewer sentences than parts: one each
    ([7], 2, [0, 1]),
    ([2, 2, 2, 2, 2, 2, 2], 3, [0, 2, 5, 7]),
])
def test_split_points_balance_the_tokens(costs, parts, want):
    assert split_points(np.array(costs), parts) == want


def test_split_points_are_contiguous_non_empty_and_near_balanced():
    rng = np.random.default_rng(0)
    for _ in range(200):
        costs = rng.integers(1, 30, size=rng.integers(1, 40))
        parts = int(rng.integers(1, 6))
        bounds = split_points(costs, parts)
        assert bounds[0] == 0 and bounds[-1] == len(costs) and len(bounds) - 1 <= parts
        assert all(a < b for a, b in itertools.pairwise(bounds))
        if len(costs) >= parts:
            sums = [costs[a:b].sum() for a, b in itertools.pairwise(bounds)]
            assert max(sums) - costs.sum() / parts <= costs.max()   # no part over its share by a sentence or more


def test_trim_padding_drops_only_columns_no_one_reads():
    src = np.array([[5, 6, 0, 0], [7, 0, 0, 0]])
    tgt_in = np.array([[1, 8, 2, 0, 0], [1, 9, 0, 0, 0]])     # column 2 holds an EOS the model reads ...
    tgt_out = np.array([[8, 2, 0, 0, 0], [9, 2, 0, 0, 0]])    # ... where the loss reads padding
    s, ti, to = trim_padding(src, tgt_in, tgt_out, PAD)
    assert s.tolist() == [[5, 6], [7, 0]] and ti.shape == to.shape == (2, 3)
    tgt_out[1, 4] = 3                                         # a target token the loss reads, under padded input
    assert trim_padding(src, tgt_in, tgt_out, PAD)[1].shape == (2, 5)


# ============================================================================ the Trainer and the command line

TASK = SequenceTask("copy", num_symbols=6, min_len=2, max_len=6)


def make_trainer(workers, seed=0, dropout=0.1, **kw):
    mt.manual_seed(seed)
    cfg = mt.TransformerConfig(TASK.vocab_size, TASK.vocab_size, d_model=16, num_heads=2, num_encoder_layers=1,
                               num_decoder_layers=1, d_ff=24, dropout=dropout, max_len=16)
    model = mt.fast.Transformer(cfg)
    loss_fn = mt.fast.CrossEntropyLoss(PAD, 0.1)
    opt = mt.fast.Adam(model.parameters(), lr=1e-2)
    parallel = DataParallel(model, loss_fn, workers) if workers > 1 else None
    return Trainer(model, loss_fn, opt, TaskBatches(TASK, batch_size=9, batches_per_epoch=7, seed=3),
                   clip_norm=1.0, progress=False, config=cfg.to_dict(), parallel=parallel, **kw)


def test_the_trainer_with_workers_trains_as_without(float64):
    """Dropout 0: the same losses and weights after several steps (Adam and clipping included)."""
    one, two = make_trainer(1, dropout=0.0, max_steps=6), make_trainer(3, dropout=0.0, max_steps=6)
    one.fit()
    two.fit()
    np.testing.assert_allclose([h[1] for h in two.history], [h[1] for h in one.history], rtol=1e-10)
    for (name, a), b in zip(one.model.state_dict().items(), two.model.state_dict().values()):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-9, err_msg=name)


@cpu_only     # a device generator's state cannot be read back: resuming reseeds it (backend.set_rng_state)
def test_a_run_with_workers_resumes_bit_for_bit(tmp_path):
    full = make_trainer(2, max_steps=9, checkpoint_dir=str(tmp_path / "full"))
    full.fit()
    first = make_trainer(2, max_steps=4, checkpoint_dir=str(tmp_path / "split"))
    first.fit()
    second = make_trainer(2, seed=99, max_steps=9, checkpoint_dir=str(tmp_path / "split"))
    second.resume(str(tmp_path / "split"))
    second.fit()
    assert [h[1] for h in second.history] == [h[1] for h in full.history]
    for name, value in full.model.state_dict().items():
        np.testing.assert_array_equal(second.model.state_dict()[name], value, err_msg=name)


def read_metrics(out):
    with open(os.path.join(out, "metrics.json")) as f:
        return json.load(f)


def test_train_workers_is_a_setting_kept_by_resume(tmp_path, capsys):
    """Saved, kept by --resume, 1 by default with --reference; off the CPU the run uses one (no gain there)."""
    used = 1 if ON_DEVICE else 3
    out = str(tmp_path / "copy")
    base = ["train", "--task", "copy", "--heldout", "5", "--no-plots", "--no-progress", "--out", out,
            "--d-model", "8", "--heads", "2", "--d-ff", "16", "--batch-size", "8"]
    assert main(base + ["--steps", "2", "--workers", "3"]) == 0
    assert ("each running a part of every batch" in capsys.readouterr().out) is not ON_DEVICE
    metrics = read_metrics(out)
    assert metrics["workers"] == used and metrics["settings"]["workers"] == 3
    if metrics["blas_threads_set_by"] == "minitransformer":
        assert metrics["blas_threads"] == 1
    assert main(base + ["--steps", "3", "--resume", "--workers", "1"]) == 0
    assert "continuing with the saved run's settings for workers" in capsys.readouterr().err
    assert read_metrics(out)["workers"] == used
    assert main(base + ["--steps", "1", "--reference", "--out", str(tmp_path / "ref")]) == 0
    assert read_metrics(tmp_path / "ref")["workers"] == 1


def test_train_refuses_a_bad_worker_count(capsys):
    for value in ("0", "-1", "two"):
        with pytest.raises(SystemExit):
            main(["train", "--task", "copy", "--workers", value])
        assert "--workers" in capsys.readouterr().err


# ============================================================================ bad arguments

@pytest.mark.parametrize("workers", [0, -2, 1.5, True, "2", None])
def test_bad_worker_counts_are_named(workers):
    model = mt.fast.Transformer(config())
    with pytest.raises(ValueError, match="DataParallel: workers must be a positive int"):
        DataParallel(model, mt.fast.CrossEntropyLoss(), workers=workers)


def test_bad_models_losses_and_batches_are_named():
    model, loss_fn = mt.fast.Transformer(config()), mt.fast.CrossEntropyLoss()
    with pytest.raises(TypeError, match="DataParallel: model must be a Module"):
        DataParallel(lambda src, tgt: src, loss_fn)
    with pytest.raises(TypeError, match="DataParallel: loss_fn must be a CrossEntropyLoss"):
        DataParallel(model, lambda logits, target: 0.0)
    parallel = DataParallel(model, loss_fn, workers=2)
    src, tgt_in, tgt_out = batch(np.random.default_rng(0), 4)
    with pytest.raises(RuntimeError, match="DataParallel.backward: call forward first"):
        parallel.backward()
    with pytest.raises(ValueError, match="DataParallel.forward: tgt_in must be a 2-D integer array"):
        parallel.forward(src, tgt_in.astype(float), tgt_out)
    with pytest.raises(ValueError, match="DataParallel.forward: src must be a 2-D integer array"):
        parallel.forward(src[0], tgt_in, tgt_out)
    with pytest.raises(ValueError, match=r"src \(B,S\), tgt_in \(B,T\) and tgt_out \(B,T\) must agree"):
        parallel.forward(src[:3], tgt_in, tgt_out)
    with pytest.raises(ValueError, match="at least one sentence"):
        parallel.forward(src[:0], tgt_in[:0], tgt_out[:0])
    other = DataParallel(mt.fast.Transformer(config()), loss_fn)
    with pytest.raises(ValueError, match="Trainer: parallel must be a DataParallel over this trainer's model"):
        Trainer(model, loss_fn, mt.fast.Adam(model.parameters()), [(src, tgt_in, tgt_out)], max_steps=1,
                parallel=other)
