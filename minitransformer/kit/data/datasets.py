"""Parallel corpora as lists of (source, target) str pairs: the bundled toy corpus (``load_toy``) and Multi30k
task 1 (``load_multi30k``, ``download_multi30k``)."""

import gzip
import io
import itertools
import os
import urllib.request
import zlib
from pathlib import Path

from minitransformer import checks
from minitransformer.kit import limits
from minitransformer.kit.files import atomic_write, open_regular

TOY_DIR = Path(__file__).parent / "toy"        # package data, written by the repository's data/make_toy_corpus.py
TOY_SPLITS = ("train", "valid", "test")

MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"
MULTI30K_SPLITS = ("train", "val", "test_2016_flickr")
MULTI30K_ALIASES = {"valid": "val", "test": "test_2016_flickr"}   # so "--split test" means the same for every task
MULTI30K_LANGS = ("en", "de")
MULTI30K_ENV = "MINITRANSFORMER_MULTI30K"
MULTI30K_CACHE = "~/.cache/minitransformer/multi30k"
MULTI30K_DEFAULT = f"${MULTI30K_ENV} if set, else {MULTI30K_CACHE}"     # multi30k_dir's rule in words (the help)


def _read_lines(path: Path) -> list[str]:
    """Lines of a UTF-8 text file (gzipped if named .gz), stripped, as text mode reads them (universal newlines).
    A corpus may come from elsewhere: a regular file only (a FIFO would block), at most ``limits.MAX_CORPUS_CHARS``
    characters in ``limits.MAX_CORPUS_LINES`` lines of at most ``limits.MAX_LINE_CHARS``, counted as it streams in
    (a small gzip that expands without end stops at the limit); a damaged gzip or non-UTF-8 byte is a ValueError
    naming the file and line."""
    lines, chars, gzipped = [], 0, path.suffix == ".gz"
    with open_regular(path, "corpus file") as raw:
        # a byte that is not UTF-8 stays in its line (as a lone surrogate) until the line's number is known
        text = io.TextIOWrapper(gzip.GzipFile(fileobj=raw, mode="rb") if gzipped else raw, encoding="utf-8",
                                errors="surrogateescape", newline=None)
        try:
            # never more read than the corpus's or the line's limit: one character past it is enough to refuse
            while line := text.readline(min(limits.MAX_CORPUS_CHARS - chars, limits.MAX_LINE_CHARS) + 1):
                chars += len(line)
                lines.append(line.strip())
                if len(line.removesuffix("\n")) > limits.MAX_LINE_CHARS:
                    raise ValueError(f"{path}, line {len(lines)}: more than {limits.MAX_LINE_CHARS:,} characters, "
                                     "the most a line of a corpus may hold "
                                     "(minitransformer.kit.limits.MAX_LINE_CHARS): refused")
                for count, name, what in ((chars, "MAX_CORPUS_CHARS", "characters"),
                                          (len(lines), "MAX_CORPUS_LINES", "lines")):
                    if count > getattr(limits, name):
                        raise ValueError(f"{path}: more than {getattr(limits, name):,} {what}"
                                         f"{' once decompressed' if gzipped else ''}, the most a corpus file may hold "
                                         f"(minitransformer.kit.limits.{name}): refused")
                try:
                    line.encode("utf-8")                        # only a byte that was not UTF-8 cannot go back
                except UnicodeEncodeError as err:
                    raise ValueError(f"{path}, line {len(lines)}: not UTF-8 text "
                                     f"(byte {ord(line[err.start]) - 0xDC00:#04x})") from None
        except (OSError, EOFError, zlib.error) as err:
            what = "not a readable gzip file" if gzipped else "cannot be read"
            raise ValueError(f"{path}: {what} ({type(err).__name__}: {err})") from None
    return lines


def _read_pairs(src_path: Path, tgt_path: Path) -> list[tuple[str, str]]:
    src_lines, tgt_lines = _read_lines(src_path), _read_lines(tgt_path)
    if len(src_lines) != len(tgt_lines):
        raise ValueError(f"{src_path} has {len(src_lines)} lines but {tgt_path} has {len(tgt_lines)}; "
                         "a parallel corpus needs one line per sentence on both sides")
    return list(zip(src_lines, tgt_lines))


def _check_langs(src_lang: str, tgt_lang: str, where: str) -> None:
    if src_lang not in MULTI30K_LANGS or tgt_lang not in MULTI30K_LANGS or src_lang == tgt_lang:
        raise ValueError(f"{where}: src_lang and tgt_lang must be 'en' and 'de' in either order, "
                         f"got {src_lang!r} -> {tgt_lang!r}")


