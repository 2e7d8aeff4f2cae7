"""A tokenize-once token store: a corpus's pretraining stream on disk, memory-mapped by every process and every run.

A store is a folder:

    store.json                  format, token dtype, the vocabulary's size, per split: tokens, sentences, documents,
                                the largest token id; what it was built from; the size and per-chunk xxh3 hashes of
                                every other file (`integrity`)
    <split>.tokens              the split's token stream (`data.build_token_stream`'s layout: documents in order, each
                                followed by <eod>), uint16 where the vocabulary fits, else int32; raw little-endian
    <split>.sentence_ends       int64 end of every sentence of the stream (the last one is the stream's length), so
                                the sentence starts are the first num_sentences - 1 entries
    tokenizer/                  the tokenizer that made the tokens

It is written under a temporary name beside its final path and renamed into place once store.json, written last, is
complete: a folder at the final path is a whole store, and a kill leaves only a temporary folder that no reader
trusts (the next builder removes it). `cached_folder` keys stores (and trained tokenizers) by a fingerprint of what
made them, under a cache folder with one lock file per key: the second of two processes that want the same store
waits for the first to finish it, then opens it (accelerate's `main_process_first` orders the ranks of one run the
same way; the lock also covers separate runs).

The store proves its bytes: `TokenStore.verify` hashes every file chunk by chunk (64 MiB chunks by default, xxh3-128 as
checkpoint manifests use) against store.json and names the first damaged file and chunk (`StoreDamage`, one line); a
token id at or above the vocabulary is damage too. A run checks the whole store before its first step, at any size:
hashing costs a small part of what the run reads before that step anyway (every training token, once, for the
unigram baseline), so checking each chunk only when the stream first reads it would save little
(benchmarks/RESULTS.md "Data scale"). A damaged entry of the cache is removed and built again (`cached_folder`'s
`verify`). Format 2 added the hashes: a store of format 1 is not opened, and the cache builds the store again under
its new key.

Tokenization runs in `num_proc` worker processes over chunks of documents, at most a few chunks in flight, so the
text is never held whole: nanoGPT writes a uint16 `train.bin` the same way, litdata and Megatron-LM index binary
shards; XLNet's own pipeline tokenizes once into TFRecords.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import fcntl
import hashlib
import itertools
import json
import multiprocessing
import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from . import integrity
from .atomic_io import replace_folder
from .data import TextFileDocuments, TokenArrays, encode_documents
from .errors import RecipeError
from .faults import crash_point
from .tokenization_xlnet_lite import load_tokenizer

FORMAT = 2  # bump when the stream layout or the files change: stores of another format are rebuilt (2: hashes)
STORE_FILE = "store.json"


class StoreDamage(RecipeError):
    """A store's bytes are not those it was built with (a file changed, a token id outside the vocabulary): the
    message names the file and the chunk. A RecipeError, so that a recipe ends on it with one line."""


def default_cache_dir() -> Path:
    """$XLNET_LITE_CACHE, else xlnet_lite/ under the Hugging Face cache ($HF_HOME, default ~/.cache/huggingface)."""
    if os.environ.get("XLNET_LITE_CACHE"):
        return Path(os.environ["XLNET_LITE_CACHE"]).expanduser()
    return Path(os.environ.get("HF_HOME", "~/.cache/huggingface")).expanduser() / "xlnet_lite"


def fingerprint(fields: Mapping) -> str:
    """A short stable hash of JSON-serialisable fields."""
    text = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.blake2b(text.encode(), digest_size=10).hexdigest()


def documents_fingerprint(documents, text_column: str = "text"):
    """What identifies a corpus without tokenizing it: a list of texts by their content, `TextFileDocuments` by file
    and range, a `datasets.Dataset` by its own fingerprint. None for a stream (`IterableDataset`): its caller names
    it."""
    if isinstance(documents, TextFileDocuments):
        return documents.fingerprint()
    if isinstance(documents, list):
        digest = hashlib.blake2b(digest_size=16)
        for text in documents:
            digest.update(text.encode())
            digest.update(b"\0")
        return {"texts": digest.hexdigest(), "count": len(documents)}
    dataset_fingerprint = getattr(documents, "_fingerprint", None)
    if dataset_fingerprint and hasattr(documents, "num_rows"):
        return {"dataset": dataset_fingerprint, "text_column": text_column}
    return None


def tokenizer_fingerprint(tokenizer) -> str:
    """A hash of the tokenizer's full definition (pieces, scores, normalizer, special tokens)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else json.dumps(tokenizer.get_vocab(), sort_keys=True)
    return hashlib.blake2b(f"{type(tokenizer).__name__}\n{text}".encode(), digest_size=16).hexdigest()


