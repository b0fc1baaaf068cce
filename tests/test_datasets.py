"""Toy corpus (the grammar in data/make_toy_corpus.py, the files the package ships), Multi30k loader (real files
when present), offline download."""

import configparser
import gzip
import importlib.util
import io
import random
import re
import shutil
from pathlib import Path

import pytest

from minitransformer.kit.data import datasets
from minitransformer.kit.data.datasets import (
    download_multi30k,
    load_multi30k,
    load_toy,
    multi30k_dir,
)

REPO = Path(__file__).resolve().parents[1]
SHARED_MULTI30K = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"
needs_multi30k = pytest.mark.skipif(not SHARED_MULTI30K.is_dir(), reason=f"Multi30k not at {SHARED_MULTI30K}")
# The toy grammar is the script that writes the shipped corpus; it lives in data/, outside the package.
_spec = importlib.util.spec_from_file_location("make_toy_corpus", REPO / "data" / "make_toy_corpus.py")
make_toy_corpus = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_toy_corpus)


@pytest.fixture(scope="module")
def corpus():
    return make_toy_corpus.generate_corpus()


# ----------------------------------------------------------------------------- toy generator


def test_generator_is_deterministic(corpus):
    assert make_toy_corpus.generate_corpus() == corpus
    assert make_toy_corpus.generate_corpus(seed=1, sizes={"train": 50, "valid": 5, "test": 5}) == \
        make_toy_corpus.generate_corpus(seed=1, sizes={"train": 50, "valid": 5, "test": 5})
    assert make_toy_corpus.generate_corpus(seed=1)["train"][:50] != corpus["train"][:50]


def test_splits_sizes_and_disjoint(corpus):
    assert {k: len(v) for k, v in corpus.items()} == make_toy_corpus.SPLIT_SIZES
    for side in (0, 1):
        sets = {split: {pair[side] for pair in pairs} for split, pairs in corpus.items()}
        assert sum(len(s) for s in sets.values()) == sum(make_toy_corpus.SPLIT_SIZES.values())   # no repeats anywhere
        assert not sets["train"] & sets["valid"] and not sets["train"] & sets["test"] and not sets["valid"] & sets["test"]


def test_files_on_disk_equal_generator_output(corpus):
    toy = datasets.TOY_DIR
    assert make_toy_corpus.SPLITS == datasets.TOY_SPLITS
    for split in make_toy_corpus.SPLITS:
        for side, lang in enumerate(("en", "de")):
            text = (toy / f"{split}.{lang}.txt").read_text(encoding="utf-8")
            assert text == "".join(pair[side] + "\n" for pair in corpus[split]), f"{split}.{lang}.txt is stale: rerun data/make_toy_corpus.py"
    assert sum(p.stat().st_size for p in toy.iterdir()) < 1_000_000


def test_the_toy_corpus_is_package_data():
    """An installed package (a wheel, no repository beside it) holds every file load_toy reads."""
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    globs = setup["options.package_data"]["minitransformer.kit.data"].split(",")
    shipped = {path for pattern in globs for path in datasets.TOY_DIR.parent.glob(pattern.strip())}
    wanted = {datasets.TOY_DIR / f"{split}.{lang}.txt" for split in datasets.TOY_SPLITS for lang in ("en", "de")}
    assert wanted <= shipped and all(path.is_file() for path in wanted)


def test_make_toy_corpus_script(tmp_path, corpus):
    import runpy
    import sys

    argv = sys.argv
    try:
        sys.argv = ["make_toy_corpus.py", "--out", str(tmp_path)]
        with pytest.raises(SystemExit) as stop:
            runpy.run_path(str(REPO / "data" / "make_toy_corpus.py"), run_name="__main__")
        assert stop.value.code == 0
    finally:
        sys.argv = argv
    assert load_toy("test", directory=tmp_path) == corpus["test"]


