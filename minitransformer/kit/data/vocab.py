"""The vocabulary side of the tokenisers: the special ids every model here relies on (<pad> 0, which the loss and
the masks ignore; <bos> 1, which starts the decoder input; <eos> 2, which ends the target; <unk> 3), ``Vocab``
(tokens <-> ids), and how a text is cut into pieces."""

import re

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

    def add(self, token: str) -> None:
        if token not in self.stoi:
            self.stoi[token] = len(self.itos)
            self.itos.append(token)

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
