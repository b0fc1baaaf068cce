"""The kit's refusals (tokenizers, batching, BLEU, datasets): each bad argument tested once, by an error of
the right type whose message names the argument."""

import numpy as np
import pytest

import minitransformer as mt
from minitransformer.kit.data import batching, bleu, datasets, tokenizers, vocab

TEXTS = ["the dog runs .", "a cat sleeps", "the cat runs fast !", "dogs and cats"]
SPECIALS = list(tokenizers.SPECIAL_TOKENS)


def tokenizer(kind):
    return (tokenizers.WordTokenizer.build(TEXTS) if kind == "word"
            else tokenizers.BPETokenizer.learn(TEXTS, num_merges=8, min_frequency=1))


@pytest.mark.parametrize("kind", ["word", "bpe"])
@pytest.mark.parametrize("text", [5, None, ["the"], b"the"])
def test_tokenizer_text_must_be_str(kind, text):
    with pytest.raises(TypeError, match=r"\btext\b"):
        tokenizer(kind).encode(text)


@pytest.mark.parametrize("kind", ["word", "bpe"])
def test_tokenizer_decode_refuses_bad_ids(kind):
    tok = tokenizer(kind)
    V = len(tok)
    with pytest.raises(ValueError, match=rf"ids\[1\].*{V}"):
        tok.decode([4, V, 5])
    for bad in ([4, 2.0], np.array([[4, 5]]), np.array([4.0]), "4 5", None):
        with pytest.raises((TypeError, ValueError), match=r"\bids\b"):
            tok.decode(bad)


@pytest.mark.parametrize("data", [
    {"type": "unknown", "tokens": SPECIALS},
    {"type": "word"},                                                      # no tokens
    {"type": "word", "tokens": 5},
    {"type": "word", "tokens": SPECIALS + [5]},
    {"type": "word", "tokens": ["a"] + SPECIALS},                          # specials not first
    {"type": "word", "tokens": SPECIALS + ["a", "b", "a"]},                # a repeated token shifts every id after it
    {"type": "bpe", "tokens": SPECIALS + ["a</w>"], "merges": [["a"]]},
    {"type": "bpe", "tokens": SPECIALS + ["a</w>"], "merges": "ab"},
    {"type": "word", "tokens": SPECIALS, "lowercase": "yes"},
    ["word"], None,
], ids=lambda d: repr(d)[:40])
def test_tokenizer_from_dict_refuses_what_to_dict_never_wrote(data):
    with pytest.raises((TypeError, ValueError), match=r"\bdata\b"):
        tokenizers.tokenizer_from_dict(data)


@pytest.mark.parametrize("text", ["{", "not json", "", None])
def test_tokenizer_from_json_refuses_bad_text(text):
    with pytest.raises((TypeError, ValueError), match=r"\btext\b"):
        tokenizers.tokenizer_from_json(text)


@pytest.mark.parametrize("bad", [0, -3, 2.5, "8", None])
def test_batcher_max_tokens(bad):
    with pytest.raises((TypeError, ValueError), match=r"\bmax_tokens\b"):
        batching.BucketBatcher([([3, 4], [5])], max_tokens=bad)


def test_batcher_max_tokens_must_hold_the_longest_pair():
    with pytest.raises(ValueError, match=r"max_tokens.*\b4\b"):
        batching.BucketBatcher([([3, 4, 5, 6], [5])], max_tokens=3)


@pytest.mark.parametrize("bad", ["float", "negative", "str", "nested", "int", "empty source", "not a pair"])
def test_collate_refuses_bad_pairs(bad):
    pairs = [[[3, 4], [5, 6]], [[7], [8]]]
    if bad == "empty source":
        pairs[1][0] = []
    elif bad == "not a pair":
        pairs[1] = pairs[1][0]
    else:
        pairs[1][0] = {"float": [1.5, 2.0], "negative": [3, -1], "str": ["a", "b"], "nested": [[1, 2], [3]],
                       "int": 7}[bad]
    with pytest.raises((TypeError, ValueError), match=r"\bpairs\b"):
        batching.collate(pairs)


@pytest.mark.parametrize("pairs", [[], "ab"])
def test_batcher_refuses_no_pairs(pairs):
    with pytest.raises((TypeError, ValueError), match=r"\bpairs\b"):
        batching.BucketBatcher(pairs, max_tokens=10)


def test_bleu_refusals():
    with pytest.raises(ValueError, match=r"\breferences\b"):
        bleu.corpus_bleu(["the dog"] * 2, ["the dog"] * 3)
    with pytest.raises((TypeError, ValueError), match=r"\bhypotheses\b"):
        bleu.corpus_bleu(["a", 5, "c"], ["a", "b", "c"])
    with pytest.raises((TypeError, ValueError), match=r"\breferences\b"):
        bleu.corpus_bleu(["a", "b", "c"], [["a", "b", "c"], ["a", 5, "c"]])
    with pytest.raises((TypeError, ValueError), match=r"\bhypotheses\b"):
        bleu.corpus_bleu("a b", ["a b"])


def test_multi30k_missing_directory_names_the_path_and_the_download(tmp_path):
    missing = tmp_path / "no_multi30k_here"
    with pytest.raises(FileNotFoundError) as info:
        datasets.load_multi30k(missing, split="valid")
    assert str(missing) in str(info.value) and "download" in str(info.value)


def test_special_ids_are_the_models_defaults():
    cfg = mt.TransformerConfig(10, 10)
    assert (cfg.pad_id, cfg.bos_id, cfg.eos_id) == (vocab.PAD, vocab.BOS, vocab.EOS)
