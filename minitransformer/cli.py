"""The command line: ``minitransformer train | translate | evaluate | gradcheck | download``.

    minitransformer train --task copy --out runs/copy          # seconds; 100% exact match
    minitransformer train --task toy --out runs/toy            # minutes; English -> German, BLEU
    minitransformer translate --checkpoint runs/toy "the dog sees the cat ."
    minitransformer evaluate --checkpoint runs/toy --split test --beam-size 4
    minitransformer gradcheck                                  # every layer's finite-difference check
    minitransformer download --dir data/multi30k

``python -m minitransformer ...`` is the same. ``train`` writes into --out: metrics.json, checkpoint.npz
(plus checkpoint-<step>.npz, the last few), loss.png and attention.png. ``--resume`` continues a run
killed or stopped earlier from its checkpoint (the newest checkpoint-<step>.npz if checkpoint.npz is gone),
step for step with exactly the numbers the uninterrupted run would have (a time limit counts from the
resume), and with the run's own settings except the
stop/report options typed on its command line. A fresh run refuses an --out that holds a file it would
write (checkpoints, metrics.json, plots); ``--overwrite`` removes the earlier run's files instead, once the
new run's config, data and model are built.

Timing note: on a small model, a multi-threaded BLAS competing with other processes for the cores can be
many times slower than one thread; ``OPENBLAS_NUM_THREADS=1 minitransformer train ...`` avoids that.

Errors in what the user typed (unknown task, a missing checkpoint, a damaged file) give a one-line message
and exit code 2, never a traceback; set MINITRANSFORMER_TRACEBACK=1 to see one anyway.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy

from . import backend

TASKS = ("copy", "reverse", "toy", "multi30k")
PRESETS = ("tiny", "small", "base")

# Defaults per task, tuned on a 2-core CPU (see the benchmarks). "model" overrides the preset's sizes when
# no --preset is given. Every value can be changed on the command line.
# copy and reverse: one encoder and one decoder layer of width 32 learn them fastest on a CPU (measured:
# 100% exact match after 900-1500 steps for copy, 3400-4000 for reverse; 2+2 layers need more steps, each slower).
_SYMBOL_MODEL = {"d_model": 32, "num_heads": 2, "d_ff": 64, "dropout": 0.0, "num_encoder_layers": 1,
                 "num_decoder_layers": 1}
TASK_DEFAULTS = {
    "copy": {"preset": "tiny", "model": _SYMBOL_MODEL,
             "batch_size": 64, "steps": 3000, "lr_factor": 0.5, "warmup": 50, "clip_norm": 1.0,
             "label_smoothing": 0.0, "eval_every": 100, "save_every": 500, "target": 1.0},
    "reverse": {"preset": "tiny", "model": _SYMBOL_MODEL,
                "batch_size": 64, "steps": 10000, "lr_factor": 0.5, "warmup": 50, "clip_norm": 1.0,
                "label_smoothing": 0.0, "eval_every": 200, "save_every": 1000, "target": 1.0},
    "toy": {"preset": "tiny", "model": {"dropout": 0.1},
            "max_tokens": 2000, "steps": 3000, "lr_factor": 1.0, "warmup": 200, "clip_norm": 1.0,
            "label_smoothing": 0.1, "eval_every": 250, "save_every": 250, "target": 99.0},
    "multi30k": {"preset": "small", "model": {},
                 # measured (README): test BLEU 36.0-38.2 greedy, 36.9-38.5 beam 4 in three 85-minute runs on a Zen 4
                 # (about 2000 steps); 31.4 greedy, 32.3 beam 4 on a slower Zen 3 (1422 steps)
                 "max_tokens": 4000, "epochs": 20, "steps": None, "lr_factor": 0.8, "warmup": 800, "clip_norm": 1.0,
                 "label_smoothing": 0.1, "eval_every": 500, "save_every": 1000, "target": None, "vocab_size": 8000,
                 "max_minutes": 85.0},
}
# The model options of `train` and the TransformerConfig field each one sets (--layers: both stacks).
_MODEL_OPTIONS = {"dropout": "dropout", "d_model": "d_model", "heads": "num_heads", "layers": "num_encoder_layers",
                  "d_ff": "d_ff"}

# What --resume may change: when and how the run stops and reports, never what it computes.
RESUMABLE_OVERRIDES = ("steps", "epochs", "max_minutes", "eval_every", "save_every", "keep", "target",
                       "progress", "plots", "heldout", "beam_size", "on_nonfinite", "limit")


class CLIError(Exception):
    """A mistake in what the user asked for: printed as one line, exit code 2."""


# ============================================================================ argument parsing

def _argument_type(convert, accept, expected: str):
    """An argparse ``type``: the text converted by `convert` (int or float) if accept(value), else an error
    saying what was expected and what came (argparse prints it with the usage line)."""
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not accept(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value
    return parse


_positive_int = _argument_type(int, lambda v: v >= 1, "a positive integer")
_non_negative_int = _argument_type(int, lambda v: v >= 0, "a non-negative integer")
_positive_float = _argument_type(float, lambda v: 0 < v < math.inf, "a positive number")
_probability = _argument_type(float, lambda v: 0.0 <= v < 1.0, "a number in [0, 1)")
_non_negative_float = _argument_type(float, lambda v: 0 <= v < math.inf, "a number >= 0")
_float = _argument_type(float, math.isfinite, "a finite number")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="minitransformer",
        description="The Transformer of 'Attention Is All You Need' in NumPy: train, translate, evaluate, check.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    t = sub.add_parser("train", help="train a model on a task and write metrics, checkpoint and plots",
                       description="Train from scratch (or --resume) and write DIR/metrics.json, DIR/checkpoint.npz, "
                                   "DIR/loss.png and DIR/attention.png. Unset options take the task's defaults.")
    t.add_argument("--task", required=True, choices=TASKS, help="what to learn")
    t.add_argument("--preset", choices=PRESETS, help="model size (default: the task's tuned size)")
    t.add_argument("--out", default=None, help="output folder (default: runs/<task>)")
    t.add_argument("--seed", type=_non_negative_int, default=None, help="random seed (default 0)")
    stop = t.add_mutually_exclusive_group()
    stop.add_argument("--steps", type=_positive_int, help="stop after this many optimiser steps")
    stop.add_argument("--epochs", type=_positive_int, help="stop after this many epochs")
    t.add_argument("--max-minutes", type=_positive_float, help="stop after this much time (minutes)")
    t.add_argument("--target", type=_float, help="stop early when the validation metric reaches this "
                                                 "(exact match in [0, 1], or BLEU)")
    t.add_argument("--batch-size", type=_positive_int, help="sequences per batch (copy, reverse)")
    t.add_argument("--max-tokens", type=_positive_int, help="token budget per batch and side (toy, multi30k)")
    t.add_argument("--lr-factor", type=_positive_float, help="factor of the Noam learning-rate schedule")
    t.add_argument("--warmup", type=_positive_int, help="warmup steps of the Noam schedule")
    t.add_argument("--label-smoothing", type=_probability, help="label smoothing epsilon (paper: 0.1)")
    t.add_argument("--clip-norm", type=_positive_float, help="clip the gradient norm to this")
    t.add_argument("--dropout", type=_probability, help="dropout rate (overrides the preset)")
    t.add_argument("--d-model", type=_positive_int, help="model width (overrides the preset)")
    t.add_argument("--heads", type=_positive_int, help="attention heads (overrides the preset)")
    t.add_argument("--layers", type=_positive_int, help="encoder and decoder layers each (overrides the preset)")
    t.add_argument("--d-ff", type=_positive_int, help="feed-forward width (overrides the preset)")
    t.add_argument("--vocab-size", type=_positive_int, help="BPE vocabulary size (multi30k)")
    t.add_argument("--eval-every", type=_positive_int, help="evaluate every so many steps")
    t.add_argument("--save-every", type=_positive_int, help="save a checkpoint every so many steps")
    t.add_argument("--keep", type=_positive_int, default=None, help="checkpoints to keep (default 5)")
    t.add_argument("--heldout", type=_positive_int, help="held-out sequences for exact match (copy, reverse; "
                                                         "default 1000)")
    t.add_argument("--beam-size", type=_positive_int, help="beam size of the final test evaluation "
                                                           "(toy, multi30k; default 1: greedy)")
    t.add_argument("--limit", type=_positive_int, help="score only the first N test sentences and the first "
                                                       "min(N, 200) valid sentences (toy, multi30k; default: "
                                                       "200 valid, all test)")
    t.add_argument("--data-dir", help="folder with the Multi30k files (default: see `download`)")
    t.add_argument("--on-nonfinite", choices=("stop", "skip"), help="at a NaN/inf loss: stop (default) or skip "
                                                                     "the step")
    continue_or_restart = t.add_mutually_exclusive_group()
    continue_or_restart.add_argument("--resume", action="store_true",
                                     help="continue the run saved in --out, with its own settings except the "
                                          "stop/report options given here")
    continue_or_restart.add_argument("--overwrite", action="store_true",
                                     help="start over in an --out that holds an earlier run: deletes its "
                                          "checkpoints, metrics.json, plots and eval-<split>.json once the new "
                                          "run is ready to train")
    t.add_argument("--no-progress", dest="progress", action="store_false", default=None,
                   help="no progress bar")
    t.add_argument("--no-plots", dest="plots", action="store_false", default=None, help="write no PNG files")

    tr = sub.add_parser("translate", help="translate sentences with a trained checkpoint",
                        description="Translate the sentences given, or else every line of standard input "
                                    "(one output line per input line).")
    tr.add_argument("--checkpoint", required=True, help="a run folder or a checkpoint .npz file")
    tr.add_argument("sentences", nargs="*", help="sentences to translate (default: read stdin)")
    tr.add_argument("--beam-size", type=_positive_int, default=1, help="beam size (default 1: greedy)")
    tr.add_argument("--alpha", type=_non_negative_float, default=0.6,
                    help="length penalty of beam search (default 0.6)")

    ev = sub.add_parser("evaluate", help="BLEU (or exact match) of a checkpoint on a data split")
    ev.add_argument("--checkpoint", required=True, help="a run folder or a checkpoint .npz file")
    ev.add_argument("--split", default="test", choices=("train", "valid", "test"),
                    help="data split (default test; a copy/reverse checkpoint is scored on its held-out sequences)")
    ev.add_argument("--beam-size", type=_positive_int, default=1, help="beam size (default 1: greedy)")
    ev.add_argument("--alpha", type=_non_negative_float, default=0.6,
                    help="length penalty of beam search (default 0.6)")
    ev.add_argument("--average", type=_positive_int, default=None,
                    help="average the weights of N saved checkpoint-<step>.npz files (paper §6.1): the N ending at "
                         "--checkpoint's step if it names a step file, else the newest N")
    ev.add_argument("--data-dir", help="folder with the Multi30k files")
    ev.add_argument("--json", dest="json_path", help="write the result here (default: <run>/eval-<split>.json)")
    ev.add_argument("--limit", type=_positive_int, help="evaluate only the first N sentences")

    gc = sub.add_parser("gradcheck", help="finite-difference check of every layer's backward (float64)")
    gc.add_argument("--max-entries", type=_positive_int, default=30,
                    help="entries checked per tensor, at random (default 30)")
    gc.add_argument("--seed", type=_non_negative_int, default=0)
    gc.add_argument("--verbose", action="store_true", help="print every tensor's row, not only each layer's")

    dl = sub.add_parser("download", help="fetch the Multi30k task-1 files")
    dl.add_argument("--dir", default=None, help="where to put them (default: see datasets.multi30k_dir)")
    return parser


# ============================================================================ tasks and models

def _settings(args) -> dict:
    """The task's defaults, overridden by every option given on the command line."""
    d = TASK_DEFAULTS[args.task]
    s = {k: v for k, v in d.items() if k != "model"}
    s.update(task=args.task, seed=0, epochs=d.get("epochs"), max_minutes=d.get("max_minutes"), keep=5,
             heldout=1000, beam_size=1, on_nonfinite="stop", progress=True, plots=True, preset=d["preset"],
             model=dict(d["model"]), data_dir=None, limit=None)
    if args.preset is not None:
        s["preset"], s["model"] = args.preset, {}
    for key in ("seed", "max_minutes", "target", "batch_size", "max_tokens", "lr_factor", "warmup", "label_smoothing",
                "clip_norm", "vocab_size", "eval_every", "save_every", "keep", "heldout", "beam_size", "data_dir",
                "on_nonfinite", "progress", "plots", "limit"):
        value = getattr(args, key, None)
        if value is not None:
            s[key] = value
    if args.steps is not None:
        s["steps"], s["epochs"] = args.steps, None
    if args.epochs is not None:
        s["epochs"], s["steps"] = args.epochs, None
    for option, field in _MODEL_OPTIONS.items():
        value = getattr(args, option)
        if value is not None:
            s["model"][field] = value
    if args.layers is not None:
        s["model"]["num_decoder_layers"] = args.layers            # --layers sets both stacks
    return s