# ---------------------------------------------------------------------------------------------------------
# Reading a store


class TokenStore:
    """An opened, complete store; `split(name)` memory-maps a split's stream read-only.

    Raises ValueError naming the folder when it is not a complete store of this format (a folder a kill left, files
    of the wrong size, another format).
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        meta_path = self.path / STORE_FILE
        if not meta_path.is_file():
            raise ValueError(f"{self.path}: not a token store (no {STORE_FILE}; a store being written has none yet)")
        self.meta = json.loads(meta_path.read_text())
        if self.meta.get("format") != FORMAT:
            raise ValueError(
                f"{self.path}: a token store of format {self.meta.get('format')}, this xlnet_lite reads "
                f"format {FORMAT}; build it again"
            )
        self.dtype = np.dtype(self.meta["dtype"])
        sizes = {name: entry["size"] for name, entry in self.meta["files"].items()}
        for name, split in self.meta["splits"].items():
            sizes[f"{name}.tokens"] = split["tokens"] * self.dtype.itemsize
            sizes[f"{name}.sentence_ends"] = split["sentences"] * 8
        for file, expected in sizes.items():
            size = (self.path / file).stat().st_size if (self.path / file).is_file() else None
            if size != expected:
                raise ValueError(
                    f"{self.path}: {file} holds {size} bytes, {STORE_FILE} says {expected}; "
                    "the store is damaged, build it again"
                )

    @property
    def splits(self) -> list[str]:
        return list(self.meta["splits"])

    def num_tokens(self, name: str) -> int:
        return self.meta["splits"][name]["tokens"]

    def split(self, name: str) -> TokenArrays:
        """The split as `TokenArrays` of read-only memory maps, for `PretrainingStream` and `build_eval_batches`."""
        if name not in self.meta["splits"]:
            raise ValueError(f"{self.path}: the token store has no split {name!r} (has {self.splits})")
        info = self.meta["splits"][name]
        tokens = _memmap(self.path / f"{name}.tokens", self.dtype, info["tokens"])
        # the last end is the corpus's end: the starts are the ends before it, mapped as they are (not sliced)
        starts = _memmap(self.path / f"{name}.sentence_ends", np.int64, max(0, info["sentences"] - 1))
        return TokenArrays(tokens, starts)

    def tokenizer(self):
        """The tokenizer that made the tokens (its files verified first: they are small)."""
        self.verify(files=[name for name in self.meta["files"] if name.startswith("tokenizer/")])
        return load_tokenizer(self.path / "tokenizer")

    def verify(self, files: Iterable[str] | None = None) -> int:
        """Check every chunk of every file (or of `files`) against its hash in store.json, and every split's
        largest token id against the vocabulary; returns the bytes read. Raises StoreDamage naming the first damaged
        file and chunk."""
        chunk_bytes, algorithm = self.meta["chunk_bytes"], self.meta["algorithm"]
        checked = 0
        for name in self.meta["files"] if files is None else files:
            expected = self.meta["files"][name]["chunks"]
            changed = integrity.first_changed_chunk(self.path / name, expected, chunk_bytes, algorithm)
            if changed is not None:
                lo = changed * chunk_bytes
                hi = min(lo + chunk_bytes, self.meta["files"][name]["size"])
                raise StoreDamage(
                    f"{self.path / name}: chunk {changed} of {len(expected)} (bytes {lo:,} to {hi:,}) does not match "
                    f"its {algorithm} hash in {STORE_FILE}: the token store is damaged"
                )
            checked += self.meta["files"][name]["size"]
        if files is None:
            self.check_vocab(self.meta["vocab_size"])
        return checked

    def check_vocab(self, vocab_size: int):
        """Raises StoreDamage when a split holds a token id >= `vocab_size` (a tokenizer's length)."""
        for name, split in self.meta["splits"].items():
            if split["max_id"] >= vocab_size:
                raise StoreDamage(
                    f"{self.path / f'{name}.tokens'}: token ids up to {split['max_id']}, outside the vocabulary of "
                    f"{vocab_size} pieces: the token store is damaged or of another tokenizer"
                )


def _memmap(path: Path, dtype, count: int) -> np.ndarray:
    if count == 0:  # mmap cannot map an empty file
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(count,))


