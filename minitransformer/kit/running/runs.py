"""A run of a task as ``minitransformer train`` makes it, for the command line and scripts alike: each tier's
classes, the BLAS threads, the Trainer of a run's settings, the final score and the figures."""

import math
import os
import sys

import numpy

from minitransformer import fast
from minitransformer.fast.threads import NO_BLAS_CONTROL, use_blas_threads
from minitransformer.kit.data.task_data import bleu_of, load_pairs
from minitransformer.kit.data.tasks import TASKS as SEQUENCE_TASKS
from minitransformer.kit.data.tasks import exact_match
from minitransformer.kit.files import atomic_write
from minitransformer.loss import CrossEntropyLoss
from minitransformer.model import Transformer
from minitransformer.optim import Adam, NoamSchedule

from . import checkpoint as ckpt
from .trainer import Trainer


def tier(reference: bool) -> tuple:
    """(Transformer, CrossEntropyLoss, Adam) of the core with ``reference``, else the fast tier's drop-in subclasses."""
    return (Transformer, CrossEntropyLoss, Adam) if reference else (fast.Transformer, fast.CrossEntropyLoss, fast.Adam)


# A model narrower than this gets one BLAS thread: its products are small, a second thread gains nothing on an
# idle machine, and when another process keeps a core busy, two spinning BLAS threads make a step several times
# slower. Wider models (the small and base presets) keep the library's default, one per core.
ONE_BLAS_THREAD_BELOW = 256


def choose_blas_threads(config, workers: int = 1) -> dict:
    """Set the BLAS threads, unless OPENBLAS_NUM_THREADS (or OMP_NUM_THREADS) chose: one with several workers
    (they keep the cores busy), else by the width. -> {"blas_threads": count or None, "blas_threads_set_by": who}"""
    count, why = use_blas_threads(1 if workers > 1 or config.d_model < ONE_BLAS_THREAD_BELOW else None)
    set_by = {"chosen": "minitransformer", "default": "the BLAS default",
              "unknown": "unknown (no BLAS threadpoolctl can set)"}
    return {"blas_threads": count, "blas_threads_set_by": set_by.get(why, why)}


def describe_blas_threads(choice: dict, config, workers: int = 1) -> str:
    """One line for a run's header: the BLAS threads and who chose them."""
    count, set_by = choice["blas_threads"], choice["blas_threads_set_by"]
    if count is None:
        return NO_BLAS_CONTROL
    why = {"minitransformer": f"for each of the {workers} workers (they keep the cores busy already)" if workers > 1
           else f"chosen for d_model {config.d_model} < {ONE_BLAS_THREAD_BELOW} (products this small gain nothing "
                f"from more)", "the BLAS default": "the BLAS default (one per core)"}.get(set_by)
    return f"BLAS threads: {count}, " + (f"{why}; OPENBLAS_NUM_THREADS=N sets another count" if why else
                                         f"from {set_by}")


def build_trainer(settings: dict, data, out, workers: int = 1) -> Trainer:
    """The tier's model, label-smoothed loss and Adam (the paper's betas and eps) under the Noam schedule, in a
    Trainer saving into ``out``; several workers split each batch (``fast.DataParallel``)."""
    config = data.config
    Transformer, CrossEntropyLoss, Adam = tier(bool(settings.get("reference")))
    model = Transformer(config)                                 # refused before it is built if it would not fit
    loss_fn = CrossEntropyLoss(ignore_index=config.pad_id, label_smoothing=settings["label_smoothing"])
    parallel = None if workers <= 1 else fast.DataParallel(model, loss_fn, workers)
    optimizer = Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    scheduler = NoamSchedule(optimizer, config.d_model, warmup=settings["warmup"], factor=settings["lr_factor"])
    return Trainer(
        model, loss_fn, optimizer, data.train_data, scheduler=scheduler, valid_data=data.valid_batches,
        clip_norm=settings["clip_norm"], max_steps=settings.get("steps"), max_epochs=settings.get("epochs"),
        max_seconds=None if settings.get("max_minutes") is None else 60.0 * settings["max_minutes"],
        eval_every=settings["eval_every"], metric_fn=data.metric_fn, target=settings.get("target"),
        checkpoint_dir=out, save_every=settings["save_every"], keep=settings["keep"],
        on_nonfinite=settings["on_nonfinite"], progress=settings["progress"], config=config.to_dict(),
        tokenizers=data.tokenizers(), extra={"task": settings["task"], "settings": settings},
        metric_name=data.metric_name, metric_format=data.format_metric, parallel=parallel)


def average_last(folder: str, n: int, up_to_step: int | None = None) -> tuple:
    """(the last ``n`` step checkpoints of the folder's run, up to ``up_to_step`` if given, as ``last_checkpoints``
    picks them; the mean of their weights, paper §6.1). Fewer are averaged and said on stderr; none is an error."""
    used = ckpt.last_checkpoints(folder, n, up_to_step=up_to_step)
    where = folder if up_to_step is None else f"{folder} up to step {up_to_step}"
    if not used:
        raise FileNotFoundError(f"--average {n}: no step checkpoints in {where}")
    if len(used) < n:
        print(f"--average {n}: only {len(used)} checkpoint(s) in {where}; averaging those", file=sys.stderr)
    return used, ckpt.average_checkpoints(used)