def _make_config(settings: dict, src_vocab: int, tgt_vocab: int, **extra):
    from .model import TransformerConfig

    return TransformerConfig.preset(settings["preset"], src_vocab_size=src_vocab, tgt_vocab_size=tgt_vocab,
                                    **{**settings["model"], **extra})


def _sequence_task(settings: dict):
    from .tasks import SequenceTask

    return SequenceTask(settings["task"])


def _load_pairs(task: str, split: str, data_dir=None) -> list:
    """(source text, target text) pairs of a translation task's split."""
    from . import datasets

    if task == "toy":
        return datasets.load_toy(split)
    return datasets.load_multi30k(data_dir, split)


def _encode_pairs(pairs, src_tok, tgt_tok, max_len: int) -> list:
    """Token id pairs. A pair is dropped when either side is empty, its source is longer than max_len, or its
    target is max_len or longer (the decoder reads it with <bos> in front, and predicts <eos> after it)."""
    out = []
    for src, tgt in pairs:
        s, t = src_tok.encode(src), tgt_tok.encode(tgt)
        if 0 < len(s) <= max_len and 0 < len(t) < max_len:
            out.append((s, t))
    return out


def _build_tokenizers(task: str, settings: dict, train_pairs: list):
    from .tokenizers import BPETokenizer, WordTokenizer

    if task == "toy":
        return (WordTokenizer.build([s for s, _ in train_pairs]), WordTokenizer.build([t for _, t in train_pairs]))
    texts = [s for s, _ in train_pairs] + [t for _, t in train_pairs]
    shared = BPETokenizer.learn(texts, vocab_size=settings["vocab_size"], lowercase=True)
    return shared, shared


