"""Training runs for the studies of the paper's choices (Table 3 and the questions around it).

A run here is what ``minitransformer train --task TASK`` would train, with some of its settings changed: the
same data, model, loss, Adam and Noam schedule (``kit.running.runs.build_trainer``), so a study measures the model
the command line trains. What a study then measures of the trained model is here too:

    true_perplexity   exp(mean negative log-likelihood per target token) with no label smoothing: the
                      perplexity of the model's distribution, whatever loss it was trained with
    split_batches     a split's sentence pairs in batches, encoded with a run's tokenisers (its test perplexity)
    test_bleu         greedy BLEU on the task's test split (the toy corpus: 500 sentences)
    token_calibration the confidence of each predicted next token (its probability, teacher forcing) against
                      whether it was right, in bins: the reliability diagram of a label-smoothing study
    run_many          several runs at once, one process per core, each with one BLAS thread
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace

import numpy

import minitransformer as mt
from minitransformer.kit.data.task_data import bleu_of, load_pairs, task_data
from minitransformer.kit.running.runs import build_trainer
from minitransformer.kit.running.settings import task_settings
from minitransformer.kit.running.trainer import unpack_batch

MODEL_FIELDS = ("d_model", "num_heads", "d_ff", "d_k", "d_v", "dropout", "num_encoder_layers", "num_decoder_layers",
                "positional", "norm_first")


def settings_for(task: str, **changes) -> dict:
    """The settings of ``minitransformer train --task TASK`` with ``changes``: a model field (d_model, num_heads,
    d_k, d_v, dropout, positional, ...) changes the model, any other name the run's setting of that name (steps,
    seed, label_smoothing, warmup, lr_factor, ...). No progress bar, no plots, no evaluation during training."""
    settings = task_settings(task)
    settings.update(progress=False, plots=False, eval_every=None, save_every=None, target=None)
    for name, value in changes.items():
        if name in MODEL_FIELDS:
            settings["model"][name] = value
        elif name in settings:
            settings[name] = value
        else:
            raise ValueError(f"settings_for: unknown setting {name!r} (a model field or a setting of `train`)")
    if "layers" in changes:
        raise ValueError("settings_for: give num_encoder_layers and num_decoder_layers, not layers")
    return settings


def train(settings: dict, data=None, out=None):
    """Train one run to its step limit. data: the task's TaskData (default: the command line's for the task);
    out: a folder for its checkpoints (settings save_every and keep), or None. -> (trainer, data)."""
    mt.backend.manual_seed(settings["seed"])
    if data is None:
        with contextlib.redirect_stdout(io.StringIO()):       # "building vocabularies ..."
            data = task_data(settings)
    data = replace(data, metric_fn=None)                      # BLEU is measured once, after training
    trainer = build_trainer(settings, data, out)
    trainer.fit()
    trainer.model.eval()
    return trainer, data


def true_perplexity(model, batches, pad_id: int = 0) -> float:
    """exp of the mean cross-entropy per non-pad target token, without label smoothing, in eval mode."""
    loss_fn = mt.CrossEntropyLoss(ignore_index=pad_id)
    total, count = 0.0, 0
    for batch in batches:
        src, tgt_in, tgt_out, _ = unpack_batch(batch, pad_id)
        loss = loss_fn(model(src, tgt_in), tgt_out)
        total += loss * loss_fn.num_tokens
        count += loss_fn.num_tokens
    return float(numpy.exp(total / count))


def split_batches(task: str, split: str, src_tok, tgt_tok, data_dir=None, max_tokens: int = 4096,
                  limit: int | None = None) -> list:
    """The (first ``limit``) pairs of a translation task's split, encoded with these tokenisers and batched in
    order (a pair the model cannot hold is left out, as in training): what ``true_perplexity`` reads."""
    from minitransformer.kit.data.batching import BucketBatcher
    from minitransformer.kit.data.task_data import TRANSLATION_MAX_LEN, encode_pairs

    ids = encode_pairs(load_pairs(task, split, data_dir)[:limit], src_tok, tgt_tok, TRANSLATION_MAX_LEN - 1)
    batcher = BucketBatcher(ids, max_tokens=max_tokens, shuffle=False)
    return [batcher.batch(ix) for ix in batcher.batches_for_epoch(0)]


def test_bleu(model, data, task: str = "toy", split: str = "test") -> float:
    """Greedy corpus BLEU of the model on the task's ``split``."""
    pairs = load_pairs(task, split)
    return float(bleu_of(model, data.src_tok, data.tgt_tok, pairs, lowercase=task == "multi30k")[0])


