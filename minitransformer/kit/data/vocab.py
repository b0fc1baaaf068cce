"""The vocabulary side of the tokenisers: the special ids every model here relies on, ``Vocab`` (tokens <-> ids),
and how a text is cut into pieces."""

import re
import sys

from minitransformer import checks

PAD, BOS, EOS, UNK = 0, 1, 2, 3
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
END_OF_WORD = "</w>"
UNK_END_OF_WORD = SPECIAL_TOKENS[UNK] + END_OF_WORD     # BPE: an unknown character that ends a word

_PIECE_RE = re.compile(r"\w+|[^\w\s]")        # a run of letters/digits/underscore, or one other non-space


def split_pieces(text: str) -> list[tuple[str, bool]]:
    """Pre-tokenise: [(piece, ends_word)], ends_word True when a space (or the end) follows.
    "the dog." -> [("the", True), ("dog", False), (".", True)]"""
    words = [_PIECE_RE.findall(word) for word in text.split()]
    return [(piece, i == len(pieces) - 1) for pieces in words for i, piece in enumerate(pieces)]


class Vocab:
    """A two-way map between tokens (str) and ids (int); ids 0-3 are always the special tokens.
    ``vocab[token]`` -> id (``<unk>``'s id for an unknown token); ``vocab.itos[id]`` -> token."""

    def __init__(self, tokens=()):
        self.itos: list[str] = list(SPECIAL_TOKENS)
        self.stoi: dict[str, int] = {t: i for i, t in enumerate(self.itos)}
        for token in tokens:
            self.add(token)

    @classmethod
    def build(cls, counts, min_freq: int = 1, max_size: int | None = None) -> "Vocab":
        """The tokens of ``counts`` (token -> count) seen at least min_freq times, most frequent first (ties:
        alphabetical), at most max_size ids, specials included."""
        checks.positive_int("Vocab.build", "min_freq", min_freq)
        if max_size is not None:
            checks.int_in("Vocab.build", "max_size", max_size, len(SPECIAL_TOKENS), sys.maxsize)
        ranked = sorted((t for t, c in counts.items() if c >= min_freq and t not in SPECIAL_TOKENS),
                        key=lambda t: (-counts[t], t))
        return cls(ranked if max_size is None else ranked[: max_size - len(SPECIAL_TOKENS)])

    def add(self, token: str) -> int:
        if token not in self.stoi:
            self.stoi[token] = len(self.itos)
            self.itos.append(token)
        return self.stoi[token]

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, token) -> bool:
        return token in self.stoi

    def __getitem__(self, token: str) -> int:
        return self.stoi.get(token, UNK)

    def is_lowercase(self) -> bool:
        """True when its tokens hold letters and none is a capital: text in any other case reads as <unk>."""
        letters = "".join(self.itos[len(SPECIAL_TOKENS):])
        return letters.lower() == letters and letters.upper() != letters
