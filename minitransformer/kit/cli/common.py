"""What several commands share: the model class, BLAS threads, loading a run, translating and BLEU, plots."""

from __future__ import annotations

import math
import os
import sys

import numpy

from minitransformer import decoding
from minitransformer.fast.threads import use_blas_threads
from minitransformer.kit.data import datasets
from minitransformer.kit.data.bleu import corpus_bleu
from minitransformer.kit.data.tokenizers import UNK, tokenizer_from_dict
from minitransformer.kit.running import checkpoint as ckpt
from minitransformer.kit.running.files import atomic_write, check_writable, parse_json
from minitransformer.loss import CrossEntropyLoss
from minitransformer.model import Transformer, TransformerConfig
from minitransformer.optim import Adam


class CLIError(Exception):
    """A mistake in what the user asked for: printed as one line, exit code 2."""


def tier(reference: bool) -> tuple:
    """(Transformer, CrossEntropyLoss, Adam) of the readable core with ``reference``, else of the fast tier (drop-in
    subclasses: same config, parameter names, state_dict and arithmetic, faster). Imported on first use."""
    if reference:
        return Transformer, CrossEntropyLoss, Adam
    from minitransformer import fast

    return fast.Transformer, fast.CrossEntropyLoss, fast.Adam


# A model narrower than this gets one BLAS thread: its products are small, a second thread gains nothing on an
# idle machine, and when another process keeps a core busy, two spinning BLAS threads make a step several times
# slower. Wider models (the small and base presets) keep the library's default, one per core.
ONE_BLAS_THREAD_BELOW = 256


def choose_blas_threads(config, workers: int = 1) -> dict:
    """Set the BLAS threads for this model, unless OPENBLAS_NUM_THREADS (or OMP_NUM_THREADS) chose: one with
    several workers (they keep the cores busy already), else by the width. -> {"blas_threads": the count in
    force (None where it cannot be known), "blas_threads_set_by": "minitransformer", "the BLAS default", the
    variable, or "unknown (not OpenBLAS)"}"""
    count, why = use_blas_threads(1 if workers > 1 or config.d_model < ONE_BLAS_THREAD_BELOW else None)
    set_by = {"chosen": "minitransformer", "default": "the BLAS default", "unknown": "unknown (not OpenBLAS)"}
    return {"blas_threads": count, "blas_threads_set_by": set_by.get(why, why)}


def describe_blas_threads(choice: dict, config, workers: int = 1) -> str:
    """One line for a run's header: the BLAS threads and who chose them."""
    count, set_by = choice["blas_threads"], choice["blas_threads_set_by"]
    if count is None:
        return "BLAS threads: the library's own setting (not OpenBLAS; OMP_NUM_THREADS or MKL_NUM_THREADS sets it)"
    why = {"minitransformer": f"for each of the {workers} workers (they keep the cores busy already)" if workers > 1
           else f"chosen for d_model {config.d_model} < {ONE_BLAS_THREAD_BELOW} (products this small gain nothing "
                f"from more)", "the BLAS default": "the BLAS default (one per core)"}.get(set_by)
    return f"BLAS threads: {count}, " + (f"{why}; OPENBLAS_NUM_THREADS=N sets another count" if why else
                                         f"from {set_by}")


# ============================================================================ data and runs

def load_pairs(task: str, split: str, data_dir=None) -> list:
    """(source text, target text) pairs of a translation task's split."""
    return datasets.load_toy(split) if task == "toy" else datasets.load_multi30k(data_dir, split)