def score(model, task: str, pairs: list, tokenizers: tuple = (None, None), split: str = "test", beam_size: int = 1,
          alpha: float = 0.6, steps: list = (), samples: int = 0) -> tuple:
    """Exact match (copy, reverse: id pairs) or corpus BLEU (toy, multi30k: text pairs; Multi30k's lowercased) of the
    model on ``pairs``, printed in one line naming the decoding and the ``steps`` averaged into the model, after
    ``samples`` translations. -> ({"exact_match": ...} or {"bleu": ..., "lowercase": ...}, the decoding in words)"""
    model.eval()
    method = "greedy" if beam_size == 1 else f"beam {beam_size}, alpha {alpha}"
    averaged = f", average of {len(steps)} checkpoints, steps {steps[0]}-{steps[-1]}" if steps else ""
    if task in SEQUENCE_TASKS:
        exact = exact_match(model, pairs, beam_size=beam_size, alpha=alpha)
        print(f"exact match ({task}, {len(pairs)} held-out sequences, {method}{averaged}): {100 * exact:.1f}%")
        return {"exact_match": exact}, method
    lowercase = task == "multi30k"
    bleu, hyps = bleu_of(model, *tokenizers, pairs, lowercase, beam_size=beam_size, alpha=alpha)
    if samples:
        print(f"sample translations ({split}):")
    for (src, ref), hyp in list(zip(pairs, hyps))[:samples]:
        print(f"  source     {src}\n  reference  {ref}\n  model      {hyp}\n")
    print(f"BLEU ({task} {split}, {len(pairs)} sentences, {method}{averaged}{', lowercased' if lowercase else ''}): "
          f"{bleu:.2f}")
    return {"bleu": bleu, "lowercase": lowercase}, method


def final_score(settings: dict, data, model, out) -> tuple:
    """The ``score`` of the model, or with average N > 1 of its last N step checkpoints' mean loaded into it, on the
    held-out sequences (greedy) or the test set. -> (scores for metrics.json, the source ids of the plots' example)"""
    task, used, sequences = settings["task"], [], settings["task"] in SEQUENCE_TASKS
    if settings["average"] > 1:
        used, weights = average_last(out, settings["average"])
        model.load_state_dict(weights)
    steps = [ckpt.step_of_file(p) for p in used]
    pairs = data.heldout if sequences else load_pairs(task, "test", settings["data_dir"])[: settings["limit"]]
    scores, method = score(model, task, pairs, (data.src_tok, data.tgt_tok), steps=steps, samples=5,
                           beam_size=1 if sequences else settings["beam_size"])
    scores.update({"heldout": len(pairs)} if sequences else {"split": "test", "sentences": len(pairs)})
    scores.update(decoding=method, averaged=max(len(used), 1), averaged_steps=steps)
    if sequences:
        return scores, pairs[0][0]
    # a subordinate clause if there is one: German moves its verb, which the attention plot shows
    return scores, data.src_tok.encode(next((s for s, _ in pairs if {"because", "weil"} & set(s.split())), pairs[0][0]))


def save_figure(fig, path: str) -> None:
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110, bbox_inches="tight"), "plot")


def _finite(rows):
    rows = [(s, v) for s, v in rows if math.isfinite(v)]
    return tuple(numpy.array(rows, float).T) if rows else None              # (steps (n,), values (n,))


PLOT_FILES = ("loss.png", "attention.png", "explain.html")          # what write_plots writes into a run folder


def write_plots(trainer, data, example: list, out: str, task: str) -> list:
    """loss.png (the losses, log scale if all > 0, and the validation metric), attention.png (the cross-attention of
    every head and decoder layer, the last only past 4, on the held-out example of source ids ``example`` and the
    model's greedy output, row t labelled by the token it produces) and explain.html (the viewer's page,
    ``viz.explain``, of the same decoding). -> (path, what it holds) of each file written."""
    from minitransformer.kit.running import viz                # matplotlib, loaded only by what draws

    written = []
    loss_png, attention_png, page = (os.path.join(out, name) for name in PLOT_FILES)
    if trainer.history:
        scale = 100.0 if data.metric_percent else 1.0
        steps, losses = (numpy.array([h[i] for h in trainer.history], dtype=float) for i in (0, 1))   # (n,) each
        valid = _finite([(s, v) for s, v, _ in trainer.valid_history])
        metric = _finite([(s, m * scale) for s, _, m in trainer.valid_history])
        positive = bool((losses > 0).all()) and (valid is None or bool((valid[1] > 0).all()))
        save_figure(viz.loss_curves((steps, losses), valid, title="Training loss", logy=positive, metric=metric,
                                    metric_name=data.metric_name + (" (%)" if scale == 100.0 else "")), loss_png)
        written.append((loss_png, f"training and validation loss, {data.metric_name}"))
    else:                                                      # e.g. a time limit reached before the first step
        print("no training steps: loss.png not written")
    tokenizers = None if data.src_tok is None else (data.src_tok, data.tgt_tok)
    explained = viz.explain(trainer.model, example, tokenizers=tokenizers)
    cross = list(explained.attention("decoder_cross"))                     # per layer (H,T,S)
    save_figure(viz.attention_grid(cross if len(cross) <= 4 else cross[-1], x_labels=explained.data["src"],
                                   y_labels=explained.data["tgt_out"], x_name="key: source token",
                                   title=f"Cross-attention ({task}, a held-out example)",
                                   y_name="query: the token produced at this step"), attention_png)
    written.append((attention_png, "cross-attention of every head on a held-out example"))
    explained.save(page)
    written.append((page, "the same example inside the model: open it in a browser"))
    return written