def token_calibration(model, batches, pad_id: int = 0, bins: int = 10) -> dict:
    """Reliability of the next-token predictions under teacher forcing. For every non-pad target position:
    the confidence p(argmax) and whether the argmax is the reference token. -> per bin of confidence
    (``bins`` equal widths of [0, 1]): count, mean confidence, accuracy; and the expected calibration error
    ECE = sum_b n_b / n * |accuracy_b - confidence_b|, the token accuracy and the mean confidence."""
    confidences, correct = [], []
    for batch in batches:
        src, tgt_in, tgt_out, _ = unpack_batch(batch, pad_id)
        logits = mt.backend.to_numpy(model(src, tgt_in)).astype(numpy.float64)     # (B,T,V)
        probs = numpy.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        keep = numpy.asarray(tgt_out) != pad_id                                         # (B,T)
        confidences.append(probs.max(-1)[keep])
        correct.append((probs.argmax(-1) == numpy.asarray(tgt_out))[keep])
    conf, hit = numpy.concatenate(confidences), numpy.concatenate(correct)
    which = numpy.minimum((conf * bins).astype(int), bins - 1)
    count = numpy.bincount(which, minlength=bins)
    with numpy.errstate(invalid="ignore"):
        mean_conf = numpy.bincount(which, weights=conf, minlength=bins) / count
        accuracy = numpy.bincount(which, weights=hit, minlength=bins) / count
    filled = count > 0
    ece = float(numpy.sum(count[filled] / conf.size * numpy.abs(accuracy[filled] - mean_conf[filled])))
    return {"count": count.tolist(), "confidence": numpy.where(filled, mean_conf, numpy.nan).tolist(),
            "accuracy": numpy.where(filled, accuracy, numpy.nan).tolist(), "ece": ece,
            "token_accuracy": float(hit.mean()), "mean_confidence": float(conf.mean())}


def _one_blas_thread() -> None:
    # a worker process of run_many: its runs share the machine with the other worker, one core each
    from minitransformer.fast.threads import set_blas_threads, set_num_threads

    set_blas_threads(1)
    set_num_threads(1)


def run_many(fn, jobs: list, progress=None, workers: int | None = None) -> list:
    """[fn(job) for job in jobs], computed in ``workers`` processes (default: the cores this process may use),
    each job in a process of its own choosing; ``progress`` (a bar) is advanced as each one finishes. The
    results come back in the order of ``jobs`` whatever order they finish in. With one worker (or one job),
    everything runs here, in this process."""
    workers = workers or len(os.sched_getaffinity(0))
    results = [None] * len(jobs)
    if workers == 1 or len(jobs) == 1:
        for k, job in enumerate(jobs):
            results[k] = fn(job)
            if progress is not None:
                progress.update(1)
        return results
    # spawn, not fork: a forked child would inherit this process's thread pools half-way through their work
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_one_blas_thread) as pool:
        futures = {pool.submit(fn, job): k for k, job in enumerate(jobs)}
        for future in as_completed(futures):
            results[futures[future]] = future.result()
            if progress is not None:
                progress.update(1)
    return results


def timed(fn, *args, **kwargs):
    """(fn(*args, **kwargs), its wall-clock seconds)."""
    started = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - started
