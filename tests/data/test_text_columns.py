"""Which columns of a finetuning file hold the text (xlnet_lite.classification_data.text_columns): the names GLUE and
`datasets` use, transformers' run_glue rule for any other names, and --text_column / --text_pair_column; each mistake
is one error line naming the column and the columns the file has."""

import datasets
import pytest
from recipe_helpers import FINETUNE, command, one_line_error, run, sentiment_rows, write_rows

from xlnet_lite.classification_data import Split, text_columns
from xlnet_lite.errors import RecipeError


def split_with(*columns):
    return Split(datasets.Dataset.from_dict({name: ["a", "b"] for name in columns}), "t.csv")


@pytest.mark.parametrize(
    "columns,expected",
    [
        (("sentence", "label"), ("sentence", None)),
        (("sentence1", "sentence2", "label"), ("sentence1", "sentence2")),
        (("text", "label"), ("text", None)),  # imdb, ag_news, yelp_review_full
        (("label", "text"), ("text", None)),
        (("idx", "sentence", "label"), ("sentence", None)),  # a known name wins over the column order
        (("text", "sentence", "label"), ("sentence", None)),
        (("review", "label"), ("review", None)),  # transformers: the only column other than `label`
        (("question", "answer", "label"), ("question", "answer")),  # transformers: the first two, as a pair
        (("review",), ("review", None)),  # a test file without labels
    ],
)
def test_the_text_columns_found_by_name_or_as_transformers_finds_them(columns, expected):
    assert text_columns(split_with(*columns)) == expected


def test_named_text_columns_win_and_a_missing_one_names_the_columns_the_file_has():
    split = split_with("id", "title", "body", "label")
    assert text_columns(split, "body") == ("body", None)
    assert text_columns(split, "title", "body") == ("title", "body")
    with pytest.raises(RecipeError, match=r"t.csv: no column `review` \(--text_column\); the file has columns"):
        text_columns(split, "review")
    with pytest.raises(RecipeError, match=r"no column `summary` \(--text_pair_column\).*'body', 'label'"):
        text_columns(split, "title", "summary")


def test_a_file_with_only_labels_has_no_text_column():
    with pytest.raises(RecipeError, match="no text column: expected `sentence`, `text`"):
        text_columns(split_with("label"))


recipe = pytest.mark.recipes  # the tests below run the finetuning recipe


@recipe
def test_finetuning_on_text_and_string_labels(tmp_path, pretrained):
    rows = [{"text": row["sentence"], "label": row["label"]} for row in sentiment_rows(1)]
    train = write_rows(tmp_path / "train.csv", rows)
    results, out = run(tmp_path, pretrained, "--train_file", train, "--test_file", train, epochs=1)
    assert results["train_samples"] == len(rows)
    predictions = (out / "predict_results.tsv").read_text().splitlines()
    assert len(predictions) == 1 + len(rows) and {line.split("\t")[1] for line in predictions[1:]} <= {"pos", "neg"}


@recipe
def test_finetuning_on_named_columns(tmp_path, pretrained):
    rows = [{"id": i, "body": row["sentence"], "label": row["label"]} for i, row in enumerate(sentiment_rows(1))]
    train = write_rows(tmp_path / "train.csv", rows)
    results, _ = run(tmp_path, pretrained, "--train_file", train, "--text_column", "body", epochs=1)
    assert results["train_samples"] == len(rows)


@recipe
@pytest.mark.parametrize(
    "flags,says",
    [
        (["--text_column", "review"], "train.csv: no column `review` (--text_column); the file has columns"),
        (["--text_column", "sentence", "--text_pair_column", "other"], "no column `other` (--text_pair_column)"),
        (["--text_pair_column", "sentence"], "--text_pair_column needs --text_column"),
    ],
)
def test_a_wrong_text_column_is_one_line(tmp_path, pretrained, flags, says):
    train = write_rows(tmp_path / "train.csv", sentiment_rows(1))
    args = ["--model_name_or_path", pretrained, "--train_file", train, "--output_dir", tmp_path / "out", *flags]
    one_line_error(command(FINETUNE, *args), says)
    assert not (tmp_path / "out" / "model.safetensors").exists()


@recipe
def test_text_columns_are_for_files(tmp_path, pretrained):
    args = ["--model_name_or_path", pretrained, "--output_dir", tmp_path / "out", "--text_column", "text"]
    one_line_error(command(FINETUNE, *args), "--text_column / --text_pair_column name columns of --train_file")
