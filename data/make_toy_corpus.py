"""The toy English -> German grammar, and the script that writes with it the corpus the package ships
(minitransformer/kit/data/toy/{train,valid,test}.{en,de}.txt, which ``datasets.load_toy`` reads).

    python data/make_toy_corpus.py              # the shipped corpus (seed 0, 6000 / 500 / 500 pairs)
    python data/make_toy_corpus.py --out /tmp/toy --seed 3

A student can train on it in minutes, and it still needs attention: German does not keep the English word order
and marks what English leaves out.
- gender and case on the article:  "the cat sees the dog" -> "die katze sieht den hund" (accusative),
                                   "the cat helps the dog" -> "die katze hilft dem hund" (dative verb)
- adjective agreement:             "a big dog" -> "ein großer hund", "with the big dog" -> "mit dem großen hund"
- verb second after a fronted adverb:  "today the dog sees the cat" -> "heute sieht der hund die katze"
- the verb bracket of the perfect:     "the dog has seen the cat"   -> "der hund hat die katze gesehen"
- verb-final subordinate clauses:      "... because the dog sees the cat" -> "... , weil der hund die katze sieht"
- plural (and its dative -n), "in dem" -> "im", "a" / "an".

The words, articles and adjective endings are data, in toy_lexicon.json beside this script. Everything is
lowercase, every punctuation mark its own token, so a word tokeniser and BLEU's 13a see the same tokens. The only
randomness is ``random.Random(seed).random()``, whose sequence Python keeps across versions: the same seed writes
the same corpus everywhere (tests/test_datasets.py checks the shipped files against seed 0). Distinct pairs are
drawn and split in order (train, valid, test), so no sentence of either language is in two splits.
"""

import argparse
import itertools
import json
import random
import sys
from collections import namedtuple
from pathlib import Path

DEFAULT_SEED = 0
PACKAGE_TOY = Path(__file__).resolve().parents[1] / "minitransformer" / "kit" / "data" / "toy"    # what ships
SPLITS = ("train", "valid", "test")
SPLIT_SIZES = {"train": 6000, "valid": 500, "test": 500}
MIN_TOKENS, MAX_TOKENS = 5, 20          # sentence length in tokens, both sides, punctuation included
ANIMATE = ("person", "animal")          # the noun kinds: person, animal, thing, place

_LEXICON = json.loads((Path(__file__).parent / "toy_lexicon.json").read_text(encoding="utf-8"))
# A noun: English singular and plural; German singular, plural and dative plural (plural + "n" unless it ends in
# -n or -s); gender "m" | "f" | "n"; kind, what the noun can do.
Noun = namedtuple("Noun", "en en_pl de de_pl de_dat_pl gender kind")
NOUNS = [Noun(en, en_pl, de, pl, pl if pl.endswith(("n", "s")) else pl + "n", gender, kind)
         for kind, gender, en, en_pl, de, pl in _LEXICON["nouns"]]
# English, then the German predicative form (after "ist"); the stem that takes an ending drops a final e (müd-).
Adjective = namedtuple("Adjective", "en stem predicative")
ADJECTIVES = [Adjective(en, de.removesuffix("e"), de) for en, de in _LEXICON["adjectives"]]
ANIMATE_PREDICATES, THING_PREDICATES = _LEXICON["animate_predicates"], _LEXICON["thing_predicates"]
_ADJ = {a.en: a for a in ADJECTIVES}
# frame: "acc" (one accusative object), "dat" (one dative object), "dat_acc" (dative, then accusative).
# aux: the perfect's auxiliary, "haben" or "sein". subj / obj: the noun kinds that fit.
Verb = namedtuple("Verb", "en en_pl en_part de de_pl de_part aux frame subj obj")
VERBS = [Verb(*fields) for fields in _LEXICON["verbs"]]
AUX = _LEXICON["aux"]                                   # haben: [hat, haben], German 3rd person singular, plural
REPORT_VERBS, CONJUNCTIONS = _LEXICON["report_verbs"], _LEXICON["conjunctions"]    # [says, say, sagt, sagen]
PREPOSITIONS = _LEXICON["prepositions"]                 # English, German, the case it governs, the noun kinds it takes
TIME_PRESENT, TIME_PERFECT = _LEXICON["time_present"], _LEXICON["time_perfect"]
# {determiner: {case: {gender or "pl": form}}}: articles ("def", "indef"; a bare plural, "dogs", has none) and
# adjective endings: weak after "der", mixed after "ein", strong with no article ("none", plural only here).
ARTICLES, ADJECTIVE_ENDINGS = _LEXICON["articles"], _LEXICON["adjective_endings"]


def _pick(rng: random.Random, items):
    """One item, using only rng.random() (the call whose sequence Python keeps stable)."""
    return items[int(rng.random() * len(items))]


