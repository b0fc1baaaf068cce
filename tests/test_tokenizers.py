"""Tokenisers: special ids, BPE merges worked out by hand, exact round trips, JSON, input checks."""

import hashlib
import heapq
import itertools
import json
import random

import numpy as np
import pytest

from minitransformer.kit.data import datasets, tokenizers
from minitransformer.kit.data.tokenizers import (
    BPETokenizer,
    WordTokenizer,
    load_tokenizer,
    readable_tokens,
    tokenizer_from_dict,
    tokenizer_from_json,
)
from minitransformer.kit.data.vocab import BOS, EOS, PAD, SPECIAL_TOKENS, UNK, Vocab, split_pieces

# Sennrich et al.'s example: low x5, lower x2, newest x6, widest x3.
SENNRICH = ["low " * 5 + "lower " * 2 + "newest " * 6 + "widest " * 3]

TEXTS = [
    "Two young, White males are outside near many bushes.",
    "Several men in hard hats are operating a giant pulley system.",
    "A little girl climbing into a wooden playhouse.",
    "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche.",
    "Mehrere Männer mit Schutzhelmen bedienen ein Antriebsradsystem.",
    "Ein kleines Mädchen klettert in ein Spielhaus aus Holz.",
    "The dog's ball (red) costs 3.50 euros - cheap!",
]


def test_special_tokens():
    assert (PAD, BOS, EOS, UNK) == (0, 1, 2, 3)
    assert SPECIAL_TOKENS == ("<pad>", "<bos>", "<eos>", "<unk>")
    for tok in (WordTokenizer.build(TEXTS), BPETokenizer.learn(TEXTS, num_merges=20)):
        assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (0, 1, 2, 3)
        assert tok.vocab.itos[:4] == list(SPECIAL_TOKENS)
        assert len(tok) == tok.vocab_size == len(tok.vocab)


def test_split_pieces_marks_word_ends():
    assert split_pieces("the dog.") == [("the", True), ("dog", False), (".", True)]
    assert split_pieces("  (a)  b ") == [("(", False), ("a", False), (")", True), ("b", True)]
    assert split_pieces("") == []


def test_bpe_merges_worked_out_by_hand():
    # Initial pair counts (</w> ends a word):
    #   l o 7, o w</w> 5, o w 2, w e 8, e r</w> 2, n e 6, e w 6, e s 9, s t</w> 9, w i 3, i d 3, d e 3
    # 1. (e, s) 9          ties with (s, t</w>) 9: the alphabetically first pair wins
    # 2. (es, t</w>) 9     newest -> n e w est</w>, widest -> w i d est</w>
    # 3. (l, o) 7
    # 4. (e, w) 6          ties at 6: (e, w) < (n, e) < (w, est</w>)
    # 5. (ew, est</w>) 6   ties with (n, ew) 6
    # 6. (n, ewest</w>) 6
    # 7. (lo, w</w>) 5
    # 8. (d, est</w>) 3    ties at 3 with (i, d), (w, i); (lo, w) (w, e) (e, r</w>) are at 2
    # 9. (i, dest</w>) 3
    # 10. (w, idest</w>) 3
    tok = BPETokenizer.learn(SENNRICH, num_merges=10)
    assert tok.merges == [("e", "s"), ("es", "t</w>"), ("l", "o"), ("e", "w"), ("ew", "est</w>"),
                          ("n", "ewest</w>"), ("lo", "w</w>"), ("d", "est</w>"), ("i", "dest</w>"),
                          ("w", "idest</w>")]
    assert tok.tokenize("low newest widest") == ["low</w>", "newest</w>", "widest</w>"]
    # an unseen word is built from the learned pieces
    assert tok.tokenize("lowest") == ["lo", "w", "est</w>"]
    # vocabulary = specials + every character (plain and </w>) + one symbol per merge + <unk></w>
    chars = sorted(set("lowernstid"))
    assert len(tok) == 4 + 2 * len(chars) + 10 + 1


def test_bpe_stops_when_no_pair_is_frequent_enough():
    tok = BPETokenizer.learn(["ab ab cd"], num_merges=100)
    assert tok.merges == [("a", "b</w>")]          # (c, d</w>) occurs once, below min_frequency=2
    assert BPETokenizer.learn(["ab ab cd"], num_merges=100, min_frequency=1).merges == [("a", "b</w>"), ("c", "d</w>")]