def _tokenizers_from_checkpoint(ck):
    from .tokenizers import tokenizer_from_json

    if not ck.tokenizers:
        return None, None
    return tokenizer_from_json(ck.tokenizers["src"]), tokenizer_from_json(ck.tokenizers["tgt"])


def _model_from_checkpoint(ck, weights=None):
    from .model import Transformer, TransformerConfig

    if ck.config is None:
        raise CLIError(f"checkpoint {ck.path} holds no model config")
    model = Transformer(TransformerConfig.from_dict(ck.config))
    model.load_state_dict(ck.weights if weights is None else weights)
    model.eval()
    return model


# ============================================================================ metrics

def translate_texts(model, src_tok, tgt_tok, texts, beam_size: int = 1, alpha: float = 0.6,
                    batch_size: int = 100) -> list:
    """Translate sentences (batched, sorted by length); returns the detokenised outputs in input order."""
    from .decoding import beam_search, greedy_decode

    c = model.config
    from .tokenizers import UNK

    encoded = [src_tok.encode(text)[: c.max_len] or [UNK] for text in texts]  # an empty line still needs a token
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    out = [None] * len(encoded)
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        src = numpy.full((len(idx), max(len(encoded[i]) for i in idx)), c.pad_id, dtype=numpy.int64)  # (B,S)
        for row, i in enumerate(idx):
            src[row, :len(encoded[i])] = encoded[i]
        if beam_size > 1:
            hyps = beam_search(model, src, beam_size=beam_size, alpha=alpha)
        else:
            hyps = greedy_decode(model, src)
        for i, h in zip(idx, hyps):
            out[i] = tgt_tok.decode(h)
    return out


