"""Tokenisers: text <-> token ids. ``WordTokenizer``: one id per word or punctuation mark (the toy corpus).
``BPETokenizer``: byte-pair encoding (Sennrich et al. 2016), the paper's subwords, one vocabulary for both sides.
Both cut text alike (``vocab.split_pieces``), share the special ids of ``vocab`` and travel with checkpoints as JSON."""

import heapq
import itertools
import json
import sys
from collections import Counter
from pathlib import Path

import numpy

from minitransformer import checks
from minitransformer.kit import files, limits
from minitransformer.kit.data.vocab import (BOS, END_OF_WORD, EOS, PAD, SPECIAL_TOKENS, UNK, UNK_END_OF_WORD, Vocab,
                                            split_pieces)

MAX_LEARN_CHARS = 32     # longer pieces are learned from in parts (``_learning_chunks``) and not cached


def _check_text(text, where: str, name: str = "text") -> str:
    if not isinstance(text, str):
        raise TypeError(f"{where}: {name} must be a str, got {type(text).__name__}")
    return text


def _check_texts(texts, where: str) -> list:
    if isinstance(texts, str) or not hasattr(texts, "__iter__"):
        raise TypeError(f"{where}: texts must be an iterable of str (a list of sentences), got {type(texts).__name__}")
    return [_check_text(text, where, f"texts[{i}]") for i, text in enumerate(texts)]


def readable_tokens(tokens) -> list[str]:
    """Labels: a BPE sequence loses its </w> and a piece inside a word gets @@ (subword-nmt); other lists unchanged.
    ["a</w>", "orange", "farbenen</w>"] -> ["a", "orange@@", "farbenen"]"""
    tokens = [str(t) for t in tokens]
    return [_readable_piece(t) for t in tokens] if any(t.endswith(END_OF_WORD) for t in tokens) else tokens


def _readable_piece(token: str) -> str:
    return token.removesuffix(END_OF_WORD) if token.endswith(END_OF_WORD) or token in SPECIAL_TOKENS else token + "@@"


class _Tokenizer:
    """What both tokenisers share: special ids, size, encoding piece by piece, checked decoding, JSON."""

    pad_id, bos_id, eos_id, unk_id = PAD, BOS, EOS, UNK
    kind: str                                   # "word" | "bpe": the "type" of to_dict
    _label = staticmethod(str)                  # a token as a plot labels it

    def __init__(self, vocab: Vocab | None = None, lowercase: bool = False):
        self.vocab = Vocab() if vocab is None else vocab
        self.lowercase = bool(lowercase)

    def __len__(self) -> int:
        return len(self.vocab)

    vocab_size = property(__len__)              # len(tokenizer), named as TransformerConfig names it

    def pieces(self, text: str) -> list[tuple[str, bool]]:
        """A text prepared for training and translating alike. -> [(piece, ends_word)]"""
        return split_pieces(text.lower() if self.lowercase else text)

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        _check_text(text, f"{type(self).__name__}.encode")
        ids = [i for piece in self.pieces(text) for i in self._piece_ids(piece)]
        return ([BOS] if add_bos else []) + ids + ([EOS] if add_eos else [])

    def unknown_words(self, text: str) -> list[str]:
        """The pieces of text that read as <unk> (or hold a character BPE never saw), each once, in order."""
        _check_text(text, f"{type(self).__name__}.unknown_words")
        unk = {UNK, self.vocab[UNK_END_OF_WORD]}
        return list(dict.fromkeys(p for p, ends in self.pieces(text) if unk & set(self._piece_ids((p, ends)))))

    def token_labels(self, ids) -> list[str]:
        """The tokens of ids, specials included, as plot labels ("orange@@ farbenen" for BPE)."""
        return [self._label(t) for t in self._ids_to_tokens(ids, False, f"{type(self).__name__}.token_labels")]

    def _ids_to_tokens(self, ids, skip_special: bool, where: str) -> list[str]:
        """The tokens of ids (each an int in [0, V)); skip_special: stop at the first <eos>, drop <pad> and <bos>."""
        if isinstance(ids, numpy.ndarray) and (ids.ndim != 1 or ids.dtype.kind not in "iu"):
            raise ValueError(f"{where}: ids must be a 1-D integer array, got shape {ids.shape} dtype {ids.dtype}")
        if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
            raise TypeError(f"{where}: ids must be a list of int, got {type(ids).__name__}")
        ids = ids.tolist() if isinstance(ids, numpy.ndarray) else list(ids)
        for pos, i in enumerate(ids):
            if isinstance(i, bool) or not isinstance(i, (int, numpy.integer)):
                raise TypeError(f"{where}: ids must be ints, got {type(i).__name__} at ids[{pos}]")
            if not 0 <= i < len(self.vocab):
                raise ValueError(f"{where}: ids[{pos}] = {int(i)} is outside the vocabulary [0, {len(self.vocab)})")
        if skip_special:
            ids = [i for i in itertools.takewhile(lambda i: i != EOS, ids) if i not in (PAD, BOS)]
        return [self.vocab.itos[i] for i in ids]

    def to_dict(self) -> dict:
        return {"type": self.kind, "lowercase": self.lowercase, "tokens": list(self.vocab.itos)}

    @classmethod
    def from_dict(cls, data: dict):
        _check_dict(data, cls.kind, f"{cls.__name__}.from_dict")
        merges = {"merges": data.get("merges", [])} if cls.kind == "bpe" else {}
        return cls(Vocab(data["tokens"][len(SPECIAL_TOKENS):]), lowercase=data.get("lowercase", False), **merges)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False)

    def save(self, path) -> Path:
        """Write the vocabulary (and merges) as UTF-8 JSON."""
        (path := Path(path)).write_text(self.to_json(), encoding="utf-8")
        return path


