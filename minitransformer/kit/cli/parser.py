"""The options of every command. Each value is checked by its argparse type, so a bad one is a usage error
(exit code 2, with the usage line) before anything runs."""

from __future__ import annotations

import argparse
import math

from .classroom import add_classroom_parser
from .defaults import PRESETS, TASKS


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
    _add_train(sub)
    _add_translate(sub)
    _add_evaluate(sub)
    _add_gradcheck(sub)
    _add_download(sub)
    add_classroom_parser(sub, _positive_int, _non_negative_int, _positive_float)  # classroom
    return parser


def _add_train(sub) -> None:
    # The options that become settings default to None (the switches too), so that None means "not typed":
    # --resume lets only typed options replace the saved run's settings (train._typed_options).
    t = sub.add_parser("train", help="train a model on a task and write metrics, checkpoint and plots",
                       description="Train from scratch (or --resume) and write DIR/metrics.json, DIR/checkpoint.npz, "
                                   "DIR/loss.png and DIR/attention.png. Unset options take the task's defaults.")
    t.add_argument("--task", required=True, choices=TASKS, help="what to learn")
    t.add_argument("--preset", choices=PRESETS, help="model size (default: the task's tuned size)")
    t.add_argument("--reference", action="store_true", default=None,
                   help="train the readable core model (mt.Transformer) instead of the fast tier's "
                        "(mt.fast.Transformer), for a student who wants to step through a run")
    t.add_argument("--workers", type=_positive_int, default=None,
                   help="threads that each take a part of every batch on a replica of the model, with one BLAS "
                        "thread each: the same loss and gradients, other dropout masks (default 2; 1 with "
                        "--reference, to step through a run)")
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
    t.add_argument("--d-k", type=_positive_int, help="size of each attention head (default d_model / heads)")
    t.add_argument("--positional", choices=("sinusoidal", "learned"),
                   help="position information: the paper's sinusoids (default) or a learned table")
    t.add_argument("--norm-first", action="store_const", const=True, default=None,
                   help="pre-LN sublayers, x + Sublayer(LayerNorm(x)), instead of the paper's post-LN")
    t.add_argument("--vocab-size", type=_positive_int, help="BPE vocabulary size (multi30k)")
    t.add_argument("--eval-every", type=_positive_int, help="evaluate every so many steps")
    t.add_argument("--save-every", type=_positive_int, help="save a checkpoint every so many steps")
    t.add_argument("--keep", type=_positive_int, default=None, help="checkpoints to keep (default 5)")
    t.add_argument("--average", type=_positive_int, default=None,
                   help="score the trained model as the mean of the weights of its last N step checkpoints "
                        "(paper §6.1; at most --keep; default 1, multi30k 4)")
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


def _add_translate(sub) -> None:
    tr = sub.add_parser("translate", help="translate sentences with a trained checkpoint",
                        description="Translate the sentences given, or else every line of standard input "
                                    "(one output line per input line). Each is prepared as the training text "
                                    "was (lowercased where the model's vocabulary is, punctuation split off); "
                                    "stderr names, per line, the words the model does not know and any tokens "
                                    "cut beyond its length. A translation has at most 2 x (source tokens) + 10 "
                                    "tokens, and at most source tokens + 50.")
    tr.add_argument("--checkpoint", required=True, help="a run folder or a checkpoint .npz file")
    tr.add_argument("sentences", nargs="*", help="sentences to translate (default: read stdin)")
    tr.add_argument("--beam-size", type=_positive_int, default=1, help="beam size (default 1: greedy)")
    tr.add_argument("--alpha", type=_non_negative_float, default=0.6,
                    help="length penalty of beam search (default 0.6)")
    tr.add_argument("--average", type=_positive_int, default=None,
                    help="translate with the mean of the weights of N saved checkpoint-<step>.npz files, as "
                         "evaluate --average does")
    tr.add_argument("--quiet", action="store_true",
                    help="no notes on stderr about unknown words, cut input or the length limit")


def _add_evaluate(sub) -> None:
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


def _add_gradcheck(sub) -> None:
    gc = sub.add_parser("gradcheck", help="finite-difference check of every layer's backward (float64)")
    gc.add_argument("--max-entries", type=_positive_int, default=30,
                    help="entries checked per tensor, at random (default 30)")
    gc.add_argument("--seed", type=_non_negative_int, default=0)
    gc.add_argument("--verbose", action="store_true", help="print every tensor's row, not only each layer's")


def _add_download(sub) -> None:
    dl = sub.add_parser("download", help="fetch the Multi30k task-1 files")
    dl.add_argument("--dir", default=None, help="where to put them (default: see datasets.multi30k_dir)")