def bleu_of(model, src_tok, tgt_tok, pairs, lowercase: bool, beam_size: int = 1, alpha: float = 0.6) -> tuple:
    from .bleu import corpus_bleu

    hyps = translate_texts(model, src_tok, tgt_tok, [s for s, _ in pairs], beam_size=beam_size, alpha=alpha)
    return corpus_bleu(hyps, [t for _, t in pairs], lowercase=lowercase), hyps


# ============================================================================ plots

def _save_figure(fig, path: str) -> None:
    fig.savefig(path, dpi=110, bbox_inches="tight")


def _plot_loss(trainer, path: str) -> None:
    from . import viz

    steps = numpy.array([h[0] for h in trainer.history], dtype=float)       # (n,)
    losses = numpy.array([h[1] for h in trainer.history], dtype=float)      # (n,)
    valid = [(s, v) for s, v, _ in trainer.valid_history if math.isfinite(v)]
    valid_series = None
    if valid:
        valid_series = (numpy.array([s for s, _ in valid], dtype=float), numpy.array([v for _, v in valid]))
    positive = bool((losses > 0).all()) and (valid_series is None or bool((valid_series[1] > 0).all()))
    _save_figure(viz.loss_curves((steps, losses), valid_series, title="Training loss", logy=positive), path)


def _plot_attention(model, src_ids, src_labels, tgt_label_fn, path: str, title: str) -> None:
    """Cross-attention of every head, in every decoder layer (only the last when there are more than 4), for one
    source sentence and the model's own output."""
    from . import viz
    from .decoding import greedy_decode

    c = model.config
    model.eval()
    src = numpy.asarray([src_ids], dtype=numpy.int64)                        # (1,S)
    hyp = greedy_decode(model, src)[0]
    tgt_in = numpy.asarray([[c.bos_id] + hyp], dtype=numpy.int64)            # (1,T)
    model(src, tgt_in)
    cross = [a[0] for a in model.attention_maps()["decoder_cross"]]          # per layer (H,T,S)
    if len(cross) > 4:
        cross = cross[-1]
    y_labels = [tgt_label_fn(i) for i in hyp] + ["<eos>"]
    _save_figure(viz.attention_grid(cross, x_labels=src_labels, y_labels=y_labels, title=title), path)


# ============================================================================ train

# The files `train` writes into --out besides the checkpoints, and those `evaluate` writes there by default.
# --overwrite removes exactly these names (and the checkpoints), never another file of the folder.
PLOT_FILES = ("loss.png", "attention.png")
EVAL_FILES = tuple(f"eval-{split}.json" for split in ("train", "valid", "test", "heldout"))

# Options that only switch something off for this command (there is no flag to switch them back on), so a
# resumed run takes them from this command line, never from the saved run.
THIS_COMMAND_ONLY = ("progress", "plots")


def _typed_options(args) -> set:
    """The `train` options given on this command line. Each one's argparse default is None, so an option that
    is not None was typed (unlike the values of `_settings`, which fill in the task's defaults)."""
    not_settings = ("command", "task", "out", "resume", "overwrite", "data_dir")
    return {name for name, value in vars(args).items() if value is not None and name not in not_settings}