@pytest.mark.parametrize("seed", ["-1", "x"])
def test_make_toy_corpus_script_refuses_a_bad_seed(seed, tmp_path, capsys):
    import runpy
    import sys

    argv = sys.argv
    try:
        sys.argv = ["make_toy_corpus.py", "--out", str(tmp_path), "--seed", seed]
        with pytest.raises(SystemExit) as stop:
            runpy.run_path(str(REPO / "data" / "make_toy_corpus.py"), run_name="__main__")
    finally:
        sys.argv = argv
    assert stop.value.code == 2 and "argument --seed: expected a non-negative integer" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())                        # nothing written


def test_sentences_are_clean(corpus):
    for pairs in corpus.values():
        for en, de in pairs:
            for s in (en, de):
                assert s == s.lower() and s == " ".join(s.split()) and s.endswith(" .")
                assert make_toy_corpus.MIN_TOKENS <= len(s.split()) <= make_toy_corpus.MAX_TOKENS
    en_vocab = {w for p in corpus["train"] for w in p[0].split()}
    de_vocab = {w for p in corpus["train"] for w in p[1].split()}
    assert 100 <= len(en_vocab) <= 250 and 100 <= len(de_vocab) <= 250


def _every(corpus, en_part, de_part, start=False):
    """Every train pair whose English contains en_part (starts with it, if start) has de_part in its German
    (at its start, if start); and there are such pairs."""
    def has(sentence, part):
        return sentence.startswith(part + " ") if start else f" {part} " in f" {sentence} "

    hits = [(en, de) for en, de in corpus["train"] if has(en, en_part)]
    assert hits, en_part
    bad = [(en, de) for en, de in hits if not has(de, de_part)]
    assert not bad, bad[:3]


def test_gender_case_and_agreement(corpus):
    _every(corpus, "the cat is", "die katze ist", start=True)           # nominative, feminine
    _every(corpus, "the horse is", "das pferd ist", start=True)         # neuter
    _every(corpus, "an old man", "ein alter mann", start=True)          # "an", and -er after ein
    _every(corpus, "likes the dog", "den hund")               # accusative masculine
    _every(corpus, "helps the dog", "dem hund")               # dative verb
    _every(corpus, "helps the dogs", "den hunden")            # dative plural -n
    _every(corpus, "in the garden", "im garten")              # in + dem -> im


def test_agreement_over_the_lexicon(corpus):
    # For every noun and adjective: English "with the big dog" -> German "mit dem großen hund" (dative, weak -en),
    # and "<acc verb> a big dog" -> "einen großen hund" (accusative, mixed ending by gender).
    dat = {"m": "dem", "f": "der", "n": "dem"}
    acc_indef = {"m": ("einen", "en"), "f": ("eine", "e"), "n": ("ein", "es")}
    expected = {}                                         # English 4-gram -> the German it must produce
    for noun in make_toy_corpus.NOUNS:
        for adj in make_toy_corpus.ADJECTIVES:
            expected[("with", "the", adj.en, noun.en)] = f"mit {dat[noun.gender]} {adj.stem}en {noun.de}"
            art, ending = acc_indef[noun.gender]
            for v in make_toy_corpus.VERBS:
                if v.frame == "acc":
                    key = (v.en, "an" if adj.en[0] in "aeiou" else "a", adj.en, noun.en)
                    expected[key] = f"{art} {adj.stem}{ending} {noun.de}"
    checked = 0
    for en, de in corpus["train"]:
        words = en.split()
        for i in range(len(words) - 3):
            german = expected.get(tuple(words[i:i + 4]))
            if german is not None:
                assert f" {german} " in f" {de} ", (en, de, german)
                checked += 1
    assert checked > 50


def _finite_forms():
    forms = {"ist", "sind"} | {f for v in make_toy_corpus.VERBS for f in (v.de, v.de_pl)}
    return forms | {f for pair in make_toy_corpus.AUX.values() for f in pair}