def test_bpe_vocab_size():
    tok = BPETokenizer.learn(TEXTS * 3, vocab_size=150)
    assert len(tok) == 150
    smallest = 4 + 2 * len(set("".join(TEXTS)) - {" "}) + 1      # specials, the alphabet, <unk></w>
    tok = BPETokenizer.learn(TEXTS, vocab_size=smallest)
    assert len(tok) == smallest and tok.merges == [] and tok.vocab.itos[-1] == "<unk></w>"
    with pytest.raises(ValueError, match=f"vocab_size={smallest - 1} is smaller .* at least {smallest}"):
        BPETokenizer.learn(TEXTS, vocab_size=smallest - 1)
    with pytest.raises(ValueError, match="vocab_size"):
        BPETokenizer.learn(TEXTS, vocab_size=10)
    with pytest.raises(ValueError, match="exactly one"):
        BPETokenizer.learn(TEXTS)
    with pytest.raises(ValueError, match="exactly one"):
        BPETokenizer.learn(TEXTS, vocab_size=100, num_merges=5)


@pytest.mark.parametrize("num_merges", [0, 10, 200, 10_000])
def test_bpe_round_trip_seen_and_unseen(num_merges):
    tok = BPETokenizer.learn(TEXTS, num_merges=num_merges)
    unseen = [
        "Two girls in a wooden house.",                 # new combination of known words
        "Ein Mann, ein Hund (zwei Bälle)!",              # new words, known characters
        "  more   spaces\tand\nnewlines  ",           # whitespace is normalised to single spaces
        "lowercase! 3.50-5.00 (Männer's)",
        "",
    ]
    assert set("".join(unseen)) - set(" \t\n") <= set("".join(TEXTS))   # only characters seen in training
    for text in TEXTS + unseen:
        ids = tok.encode(text)
        assert UNK not in ids, text
        assert tok.decode(ids) == " ".join(text.split()), text
        assert all(isinstance(i, int) for i in ids)


def test_bpe_lowercase():
    tok = BPETokenizer.learn(TEXTS, num_merges=100, lowercase=True)
    assert tok.encode("A Little GIRL.") == tok.encode("a little girl.")
    assert tok.decode(tok.encode("A Little GIRL.")) == "a little girl."
    assert tokenizer_from_json(tok.to_json()).encode("WHITE") == tok.encode("white")
    assert all(t == t.lower() for t in tok.vocab.itos)


def test_bpe_unknown_characters_become_unk():
    tok = BPETokenizer.learn(TEXTS, num_merges=50)
    ids = tok.encode("ein 猫")
    assert tok.vocab.itos[ids[-1]] == "<unk></w>"          # the end-of-word form of <unk>: 猫 ends the text
    assert tok.decode(ids) == "ein <unk>"
    assert tok.encode("ein 猫s")[-2:] == [UNK, tok.vocab["s</w>"]]


@pytest.mark.parametrize("text", [
    "the dog€ runs",            # at the end of a word
    "x y",                      # whole unknown words
    "€dog runs",                # at the start of a word
    "do€g runs",                # in the middle
    "the dog€. runs ö",         # an unknown piece before a known one, and a last word of one unknown character
    "(€) dog€€ €€ ab€cd€ the€",
])
def test_bpe_unknown_characters_keep_word_boundaries(text):
    tok = BPETokenizer.learn(["the dog runs", "a cat sleeps"], num_merges=5)
    seen = set("the dog runs a cat sleeps")
    expected = " ".join("".join(ch if ch in seen or ch.isspace() else "<unk>" for ch in text).split())
    assert tok.decode(tok.encode(text)) == expected


# What BPETokenizer.learn(OLD_CORPUS, num_merges=4).to_dict() gave before <unk></w> existed: a vocabulary
# saved then (in a checkpoint, say) must load to the same ids.
OLD_CORPUS = ["the dog runs", "the cat runs", "a dog sleeps"]
OLD_SAVED = {
    "type": "bpe", "lowercase": False,
    "tokens": ["<pad>", "<bos>", "<eos>", "<unk>", "a", "a</w>", "c", "c</w>", "d", "d</w>", "e", "e</w>", "g",
               "g</w>", "h", "h</w>", "l", "l</w>", "n", "n</w>", "o", "o</w>", "p", "p</w>", "r", "r</w>", "s",
               "s</w>", "t", "t</w>", "u", "u</w>", "do", "dog</w>", "he</w>", "ns</w>"],
    "merges": [["d", "o"], ["do", "g</w>"], ["h", "e</w>"], ["n", "s</w>"]],
}


