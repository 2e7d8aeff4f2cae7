"""The tokenizer's training sample (xlnet_lite.data.TokenizerSample): capped in characters, spread over the corpus,
read as the trainer asks; a corpus under the cap gives every document in order (the tokenizer it always had)."""

import types

import datasets
import numpy as np
import pytest

from xlnet_lite.data import TextFileDocuments, TokenizerSample, spread_documents


def sorted_corpus(n=400, seed=0):
    """Documents of 20 to 2,000 characters stored by topic (the first half of topic a, the second of topic b)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(20, 2000, size=n)
    return [f"{'a' if i < n // 2 else 'b'}{i} " + "x" * int(length) for i, length in enumerate(lengths)]


def numbers(texts):
    return [int(t.split()[0][1:]) for t in texts]


def every_kind(texts, tmp_path):
    """The same documents as a list, a Dataset and a text file."""
    path = tmp_path / "corpus.txt"
    path.write_text("\n\n".join(texts), encoding="utf-8")
    return {
        "list": texts,
        "dataset": datasets.Dataset.from_dict({"body": texts}),
        "file": TextFileDocuments(path),
    }


def test_a_corpus_under_the_cap_is_every_document_in_order(tmp_path):
    """Under the character cap the sample is the corpus itself, in order (and with a document cap, spread_documents'
    documents, as before the character cap existed): the tokenizer of such a corpus is unchanged, and the cap is
    known to take nothing without reading it (so its cache key stays)."""
    texts = sorted_corpus(60)
    total = sum(len(t) for t in texts)
    for kind, corpus in every_kind(texts, tmp_path).items():
        sample = TokenizerSample(corpus, total + 200, text_column="body")
        assert list(sample) == texts, kind
        assert (sample.documents, sample.characters) == (len(texts), total), kind
        assert sample.whole_corpus_fits(), kind
        assert list(TokenizerSample(corpus, total + 200, max_documents=7, text_column="body")) == spread_documents(
            texts, 7
        ), kind
    assert not TokenizerSample(texts, total - 1).whole_corpus_fits()


def test_the_main_jobs_corpus_is_whole_under_the_default_cap():
    """The recipe's default cap keeps every embedded corpus whole, 20 Newsgroups (the main job's) first: the same
    documents in the same order reach the trainer as before the cap, so its tokenizer is byte for byte the same."""
    from xlnet_lite.pretraining import load_corpus

    run_pretraining = pytest.importorskip("pretrain.run_pretraining")
    defaults = run_pretraining.PretrainingArguments()
    for corpus in ("newsgroups", "newsgroups+news", "rotten_tomatoes"):
        args = types.SimpleNamespace(
            train_file=None, dataset_name=None, embedded_corpus=corpus, validation_split_percentage=2.0
        )
        train, _ = load_corpus(args)
        sample = TokenizerSample(
            train, defaults.tokenizer_train_characters, max_documents=defaults.tokenizer_train_documents
        )
        assert sample.whole_corpus_fits() and len(train) <= defaults.tokenizer_train_documents, corpus
        if corpus == "rotten_tomatoes":
            assert list(sample) == train


@pytest.mark.parametrize("share", [0.05, 0.2, 0.5])
def test_the_sample_is_capped_in_characters_and_spread_over_the_corpus(tmp_path, share):
    """Over the cap: at most that many characters (and nearly all of them), from every tenth of the corpus's text in
    proportion, long and short documents alike, the same from a list, a Dataset and a text file."""
    texts = sorted_corpus()
    lengths = np.array([len(t) for t in texts])
    cap = int(share * lengths.sum())
    picked = list(TokenizerSample(texts, cap))
    taken = sum(len(t) for t in picked)
    assert cap - lengths.max() <= taken <= cap
    chosen = numbers(picked)
    assert chosen == sorted(set(chosen)) and chosen[0] == 0
    # every tenth of the text gives about its share (within two of the longest documents)
    tenth = np.minimum(np.cumsum(lengths) * 10 // lengths.sum(), 9)
    for part in range(10):
        got = sum(lengths[i] for i in chosen if tenth[i] == part)
        assert abs(got - share * lengths[tenth == part].sum()) <= 2 * lengths.max(), (part, got)
    assert abs(np.mean(lengths[chosen]) - lengths.mean()) < 0.25 * lengths.mean()  # not only the short documents
    for kind, corpus in every_kind(texts, tmp_path).items():
        assert list(TokenizerSample(corpus, cap, text_column="body")) == picked, kind


def test_a_cap_below_one_document_cuts_it():
    """A document longer than the cap (a book) is cut at the cap: the sample never passes it."""
    sample = TokenizerSample(["y" * 50, "z" * 500, "w" * 50], 30)
    assert list(sample) == ["y" * 30] and sample.characters == 30


def test_a_stream_gives_its_first_characters():
    """A stream (size unknown): its first documents up to the character cap, the last one cut to fill it, and no
    further document read; the document cap too."""
    texts = sorted_corpus(50)
    read = []

    def stream():
        for t in texts:
            read.append(t)
            yield t

    cap = sum(len(t) for t in texts[:10]) + 5
    sample = TokenizerSample(stream(), cap)
    picked = list(sample)
    assert picked == texts[:10] + [texts[10][:5]] and "".join(picked) == "".join(texts)[:cap]
    assert len(read) == 11 and sample.characters == cap and not sample.spread
    hf_stream = datasets.Dataset.from_dict({"body": texts}).to_iterable_dataset()
    assert list(TokenizerSample(hf_stream, cap, text_column="body")) == picked
    assert list(TokenizerSample(iter(texts), 10**9, max_documents=3)) == texts[:3]
    assert not TokenizerSample(hf_stream, 10**9, text_column="body").whole_corpus_fits()
    with pytest.raises(ValueError, match="max_characters"):
        TokenizerSample(texts, 0)


class FakeAccelerator:
    is_main_process = True

    def __init__(self):
        self.lines = []

    def print(self, line):
        self.lines.append(line)

    def main_process_first(self):
        import contextlib

        return contextlib.nullcontext()

    def wait_for_everyone(self):
        pass


@pytest.mark.parametrize("streaming", [False, True])
def test_the_recipe_logs_how_much_text_the_tokenizer_read(tmp_path, streaming):
    """get_tokenizer trains on the capped sample and says how much text that was; a capped corpus and its whole self
    are kept under different cache keys, a corpus under the cap under the key it had before the cap."""
    from xlnet_lite import pretraining

    texts = sorted_corpus(80)
    total = sum(len(t) for t in texts)
    train = datasets.Dataset.from_dict({"text": texts})
    if streaming:
        train = train.to_iterable_dataset()
    args = types.SimpleNamespace(
        output_dir=str(tmp_path / "out"),
        token_store=None,
        tokenizer_name=None,
        model_name_or_path=None,
        vocab_size=60,
        tokenizer_train_documents=100000,
        tokenizer_train_characters=total // 4,
        text_column="text",
        streaming=streaming,
        dataset_name="corpus",
        dataset_config_name=None,
        train_file=None,
        validation_file=None,
        token_store_cache_dir=str(tmp_path / "cache"),
    )
    accelerator = FakeAccelerator()
    tokenizer = pretraining.get_tokenizer(args, train, accelerator)
    assert len(tokenizer) <= 60
    expected = list(TokenizerSample(train, total // 4))
    where = "(the first of the stream)" if streaming else "spread evenly over the corpus"
    line = f"tokenizer trained on {len(expected):,} training documents {where}: {sum(map(len, expected)):,} characters"
    assert line in accelerator.lines[-1], accelerator.lines
    assert accelerator.lines[-2].startswith(f"training a 60-piece Unigram tokenizer on at most {total // 4:,} char")
    if not streaming:
        args.output_dir, args.tokenizer_train_characters = str(tmp_path / "whole"), total
        pretraining.get_tokenizer(args, train, accelerator)
        keys = sorted(p.name for p in (tmp_path / "cache").glob("tokenizer-*"))
        assert len(keys) == 2, keys  # the whole corpus is not served the capped corpus's tokenizer
