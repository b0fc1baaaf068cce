"""BPE on one very long word: encoding time for words of 10 KB, 100 KB and 1 MB, and learning from text that holds
a 200 KB word, with the tokenizer's merge loop ("new": a heap of pair ranks over a linked list of symbols) and
with the plain loop that rescans the whole word after every merge ("old", kept here as the reference: it takes
O(n) per merge, so a word of n characters costs O(n^2)).

    python benchmarks/bench_bpe.py                 # new for every size, old up to --old-max characters
    python benchmarks/bench_bpe.py --old-max 0     # new only

The merges are learned from the toy corpus (2,000 merges asked, min frequency 1); the words are random letters
of its alphabet, and the corpus itself with its spaces taken out (where most of the merges apply). Both loops give the same symbols (checked
here on every size both run).
"""

from __future__ import annotations

import argparse
import itertools
import random
import time

from minitransformer.kit.data import datasets
from minitransformer.kit.data.tokenizers import (
    BPETokenizer,
    _initial_symbols,
    _merge_pair,
)

SIZES = (10_000, 100_000, 1_000_000)


def old_apply_merges(ranks: dict, symbols: list) -> list:
    """The plain loop: find the lowest-ranked adjacent pair in the whole word, merge it everywhere, repeat."""
    while len(symbols) > 1:
        best = min(set(itertools.pairwise(symbols)), key=lambda p: ranks.get(p, len(ranks)))
        if best not in ranks:
            break
        symbols = _merge_pair(symbols, best)
    return symbols


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--old-max", type=int, default=100_000, help="longest word the old loop runs on")
    args = parser.parse_args()
    texts = [s for pair in datasets.load_toy("train") for s in pair]
    tok = BPETokenizer.learn(texts, num_merges=2000, min_frequency=1)
    alphabet = sorted({ch for text in texts for ch in text if ch.isalpha()})
    rng = random.Random(0)
    print(f"{len(tok.merges)} merges learned from the toy corpus; alphabet of {len(alphabet)} letters")
    corpus_letters = "".join(ch for text in texts for ch in text if ch.isalpha())     # the corpus, spaces out
    words = [("random letters", lambda n: "".join(rng.choice(alphabet) for _ in range(n))),
             ("corpus without spaces", lambda n: (corpus_letters * (n // len(corpus_letters) + 1))[:n])]
    for (kind, make), n in itertools.product(words, SIZES):
        word = make(n)
        symbols = _initial_symbols(word, True)
        new, t_new = timed(tok._apply_merges, symbols)
        line = f"{kind}, one word of {n:>9,} characters: new {t_new:8.3f} s ({len(new):,} symbols)"
        if n <= args.old_max:
            old, t_old = timed(old_apply_merges, tok.ranks, symbols)
            assert old == new, "the two loops disagree"
            line += f"   old {t_old:8.3f} s (same symbols)"
        print(line, flush=True)
        _, t_encode = timed(tok.encode, word)
        print(f"  tok.encode of the same text (pieces, merges, ids): {t_encode:.3f} s", flush=True)
    word = "".join(rng.choice(alphabet) for _ in range(200_000))
    as_words = " ".join(word[i:i + 6] for i in range(0, len(word), 6))
    _, t_plain = timed(BPETokenizer.learn, texts, vocab_size=8000)
    _, t_words = timed(BPETokenizer.learn, texts + [as_words], vocab_size=8000)
    _, t_learn = timed(BPETokenizer.learn, texts + [word], vocab_size=8000)
    print(f"learn vocab_size=8000 (the command line's default) from the toy corpus: {t_plain:.3f} s; plus 200,000 "
          f"random letters as words of 6: {t_words:.3f} s; plus the same letters as one word: {t_learn:.3f} s")

if __name__ == "__main__":
    main()
