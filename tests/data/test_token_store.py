"""The token store: a corpus tokenized once to memory-mapped files gives exactly the in-memory stream, is keyed by
what made it, survives a kill while it is written, and is built once when two processes want it."""

import json
import os
import sys
import textwrap
import time

import datasets
import numpy as np
import prewarmed
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from xlnet_lite import integrity, token_store
from xlnet_lite.data import (
    PretrainingStream,
    RowBounds,
    SortedPositions,
    TextFileDocuments,
    _encode_without_special_tokens,
    build_eval_batches,
    build_token_stream,
    count_text_documents,
    split_sentences,
)
from xlnet_lite.tokenization_xlnet_lite import SPECIAL_TOKENS, train_tokenizer, wrap_tokenizer


def word_tokenizer(n_words=5000):
    """Word-level-like Unigram: "." is id 8, "!" id 9, "w<i>" id 10 + i."""
    vocab = [(t, 0.0) for t in SPECIAL_TOKENS] + [(".", -1.0), ("!", -1.0)]
    vocab += [(f"▁w{i}", -1.0) for i in range(n_words)]
    backend = Tokenizer(models.Unigram(vocab, unk_id=0))
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace()])
    return wrap_tokenizer(backend)


@pytest.fixture(scope="module")
def tokenizer():
    return word_tokenizer()


def random_documents(seed, n_docs=120, n_words=5000):
    """Documents of sentences ending in . ! or a line break, some empty."""
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(n_docs):
        sentences = [
            " ".join(f"w{x}" for x in rng.integers(0, n_words, rng.integers(1, 12))) + str(rng.choice([".", "!", ""]))
            for _ in range(rng.integers(0, 6))
        ]
        docs.append((" " if rng.random() < 0.6 else "\n").join(sentences))
    return docs


def write_documents(path, docs):
    path.write_text("\n\n".join(d for d in docs if d.strip()) + "\n", encoding="utf-8")
    return path


def same_batches(a: PretrainingStream, b: PretrainingStream, steps: int):
    for _ in range(steps):
        for x, y in zip(a.next_batch(), b.next_batch(), strict=True):
            assert (x["input_ids"] == y["input_ids"]).all() and (x["token_type_ids"] == y["token_type_ids"]).all()
            assert x["is_reversed"] == y["is_reversed"]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.slow
def test_the_store_reproduces_the_in_memory_stream(tokenizer, tmp_path, seed):
    """Tokens and sentence starts equal build_token_stream's for a list, a text file, a Dataset and a stream, in one
    process or in two workers over small chunks; the streams read from the store give the same batches, epochs
    included, for bi_data and for each of two ranks, and the same token counts."""
    docs = random_documents(seed)
    kept = [d for d in docs if d.strip()]
    tokens, starts = build_token_stream(kept, tokenizer)
    file_docs = TextFileDocuments(write_documents(tmp_path / "corpus.txt", docs))
    dataset = datasets.Dataset.from_dict({"body": kept, "other": list(range(len(kept)))})
    sources = {
        "list": (kept, 1),
        "file": (file_docs, 1),
        "dataset": (dataset, 1),
        "stream": (dataset.to_iterable_dataset(), 1),
        "file_two_workers": (file_docs, 2),
    }
    if seed:  # the worker pool costs a few seconds: once is enough
        sources.pop("file_two_workers")
    for name, (source, workers) in sources.items():
        store = token_store.write_token_store(
            tmp_path / name,
            {"train": source},
            tokenizer,
            text_column="body",
            num_proc=workers,
            chunk_documents=7,
            log=None,
        )
        split = store.split("train")
        assert isinstance(split.tokens, np.memmap) and split.tokens.dtype == np.uint16, name
        assert (np.asarray(split.tokens) == tokens).all() and (np.asarray(split.sentence_starts) == starts).all(), name
    store = token_store.TokenStore(tmp_path / "file")
    rng = np.random.default_rng(seed)
    for bi_data, world_size in ((False, 1), (True, 1), (False, 2)):
        seq_len = int(rng.choice([16, 24]))
        kwargs = dict(
            batch_size=2,
            seq_len=seq_len,
            reuse_len=int(rng.integers(1, seq_len - 5)),
            bi_data=bi_data,
            seed=seed,
            world_size=world_size,
        )
        for rank in range(world_size):
            in_memory = PretrainingStream(kept, tokenizer, rank=rank, **kwargs)
            on_disk = PretrainingStream(store.split("train"), tokenizer, rank=rank, **kwargs)
            assert (in_memory.token_counts(50) == on_disk.token_counts(50, chunk=13)).all()
            same_batches(in_memory, on_disk, 2 * in_memory.steps_per_epoch + 1)
    evals = build_eval_batches(store.split("train"), tokenizer, batch_size=2, seq_len=16, reuse_len=6)
    assert [b[0]["input_ids"].tolist() for b in evals] == [
        b[0]["input_ids"].tolist() for b in build_eval_batches(kept, tokenizer, batch_size=2, seq_len=16, reuse_len=6)
    ]