def tokenizers_from_checkpoint(ck):
    """(source, target) tokenisers saved with a run; (None, None) for a copy/reverse run, which has none.
    A checkpoint may come from anyone: a missing side, bad JSON or a bad vocabulary is a CLIError naming it."""
    if not ck.tokenizers:
        return None, None
    tokenizers = []
    for side in ("src", "tgt"):
        text = ck.tokenizers.get(side)
        if not isinstance(text, str):
            raise CLIError(f"checkpoint {ck.path} is missing tokenizers.{side} (the {side} vocabulary as JSON)")
        try:
            tokenizer = tokenizer_from_dict(parse_json(text, f"tokenizers.{side}"))
        except (ValueError, TypeError) as err:
            raise CLIError(f"checkpoint {ck.path}: {err}") from None
        # A vocabulary without a capital letter knows "the" but reads "The" as <unk>: such a model reads its input
        # lowercased (the toy corpus's vocabularies were saved before tokenisers said they lowercase).
        tokenizer.lowercase = tokenizer.lowercase or tokenizer.vocab.is_lowercase()
        tokenizers.append(tokenizer)
    return tuple(tokenizers)


def model_from_checkpoint(ck, weights=None):
    """The fast tier's model with the checkpoint's config and weights (or ``weights``), in eval mode.
    ``load_checkpoint`` checked the config's sizes against the weights the file holds before this builds it."""
    if ck.config is None:
        raise CLIError(f"checkpoint {ck.path} holds no model config")
    model = tier(reference=False)[0](TransformerConfig.from_dict(ck.config))
    try:
        model.load_state_dict(ck.weights if weights is None else weights)
    except ValueError as err:
        raise CLIError(f"checkpoint {ck.path}: its weights do not fit its config ({err})") from None
    model.eval()
    return model


def load_run(path, average: int | None = None):
    """(checkpoint, model, src tokenizer, tgt tokenizer, the checkpoint files used) of a run folder or file.
    With ``average``: the weights are the mean of that many step checkpoints of the folder, those ending at the
    named file's step when it is a step file, else the newest."""
    file = ckpt.resolve_checkpoint(path)
    ck = ckpt.load_checkpoint(file)
    used, weights = [file], None
    if average is not None:
        folder, up_to = os.path.dirname(os.path.abspath(file)), ckpt.step_of_file(file)
        where = folder if up_to is None else f"{folder} up to step {up_to}"
        used = ckpt.last_checkpoints(folder, average, up_to_step=up_to)
        if not used:
            raise CLIError(f"--average {average}: no step checkpoints in {where}")
        if len(used) < average:
            print(f"--average {average}: only {len(used)} checkpoint(s) in {where}; averaging those", file=sys.stderr)
        weights = ckpt.average_checkpoints(used)
    src_tok, tgt_tok = tokenizers_from_checkpoint(ck)
    model = model_from_checkpoint(ck, weights)
    for side, tok in (("src", src_tok), ("tgt", tgt_tok)):    # else decoding would index out of range
        if tok is not None and tok.vocab_size != ck.config[f"{side}_vocab_size"]:
            raise CLIError(f"checkpoint {ck.path}: tokenizers.{side} has {tok.vocab_size} tokens but the model's "
                           f"config {side}_vocab_size is {ck.config[f'{side}_vocab_size']}")
    return ck, model, src_tok, tgt_tok, used


def check_outputs(folder: str, names) -> None:
    """Before any work: refuse (CLIError) if a file this command will write in ``folder`` is a symbolic link or
    not a regular file (``files.atomic_write`` refuses them too, but only after the training or the scoring)."""
    for name in names:
        try:
            check_writable(os.path.join(folder, name), name)
        except ValueError as err:
            raise CLIError(str(err)) from None


# ============================================================================ translating and scoring

def encode_sources(model, src_tok, texts) -> list:
    """Each text's source ids as the model reads them: at most config.max_len tokens (the rest is cut), and an
    empty text as one <unk> (the encoder needs a token)."""
    return [src_tok.encode(text)[: model.config.max_len] or [UNK] for text in texts]


