"""BLEU: hand-computed cases, and equality with sacrebleu's default corpus_bleu (skipped without sacrebleu)."""

import math
import random

import pytest

from minitransformer.kit.data.bleu import (
    BleuStats,
    bleu_from_stats,
    corpus_bleu,
    corpus_bleu_score,
    corpus_stats,
    count_ngrams,
    sentence_stats,
    tokenize_13a,
)

REFERENCES = [
    "Two young, White males are outside near many bushes.",
    "Several men in hard hats are operating a giant pulley system.",
    "A little girl climbing into a wooden playhouse.",
    "A man in a blue shirt is standing on a ladder cleaning windows.",
    "Two men are at the stove preparing food.",
    "A man in green holds a guitar while the other man observes his shirt.",
    "It costs 3.50 dollars (or 4,000 yen) - a 10-minute walk!",
    "\"Hello,\" she said & left; the cat's toy was 1.5m long.",
]


# ----------------------------------------------------------------------------- without sacrebleu


def test_tokenize_13a():
    assert tokenize_13a("Hello, world!") == ["Hello", ",", "world", "!"]
    assert tokenize_13a("It costs 3.50 dollars.") == ["It", "costs", "3.50", "dollars", "."]
    assert tokenize_13a("4,000 yen (approx)") == ["4,000", "yen", "(", "approx", ")"]
    assert tokenize_13a("a 10-minute walk") == ["a", "10", "-", "minute", "walk"]
    assert tokenize_13a("well-known cat's") == ["well-known", "cat's"]
    assert tokenize_13a("&quot;x&quot; &amp; y") == ['"', "x", '"', "&", "y"]
    assert tokenize_13a("") == []


def test_identical_is_100():
    assert corpus_bleu(REFERENCES, REFERENCES) == pytest.approx(100.0, abs=1e-12)
    assert corpus_bleu(["a b c d"], [["x"], ["a b c d"]]) == pytest.approx(100.0, abs=1e-12)


def test_hand_computed_brevity_penalty():
    # hypothesis "the cat sat on" vs reference "the cat sat on the mat": every n-gram matches (p_n = 1),
    # c = 4, r = 6 -> BP = exp(1 - 6/4)
    assert corpus_bleu(["the cat sat on"], ["the cat sat on the mat"]) == pytest.approx(100 * math.exp(-0.5), abs=1e-9)


def test_hand_computed_precisions_and_smoothing():
    # hyp "the the cat sat"   ref "the cat sat down"   (c = r = 4, BP = 1)
    # 1-grams: the x2 (clipped to 1), cat, sat -> 3/4
    # 2-grams: "the the" no, "the cat", "cat sat" -> 2/3
    # 3-grams: "the the cat" no, "the cat sat" -> 1/2
    # 4-gram:  "the the cat sat" no -> 0 correct of 1: exp smoothing, 1 / (2 * 1)
    score = corpus_bleu_score(["the the cat sat"], ["the cat sat down"])
    assert score.correct == [3, 2, 1, 0] and score.total == [4, 3, 2, 1]
    assert score.precisions == pytest.approx([75.0, 100 * 2 / 3, 50.0, 50.0])
    expected = 100 * (0.75 * (2 / 3) * 0.5 * 0.5) ** 0.25
    assert score.score == pytest.approx(expected, abs=1e-9)
    # a second zero order halves again: hyp "a b x c", ref "a b y c": p = 3/4, 1/3, 1/(2*2), 1/(4*1)
    expected2 = 100 * (0.75 * (1 / 3) * 0.25 * 0.25) ** 0.25
    assert corpus_bleu(["a b x c"], ["a b y c"]) == pytest.approx(expected2, abs=1e-9)


def test_clipping_and_closest_reference_length():
    stats = sentence_stats("the the the the", ["the cat", "a cat on the mat"])
    assert stats.correct[0] == 1 and stats.total[0] == 4
    # the reference length closest to the hypothesis length counts ...
    assert sentence_stats("a b c d", ["a b", "a b c d e"]).ref_len == 5
    # ... and on a tie (4 is 1 away from both 3 and 5; 2 away from both 2 and 6) the shorter one
    assert sentence_stats("a b c d", ["a b c d e", "a b c"]).ref_len == 3
    assert sentence_stats("a b c d", ["a b c d e f", "a b"]).ref_len == 2


def test_zero_cases():
    assert corpus_bleu([""], ["a b c"]) == 0.0                    # empty hypothesis
    assert corpus_bleu(["x y z w"], ["a b c d"]) == 0.0           # nothing matches
    assert corpus_bleu(["a b c"], ["a b c"]) == 0.0               # no 4-gram at all: p_4 = 0
    s = corpus_bleu_score([""], ["a b c"])
    assert s.bp == 0.0 and s.hyp_len == 0 and s.ref_len == 3


def test_stats_add_up():
    hyps, refs = ["a b c d e", "the cat"], ["a b c d f", "the cat sat"]
    total = sentence_stats(hyps[0], [refs[0]]) + sentence_stats(hyps[1], [refs[1]])
    assert total == corpus_stats(hyps, refs)
    assert bleu_from_stats(total).score == corpus_bleu(hyps, refs)
    assert BleuStats() + total == total