def _resumed_settings(args, settings: dict, resume_from) -> dict:
    """The saved run's settings, with the RESUMABLE_OVERRIDES the user typed on this command line.

    Only typed options count: `settings` also holds the task's defaults, and those must not replace what
    the run was started with (a plain --resume of a 6-step run once trained on to the default 3000).
    """
    saved = resume_from.extra.get("settings")
    if saved is None or saved.get("task") != args.task:
        raise CLIError(f"--resume: {resume_from.path} is not a checkpoint of a `train --task {args.task}` run")
    typed = _typed_options(args)
    overrides = {k: settings[k] for k in RESUMABLE_OVERRIDES if k in typed and k not in THIS_COMMAND_ONLY}
    if "steps" in typed or "epochs" in typed:            # one replaces the other (they are exclusive options)
        overrides["steps"], overrides["epochs"] = settings["steps"], settings["epochs"]
    changed = [f"{k} {saved.get(k)} -> {v}" for k, v in overrides.items() if saved.get(k) != v]
    if changed:
        print(f"--resume: overriding the saved run's {', '.join(changed)}", file=sys.stderr)

    saved_config = resume_from.config or {}
    ignored = []
    for option in sorted(typed - set(RESUMABLE_OVERRIDES)):
        if option in _MODEL_OPTIONS:
            field = _MODEL_OPTIONS[option]
            differs = settings["model"].get(field) != saved_config.get(field)
        else:
            differs = settings.get(option) != saved.get(option)
        if differs:
            ignored.append(option)
    if ignored:
        print(f"--resume: continuing with the saved run's settings for {', '.join(ignored)}", file=sys.stderr)
    return {**saved, **overrides, **{k: settings[k] for k in THIS_COMMAND_ONLY},
            "data_dir": settings["data_dir"] or saved.get("data_dir")}


def _refuse_an_earlier_run(out: str, plots: bool) -> None:
    """A fresh run (no --overwrite) must not write over anything in --out: refuse if a file it would write
    is there already (another run's, or the user's own), naming it and what to do instead."""
    from . import checkpoint as ckpt

    checkpoints = ckpt.checkpoint_files(out)
    if checkpoints:
        raise CLIError(f"{out} already holds the checkpoints of a run ({os.path.basename(checkpoints[-1])} ...): "
                       f"continue it with --resume, start over with --overwrite, or choose another --out")
    would_write = ["metrics.json", *(PLOT_FILES if plots else ())]
    present = [name for name in would_write if os.path.lexists(os.path.join(out, name))]
    if present:
        raise CLIError(f"{out} already holds {', '.join(present)}, which this run would overwrite: start over "
                       f"with --overwrite (removes {'it' if len(present) == 1 else 'them'}), or choose another --out")


def _remove_earlier_run(out: str) -> list:
    """--overwrite: delete what an earlier run (and `evaluate`) wrote in --out, so that none of it sits beside
    the new run as if it were the new run's. Only those names: any other file of the folder stays. -> names."""
    from . import checkpoint as ckpt

    names = [os.path.basename(p) for p in ckpt.checkpoint_files(out)]
    names += [n for n in ("metrics.json", *PLOT_FILES, *EVAL_FILES) if os.path.lexists(os.path.join(out, n))]
    for name in names:
        os.remove(os.path.join(out, name))
    return names


def _make_out_folder(out: str) -> None:
    """Create --out (and its parents), or say clearly why it cannot be the run's folder."""
    if os.path.lexists(out) and not os.path.isdir(out):
        raise CLIError(f"--out {out} is a file, not a folder: choose a folder for the run's files")
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as err:
        raise CLIError(f"--out {out}: cannot create the folder ({err.strerror or err})") from None


