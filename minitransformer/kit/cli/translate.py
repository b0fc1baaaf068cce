"""``minitransformer translate``: sentences in, translations out, one line each.

Each sentence is prepared as the training text was (the tokeniser's own ``pieces``: lowercased where the
model's vocabulary is, punctuation split off), and stderr says, per input line, what the model could not
read: the words it never saw (they read as <unk>), the tokens cut beyond its max_len, and a translation
that ran into the length limit. ``--quiet`` keeps stderr silent.

The length limit: a translation gets at most 2 x (source tokens) + 10 tokens, and never more than the
paper's source tokens + 50 (§6.1, meant for real sentences). A model that did not understand its input
otherwise repeats a word up to that limit: fifty words for a one-word line.
"""

from __future__ import annotations

import sys

import numpy

from minitransformer import decoding

from .common import (
    CLIError,
    choose_blas_threads,
    encode_sources,
    load_run,
    translate_ids,
)


def output_limit(src_len: int) -> int:
    """The most tokens a translation of a source of src_len tokens may have: 2 * src_len + 10, at most the
    paper's src_len + 50."""
    return min(2 * src_len + 10, src_len + decoding.EXTRA_LENGTH)


def cmd_translate(args) -> int:
    _, model, src_tok, tgt_tok, _ = load_run(args.checkpoint, args.average)
    choose_blas_threads(model.config)
    lines = args.sentences if args.sentences else [line.rstrip("\n") for line in sys.stdin]
    if src_tok is None:
        return _translate_ids(model, lines, args)
    encoded = encode_sources(model, src_tok, lines)
    hyps = translate_ids(model, encoded, beam_size=args.beam_size, alpha=args.alpha, length_limit=output_limit)
    for number, (line, src, hyp) in enumerate(zip(lines, encoded, hyps), start=1):
        if not line.strip():
            print()                                        # one line out per line in, empty stays empty
            continue
        if not args.quiet:
            _report(number, line, src, hyp, model.config.max_len, src_tok)
        print(tgt_tok.decode(hyp), flush=True)
    return 0


def _report(number: int, line: str, src: list, hyp: list, max_len: int, src_tok) -> None:
    """Tell on stderr what the model could not read in this line, and a translation cut by the limit."""
    unknown = src_tok.unknown_words(line)
    if unknown:
        print(f"line {number}: not in the model's vocabulary (read as <unk>): {', '.join(unknown)}", file=sys.stderr)
    length = len(src_tok.encode(line))
    if length > max_len:
        print(f"line {number}: {length} tokens, but the model reads at most {max_len}: the last {length - max_len} "
              f"were left out", file=sys.stderr)
    if len(hyp) >= output_limit(len(src)):
        print(f"line {number}: the translation reached the length limit ({output_limit(len(src))} tokens for "
              f"{len(src)} source tokens) without ending", file=sys.stderr)


def _translate_ids(model, lines, args) -> int:
    """copy/reverse checkpoints have no tokeniser: the input is symbol ids separated by spaces."""
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
        limit = output_limit(len(ids))
        hyp = (decoding.beam_search(model, src, beam_size=args.beam_size, alpha=args.alpha, max_len=limit)
               if args.beam_size > 1 else decoding.greedy_decode(model, src, max_len=limit))[0]
        print(" ".join(str(i) for i in hyp))
    return 0