def test_sentences_are_encoded_as_the_tokenizer_call_encodes_them(tokenizer):
    """The direct batch encoding through the tokenizers library gives tokenizer(texts, add_special_tokens=False)'s
    ids, for a trained Unigram tokenizer (normalizer, Metaspace) and for one with truncation set (which takes the
    tokenizer call itself)."""
    texts = [s for d in random_documents(3, n_docs=60) for s in split_sentences(d)]
    texts += ["Café, naïve!  Tabs\tand   spaces.", "ünïcödé «quotes» — dash", "x" * 300]
    trained = train_tokenizer(texts + ["the café was naïve and the story was long"] * 3, vocab_size=300)
    truncating = word_tokenizer()
    truncating.backend_tokenizer.enable_truncation(max_length=4)
    for tok in (tokenizer, trained, truncating):
        assert _encode_without_special_tokens(tok, texts) == tok(texts, add_special_tokens=False)["input_ids"]
    assert _encode_without_special_tokens(tokenizer, []) == []


@pytest.mark.parametrize("seed", range(6))
def test_positions_on_disk_are_searched_as_numpy_does(tmp_path, seed):
    """SortedPositions over a memory-mapped file (a sparse index and one block read per search) answers as
    np.searchsorted, at block edges and beyond both ends; RowBounds over it, forward and reversed, as over the array."""
    rng = np.random.default_rng(seed)
    values = np.sort(rng.integers(0, 5000, int(rng.integers(1, 400)))).astype(np.int64)
    values.tofile(tmp_path / "starts")
    on_disk = np.memmap(tmp_path / "starts", dtype=np.int64, mode="r")
    positions = SortedPositions(on_disk, block=int(rng.choice([1, 2, 7, 64])))
    assert len(positions) == len(values) and [positions[i] for i in range(len(values))] == values.tolist()
    for x in [*rng.integers(-10, 5010, 300).tolist(), *values[::5].tolist(), -1, 5001]:
        for side in ("left", "right"):
            assert positions.searchsorted(x, side) == np.searchsorted(values, x, side), (x, side)
    for _ in range(20):
        row_start, row_len = int(rng.integers(0, 4000)), int(rng.integers(2, 1500))
        for reversed_ in (False, True):
            disk, memory = (RowBounds(p, row_start, row_len, reversed_=reversed_) for p in (positions, values))
            assert [disk[k] for k in range(len(disk))] == [memory[k] for k in range(len(memory))]
            for x in rng.integers(-5, row_len + 5, 30).tolist():
                for side in ("left", "right"):
                    assert disk.searchsorted(x, side) == memory.searchsorted(x, side)


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="reads Linux's /proc/self/smaps")
def test_reading_the_stream_leaves_no_store_pages_resident(tokenizer, tmp_path):
    """The stream reads its windows and sentence starts with file reads: after an epoch and a half the store's
    mappings hold no resident pages (a long run's RSS does not grow with what it has read)."""
    store = token_store.write_token_store(
        tmp_path / "store", {"train": random_documents(0, n_docs=400)}, tokenizer, log=None
    )
    stream = PretrainingStream(store.split("train"), tokenizer, batch_size=4, seq_len=32, reuse_len=16, bi_data=True)
    stream.token_counts(100)
    for _ in range(stream.steps_per_epoch * 3 // 2):
        stream.next_batch()
    resident, mapping = {}, None
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5:
                mapping = fields[5] if len(fields) > 5 else None
            elif fields[0] == "Rss:" and mapping and mapping.startswith(str(tmp_path / "store")):
                resident[mapping] = resident.get(mapping, 0) + int(fields[1])
    assert len(resident) == 2 and set(resident.values()) == {0}, resident  # tokens and sentence ends, mapped, untouched


def test_a_vocabulary_over_65536_pieces_is_stored_as_int32(tmp_path):
    big = word_tokenizer(70_000)
    docs = ["w69990 w3. w65600 w12", "w1 w65599!"]
    store = token_store.write_token_store(tmp_path / "s", {"train": docs}, big, log=None)
    assert store.split("train").tokens.dtype == np.int32
    assert np.asarray(store.split("train").tokens).tolist() == build_token_stream(docs, big)[0].tolist()
    assert max(store.split("train").tokens) == 10 + 69990


def test_an_incomplete_or_damaged_folder_is_not_a_store(tokenizer, tmp_path):
    store = token_store.write_token_store(tmp_path / "s", {"train": ["w1 w2. w3", "w4"]}, tokenizer, log=None)
    assert token_store.is_token_store(store.path)
    with open(store.path / "train.tokens", "ab") as f:
        f.write(b"\0\0")
    with pytest.raises(ValueError, match="train.tokens holds 16 bytes, store.json says 14"):
        token_store.TokenStore(store.path)
    (store.path / "store.json").unlink()
    assert not token_store.is_token_store(store.path)
    with pytest.raises(ValueError, match="not a token store"):
        token_store.TokenStore(tmp_path)


def test_the_key_changes_with_the_corpus_and_the_tokenizer(tokenizer, tmp_path):
    path = write_documents(tmp_path / "c.txt", ["w1 w2.", "w3"])
    before = TextFileDocuments(path).fingerprint()
    assert TextFileDocuments(path).fingerprint() == before
    write_documents(path, ["w1 w2.", "w3 w4"])
    os.utime(path, ns=(1, 2))
    assert TextFileDocuments(path).fingerprint() != before
    assert token_store.documents_fingerprint(["a", "b"]) != token_store.documents_fingerprint(["a", "c"])
    assert token_store.documents_fingerprint(["ab"]) != token_store.documents_fingerprint(["a", "b"])
    other = word_tokenizer(4999)
    assert token_store.tokenizer_fingerprint(tokenizer) == token_store.tokenizer_fingerprint(word_tokenizer())
    assert token_store.tokenizer_fingerprint(tokenizer) != token_store.tokenizer_fingerprint(other)


def test_held_out_documents_of_a_file(tmp_path):
    docs = [f"w{i} w{i + 1}." for i in range(9)]
    path = write_documents(tmp_path / "c.txt", docs)
    train = TextFileDocuments(path, hold_out=20, part="train")
    valid = TextFileDocuments(path, hold_out=20, part="validation")
    # round(9 * 0.2) = 2 held out, the middles of the strides 0-4 and 4-8
    assert list(valid) == [docs[2], docs[6]] and list(train) == docs[:2] + docs[3:6] + docs[7:]
    assert (train.num_documents(), valid.num_documents(), TextFileDocuments(path).num_documents()) == (7, 2, 9)
    assert count_text_documents(path) == 9
    one = write_documents(tmp_path / "one.txt", ["w1"])
    with pytest.raises(ValueError, match="at least two documents"):
        list(TextFileDocuments(one, hold_out=2, part="train"))
    (tmp_path / "blank.txt").write_text("\n \n")
    with pytest.raises(ValueError, match="empty or holds only whitespace"):
        count_text_documents(tmp_path / "blank.txt")


BUILD = """
import sys
from pathlib import Path
from xlnet_lite import integrity, token_store
from xlnet_lite.data import TextFileDocuments
sys.path[:0] = [{tests!r}, str(Path({tests!r}).parent)]  # test_token_store and the helpers it imports
from test_token_store import word_tokenizer

def build(path):
    Path({marker!r}).write_text("built")
    token_store.write_token_store(path, {{"train": TextFileDocuments({corpus!r})}}, word_tokenizer(), chunk_documents=5)

path = token_store.cached_folder({cache!r}, "store-x", build, is_complete=token_store.is_token_store)
print("opened", token_store.TokenStore(path).num_tokens("train"), flush=True)
"""


def build_script(tmp_path, name):
    corpus = write_documents(tmp_path / "corpus.txt", random_documents(0, n_docs=60))
    return textwrap.dedent(
        BUILD.format(
            tests=os.path.dirname(__file__),
            marker=str(tmp_path / f"{name}.built"),
            corpus=str(corpus),
            cache=str(tmp_path / "cache"),
        )
    )


@pytest.mark.slow
def test_a_kill_while_the_store_is_written_leaves_nothing_a_later_run_trusts(tmp_path):
    script = build_script(tmp_path, "first")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    crash = {**env, "XLNET_LITE_CRASH_AT": "token_store_chunk@3"}
    killed = prewarmed.run([sys.executable, "-c", script], env=crash, timeout=300)
    assert killed.returncode == -9, killed.stderr[-2000:]
    cache = tmp_path / "cache"
    assert not (cache / "store-x").exists() and list(cache.glob(".store-x.tmp-*")), "no partial store beside the path"
    again = prewarmed.run([sys.executable, "-c", script], env=env, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert not list(cache.glob(".store-x.tmp-*")), "the next builder removes what the killed one left"
    kept = [d for d in random_documents(0, n_docs=60) if d.strip()]
    tokens, _ = build_token_stream(kept, word_tokenizer())
    assert np.asarray(token_store.TokenStore(cache / "store-x").split("train").tokens).tolist() == tokens.tolist()


@pytest.mark.slow
def test_a_second_process_waits_for_the_store_being_built_and_builds_nothing(tmp_path):
    """One process holds the store's lock (as a builder does); a second that wants the store says so in one line and
    waits; once the first has written the store, the second opens it without building."""
    script = build_script(tmp_path, "second")
    cache = tmp_path / "cache"
    cache.mkdir()
    with token_store._locked(cache / ".store-x.lock", waiting="", log=print):
        waiter = prewarmed.start([sys.executable, "-c", script], env={**os.environ, "OMP_NUM_THREADS": "1"})
        deadline = time.monotonic() + 300
        while "\n" not in waiter.out.read_text() and waiter.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        first_line = waiter.out.read_text().split("\n")[0]
        assert first_line.startswith(f"waiting for another process to finish {cache / 'store-x'}"), first_line
        time.sleep(0.2)
        assert waiter.poll() is None, "the second process did not wait"
        token_store.write_token_store(
            cache / "store-x", {"train": TextFileDocuments(tmp_path / "corpus.txt")}, word_tokenizer(), log=None
        )
    out, err = waiter.communicate(timeout=300)
    assert waiter.returncode == 0, err[-2000:]
    assert out.split("\n", 1)[1].startswith("opened ") and not (tmp_path / "second.built").exists()


def flip_byte(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))


def test_a_whole_store_verifies_and_every_chunk_of_every_file_is_checked(tokenizer, tmp_path):
    """With 64-byte chunks: store.json holds one hash per chunk of every file (the tokenizer's included),
    verification reads every byte, and a bit flipped anywhere in a file (first, middle and last chunk) is named by
    the file and its chunk."""
    docs = {"train": random_documents(0), "validation": random_documents(1, n_docs=20)}
    store = token_store.write_token_store(tmp_path / "s", docs, tokenizer, log=None, chunk_bytes=64)
    files = store.meta["files"]
    assert {"train.tokens", "train.sentence_ends", "validation.tokens", "tokenizer/tokenizer.json"} <= set(files)
    for name, entry in files.items():
        assert entry["size"] == (store.path / name).stat().st_size
        assert len(entry["chunks"]) == max(1, -(-entry["size"] // 64)), name
    assert store.verify() == sum(entry["size"] for entry in files.values())
    for name in ("train.tokens", "train.sentence_ends", "validation.tokens"):
        size = files[name]["size"]
        for offset in (0, size // 2, size - 1):
            flip_byte(store.path / name, offset)
            chunk = offset // 64
            with pytest.raises(
                token_store.StoreDamage, match=rf"{name}: chunk {chunk} of {len(files[name]['chunks'])} "
            ):
                token_store.TokenStore(store.path).verify()
            flip_byte(store.path / name, offset)  # back as it was
            store.verify()


def test_a_token_id_outside_the_vocabulary_is_damage(tokenizer, tmp_path):
    """Tokens rewritten to 0xFFFF in a uint16 store are a hash mismatch naming the file; the store's largest id,
    recorded at build, names a store whose ids a (smaller) tokenizer does not have."""
    store = token_store.write_token_store(tmp_path / "s", {"train": random_documents(0)}, tokenizer, log=None)
    assert store.meta["vocab_size"] == len(tokenizer)
    assert store.meta["splits"]["train"]["max_id"] == int(np.asarray(store.split("train").tokens).max())
    store.check_vocab(len(tokenizer))
    with pytest.raises(token_store.StoreDamage, match="train.tokens: token ids up to .* outside the vocabulary of 100"):
        store.check_vocab(100)
    with open(store.path / "train.tokens", "r+b") as f:
        f.seek(64)
        f.write(b"\xff" * 128)
    with pytest.raises(token_store.StoreDamage, match=r"train.tokens: chunk 0 of 1 .* does not match its xxh3_128"):
        store.verify()


def test_a_store_of_the_format_before_hashes_is_not_opened(tokenizer, tmp_path):
    store = token_store.write_token_store(tmp_path / "s", {"train": ["w1 w2. w3", "w4"]}, tokenizer, log=None)
    meta = store.meta
    meta["format"] = 1
    (store.path / "store.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="of format 1, this xlnet_lite reads format 2"):
        token_store.TokenStore(store.path)
    assert not token_store.is_token_store(store.path)


@pytest.mark.parametrize("damaged", ["train.tokens", "train.sentence_ends", "store.json"])
def test_a_damaged_cache_entry_is_named_once_removed_and_built_again(tokenizer, tmp_path, damaged):
    """A flipped byte in a cached store (or a token count changed in its store.json): one warning line naming the
    file (the folder), the folder removed and built again (the same tokens as before the damage); the next open finds
    it whole and builds nothing."""
    builds, lines = [], []

    def build(path):
        builds.append(path)
        token_store.write_token_store(path, {"train": random_documents(0)}, tokenizer, log=None, chunk_bytes=256)

    def open_cached():
        return token_store.cached_folder(
            tmp_path / "cache",
            "store-x",
            build,
            is_complete=token_store.is_token_store,
            verify=lambda folder: token_store.TokenStore(folder).verify(),
            log=lines.append,
        )

    path = open_cached()
    tokens = np.asarray(token_store.TokenStore(path).split("train").tokens).copy()
    if damaged == "store.json":
        meta = json.loads((path / damaged).read_text())
        meta["splits"]["train"]["tokens"] += 1
        (path / damaged).write_text(json.dumps(meta))
    else:
        flip_byte(path / damaged, (path / damaged).stat().st_size // 2)
    assert open_cached() == path and len(builds) == 2
    if damaged == "store.json":
        assert lines == [f"warning: {path} is not complete; removing it from the cache and building it again"]
    else:
        assert len(lines) == 1 and lines[0].startswith(f"warning: {path / damaged}: chunk "), lines
        assert f"removing {path} from the cache and building it again" in lines[0]
    assert (
        token_store.TokenStore(path).verify()
        and (np.asarray(token_store.TokenStore(path).split("train").tokens) == tokens).all()
    )
    open_cached()
    assert len(builds) == 2 and len(lines) == 1


def test_chunk_hashes_name_the_first_changed_chunk_of_a_file(tmp_path):
    """integrity.first_changed_chunk: None for the file as hashed; the chunk of a flipped byte; for a file grown or
    cut, the first chunk that is not as recorded; an empty file is one chunk."""
    path = tmp_path / "f"
    whole = bytes(range(250)) * 4  # 1000 bytes: 10 chunks of 100
    path.write_bytes(whole)
    chunks = integrity.chunk_digests(path, 100)
    assert len(chunks) == 10 and integrity.first_changed_chunk(path, chunks, 100) is None
    flip_byte(path, 555)
    assert integrity.first_changed_chunk(path, chunks, 100) == 5
    for grown in (whole + b"x", whole + bytes(100)):
        path.write_bytes(grown)
        assert integrity.first_changed_chunk(path, chunks, 100) == 10  # one chunk more than recorded
    path.write_bytes(whole[:768])
    assert integrity.first_changed_chunk(path, chunks, 100) == 7
    path.write_bytes(whole[:900])
    assert integrity.first_changed_chunk(path, chunks, 100) == 9  # a chunk fewer
    path.write_bytes(b"")
    assert len(integrity.chunk_digests(path, 100)) == 1 and integrity.first_changed_chunk(path, chunks, 100) == 0
