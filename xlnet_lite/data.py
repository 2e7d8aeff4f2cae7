"""Pretraining data: documents, tokenization, and contiguous streams of XLNet samples.

A pretraining sample (zihangdai/xlnet data_utils.py, `create_tfrecords` / `_split_a_and_b`) is

    [reuse_len tokens] + A + <sep> + B + <sep> + <cls>          (seq_len tokens)
    token_type_ids:  0 ... 0 | 0 ... 0   0  | 1 ... 1   1  | 2

where A starts right after the reused part and ends at a sentence boundary, and B continues A
half the time and is a random sentence-aligned span of the same row otherwise. The corpus is
one token stream (documents end with `<eod>`), cut into contiguous rows; row r of step t+1
starts reuse_len tokens after row r of step t, so the Transformer-XL memory (which caches the
first reuse_len positions) always holds the text just before the new window.

The targets and the permutation mask are sampled later, by
`collator.DataCollatorForXLNetPretraining`.
"""

from __future__ import annotations

import itertools
import mmap
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from .tokenization_xlnet_lite import special_token_ids

# ---------------------------------------------------------------------------------------------
# Documents and tokenization
# ---------------------------------------------------------------------------------------------


def utf8_lines(path: str | os.PathLike) -> Iterator[str]:
    """The lines of a file, decoded; ValueError naming the file and the first line that is not valid UTF-8."""
    with open(path, "rb") as f:
        for line_number, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise ValueError(f"{path}: line {line_number} is not valid UTF-8 ({err.reason})") from None
            yield line


def iter_text_documents(path: str | os.PathLike) -> Iterator[str]:
    """The documents of a UTF-8 plain-text file in which an empty line separates documents, read one at a time.

    Lines of a document are stripped and joined with "\\n" (each line is treated as a sentence boundary).
    Raises ValueError naming the file and line where the text is not valid UTF-8.
    """
    current = []
    for line in utf8_lines(path):
        line = line.strip()
        if line:
            current.append(line)
        elif current:
            yield "\n".join(current)
            current = []
    if current:
        yield "\n".join(current)


def read_text_documents(path: str | os.PathLike) -> list[str]:
    """All documents of a UTF-8 plain-text file (`iter_text_documents`) in a list.

    Raises:
        ValueError: the file is not valid UTF-8 (names the file and line), or is empty or
            holds only whitespace (names the file).
    """
    documents = list(iter_text_documents(path))
    if not documents:
        count_text_documents(path)  # raises, naming the file
    return documents