def cmd_train(args) -> int:
    from . import checkpoint as ckpt
    from .loss import CrossEntropyLoss
    from .model import Transformer
    from .optim import Adam, NoamSchedule
    from .train import Trainer

    settings = _settings(args)
    out = args.out or os.path.join("runs", args.task)
    _make_out_folder(out)                                  # first: every later message may name files in it
    resume_from = None
    if args.resume:
        resume_path = ckpt.latest_checkpoint(out)
        if resume_path is not None:
            if ckpt.step_of_file(resume_path) is not None:      # checkpoint.npz is missing
                print(f"--resume: {os.path.join(out, ckpt.LATEST)} does not exist: continuing from the newest "
                      f"step checkpoint, {resume_path}", file=sys.stderr)
            resume_from = ckpt.load_checkpoint(resume_path)
            settings = _resumed_settings(args, settings, resume_from)
    fresh = resume_from is None
    if fresh and not args.overwrite:
        _refuse_an_earlier_run(out, settings["plots"])
    if fresh and args.resume:
        print(f"--resume: no checkpoint in {out} yet: starting from scratch", file=sys.stderr)
    task = settings["task"]
    backend.manual_seed(settings["seed"])
    wall_start = time.perf_counter()

    # -- data and model -----------------------------------------------------------------------------
    tokenizers = {}
    if task in ("copy", "reverse"):
        from .tasks import TaskBatches, exact_match, heldout_batches

        seq = _sequence_task(settings)
        config = _make_config(settings, seq.vocab_size, seq.vocab_size, max_len=max(64, seq.max_len + 2))
        train_data = TaskBatches(seq, batch_size=settings["batch_size"], seed=settings["seed"])
        heldout = seq.heldout(settings["heldout"])
        valid_batches = heldout_batches(heldout)

        def metric_fn(model):
            return exact_match(model, heldout)
    else:
        from .batching import BucketBatcher

        train_text = _load_pairs(task, "train", settings["data_dir"])
        valid_text = _load_pairs(task, "valid", settings["data_dir"])
        if resume_from is not None:
            src_tok, tgt_tok = _tokenizers_from_checkpoint(resume_from)
        else:
            print(f"building vocabularies from {len(train_text)} training pairs ...")
            src_tok, tgt_tok = _build_tokenizers(task, settings, train_text)
        tokenizers = {"src": src_tok.to_json(), "tgt": tgt_tok.to_json()}
        max_len = 256
        config = _make_config(settings, src_tok.vocab_size, tgt_tok.vocab_size, max_len=max_len,
                              share_embeddings=src_tok is tgt_tok or task == "multi30k")
        train_ids = _encode_pairs(train_text, src_tok, tgt_tok, max_len - 1)
        valid_ids = _encode_pairs(valid_text, src_tok, tgt_tok, max_len - 1)
        train_data = BucketBatcher(train_ids, max_tokens=settings["max_tokens"], seed=settings["seed"])
        valid_batcher = BucketBatcher(valid_ids, max_tokens=settings["max_tokens"], shuffle=False)
        valid_batches = [valid_batcher.batch(ix) for ix in valid_batcher.batches_for_epoch(0)]
        lowercase = task == "multi30k"
        eval_pairs = valid_text[:min(200, settings["limit"] or 200)]

        def metric_fn(model):
            return bleu_of(model, src_tok, tgt_tok, eval_pairs, lowercase)[0]

    model = Transformer(config)
    loss_fn = CrossEntropyLoss(ignore_index=config.pad_id, label_smoothing=settings["label_smoothing"])
    optimizer = Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    scheduler = NoamSchedule(optimizer, config.d_model, warmup=settings["warmup"], factor=settings["lr_factor"])
    trainer = Trainer(
        model, loss_fn, optimizer, train_data, scheduler=scheduler, valid_data=valid_batches,
        clip_norm=settings["clip_norm"], max_steps=settings.get("steps"), max_epochs=settings.get("epochs"),
        max_seconds=None if settings.get("max_minutes") is None else 60.0 * settings["max_minutes"],
        eval_every=settings["eval_every"], metric_fn=metric_fn, target=settings.get("target"),
        checkpoint_dir=out, save_every=settings["save_every"], keep=settings["keep"],
        on_nonfinite=settings["on_nonfinite"], progress=settings["progress"], config=config.to_dict(),
        tokenizers=tokenizers, extra={"task": task, "settings": settings})
    if resume_from is not None:
        trainer.resume(resume_from.path)
        print(f"resumed {out} at step {trainer.step} (epoch {train_data.epoch}, "
                         f"batch {train_data.position})")
    elif args.overwrite:
        # Only now, with the config, data and model built: a mistake in any of them leaves the old run whole.
        removed = _remove_earlier_run(out)
        if removed:
            print(f"--overwrite: removed the earlier run's {', '.join(removed)} from {out}", file=sys.stderr)
    print(f"training {task}: {model.num_parameters():,} parameters, d_model={config.d_model}, "
                     f"heads={config.num_heads}, layers={config.num_encoder_layers}+{config.num_decoder_layers}, "
                     f"d_ff={config.d_ff} -> {out}")
    summary = trainer.fit()

    # -- final evaluation ---------------------------------------------------------------------------
    model.eval()
    metrics = {"task": task, "steps": summary["steps"], "epoch": summary["epoch"], "loss": summary["loss"],
               "valid_loss": summary["valid_loss"], "train_seconds": summary["train_seconds"],
               "train_cpu_seconds": summary["train_cpu_seconds"],
               "tokens_per_second": summary["tokens_per_second"], "stop_reason": summary["stop_reason"],
               "skipped_steps": summary["skipped_steps"], "seed": settings["seed"], "config": config.to_dict(),
               "settings": settings}
    if task in ("copy", "reverse"):
        score = exact_match(model, heldout)
        metrics.update(exact_match=score, heldout=len(heldout), decoding="greedy")
        print(f"exact match on {len(heldout)} held-out sequences: {100 * score:.1f}%")
        example = heldout[0][0]
        src_labels = [str(i) for i in example]

        def label(i):
            return str(i)
    else:
        test_text = _load_pairs(task, "test", settings["data_dir"])[: settings["limit"]]
        lowercase = task == "multi30k"
        score, hyps = bleu_of(model, src_tok, tgt_tok, test_text, lowercase, beam_size=settings["beam_size"])
        metrics.update(bleu=score, split="test", sentences=len(test_text), lowercase=lowercase,
                       decoding="greedy" if settings["beam_size"] == 1 else f"beam {settings['beam_size']}")
        print("sample translations (test):")
        for (src, ref), hyp in list(zip(test_text, hyps))[:5]:
            print(f"  source     {src}\n  reference  {ref}\n  model      {hyp}\n")
        print(f"test BLEU ({metrics['decoding']}{', lowercased' if lowercase else ''}, {len(test_text)} sentences): "
              f"{score:.2f}")
        example_text = next((s for s, _ in test_text if "because" in s.split() or "weil" in s.split()), test_text[0][0])
        example = src_tok.encode(example_text)
        src_labels = [src_tok.vocab.lookup_token(i) for i in example]

        def label(i):
            return tgt_tok.vocab.lookup_token(i)
    metrics["wall_seconds"] = time.perf_counter() - wall_start
    metrics_path = os.path.join(out, "metrics.json")
    with open(metrics_path, "w", encoding="utf-8") as f:
        json.dump(metrics, f, indent=2)
    written = [metrics_path, os.path.join(out, ckpt.LATEST)]
    if settings["plots"]:
        if trainer.history:
            _plot_loss(trainer, os.path.join(out, "loss.png"))
            written.append("loss.png")
        else:                                              # e.g. a time limit reached before the first step
            print("no training steps: loss.png not written")
        _plot_attention(model, example, src_labels, label, os.path.join(out, "attention.png"),
                        title=f"Cross-attention ({task}, a held-out example)")
        written.append("attention.png")
    print(f"wrote {', '.join(written)}  ({summary['train_seconds']:.1f} s of training, {summary['steps']} steps, "
          f"{summary['tokens_per_second']:,.0f} tokens/s)")
    return 0


