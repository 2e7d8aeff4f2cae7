"""The in-domain downstream task (the topic of an embedded news article, from its URL section) and its split: labels,
a deterministic order-free split, validation and test articles never in the pretraining text; the finetuning recipe
and the TF-IDF baseline on it."""

import random

import pytest
from recipe_helpers import run

from main_job.tfidf import tfidf_baseline
from xlnet_lite.classification_data import load_splits
from xlnet_lite.embedded_datasets import (
    NEWS_TOPICS,
    embedded_news_articles,
    embedded_news_pretraining_texts,
    embedded_news_topics,
    news_section,
    news_topic,
    news_topic_split,
)


@pytest.mark.parametrize(
    "url,section,topic",
    [
        ("http://abcnews.go.com/Politics/pence-break-tie-devos/story?id=45322312", "politics", "politics"),
        ("http://abcnews.go.com/International/wireStory/quake-45300001", "international", "world"),
        ("http://tass.com/economy/929410", "economy", "business"),
        ("http://tass.com/defense/929400", "defense", None),  # a section outside the six topics
        ("http://www.cnn.com/2017/02/07/politics/betsy-devos-senate-vote/index.html", "politics", "politics"),
        ("http://www.cnn.com/2017/02/05/opinions/devos-opinion-wong/index.html", "opinions", None),
        ("http://www.cnn.com/2017/03/01/middleeast/mosul-offensive/index.html", "middleeast", "world"),
        ("http://www.bbc.co.uk/news/uk-politics-38895007", "politics", "politics"),
        ("http://www.bbc.co.uk/news/world-us-canada-38897507", "world", "world"),
        ("http://www.bbc.co.uk/news/business-38891234", "business", "business"),
        ("http://www.bbc.co.uk/news/uk-38899472", "uk", None),
        ("http://www.bbc.co.uk/sport/football/38891023", "sport", "sport"),
        ("http://www.rte.ie/news/business/2017/0207/850712-jobs/", "business", "business"),
        ("http://www.rte.ie/news/2017/0207/850712-waiting-lists-reaction/", None, None),  # no section in the URL
        ("http://www.aljazeera.com/news/2017/02/haiti-president-170207161155899.html", None, None),
        ("http://www.dw.com/en/poland-wants-nuclear-weapons/a-37449773", None, None),
    ],
)
def test_topic_from_the_url_section(url, section, topic):
    assert news_section(url) == section and news_topic(url) == topic


def synthetic_articles(n, seed=0):
    rng = random.Random(seed)
    urls = [
        "http://tass.com/sport/{}",
        "http://tass.com/economy/{}",
        "http://abcnews.go.com/Politics/story-{}",
        "http://www.cnn.com/2017/02/07/world/story-{}/index.html",
        "http://www.dw.com/en/story/a-{}",
    ]
    return [
        {
            "article_id": str(i),
            "article_source_link": rng.choice(urls).format(i),
            "text": f"article {i} " + " ".join(rng.choice(["vote", "match", "market", "troops"]) for _ in range(60)),
        }
        for i in range(n)
    ]


def test_split_is_deterministic_order_free_and_keeps_held_out_text_out_of_pretraining():
    articles = synthetic_articles(3000)
    ds = embedded_news_topics(articles)
    shuffled = articles[:]
    random.Random(1).shuffle(shuffled)
    again = embedded_news_topics(shuffled)
    for split in ("train", "validation", "test"):
        assert sorted(ds[split]["article_id"]) == sorted(again[split]["article_id"])  # a property of the text alone
    labelled = [a for a in articles if news_topic(a["article_source_link"])]
    assert (
        sum(ds[s].num_rows for s in ds)
        == len(labelled)
        == sum("dw.com" not in a["article_source_link"] for a in articles)
    )
    shares = {s: ds[s].num_rows / len(labelled) for s in ds}
    assert (
        abs(shares["train"] - 0.60) < 0.04
        and abs(shares["validation"] - 0.15) < 0.03
        and abs(shares["test"] - 0.25) < 0.04
    )
    ids = {s: set(ds[s]["article_id"]) for s in ds}
    assert (
        not ids["train"] & ids["validation"] and not ids["train"] & ids["test"] and not ids["validation"] & ids["test"]
    )
    pretraining = set(embedded_news_pretraining_texts(articles))
    held_out = set(ds["validation"]["sentence"]) | set(ds["test"]["sentence"])
    assert not pretraining & held_out
    assert set(ds["train"]["sentence"]) <= pretraining  # task-adaptive: the train texts are pretrained on, unlabelled
    unlabelled = {a["text"] for a in articles if news_topic(a["article_source_link"]) is None}
    assert unlabelled <= pretraining and len(pretraining) == len(articles) - len(held_out)
    # pinned: a change of the hash would move articles between the splits (and test articles into pretraining)
    assert [news_topic_split(f"text {i}") for i in range(1, 9)] == ["train"] * 3 + ["validation"] + ["train"] * 3 + [
        "test"
    ]


def test_labels_follow_the_topic_list():
    articles = synthetic_articles(200, seed=3)
    ds = embedded_news_topics(articles)
    assert ds["train"].features["label"].names == NEWS_TOPICS
    by_id = {a["article_id"]: news_topic(a["article_source_link"]) for a in articles}
    for split in ds:
        assert all(NEWS_TOPICS[label] == by_id[i] for label, i in zip(ds[split]["label"], ds[split]["article_id"]))


