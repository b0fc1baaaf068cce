"""``minitransformer translate``: the sentences given, or each line of stdin as it arrives, one line each."""

import sys

from minitransformer import decoding
from minitransformer.kit.data.batching import translate_ids
from minitransformer.kit.data.task_data import encode_sources

from .common import CLIError, load_run


def output_limit(src_len: int) -> int:
    """The most tokens a translation of src_len source tokens may have: 2 * src_len + 10, at most src_len + 50."""
    return min(2 * src_len + 10, src_len + decoding.EXTRA_LENGTH)


def cmd_translate(args) -> int:
    _, model, src_tok, tgt_tok, _ = load_run(args.checkpoint, args.average)
    hinted = []                                            # the target-language hint is given once

    def translate(lines: list) -> None:
        """Translate (number, line) pairs and print one line each (an empty line stays empty), flushed."""
        if src_tok is None:                                # copy/reverse: no tokeniser, symbol ids
            encoded = [symbol_ids(model, line) for _, line in lines]
        else:
            encoded = encode_sources(model, src_tok, [line for _, line in lines])
        todo = [i for i, (_, line) in enumerate(lines) if line.strip()]
        hyps = dict(zip(todo, translate_ids(model, [encoded[i] for i in todo], args.beam_size, args.alpha,
                                            length_limit=output_limit)))
        for i, (number, line) in enumerate(lines):
            if src_tok is not None and i in hyps and not args.quiet:
                _report(number, line, encoded[i], hyps[i], model.config.max_len, src_tok, tgt_tok, hinted)
            text = "" if i not in hyps else tgt_tok.decode(hyps[i]) if src_tok else " ".join(map(str, hyps[i]))
            print(text, flush=True)

    if args.sentences:                                     # given at once: translated in batches
        translate(list(enumerate(args.sentences, 1)))
    for number, line in enumerate(() if args.sentences else sys.stdin, 1):   # as each line arrives
        translate([(number, line.rstrip("\n"))])
    return 0


def symbol_ids(model, line: str) -> list:
    """A copy/reverse checkpoint's input: symbol ids separated by spaces."""
    try:
        ids = [int(x) for x in line.split()]
    except ValueError:
        raise CLIError(f"this checkpoint has no tokeniser (a copy/reverse task): give token ids separated by "
                       f"spaces, e.g. \"4 5 6\", got {line!r:.80}") from None
    vocab = model.config.src_vocab_size
    if ids and (min(ids) < 4 or max(ids) >= vocab):
        raise CLIError(f"symbol ids must be in [4, {vocab}) for this checkpoint, got {line!r:.80}")
    return ids


def _report(number: int, line: str, src: list, hyp: list, max_len: int, src_tok, tgt_tok, hinted: list) -> None:
    """Tell on stderr what the model could not read in this line: unknown words, input that looks like the language
    it writes (once: ``hinted``), tokens cut beyond max_len, a translation cut by the length limit."""
    unknown = src_tok.unknown_words(line)
    if unknown:
        print(f"line {number}: not in the model's vocabulary (read as <unk>): {', '.join(unknown)}", file=sys.stderr)
    words = [piece for piece, _ in src_tok.pieces(line) if piece.isalpha()]
    known_to_target = set(words) & set(unknown) - set(tgt_tok.unknown_words(line))
    if not hinted and src_tok is not tgt_tok and sum(w in known_to_target for w in words) > len(words) / 2:
        hinted.append(number)
        print(f"line {number}: most of its words belong to the language this model translates into, not to the one "
              f"it reads: give it text in its source language", file=sys.stderr)
    length = len(src_tok.encode(line))
    if length > max_len:
        print(f"line {number}: {length} tokens, but the model reads at most {max_len}: the last {length - max_len} "
              f"were left out", file=sys.stderr)
    if len(hyp) >= output_limit(len(src)):
        print(f"line {number}: the translation reached the length limit ({output_limit(len(src))} tokens for "
              f"{len(src)} source tokens) without ending", file=sys.stderr)