def noun_phrase(rng: random.Random, kinds, case: str, adjective_p: float = 0.35):
    """A noun phrase in both languages.   -> (English tokens, German tokens, "sg" | "pl")"""
    noun = _pick(rng, [n for n in NOUNS if n.kind in kinds])
    number = "pl" if rng.random() < 0.3 else "sg"
    det = ("def" if rng.random() < 0.6 else "none") if number == "pl" else ("def" if rng.random() < 0.65 else "indef")
    adjective = _ADJ[_pick(rng, THING_PREDICATES if noun.kind in ("thing", "place") else ANIMATE_PREDICATES)] \
        if rng.random() < adjective_p else None

    en = ([adjective.en] if adjective else []) + [noun.en_pl if number == "pl" else noun.en]
    if det == "def":
        en = ["the"] + en
    elif det == "indef":
        en = ["an" if en[0][0] in "aeiou" else "a"] + en

    key = "pl" if number == "pl" else noun.gender
    de_noun = noun.de if number == "sg" else (noun.de_dat_pl if case == "dat" else noun.de_pl)
    de = ([adjective.stem + ADJECTIVE_ENDINGS[det][case][key]] if adjective else []) + [de_noun]
    if det != "none":
        de = [ARTICLES[det][case][key]] + de
    return en, de, number


def prepositional_phrase(rng: random.Random):
    """'in the garden' -> 'im garten', 'for a dog' -> 'für einen hund'.   -> (English, German)"""
    en_prep, de_prep, case, kinds = _pick(rng, PREPOSITIONS)
    en, de, _ = noun_phrase(rng, kinds, case, adjective_p=0.2)
    if de_prep == "in" and de[0] == "dem":
        return [en_prep] + en, ["im"] + de[1:]           # "in dem" contracts to "im"
    return [en_prep] + en, [de_prep] + de


# One clause in parts: the English tokens, and the German in the pieces that word order moves around.
Clause = namedtuple("Clause", "en subj finite middle end tense")


def clause(rng: random.Random, pp_p: float) -> Clause:
    """One clause, kept in parts so the caller can put the German verb where the clause type wants it.

    -> Clause(en tokens, German subject, finite verb, middle field, end, tense), German orders
       main:        subject finite middle end          "der hund hat die katze gesehen"
       inverted:    finite subject middle end          "(heute) hat der hund die katze gesehen"
       subordinate: subject middle end finite          "(weil) der hund die katze gesehen hat"
    """
    if _pick(rng, ["verb"] * 5 + ["copula"]) == "copula":
        animate = rng.random() < 0.6
        en_subj, de_subj, number = noun_phrase(rng, ANIMATE if animate else ("thing",), "nom")
        adjective = _ADJ[_pick(rng, ANIMATE_PREDICATES if animate else THING_PREDICATES)]
        en = en_subj + ["is" if number == "sg" else "are", adjective.en]
        return Clause(en, de_subj, ["ist" if number == "sg" else "sind"], [adjective.predicative], [], "present")

    verb = _pick(rng, VERBS)
    en_subj, de_subj, number = noun_phrase(rng, verb.subj, "nom")
    objects = []                                          # (English, German) of each object, then a phrase
    if verb.frame in ("dat", "dat_acc"):
        objects.append(noun_phrase(rng, ANIMATE if verb.frame == "dat_acc" else verb.obj, "dat")[:2])
    if verb.frame in ("acc", "dat_acc"):
        objects.append(noun_phrase(rng, verb.obj, "acc")[:2])
    if rng.random() < pp_p:
        objects.append(prepositional_phrase(rng))
    en_obj, de_obj = [w for e, _ in objects for w in e], [w for _, d in objects for w in d]

    singular = number == "sg"
    if rng.random() < 0.3:                                # perfect: has seen / hat ... gesehen
        en = en_subj + ["has" if singular else "have", verb.en_part] + en_obj
        return Clause(en, de_subj, [AUX[verb.aux][0 if singular else 1]], de_obj, [verb.de_part], "perfect")
    en = en_subj + [verb.en if singular else verb.en_pl] + en_obj
    return Clause(en, de_subj, [verb.de if singular else verb.de_pl], de_obj, [], "present")


_ORDERS = {"main": "subj finite middle end", "inverted": "finite subj middle end", "sub": "subj middle end finite"}


def _german(c: Clause, order: str) -> list:
    """The German words of a clause in one of the three orders of ``clause``'s docstring."""
    return [word for part in _ORDERS[order].split() for word in getattr(c, part)]