def test_lowercase():
    assert corpus_bleu(["The Cat Sat On The Mat"], ["the cat sat on the mat"]) < 100
    assert corpus_bleu(["The Cat Sat On The Mat"], ["the cat sat on the mat"], lowercase=True) == pytest.approx(100)


def test_count_ngrams():
    c = count_ngrams(["a", "b", "a", "b"], max_order=2)
    assert c[("a",)] == 2 and c[("a", "b")] == 2 and c[("b", "a")] == 1 and sum(c.values()) == 7


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="references has 1 sentences but hypotheses has 2"):
        corpus_bleu(["a", "b"], ["a"])
    with pytest.raises(ValueError, match=r"references\[1\] has 1 sentences"):
        corpus_bleu(["a", "b"], [["a", "b"], ["a"]])
    with pytest.raises(TypeError, match="hypotheses must be a list of str"):
        corpus_bleu("a b c", ["a b c"])
    with pytest.raises(TypeError, match=r"hypotheses\[0\] must be a str"):
        corpus_bleu([3], ["a"])
    with pytest.raises(TypeError, match="references must be"):
        corpus_bleu(["a"], "a")
    with pytest.raises(ValueError, match="hypotheses must not be empty"):
        corpus_bleu([], [])


def test_sentence_stats_checks_its_arguments():
    with pytest.raises(TypeError, match=r"sentence_stats: references must be a list of str \(\[reference\] for one\), "
                                        "got str"):
        sentence_stats("a cat", "a cat")                 # would be read letter by letter
    with pytest.raises(TypeError, match=r"sentence_stats: references\[1\] must be a str or None, got list"):
        sentence_stats("a cat", ["a cat", ["a", "cat"]])
    with pytest.raises(TypeError, match="sentence_stats: hypothesis must be a str, got list"):
        sentence_stats(["a", "cat"], ["a cat"])
    assert sentence_stats("a cat", ["a cat", None]) == sentence_stats("a cat", ["a cat"])


# ----------------------------------------------------------------------------- against sacrebleu


def _mutate(rng, sentence, vocab):
    words = sentence.split()
    words = words[: rng.randint(0, len(words) + 2)]
    out = []
    for w in words:
        r = rng.random()
        if r < 0.15:
            continue
        out.append(rng.choice(vocab) if r < 0.35 else (w.upper() if r < 0.45 else w))
    return " ".join(out)


def _cases():
    rng = random.Random(0)
    vocab = sorted({w for s in REFERENCES for w in s.split()}) + [".", ",", "the", "a"]
    cases = []
    for k in range(40):                                            # random corpora, 1 or 2 reference streams
        n = rng.randint(1, 12)
        refs = [rng.choice(REFERENCES) for _ in range(n)]
        hyps = [_mutate(rng, r, vocab) for r in refs]
        streams = [refs] if k % 2 else [refs, [_mutate(rng, r, vocab) for r in refs]]
        cases.append((hyps, streams, k % 3 == 0))
    cases += [
        ([""], [["a cat sat on the mat ."]], False),               # empty hypothesis
        (["", ""], [["a b", "c d"]], False),                       # every hypothesis empty
        (["a cat"], [["a cat sat on the mat ."]], False),          # shorter than 4 tokens
        (["a cat", "on"], [["a cat sat", "on the mat"]], False),   # no 4-grams at all
        (REFERENCES, [REFERENCES], False),                         # identical
        ([r.upper() for r in REFERENCES], [REFERENCES], True),     # identical up to case
        ([r.upper() for r in REFERENCES], [REFERENCES], False),
        (["the cat"], [["the cat sat"], ["the cat"], ["a dog"]], False),   # multiple references
        (["x y z"], [["a b c"]], False),                           # nothing matches
        (["the the the the the"], [["the cat is on the mat"]], False),    # clipping
        (["a b c d e f g h"], [["a b c d"], ["a b c d e f g h i j k l"]], False),
        (["It costs 3.50 dollars - a 10-minute walk !"], [[REFERENCES[6]]], True),
    ]
    return cases


@pytest.mark.parametrize("hyps,streams,lowercase", _cases())
def test_equals_sacrebleu(hyps, streams, lowercase):
    sacrebleu = pytest.importorskip("sacrebleu")
    expected = sacrebleu.corpus_bleu(hyps, streams, lowercase=lowercase).score
    got = corpus_bleu(hyps, streams if len(streams) > 1 else streams[0], lowercase=lowercase)
    assert abs(got - expected) < 0.01, (got, expected)
    assert got == pytest.approx(expected, abs=1e-9)                 # in fact the same arithmetic
    assert corpus_bleu(hyps, streams, lowercase=lowercase) == got  # one stream as list[list[str]] too


def test_tokenizer_equals_sacrebleu():
    pytest.importorskip("sacrebleu")
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    reference = Tokenizer13a()
    lines = REFERENCES + ["a..b", "x.,y", "3.5-4 -5", "<skipped> a-\nb", "{[|]}~^_`", "  spaced   out  ", "Ünïcödé, ok."]
    for line in lines:
        assert tokenize_13a(line) == reference(line).split(), line
