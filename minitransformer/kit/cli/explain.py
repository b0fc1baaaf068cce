"""``minitransformer explain``: one sentence translated, and the page that shows it inside the model."""

import os
import sys

from minitransformer.kit.data.task_data import encode_sources
from minitransformer.kit.running import viz

from .common import CLIError, load_run
from .translate import symbol_ids


def cmd_explain(args) -> int:
    _, model, src_tok, tgt_tok, _ = load_run(args.checkpoint, args.average)
    if not args.sentence.strip():
        raise CLIError("give a sentence to explain (symbol ids separated by spaces for a copy/reverse run), got an "
                       "empty one")
    if src_tok is None:                                    # copy/reverse: symbol ids
        src, tokenizers = symbol_ids(model, args.sentence), None
        tgt = None if args.target is None else symbol_ids(model, args.target)
    else:
        src, tokenizers = encode_sources(model, src_tok, [args.sentence])[0], (src_tok, tgt_tok)
        tgt = args.target                                  # a text (or None): the viewer reads it with tgt_tok
        unknown = src_tok.unknown_words(args.sentence)
        if unknown:
            print(f"not in the model's vocabulary (read as <unk>): {', '.join(unknown)}", file=sys.stderr)
    explanation = viz.explain(model, src, tgt, tokenizers=tokenizers, beam_size=args.beam_size, alpha=args.alpha)
    path = explanation.save(args.out)
    ids = explanation.data["output_ids"]
    print(f"translation: {tgt_tok.decode(ids) if tgt_tok else ' '.join(map(str, ids))}")
    for note in explanation.data["notes"]:
        print(f"note: {note}", file=sys.stderr)
    print(f"wrote {os.path.abspath(path)}: open it in a browser")
    return 0