class WordTokenizer(_Tokenizer):
    """One id per word or punctuation mark, unknown words <unk>: "The dog, too." -> The dog , too . (decode joins
    with single spaces: exact on text written that way, the toy corpus)."""

    kind = "word"

    @classmethod
    def build(cls, texts, min_freq: int = 1, max_size: int | None = None, lowercase: bool = False) -> "WordTokenizer":
        """Learn a vocabulary from texts (list of str): the words seen >= min_freq times, most frequent first (ties:
        alphabetical), at most max_size ids (specials included)."""
        texts = _check_texts(texts, "WordTokenizer.build")
        checks.positive_int("WordTokenizer.build", "min_freq", min_freq)
        if max_size is not None:
            checks.int_in("WordTokenizer.build", "max_size", max_size, len(SPECIAL_TOKENS), sys.maxsize)
        tokenizer = cls(lowercase=lowercase)
        counts = Counter(piece for text in texts for piece, _ in tokenizer.pieces(text))
        ranked = sorted((w for w, c in counts.items() if c >= min_freq and w not in SPECIAL_TOKENS),
                        key=lambda w: (-counts[w], w))
        tokenizer.vocab = Vocab(ranked if max_size is None else ranked[: max_size - len(SPECIAL_TOKENS)])
        return tokenizer

    def tokenize(self, text: str) -> list[str]:
        return [piece for piece, _ in self.pieces(_check_text(text, "WordTokenizer.tokenize"))]

    def _piece_ids(self, piece: tuple[str, bool]) -> tuple[int]:
        return (self.vocab[piece[0]],)

    def decode(self, ids, skip_special: bool = True) -> str:
        return " ".join(self._ids_to_tokens(ids, skip_special, "WordTokenizer.decode"))


