"""`minitransformer translate` on the inputs a newcomer types: each line is prepared as the training text was
(lowercased, punctuation split off), stderr names what the model could not read (unknown words, tokens cut
beyond max_len), --quiet silences it, and a translation never runs past 2 x its source length + 10 tokens."""

import io
import sys

import pytest

from minitransformer import decoding
from minitransformer.kit.cli import main
from minitransformer.kit.cli.common import load_run
from minitransformer.kit.cli.translate import output_limit

ARTICLES = {"der", "die", "das", "den", "dem", "des", "ein", "eine", "einen", "einem"}
# Small enough to train in a few seconds, and enough steps for it to begin its sentences with an article.
TINY = ["--d-model", "32", "--heads", "2", "--layers", "1", "--d-ff", "64", "--dropout", "0", "--max-tokens", "1000",
        "--warmup", "50", "--eval-every", "1000", "--save-every", "1000", "--limit", "5", "--no-plots",
        "--no-progress"]


@pytest.fixture(scope="module")
def toy_model(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("toy"))
    assert main(["train", "--task", "toy", "--steps", "300", "--out", out, *TINY]) == 0
    return out


def translate(capsys, run, *args, stdin=None, monkeypatch=None):
    """(stdout lines, stderr lines) of one translate command."""
    capsys.readouterr()
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    assert main(["translate", "--checkpoint", run, *args]) == 0
    captured = capsys.readouterr()
    return captured.out.splitlines(), captured.err.splitlines()


def test_a_capital_and_attached_punctuation_read_as_the_corpus_writes_them(toy_model, capsys):
    # Before: "The" was <unk> to a vocabulary that only knows "the", and the article was lost.
    out, err = translate(capsys, toy_model, "The small dog sees the red ball.")
    prepared, prepared_err = translate(capsys, toy_model, "the small dog sees the red ball .")
    assert err == [] and prepared_err == []                  # every word known: nothing to say
    assert out == prepared and len(out) == 1
    assert out[0].split()[0] in ARTICLES, out


def test_unknown_words_are_named_on_stderr(toy_model, capsys):
    out, err = translate(capsys, toy_model, "the computer eats a sandwich .")
    assert len(out) == 1
    assert len(err) == 1 and err[0].startswith("line 1: not in the model's vocabulary")
    named = err[0].split(": ")[-1].split(", ")
    assert "computer" in named and "sandwich" in named and "the" not in named and "a" not in named


def test_a_line_of_unknown_words_warns_and_stays_short(toy_model, capsys):
    out, err = translate(capsys, toy_model, "hello world")
    assert any("hello, world" in line for line in err)
    assert len(out) == 1 and len(out[0].split()) <= output_limit(2) == 14


def test_a_single_word_gives_a_short_translation(toy_model, capsys):
    out, err = translate(capsys, toy_model, "the")
    assert len(out) == 1 and 0 < len(out[0].split()) <= output_limit(1) == 12
    assert not any("vocabulary" in line for line in err)


def test_a_line_longer_than_max_len_says_it_was_cut(toy_model, capsys):
    line = " ".join(["the dog sees the cat ."] * 60)                          # 360 tokens
    _, model, *_ = load_run(toy_model)
    max_len = model.config.max_len
    out, err = translate(capsys, toy_model, line)
    assert len(out) == 1
    assert f"line 1: 360 tokens, but the model reads at most {max_len}: the last {360 - max_len} were left out" in err


def test_quiet_silences_stderr_and_output_stays_one_line_per_line(toy_model, capsys, monkeypatch):
    lines = ["The dog sees the cat.", "", "hello world", " ".join(["a man sees a dog ."] * 60)]
    out, err = translate(capsys, toy_model, stdin="\n".join(lines) + "\n", monkeypatch=monkeypatch)
    assert len(out) == 4 and out[1] == ""
    assert [e.split(":")[0] for e in err if "vocabulary" in e or "left out" in e] == ["line 3", "line 4"]
    quiet_out, quiet_err = translate(capsys, toy_model, "--quiet", stdin="\n".join(lines) + "\n",
                                     monkeypatch=monkeypatch)
    assert quiet_out == out and quiet_err == []


def test_the_decoding_limit_follows_each_source_length(toy_model, capsys, monkeypatch):
    """translate asks the decoder for at most 2 x S + 10 tokens (S + 50 from 40 tokens on), per sentence."""
    assert [output_limit(s) for s in (1, 2, 39, 40, 41, 256)] == [12, 14, 88, 90, 91, 306]
    seen = []
    real = decoding.greedy_decode

    def recording(model, src, **kw):
        seen.append((src.shape[1], kw.get("max_len")))
        return real(model, src, **kw)

    monkeypatch.setattr(decoding, "greedy_decode", recording)
    translate(capsys, toy_model, "the", "hello world", "the dog sees the cat .", "the")
    assert sorted(seen) == [(1, 12), (2, 14), (6, 22)]        # one batch per source length: each its own limit
