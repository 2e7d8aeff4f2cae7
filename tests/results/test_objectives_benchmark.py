"""benchmarks.objectives end to end at tiny settings: both kinds of arm (the recipe's objectives, here the permutation
LM with random init and TF-IDF beside it; transformers' BERT) pretrain, finetune (on the small embedded news task
here) and land in the table; the committed records are what a later run reuses, and a model that is missing is
trained again to the record's loss. Every arm of the grid is a valid run of the recipe."""

import json

import pytest
from recipe_helpers import tiny_args

from benchmarks import objectives

pytestmark = pytest.mark.recipes

ARMS = ("plm_lr6e-4", "bert_lr6e-4")


@pytest.fixture
def tiny_benchmark(corpus, tmp_path, monkeypatch):
    steps = {"plm": 4, "mlm": 5, "clm": 4, "bert": 5}
    cost = {"steps": {"10": steps}, "flops_per_step": {o: 1e9 for o in steps}}
    (tmp_path / "step_cost.json").write_text(json.dumps(cost))
    monkeypatch.setattr(objectives, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(objectives, "STEP_COST", tmp_path / "step_cost.json")
    monkeypatch.setattr(objectives, "TABLE", tmp_path / "objectives")
    monkeypatch.setattr(objectives, "EPOCHS", {"20": 1, "50": 1, "all": 1})
    monkeypatch.setattr(objectives, "TASK", "news_topic")
    monkeypatch.setattr(objectives, "FINETUNE_FLAGS", "--max_seq_length 32")

    def recipe_flags(objective, output_dir):
        flags = tiny_args(corpus, output_dir, "--objective", objective)
        for name in ("--max_steps", "--learning_rate", "--lr_scheduler_type"):  # the benchmark's to set
            del flags[flags.index(name) : flags.index(name) + 2]
        return flags

    monkeypatch.setattr(objectives, "recipe_flags", recipe_flags)
    return tmp_path


def test_every_kind_of_arm_pretrains_finetunes_and_lands_in_the_table(tiny_benchmark):
    runs = tiny_benchmark / "runs"
    objectives.main(["finetune", *ARMS, "--labels_per_class", "20", "--threads", "1"])
    table = objectives.main(["table"])
    rows = {row["arm"]: row for row in table["arms"]}
    assert sorted(rows) == sorted(ARMS)
    assert [rows[a]["steps"] for a in ARMS] == [4, 5]  # each objective's equal-compute steps
    for arm in ARMS:
        test = rows[arm]["20"]["test"]
        assert test["n"] == 1 and all(0 <= v <= 1 for v in test["values"])
        assert rows[arm]["20"]["gain"] == pytest.approx(test["mean"] - table["baselines"]["20"]["random_init"]["mean"])
        assert (runs / f"{arm}_10min" / "pretrain" / "record.json").is_file()
    assert "50" not in rows["plm_lr6e-4"]
    plm = json.loads((runs / "plm_lr6e-4_10min" / "pretrain" / "run_args.json").read_text())
    assert plm["objective"] == "plm" and plm["learning_rate"] == 6e-4 and plm["max_steps"] == 4
    markdown = (tiny_benchmark / "objectives.md").read_text()
    assert all(f"| {arm} |" in markdown for arm in ARMS) and "| tfidf |" in markdown

    # a clone holds the records, not the models: finetuning records are reused, a missing model is trained again
    before = {p: p.read_text() for p in runs.rglob("*.json") if "finetune_20/" in str(p)}
    pretrained = runs / "plm_lr6e-4_10min" / "pretrain"
    recorded = json.loads((pretrained / "results.json").read_text())
    (pretrained / "model.safetensors").unlink()
    objectives.main(["finetune", "plm_lr6e-4", "--labels_per_class", "20"])
    assert (pretrained / "model.safetensors").is_file()
    assert json.loads((pretrained / "results.json").read_text())["eval_loss"] == pytest.approx(recorded["eval_loss"])
    assert {p: p.read_text() for p in before} == before


def test_every_arm_of_the_grid_is_a_valid_run_of_the_recipe(tmp_path):
    from pretrain.run_pretraining import PretrainingArguments, check_args
    from xlnet_lite.training import parse_args

    assert len(objectives.ARMS) == 4 * 3 * 3  # objectives x rates x (constant, linear, own lever)
    for arm, (objective, flags) in objectives.ARMS.items():
        assert arm.startswith(objective) and flags[:2] == ["--learning_rate", arm.split("_")[1][2:]]
        if objective != "bert":
            args = parse_args(PretrainingArguments, [*objectives.recipe_flags(objective, str(tmp_path)), *flags])
            check_args(args)
            assert args.objective == objective