# ---------------------------------------------------------------------------------------------------------
# Writing a store


def write_token_store(
    path: str | os.PathLike,
    splits: Mapping[str, Iterable],
    tokenizer,
    *,
    text_column: str = "text",
    num_proc: int = 1,
    chunk_documents: int = 1000,
    source=None,
    log: Callable | None = print,
    chunk_bytes: int = integrity.CHUNK_BYTES,
) -> TokenStore:
    """Tokenize each split once into a new store at `path`, which must not exist yet.

    Args:
        splits: split name -> documents: a list of texts, `TextFileDocuments`, a `datasets.Dataset` or
            `IterableDataset` (column `text_column`), or any iterable of texts; each is read once, in chunks.
        tokenizer: saved into the store with it.
        num_proc: worker processes for tokenizing (1: in this process, where the tokenizers library still encodes a
            chunk on every core).
        chunk_documents: documents per chunk; at most 2 * num_proc chunks are in flight.
        source: what the store was built from (recorded in store.json).
        log: prints a line per split and a progress bar (None: silent).
        chunk_bytes: the size of the pieces each file is hashed in (`TokenStore.verify` names the damaged one).

    The files go to a temporary folder beside `path`, renamed to `path` when store.json is written: a kill leaves no
    folder at `path`.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    dtype = np.dtype(np.uint16 if len(tokenizer) <= np.iinfo(np.uint16).max + 1 else np.int32)
    tokenizer.save_pretrained(tmp / "tokenizer")
    meta = {"format": FORMAT, "dtype": dtype.name, "vocab_size": len(tokenizer), "splits": {}}
    meta.update(source=source, num_proc=num_proc)
    start = time.perf_counter()
    with _Encoder(tokenizer, num_proc) as encoder:
        for name, documents in splits.items():
            meta["splits"][name] = _write_split(
                tmp,
                name,
                documents,
                encoder,
                dtype=dtype,
                text_column=text_column,
                chunk_documents=chunk_documents,
                log=log,
            )
    meta["build_seconds"] = round(time.perf_counter() - start, 3)
    start = time.perf_counter()
    meta.update(algorithm=integrity.ALGORITHM, chunk_bytes=chunk_bytes)
    meta["files"] = hash_files(tmp, chunk_bytes)  # as just written, from the page cache
    meta["hash_seconds"] = round(time.perf_counter() - start, 3)
    (tmp / STORE_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    replace_folder(tmp, path)  # fsyncs every file, then one rename
    return TokenStore(path)


def hash_files(folder: Path, chunk_bytes: int = integrity.CHUNK_BYTES) -> dict:
    """store.json's "files": the size and per-chunk hashes of every file under `folder` but store.json."""
    folder = Path(folder)
    files = [file for file in sorted(folder.rglob("*")) if file.is_file() and file != folder / STORE_FILE]
    return {
        str(file.relative_to(folder)): {
            "size": file.stat().st_size,
            "chunks": integrity.chunk_digests(file, chunk_bytes),
        }
        for file in files
    }


def _write_split(folder: Path, name: str, documents, encoder: _Encoder, *, dtype, text_column, chunk_documents, log):
    counts = {"tokens": 0, "sentences": 0, "documents": 0, "max_id": -1}
    progress = tqdm(desc=f"tokenizing {name}", unit=" documents", disable=not log, leave=False)
    with (
        progress,
        open(folder / f"{name}.tokens", "wb") as tokens_file,
        open(folder / f"{name}.sentence_ends", "wb") as ends_file,
    ):
        for tokens, sentence_lengths, n_docs in encoder.map(_text_chunks(documents, text_column, chunk_documents)):
            tokens.astype(dtype, copy=False).tofile(tokens_file)
            (counts["tokens"] + np.cumsum(sentence_lengths)).tofile(ends_file)
            counts["tokens"] += len(tokens)
            counts["sentences"] += len(sentence_lengths)
            counts["documents"] += n_docs
            counts["max_id"] = max(counts["max_id"], int(tokens.max(initial=-1)))
            progress.update(n_docs)
            crash_point("token_store_chunk")
    if log:
        log(f"token store: {name}: {counts['documents']:,} documents, {counts['tokens']:,} tokens")
    return counts


