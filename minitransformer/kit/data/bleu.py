"""Corpus BLEU (Papineni et al. 2002) as the field reports it: sacrebleu's default ``corpus_bleu`` (13a
tokenisation, "exp" smoothing), behind checks that name a bad argument. sacrebleu alone would score a str
letter by letter and silently cut the longer of two streams of unequal length.

    BLEU = BP * exp( (1/4) * sum_{n=1..4} log p_n )          (reported x 100)
"""


def _strings(name: str, values, none_ok: bool = False, n: int | None = None) -> list:
    """values as a list of str (None entries allowed if none_ok), as many as the n hypotheses if n is given."""
    if isinstance(values, str) or not hasattr(values, "__iter__"):
        raise TypeError(f"corpus_bleu: {name} must be a list of str, got {type(values).__name__}")
    values = list(values)
    for i, v in enumerate(values):
        if not isinstance(v, str) and not (none_ok and v is None):
            raise TypeError(f"corpus_bleu: {name}[{i}] must be a str{' or None' * none_ok}, got {type(v).__name__}")
    if n is not None and len(values) != n:
        raise ValueError(f"corpus_bleu: {name} has {len(values)} sentences but hypotheses has {n}")
    return values


def _reference_streams(references, n: int) -> list:
    """references as a list of streams, each a list of n str (or None: no such reference for that sentence)."""
    refs = None if isinstance(references, str) or not hasattr(references, "__len__") else list(references)
    if refs and all(isinstance(r, str) for r in refs):
        refs = [refs]                               # one reference per hypothesis
    elif not (refs and all(isinstance(r, (list, tuple)) for r in refs)):
        got = type(references).__name__ if refs is None else [type(r).__name__ for r in refs[:3]]
        raise TypeError("corpus_bleu: references must be a non-empty list of str (one per hypothesis) or a list of "
                        f"reference streams (lists of str), got {got}")
    names = ["references"] if len(refs) == 1 else [f"references[{k}]" for k in range(len(refs))]
    return [_strings(name, stream, none_ok=True, n=n) for name, stream in zip(names, refs)]


def corpus_bleu_score(hypotheses, references, lowercase: bool = False):
    """Like ``corpus_bleu``, returning sacrebleu's BLEUScore: ``score``, ``precisions`` p_n (in %), ``counts`` and
    ``totals`` (correct and hypothesis n-grams per order), ``bp``, ``sys_len``, ``ref_len``; it prints as sacrebleu
    does ("BLEU = 96.26 98.8/97.1/95.5/94.0 (BP = 0.999 ratio = 0.999 hyp_len = 2317 ref_len = 2319)")."""
    import sacrebleu  # on first use, so that `import minitransformer` does not load it

    if not (hypotheses := _strings("hypotheses", hypotheses)):
        raise ValueError("corpus_bleu: hypotheses must not be empty")
    streams = _reference_streams(references, len(hypotheses))
    # force=True only silences the warning about lines that end in " ." (the toy corpus writes them so)
    return sacrebleu.corpus_bleu(hypotheses, streams, lowercase=bool(lowercase), force=True)


def corpus_bleu(hypotheses, references, lowercase: bool = False) -> float:
    """Corpus BLEU in [0, 100], equal to ``sacrebleu.corpus_bleu(hypotheses, streams, lowercase=...).score``.
    hypotheses: list of str (detokenised output). references: list of str, one per hypothesis, or a list of
    reference streams (lists of str as long as hypotheses), as sacrebleu takes them."""
    return corpus_bleu_score(hypotheses, references, lowercase).score
