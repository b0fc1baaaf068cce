"""BLEU: the sacrebleu wrapper on hand-computed cases (each number worked out below, not taken from sacrebleu),
the reference shapes it takes, and its refusals."""

import logging
import math

import pytest

from minitransformer.kit.data.bleu import corpus_bleu, corpus_bleu_score

REFERENCES = [
    "Two young, White males are outside near many bushes.",
    "Several men in hard hats are operating a giant pulley system.",
    "It costs 3.50 dollars (or 4,000 yen) - a 10-minute walk!",
    "\"Hello,\" she said & left; the cat's toy was 1.5m long.",
]


def test_identical_is_100():
    assert corpus_bleu(REFERENCES, REFERENCES) == pytest.approx(100.0, abs=1e-12)
    assert corpus_bleu(["a b c d"], [["x"], ["a b c d"]]) == pytest.approx(100.0, abs=1e-12)


def test_13a_tokens_counted_by_hand():
    # punctuation split off, except a period or comma between digits and a dash inside a word
    assert corpus_bleu_score(["Hello, world!"], ["x"]).sys_len == 4                  # Hello , world !
    assert corpus_bleu_score(["It costs 3.50 dollars."], ["x"]).sys_len == 5         # ... 3.50 dollars .
    assert corpus_bleu_score(["4,000 yen (approx)"], ["x"]).sys_len == 5             # 4,000 yen ( approx )
    assert corpus_bleu_score(["a 10-minute walk"], ["x"]).sys_len == 5               # a 10 - minute walk
    assert corpus_bleu_score(["well-known cat's"], ["x"]).sys_len == 2
    # so detokenised output scores 100 against the same text written token by token
    assert corpus_bleu(["It costs 3.50 dollars (or 4,000 yen)."], ["It costs 3.50 dollars ( or 4,000 yen ) ."]) == \
        pytest.approx(100.0, abs=1e-12)


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
    assert score.counts == [3, 2, 1, 0] and score.totals == [4, 3, 2, 1]
    assert score.precisions == pytest.approx([75.0, 100 * 2 / 3, 50.0, 50.0])
    expected = 100 * (0.75 * (2 / 3) * 0.5 * 0.5) ** 0.25
    assert score.score == pytest.approx(expected, abs=1e-9)
    assert str(score) == "BLEU = 59.46 75.0/66.7/50.0/50.0 (BP = 1.000 ratio = 1.000 hyp_len = 4 ref_len = 4)"
    # a second zero order halves again: hyp "a b x c", ref "a b y c": p = 3/4, 1/3, 1/(2*2), 1/(4*1)
    expected2 = 100 * (0.75 * (1 / 3) * 0.25 * 0.25) ** 0.25
    assert corpus_bleu(["a b x c"], ["a b y c"]) == pytest.approx(expected2, abs=1e-9)


def test_counts_add_up_over_sentences():
    # "a b c d e" vs "a b c d f": 4/5, 3/4, 2/3, 1/2 correct; "the cat" vs "the cat sat": 2/2, 1/1, 0/0, 0/0
    score = corpus_bleu_score(["a b c d e", "the cat"], ["a b c d f", "the cat sat"])
    assert score.counts == [6, 4, 2, 1] and score.totals == [7, 5, 3, 2]
    assert (score.sys_len, score.ref_len) == (7, 8)
    expected = 100 * math.exp(1 - 8 / 7) * (6 / 7 * 4 / 5 * 2 / 3 * 1 / 2) ** 0.25
    assert score.score == pytest.approx(expected, abs=1e-9)


def test_clipping_and_closest_reference_length():
    score = corpus_bleu_score(["the the the the"], [["the cat"], ["a cat on the mat"]])
    assert score.counts[0] == 1 and score.totals[0] == 4
    # the reference length closest to the hypothesis length counts ...
    assert corpus_bleu_score(["a b c d"], [["a b"], ["a b c d e"]]).ref_len == 5
    # ... and on a tie (4 is 1 away from both 3 and 5; 2 away from both 2 and 6) the shorter one
    assert corpus_bleu_score(["a b c d"], [["a b c d e"], ["a b c"]]).ref_len == 3
    assert corpus_bleu_score(["a b c d"], [["a b c d e f"], ["a b"]]).ref_len == 2
    # a None reference is no reference: "a b" alone against the second sentence
    assert corpus_bleu_score(["x", "a b c d"], [["x", "a b"], ["x y", None]]).ref_len == 1 + 2


def test_zero_cases():
    assert corpus_bleu([""], ["a b c"]) == 0.0                    # empty hypothesis
    assert corpus_bleu(["x y z w"], ["a b c d"]) == 0.0           # nothing matches
    assert corpus_bleu(["a b c"], ["a b c"]) == 0.0               # no 4-gram at all: p_4 = 0
    s = corpus_bleu_score([""], ["a b c"])
    assert s.bp == 0.0 and s.sys_len == 0 and s.ref_len == 3


def test_lowercase():
    assert corpus_bleu(["The Cat Sat On The Mat"], ["the cat sat on the mat"]) < 100
    assert corpus_bleu(["The Cat Sat On The Mat"], ["the cat sat on the mat"], lowercase=True) == pytest.approx(100)


def test_one_stream_as_list_of_str_or_of_lists(caplog):
    hyps = ["the cat sat on the mat .", "a dog ran in the park ."] * 60
    refs = ["the cat sat on a mat .", "a dog ran in the park ."] * 60
    with caplog.at_level(logging.WARNING):
        assert corpus_bleu(hyps, refs) == corpus_bleu(hyps, [refs]) == corpus_bleu(hyps, (refs,))
    assert not caplog.records                    # no "tokenized period" warning on lines that end in " ."


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="references has 1 sentences but hypotheses has 2"):
        corpus_bleu(["a", "b"], ["a"])
    with pytest.raises(ValueError, match=r"references\[1\] has 1 sentences"):
        corpus_bleu(["a", "b"], [["a", "b"], ["a"]])
    with pytest.raises(TypeError, match="hypotheses must be a list of str"):
        corpus_bleu("a b c", ["a b c"])
    with pytest.raises(TypeError, match=r"hypotheses\[0\] must be a str"):
        corpus_bleu([3], ["a"])
    with pytest.raises(TypeError, match=r"references\[1\]\[0\] must be a str or None, got int"):
        corpus_bleu(["a"], [["a"], [3]])
    with pytest.raises(TypeError, match="references must be"):
        corpus_bleu(["a"], "a")
    with pytest.raises(ValueError, match="hypotheses must not be empty"):
        corpus_bleu([], [])