def test_bpe_ids_of_known_text_are_those_of_older_vocabularies():
    tok = BPETokenizer.learn(OLD_CORPUS, num_merges=4)
    assert tok.vocab.itos == OLD_SAVED["tokens"] + ["<unk></w>"]     # the one new symbol comes last
    old = BPETokenizer.from_dict(OLD_SAVED)
    assert len(old) == len(OLD_SAVED["tokens"])                       # a checkpoint's embedding still fits
    text = "the dog runs a cat"
    assert tok.encode(text) == old.encode(text) == [28, 34, 33, 24, 30, 35, 5, 6, 4, 29]
    # An old vocabulary has no <unk></w>: an unknown character at the end of a word is <unk>, as it was.
    assert old.encode("the dog€")[-1] == UNK


def test_bpe_merges_shrink_sequences():
    text = " ".join(TEXTS)
    lengths = [len(BPETokenizer.learn(TEXTS, num_merges=m).encode(text)) for m in (0, 10, 40)]
    assert lengths[0] == sum(len(p) for p, _ in split_pieces(text))   # no merges: one id per character
    assert lengths[0] > lengths[1] > lengths[2]


def test_bpe_encode_matches_training_segmentation():
    # After learning, the training words are segmented exactly as the learner left them.
    tok = BPETokenizer.learn(SENNRICH, num_merges=7)
    assert tok.tokenize("low lower newest widest") == ["low</w>", "lo", "w", "e", "r</w>", "newest</w>",
                                                       "w", "i", "d", "est</w>"]


def test_decode_special_ids():
    tok = BPETokenizer.learn(TEXTS, num_merges=100)
    ids = tok.encode("A little girl.")
    assert tok.encode("A little girl.", add_bos=True, add_eos=True) == [BOS] + ids + [EOS]
    padded = [BOS] + ids + [EOS] + [PAD, PAD]
    assert tok.decode(padded) == "A little girl."
    assert tok.decode(ids + [EOS] + ids) == "A little girl."   # stops at the first <eos>
    assert tok.decode(np.array(padded, dtype=np.int64)) == "A little girl."
    assert "<bos>" in tok.decode(padded, skip_special=False)


def test_word_tokenizer():
    tok = WordTokenizer.build(["the dog sees the cat .", "the cat , too ."], min_freq=1)
    assert tok.vocab.itos[4:] == ["the", ".", "cat", ",", "dog", "sees", "too"]   # by count, then alphabetical
    assert tok.tokenize("The dog, too.") == ["The", "dog", ",", "too", "."]
    ids = tok.encode("the dog sees a cat .")
    assert ids[3] == UNK
    assert tok.decode(tok.encode("the cat sees the dog .")) == "the cat sees the dog ."
    lower = WordTokenizer.build(["The Dog ."], lowercase=True)
    assert lower.encode("THE dog .") == lower.encode("the DOG .")
    assert UNK not in lower.encode("THE dog .")


def test_word_tokenizer_min_freq_and_max_size():
    texts = ["a a a b b c"]
    assert WordTokenizer.build(texts, min_freq=2).vocab.itos[4:] == ["a", "b"]
    assert WordTokenizer.build(texts, max_size=5).vocab.itos[4:] == ["a"]
    with pytest.raises(ValueError, match="min_freq"):
        WordTokenizer.build(texts, min_freq=0)
    with pytest.raises(ValueError, match="max_size"):
        WordTokenizer.build(texts, max_size=2)


def test_toy_round_trip_with_word_tokenizer():
    from minitransformer.kit.data.datasets import load_toy

    pairs = load_toy("valid")
    tok = WordTokenizer.build([s for p in load_toy("train") for s in p])
    for en, de in pairs[:100]:
        assert tok.decode(tok.encode(de)) == de


@pytest.mark.parametrize("make", [lambda: WordTokenizer.build(TEXTS, lowercase=True),
                                  lambda: BPETokenizer.learn(TEXTS, num_merges=60)])