def test_word_order(corpus):
    finite = _finite_forms()
    fronted = [(en, de) for en, de in corpus["train"] if en.startswith("today ")]
    assert fronted
    for en, de in fronted:                                    # verb second: heute + finite verb
        assert de.split()[:2][0] == "heute" and de.split()[1] in finite, de
    because = [(en, de) for en, de in corpus["train"] if " because " in en and "says" not in en]
    assert because
    for en, de in because:                                    # verb final: ", weil ... <finite verb> ."
        assert ", weil " in de
        assert de.split()[-2] in finite, de
    participles = {v.de_part for v in make_toy_corpus.VERBS}
    perfect = [(en, de) for en, de in corpus["train"] if en.split()[0] == "the" and en.split()[2] == "has"
               and not {"because", "although", "while", "that"} & set(en.split())]
    assert perfect
    for en, de in perfect:                                    # the verb bracket: der hund hat ... gesehen .
        assert de.split()[2] in ("hat", "ist") and de.split()[-2] in participles, de


# ----------------------------------------------------------------------------- load_toy


def test_load_toy_reads_the_files(corpus):
    assert load_toy("train") == corpus["train"]
    assert load_toy("valid", src_lang="de", tgt_lang="en") == [(de, en) for en, de in corpus["valid"]]


def test_load_toy_reads_another_folder_and_names_a_missing_file(tmp_path, corpus):
    make_toy_corpus.write_corpus({"test": corpus["test"]}, tmp_path)
    assert load_toy("test", "de", "en", directory=tmp_path)[0] == corpus["test"][0][::-1]
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "missing" / "test.en.txt"))):
        load_toy("test", directory=tmp_path / "missing")


def test_load_toy_errors():
    with pytest.raises(ValueError, match="split must be one of"):
        load_toy("val")
    with pytest.raises(ValueError, match="src_lang and tgt_lang"):
        load_toy("train", src_lang="en", tgt_lang="en")


# ----------------------------------------------------------------------------- Multi30k


@needs_multi30k
def test_load_multi30k_real_files():
    sizes = {"train": 29000, "val": 1014, "test_2016_flickr": 1000}
    for split, n in sizes.items():
        pairs = load_multi30k(SHARED_MULTI30K, split)
        assert len(pairs) == n and all(de and en for de, en in pairs)
    de, en = load_multi30k(SHARED_MULTI30K, "train")[0]
    assert en == "Two young, White males are outside near many bushes."
    assert de == "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche."
    assert load_multi30k(SHARED_MULTI30K, "test") == load_multi30k(SHARED_MULTI30K, "test_2016_flickr")
    assert load_multi30k(SHARED_MULTI30K, "valid", src_lang="en", tgt_lang="de")[0] == \
        load_multi30k(SHARED_MULTI30K, "val")[0][::-1]


def _write_fake_multi30k(directory, gz=True, n=3):
    directory.mkdir(parents=True, exist_ok=True)
    for split in datasets.MULTI30K_SPLITS:
        for lang in ("en", "de"):
            text = "".join(f"{split} {lang} sentence {i} äöü.\n" for i in range(n))
            if gz:
                with gzip.open(directory / f"{split}.{lang}.gz", "wt", encoding="utf-8") as f:
                    f.write(text)
            else:
                (directory / f"{split}.{lang}").write_text(text, encoding="utf-8")


def test_load_multi30k_plain_and_gzip(tmp_path):
    _write_fake_multi30k(tmp_path / "gz", gz=True)
    _write_fake_multi30k(tmp_path / "plain", gz=False)
    a, b = load_multi30k(tmp_path / "gz", "val"), load_multi30k(tmp_path / "plain", "val")
    assert a == b == [(f"val de sentence {i} äöü.", f"val en sentence {i} äöü.") for i in range(3)]


def test_load_multi30k_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "train.de"))):
        load_multi30k(tmp_path, "train")
    with pytest.raises(ValueError, match="split must be one of"):
        load_multi30k(tmp_path, "dev")
    _write_fake_multi30k(tmp_path, gz=False)
    (tmp_path / "val.en").write_text("only one line\n", encoding="utf-8")
    with pytest.raises(ValueError, match="has 3 lines but"):
        load_multi30k(tmp_path, "val")