class BPETokenizer(_Tokenizer):
    """Byte-pair encoding; a word's last piece ends in </w>, so decoding finds the spaces ("the dog." -> the</w>
    dog .</w>). Learning starts each piece as its characters (d o g</w>), then again and again merges the most
    frequent adjacent pair (ties: alphabetical). Vocabulary: specials, every character seen (plain and with </w>),
    one symbol per merge, last <unk></w> for an unseen character ending a word (last, so a vocabulary saved
    without it keeps every other id). Encoding applies the merges in learned order, which reproduces the training
    segmentation: ``decode(encode(text)) == " ".join(text.split())`` when every character was seen."""

    kind = "bpe"
    _label = staticmethod(_readable_piece)

    def __init__(self, vocab: Vocab | None = None, merges=(), lowercase: bool = False):
        super().__init__(vocab, lowercase)
        self.merges: list[tuple[str, str]] = [tuple(m) for m in merges]
        self.ranks: dict[tuple[str, str], int] = {pair: r for r, pair in enumerate(self.merges)}
        self._cache: dict[tuple[str, bool], tuple[int, ...]] = {}

    @classmethod
    def learn(cls, texts, vocab_size: int | None = None, num_merges: int | None = None,
              min_frequency: int = 2, lowercase: bool = False) -> "BPETokenizer":
        """Learn merges from texts (list of str; source and target together for a shared vocabulary). Give exactly
        one of vocab_size (specials included) or num_merges; stops early when no pair occurs min_frequency times."""
        texts = _check_texts(texts, "BPETokenizer.learn")
        if (vocab_size is None) == (num_merges is None):
            raise ValueError("BPETokenizer.learn: give exactly one of vocab_size or num_merges, "
                             f"got vocab_size={vocab_size!r}, num_merges={num_merges!r}")
        name, value = ("vocab_size", vocab_size) if num_merges is None else ("num_merges", num_merges)
        checks.int_in("BPETokenizer.learn", name, value, 0, sys.maxsize)
        checks.positive_int("BPETokenizer.learn", "min_frequency", min_frequency)

        # Distinct pieces (prepared as encode will) and their counts; each piece as a list of symbols.
        piece_counts = Counter(chunk for text in texts for p in cls(lowercase=lowercase).pieces(text)
                               for chunk in _learning_chunks(*p))
        words = [_initial_symbols(piece, ends_word) for piece, ends_word in piece_counts]
        freqs = list(piece_counts.values())

        # The alphabet: every character seen, plain and with </w>, so any word of known characters can be encoded.
        chars = sorted({ch for piece, _ in piece_counts for ch in piece})
        vocab = Vocab([c for ch in chars for c in (ch, ch + END_OF_WORD)])
        if vocab_size is not None and vocab_size < len(vocab) + 1:
            raise ValueError(f"BPETokenizer.learn: vocab_size={vocab_size} is smaller than the specials plus the "
                             f"alphabet plus {UNK_END_OF_WORD}; ask for at least {len(vocab) + 1}")

        # pair -> total count, pair -> indices of the words that contain it, and a max-heap of (-count, pair).
        pair_counts: Counter = Counter()
        where: dict[tuple[str, str], set[int]] = {}
        for w, symbols in enumerate(words):
            for pair in itertools.pairwise(symbols):
                pair_counts[pair] += freqs[w]
                where.setdefault(pair, set()).add(w)
        heap = [(-c, pair) for pair, c in pair_counts.items()]
        heapq.heapify(heap)

        merges = []
        while heap and (num_merges is None or len(merges) < num_merges) and \
                (vocab_size is None or len(vocab) + 1 < vocab_size):      # + 1: <unk></w> comes after the merges
            neg_count, pair = heapq.heappop(heap)
            if pair_counts.get(pair, 0) != -neg_count:
                continue                                  # stale entry: the count changed after it was pushed
            if -neg_count < min_frequency:
                break
            merges.append(pair)
            merged = pair[0] + pair[1]
            vocab.add(merged)
            # Only pairs with a, b or ab in them change; the rest of a word's pairs stay as they are.
            touched = {pair[0], pair[1], merged}
            delta: Counter = Counter()                    # how each pair's count changes with this merge
            for w in where.pop(pair):
                old, new = words[w], _merge_pair(words[w], pair)
                if new is old:
                    continue
                for sign, symbols in ((-1, old), (1, new)):     # the word's old pairs out, its new pairs in
                    for p in itertools.pairwise(symbols):
                        if p[0] in touched or p[1] in touched:
                            delta[p] += sign * freqs[w]
                            if sign > 0 and merged in p:
                                where.setdefault(p, set()).add(w)
                words[w] = new
            for p, d in delta.items():                          # a pair whose count is unchanged keeps its entry
                if d and (c := pair_counts.pop(p, 0) + d) > 0:
                    pair_counts[p] = c
                    heapq.heappush(heap, (-c, p))
        vocab.add(UNK_END_OF_WORD)
        return cls(vocab, merges, lowercase=lowercase)

    def tokenize(self, text: str) -> list[str]:
        """The subword symbols of text: "the dog." -> ["the</w>", "dog", ".</w>"] (given the merges)."""
        return [self.vocab.itos[i] for i in self.encode(_check_text(text, "BPETokenizer.tokenize"))]

    def _piece_ids(self, piece: tuple[str, bool]) -> tuple[int, ...]:
        """A piece's ids, cached; an unseen character is <unk>, or <unk></w> (if the vocabulary has it) at the end."""
        cached = self._cache.get(piece)
        if cached is None:
            unk_end = self.vocab[UNK_END_OF_WORD]
            cached = tuple(self.vocab.stoi.get(s, unk_end if s.endswith(END_OF_WORD) else UNK)
                           for s in self._apply_merges(_initial_symbols(*piece)))
            if len(self._cache) < 200_000 and len(piece[0]) <= MAX_LEARN_CHARS:
                self._cache[piece] = cached
        return cached

    def _apply_merges(self, symbols: list[str]) -> list[str]:
        """Merge the lowest-ranked adjacent pair, every occurrence left to right, until none is a merge. O(n log n):
        the symbols form a linked list, and a heap of (rank, position) hands over one rank's pairs at a time."""
        n = len(symbols)
        symbols = list(symbols)
        after, before = list(range(1, n + 1)), list(range(-1, n - 1))         # n / -1: no neighbour
        heap = [(self.ranks[p], i) for i, p in enumerate(itertools.pairwise(symbols)) if p in self.ranks]
        heapq.heapify(heap)
        while heap:
            rank, group = heap[0][0], []
            while heap and heap[0][0] == rank:
                group.append(heapq.heappop(heap)[1])            # positions, left to right
            new_pairs = []
            for i in group:
                j = after[i]
                if symbols[i] is None or j == n or (symbols[i], symbols[j]) != self.merges[rank]:
                    continue                                    # stale: merged or changed since it was pushed
                symbols[i], symbols[j] = symbols[i] + symbols[j], None     # j joins its left neighbour
                after[i] = after[j]
                if after[i] < n:
                    before[after[i]] = i
                new_pairs += [before[i], i]                     # the pairs the new symbol starts or ends
            for left in new_pairs:                              # pushed after the pass: none has this rank
                if left >= 0 and symbols[left] is not None and after[left] < n:
                    rank_left = self.ranks.get((symbols[left], symbols[after[left]]))
                    if rank_left is not None:
                        heapq.heappush(heap, (rank_left, left))
        return [s for s in symbols if s is not None]

    def decode(self, ids, skip_special: bool = True) -> str:
        tokens = self._ids_to_tokens(ids, skip_special, "BPETokenizer.decode")
        return "".join(t.removesuffix(END_OF_WORD) + " " if t.endswith(END_OF_WORD) else t
                       for t in tokens).removesuffix(" ")              # the space of the last </w>

    def to_dict(self) -> dict:
        return {**super().to_dict(), "merges": [list(m) for m in self.merges]}