def test_json_round_trip(make, tmp_path):
    tok = make()
    again = tokenizer_from_json(tok.to_json())
    for text in TEXTS:
        assert again.encode(text) == tok.encode(text)
    assert again.vocab.itos == tok.vocab.itos
    json.loads(tok.to_json())                          # plain JSON
    path = tok.save(tmp_path / "vocab.json")
    loaded = load_tokenizer(path)
    assert type(loaded) is type(tok) and loaded.encode(TEXTS[3]) == tok.encode(TEXTS[3])
    assert type(tokenizer_from_dict(tok.to_dict())) is type(tok)


def test_from_dict_rejects_wrong_data():
    with pytest.raises(ValueError, match="type"):
        tokenizer_from_dict({"type": "sentencepiece"})
    with pytest.raises(ValueError, match="tokens must start"):
        BPETokenizer.from_dict({"type": "bpe", "tokens": ["a", "b"], "merges": []})
    with pytest.raises(ValueError, match="type='word'"):
        WordTokenizer.from_dict(BPETokenizer.learn(TEXTS, num_merges=3).to_dict())


def test_input_validation():
    bpe, word = BPETokenizer.learn(TEXTS, num_merges=10), WordTokenizer.build(TEXTS)
    for tok in (bpe, word):
        with pytest.raises(TypeError, match="text must be a str, got int"):
            tok.encode(5)
        with pytest.raises(TypeError, match="text must be a str"):
            tok.encode(["a list"])
        with pytest.raises(ValueError, match="outside the vocabulary"):
            tok.decode([4, len(tok)])
        with pytest.raises(TypeError, match="ids must be"):
            tok.decode("abc")
        with pytest.raises(TypeError, match="ids must be ints"):
            tok.decode([1.5])
        with pytest.raises(ValueError, match="1-D"):
            tok.decode(np.zeros((2, 2), dtype=np.int64))
    with pytest.raises(TypeError, match="texts must be an iterable of str"):
        BPETokenizer.learn("one string", num_merges=3)
    with pytest.raises(TypeError, match=r"texts\[1\] must be a str"):
        WordTokenizer.build(["ok", 3])


def test_vocab():
    v = Vocab(["x", "y", "x"])
    assert len(v) == 6 and v["y"] == 5 and v["zzz"] == UNK and v.itos[4] == "x"
    assert "x" in v and "zzz" not in v


# ----------------------------------------------------------------------------- preparing input, naming it

def test_pieces_is_how_both_tokenisers_prepare_text_for_training_and_for_translating():
    # The toy corpus writes "the ball ." : a sentence typed as "The ball." must read the same way.
    word = WordTokenizer.build(["the dog sees the ball ."], lowercase=True)
    assert word.pieces("The ball.") == [("the", True), ("ball", False), (".", True)]
    assert word.encode("The ball.") == word.encode("the ball .")
    bpe = BPETokenizer.learn(TEXTS, num_merges=40, lowercase=True)
    assert bpe.pieces("A girl.") == split_pieces("a girl.")
    assert bpe.encode("A girl.") == bpe.encode("a girl.")
    cased = WordTokenizer.build(["The dog ."])
    assert cased.pieces("The dog.") == split_pieces("The dog.")          # no lowercasing asked, none done


def test_unknown_words_names_each_unknown_word_once():
    word = WordTokenizer.build(["the dog sees the cat ."], lowercase=True)
    assert word.unknown_words("The computer eats the sandwich, the computer.") == ["computer", "eats", "sandwich",
                                                                                   ","]
    assert word.unknown_words("the dog sees the cat .") == []
    bpe = BPETokenizer.learn(["the dog runs", "a cat sleeps"], num_merges=5)
    # BPE knows every word of known characters; a word with a character it never saw is the unknown one
    assert bpe.unknown_words("the dogs run") == []
    assert bpe.unknown_words("the dög runs €5 x") == ["dög", "€", "5", "x"]
    with pytest.raises(TypeError, match="unknown_words: text must be a str"):
        word.unknown_words(3)


def test_vocab_is_lowercase():
    assert Vocab(["the", "dog", ".", "über"]).is_lowercase()
    assert not Vocab(["the", "Dog"]).is_lowercase()
    assert not Vocab([".", ",", "3"]).is_lowercase()                    # no letters: nothing to say about case
    assert not Vocab().is_lowercase()