class _Trickle(io.RawIOBase):
    """A file that hands over at most ``chunk`` bytes per read, as a pipe or a slow disk may."""

    def __init__(self, data: bytes, chunk: int):
        self.data, self.chunk = data, chunk

    def readable(self):
        return True

    def readinto(self, buffer):
        n = min(len(buffer), self.chunk, len(self.data))
        buffer[:n], self.data = self.data[:n], self.data[n:]
        return n


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 1 << 20])
def test_corpus_lines_stream_in_as_a_text_mode_read_gives_them(tmp_path, monkeypatch, chunk):
    """Read in pieces of any size (a \r\n or a multi-byte character cut between two), a file gives the lines
    that reading it whole in text mode gives: universal newlines, whitespace stripped, no line after a final
    newline."""
    def trickling(path, what):
        return io.BufferedReader(_Trickle(Path(path).read_bytes(), chunk), buffer_size=chunk)

    monkeypatch.setattr(datasets, "open_regular", trickling)
    rng = random.Random(chunk)
    for trial in range(60):
        text = "".join(rng.choice(["a", "b ", " ", "\n", "\r", "\r\n", "ü", "€", "\t"]) for _ in range(rng.randint(0, 40)))
        path = tmp_path / f"{trial}.txt"
        path.write_bytes(text.encode("utf-8"))
        expected = [line.strip() for line in io.StringIO(text, newline=None)]
        assert datasets._read_lines(path) == expected, repr(text)


def test_corpus_limits_count_decoded_characters_and_lines(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.limits, "MAX_CORPUS_CHARS", 100)
    monkeypatch.setattr(datasets.limits, "MAX_CORPUS_LINES", 10)
    path = tmp_path / "train.de.gz"
    path.write_bytes(gzip.compress(("ü" * 100 + "\n").encode()))       # 101 characters, 201 bytes
    with pytest.raises(ValueError, match=r"train.de.gz: more than 100 characters once decompressed.*MAX_CORPUS_CHARS"):
        datasets._read_lines(path)
    path.write_bytes(gzip.compress(("ü" * 99).encode()))                 # 99 characters in 198 bytes: taken
    assert datasets._read_lines(path) == ["ü" * 99]
    path.write_bytes(gzip.compress(b"a\n" * 11))
    with pytest.raises(ValueError, match=r"more than 10 lines once decompressed.*MAX_CORPUS_LINES"):
        datasets._read_lines(path)
    path.write_bytes(gzip.compress(b"a\n" * 10))
    assert datasets._read_lines(path) == ["a"] * 10


def test_a_line_longer_than_the_line_limit_is_refused_by_its_number(tmp_path):
    """At the real limit: a line of MAX_LINE_CHARS characters is read, one more character is refused, naming the
    file and the line, whether the file is plain or gzipped."""
    cap = datasets.limits.MAX_LINE_CHARS

    def corpus(path, third: int) -> Path:
        data = ("a" * cap + "\n" + "ü" * cap + "\r\n" + "b" * third + "\nc\n").encode("utf-8")
        path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
        return path

    for path in (tmp_path / "train.en", tmp_path / "train.en.gz"):
        with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}, line 3: more than {cap:,} characters, "
                                             r"the most a line of a corpus may hold .*MAX_LINE_CHARS\): refused$"):
            datasets._read_lines(corpus(path, cap + 1))
        assert datasets._read_lines(corpus(path, cap)) == ["a" * cap, "ü" * cap, "b" * cap, "c"]


