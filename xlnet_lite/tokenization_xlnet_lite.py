"""Train a SentencePiece-style Unigram tokenizer with XLNet's special tokens and templates.

The tokenizer is built with the `tokenizers` library and returned as a transformers
`PreTrainedTokenizerFast`. Its normalizer and pre-tokenizer are the ones transformers' own
`XLNetTokenizer` uses (quotes, NFKD, accents stripped, whitespace split, Metaspace "▁"), so an
`XLNetTokenizer` built from the same vocabulary encodes every text identically.

Layout (as in XLNet): a single text is `A <sep> <cls>` with token_type_ids 0.., 0, 2; a pair is
`A <sep> B <sep> <cls>` with 0.., 0, 1.., 1, 2; padding goes on the LEFT so `<cls>` stays last.

Training is deterministic: the same texts and settings give a byte-identical `tokenizer.json` in any
process and with any thread count. `tokenizers`' UnigramTrainer is not: it keeps the word counts in a
hash map seeded afresh in every process, so its EM adds up the words in a different order each time
(and in chunks that depend on the thread count), and it gives the characters its model dropped their
penalty scores (1e-4 apart) and ids in hash-set order. Scores then differ by ~4e-11 (by multiples of
1e-4 for those characters) and ids of tied pieces swap. The trainer's piece *set* does not depend on that order
(measured), so `train_tokenizer` keeps its pieces and re-estimates their scores with a few EM steps of
its own (`_deterministic_scores`), over the words in sorted order.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

# XLNet's vocabulary starts with these pieces, in this order (zihangdai/xlnet data_utils.py).
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<cls>", "<sep>", "<pad>", "<mask>", "<eod>"]
XLNET_PAD_TOKEN_TYPE_ID = 3  # transformers' XLNetTokenizer pads token_type_ids with 3


def _backend_tokenizer() -> Tokenizer:
    """An untrained Unigram tokenizer with XLNet's normalizer, pre-tokenizer and decoder."""
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.Sequence(
        [
            normalizers.Replace("``", '"'),
            normalizers.Replace("''", '"'),
            normalizers.NFKD(),
            normalizers.StripAccents(),
        ]
    )
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always"),
        ]
    )
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    return tok


def _xlnet_post_processor(sep_id: int, cls_id: int) -> processors.TemplateProcessing:
    return processors.TemplateProcessing(
        single="$A:0 <sep>:0 <cls>:2",
        pair="$A:0 <sep>:0 $B:1 <sep>:1 <cls>:2",
        special_tokens=[("<sep>", sep_id), ("<cls>", cls_id)],
    )


def _as_file_list(texts_or_files) -> list[str] | None:
    """The list of file paths if `texts_or_files` is a list/tuple of existing paths, else None."""
    if isinstance(texts_or_files, (str, os.PathLike)):
        raise ValueError(
            "texts_or_files must be an iterable of texts or a list of file paths, not a single "
            f"{type(texts_or_files).__name__}; wrap it in a list."
        )
    if not isinstance(texts_or_files, (list, tuple)) or not texts_or_files:
        return None
    if all(isinstance(p, Path) for p in texts_or_files):
        paths = [str(p) for p in texts_or_files]
    elif all(isinstance(p, str) and "\n" not in p and len(p) < 4096 and os.path.isfile(p) for p in texts_or_files):
        paths = list(texts_or_files)
    else:
        return None
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise ValueError(f"texts_or_files: file not found: {missing[0]}")
    return paths


def _non_empty_texts(texts: Iterable[str], words: "_WordCounter"):
    """The non-blank texts, counted into `words` as they pass to the trainer."""
    for text in texts:
        if not isinstance(text, str):
            raise ValueError(f"texts_or_files must contain strings, got {type(text).__name__}")
        if text.strip():
            words.add(text)
            yield text


def _count_file_words(paths: list[str], words: "_WordCounter") -> None:
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                words.add(line)


# Rust's char::is_whitespace, which the WhitespaceSplit pre-tokenizer splits on (Python's str.split()
# also splits on U+001C..U+001F).
_RUST_WHITESPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
# WhitespaceSplit then Metaspace(prepend "always", split): a word starts at a "▁" or after whitespace.
_WORD = re.compile(f"▁[^▁{_RUST_WHITESPACE}]*|[^▁{_RUST_WHITESPACE}]+")