def translate_ids(model, encoded, beam_size: int = 1, alpha: float = 0.6, batch_size: int = 100,
                  length_limit=None) -> list:
    """The output ids of each source id list (batched, sorted by length), in input order.
    length_limit(S) -> the most tokens generated for a source of S tokens; the batches then hold sources of one
    length each. None: decoding's default, S + 50 (the paper's, §6.1)."""
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    out, batches, start = [None] * len(encoded), [], 0
    for end in range(1, len(order) + 1):
        if end == len(order) or end - start == batch_size or (
                length_limit is not None and len(encoded[order[end]]) != len(encoded[order[start]])):
            batches.append(order[start:end])
            start = end
    for idx in batches:
        src = numpy.full((len(idx), max(len(encoded[i]) for i in idx)), model.config.pad_id, dtype=numpy.int64)  # (B,S)
        for row, i in enumerate(idx):
            src[row, :len(encoded[i])] = encoded[i]
        max_len = None if length_limit is None else length_limit(src.shape[1])
        hyps = (decoding.beam_search(model, src, beam_size=beam_size, alpha=alpha, max_len=max_len) if beam_size > 1
                else decoding.greedy_decode(model, src, max_len=max_len))
        for i, h in zip(idx, hyps):
            out[i] = h
    return out


def bleu_of(model, src_tok, tgt_tok, pairs, lowercase: bool, beam_size: int = 1, alpha: float = 0.6) -> tuple:
    """(corpus BLEU of the model's translations of the pairs' sources, the translations)."""
    hyps = translate_ids(model, encode_sources(model, src_tok, [s for s, _ in pairs]), beam_size, alpha)
    hyps = [tgt_tok.decode(h) for h in hyps]
    return corpus_bleu(hyps, [t for _, t in pairs], lowercase=lowercase), hyps


# ============================================================================ plots

def _save_figure(fig, path: str) -> None:
    """Atomically (``files.atomic_write``): a run stopped mid-write leaves the previous plot whole."""
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110, bbox_inches="tight"), "plot")


def plot_loss(trainer, path: str, metric_name: str = "metric", metric_scale: float = 1.0) -> None:
    """The training loss of every step and the validation loss of every evaluation (log scale if all > 0), and
    beside them the validation metric (times metric_scale: 100 shows a fraction as a percentage)."""
    from minitransformer.kit.running import (
        viz,  # matplotlib is slow to import: only to draw
    )

    def finite(pairs):
        pairs = [(s, v) for s, v in pairs if math.isfinite(v)]
        return (numpy.array([s for s, _ in pairs], float), numpy.array([v for _, v in pairs], float)) if pairs else None

    steps, losses = (numpy.array([h[i] for h in trainer.history], dtype=float) for i in (0, 1))   # (n,) each
    valid = finite([(s, v) for s, v, _ in trainer.valid_history])
    metric = finite([(s, m * metric_scale) for s, _, m in trainer.valid_history])
    positive = bool((losses > 0).all()) and (valid is None or bool((valid[1] > 0).all()))
    label = metric_name + (" (%)" if metric_scale == 100.0 else "")
    _save_figure(viz.loss_curves((steps, losses), valid, title="Training loss", logy=positive, metric=metric,
                                 metric_name=label), path)


def plot_attention(model, src_ids, src_labels, tgt_labels_fn, path: str, title: str) -> None:
    """Cross-attention of every head in every decoder layer (the last only, past 4) for one source sentence and
    the model's own output. Row t is the query of decoder position t, which produces token t: the rows are
    labelled by what they produce (the output, then <eos>), as the notebooks label theirs."""
    from minitransformer.kit.running import viz

    c = model.config
    model.eval()
    src = numpy.asarray([src_ids], dtype=numpy.int64)                        # (1,S)
    hyp = decoding.greedy_decode(model, src)[0]
    model(src, numpy.asarray([[c.bos_id] + hyp], dtype=numpy.int64))       # tgt_in (1,T)
    cross = [a[0] for a in model.attention_maps()["decoder_cross"]]          # per layer (H,T,S)
    _save_figure(viz.attention_grid(cross if len(cross) <= 4 else cross[-1], x_labels=src_labels,
                                    y_labels=tgt_labels_fn(hyp + [c.eos_id]), title=title, x_name="key: source token",
                                    y_name="query: the token produced at this step"), path)
