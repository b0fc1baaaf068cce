"""``minitransformer translate``: sentences in, translations out, one line each."""

from __future__ import annotations

import sys

import numpy

from .. import decoding
from .common import CLIError, load_run, translate_texts


def cmd_translate(args) -> int:
    _, model, src_tok, tgt_tok, _ = load_run(args.checkpoint)
    lines = args.sentences if args.sentences else [line.rstrip("\n") for line in sys.stdin]
    if src_tok is None:
        return _translate_ids(model, lines, args)
    outputs = translate_texts(model, src_tok, tgt_tok, lines, beam_size=args.beam_size, alpha=args.alpha)
    for line, text in zip(lines, outputs):
        print(text if line.strip() else "")
    return 0


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
        hyp = (decoding.beam_search(model, src, beam_size=args.beam_size, alpha=args.alpha) if args.beam_size > 1
               else decoding.greedy_decode(model, src))[0]
        print(" ".join(str(i) for i in hyp))
    return 0