class _WordCounter:
    """Counts the words the Unigram trainer sees: normalized, pre-tokenized, "▁"-prefixed.

    Same words as `backend.pre_tokenizer.pre_tokenize_str(backend.normalizer.normalize_str(text))`,
    about 5x faster (tests/data/test_tokenizer_determinism.py checks the two agree).
    """

    def __init__(self, backend: Tokenizer):
        self.normalize = backend.normalizer.normalize_str
        self.counts: Counter[str] = Counter()

    def add(self, text: str) -> None:
        self.counts.update(_WORD.findall(self.normalize(text)))

    def sorted_items(self) -> list[tuple[str, int]]:
        merged: Counter[str] = Counter()
        for word, count in self.counts.items():
            merged[word if word.startswith("▁") else "▁" + word] += count
        return sorted(merged.items())


# ----------------------------------------------------------------------------------------------------
# Deterministic scores: EM over the trained pieces, words in sorted order (see the module docstring).
# Notation: W words, C characters of the words laid end to end, E piece occurrences (lattice edges);
# a word of n characters has n + 1 lattice nodes, so there are C + W nodes.

EM_ITERATIONS = 5  # from SentencePiece's seed scores: the corpus likelihood is within 1e-6 of its plateau


def _trie(pieces: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(edge keys node * 0x110000 + code point, sorted; child node of each key; piece index of each node or -1)."""
    children: dict[tuple[int, int], int] = {}
    piece_of_node = [-1]
    for index, piece in enumerate(pieces):
        node = 0
        for char in piece:
            node = children.setdefault((node, ord(char)), len(piece_of_node))
            if node == len(piece_of_node):
                piece_of_node.append(-1)
        piece_of_node[node] = index
    keys = np.array([parent * 0x110000 + char for parent, char in children], dtype=np.int64)
    order = np.argsort(keys)
    return keys[order], np.array(list(children.values()), dtype=np.int64)[order], np.array(piece_of_node)


def _occurrences(chars: np.ndarray, word_end: np.ndarray, pieces: list[str]) -> tuple[np.ndarray, ...]:
    """(start, length, piece) of every occurrence of a piece inside a word, walking the pieces' trie from every
    character at once. `chars` (C,) holds the code points of the words laid end to end; `word_end` (C,) the
    position one past each character's word."""
    keys, child, piece_of_node = _trie(pieces)
    position, node = np.arange(len(chars)), np.zeros(len(chars), dtype=np.int64)
    found = []
    for length in range(1, max(len(p) for p in pieces) + 1):
        inside = position + length - 1 < word_end[position]
        position, node = position[inside], node[inside]
        key = node * 0x110000 + chars[position + length - 1]
        index = np.minimum(np.searchsorted(keys, key), len(keys) - 1)
        hit = keys[index] == key
        position, node = position[hit], child[index[hit]]
        is_piece = piece_of_node[node] >= 0
        found.append((position[is_piece], np.full(is_piece.sum(), length), piece_of_node[node[is_piece]]))
    return tuple(np.concatenate(column) for column in zip(*found))


def _lattice(words: list[str], pieces: list[str]) -> dict:
    """Every occurrence of a piece in the words, as an edge between two lattice nodes.

    Returns arrays `start`, `end` (node ids, E), `piece` (E), `word` (word of each edge, E), `first`
    (first node of each word, W), `last` (last node of each word, W), the node count `n_nodes`, and the
    `forward` and `backward` sweeps over the edges.
    """
    lengths = np.array([len(w) for w in words], dtype=np.int64)
    offsets = np.cumsum(lengths) - lengths  # (W,) first character of each word
    chars = np.frombuffer("".join(words).encode("utf-32-le"), dtype=np.uint32).astype(np.int64)  # (C,)
    word_of_char = np.repeat(np.arange(len(words)), lengths)  # (C,)
    occurrences = _occurrences(chars, (offsets + lengths)[word_of_char], pieces)
    start_char, length, piece = (column.astype(np.int32) for column in occurrences)  # int32 halves the memory
    word = word_of_char[start_char].astype(np.int32)
    start = start_char + word  # node id = character position + word index: a word of n characters has n + 1 nodes
    end = start + length
    local_start = start_char - offsets[word]  # (E,) position of the edge's start in its word
    first = offsets + np.arange(len(words))
    return {
        "start": start,
        "end": end,
        "piece": piece,
        "word": word,
        "first": first,
        "last": first + lengths,
        "n_nodes": len(chars) + len(words),
        "forward": _Sweep(local_start + length, start, end, piece),
        "backward": _Sweep(-local_start, end, start, piece),
    }


class _Sweep:
    """One pass of forward-backward: for each level, in order, the edges feeding that level's nodes.

    A level's `targets[g]` = log(sum(exp(source[edge] + score[edge]))) over the edges of group g, where the
    forward pass reads a node's value from the edge's start and writes its end (levels: end position within
    the word), and the backward pass the reverse (levels: start position within the word, last first).
    """

    def __init__(self, level: np.ndarray, read: np.ndarray, write: np.ndarray, piece: np.ndarray):
        order = np.lexsort((write, level))
        self.levels = []
        for edges in np.split(order, np.flatnonzero(np.diff(level[order])) + 1) if len(order) else []:
            bounds = np.flatnonzero(np.r_[True, write[edges][1:] != write[edges][:-1]])
            sizes = np.diff(np.r_[bounds, len(edges)])
            self.levels.append((read[edges], piece[edges], bounds, sizes, write[edges][bounds]))

    def run(self, values: np.ndarray, scores: np.ndarray) -> None:
        for read, piece, bounds, sizes, targets in self.levels:
            incoming = values[read] + scores[piece]
            peak = np.maximum.reduceat(incoming, bounds)
            total = np.add.reduceat(np.exp(incoming - np.repeat(peak, sizes)), bounds)
            values[targets] = peak + np.log(total)


def _expected_counts(lattice: dict, counts: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Expected number of uses of each piece over all segmentations of the words (forward-backward)."""
    start, end, piece, word = lattice["start"], lattice["end"], lattice["piece"], lattice["word"]
    alpha = np.full(lattice["n_nodes"], -np.inf)
    alpha[lattice["first"]] = 0.0
    lattice["forward"].run(alpha, scores)
    beta = np.full(lattice["n_nodes"], -np.inf)
    beta[lattice["last"]] = 0.0
    lattice["backward"].run(beta, scores)
    log_z = alpha[lattice["last"]]  # (W,)
    posterior = np.exp(alpha[start] + scores[piece] + beta[end] - log_z[word]) * counts[word]  # (E,)
    return np.bincount(piece, weights=posterior, minlength=len(scores))


def _digamma(x: np.ndarray) -> np.ndarray:
    """The digamma approximation of `tokenizers`' Unigram trainer, elementwise."""
    x, result = x.astype(np.float64), np.zeros(len(x))
    while (small := x < 7.0).any():
        result[small] -= 1.0 / x[small]
        x[small] += 1.0
    x -= 0.5
    xx2 = 1.0 / (x * x)
    xx4 = xx2 * xx2
    return result + np.log(x) + xx2 / 24.0 - 7.0 / 960.0 * xx4 + 31.0 / 8064.0 * xx4 * xx2 - 127.0 / 30720.0 * xx4 * xx4


def _deterministic_scores(word_counts: list[tuple[str, int]], pieces: list[str], iterations: int) -> np.ndarray:
    """Log-probabilities of `pieces` after `iterations` EM steps on the words, from SentencePiece's seed scores.

    The M-step is the trainer's (Bayesian, digamma); a piece expected fewer than 0.5 times is scored as if
    expected 0.5 times, so it stays in the vocabulary with the lowest scores. Words holding a character
    that is no piece (none, for the trainer's vocabulary) are left out.
    """
    singles = {p for p in pieces if len(p) == 1}
    word_counts = [(w, c) for w, c in word_counts if all(ch in singles for ch in w)]
    lattice = _lattice([w for w, _ in word_counts], pieces)
    counts = np.array([c for _, c in word_counts], dtype=np.float64)
    occurrences = np.bincount(lattice["piece"], weights=counts[lattice["word"]], minlength=len(pieces))
    seed = np.maximum(occurrences * np.array([len(p) for p in pieces]), 0.5)  # frequency x length, as SentencePiece
    scores = np.log(seed) - np.log(seed.sum())
    for _ in range(iterations):
        expected = _expected_counts(lattice, counts, scores)
        scores = _digamma(np.maximum(expected, 0.5)) - _digamma(np.array([expected.sum()]))
    return scores


def _rescore(backend: Tokenizer, word_counts: list[tuple[str, int]]) -> None:
    """Replace the trained model's scores with deterministic ones; pieces ordered by score, then text."""
    pieces = sorted(p for p in backend.get_vocab() if p not in SPECIAL_TOKENS)
    scores = _deterministic_scores(word_counts, pieces, EM_ITERATIONS)
    ranked = sorted(zip(pieces, scores.tolist()), key=lambda ps: (-ps[1], ps[0]))
    vocab = [(token, 0.0) for token in SPECIAL_TOKENS] + ranked
    backend.model = models.Unigram(vocab, unk_id=0, byte_fallback=False)


def wrap_tokenizer(backend: Tokenizer) -> PreTrainedTokenizerFast:
    """Wrap a `tokenizers.Tokenizer` holding XLNet's special tokens as a transformers tokenizer.

    Sets the special tokens, left padding, `token_type_ids` among the model inputs and
    XLNet's padding token type id 3.
    """
    ids = {t: backend.token_to_id(t) for t in SPECIAL_TOKENS}
    missing = [t for t, i in ids.items() if i is None]
    if missing:
        raise ValueError(f"backend tokenizer lacks the special tokens {missing}")
    backend.post_processor = _xlnet_post_processor(ids["<sep>"], ids["<cls>"])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        cls_token="<cls>",
        sep_token="<sep>",
        pad_token="<pad>",
        mask_token="<mask>",
        additional_special_tokens=["<eod>"],
        padding_side="left",
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )
    tokenizer._pad_token_type_id = XLNET_PAD_TOKEN_TYPE_ID
    return tokenizer


def train_tokenizer(
    texts_or_files,
    vocab_size: int = 8000,
    *,
    max_piece_length: int = 16,
    show_progress: bool = False,
) -> PreTrainedTokenizerFast:
    """Train a Unigram (SentencePiece-style, Metaspace "▁") tokenizer with XLNet's special tokens.

    Args:
        texts_or_files: an iterable of texts (strings), or a list of paths (str or Path) of
            UTF-8 text files.
        vocab_size: size of the vocabulary including the 8 special tokens. A small corpus may
            yield fewer pieces than asked for.
        max_piece_length: longest piece, in characters.
        show_progress: show the `tokenizers` progress bar.

    Returns:
        A `PreTrainedTokenizerFast` with ids `<unk>`=0, `<s>`=1, `</s>`=2, `<cls>`=3, `<sep>`=4,
        `<pad>`=5, `<mask>`=6, `<eod>`=7, that encodes a text as `A <sep> <cls>` and a pair as
        `A <sep> B <sep> <cls>` (token_type_ids 0/1/2), pads on the left with token type 3.
        The same texts and settings give the same tokenizer, byte for byte, in any process, with
        any thread count and in any input order. Save it with `save_pretrained`; reload it with
        `load_tokenizer` (see there for loading without xlnet_lite).

    Raises:
        ValueError: if the corpus is empty or holds only whitespace, or a file is missing.
    """
    if vocab_size <= len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must be larger than {len(SPECIAL_TOKENS)}, got {vocab_size}")
    backend = _backend_tokenizer()
    trainer = trainers.UnigramTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        unk_token="<unk>",
        max_piece_length=max_piece_length,
        show_progress=show_progress,
    )
    words = _WordCounter(backend)
    paths = _as_file_list(texts_or_files)
    if paths is not None:
        _count_file_words(paths, words)
        if not words.counts:
            raise ValueError(f"texts_or_files: the files {paths} hold no text (empty or whitespace only)")
        backend.train(paths, trainer)
    else:
        backend.train_from_iterator(_non_empty_texts(texts_or_files, words), trainer)
        if not words.counts:
            raise ValueError("texts_or_files is empty or holds only whitespace: nothing to train a tokenizer on")
    _rescore(backend, words.sorted_items())
    for expected_id, token in enumerate(SPECIAL_TOKENS):
        assert backend.token_to_id(token) == expected_id, (token, backend.token_to_id(token))
    return wrap_tokenizer(backend)