def load_toy(split: str = "train", src_lang: str = "en", tgt_lang: str = "de",
             directory=None) -> list[tuple[str, str]]:
    """The toy corpus split ("train" | "valid" | "test") as (source, target) pairs. directory: where
    {split}.en.txt / {split}.de.txt are (default ``TOY_DIR``, the corpus the package ships)."""
    checks.one_of("load_toy", "split", split, TOY_SPLITS)
    _check_langs(src_lang, tgt_lang, "load_toy")
    directory = TOY_DIR if directory is None else Path(directory)
    return _read_pairs(directory / f"{split}.{src_lang}.txt", directory / f"{split}.{tgt_lang}.txt")


def multi30k_dir() -> Path:
    """Where Multi30k is when no folder is given (``train --data-dir``, ``load_multi30k(directory)``):
    ``MULTI30K_DEFAULT``; ``download_multi30k`` fills the cache."""
    return Path(os.environ.get(MULTI30K_ENV) or MULTI30K_CACHE).expanduser()


def _multi30k_split(split: str, where: str) -> str:
    split = MULTI30K_ALIASES.get(split, split)
    if split not in MULTI30K_SPLITS:
        raise ValueError(f"{where}: split must be one of {MULTI30K_SPLITS} (or {tuple(MULTI30K_ALIASES)}), "
                         f"got {split!r}")
    return split


def _names(value, name: str, where: str) -> list:
    """splits or langs as a list: one name may come as a plain str ("val" means ["val"])."""
    if not isinstance(value, str) and not hasattr(value, "__iter__"):
        raise TypeError(f"{where}: {name} must be a str or a list of str, got {type(value).__name__}")
    return [value] if isinstance(value, str) else list(value)


def _find_file(directory: Path, split: str, lang: str) -> Path:
    for name in (f"{split}.{lang}", f"{split}.{lang}.gz"):
        if (directory / name).is_file():
            return directory / name
    raise FileNotFoundError(
        f"Multi30k file {directory / f'{split}.{lang}'} (or .gz) not found. Put the task-1 raw files there, "
        f"point to their folder (`train --data-dir DIR`, or {MULTI30K_ENV}), or fetch them: "
        f"`minitransformer download --dir {directory}` (in Python: datasets.download_multi30k({str(directory)!r}))")


def load_multi30k(directory=None, split: str = "train", src_lang: str = "de",
                  tgt_lang: str = "en") -> list[tuple[str, str]]:
    """Multi30k task 1 as (source, target) pairs. split: "train" (29000 pairs), "val" (1014) or "test_2016_flickr"
    (1000); "valid" and "test" are aliases. directory: holding {split}.{en,de}[.gz] (default ``multi30k_dir()``)."""
    split = _multi30k_split(split, "load_multi30k")
    _check_langs(src_lang, tgt_lang, "load_multi30k")
    directory = multi30k_dir() if directory is None else Path(directory).expanduser()
    return _read_pairs(_find_file(directory, split, src_lang), _find_file(directory, split, tgt_lang))


def download_multi30k(directory=None, splits=MULTI30K_SPLITS, langs=MULTI30K_LANGS,
                      base_url: str = MULTI30K_URL, overwrite: bool = False, opener=None) -> Path:
    """Fetch the task-1 raw files ({split}.{lang}.gz) into directory (kept if already there). -> the directory.
    splits, langs: lists of names, or one as a str; checked before anything is created. Each file is checked to be
    readable gzip before it is written, atomically: an interrupted download leaves no half file.
    base_url may be a file:// URL; opener(url) -> a file-like object replaces urllib.request.urlopen."""
    where = "download_multi30k"
    splits = [_multi30k_split(split, where) for split in _names(splits, "splits", where)]
    langs = _names(langs, "langs", where)
    if bad := [lang for lang in langs if lang not in MULTI30K_LANGS]:
        raise ValueError(f"{where}: langs must be among {MULTI30K_LANGS}, got {bad[0]!r}")
    directory = (multi30k_dir() if directory is None else Path(directory)).expanduser()
    directory.mkdir(parents=True, exist_ok=True)
    for split, lang in itertools.product(splits, langs):
        target = directory / f"{split}.{lang}.gz"
        if target.exists() and not overwrite:
            continue
        url = base_url.removesuffix("/") + "/" + target.name
        try:
            with (opener or urllib.request.urlopen)(url) as response:
                data = response.read()
            gzip.decompress(data).decode("utf-8")                  # a truncated or HTML file fails here
        except (OSError, EOFError, zlib.error, UnicodeDecodeError) as err:
            raise OSError(f"download_multi30k: could not fetch {url} into {target}: {err}") from err
        atomic_write(target, lambda f, data=data: f.write(data), "Multi30k file")
    return directory