def test_token_labels_show_bpe_pieces_as_people_write_them():
    bpe = BPETokenizer.learn(["orangefarbenen orangefarbenen a a"], num_merges=6)
    ids = bpe.encode("a orangefarbenen")
    pieces = [bpe.vocab.itos[i] for i in ids]
    labels = bpe.token_labels(ids)
    assert len(pieces) > 2 and pieces[0] == "a</w>"                    # the word was split into several pieces
    assert not any("</w>" in label for label in labels)
    assert labels[0] == "a" and all(label.endswith("@@") for label in labels[1:-1]) and not labels[-1].endswith("@@")
    assert "".join(label.removesuffix("@@") for label in labels[1:]) == "orangefarbenen"
    assert bpe.token_labels([BOS, *ids, EOS])[::len(ids) + 1] == ["<bos>", "<eos>"]     # specials unmarked
    word = WordTokenizer.build(["the dog ."])
    assert word.token_labels(word.encode("the dog .")) == ["the", "dog", "."]


def test_readable_tokens_of_a_list():
    assert readable_tokens(["a</w>", "orange", "farbenen</w>", "<eos>"]) == ["a", "orange@@", "farbenen", "<eos>"]
    assert readable_tokens(["the", "dog", "4"]) == ["the", "dog", "4"]          # not BPE: unchanged
    assert readable_tokens([3, 4]) == ["3", "4"]


# ----------------------------------------------------------------------------- cost on long words

def _rescan_merges(ranks: dict, symbols: list) -> list:
    """The reference the tokenizer's heap must equal: find the lowest-ranked adjacent pair of the whole word,
    merge every occurrence of it left to right, rescan (O(n) per merge)."""
    while len(symbols) > 1:
        best = min(set(itertools.pairwise(symbols)), key=lambda p: ranks.get(p, len(ranks)))
        if best not in ranks:
            break
        out, i = [], 0
        while i < len(symbols):
            if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == best:
                out.append(symbols[i] + symbols[i + 1])
                i += 2
            else:
                out.append(symbols[i])
                i += 1
        symbols = out
    return symbols


def _toy_texts():
    return [s for pair in datasets.load_toy("train") for s in pair]


def test_bpe_heap_equals_the_rescanning_loop_on_the_toy_corpus_and_random_words():
    texts = _toy_texts()
    tok = BPETokenizer.learn(texts, num_merges=2000, min_frequency=1)
    rng = random.Random(0)
    alphabet = sorted(set("".join(texts)) - {" "})
    pieces = [p for text in texts[:2000] for p in tok.pieces(text)]
    pieces += [("".join(rng.choice(alphabet[:rng.randint(2, len(alphabet))]) for _ in range(rng.randint(1, 80))),
                rng.random() < 0.5) for _ in range(2000)]
    for piece in pieces:
        symbols = tokenizers._initial_symbols(*piece)
        assert tok._apply_merges(symbols) == _rescan_merges(tok.ranks, symbols), piece


def test_bpe_heap_equals_the_rescanning_loop_with_merges_in_any_order():
    """Merges read from a file need not come in the order learning makes them (a merge may build on a later
    one): the heap still merges what the rescanning loop merges, repeated letters (a a a) included."""
    rng = random.Random(1)
    for _ in range(2000):
        symbols, merges = ["a", "b", "a</w>", "b</w>"], []
        for _ in range(rng.randint(0, 12)):
            pair = (rng.choice([s for s in symbols if not s.endswith("</w>")]), rng.choice(symbols))
            if pair not in merges:
                merges.append(pair)
                symbols.append(pair[0] + pair[1])
        rng.shuffle(merges)
        tok = BPETokenizer(merges=merges)
        word = tokenizers._initial_symbols("".join(rng.choice("ab") for _ in range(rng.randint(1, 30))),
                                           rng.random() < 0.5)
        assert tok._apply_merges(word) == _rescan_merges(tok.ranks, word), (word, merges)


# What learning gave on the toy corpus before words were bounded in learning (sha256 of to_json(), and of the
# ids of the first 2,000 sentences): a corpus of ordinary words learns and encodes exactly as before.
TOY_LEARNED = {
    (("vocab_size", 300),): ("86b6fc65a05c09f9c4ee2e9b99381c40394bcf74333b1ba24b433b109b58ba8e",
                             "ee47e1f3ebdaa690f767dda4500ca1c2fafee6bdcf2e9669b90f655c4975be12"),
    (("min_frequency", 1), ("num_merges", 2000)): (
        "48beff51a2255499453c5f0380ebafec51f76a2a7e6974f0522c1c71ac262a1e",
        "c789ab986e899eb82a062505d93cea09c35785df2a06299e3138fd2dd27f8409"),
}


