"""What several commands share: the model class, BLAS threads, loading a run, the data splits, translating and
BLEU, plots."""

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
    """(Transformer, CrossEntropyLoss, Adam) of the tier to train: the readable core with ``reference``, else
    the fast tier, whose classes are drop-in subclasses of the core's (same config, parameter names, state_dict
    and arithmetic) that train and decode faster. The fast tier is imported on first use."""
    if reference:
        return Transformer, CrossEntropyLoss, Adam
    from minitransformer import fast

    return fast.Transformer, fast.CrossEntropyLoss, fast.Adam


def model_class(reference: bool):
    """The Transformer class of that tier."""
    return tier(reference)[0]


# A model narrower than this gets one BLAS thread. Its products are small: a second thread gains nothing on
# an idle machine, and when another process keeps a core busy, OpenBLAS's two threads (which spin while they
# wait for each other) make a step of the toy task several times slower than one thread does. Wider models
# (the small and base presets) keep the library's default, one per core, where a second thread pays.
ONE_BLAS_THREAD_BELOW = 256


def choose_blas_threads(config, workers: int = 1) -> dict:
    """Set the BLAS threads for this model's products, unless the user's OPENBLAS_NUM_THREADS (or
    OMP_NUM_THREADS) chose: one with several workers (they keep the cores busy already), else by the width.
    -> {"blas_threads": the count in force (None where the BLAS is not OpenBLAS),
    "blas_threads_set_by": "minitransformer" | "the BLAS default" | the variable | "unknown (not OpenBLAS)"}"""
    wanted = 1 if workers > 1 or config.d_model < ONE_BLAS_THREAD_BELOW else None
    count, why = use_blas_threads(wanted)
    set_by = {"chosen": "minitransformer", "default": "the BLAS default",
              "unknown": "unknown (not OpenBLAS)"}.get(why, why)
    return {"blas_threads": count, "blas_threads_set_by": set_by}


def describe_blas_threads(choice: dict, config, workers: int = 1) -> str:
    """One line for a run's header: the BLAS threads and who chose them."""
    count, set_by = choice["blas_threads"], choice["blas_threads_set_by"]
    if count is None:
        return "BLAS threads: the library's own setting (not OpenBLAS; OMP_NUM_THREADS or MKL_NUM_THREADS sets it)"
    if set_by == "minitransformer" and workers > 1:
        return (f"BLAS threads: {count}, for each of the {workers} workers (they keep the cores busy already); "
                f"OPENBLAS_NUM_THREADS=N sets another count")
    if set_by == "minitransformer":
        return (f"BLAS threads: {count}, chosen for d_model {config.d_model} < {ONE_BLAS_THREAD_BELOW} (products "
                f"this small gain nothing from more); OPENBLAS_NUM_THREADS=N sets another count")
    if set_by == "the BLAS default":
        return f"BLAS threads: {count}, the BLAS default (one per core); OPENBLAS_NUM_THREADS=N sets another count"
    return f"BLAS threads: {count}, from {set_by}"


# ============================================================================ data and runs

def load_pairs(task: str, split: str, data_dir=None) -> list:
    """(source text, target text) pairs of a translation task's split."""
    if task == "toy":
        return datasets.load_toy(split)
    return datasets.load_multi30k(data_dir, split)


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
        # A vocabulary without a capital letter (the toy corpus's, saved before its tokenisers said they
        # lowercase) knows "the" but can only read "The" as <unk>: such a model reads its input lowercased.
        tokenizer.lowercase = tokenizer.lowercase or tokenizer.vocab.is_lowercase()
        tokenizers.append(tokenizer)
    return tuple(tokenizers)


def model_from_checkpoint(ck, weights=None):
    """The fast tier's model with the checkpoint's config and weights (or ``weights``), in eval mode.
    ``load_checkpoint`` checked the config's sizes against the weights the file holds before this builds it."""
    if ck.config is None:
        raise CLIError(f"checkpoint {ck.path} holds no model config")
    model = model_class(reference=False)(TransformerConfig.from_dict(ck.config))
    try:
        model.load_state_dict(ck.weights if weights is None else weights)
    except ValueError as err:
        raise CLIError(f"checkpoint {ck.path}: its weights do not fit its config ({err})") from None
    model.eval()
    return model


def _check_vocabularies(ck, src_tok, tgt_tok) -> None:
    """The tokenisers must give the ids the model was built for (else decoding would index out of range)."""
    for side, tok in (("src", src_tok), ("tgt", tgt_tok)):
        size = ck.config[f"{side}_vocab_size"]
        if tok is not None and tok.vocab_size != size:
            raise CLIError(f"checkpoint {ck.path}: tokenizers.{side} has {tok.vocab_size} tokens but the model's "
                           f"config {side}_vocab_size is {size}")


def load_run(path, average: int | None = None):
    """(checkpoint, model, src tokenizer, tgt tokenizer, the checkpoint files used) of a run folder or file.

    With ``average``: the weights are the mean of ``average`` checkpoint-<step>.npz files of the folder, those
    ending at the named file's step when it is a step file, else (the folder, checkpoint.npz) the newest.
    """
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
    src_tok, tgt_tok = tokenizers_from_checkpoint(ck)
    model = model_from_checkpoint(ck, weights)
    _check_vocabularies(ck, src_tok, tgt_tok)
    return ck, model, src_tok, tgt_tok, used


# ============================================================================ translating and scoring

def encode_sources(model, src_tok, texts) -> list:
    """Each text's source ids as the model reads them: at most config.max_len tokens (the rest is cut), and
    an empty text as one <unk> (the encoder needs a token)."""
    return [src_tok.encode(text)[: model.config.max_len] or [UNK] for text in texts]