def _learning_chunks(piece: str, ends_word: bool):
    """A piece cut into parts of MAX_LEARN_CHARS (the last keeps ends_word): a merge rewrites every part holding
    its pair, so an uncut piece would cost O(n) per merge; the few pairs across a cut are not counted."""
    for start in range(0, len(piece), MAX_LEARN_CHARS):
        yield piece[start:start + MAX_LEARN_CHARS], ends_word and start + MAX_LEARN_CHARS >= len(piece)


def _initial_symbols(piece: str, ends_word: bool) -> list[str]:
    """'dog', True -> ['d', 'o', 'g</w>']"""
    return list(piece[:-1]) + [piece[-1] + END_OF_WORD] if ends_word else list(piece)


def _merge_pair(symbols: list[str], pair: tuple[str, str]) -> list[str]:
    """Every non-overlapping occurrence of pair (left to right) replaced by the joined symbol; the same list
    object when pair does not occur."""
    out, i = [], 0
    while i < len(symbols):
        here = i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == pair
        out.append(pair[0] + pair[1] if here else symbols[i])
        i += 2 if here else 1
    return out if len(out) != len(symbols) else symbols


def _check_dict(data, kind: str, where: str) -> None:
    """What ``to_dict`` writes: type, tokens (str, specials first, no repeats), merges (str pairs), lowercase."""
    if not isinstance(data, dict) or data.get("type") != kind or "tokens" not in data:
        raise ValueError(f"{where}: data must be a dict with type={kind!r} and tokens, got "
                         f"{type(data).__name__} with type={data.get('type') if isinstance(data, dict) else None!r}")
    tokens, merges = data["tokens"], data.get("merges", [])
    if not isinstance(tokens, (list, tuple)) or not all(isinstance(t, str) for t in tokens):
        raise TypeError(f"{where}: data['tokens'] must be a list of str, got {tokens!r:.80}")
    if list(tokens[: len(SPECIAL_TOKENS)]) != list(SPECIAL_TOKENS):
        raise ValueError(f"{where}: data's tokens must start with {SPECIAL_TOKENS}, got {tokens[:4]!r}")
    if len(set(tokens)) != len(tokens):
        raise ValueError(f"{where}: data['tokens'] must not repeat a token (every later id would shift), got "
                         f"{sorted(t for t, c in Counter(tokens).items() if c > 1)[:5]!r} more than once")
    if not isinstance(merges, (list, tuple)) or not all(
            isinstance(m, (list, tuple)) and len(m) == 2 and all(isinstance(x, str) for x in m) for m in merges):
        raise TypeError(f"{where}: data['merges'] must be a list of [str, str] pairs, got {merges!r:.80}")
    if not isinstance(data.get("lowercase", False), bool):
        raise TypeError(f"{where}: data['lowercase'] must be a bool, got {data['lowercase']!r}")