def _text_chunks(documents, text_column: str, size: int) -> Iterator[list[str]]:
    """Lists of `size` texts, read lazily from a list, file, dataset or stream."""
    if hasattr(documents, "iter") and hasattr(documents, "column_names"):  # datasets: read the column only
        names = documents.column_names
        if names is not None and text_column not in names:
            raise ValueError(f"text_column={text_column!r} is not a column of the dataset (columns: {names})")
        yield from (batch[text_column] for batch in documents.select_columns([text_column]).iter(batch_size=size))
        return
    iterator = iter(documents)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


_WORKER_TOKENIZER = None


def _init_worker(tokenizer):
    global _WORKER_TOKENIZER
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core per worker: the workers share the cores
    _WORKER_TOKENIZER = tokenizer


def _encode_chunk(texts: list[str]):
    tokens, sentence_lengths = encode_documents([t or "" for t in texts], _WORKER_TOKENIZER)
    return tokens, sentence_lengths, len(texts)


class _Encoder:
    """Encodes chunks in order: in this process, or in `num_proc` spawned workers with a bounded window of chunks in
    flight (the pool starts only once a second chunk shows there is work to share)."""

    def __init__(self, tokenizer, num_proc: int):
        self.tokenizer, self.num_proc, self.pool = tokenizer, max(1, int(num_proc)), None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)

    def map(self, chunks: Iterator[list[str]]):
        global _WORKER_TOKENIZER
        chunks = iter(chunks)
        first = next(chunks, None)
        if first is None:
            return
        second = next(chunks, None)
        if second is None or self.num_proc == 1:
            _WORKER_TOKENIZER = self.tokenizer
            for chunk in itertools.chain([first], [] if second is None else [second], chunks):
                yield _encode_chunk(chunk)
            return
        if self.pool is None:
            self.pool = concurrent.futures.ProcessPoolExecutor(
                self.num_proc,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_worker,
                initargs=(self.tokenizer,),
            )
        in_flight = collections.deque()
        for chunk in itertools.chain([first, second], chunks):
            in_flight.append(self.pool.submit(_encode_chunk, chunk))
            if len(in_flight) >= 2 * self.num_proc:
                yield in_flight.popleft().result()
        while in_flight:
            yield in_flight.popleft().result()


# ---------------------------------------------------------------------------------------------------------
# The cache: one folder per key, built once under a lock


def cached_folder(
    cache_dir: str | os.PathLike,
    name: str,
    build: Callable[[Path], None],
    *,
    is_complete: Callable[[Path], bool],
    verify: Callable[[Path], None] | None = None,
    log: Callable = print,
) -> Path:
    """cache_dir/name, built by `build(path)` unless a complete one is there; one builder at a time.

    `build` must leave either a complete folder at `path` (renamed into place) or none. A process that finds the lock
    taken says so in one line and waits; it then finds the folder complete and builds nothing. Temporary folders a
    killed builder left (`.name.tmp-*`) are removed by the next builder, which holds the lock.

    `verify(path)` (optional) raises ValueError when a complete folder's content is damaged: the folder is then
    named in one warning line, removed (never trusted again) and built again. Every process that opens the folder
    verifies it, so a damaged entry is found before anything reads it.
    """
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / name
    warned = None
    if is_complete(path):
        warned = _damage(verify, path)
        if warned is None:
            return path
        log(f"warning: {warned}; removing {path} from the cache and building it again")
    with _locked(cache_dir / f".{name}.lock", waiting=f"waiting for another process to finish {path}", log=log):
        damage = None
        if is_complete(path):
            damage = _damage(verify, path)  # another process may have built it again meanwhile
            if damage is None:
                return path
            if damage != warned:
                log(f"warning: {damage}; removing {path} from the cache and building it again")
        for stale in cache_dir.glob(f".{name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        if path.exists():  # incomplete (not written by this module, or its store.json changed) or damaged
            if damage is None:
                log(f"warning: {path} is not complete; removing it from the cache and building it again")
            shutil.rmtree(path)
        build(path)
    return path


def _damage(verify: Callable[[Path], None] | None, path: Path) -> str | None:
    """What `verify` says is wrong with the folder, or None."""
    if verify is None:
        return None
    try:
        verify(path)
    except ValueError as error:
        return str(error)
    return None


@contextlib.contextmanager
def _locked(lock_path: Path, *, waiting: str, log: Callable):
    with open(lock_path, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(waiting)
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def is_token_store(path: Path) -> bool:
    try:
        TokenStore(path)
    except (ValueError, OSError, KeyError, TypeError):  # TypeError, KeyError: a store.json that lacks a field
        return False
    return True