def load_tokenizer(name_or_path: str | os.PathLike, **kwargs) -> PreTrainedTokenizerBase:
    """`AutoTokenizer.from_pretrained`, then restore XLNet's padding token type id 3.

    transformers 5.23 keeps no `pad_token_type_id`: every reloaded tokenizer pads token_type_ids
    with 0 (its own XLNetTokenizer too: it sets 3 before the base class resets it). Only padded
    positions differ. Where xlnet_lite is not installed, a saved tokenizer is a plain transformers
    tokenizer: `AutoTokenizer.from_pretrained(folder)` loads a folder holding only the tokenizer
    silently; for a folder that also holds a model, pass `trust_remote_code=True`: AutoTokenizer
    first loads the model's config.json, and without it asks whether to run that config's code.
    """
    tokenizer = AutoTokenizer.from_pretrained(name_or_path, **kwargs)
    if "token_type_ids" not in tokenizer.model_input_names:
        tokenizer.model_input_names = [*tokenizer.model_input_names, "token_type_ids"]
    tokenizer._pad_token_type_id = XLNET_PAD_TOKEN_TYPE_ID
    return tokenizer


def special_token_ids(tokenizer: PreTrainedTokenizerBase) -> dict[str, int | None]:
    """Ids of XLNet's special tokens, looked up by token string (None where the vocab lacks one).

    Works for tokenizers from `train_tokenizer` and for transformers' `XLNetTokenizer(Fast)`.
    """
    vocab = tokenizer.get_vocab()
    ids = {token: vocab.get(token) for token in SPECIAL_TOKENS}
    for name, attr in (("<sep>", "sep_token_id"), ("<cls>", "cls_token_id"), ("<pad>", "pad_token_id")):
        value = getattr(tokenizer, attr, None)
        if value is not None:
            ids[name] = value
    return ids