# ============================================================================ translate, evaluate

def _load_run(path, average: int | None = None):
    """(checkpoint, model, src tokenizer, tgt tokenizer, the checkpoint files used) of a run folder or file.

    With ``average``: the weights are the mean of ``average`` checkpoint-<step>.npz files of the folder, those
    ending at the named file's step when it is a step file, else (the folder, checkpoint.npz) the newest.
    """
    from . import checkpoint as ckpt

    file = ckpt.resolve_checkpoint(path)
    ck = ckpt.load_checkpoint(file)
    used = [file]
    weights = None
    if average is not None:
        folder = os.path.dirname(os.path.abspath(file))
        up_to = ckpt.step_of_file(file)                    # None for checkpoint.npz: the newest
        where = folder if up_to is None else f"{folder} up to step {up_to}"
        used = ckpt.last_checkpoints(folder, average, up_to_step=up_to)
        if not used:
            raise CLIError(f"--average {average}: no checkpoint-<step>.npz files in {where}")
        if len(used) < average:
            print(f"--average {average}: only {len(used)} checkpoint-<step>.npz file(s) in {where}; "
                  f"averaging those", file=sys.stderr)
        weights = ckpt.average_checkpoints(used)
    model = _model_from_checkpoint(ck, weights)
    src_tok, tgt_tok = _tokenizers_from_checkpoint(ck)
    return ck, model, src_tok, tgt_tok, used


def cmd_translate(args) -> int:
    _, model, src_tok, tgt_tok, _ = _load_run(args.checkpoint)
    lines = args.sentences if args.sentences else [line.rstrip("\n") for line in sys.stdin]
    if src_tok is None:
        return _translate_ids(model, lines, args)
    outputs = translate_texts(model, src_tok, tgt_tok, lines, beam_size=args.beam_size, alpha=args.alpha)
    for line, text in zip(lines, outputs):
        print(text if line.strip() else "")
    return 0


def _translate_ids(model, lines, args) -> int:
    """copy/reverse checkpoints have no tokeniser: the input is symbol ids separated by spaces."""
    from .decoding import beam_search, greedy_decode

    vocab = model.config.src_vocab_size
    for line in lines:
        try:
            ids = [int(x) for x in line.split()]
        except ValueError:
            raise CLIError(f"this checkpoint has no tokeniser (a copy/reverse task): give token ids separated by "
                           f"spaces, e.g. \"4 5 6\", got {line!r}") from None
        if not ids:
            print()
            continue
        if min(ids) < 4 or max(ids) >= vocab:
            raise CLIError(f"symbol ids must be in [4, {vocab}) for this checkpoint, got {line!r}")
        src = numpy.asarray([ids], dtype=numpy.int64)                         # (1,S)
        hyp = (beam_search(model, src, beam_size=args.beam_size, alpha=args.alpha) if args.beam_size > 1
               else greedy_decode(model, src))[0]
        print(" ".join(str(i) for i in hyp))
    return 0