def test_copies_of_a_text_share_its_split_and_short_texts_stay_unlabelled():
    articles = synthetic_articles(400, seed=5)
    copies = [
        {**a, "article_id": a["article_id"] + "-copy", "article_source_link": "http://tass.com/world/1"}
        for a in articles
    ]
    short = [{"article_id": "short", "article_source_link": "http://tass.com/sport/2", "text": " March 20"}]
    ds = embedded_news_topics(articles + copies + short)
    for split in ds:
        ids = set(ds[split]["article_id"])
        assert all((i + "-copy" in ids) for i in ids if not i.endswith("-copy"))
    assert "short" not in {i for split in ds for i in ds[split]["article_id"]}
    pretraining = embedded_news_pretraining_texts(articles + copies + short)
    assert " March 20" in pretraining
    held_out = set(ds["validation"]["sentence"]) | set(ds["test"]["sentence"])
    assert held_out and not held_out & set(pretraining)


def test_the_embedded_task():
    articles = embedded_news_articles()
    ds = embedded_news_topics(articles)
    assert {s: ds[s].num_rows for s in ds} == {"train": 778, "validation": 182, "test": 298}
    assert set(ds["test"]["label"]) == set(range(len(NEWS_TOPICS)))  # every topic is tested
    pretraining = embedded_news_pretraining_texts(articles)
    held_out = {t.strip() for t in list(ds["validation"]["sentence"]) + list(ds["test"]["sentence"])}
    assert (
        len(pretraining) == sum(1 for a in articles if a["text"].strip() and a["text"].strip() not in held_out) == 3308
    )
    assert not {t.strip() for t in pretraining} & held_out  # no copy of a held-out text either (wire stories repeat)
    texts = {s: {t.strip() for t in ds[s]["sentence"]} for s in ds}
    assert not texts["train"] & texts["test"] and not texts["train"] & texts["validation"]


def test_finetuning_and_the_baseline_on_the_embedded_task(pretrained, tmp_path):
    results, out = run(
        tmp_path,
        pretrained,
        "--embedded_task",
        "news_topic",
        "--max_train_samples",
        "24",
        "--max_eval_samples",
        "10",
        "--max_predict_samples",
        "10",
        epochs=1,
    )
    assert 0 <= results["test_accuracy"] <= 1 and results["train_samples"] == 24
    assert (out / "predict_results.tsv").read_text().splitlines()[1].split("\t")[1] in NEWS_TOPICS
    baseline = tfidf_baseline(load_splits(embedded_task="news_topic"))
    assert (
        baseline["test_examples"] == 298 and baseline["test_accuracy"] > baseline["majority_class_test_accuracy"] + 0.1
    )


def test_the_tfidf_baseline_warm_started_along_the_grid_equals_a_fit_per_c():
    """Each C warm-started from the one before reaches the optimum a cold fit reaches: the same validation
    accuracy for every C, so the same chosen C and test accuracy."""
    from sklearn.linear_model import LogisticRegression

    from main_job.tfidf import C_GRID, SOLVER, _texts, vectorizer
    from xlnet_lite.classification_data import first_per_class
    from xlnet_lite.glue_metrics import accuracy

    splits = load_splits(embedded_task="news_topic")
    splits["train"] = first_per_class(splits["train"], 15)
    baseline = tfidf_baseline(splits)
    features = vectorizer()
    x_train = features.fit_transform(_texts(splits["train"]))
    x_val = features.transform(_texts(splits["validation"]))
    cold = {
        str(c): accuracy(
            LogisticRegression(C=c, **SOLVER).fit(x_train, splits["train"].data["label"]).predict(x_val),
            list(splits["validation"].data["label"]),
        )
        for c in C_GRID
    }
    assert baseline["validation_accuracy_by_C"] == cold
    assert len(set(cold.values())) > 1  # the grid matters on this data: a mix-up of Cs would show
    assert baseline["best_C"] == max(C_GRID, key=lambda c: (cold[str(c)], -c))


def test_a_cached_tfidf_row_from_another_solver_is_fitted_again(tmp_path):
    import argparse
    import json

    from benchmarks import bench_newsgroups
    from main_job.tfidf import MODEL

    args = argparse.Namespace(runs_dir=str(tmp_path / "runs"), embedded_task="news_topic")
    cache = tmp_path / "tfidf" / "news_topic_20.json"
    cache.parent.mkdir()
    cache.write_text(json.dumps({"model": "tfidf + logistic regression (lbfgs)", "test_accuracy": -1.0}))
    splits = load_splits(embedded_task="news_topic")
    row = bench_newsgroups.tfidf_row(args, splits, 20)
    assert row["model"] == MODEL and 0 <= row["test_accuracy"] <= 1 and row["train_examples"] == 6 * 20
    assert json.loads(cache.read_text()) == row
    cache.write_text(json.dumps({**row, "test_accuracy": -2.0}))  # a row of this solver is read back, not refitted
    assert bench_newsgroups.tfidf_row(args, splits, 20)["test_accuracy"] == -2.0