def check_size(text, where: str):
    """text, a tokeniser's JSON (str or bytes), if it is at most ``limits.MAX_TOKENIZER_BYTES`` in UTF-8, else a
    ValueError naming ``where``; checked before parsing, which costs about ten times the text in memory."""
    cap = limits.MAX_TOKENIZER_BYTES              # a str of more characters than that is more bytes, never encoded
    if isinstance(text, (str, bytes)) and (len(text) > cap or isinstance(text, str) and
                                           len(text.encode("utf-8", "surrogatepass")) > cap):
        raise ValueError(f"{where}: more than {cap:,} bytes, the most a tokenizer's JSON may be "
                         f"(minitransformer.kit.limits.MAX_TOKENIZER_BYTES): refused unread")
    return text


def tokenizer_from_dict(data: dict):
    """A WordTokenizer or BPETokenizer from what its ``to_dict`` returned (checkpoints store that)."""
    kinds = {"word": WordTokenizer, "bpe": BPETokenizer}
    if not isinstance(data, dict) or data.get("type") not in kinds:
        raise ValueError(f"tokenizer_from_dict: data must be a dict with type in {sorted(kinds)}, got {data!r:.80}")
    return kinds[data["type"]].from_dict(data)


def tokenizer_from_json(text: str, where: str = "tokenizer_from_json: text"):
    """A WordTokenizer or BPETokenizer from what its ``to_json`` returned, its size checked before parsing
    (``check_size``); where: how an error names the text."""
    return tokenizer_from_dict(files.parse_json(check_size(text, where), where))


def load_tokenizer(path):
    """Read a tokeniser saved with ``save(path)``, whichever kind it is: from a regular file only (a FIFO is
    refused, not waited on), read no further than one byte past the size a tokeniser may have."""
    with files.open_regular(path, "tokenizer file") as f:
        text = f.read(limits.MAX_TOKENIZER_BYTES + 1)
    return tokenizer_from_json(text, f"load_tokenizer: tokenizer file {path}")