def held_out_positions(n: int, percentage: float) -> list[int]:
    """Which of n documents a validation split of `percentage` percent holds out, in order: k = max(1,
    round(n * percentage / 100)) of them (at most n - 1), the middle document of each of k equal strides of the corpus.
    A corpus stored in order (by topic, source or date) is then validated on every part of it and trains on every part
    too, and the split depends on nothing but n and the percentage.

    Raises ValueError when n < 2 (one side would be empty) or the percentage is not in (0, 100).
    """
    if not 0 < percentage < 100:
        raise ValueError(f"the held-out percentage must be in (0, 100), got {percentage}")
    if n < 2:
        raise ValueError(f"needs at least two documents (one for validation), has {n}")
    k = min(n - 1, max(1, round(n * percentage / 100)))
    return [(2 * i + 1) * n // (2 * k) for i in range(k)]


class TextFileDocuments:
    """The documents of a text file (`iter_text_documents`), read lazily each time they are iterated: a corpus larger
    than memory is never held whole.

    `hold_out=p` holds p percent of the documents out for validation, spread over the file (`held_out_positions`):
    `part="validation"` is those documents, `part="train"` the others, each in file order; the documents are counted
    (one pass) when the part is first read.
    """

    def __init__(self, path: str | os.PathLike, *, hold_out: float | None = None, part: str | None = None):
        if (hold_out is None) != (part is None) or part not in (None, "train", "validation"):
            raise ValueError("pass hold_out with part='train' or part='validation', or neither")
        self.path, self.hold_out, self.part = Path(path), hold_out, part
        self._split = None

    def __iter__(self) -> Iterator[str]:
        documents = iter_text_documents(self.path)
        if self.part is None:
            return documents
        _, held_out = self._held_out()
        keep = self.part == "validation"
        return (text for i, text in enumerate(documents) if (i in held_out) == keep)

    def num_documents(self) -> int:
        """How many documents this part holds (the file counted once)."""
        if self.part is None:
            return count_text_documents(self.path)
        n, held_out = self._held_out()
        return len(held_out) if self.part == "validation" else n - len(held_out)

    def _held_out(self) -> tuple[int, frozenset[int]]:
        if self._split is None:
            n = count_text_documents(self.path)
            try:
                positions = held_out_positions(n, self.hold_out)
            except ValueError as err:
                raise ValueError(f"{self.path}: {err}") from None
            self._split = (n, frozenset(positions))
        return self._split

    def fingerprint(self) -> dict:
        """What identifies these documents without reading them: the file (as `datasets` identifies a local data
        file: path, size, modification time) and the part, with the way the part is chosen."""
        stat = self.path.stat()
        return {
            "file": str(self.path.resolve()),
            "size": stat.st_size,
            "mtime_ns": stat.st_mtime_ns,
            "hold_out": self.hold_out,
            "part": self.part,
            "held_out_positions": "stride middles",
        }


def count_text_documents(path: str | os.PathLike) -> int:
    """How many documents `iter_text_documents` reads from the file (one pass, nothing kept).

    Raises ValueError naming the file (and line) when it is not valid UTF-8 or holds no document.
    """
    n = sum(1 for _ in iter_text_documents(path))
    if n == 0:
        raise ValueError(f"{path}: the file is empty or holds only whitespace; no documents to read")
    return n


def spread_documents(documents, limit: int, *, text_column: str = "text") -> list[str]:
    """Up to `limit` texts spread evenly over a corpus, to train a tokenizer on: documents i * n // limit for
    i < limit, or all n of them where n <= limit. A corpus stored in order (by topic, source or date) then gives the
    tokenizer every part of it, not only the first. The size n is known for a list, a `datasets.Dataset` and
    `TextFileDocuments` (counted in one pass); of a stream (`datasets.IterableDataset`, any other iterable) the
    first `limit` documents are taken.
    """
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")

    def positions(n):
        return range(n) if n <= limit else [i * n // limit for i in range(limit)]

    if hasattr(documents, "column_names"):  # datasets
        if not hasattr(documents, "num_rows"):  # a stream
            return [row[text_column] for row in documents.take(limit)]
        return list(documents.select(positions(documents.num_rows))[text_column])
    if isinstance(documents, TextFileDocuments):
        wanted = set(positions(documents.num_documents()))
        return [text for i, text in enumerate(documents) if i in wanted]
    if isinstance(documents, Sequence):
        return [documents[i] for i in positions(len(documents))]
    return list(itertools.islice(documents, limit))


def _iter_texts(documents, text_column: str) -> Iterator[str]:
    """The texts of a corpus in order, one at a time (a `datasets.Dataset` read in batches)."""
    if hasattr(documents, "column_names") and hasattr(documents, "num_rows"):
        for batch in documents.iter(batch_size=1000):
            yield from batch[text_column]
    elif hasattr(documents, "column_names"):  # a stream
        for row in documents:
            yield row[text_column]
    else:
        yield from documents


def _is_spread_position(i: int, n: int, limit: int) -> bool:
    """Whether document i is one of `spread_documents`' positions j * n // limit (j < limit) of n > limit documents."""
    j = -(-i * limit // n)  # the smallest j with j * n // limit >= i
    return j < limit and j * n // limit == i


class TokenizerSample:
    """The texts a tokenizer is trained on: at most `max_characters` characters (and at most `max_documents`
    documents) of a corpus, drawn evenly over it and read as the trainer asks for them, so that memory holds the text
    in flight, never the sample or the corpus.

    A corpus of known size (a list, a `datasets.Dataset`, `TextFileDocuments`) is measured first (one pass: documents
    and characters). Where `max_documents` is below its document count, the candidates are `spread_documents`'
    positions; where the candidates' text fits under `max_characters`, they are the sample, in order (as
    `spread_documents` gives them). Otherwise documents are taken at an even rate of text (max_characters over the
    candidates' characters): a document is taken when the text taken so far is at most that share of the text passed,
    whatever its own length, so long and short documents are as likely, and every part of the corpus is sampled. No
    more than `max_characters` characters are taken (a document that would pass the cap is cut). A stream gives its
    first documents, up to the caps (the last one cut to fill the character cap).

    After an iteration, `documents` and `characters` say what it read; `spread` is False for a stream.
    """

    def __init__(self, documents, max_characters: int, *, max_documents: int | None = None, text_column: str = "text"):
        if max_characters < 1:
            raise ValueError(f"max_characters must be >= 1, got {max_characters}")
        if max_documents is not None and max_documents < 1:
            raise ValueError(f"max_documents must be >= 1, got {max_documents}")
        self.corpus, self.text_column = documents, text_column
        self.max_characters, self.max_documents = max_characters, max_documents
        self.spread = isinstance(documents, (Sequence, TextFileDocuments)) or hasattr(documents, "num_rows")
        self.documents = self.characters = 0
        self._measured = None

    def characters_bound(self) -> int | None:
        """An upper bound on the corpus's characters known without reading it (a list: its exact count; a text file:
        its size in bytes; a Dataset: the UTF-8 bytes of its table's text column), None for a stream."""
        documents = self.corpus
        if isinstance(documents, TextFileDocuments):
            return documents.path.stat().st_size
        if isinstance(documents, Sequence):
            return sum(len(t) for t in documents)
        if hasattr(documents, "num_rows"):
            import pyarrow.compute as pc

            column = documents.data.column(self.text_column)
            return int(pc.sum(pc.binary_length(column)).as_py() or 0)
        return None

    def whole_corpus_fits(self) -> bool:
        """Whether the character cap is known, without reading the corpus, to keep all of it (the sample then being
        `spread_documents(corpus, max_documents)`)."""
        bound = self.characters_bound()
        return bound is not None and bound <= self.max_characters

    def measure(self) -> tuple[int, int]:
        """(documents, characters) of the candidates (all documents, or `max_documents` spread over them); one pass
        over the corpus (two when max_documents is below its document count). Not for a stream."""
        if self._measured is None:
            n = total = 0
            for text in _iter_texts(self.corpus, self.text_column):
                n, total = n + 1, total + len(text)
            if self.max_documents is not None and n > self.max_documents:
                total = sum(
                    len(text)
                    for i, text in enumerate(_iter_texts(self.corpus, self.text_column))
                    if _is_spread_position(i, n, self.max_documents)
                )
            self._measured = (n, total)
        return self._measured

    def __iter__(self) -> Iterator[str]:
        self.documents = self.characters = 0
        for text in self._texts():
            self.documents += 1
            self.characters += len(text)
            yield text

    def _texts(self) -> Iterator[str]:
        cap, limit = self.max_characters, self.max_documents
        texts = _iter_texts(self.corpus, self.text_column)
        if not self.spread:
            taken = 0
            for text in itertools.islice(texts, limit):
                piece = text[: cap - taken]
                taken += len(piece)
                yield piece
                if taken >= cap:
                    return
            return
        n, total = self.measure()
        if limit is not None and n > limit:
            texts = (text for i, text in enumerate(texts) if _is_spread_position(i, n, limit))
        if total <= cap:
            yield from texts
            return
        rate, passed, taken = cap / total, 0, 0
        for text in texts:
            if taken <= rate * passed and taken < cap:
                piece = text[: cap - taken]
                taken += len(piece)
                yield piece
            passed += len(text)


# A sentence ends at a line break, or at . ! ? (optionally followed by a closing quote or
# bracket) followed by whitespace.
_SENTENCE_END = re.compile(r"\s*\n\s*|(?:(?<=[.!?])|(?<=[.!?][\"'”’)\]]))\s+")


def split_sentences(text: str) -> list[str]:
    """Split a document into sentences (lines, then `. ! ?` + whitespace); drops empty pieces."""
    return [s for s in _SENTENCE_END.split(text.strip()) if s]


def _encode_sentences(texts, tokenizer) -> tuple[list[int], list[list[int]]]:
    """Each text split into sentences (`split_sentences`), every sentence encoded without special tokens: (the number
    of sentences of each text, the token ids of all sentences in order)."""
    sentences_per_doc = [split_sentences(text or "") for text in texts]
    flat = [s for doc in sentences_per_doc for s in doc]
    return [len(doc) for doc in sentences_per_doc], _encode_without_special_tokens(tokenizer, flat)


def _tokenize_batch(batch, *, tokenizer, text_column):
    ids, lengths = [], []
    sentences_per_doc, encoded = _encode_sentences(batch[text_column], tokenizer)
    k = 0
    for n in sentences_per_doc:
        pieces = [e for e in encoded[k : k + n] if e]
        k += n
        if pieces:
            ids.append([t for p in pieces for t in p])
            lengths.append([len(p) for p in pieces])
    return {"input_ids": ids, "sentence_lengths": lengths}


def tokenize_documents(documents, tokenizer, *, text_column: str = "text", batch_size: int = 1000):
    """Tokenize documents without special tokens, with `datasets.map(batched=True)`.

    Each document is split into sentences (`split_sentences`), whose boundaries are where A may
    end and B may start in a pretraining sample. Empty documents are dropped.

    Args:
        documents: a list of strings, a `datasets.Dataset` or a `datasets.IterableDataset`
            (streaming) with a text column.
        tokenizer: a transformers tokenizer (e.g. from `train_tokenizer`, or XLNetTokenizer).
        text_column: the column that holds the text (for datasets).
        batch_size: documents per `map` batch.

    Returns:
        A `Dataset` (for a list or a Dataset) or an `IterableDataset` (for an IterableDataset)
        with one row per non-empty document and the columns `input_ids` (list of int) and
        `sentence_lengths` (list of int, summing to len(input_ids)).
    """
    import datasets

    features = datasets.Features(
        {
            "input_ids": datasets.List(datasets.Value("int32")),
            "sentence_lengths": datasets.List(datasets.Value("int32")),
        }
    )
    if isinstance(documents, (str, bytes)):
        raise ValueError("documents must be a list of texts or a datasets dataset, not a single string")
    if not isinstance(documents, (datasets.Dataset, datasets.IterableDataset)):
        documents = list(documents)
        if not all(isinstance(d, str) for d in documents):
            raise ValueError("documents: a list must hold only strings")
        documents = datasets.Dataset.from_dict({text_column: documents})
    columns = documents.column_names
    if columns is not None and text_column not in columns:
        raise ValueError(f"text_column={text_column!r} is not a column of documents (columns: {columns})")
    fn_kwargs = {"tokenizer": tokenizer, "text_column": text_column}
    if isinstance(documents, datasets.IterableDataset):
        remove = columns if columns is not None else [text_column]
        return documents.map(
            _tokenize_batch,
            batched=True,
            batch_size=batch_size,
            fn_kwargs=fn_kwargs,
            remove_columns=remove,
            features=features,
        )
    return documents.map(
        _tokenize_batch,
        batched=True,
        batch_size=batch_size,
        fn_kwargs=fn_kwargs,
        remove_columns=columns,
        features=features,
        desc="Tokenizing",
    )


def _arrow_list_column(table, name):
    """(flat values, lengths) of a list<int> column of an Arrow table, without Python ints."""
    column = table.column(name).combine_chunks()
    values = column.flatten().to_numpy(zero_copy_only=False)
    lengths = np.diff(column.offsets.to_numpy(zero_copy_only=False))
    return values, lengths


class TokenArrays(NamedTuple):
    """A corpus already laid out as one token stream: `tokens` (N token ids, any integer dtype) and
    `sentence_starts` (sorted int64 positions in (0, N) where a sentence starts). Either may be a read-only memory
    map (`xlnet_lite.token_store.TokenStore.split`): the streams read it in place."""

    tokens: np.ndarray
    sentence_starts: np.ndarray


def build_token_stream(token_source, tokenizer, *, text_column: str = "text"):
    """One flat int32 token array for the corpus and the sentence boundaries in it.

    Documents are concatenated in order, each followed by `<eod>` (when the tokenizer has it),
    which is a sentence of its own, as in XLNet with `use_eod`.

    Args:
        token_source: `TokenArrays` (returned as they are), the output of `tokenize_documents`
            (Dataset or IterableDataset, which is read to the end), a list of token-id lists (one
            per document, no sentence boundaries inside), or anything `tokenize_documents` accepts.
        tokenizer: gives the id of `<eod>`.

    Returns:
        (tokens, sentence_starts): int32 array of N tokens, int64 array of the positions in
        (0, N) where a new sentence starts.
    """
    import datasets

    if isinstance(token_source, TokenArrays):
        return token_source.tokens, token_source.sentence_starts
    eod = special_token_ids(tokenizer)["<eod>"]
    if isinstance(token_source, (datasets.Dataset, datasets.IterableDataset)):
        names = token_source.column_names
        if names is None or "input_ids" not in names:
            token_source = tokenize_documents(token_source, tokenizer, text_column=text_column)
    elif isinstance(token_source, Sequence) and token_source and not isinstance(token_source[0], str):
        docs = [np.asarray(d, dtype=np.int64) for d in token_source]
        doc_lens = np.array([len(d) for d in docs], dtype=np.int64)
        flat = np.concatenate(docs) if docs else np.zeros(0, dtype=np.int64)
        return _with_eod(flat, doc_lens, doc_lens, np.ones(len(docs), dtype=np.int64), eod)
    else:
        token_source = tokenize_documents(token_source, tokenizer, text_column=text_column)

    if isinstance(token_source, datasets.Dataset):
        table = token_source.with_format("arrow")[:]
        flat, doc_lens = _arrow_list_column(table, "input_ids")
        if "sentence_lengths" in table.column_names:
            sent_lens, sents_per_doc = _arrow_list_column(table, "sentence_lengths")
        else:
            sent_lens, sents_per_doc = doc_lens, np.ones(len(doc_lens), dtype=np.int64)
    else:  # IterableDataset: read the stream to its end
        docs, sents = [], []
        for row in token_source:
            docs.append(np.asarray(row["input_ids"], dtype=np.int64))
            sents.append(np.asarray(row.get("sentence_lengths") or [len(row["input_ids"])], dtype=np.int64))
        doc_lens = np.array([len(d) for d in docs], dtype=np.int64)
        flat = np.concatenate(docs) if docs else np.zeros(0, dtype=np.int64)
        sents_per_doc = np.array([len(s) for s in sents], dtype=np.int64)
        sent_lens = np.concatenate(sents) if sents else np.zeros(0, dtype=np.int64)
    return _with_eod(flat, doc_lens, sent_lens, sents_per_doc, eod)


def _with_eod(flat, doc_lens, sent_lens, sents_per_doc, eod):
    flat, sent_lens = _insert_eod(flat, doc_lens, sent_lens, sents_per_doc, eod)
    starts = np.cumsum(sent_lens)[:-1]
    return flat, starts.astype(np.int64)


def _insert_eod(flat, doc_lens, sent_lens, sents_per_doc, eod):
    """(tokens with `<eod>` after each non-empty document, the lengths of their non-empty sentences)."""
    flat = np.asarray(flat, dtype=np.int32)
    sent_lens = np.asarray(sent_lens, dtype=np.int64)
    doc_lens = np.asarray(doc_lens, dtype=np.int64)
    keep = doc_lens > 0
    if eod is not None:
        flat = np.insert(flat, np.cumsum(doc_lens)[keep], eod)
        sent_lens = np.insert(sent_lens, np.cumsum(sents_per_doc)[keep], 1)
    return flat.astype(np.int32, copy=False), sent_lens[sent_lens > 0]


# Characters of sentences `encode_documents` encodes at once: ~1 MB of text, ~0.3M tokens, a few tens of MB of the
# tokenizers library's encodings (a chunk of 1,000 documents of 15 KB at once held 300 MB more).
ENCODE_BATCH_CHARACTERS = 1_000_000


def encode_documents(texts: Sequence[str], tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """One chunk of a corpus as `build_token_stream` lays it out: (int32 tokens of the documents in order, each
    followed by `<eod>`; int64 lengths of their sentences). Concatenating the chunks of a corpus gives its stream.

    Same pieces as `tokenize_documents` (`_encode_sentences`; empty sentences and documents dropped), with fewer
    Python objects on the way: the sentences are encoded `ENCODE_BATCH_CHARACTERS` of text at a time, each batch's
    encodings turned into arrays before the next, so that a chunk of long documents costs little more memory than its
    text.
    """
    sentences_per_doc = [split_sentences(text or "") for text in texts]
    sentences = [s for doc in sentences_per_doc for s in doc]
    token_parts, length_parts, start, size = [], [], 0, 0
    for end, sentence in enumerate(sentences, start=1):
        size += len(sentence)
        if size >= ENCODE_BATCH_CHARACTERS or end == len(sentences):
            encoded = _encode_without_special_tokens(tokenizer, sentences[start:end])
            lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
            length_parts.append(lengths)
            token_parts.append(
                np.fromiter(itertools.chain.from_iterable(encoded), dtype=np.int32, count=int(lengths.sum()))
            )
            del encoded
            start, size = end, 0
    sent_lens = np.concatenate(length_parts) if length_parts else np.zeros(0, np.int64)
    tokens = np.concatenate(token_parts) if token_parts else np.zeros(0, np.int32)
    sentences_per_doc = [len(doc) for doc in sentences_per_doc]
    doc_of_sentence = np.repeat(np.arange(len(texts)), sentences_per_doc)
    keep = sent_lens > 0
    sent_lens, doc_of_sentence = sent_lens[keep], doc_of_sentence[keep]
    doc_lens = np.bincount(doc_of_sentence, weights=sent_lens, minlength=len(texts)).astype(np.int64)
    sents_per_doc = np.bincount(doc_of_sentence, minlength=len(texts))
    return _insert_eod(tokens, doc_lens, sent_lens, sents_per_doc, special_token_ids(tokenizer)["<eod>"])


def _encode_without_special_tokens(tokenizer, texts: list[str]) -> list[list[int]]:
    """tokenizer(texts, add_special_tokens=False)["input_ids"], through the tokenizers library directly when the
    tokenizer has a backend with no truncation or padding set (a third less time: no offsets, no BatchEncoding)."""
    if not texts:
        return []
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or backend.truncation or backend.padding:
        return tokenizer(texts, add_special_tokens=False)["input_ids"]
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
    return [e.ids for e in encode(texts, add_special_tokens=False)]


# ---------------------------------------------------------------------------------------------
# Samples: [reuse] + A <sep> B <sep> <cls>
# ---------------------------------------------------------------------------------------------


def _trim_to(a_len: int, b_len: int, tot_len: int) -> tuple[int, int]:
    """XLNet's trimming loop in closed form: cut one token off the longer (B on ties) until fit."""
    excess = a_len + b_len - tot_len
    if excess <= 0:
        return a_len, b_len
    if a_len > b_len:
        d = min(excess, a_len - b_len)
        a_len -= d
    else:
        d = min(excess, b_len - a_len)
        b_len -= d
    excess -= d
    return a_len - excess // 2, b_len - (excess + 1) // 2


class ArrayReader:
    """Slices [lo, hi) of a 1-D array. A memory-mapped file (as `TokenStore.split` gives) is read with plain file
    reads on one open file, so what a long run reads stays in the page cache, shared and reclaimable, and never piles
    up in the resident memory of the process; any other array is sliced in place."""

    def __init__(self, array: np.ndarray):
        self.array = array
        on_disk = isinstance(array, np.memmap) and isinstance(array.base, mmap.mmap)  # a slice's offset would be wrong
        self._path = array.filename if on_disk else None
        self._file = None

    @property
    def on_disk(self) -> bool:
        return self._path is not None

    def __call__(self, lo: int, hi: int) -> np.ndarray:
        if self._path is None:
            return self.array[lo:hi]
        if self._file is None:
            self._file = open(self._path, "rb", buffering=0)
        size = self.array.itemsize
        data = os.pread(self._file.fileno(), (hi - lo) * size, self.array.offset + lo * size)
        return np.frombuffer(data, dtype=self.array.dtype)


class SortedPositions:
    """A sorted array of corpus positions (the sentence starts), searched in place: one on disk through an
    in-memory index of every `block`-th value and one file read of `block` values per search."""

    def __init__(self, values: np.ndarray, block: int = 512):
        self._read, self._n, self._block = ArrayReader(values), len(values), block
        self._index = None
        if self._read.on_disk:
            step = block * 4096
            parts = [self._read(lo, min(lo + step, self._n))[::block] for lo in range(0, self._n, step)]
            self._index = np.concatenate(parts) if parts else np.zeros(0, dtype=values.dtype)

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> int:
        return int(self._read(i, i + 1)[0])

    def searchsorted(self, x: int, side: str = "left") -> int:
        """As np.searchsorted(values, x, side)."""
        if self._index is None:
            return int(np.searchsorted(self._read.array, x, side))
        b = int(np.searchsorted(self._index, x, side))  # the answer lies in ((b - 1) * block, b * block]
        if b == 0:
            return 0
        lo = (b - 1) * self._block
        return lo + int(np.searchsorted(self._read(lo, min(lo + self._block, self._n)), x, side))


class RowBounds:
    """The sentence starts inside one row of the corpus, in row coordinates (0 < b < row_len), ascending.

    Read from the corpus-wide starts in place (`SortedPositions`: a store on disk stays there); a reversed row
    (bi_data) sees `row_len - b` in ascending order. Supports len(), [k] and `searchsorted`.
    """

    def __init__(self, starts, row_start: int, row_len: int, *, reversed_: bool = False):
        self._starts = starts if isinstance(starts, SortedPositions) else SortedPositions(np.asarray(starts))
        self._i = self._starts.searchsorted(row_start + 1)
        self._len = self._starts.searchsorted(row_start + row_len) - self._i
        self._row_start, self._row_len, self._reversed = row_start, row_len, reversed_

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, k: int) -> int:
        if self._reversed:
            return self._row_start + self._row_len - self._starts[self._i + self._len - 1 - k]
        return self._starts[self._i + k] - self._row_start

    def _local(self, x: int, side: str) -> int:
        """np.searchsorted on this row's slice of the corpus-wide starts."""
        return min(max(self._starts.searchsorted(x, side) - self._i, 0), self._len)

    def searchsorted(self, x: int, side: str = "left") -> int:
        """As np.searchsorted on the row's bounds."""
        if not self._reversed:
            return self._local(x + self._row_start, side)
        # reversed bound k is y_k = row_start + row_len - s[m-1-k]: y_k <= x  <=>  s >= row_start + row_len - x
        mirror = self._row_start + self._row_len - x
        return self._len - self._local(mirror, "left" if side == "right" else "right")


def split_a_and_b(bounds, data_len: int, begin: int, tot_len: int, rng: np.random.Generator):
    """Choose A and B after `begin` (XLNet's `_split_a_and_b`, on sentence boundaries).

    Args:
        bounds: `RowBounds`, or a sorted array of the positions in (0, data_len) where a sentence
            starts in this row.
        data_len: length of the row.
        begin: where A starts.
        tot_len: len(A) + len(B) (seq_len - reuse_len - 3).
        rng: numpy Generator.

    Returns:
        (a_begin, a_end, b_begin, b_end, is_next): B continues A when is_next is True.
    """
    if not isinstance(bounds, RowBounds):
        bounds = RowBounds(np.asarray(bounds), 0, data_len)
    lo = bounds.searchsorted(begin, side="right")
    hi = bounds.searchsorted(begin + tot_len, side="left")
    n_cuts = hi - lo  # sentence starts strictly inside (begin, begin + tot_len)
    end_idx = bounds[hi] if hi < len(bounds) else data_len
    a_begin = begin
    if n_cuts == 0 or rng.random() < 0.5:
        is_next = False
        a_end = end_idx if n_cuts == 0 else bounds[lo + int(rng.integers(n_cuts))]
        b_len = max(1, tot_len - (a_end - a_begin))
        b_begin = int(rng.integers(0, max(1, data_len - b_len)))
        b_end = b_begin + b_len
        # widen B to whole sentences
        k = bounds.searchsorted(b_begin, side="right")
        b_begin = bounds[k - 1] if k > 0 else 0
        k = bounds.searchsorted(b_end, side="left")
        b_end = min(bounds[k] if k < len(bounds) else data_len, data_len)
    else:
        is_next = True
        a_end = bounds[lo + int(rng.integers(n_cuts))]
        b_begin, b_end = a_end, end_idx
    a_len, b_len = _trim_to(a_end - a_begin, b_end - b_begin, tot_len)
    return a_begin, a_begin + a_len, b_begin, b_begin + b_len, is_next


class PretrainingStream:
    """Contiguous rows of the corpus, cut step by step into XLNet pretraining samples.

    The corpus is one token stream, split into `batch_size * world_size` rows of equal length
    (with `bi_data`, half as many forward rows, each also read reversed). Rank r takes rows
    [r * batch_size, (r + 1) * batch_size): with bi_data the first half of its batch is its
    forward rows and the second half the same rows reversed, as in XLNet's data_utils.

    At step t (within an epoch) row r yields the window starting at t * reuse_len:
    `[reuse_len tokens] + A <sep> B <sep> <cls>` (see `split_a_and_b`), so step t + 1 continues
    step t and the memory of the first reuse_len positions carries real context. With
    reuse_len 0 the window advances by seq_len - 3 tokens.

    Iterating gives, per step, a list of `batch_size` examples: dicts with `input_ids` and
    `token_type_ids` (int64 numpy arrays of length seq_len) and `is_reversed` (bool), ready for
    `DataCollatorForXLNetPretraining`.

    Args:
        token_source: `TokenArrays`, such as `xlnet_lite.TokenStore(path).split("train")` (read in
            place: for a corpus larger than memory), the output of `tokenize_documents`, a list of
            token-id lists, or anything `tokenize_documents` accepts (texts are then tokenized with
            `tokenizer`, and the stream is held in memory).
        tokenizer: gives the ids of `<sep>`, `<cls>`, `<eod>` (by token string).
        batch_size: examples per step for THIS process.
        seq_len: tokens per example.
        reuse_len: tokens at the start of each example that the next step's memory reuses.
        bi_data: half of each batch reads the rows reversed (batch_size must be even).
        seed: seed of the choice of B (combined with rank).
        rank, world_size: this process and the number of processes.
        loop: start a new epoch at the end of the corpus (else stop iterating).
        text_column: text column when token_source holds raw text.
    """

    def __init__(
        self,
        token_source,
        tokenizer,
        *,
        batch_size: int,
        seq_len: int,
        reuse_len: int,
        bi_data: bool = False,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        loop: bool = True,
        text_column: str = "text",
    ):
        _check_int("batch_size", batch_size, 1)
        _check_int("seq_len", seq_len, 5)
        _check_int("reuse_len", reuse_len, 0)
        _check_int("world_size", world_size, 1)
        _check_int("rank", rank, 0)
        if reuse_len > seq_len - 5:
            raise ValueError(
                f"reuse_len={reuse_len} leaves no room for A <sep> B <sep> <cls>: it must be at most "
                f"seq_len - 5 = {seq_len - 5}"
            )
        if rank >= world_size:
            raise ValueError(f"rank={rank} must be smaller than world_size={world_size}")
        if bi_data and batch_size % 2:
            raise ValueError(f"bi_data needs an even batch_size (half forward, half reversed), got {batch_size}")
        self.batch_size, self.seq_len, self.reuse_len = batch_size, seq_len, reuse_len
        self.bi_data, self.seed, self.rank, self.world_size, self.loop = bi_data, seed, rank, world_size, loop
        self.advance = reuse_len if reuse_len > 0 else seq_len - 3

        ids = special_token_ids(tokenizer)
        if ids["<sep>"] is None or ids["<cls>"] is None:
            raise ValueError("tokenizer must have <sep> and <cls> tokens")
        self.sep_id, self.cls_id = ids["<sep>"], ids["<cls>"]

        tokens, starts = build_token_stream(token_source, tokenizer, text_column=text_column)
        self.num_tokens = int(len(tokens))
        self._layout_rows(tokens, starts)
        self._rng = np.random.default_rng([seed, rank])
        self.epoch, self.step = 0, 0

    def _layout_rows(self, tokens: np.ndarray, starts: np.ndarray) -> None:
        fwd_per_rank = self.batch_size // 2 if self.bi_data else self.batch_size
        n_rows = fwd_per_rank * self.world_size
        row_len = len(tokens) // n_rows
        if row_len < self.seq_len:
            raise ValueError(
                f"the corpus is too short: {n_rows} rows (batch_size={self.batch_size} x "
                f"world_size={self.world_size}{', halved by bi_data' if self.bi_data else ''}) of "
                f"seq_len={self.seq_len} tokens need at least {n_rows * self.seq_len} tokens, "
                f"and there are {len(tokens)}"
            )
        self.row_len = row_len
        # read in place, window by window: a corpus on disk stays there
        self._read = ArrayReader(tokens)
        positions = SortedPositions(starts)
        self._row_starts = [r * row_len for r in range(self.rank * fwd_per_rank, (self.rank + 1) * fwd_per_rank)]
        self._bounds = [RowBounds(positions, lo, row_len) for lo in self._row_starts]
        if self.bi_data:
            self._bounds += [RowBounds(positions, lo, row_len, reversed_=True) for lo in self._row_starts]
        self._reversed = np.arange(self.batch_size) >= fwd_per_rank if self.bi_data else np.zeros(self.batch_size, bool)

    @property
    def steps_per_epoch(self) -> int:
        """Batches in one pass over the rows."""
        return (self.row_len - self.seq_len) // self.advance + 1

    def token_counts(self, minlength: int = 0, *, chunk: int = 1 << 20) -> np.ndarray:
        """How often each token id occurs in this process's rows (for unigram baselines), read `chunk` tokens at a
        time."""
        counts = np.zeros(minlength, dtype=np.int64)
        for row_start in self._row_starts:
            for lo in range(row_start, row_start + self.row_len, chunk):
                part = np.bincount(self._read(lo, min(lo + chunk, row_start + self.row_len)))
                if len(part) > len(counts):
                    counts = np.concatenate([counts, np.zeros(len(part) - len(counts), dtype=np.int64)])
                counts[: len(part)] += part
        return counts * 2 if self.bi_data else counts  # a reversed row holds the tokens of its forward row

    def _window(self, row: int, lo: int, hi: int) -> np.ndarray:
        """Tokens [lo, hi) of row `row` (a reversed row, bi_data, reads its forward row backwards)."""
        fwd = len(self._row_starts)
        if row < fwd:
            return self._read(self._row_starts[row] + lo, self._row_starts[row] + hi)
        end = self._row_starts[row - fwd] + self.row_len
        return self._read(end - hi, end - lo)[::-1]

    def _example(self, row: int, start: int) -> dict:
        begin = start + self.reuse_len
        tot_len = self.seq_len - self.reuse_len - 3
        a0, a1, b0, b1, _ = split_a_and_b(self._bounds[row], self.row_len, begin, tot_len, self._rng)
        input_ids = np.empty(self.seq_len, dtype=np.int64)
        input_ids[: begin - start] = self._window(row, start, begin)
        k = begin - start
        input_ids[k : k + a1 - a0] = self._window(row, a0, a1)
        k += a1 - a0
        input_ids[k] = self.sep_id
        input_ids[k + 1 : k + 1 + b1 - b0] = self._window(row, b0, b1)
        input_ids[-2], input_ids[-1] = self.sep_id, self.cls_id
        token_type_ids = np.zeros(self.seq_len, dtype=np.int64)
        token_type_ids[k + 1 : -1] = 1
        token_type_ids[-1] = 2
        return {"input_ids": input_ids, "token_type_ids": token_type_ids, "is_reversed": bool(self._reversed[row])}

    def next_batch(self) -> list[dict]:
        """The next `batch_size` examples (raises StopIteration at the end when loop=False)."""
        start = self.step * self.advance
        if start + self.seq_len > self.row_len:
            if not self.loop:
                raise StopIteration
            self.epoch, self.step, start = self.epoch + 1, 0, 0
        batch = [self._example(row, start) for row in range(self.batch_size)]
        self.step += 1
        return batch

    def __iter__(self) -> Iterator[list[dict]]:
        return self

    def __next__(self) -> list[dict]:
        return self.next_batch()

    def state_dict(self) -> dict:
        """Position, epoch and RNG state (JSON-serialisable) to resume exactly where this stream is."""
        return {
            "epoch": self.epoch,
            "step": self.step,
            "rng": self._rng.bit_generator.state,
            "layout": self._layout_signature(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Resume from `state_dict()`; the stream must have been built on the same corpus and layout."""
        if state["layout"] != self._layout_signature():
            raise ValueError(
                f"state_dict was saved for a different stream layout: {state['layout']} != {self._layout_signature()}"
            )
        self.epoch, self.step = int(state["epoch"]), int(state["step"])
        self._rng.bit_generator.state = state["rng"]

    @staticmethod
    def resplit_state_dicts(states: list[dict], *, rank: int, world_size: int) -> tuple[dict, list[tuple[int, int]]]:
        """The state of process `rank` of `world_size` continuing the streams saved by another number of processes
        (`states`: their `state_dict()`s, by rank) at the same global batch: the global rows are the same (their
        number, hence their length and starts, is the global batch), process r now takes forward rows
        [r * b, (r + 1) * b) at the saved position (epoch, step), so every row goes on where it stopped and none is
        read twice or skipped. Returns that state and, for each of the new process's batch rows, the (saved process,
        batch row) it continues (to re-split per-row state such as the Transformer-XL memory).

        What cannot carry over: the random state choosing each sample's B segment was one per process, drawn row
        after row; the new one is derived deterministically from all the saved ones, `rank` and `world_size`."""
        import hashlib
        import json

        layout = states[0]["layout"]
        saved = len(states)
        if [(s["layout"]["rank"], s["layout"]["world_size"]) for s in states] != [(q, saved) for q in range(saved)]:
            raise ValueError(f"expected the states of processes 0..{saved - 1} of {saved}, in order")
        if len({(s["epoch"], s["step"]) for s in states}) != 1:
            raise ValueError("the saved processes are at different positions (epoch, step): not one run's streams")
        halves = 2 if layout["bi_data"] else 1
        fwd = layout["batch_size"] // halves
        rows = fwd * saved
        if rows % world_size or not 0 <= rank < world_size:
            raise ValueError(f"{rows} forward rows do not split evenly over {world_size} processes (rank {rank})")
        new_fwd = rows // world_size
        sources = []
        for j in range(new_fwd * halves):
            half, k = divmod(j, new_fwd)  # half 1: the rows read reversed (bi_data), after the forward ones
            q, i = divmod(rank * new_fwd + k, fwd)
            sources.append((q, half * fwd + i))
        digest = hashlib.sha256(json.dumps([s["rng"] for s in states], sort_keys=True).encode()).digest()
        rng = np.random.default_rng([int.from_bytes(digest[:16], "little"), rank, world_size])
        state = {
            "epoch": states[0]["epoch"],
            "step": states[0]["step"],
            "rng": rng.bit_generator.state,
            "layout": {**layout, "batch_size": new_fwd * halves, "rank": rank, "world_size": world_size},
        }
        return state, sources

    def _layout_signature(self) -> dict:
        return {
            "num_tokens": self.num_tokens,
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "reuse_len": self.reuse_len,
            "bi_data": self.bi_data,
            "rank": self.rank,
            "world_size": self.world_size,
        }


def _check_int(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def build_eval_batches(
    token_source,
    tokenizer,
    *,
    batch_size: int,
    seq_len: int,
    reuse_len: int,
    bi_data: bool = False,
    seed: int = 0,
    rank: int = 0,
    world_size: int = 1,
    max_batches: int | None = None,
    text_column: str = "text",
) -> list[list[dict]]:
    """All batches of one deterministic pass (loop=False) over a validation corpus.

    Same layout as `PretrainingStream`; the batches are consecutive, so the memory can be carried
    from one to the next while evaluating. `max_batches` keeps only the first batches.
    """
    stream = PretrainingStream(
        token_source,
        tokenizer,
        batch_size=batch_size,
        seq_len=seq_len,
        reuse_len=reuse_len,
        bi_data=bi_data,
        seed=seed,
        rank=rank,
        world_size=world_size,
        loop=False,
        text_column=text_column,
    )
    n = stream.steps_per_epoch if max_batches is None else min(max_batches, stream.steps_per_epoch)
    return [stream.next_batch() for _ in range(n)]