@pytest.mark.parametrize("kwargs", sorted(TOY_LEARNED))
def test_bpe_learns_and_encodes_the_toy_corpus_as_it_always_did(kwargs):
    texts = _toy_texts()
    tok = BPETokenizer.learn(texts, **dict(kwargs))
    ids = [i for text in texts[:2000] for i in tok.encode(text)]
    digests = (hashlib.sha256(tok.to_json().encode()).hexdigest(), hashlib.sha256(json.dumps(ids).encode()).hexdigest())
    assert digests == TOY_LEARNED[kwargs]


def test_bpe_learns_random_words_of_repeated_letters_as_it_always_did():
    """Words of up to 32 characters drawn from a few letters (a a a, b b: the overlapping pairs), 400 merges:
    the sha256 of the learned tokenizer's JSON and of the corpus's ids, as the tokenizer gave them before
    learning counted only the pairs a merge changes."""
    rng = random.Random(7)
    texts = [" ".join("".join(rng.choice("aabbcde.") for _ in range(rng.randint(1, 32)))
                      for _ in range(rng.randint(1, 12))) for _ in range(300)]
    tok = BPETokenizer.learn(texts, num_merges=400, min_frequency=1)
    ids = [i for text in texts for i in tok.encode(text)]
    assert len(tok.merges) == 400
    assert hashlib.sha256((tok.to_json() + repr(ids)).encode()).hexdigest() == \
        "6df497d5e87d3bad60048817db552b79185288d3a16536e9c95e497b27a0d03a"


class _CountingHeap:
    """heapq, counting the entries popped: the merge loop's iterations."""

    def __init__(self):
        self.pops = 0
        self.heapify, self.heappush = heapq.heapify, heapq.heappush

    def heappop(self, heap):
        self.pops += 1
        return heapq.heappop(heap)


def test_bpe_encoding_a_word_takes_a_number_of_steps_linear_in_its_length(monkeypatch):
    """Each merge removes a symbol and pushes at most two pairs, so a word of n characters pops at most 3n heap
    entries (the rescanning loop walks the whole word once per merge: ~n^2 / 2 steps on a word that merges)."""
    texts = _toy_texts()
    tok = BPETokenizer.learn(texts, num_merges=2000, min_frequency=1)
    letters = "".join(ch for text in texts for ch in text if ch.isalpha())
    counter = _CountingHeap()
    monkeypatch.setattr(tokenizers, "heapq", counter)
    for n in (1_000, 10_000, 100_000):
        counter.pops = 0
        symbols = tok._apply_merges(tokenizers._initial_symbols(letters[:n], True))
        merged = n - len(symbols)
        assert merged > n // 3                            # most of the word merges: the case that costs most
        assert merged <= counter.pops <= 3 * n


def test_bpe_learning_bounds_the_words_it_rewrites(monkeypatch):
    """Learning rewrites every word that holds the pair it merges: a 20,000-character word is learned from in
    parts of MAX_LEARN_CHARS characters, so no merge costs more than that per part. The parts keep the word's
    end only on the last."""
    longest = []
    merge_pair = tokenizers._merge_pair
    monkeypatch.setattr(tokenizers, "_merge_pair", lambda symbols, pair: longest.append(len(symbols)) or
                        merge_pair(symbols, pair))
    rng = random.Random(2)
    word = "".join(rng.choice("abcdefgh") for _ in range(20_000))
    tok = BPETokenizer.learn(["a short text", word], num_merges=200)
    assert len(tok.merges) == 200 and 0 < max(longest) <= tokenizers.MAX_LEARN_CHARS
    chunks = list(tokenizers._learning_chunks("x" * 70, True))
    assert chunks == [("x" * 32, False), ("x" * 32, False), ("x" * 6, True)]
    assert list(tokenizers._learning_chunks("x" * 32, False)) == [("x" * 32, False)]
    assert tok.decode(tok.encode(word)) == word                 # a long word still encodes whole
