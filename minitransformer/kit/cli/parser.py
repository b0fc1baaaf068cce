"""The options of every command (classroom's sit in its package), each number parsed into its range in
``minitransformer.kit.limits`` before anything runs: a bad one is a usage error naming the option, exit code 2."""

import argparse

from minitransformer import __version__
from minitransformer.kit.classroom.commands import add_classroom
from minitransformer.kit.data import datasets
from minitransformer.kit.limits import option
from minitransformer.kit.running.settings import PRESETS, TASKS, defaults_table

from . import evaluate, explain, translate
from .train import cmd_train
from .utility import cmd_convert, cmd_download, cmd_gradcheck


def _add_train(sub) -> None:
    # The options that become settings default to None (the switches too): None means "not typed", so that
    # --resume lets only typed options replace the saved run's settings.
    t = sub.add_parser("train", help="train a model on a task and write metrics, checkpoints and plots",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=defaults_table(),
                       description="Train from scratch (or --resume) into --out: metrics.json, the checkpoints,\n"
                                   "the plots and explain.html. An option not given takes the task's default (below).")
    t.add_argument("--task", required=True, choices=TASKS, help="what to learn")
    t.add_argument("--preset", choices=PRESETS, help="model size (replaces the task's model below)")
    t.add_argument("--reference", action="store_true", default=None,
                   help="train the readable core model (mt.Transformer), not the fast tier's, to step through a run")
    option(t, "--workers", "threads that each take a part of every batch on a replica of the model: the same loss "
                           "and gradients, other dropout masks (default 2; 1 with --reference)")
    t.add_argument("--out", help="output folder (default: runs/<task>)")
    option(t, "--seed", "random seed (default 0)")
    stop = t.add_mutually_exclusive_group()
    option(stop, "--steps", "stop after this many optimiser steps")
    option(stop, "--epochs", "stop after this many epochs")
    option(t, "--max-minutes", "stop after this many minutes")
    option(t, "--target", "stop early when the validation metric reaches this, in the unit the run prints: exact "
                          "match in percent (copy, reverse), BLEU (toy, multi30k)")
    option(t, "--batch-size", "sequences per batch (copy, reverse)")
    option(t, "--max-tokens", "token budget per batch and side (toy, multi30k)")
    option(t, "--lr-factor", "factor of the Noam learning-rate schedule")
    option(t, "--warmup", "warmup steps of the Noam schedule")
    option(t, "--label-smoothing", "label smoothing epsilon (paper: 0.1)")
    option(t, "--clip-norm", "clip the gradient norm to this")
    option(t, "--dropout", "dropout rate (replaces the preset's)")
    option(t, "--d-model", "model width (replaces the preset's)")
    option(t, "--heads", "attention heads (replaces the preset's)", "num_heads")
    option(t, "--layers", "encoder and decoder layers each (replaces the preset's)", "num_encoder_layers")
    option(t, "--d-ff", "feed-forward width (replaces the preset's)")
    option(t, "--d-k", "size of each attention head's queries and keys (default d_model / heads)")
    option(t, "--d-v", "size of each attention head's values (default d_k)")
    t.add_argument("--positional", choices=("sinusoidal", "learned"),
                   help="position information: the paper's sinusoids (default) or a learned table")
    t.add_argument("--norm-first", action="store_const", const=True, default=None,
                   help="pre-LN sublayers, x + Sublayer(LayerNorm(x)), instead of the paper's post-LN")
    option(t, "--vocab-size", "BPE vocabulary size (multi30k)")
    option(t, "--eval-every", "evaluate every so many steps")
    option(t, "--save-every", "save a checkpoint every so many steps")
    option(t, "--keep", "step checkpoints kept (default 5)")
    option(t, "--average", "score the mean of the weights of the last N step checkpoints (paper §6.1; at most "
                           "--keep; default 1)")
    option(t, "--heldout", "held-out sequences for exact match (copy, reverse; default 1000)")
    option(t, "--beam-size", "beam size of the final test evaluation (toy, multi30k; default 1: greedy)")
    option(t, "--limit", "score only the first N test and min(N, 200) valid sentences (toy, multi30k; default: "
                         "200 valid, all test)")
    t.add_argument("--data-dir", help=f"folder with the Multi30k files (default: {datasets.MULTI30K_DEFAULT}, "
                                      "where `download` puts them)")
    t.add_argument("--on-nonfinite", choices=("stop", "skip"), help="at a NaN/inf loss: stop (default) or skip it")
    again = t.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true", help="continue the run saved in --out, with its own "
                                                             "settings except the stop/report options given here")
    again.add_argument("--overwrite", action="store_true",
                       help="start over in an --out that holds an earlier run: deletes its checkpoints, "
                            "metrics.json, plots and eval-<split>.json once the new run is ready to train")
    t.add_argument("--no-progress", dest="progress", action="store_false", default=None,
                   help="no progress bar (the validation lines stay)")
    t.add_argument("--no-plots", dest="plots", action="store_false", default=None,
                   help="write no plots and no explain.html")
    t.set_defaults(run=cmd_train)