def test_multi30k_dir_is_the_environment_then_the_cache_never_a_folder_beside_the_repository(monkeypatch, tmp_path):
    """Where the user says: $MINITRANSFORMER_MULTI30K, else the cache download fills, even when a folder of
    Multi30k files lies beside the repository (a development machine's copy is passed explicitly)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    _write_fake_multi30k(tmp_path / "shared" / "data" / "multi30k")
    monkeypatch.setenv(datasets.MULTI30K_ENV, str(tmp_path / "mine"))
    assert multi30k_dir() == tmp_path / "mine"
    for unset in (lambda: monkeypatch.setenv(datasets.MULTI30K_ENV, ""),
                  lambda: monkeypatch.delenv(datasets.MULTI30K_ENV)):
        unset()
        assert multi30k_dir() == tmp_path / "home" / ".cache" / "minitransformer" / "multi30k"
        with pytest.raises(FileNotFoundError, match=r"\.cache/minitransformer/multi30k/val\.de"):
            load_multi30k(split="val")


# ----------------------------------------------------------------------------- download, offline only


@pytest.fixture
def local_mirror(tmp_path):
    """A stand-in for the GitHub folder: the real files when present, else small fake ones."""
    mirror = tmp_path / "mirror"
    if SHARED_MULTI30K.is_dir():
        mirror.mkdir()
        for split in datasets.MULTI30K_SPLITS:
            for lang in ("en", "de"):
                shutil.copy(SHARED_MULTI30K / f"{split}.{lang}.gz", mirror)
    else:
        _write_fake_multi30k(mirror)
    return mirror


def test_download_from_local_file_url(tmp_path, local_mirror):
    target = tmp_path / "downloaded"
    assert download_multi30k(target, base_url=local_mirror.as_uri()) == target
    names = sorted(p.name for p in target.iterdir())
    assert names == sorted(f"{s}.{lang}.gz" for s in datasets.MULTI30K_SPLITS for lang in ("en", "de"))
    for split in datasets.MULTI30K_SPLITS:
        assert load_multi30k(target, split) == load_multi30k(local_mirror, split)


def test_download_with_patched_opener_keeps_existing_files(tmp_path, local_mirror):
    calls = []

    def opener(url):
        calls.append(url)
        return io.BytesIO((local_mirror / url.rsplit("/", 1)[1]).read_bytes())

    target = tmp_path / "dl"
    download_multi30k(target, splits=["val"], langs=["de"], opener=opener)
    assert calls == [datasets.MULTI30K_URL + "val.de.gz"]
    download_multi30k(target, splits=["val"], langs=["de"], opener=opener)          # already there: no fetch
    assert len(calls) == 1
    download_multi30k(target, splits=["valid"], langs=["de"], opener=opener, overwrite=True)
    assert len(calls) == 2


def test_download_failure_leaves_no_file(tmp_path):
    def broken(url):
        return io.BytesIO(b"<html>not found</html>")

    target = tmp_path / "dl"
    with pytest.raises(OSError, match="could not fetch"):
        download_multi30k(target, splits=["val"], langs=["en"], opener=broken)
    assert list(target.iterdir()) == []                        # no half file, no temporary left behind


def test_download_takes_one_split_or_lang_as_a_str(tmp_path):
    calls = []

    def opener(url):
        calls.append(url)
        return io.BytesIO(gzip.compress(b"ein satz\n"))

    target = tmp_path / "dl"
    download_multi30k(target, splits="valid", langs="de", opener=opener)
    assert calls == [datasets.MULTI30K_URL + "val.de.gz"]
    download_multi30k(target, splits="val", opener=opener)
    assert calls[1:] == [datasets.MULTI30K_URL + "val.en.gz"]             # val.de.gz is there already


def _no_network(url):
    raise AssertionError(f"a test tried to fetch {url}")


@pytest.mark.parametrize("kwargs, error, message", [
    ({"splits": "tran"}, ValueError, "download_multi30k: split must be one of .*got 'tran'"),
    ({"splits": ["val", "tst"]}, ValueError, "download_multi30k: split must be one of .*got 'tst'"),
    ({"langs": "fr"}, ValueError, r"download_multi30k: langs must be among \('en', 'de'\), got 'fr'"),
    ({"langs": ["de", "fr"]}, ValueError, "download_multi30k: langs must be among .*got 'fr'"),
    ({"splits": 3}, TypeError, "download_multi30k: splits must be a str or a list of str, got int"),
    ({"langs": None}, TypeError, "download_multi30k: langs must be a str or a list of str, got NoneType"),
])
def test_download_checks_its_arguments_before_creating_anything(tmp_path, monkeypatch, kwargs, error, message):
    monkeypatch.setattr(datasets.urllib.request, "urlopen", _no_network)
    target = tmp_path / "dl"
    with pytest.raises(error, match=message):
        download_multi30k(target, **kwargs)
    assert not target.exists()