def cmd_evaluate(args) -> int:
    from .checkpoint import step_of_file

    ck, model, src_tok, tgt_tok, used = _load_run(args.checkpoint, args.average)
    task = ck.extra.get("task")
    settings = ck.extra.get("settings") or {}
    split = "heldout" if task in ("copy", "reverse") else args.split   # a sequence task has its held-out set
    decoding = "greedy" if args.beam_size == 1 else f"beam {args.beam_size}, alpha {args.alpha}"
    # the step of the newest checkpoint evaluated (averaged files are checkpoint-<step>.npz: the name says it)
    step = ck.step if args.average is None else step_of_file(used[-1])
    result = {"checkpoint": used[-1] if args.average is None else used, "task": task, "split": split,
              "beam_size": args.beam_size, "alpha": args.alpha if args.beam_size > 1 else None,
              "averaged": len(used) if args.average else 1, "step": step}
    avg = ""
    if args.average:
        avg = f", average of {len(used)} checkpoints, steps {step_of_file(used[0])}-{step}"
    if task in ("copy", "reverse"):
        from .tasks import SequenceTask, exact_match

        pairs = SequenceTask(task).heldout(settings.get("heldout", 1000))[: args.limit]
        score = exact_match(model, pairs, beam_size=args.beam_size, alpha=args.alpha)
        result.update(exact_match=score, sentences=len(pairs))
        print(f"exact match ({task}, {len(pairs)} held-out sequences, {decoding}{avg}): {100 * score:.2f}%")
    elif task in ("toy", "multi30k"):
        if src_tok is None:
            raise CLIError(f"checkpoint {used[-1]} holds no tokenisers; cannot evaluate a translation task")
        pairs = _load_pairs(task, args.split, args.data_dir or settings.get("data_dir"))[: args.limit]
        lowercase = task == "multi30k"
        score, _ = bleu_of(model, src_tok, tgt_tok, pairs, lowercase, beam_size=args.beam_size, alpha=args.alpha)
        result.update(bleu=score, sentences=len(pairs), lowercase=lowercase)
        print(f"BLEU ({task} {args.split}, {len(pairs)} sentences, {decoding}{avg}"
              f"{', lowercased' if lowercase else ''}): {score:.2f}")
    else:
        raise CLIError(f"checkpoint {used[-1]} does not say which task it was trained on (task={task!r})")
    json_path = args.json_path or os.path.join(os.path.dirname(os.path.abspath(used[-1])), f"eval-{split}.json")
    with open(json_path, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    return 0


# ============================================================================ gradcheck

def cmd_gradcheck(args) -> int:
    from . import gradcheck
    from .gradcheck_cases import gradcheck_cases

    previous = backend.get_default_dtype()
    backend.set_default_dtype("float64")
    backend.manual_seed(args.seed)
    try:
        rows = []
        for label, module, inputs in gradcheck_cases(numpy.random.default_rng(args.seed)):
            report = gradcheck.check(module, *inputs, max_entries=args.max_entries, seed=args.seed)
            rows.append((label, len(report.rows), report.max_error, report.ok))
            if args.verbose:
                print(report.table(), end="\n\n")
    finally:
        backend.set_default_dtype(previous)
    width = max(len(r[0]) for r in rows)
    print(f"{'layer':<{width}}  {'tensors':>7}  {'max rel. error':>14}  result")
    print("-" * (width + 35))
    for label, n, err, ok in rows:
        print(f"{label:<{width}}  {n:>7}  {err:>14.2e}  {'ok' if ok else 'FAIL'}")
    failed = [r[0] for r in rows if not r[3]]
    print(f"float64, central differences on up to {args.max_entries} entries per tensor, "
          f"bound {gradcheck.DEFAULT_TOLERANCE:.0e}: "
          + ("all passed" if not failed else f"FAILED: {', '.join(failed)}"))
    return 0 if not failed else 1


# ============================================================================ download

def cmd_download(args) -> int:
    from . import datasets

    directory = datasets.download_multi30k(args.dir)
    print(f"Multi30k files are in {directory}")
    return 0


# ============================================================================ main

COMMANDS = {"train": cmd_train, "translate": cmd_translate, "evaluate": cmd_evaluate, "gradcheck": cmd_gradcheck,
            "download": cmd_download}


def main(argv=None) -> int:
    """Run the command line; returns the exit code (0 success, 1 failure, 2 bad input, 130 interrupted)."""
    parser = build_parser()
    args = parser.parse_args(argv)          # exits with code 2 and the usage on bad arguments
    from .train import NonFiniteError

    prog = f"minitransformer {args.command}"
    try:
        return COMMANDS[args.command](args)
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:                 # `minitransformer ... | head`: the reader left, nothing to report
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        return 0
    except NonFiniteError as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 1
    except (CLIError, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError, ValueError,
            TypeError) as err:
        if os.environ.get("MINITRANSFORMER_TRACEBACK"):
            raise
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:                  # a network error of `download`, a full disk, ...
        if os.environ.get("MINITRANSFORMER_TRACEBACK"):
            raise
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
