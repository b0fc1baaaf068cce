"""Write the bundled toy English -> German corpus to minitransformer/kit/data/toy/{train,valid,test}.{en,de}.txt.

    python data/make_toy_corpus.py              # the default corpus (seed 0, 6000 / 500 / 500 pairs)
    python data/make_toy_corpus.py --out /tmp/toy --seed 3

The grammar lives in minitransformer/kit/data/toy_grammar.py; this script only runs it and writes the files.
The same seed always writes the same files (tests/test_datasets.py checks that the files here match).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:          # run from a checkout without installing the package
    sys.path.insert(0, str(REPO_ROOT))

from minitransformer.kit.data import toy_grammar  # after the sys.path entry above


def _seed(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return int(text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "minitransformer" / "kit" / "data" / "toy", help="output directory")
    parser.add_argument("--seed", type=_seed, default=toy_grammar.DEFAULT_SEED, help="random seed (>= 0)")
    args = parser.parse_args(argv)

    corpus = toy_grammar.generate_corpus(seed=args.seed)
    paths = toy_grammar.write_corpus(corpus, args.out)
    total = sum(p.stat().st_size for p in paths)
    for split, pairs in corpus.items():
        print(f"{split:5s} {len(pairs):5d} pairs   e.g. {pairs[0][0]}  ->  {pairs[0][1]}")
    print(f"wrote {len(paths)} files, {total / 1024:.0f} KiB, to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
