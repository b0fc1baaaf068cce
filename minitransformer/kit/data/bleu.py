"""Corpus BLEU (Papineni et al. 2002), computed as sacrebleu's default ``corpus_bleu`` computes it.

    BLEU = BP * exp( (1/4) * sum_{n=1..4} log p_n )          (reported x 100)

- p_n: each hypothesis n-gram counts as correct at most as often as it occurs in one reference (the max over
  references); p_n = total correct / total hypothesis n-grams, over the corpus.
- BP = 1 if c >= r else exp(1 - r/c): c the hypothesis length, r the sum of each sentence's reference length
  closest to its hypothesis length (ties: the shorter).
- "exp" smoothing (sacrebleu's default): an order with no correct n-gram gets precision 1 / (2^k * total_n),
  k = 1, 2, ... over such orders; nothing correct at all, or an order with no n-gram at all, gives BLEU 0.
- "13a" tokenisation: punctuation split off, periods and commas too unless between digits ("3.5" stays whole).

The statistics (``BleuStats``) add up over sentences: ``corpus_stats`` / ``bleu_from_stats`` show every number.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field

MAX_ORDER = 4

# The 13a tokeniser, rule by rule (applied in this order, each with re.sub over the whole line).
_13A_RULES = [
    (re.compile("([" + re.escape("{|}~[\\]^_`!\"#$%&()*+:;<=>?@/") + "])"), r" \1 "),  # punctuation but . , ' -
    (re.compile(r"([^0-9])([\.,])"), r"\1 \2 "),      # a period or comma after a non-digit
    (re.compile(r"([\.,])([^0-9])"), r" \1 \2"),      # a period or comma before a non-digit
    (re.compile(r"([0-9])(-)"), r"\1 \2 "),           # a dash after a digit
]


def tokenize_13a(line: str) -> list[str]:
    """mteval-v13a tokenisation: "Hello, world!" -> ["Hello", ",", "world", "!"]  ("3.5" stays one token)."""
    line = line.replace("<skipped>", "").replace("-\n", "").replace("\n", " ")
    if "&" in line:
        line = line.replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">")
    line = f" {line} "
    for pattern, replacement in _13A_RULES:
        line = pattern.sub(replacement, line)
    return line.split()


def count_ngrams(tokens: list[str], max_order: int = MAX_ORDER) -> Counter:
    """Every n-gram (tuple of tokens) for n = 1..max_order, with its count."""
    return Counter(tuple(tokens[i: i + n]) for n in range(1, max_order + 1) for i in range(len(tokens) - n + 1))


@dataclass
class BleuStats:
    """What BLEU needs, summed over sentences: hypothesis and (closest) reference lengths, and per order n
    the correct (clipped) and total hypothesis n-grams."""

    hyp_len: int = 0
    ref_len: int = 0
    correct: list = field(default_factory=lambda: [0] * MAX_ORDER)
    total: list = field(default_factory=lambda: [0] * MAX_ORDER)

    def __add__(self, other: BleuStats) -> BleuStats:
        return BleuStats(self.hyp_len + other.hyp_len, self.ref_len + other.ref_len,
                         [a + b for a, b in zip(self.correct, other.correct)],
                         [a + b for a, b in zip(self.total, other.total)])


@dataclass
class BleuScore:
    """A BLEU score and how it came about: precisions p_n (in %), brevity penalty, lengths."""

    score: float
    precisions: list
    bp: float
    hyp_len: int
    ref_len: int
    correct: list
    total: list

    @property
    def ratio(self) -> float:
        return self.hyp_len / self.ref_len if self.ref_len else 0.0

    def __str__(self) -> str:
        p = "/".join(f"{x:.1f}" for x in self.precisions)
        return (f"BLEU = {self.score:.2f} {p} (BP = {self.bp:.3f} ratio = {self.ratio:.3f} "
                f"hyp_len = {self.hyp_len} ref_len = {self.ref_len})")


def _preprocess(line: str, lowercase: bool) -> list[str]:
    return tokenize_13a((line.lower() if lowercase else line).rstrip())


def _strings(owner: str, name: str, values, none_ok: bool = False, hint: str = "") -> list:
    """values as a list of str (None allowed if none_ok); a str itself is refused: it would count its letters."""
    if isinstance(values, str) or not hasattr(values, "__iter__"):
        raise TypeError(f"{owner}: {name} must be a list of str{hint}, got {type(values).__name__}")
    values = list(values)
    for i, v in enumerate(values):
        if not isinstance(v, str) and not (none_ok and v is None):
            raise TypeError(f"{owner}: {name}[{i}] must be a str{' or None' * none_ok}, got {type(v).__name__}")
    return values


def sentence_stats(hypothesis: str, references: list, lowercase: bool = False) -> BleuStats:
    """The BleuStats of one hypothesis against its references (a list of str; None entries are skipped)."""
    if not isinstance(hypothesis, str):
        raise TypeError(f"sentence_stats: hypothesis must be a str, got {type(hypothesis).__name__}")
    references = _strings("sentence_stats", "references", references, True, " ([reference] for one)")
    hyp = _preprocess(hypothesis, lowercase)
    hyp_ngrams = count_ngrams(hyp)
    ref_max: Counter = Counter()                # each n-gram's largest count in any one reference
    ref_lens = []
    for ref in references:
        if ref is None:
            continue
        tokens = _preprocess(ref, lowercase)
        ref_lens.append(len(tokens))
        for ngram, c in count_ngrams(tokens).items():
            ref_max[ngram] = max(ref_max[ngram], c)
    # the reference length closest to the hypothesis length; on a tie, the shorter one
    ref_len = min(ref_lens, key=lambda r: (abs(len(hyp) - r), r)) if ref_lens else 0
    correct, total = [0] * MAX_ORDER, [0] * MAX_ORDER
    for ngram, c in hyp_ngrams.items():
        n = len(ngram) - 1
        total[n] += c
        correct[n] += min(c, ref_max[ngram])       # clipping: no credit beyond the reference count
    return BleuStats(len(hyp), ref_len, correct, total)


def _reference_streams(references, n: int) -> list:
    """references as a list of streams, each a list of n str (or None)."""
    refs = None if isinstance(references, str) or not hasattr(references, "__len__") else list(references)
    if refs and all(isinstance(r, str) for r in refs):
        streams = [refs]                            # one reference per hypothesis
    elif refs and all(isinstance(r, (list, tuple)) for r in refs):
        streams = [list(s) for s in refs]           # several reference streams
    else:
        got = type(references).__name__ if refs is None else [type(r).__name__ for r in refs[:3]]
        raise TypeError("corpus_bleu: references must be a non-empty list of str (one per hypothesis) or a list of "
                        f"reference streams (lists of str), got {got}")
    for k, stream in enumerate(streams):
        what = "references" if len(streams) == 1 else f"references[{k}]"
        if len(_strings("corpus_bleu", what, stream, True)) != n:
            raise ValueError(f"corpus_bleu: {what} has {len(stream)} sentences but hypotheses has {n}")
    return streams


def corpus_stats(hypotheses, references, lowercase: bool = False) -> BleuStats:
    """BleuStats summed over a corpus. Arguments as in ``corpus_bleu``."""
    if not (hypotheses := _strings("corpus_bleu", "hypotheses", hypotheses)):
        raise ValueError("corpus_bleu: hypotheses must not be empty")
    streams = _reference_streams(references, len(hypotheses))
    return sum((sentence_stats(hyp, [s[i] for s in streams], lowercase) for i, hyp in enumerate(hypotheses)),
               BleuStats())


def bleu_from_stats(stats: BleuStats) -> BleuScore:
    """BLEU from the summed statistics, with sacrebleu's default "exp" smoothing."""
    c, r = stats.hyp_len, stats.ref_len
    bp = 1.0 if c >= r else (math.exp(1 - r / c) if c > 0 else 0.0)
    precisions, halvings = [0.0] * MAX_ORDER, 1.0
    for n in range(MAX_ORDER if any(stats.correct) else 0):     # nothing correct at all: every p_n 0, BLEU 0
        if stats.total[n] == 0:
            break                                   # no n-grams of this order at all: p_n stays 0, BLEU is 0
        if stats.correct[n] == 0:
            halvings *= 2                           # exp smoothing: 1/2, 1/4, ... of one correct n-gram
            precisions[n] = 100.0 / (halvings * stats.total[n])
        else:
            precisions[n] = 100.0 * stats.correct[n] / stats.total[n]
    score = bp * math.exp(sum(math.log(p) for p in precisions) / MAX_ORDER) if min(precisions) > 0 else 0.0
    return BleuScore(score, precisions, bp, c, r, list(stats.correct), list(stats.total))


def corpus_bleu_score(hypotheses, references, lowercase: bool = False) -> BleuScore:
    """Like ``corpus_bleu``, returning the BleuScore with precisions, brevity penalty and lengths."""
    return bleu_from_stats(corpus_stats(hypotheses, references, lowercase))


def corpus_bleu(hypotheses, references, lowercase: bool = False) -> float:
    """Corpus BLEU in [0, 100], equal to ``sacrebleu.corpus_bleu(hypotheses, streams, lowercase=...).score``.
    hypotheses: list of str (detokenised output). references: list of str, one per hypothesis, or a list of
    reference streams (lists of str as long as hypotheses), as sacrebleu takes them."""
    return corpus_bleu_score(hypotheses, references, lowercase).score
