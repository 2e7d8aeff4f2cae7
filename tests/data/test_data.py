"""Documents, tokenization and PretrainingStream (contiguous XLNet samples)."""

import json

import datasets
import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from xlnet_lite.data import (
    PretrainingStream,
    TextFileDocuments,
    build_eval_batches,
    build_token_stream,
    held_out_positions,
    read_text_documents,
    spread_documents,
    tokenize_documents,
)
from xlnet_lite.tokenization_xlnet_lite import SPECIAL_TOKENS, wrap_tokenizer

SEP, CLS, EOD = 4, 3, 7


@pytest.fixture(scope="module")
def tokenizer():
    """Word-level-like Unigram: "." is id 8, "!" id 9, "w<i>" id 10 + i."""
    vocab = [(t, 0.0) for t in SPECIAL_TOKENS] + [(".", -1.0), ("!", -1.0)]
    vocab += [(f"▁w{i}", -1.0) for i in range(5000)]
    backend = Tokenizer(models.Unigram(vocab, unk_id=0))
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace()])
    return wrap_tokenizer(backend)


def unique_corpus(n_docs=60, seed=0, lengths=(5, 40)):
    """Documents of distinct token ids (>= 8) with no sentence boundaries inside."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(*lengths, size=n_docs)
    ids = np.arange(8, 8 + lengths.sum())
    return np.split(ids, np.cumsum(lengths)[:-1])


@pytest.mark.parametrize("n,limit", [(10, 3), (10, 10), (10, 20), (7, 1), (1000, 999), (1000, 7)])
def test_spread_documents_over_every_kind_of_corpus(tmp_path, n, limit):
    """Up to `limit` documents spread evenly (first and last part of the corpus both present, no repeats, in order)
    from a list, a Dataset and a text file (whole or its training part); a stream gives its first `limit`."""
    texts = [f"document {i}" for i in range(n)]
    picked = spread_documents(texts, limit)
    numbers = [int(t.split()[1]) for t in picked]
    assert len(picked) == min(n, limit) and numbers == sorted(set(numbers)) and numbers[0] == 0
    if limit > 1:
        assert numbers[-1] >= n - -(-n // limit), numbers  # the last stride of the corpus is sampled too
    gaps = np.diff(numbers)
    assert len(gaps) == 0 or gaps.max() - gaps.min() <= 1  # evenly
    dataset = datasets.Dataset.from_dict({"body": texts})
    assert spread_documents(dataset, limit, text_column="body") == picked
    path = tmp_path / "corpus.txt"
    path.write_text("\n\n".join(texts + ["held out"]), encoding="utf-8")
    assert spread_documents(TextFileDocuments(path), limit) == spread_documents(texts + ["held out"], limit)
    train_part = TextFileDocuments(path, hold_out=100 / (n + 1), part="train")
    held = list(TextFileDocuments(path, hold_out=100 / (n + 1), part="validation"))
    assert len(held) == 1 and train_part.num_documents() == n
    assert spread_documents(train_part, limit) == spread_documents(
        [t for t in texts + ["held out"] if t not in held], limit
    )
    stream = datasets.Dataset.from_dict({"body": texts}).to_iterable_dataset()
    assert spread_documents(stream, limit, text_column="body") == texts[:limit]
    assert spread_documents(iter(texts), limit) == texts[:limit]
    with pytest.raises(ValueError, match="limit"):
        spread_documents(texts, 0)


@pytest.mark.parametrize("percentage", [0.5, 2, 10, 33.3, 49.9])
def test_held_out_positions_spread_over_the_corpus(percentage):
    """For every corpus size: round(n * p / 100) documents (at least 1, at most n - 1), distinct and in order, one in
    each of that many equal strides, so the first and the last part of a corpus stored in order are both validated."""
    for n in list(range(2, 120)) + [997, 10_180, 123_457]:
        positions = held_out_positions(n, percentage)
        k = min(n - 1, max(1, round(n * percentage / 100)))
        assert len(positions) == k and positions == sorted(set(positions)), (n, positions)
        assert 0 <= positions[0] and positions[-1] < n
        strides = [i * k // n for i in positions]  # the stride of k equal ones each position falls in
        assert strides == list(range(k)), (n, positions)
    topics = [f"topic{t} doc{d}" for t in range(20) for d in range(50)]  # stored topic after topic
    held = {topics[i].split()[0] for i in held_out_positions(len(topics), 2)}
    assert held == {f"topic{t}" for t in range(20)}  # 20 of 1,000: one from each topic
    for bad in (0, 100, -1):
        with pytest.raises(ValueError, match="percentage"):
            held_out_positions(10, bad)
    with pytest.raises(ValueError, match="at least two documents"):
        held_out_positions(1, 2)


def test_read_text_documents(tmp_path):
    path = tmp_path / "docs.txt"
    path.write_text("first line\nsecond line\n\n\n  \nnext doc\n", encoding="utf-8")
    assert read_text_documents(path) == ["first line\nsecond line", "next doc"]
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\nalso fine\n\xff\xfe broken\n")
    with pytest.raises(ValueError, match=r"bad\.txt.*line 3"):
        read_text_documents(bad)
    empty = tmp_path / "empty.txt"
    empty.write_text(" \n\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"empty\.txt"):
        read_text_documents(empty)


def test_tokenize_documents_list_dataset_and_streaming(tokenizer):
    docs = ["w1 w2. w3 w4 w5! w6", "", "w7\nw8 w9"]
    from_list = tokenize_documents(docs, tokenizer)
    assert from_list.num_rows == 2
    assert from_list[0]["input_ids"] == [11, 12, 8, 13, 14, 15, 9, 16]
    assert from_list[0]["sentence_lengths"] == [3, 4, 1]
    assert from_list[1]["sentence_lengths"] == [1, 2]
    ds = datasets.Dataset.from_dict({"body": docs, "id": [0, 1, 2]})
    from_ds = tokenize_documents(ds, tokenizer, text_column="body", batch_size=2)
    assert from_ds.column_names == ["input_ids", "sentence_lengths"] and from_ds.to_list() == from_list.to_list()
    streamed = tokenize_documents(ds.to_iterable_dataset(), tokenizer, text_column="body")
    assert isinstance(streamed, datasets.IterableDataset)
    assert [{k: r[k] for k in ("input_ids", "sentence_lengths")} for r in streamed] == from_list.to_list()
    with pytest.raises(ValueError, match="text_column"):
        tokenize_documents(ds, tokenizer)


def test_token_stream_inserts_eod_as_its_own_sentence(tokenizer):
    tokens, starts = build_token_stream(tokenize_documents(["w1 w2. w3", "w4"], tokenizer), tokenizer)
    assert tokens.tolist() == [11, 12, 8, 13, EOD, 14, EOD]
    assert starts.tolist() == [3, 4, 5, 6]


def check_example(ex, seq_len, reuse_len):
    ids, types = ex["input_ids"], ex["token_type_ids"]
    assert len(ids) == len(types) == seq_len
    seps = np.flatnonzero(ids == SEP)
    assert len(seps) == 2 and seps[1] == seq_len - 2 and ids[-1] == CLS and seps[0] > reuse_len
    assert (types[: seps[0] + 1] == 0).all() and (types[seps[0] + 1 : -1] == 1).all() and types[-1] == 2
    return ids[:reuse_len], ids[reuse_len : seps[0]], ids[seps[0] + 1 : -2]


def test_stream_layout_and_continuity(tokenizer):
    docs = unique_corpus(1000, lengths=(2, 8))  # short sentences: A can always end at one
    tokens, starts = build_token_stream(docs, tokenizer)
    seq_len, reuse_len, bs = 32, 12, 4
    stream = PretrainingStream(docs, tokenizer, batch_size=bs, seq_len=seq_len, reuse_len=reuse_len, seed=1)
    row_len = len(tokens) // bs
    assert stream.steps_per_epoch == (row_len - seq_len) // reuse_len + 1
    sentence_start = np.zeros(len(tokens) + 1, dtype=bool)
    sentence_start[starts] = True
    is_next = []
    for step in range(stream.steps_per_epoch):
        for row, ex in enumerate(stream.next_batch()):
            reuse, a, b = check_example(ex, seq_len, reuse_len)
            start = row * row_len + step * reuse_len
            assert (reuse == tokens[start : start + reuse_len]).all(), "reuse part is not the row's next window"
            assert (a == tokens[start + reuse_len : start + reuse_len + len(a)]).all(), (
                "A does not follow the reused part"
            )
            assert len(a) >= 1 and len(b) >= 1
            k = int(np.argmax(b != EOD))  # the other tokens are unique
            b_pos = np.flatnonzero(tokens == b[k])[0] - k
            assert b_pos == row * row_len or sentence_start[b_pos], "B does not start at a sentence"
            assert (b == tokens[b_pos : b_pos + len(b)]).all()
            # B continues A: it starts where A was cut (XLNet trims A from the right to fit)
            a_begin = start + reuse_len
            is_next.append(a_begin + len(a) <= b_pos <= a_begin + seq_len - reuse_len - 3)
    assert 0.35 < np.mean(is_next) < 0.65, np.mean(is_next)


def test_bi_data_reverses_half_of_the_rows(tokenizer):
    docs = unique_corpus(200)
    tokens, _ = build_token_stream(docs, tokenizer)
    stream = PretrainingStream(docs, tokenizer, batch_size=4, seq_len=24, reuse_len=8, bi_data=True)
    row_len = len(tokens) // 2
    for step in range(3):
        batch = stream.next_batch()
        assert [ex["is_reversed"] for ex in batch] == [False, False, True, True]
        for row in range(2):
            fwd, bwd = batch[row]["input_ids"][:8], batch[row + 2]["input_ids"][:8]
            assert (fwd == tokens[row * row_len + step * 8 :][:8]).all()
            end = (row + 1) * row_len - step * 8
            assert (bwd == tokens[end - 8 : end][::-1]).all()
    with pytest.raises(ValueError, match="even batch_size"):
        PretrainingStream(docs, tokenizer, batch_size=3, seq_len=24, reuse_len=8, bi_data=True)


def test_ranks_take_disjoint_rows(tokenizer):
    docs = unique_corpus(300)
    kwargs = dict(seq_len=24, reuse_len=8, seed=5)
    whole = PretrainingStream(docs, tokenizer, batch_size=6, **kwargs).next_batch()
    parts = [
        PretrainingStream(docs, tokenizer, batch_size=3, rank=r, world_size=2, **kwargs).next_batch() for r in range(2)
    ]
    reuse = [[tuple(ex["input_ids"][:8]) for ex in part] for part in parts]
    assert not set(reuse[0]) & set(reuse[1])
    assert reuse[0] + reuse[1] == [tuple(ex["input_ids"][:8]) for ex in whole]
    with pytest.raises(ValueError, match="rank"):
        PretrainingStream(docs, tokenizer, batch_size=3, rank=2, world_size=2, **kwargs)


def test_state_dict_resume_and_epochs(tokenizer):
    docs = unique_corpus(80)
    kwargs = dict(batch_size=2, seq_len=20, reuse_len=6, seed=3)
    stream = PretrainingStream(docs, tokenizer, **kwargs)
    n = stream.steps_per_epoch
    for _ in range(n - 2):
        stream.next_batch()
    state = json.loads(json.dumps(stream.state_dict()))
    expected = [stream.next_batch() for _ in range(5)]  # crosses into epoch 1
    assert stream.epoch == 1
    resumed = PretrainingStream(docs, tokenizer, **kwargs)
    resumed.load_state_dict(state)
    for want, got in zip(expected, (resumed.next_batch() for _ in range(5))):
        for w, g in zip(want, got):
            assert (w["input_ids"] == g["input_ids"]).all() and (w["token_type_ids"] == g["token_type_ids"]).all()
    other = PretrainingStream(docs, tokenizer, **{**kwargs, "seq_len": 22})
    with pytest.raises(ValueError, match="layout"):
        other.load_state_dict(state)
    finite = PretrainingStream(docs, tokenizer, loop=False, **kwargs)
    assert len(list(finite)) == n
    evals = build_eval_batches(docs, tokenizer, **kwargs)
    assert len(evals) == n
    assert all(
        (a["input_ids"] == b["input_ids"]).all()
        for x, y in zip(evals, build_eval_batches(docs, tokenizer, **kwargs))
        for a, b in zip(x, y)
    )


def test_stream_errors(tokenizer):
    docs = unique_corpus(10)
    total = len(build_token_stream(docs, tokenizer)[0])
    with pytest.raises(ValueError, match=rf"need at least {8 * 64} tokens, and there are {total}"):
        PretrainingStream(docs, tokenizer, batch_size=8, seq_len=64, reuse_len=16)
    with pytest.raises(ValueError, match="reuse_len"):
        PretrainingStream(docs, tokenizer, batch_size=1, seq_len=16, reuse_len=12)
    with pytest.raises(ValueError, match="batch_size"):
        PretrainingStream(docs, tokenizer, batch_size=0, seq_len=16, reuse_len=4)


def test_streaming_source_matches_in_memory(tokenizer):
    texts = [" ".join(f"w{i}" for i in range(k, k + 30)) + "." for k in range(0, 3000, 30)]
    ds = datasets.Dataset.from_dict({"text": texts})
    kwargs = dict(batch_size=2, seq_len=24, reuse_len=8, seed=0)
    a = PretrainingStream(texts, tokenizer, **kwargs).next_batch()
    b = PretrainingStream(tokenize_documents(ds.to_iterable_dataset(), tokenizer), tokenizer, **kwargs).next_batch()
    assert all((x["input_ids"] == y["input_ids"]).all() for x, y in zip(a, b))


def test_encode_documents_in_batches_of_text_gives_the_same_stream(tokenizer, monkeypatch):
    """encode_documents encodes a chunk's sentences ENCODE_BATCH_CHARACTERS of text at a time (a chunk of long
    documents would otherwise hold the tokenizers library's encodings of all of it): any batch size, down to one
    sentence a batch, gives the same tokens and sentence lengths, empty documents and sentences dropped as before."""
    import xlnet_lite.data as data

    texts = ["w1 w2. w3 w4!\nw5", "", "w6", "  \n ", "w7 w8 w9. w10.\n\nw11"] * 3
    whole = data.encode_documents(texts, tokenizer)
    calls = []
    encode = data._encode_without_special_tokens
    monkeypatch.setattr(data, "_encode_without_special_tokens", lambda t, s: calls.append(len(s)) or encode(t, s))
    for size in (1, 7, 30):
        calls.clear()
        monkeypatch.setattr(data, "ENCODE_BATCH_CHARACTERS", size)
        tokens, lengths = data.encode_documents(texts, tokenizer)
        assert np.array_equal(tokens, whole[0]) and np.array_equal(lengths, whole[1]), size
        assert len(calls) > 1 and (size > 1 or max(calls) == 1), calls
    assert data.encode_documents([], tokenizer)[0].size == 0