def _decoding_options(p) -> None:
    p.add_argument("--checkpoint", required=True, help="a run folder or a checkpoint file")
    option(p, "--beam-size", "beam size (default 1: greedy)", default=1)
    option(p, "--alpha", "length penalty of beam search (default 0.6)", default=0.6)
    option(p, "--average", "use the mean of the weights of N saved step checkpoints (paper §6.1): the N ending "
                           "at --checkpoint's step if it names a step file, else the newest N")


def _add_translate(sub) -> None:
    tr = sub.add_parser("translate", help="translate sentences with a trained checkpoint",
                        description="Translate the sentences given, or else each line of standard input as it "
                                    "arrives, one line each. Each is prepared as the training text was; stderr names "
                                    "the words the model does not know and tokens cut beyond its length. A "
                                    "translation has at most 2 x (source tokens) + 10 tokens, and at most source "
                                    "tokens + 50 (paper §6.1): a model that did not understand its input does not "
                                    "repeat a word for long.")
    tr.add_argument("sentences", nargs="*", help="sentences to translate (default: read stdin)")
    _decoding_options(tr)
    tr.add_argument("--quiet", action="store_true", help="no notes on stderr about the input")
    tr.set_defaults(run=translate.cmd_translate)


def _add_evaluate(sub) -> None:
    ev = sub.add_parser("evaluate", help="BLEU (or exact match) of a checkpoint on a data split",
                        description="Score a checkpoint: BLEU on a split of its translation task, or exact match on "
                                    "the held-out sequences of a copy/reverse run. Prints the score and writes it as "
                                    "JSON.")
    _decoding_options(ev)
    ev.add_argument("--split", default="test", choices=("train", "valid", "test"),
                    help="data split (default test; a copy/reverse checkpoint is scored on its held-out sequences)")
    ev.add_argument("--data-dir", help="folder with the Multi30k files (default: the run's)")
    ev.add_argument("--json", dest="json_path", help="write the result here (default: <run>/eval-<split>.json)")
    option(ev, "--limit", "evaluate only the first N sentences")
    ev.set_defaults(run=evaluate.cmd_evaluate)


def _add_explain(sub) -> None:
    ex = sub.add_parser("explain", help="write a page that shows one sentence inside a trained model",
                        description="Translate one sentence and write one page, to open from disk in any browser "
                                    "(nothing is fetched): the attention of every head (head view, model view), the "
                                    "queries and keys behind it, dL/dA after one backward pass of the loss on the "
                                    "translation (or on --target), the decoding step by step, the masks and the "
                                    "positional encodings; each view exports as PNG or SVG. The sentence is read as "
                                    "translate reads it.")
    ex.add_argument("sentence", help="the sentence (for a copy/reverse run: symbol ids separated by spaces)")
    _decoding_options(ex)
    ex.add_argument("--target", help="a reference translation: the gradient view uses the loss on it")
    ex.add_argument("--out", default="explain.html", help="the page to write (default: explain.html)")
    ex.set_defaults(run=explain.cmd_explain)


def _add_gradcheck(sub) -> None:
    gc = sub.add_parser("gradcheck", help="finite-difference check of every layer's backward (float64)",
                        description="Check every layer's backward against central finite differences in float64 "
                                    "and print the largest relative error of each. Exit code 1 if one fails.")
    option(gc, "--max-entries", "entries checked per tensor, at random (default 30)", default=30)
    option(gc, "--seed", "random seed (default 0)", default=0)
    gc.add_argument("--verbose", action="store_true", help="print every tensor's row, not only each layer's")
    gc.set_defaults(run=cmd_gradcheck)


def _add_download(sub) -> None:
    dl = sub.add_parser("download", help="fetch the Multi30k task-1 files",
                        description="Fetch the Multi30k task-1 files (train, valid and test, German and English) "
                                    "that `train --task multi30k` reads. Files already there are kept.")
    dl.add_argument("--dir", help=f"where to put them (default: {datasets.MULTI30K_DEFAULT}, where `train` looks)")
    dl.set_defaults(run=cmd_download)


def _add_convert(sub) -> None:
    c = sub.add_parser("convert", help="rewrite checkpoints of earlier versions (.npz) as safetensors",
                       description="Rewrite an .npz checkpoint of an earlier minitransformer as a .safetensors file "
                                   "beside it (or, given a run folder, each of its checkpoint*.npz files), so that "
                                   "translate, evaluate and train --resume read it. The old files are kept.")
    c.add_argument("path", help="an .npz checkpoint, or a run folder holding checkpoint.npz and checkpoint-<step>.npz")
    c.add_argument("--to", metavar="FILE",
                   help="the new file's name (default: the old one's, ending in .safetensors); not for a folder")
    c.set_defaults(run=cmd_convert)


# Every command, in the order --help lists them: a function that adds its subparser (with set_defaults(run=...)).
COMMANDS = [_add_train, _add_translate, _add_evaluate, _add_explain, _add_gradcheck, add_classroom, _add_download,
            _add_convert]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="minitransformer",
        description="The Transformer of 'Attention Is All You Need' in NumPy: train, translate, evaluate, check.")
    parser.add_argument("--version", action="version", version=f"minitransformer {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in COMMANDS:
        add(sub)
    return parser
