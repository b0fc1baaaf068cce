"""What a run of each task trains and is scored on (``task_data``, as ``minitransformer train`` and the studies
build it), and a translation model's scoring: its sources encoded, decoded in batches, the BLEU of the result."""

from dataclasses import dataclass, field

from minitransformer.model import TransformerConfig

from . import datasets
from .batching import BucketBatcher, translate_ids
from .bleu import corpus_bleu
from .tasks import TASKS as SEQUENCE_TASKS
from .tasks import SequenceTask, TaskBatches, exact_match, heldout_batches
from .tokenizers import BPETokenizer, WordTokenizer
from .vocab import UNK

TRANSLATION_MAX_LEN = 256          # positions of a translation model; longer pairs are left out of training
VALID_SENTENCES = 200              # BLEU during training on at most this many valid sentences: decoding is slow


@dataclass
class TaskData:
    """What a task gives a run: held-out pairs (copy, reverse) or tokenisers (toy, multi30k)."""

    config: TransformerConfig
    train_data: object                 # a resumable batch source: TaskBatches or BucketBatcher
    valid_batches: list                # for the validation loss
    metric_fn: object                  # metric_fn(model) -> exact match in [0, 1] or BLEU
    heldout: list = field(default_factory=list)
    src_tok: object = None
    tgt_tok: object = None
    metric_name: str = "valid BLEU"    # how the run's output and loss.png name the metric
    metric_percent: bool = False       # exact match, a fraction, is shown as a percentage

    def format_metric(self, value: float) -> str:          # "99.0%" for exact match, "72.50" for BLEU
        return f"{100 * value:.1f}%" if self.metric_percent else f"{value:.2f}"

    def tokenizers(self) -> dict:
        """The vocabularies as the checkpoints store them ({} for a sequence task)."""
        return {} if self.src_tok is None else {"src": self.src_tok.to_json(), "tgt": self.tgt_tok.to_json()}


def task_data(settings: dict, tokenizers=None) -> TaskData:
    """The data of a run with these settings (``minitransformer train``'s). copy, reverse: batches generated from the
    seed, exact match on the held-out sequences; a translation run given ``tokenizers`` (source, target), such as
    a resumed run's, keeps those vocabularies."""
    if settings["task"] not in SEQUENCE_TASKS:
        return _translation_data(settings, tokenizers)
    seq = SequenceTask(settings["task"])
    config = _make_config(settings, seq.vocab_size, seq.vocab_size, max_len=max(64, seq.max_len + 2))
    train_data = TaskBatches(seq, batch_size=settings["batch_size"], seed=settings["seed"])
    heldout = seq.heldout(settings["heldout"])          # also the validation set: the valid loss is computed on it
    return TaskData(config, train_data, heldout_batches(heldout), lambda model: exact_match(model, heldout),
                    heldout=heldout, metric_name="valid exact match", metric_percent=True)


def _make_config(settings: dict, src_vocab: int, tgt_vocab: int, **extra) -> TransformerConfig:
    return TransformerConfig.preset(settings["preset"], src_vocab_size=src_vocab, tgt_vocab_size=tgt_vocab,
                                    **{**settings["model"], **extra})


def _translation_data(settings: dict, tokenizers) -> TaskData:
    """toy, multi30k: token-budgeted batches of similar length, BLEU on the first valid sentences."""
    task = settings["task"]
    train_text, valid_text = (load_pairs(task, split, settings["data_dir"]) for split in ("train", "valid"))
    if not (tokenizers and tokenizers[0] is not None):
        tokenizers = _build_tokenizers(task, settings, train_text)
    src_tok, tgt_tok = tokenizers
    config = _make_config(settings, src_tok.vocab_size, tgt_tok.vocab_size, max_len=TRANSLATION_MAX_LEN,
                          share_embeddings=src_tok is tgt_tok or task == "multi30k")
    train_ids, valid_ids = (encode_pairs(text, src_tok, tgt_tok, TRANSLATION_MAX_LEN - 1)
                            for text in (train_text, valid_text))
    train_data = BucketBatcher(train_ids, max_tokens=settings["max_tokens"], seed=settings["seed"])
    valid_batches = list(BucketBatcher(valid_ids, max_tokens=settings["max_tokens"], shuffle=False))    # one epoch
    eval_pairs = valid_text[:min(VALID_SENTENCES, settings["limit"] or VALID_SENTENCES)]
    return TaskData(config, train_data, valid_batches,
                    lambda model: bleu_of(model, src_tok, tgt_tok, eval_pairs, lowercase=task == "multi30k")[0],
                    src_tok=src_tok, tgt_tok=tgt_tok)


def encode_pairs(pairs, src_tok, tgt_tok, max_len: int) -> list:
    """Token id pairs. A pair is dropped when either side is empty, its source is longer than max_len, or its
    target is max_len or longer (the decoder reads it with <bos> in front, and predicts <eos> after it)."""
    encoded = ((src_tok.encode(src), tgt_tok.encode(tgt)) for src, tgt in pairs)
    return [(s, t) for s, t in encoded if 0 < len(s) <= max_len and 0 < len(t) < max_len]


def _build_tokenizers(task: str, settings: dict, train_pairs: list):
    """toy: a word vocabulary per language; multi30k: one BPE shared by both sides, as in the paper. Both
    lowercase: the toy corpus is written in lowercase, and Multi30k is scored lowercased; a sentence given to
    `translate` is then read the same way ("The" as "the")."""
    print(f"building vocabularies from {len(train_pairs)} training pairs ...")
    sources, targets = [s for s, _ in train_pairs], [t for _, t in train_pairs]
    if task == "toy":
        return WordTokenizer.build(sources, lowercase=True), WordTokenizer.build(targets, lowercase=True)
    shared = BPETokenizer.learn(sources + targets, vocab_size=settings["vocab_size"], lowercase=True)
    return shared, shared


def load_pairs(task: str, split: str, data_dir=None) -> list:
    """(source text, target text) pairs of a translation task's split."""
    return datasets.load_toy(split) if task == "toy" else datasets.load_multi30k(data_dir, split)


def encode_sources(model, src_tok, texts) -> list:
    """Each text's source ids as the model reads them: at most config.max_len tokens (the rest is cut), and an
    empty text as one <unk> (the encoder needs a token)."""
    return [src_tok.encode(text)[: model.config.max_len] or [UNK] for text in texts]


def bleu_of(model, src_tok, tgt_tok, pairs, lowercase: bool, beam_size: int = 1, alpha: float = 0.6) -> tuple:
    """(corpus BLEU of the model's translations of the pairs' sources, the translations)."""
    hyps = translate_ids(model, encode_sources(model, src_tok, [s for s, _ in pairs]), beam_size, alpha)
    hyps = [tgt_tok.decode(h) for h in hyps]
    return corpus_bleu(hyps, [t for _, t in pairs], lowercase=lowercase), hyps