def sentence_pair(rng: random.Random) -> tuple[str, str]:
    """One (English, German) sentence pair, lowercase, tokens separated by single spaces."""
    shape = _pick(rng, ["simple"] * 5 + ["fronted"] * 2 + ["then_sub"] * 3 + ["sub_first"] * 2 + ["report"] * 2)
    if shape in ("simple", "fronted"):
        c = clause(rng, pp_p=0.35)
        if shape == "fronted":                           # verb second: the finite verb moves before the subject
            en_time, de_time = _pick(rng, TIME_PERFECT if c.tense == "perfect" else TIME_PRESENT)
            en, de = en_time.split() + c.en, de_time.split() + _german(c, "inverted")
        else:
            en, de = c.en, _german(c, "main")
    elif shape == "then_sub":                            # main clause, then a verb-final subordinate clause
        main, sub = clause(rng, pp_p=0.25), clause(rng, pp_p=0.15)
        en_conj, de_conj = _pick(rng, CONJUNCTIONS)
        en = main.en + [en_conj] + sub.en
        de = _german(main, "main") + [",", de_conj] + _german(sub, "sub")
    elif shape == "sub_first":                           # subordinate clause first, then the main clause's verb
        sub, main = clause(rng, pp_p=0.15), clause(rng, pp_p=0.25)
        en_conj, de_conj = _pick(rng, CONJUNCTIONS)
        en = [en_conj] + sub.en + [","] + main.en
        de = [de_conj] + _german(sub, "sub") + [","] + _german(main, "inverted")
    else:                                                # "the woman says that ..." -> "die frau sagt , dass ..."
        en_subj, de_subj, number = noun_phrase(rng, ("person",), "nom")
        en_verb, en_verb_pl, de_verb, de_verb_pl = _pick(rng, REPORT_VERBS)
        sub = clause(rng, pp_p=0.2)
        singular = number == "sg"
        en = en_subj + [en_verb if singular else en_verb_pl, "that"] + sub.en
        de = de_subj + [de_verb if singular else de_verb_pl, ",", "dass"] + _german(sub, "sub")
    return " ".join(en + ["."]), " ".join(de + ["."])


def generate_corpus(seed: int = DEFAULT_SEED, sizes: dict | None = None) -> dict:
    """The toy corpus: {split: [(english, german), ...]}, disjoint and deterministic; sizes: pairs per split."""
    sizes = dict(SPLIT_SIZES if sizes is None else sizes)
    if set(sizes) != set(SPLITS) or any(not isinstance(n, int) or n < 0 for n in sizes.values()):
        raise ValueError(f"generate_corpus: sizes must map each of {SPLITS} to a non-negative int, got {sizes!r}")
    rng, wanted = random.Random(seed), sum(sizes.values())
    pairs, seen_en, seen_de = [], set(), set()
    for _ in range(50 * wanted + 1000):
        if len(pairs) == wanted:
            break
        en, de = sentence_pair(rng)
        if MIN_TOKENS <= en.count(" ") + 1 <= MAX_TOKENS and MIN_TOKENS <= de.count(" ") + 1 <= MAX_TOKENS \
                and en not in seen_en and de not in seen_de:   # distinct on both sides: splits cannot overlap
            seen_en.add(en)
            seen_de.add(de)
            pairs.append((en, de))
    if len(pairs) < wanted:
        raise RuntimeError(f"generate_corpus: could not draw {wanted} distinct pairs")
    ends = list(itertools.accumulate(sizes[split] for split in SPLITS))
    return {split: pairs[end - sizes[split]:end] for split, end in zip(SPLITS, ends)}


def write_corpus(corpus: dict, directory) -> list[Path]:
    """Write {split}.en.txt and {split}.de.txt (UTF-8, one sentence a line) under directory. -> the paths written."""
    (directory := Path(directory)).mkdir(parents=True, exist_ok=True)
    written = []
    for (split, pairs), (side, lang) in itertools.product(corpus.items(), enumerate(("en", "de"))):
        path = directory / f"{split}.{lang}.txt"
        path.write_text("".join(pair[side] + "\n" for pair in pairs), encoding="utf-8")
        written.append(path)
    return written


def _seed(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return int(text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Write the toy English -> German corpus.")
    parser.add_argument("--out", type=Path, default=PACKAGE_TOY, help="output directory (default: the package's)")
    parser.add_argument("--seed", type=_seed, default=DEFAULT_SEED, help="random seed (>= 0)")
    args = parser.parse_args(argv)

    corpus = generate_corpus(seed=args.seed)
    paths = write_corpus(corpus, args.out)
    total = sum(p.stat().st_size for p in paths)
    for split, pairs in corpus.items():
        print(f"{split:5s} {len(pairs):5d} pairs   e.g. {pairs[0][0]}  ->  {pairs[0][1]}")
    print(f"wrote {len(paths)} files, {total / 1024:.0f} KiB, to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
