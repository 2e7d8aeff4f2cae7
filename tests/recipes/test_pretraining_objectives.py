"""--objective mlm and clm in the pretraining recipe: each trains, checkpoints and resumes exactly like plm, saves a
model whose config says how it attends (and not the training-only sparse prediction), and finetunes with
finetune/run_glue.py unchanged; flags that do not fit an objective stop at once."""

import json
import math

import pytest
from recipe_helpers import (
    PRETRAIN,
    assert_same_losses,
    command,
    cut_at_step_6,
    one_line_error,
    read_metrics,
    run,
    sentiment_rows,
    tiny_args,
    write_rows,
)

from pretrain import run_pretraining

pytestmark = pytest.mark.recipes


@pytest.mark.parametrize("objective, attn_type", [("mlm", "bi"), ("clm", "uni")])
def test_objective_trains_resumes_and_finetunes(corpus, tmp_path, objective, attn_type):
    straight = tmp_path / "straight"
    flags = ("--objective", objective, "--mlm_probability", "0.3")
    results = run_pretraining.main(tiny_args(corpus, straight, *flags))
    assert results["steps"] == 12 and math.isfinite(results["eval_loss"]) and results["skipped_steps"] == 0
    # the first step's loss is about the unigram entropy (the LM bias starts there): each objective scores text
    assert read_metrics(straight)[0]["loss"] == pytest.approx(results["unigram_baseline_loss"], abs=0.7)
    config = json.loads((straight / "config.json").read_text())
    assert config["attn_type"] == attn_type and config["sparse_prediction"] is False

    resumed = tmp_path / "resumed"
    cut_at_step_6(straight, resumed)
    run_pretraining.main(tiny_args(corpus, resumed, *flags, "--resume_from_checkpoint", "latest"))
    assert_same_losses(read_metrics(straight), read_metrics(resumed))

    train = write_rows(tmp_path / "train.csv", sentiment_rows())
    finetuned, out = run(tmp_path, straight, "--train_file", train, "--validation_file", train, epochs=1)
    assert json.loads((out / "config.json").read_text())["attn_type"] == attn_type
    assert 0 <= finetuned["eval_accuracy"] <= 1


def test_a_resume_keeps_the_objective(corpus, tmp_path):
    run_pretraining.main(tiny_args(corpus, tmp_path, "--max_steps", "6"))
    result = command(PRETRAIN, *tiny_args(corpus, tmp_path, "--objective", "mlm", "--resume_from_checkpoint", "latest"))
    one_line_error(result, "--objective", "plm", "mlm")


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--objective", "clm", "--bi_data"], "--bi_data is a permutation-LM option"),
        (["--objective", "mlm", "--mlm_probability", "0"], "--mlm_probability must be in (0, 1)"),
        (["--objective", "bert"], "--objective"),
    ],
)
def test_flags_that_do_not_fit_stop_at_once(corpus, tmp_path, flags, message):
    one_line_error(command(PRETRAIN, *tiny_args(corpus, tmp_path, *flags)), message)