def translate_ids(model, encoded, beam_size: int = 1, alpha: float = 0.6, batch_size: int = 100,
                  length_limit=None) -> list:
    """The output ids of each source id list (batched, sorted by length), in input order.

    length_limit  length_limit(S) -> the most tokens generated for a source of S tokens; the batches then
                  hold sources of one length each. None: decoding's default, S + 50 (the paper's, §6.1).
    """
    c = model.config
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    out = [None] * len(encoded)
    batches, start = [], 0
    for end in range(1, len(order) + 1):
        if end == len(order) or end - start == batch_size or (
                length_limit is not None and len(encoded[order[end]]) != len(encoded[order[start]])):
            batches.append(order[start:end])
            start = end
    for idx in batches:
        src = numpy.full((len(idx), max(len(encoded[i]) for i in idx)), c.pad_id, dtype=numpy.int64)  # (B,S)
        for row, i in enumerate(idx):
            src[row, :len(encoded[i])] = encoded[i]
        max_len = None if length_limit is None else length_limit(src.shape[1])
        if beam_size > 1:
            hyps = decoding.beam_search(model, src, beam_size=beam_size, alpha=alpha, max_len=max_len)
        else:
            hyps = decoding.greedy_decode(model, src, max_len=max_len)
        for i, h in zip(idx, hyps):
            out[i] = h
    return out


def translate_texts(model, src_tok, tgt_tok, texts, beam_size: int = 1, alpha: float = 0.6,
                    batch_size: int = 100) -> list:
    """Translate sentences (batched, sorted by length); returns the detokenised outputs in input order."""
    hyps = translate_ids(model, encode_sources(model, src_tok, texts), beam_size, alpha, batch_size)
    return [tgt_tok.decode(h) for h in hyps]


def bleu_of(model, src_tok, tgt_tok, pairs, lowercase: bool, beam_size: int = 1, alpha: float = 0.6) -> tuple:
    """(corpus BLEU of the model's translations of the pairs' sources, the translations)."""
    hyps = translate_texts(model, src_tok, tgt_tok, [s for s, _ in pairs], beam_size=beam_size, alpha=alpha)
    return corpus_bleu(hyps, [t for _, t in pairs], lowercase=lowercase), hyps


# ============================================================================ plots

def _save_figure(fig, path: str) -> None:
    """Atomically (``files.atomic_write``): a run stopped mid-write leaves the previous plot whole."""
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110, bbox_inches="tight"), "plot")


def check_outputs(folder: str, names) -> None:
    """Before any work: refuse (CLIError) if a file this command will write in ``folder`` is a symbolic link
    or not a regular file. A run folder from elsewhere may hold such traps; ``files.atomic_write`` refuses
    them too, but only when it comes to write, after the training or the scoring."""
    for name in names:
        try:
            check_writable(os.path.join(folder, name), name)
        except ValueError as err:
            raise CLIError(str(err)) from None


def _finite_series(pairs):
    """(steps, values) of the (step, value) pairs whose value is finite; None if there are none."""
    pairs = [(s, v) for s, v in pairs if math.isfinite(v)]
    if not pairs:
        return None
    return numpy.array([s for s, _ in pairs], dtype=float), numpy.array([v for _, v in pairs], dtype=float)


def plot_loss(trainer, path: str, metric_name: str = "metric", metric_scale: float = 1.0) -> None:
    """The training loss of every step and the validation loss of every evaluation (log scale if all > 0),
    and beside them the validation metric (times metric_scale: 100 shows a fraction as a percentage)."""
    # matplotlib is slow to import: only when a plot is drawn
    from minitransformer.kit.running import viz

    steps = numpy.array([h[0] for h in trainer.history], dtype=float)       # (n,)
    losses = numpy.array([h[1] for h in trainer.history], dtype=float)      # (n,)
    valid_series = _finite_series([(s, v) for s, v, _ in trainer.valid_history])
    metric_series = _finite_series([(s, m * metric_scale) for s, _, m in trainer.valid_history])
    positive = bool((losses > 0).all()) and (valid_series is None or bool((valid_series[1] > 0).all()))
    label = metric_name + (" (%)" if metric_scale == 100.0 else "")
    _save_figure(viz.loss_curves((steps, losses), valid_series, title="Training loss", logy=positive,
                                 metric=metric_series, metric_name=label), path)


# Row t of a cross-attention map is the query of decoder position t: it reads the token before and produces
# token t. The rows are labelled by what they produce (the model's output, then <eos>), as the notebooks
# label theirs, and the axis says so.
QUERY_AXIS = "query: the token produced at this step"
KEY_AXIS = "key: source token"


def plot_attention(model, src_ids, src_labels, tgt_labels_fn, path: str, title: str) -> None:
    """Cross-attention of every head, in every decoder layer (only the last when there are more than 4), for one
    source sentence and the model's own output. tgt_labels_fn(ids) -> a label per target id."""
    from minitransformer.kit.running import viz

    c = model.config
    model.eval()
    src = numpy.asarray([src_ids], dtype=numpy.int64)                        # (1,S)
    hyp = decoding.greedy_decode(model, src)[0]
    tgt_in = numpy.asarray([[c.bos_id] + hyp], dtype=numpy.int64)            # (1,T)
    model(src, tgt_in)
    cross = [a[0] for a in model.attention_maps()["decoder_cross"]]          # per layer (H,T,S)
    if len(cross) > 4:
        cross = cross[-1]
    y_labels = tgt_labels_fn(hyp + [c.eos_id])                                 # the output, then <eos>
    _save_figure(viz.attention_grid(cross, x_labels=src_labels, y_labels=y_labels, title=title,
                                    x_name=KEY_AXIS, y_name=QUERY_AXIS), path)
