"""benchmarks.objectives end to end at tiny settings: both kinds of arm (the recipe's objectives, here the permutation
LM with random init and TF-IDF beside it; transformers' BERT) pretrain, finetune (on the small embedded news task
here), are probed (linear probes of the frozen models) and land in the table; the committed records are what a later
run reuses, and a model that is missing is trained again to the record's loss. Every arm of the grid is a valid run
of the recipe."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from recipe_helpers import REPO, tiny_args

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
    monkeypatch.setattr(objectives, "precision", lambda: "fp32")  # the folders' key; the runs pick their own
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


def committed(runs, tmp_path):
    """The files of `runs` that git would commit under benchmarks/results/objective_runs (the repository's
    .gitignore in a scratch repository); every other file is deleted, as a clone of the repository lacks it."""
    scratch = tmp_path / "scratch"
    shutil.copytree(runs, scratch / "benchmarks" / "results" / "objective_runs")
    shutil.copy(REPO / ".gitignore", scratch / ".gitignore")
    git = ["git", "-C", str(scratch), "-c", "core.excludesFile=/dev/null"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    listed = subprocess.run([*git, "ls-files"], check=True, capture_output=True, text=True).stdout.split()
    kept = {Path(p).relative_to("benchmarks/results/objective_runs") for p in listed if p != ".gitignore"}
    for path in sorted(runs.rglob("*"), reverse=True):
        if path.is_file() and path.relative_to(runs) not in kept:
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()
    return kept


def test_every_kind_of_arm_pretrains_finetunes_and_lands_in_the_table(tiny_benchmark):
    runs = tiny_benchmark / "runs"
    objectives.main(["finetune", *ARMS, "--labels_per_class", "20", "--threads", "1"])
    table = objectives.main(["table"])
    rows = {row["arm"]: row for row in table["arms"]}
    assert sorted(rows) == sorted(ARMS)
    assert [rows[a]["steps"] for a in ARMS] == [4, 5]  # each objective's equal-compute steps
    random_init = table["baselines"]["20"]["random_init"]
    assert random_init["n"] == 1 and "tfidf" in table["baselines"]["20"]
    for arm in ARMS:
        assert rows[arm]["20"]["test"]["n"] == 1 and rows[arm]["20"]["learning_rate"] == 3e-4
        record = json.loads((objectives.folder(arm, 10) / "pretrain" / "record.json").read_text())
        assert record["threads"] == 1 and record["command"].endswith(f"pretrain {arm} --budget 10 --threads 1")
    plm = json.loads((objectives.folder("plm_lr6e-4", 10) / "pretrain" / "run_args.json").read_text())
    assert plm["objective"] == "plm" and plm["learning_rate"] == 6e-4 and plm["max_steps"] == 4
    # linear probes of the frozen models, the untrained architecture beside plm_lr6e-4
    objectives.main(["probe", *ARMS, "--labels_per_class", "20", "--threads", "1"])
    plm_probe = json.loads((objectives.folder("plm_lr6e-4", 10) / "probe_20.json").read_text())
    assert sorted(plm_probe) == ["pretrained", "random_init"] and plm_probe["random_init"]["random_init"]
    features = {f"mean_layer_{i}" for i in range(3)} | {"read_token_last_layer"}  # the tiny model's 2 layers
    assert set(plm_probe["pretrained"]["probes"]) == features and plm_probe["pretrained"]["max_len"] == 32
    bert_probe = json.loads((objectives.folder("bert_lr6e-4", 10) / "probe_20.json").read_text())
    assert sorted(bert_probe) == ["pretrained"] and bert_probe["pretrained"]["kind"] == "bert"
    table = objectives.main(["table"])
    rows = {row["arm"]: row for row in table["arms"]}
    for arm, probed in (("plm_lr6e-4", plm_probe), ("bert_lr6e-4", bert_probe)):
        best = probed["pretrained"]["best_on_validation"]
        assert rows[arm]["20"]["probe"] == {"features": best, **probed["pretrained"]["probes"][best]}
    assert table["baselines"]["20"]["random_init_probe"]["features"] == plm_probe["random_init"]["best_on_validation"]
    markdown = (tiny_benchmark / "objectives_fp32_news_topic.md").read_text()
    assert all(f"| {arm} |" in markdown for arm in ARMS) and "| tfidf |" in markdown
    assert "| linear probe, 20 per group |" in markdown
    by_layer = markdown.split("Linear probes, 20 training texts per group")[1]
    assert all(f"| {name} | " in by_layer for name in ("plm_lr6e-4", "random_init", "bert_lr6e-4"))
    assert (tiny_benchmark / "objectives_fp32_news_topic.png").stat().st_size > 10_000  # the plot

    # a clone holds the records, not the models
    kept = committed(runs, tiny_benchmark)
    names = {p.name for p in kept}
    assert {"results.json", "record.json", "run_args.json", "finetune_20.json", "probe_20.json"} <= names
    assert not names & {"model.safetensors", "config.json", "tokenizer.json", "metrics.jsonl", "loss.png"}
    assert not [p for p in kept if "checkpoints" in p.parts]
    records = {p: (runs / p).read_text() for p in kept}
    # finetuning its records cover runs nothing, and the table is the same
    objectives.main(["finetune", *ARMS, "--labels_per_class", "20", "--threads", "1"])
    objectives.main(["probe", *ARMS, "--labels_per_class", "20", "--threads", "1"])
    assert not list(runs.rglob("model.safetensors"))
    objectives.main(["table"])
    assert (tiny_benchmark / "objectives_fp32_news_topic.md").read_text() == markdown
    # more seeds need the model: trained again; the committed records stay, the new run is noted
    objectives.main(["finetune", "bert_lr6e-4", "--labels_per_class", "20", "--seeds", "0", "1", "--threads", "1"])
    objectives.pretrain("plm_lr6e-4", 10, threads=1)
    for arm in ARMS:
        pretrain = objectives.folder(arm, 10) / "pretrain"
        assert (pretrain / "model.safetensors").is_file()
        for name in ("results.json", "run_args.json"):  # BERT's run writes no run_args.json
            if pretrain.relative_to(runs) / name in records:
                assert (pretrain / name).read_text() == records[pretrain.relative_to(runs) / name]
        record = json.loads((pretrain / "record.json").read_text())
        (again,) = record["pretrained_again"]
        assert again["eval_loss"] == pytest.approx(json.loads((pretrain / "results.json").read_text())["eval_loss"])
    assert all((runs / p).read_text() == text for p, text in records.items() if p.parent.name == "finetune_20")
    bert = json.loads((objectives.folder("bert_lr6e-4", 10) / "finetune_20.json").read_text())
    assert [r["seed"] for r in bert["runs"]] == [0, 1]  # seed 0 reused, not run twice


def test_every_arm_of_the_grid_is_a_valid_run_of_the_recipe(tmp_path):
    from pretrain.run_pretraining import PretrainingArguments, check_args
    from xlnet_lite.training import parse_args

    grid = [arm for arm in objectives.ARMS if arm not in objectives.WHY_ARMS]
    assert len(grid) == 4 * 3 * 3  # objectives x rates x (constant, linear, own lever)
    rates = objectives.LEARNING_RATES
    why = [f"{o}_lr{lr}_{lever}" for o, lever in (("plm", "p67"), ("clm", "bf16time"), ("clm", "bi")) for lr in rates]
    seeded = [f"{a}_seed{seed}" for a in grid + why if a.split("_")[0] in ("plm", "clm", "mlm") for seed in (1, 2)]
    assert sorted(objectives.WHY_ARMS) == sorted(why + seeded)
    assert objectives.ARMS["mlm_lr6e-4_m30_seed1"] == (
        "mlm",
        ["--learning_rate", "6e-4", "--mlm_probability", "0.3", "--seed", "1"],
    )
    for arm, (objective, flags) in objectives.ARMS.items():
        assert arm.startswith(objective) and flags[:2] == ["--learning_rate", arm.split("_")[1][2:]]
        if objective != "bert":
            args = parse_args(PretrainingArguments, [*objectives.recipe_flags(objective, str(tmp_path)), *flags])
            check_args(args)
            assert args.objective == objective
    assert PretrainingArguments.__dataclass_fields__["seed"].default == objectives.RECIPE_SEED


def test_a_lever_of_finetuning_finetunes_the_points_own_model(tmp_path, monkeypatch):
    """`<point>_bi` trains nothing: it finetunes `<point>`'s model (seeds too) with run_glue.py --attn_type bi, kept
    in its own folder; its probes are the point's."""
    from benchmarks import bench_newsgroups
    from finetune.run_glue import FinetuneArguments
    from xlnet_lite.training import parse_args

    monkeypatch.setattr(objectives, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(objectives, "precision", lambda: "bf16")
    for point in ("clm_lr6e-4", "clm_lr6e-4_seed1"):
        model = objectives.folder(point, 10) / "pretrain"
        model.mkdir(parents=True)
        (model / "model.safetensors").write_text("")
        (model / "results.json").write_text("{}")
    calls = []
    monkeypatch.setattr(bench_newsgroups, "main", lambda argv: calls.append(argv))
    for arm, point in (("clm_lr6e-4_bi", "clm_lr6e-4"), ("clm_lr6e-4_bi_seed1", "clm_lr6e-4_seed1")):
        assert objectives.pretrained_arm(arm) == point and arm in objectives.WHY_ARMS
        objectives.finetune(arm, 10, "50", [0, 1], ["3e-4"])
        argv = calls.pop()
        assert argv[argv.index("--pretrained") + 1] == str(objectives.folder(point, 10) / "pretrain")
        assert argv[argv.index("--runs_dir") + 1] == str(objectives.folder(arm, 10) / "finetune_50")
        flags = argv[argv.index("--finetune_flags") + 1].split()
        assert flags[-2:] == ["--attn_type", "bi"] and argv[argv.index("--labels_per_class") + 1] == "50"
        assert parse_args(FinetuneArguments, flags).attn_type == "bi"
        with pytest.raises(SystemExit, match=f"{arm} finetunes {point}'s model: probe {point}"):
            objectives.probe(arm, 10, "50")
    objectives.finetune("clm_lr6e-4", 10, "50", [0], ["3e-4"])
    argv = calls.pop()
    assert "--attn_type" not in argv[argv.index("--finetune_flags") + 1]  # the entry finetunes as it pretrained


def test_each_objectives_entry_is_its_best_point_on_validation():
    def row(arm, validation=None):
        found = {} if validation is None else {"50": {"test": {}, "validation": {"values": [validation, 0.1]}}}
        return {"arm": arm, "objective": arm.split("_")[0], **found}

    rows = [row("plm_lr3e-4", 0.70), row("plm_lr6e-4", 0.73), row("plm_lr1e-3", 0.73), row("mlm_lr6e-4", 0.6)]
    rows += [row("clm_lr6e-4"), row("mlm_lr1e-3", 0.68), row("plm_lr6e-4_p67", 0.9)]  # outside the grid
    assert objectives.entries(rows) == {"plm": "plm_lr6e-4", "mlm": "mlm_lr1e-3"}  # the first on ties; seed 0's


def test_pretraining_seeds_are_summarised_over_the_models_finetuning_seed_zero():
    def row(arm, validation, test):  # finetuning seeds 0, 1: only seed 0's figures count
        return {"arm": arm, "50": {"validation": {"values": [validation, 0.0]}, "test": {"values": [test, 0.0]}}}

    rows = [row("plm_lr6e-4", 0.7, 0.6), row("plm_lr6e-4_seed2", 0.6, 0.5), row("plm_lr6e-4_seed1", 0.8, 0.4)]
    rows += [row("clm_lr6e-4", 0.7, 0.6), row("plm_lr1e-3_seed1", 0.5, 0.5), {"arm": "mlm_lr6e-4_seed1"}]
    seeds = objectives.pretraining_seeds(rows)
    assert list(seeds) == ["plm_lr6e-4"]  # a single pretraining seed, or a seed without its recipe's, is no row
    assert {s: seeds["plm_lr6e-4"][s] for s in ("42", "1", "2")} == {"42": [0.7, 0.6], "1": [0.8, 0.4], "2": [0.6, 0.5]}
    assert seeds["plm_lr6e-4"]["validation"] == pytest.approx({"mean": 0.7, "std": 0.1, "n": 3})
    assert seeds["plm_lr6e-4"]["test"] == pytest.approx({"mean": 0.5, "std": 0.1, "n": 3})
    table = "\n".join(objectives.seed_table(seeds))
    assert (
        "| plm_lr6e-4 | 0.700 / 0.600 | 0.800 / 0.400 | 0.600 / 0.500 | 0.700 ± 0.100 / 0.500 ± 0.100 (n=3) |" in table
    )
    assert objectives.seed_table({}) == [] and objectives.pretraining_seeds(rows, "20") == {}
    rows = [{"arm": row["arm"], "20": row["50"]} for row in rows if "50" in row]
    assert objectives.pretraining_seeds(rows, "20") == seeds  # at any number of labels that ran
    assert "Pretraining seeds, 20 labels per group:" in objectives.seed_table(seeds, "20")[1]


def test_a_held_out_task_pretrains_on_its_own_text_and_compares_twenty_newsgroups_entries(tmp_path, monkeypatch):
    from xlnet_lite.classification_data import EMBEDDED_TASKS
    from xlnet_lite.pretraining import EMBEDDED_CORPORA

    assert sorted(objectives.TASKS) == sorted(EMBEDDED_TASKS)
    assert all(corpus in EMBEDDED_CORPORA for corpus, _ in objectives.TASKS.values())
    monkeypatch.setattr(objectives, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(objectives, "TABLE", tmp_path / "objectives")
    monkeypatch.setattr(objectives, "precision", lambda: "bf16")
    assert objectives.folder("plm_lr6e-4", 10) == tmp_path / "runs" / "plm_lr6e-4_10min_bf16"
    chosen = {"plm": "plm_lr3e-4", "clm": "clm_lr6e-4"}
    monkeypatch.setattr(objectives, "TASK", "rotten_tomatoes")
    assert objectives.folder("clm_lr6e-4", 30) == tmp_path / "runs" / "clm_lr6e-4_30min_bf16_rotten_tomatoes"
    assert objectives.recipe_flags("clm", "out")[:2] == ["--embedded_corpus", "rotten_tomatoes"]
    assert objectives.reference_arm() == "plm_lr6e-4"  # before the entries are chosen
    (tmp_path / "objectives_bf16.json").write_text(json.dumps({"entries": chosen}))
    assert objectives.reference_arm() == "plm_lr3e-4" and objectives._models("plm_lr3e-4")[1] == "random_init"
    assert objectives.reference_arm("fp32") == "plm_lr6e-4"  # an fp32 grid has its own entries
    monkeypatch.setattr(objectives, "TASK", "newsgroups")
    assert objectives.reference_arm() == "plm_lr6e-4" and objectives._models("plm_lr3e-4") == ["pretrained"]
    assert objectives.recipe_flags("plm", "out")[:2] == ["--embedded_corpus", "newsgroups"]


def test_a_longer_budget_shows_the_entries_the_choosing_budget_chose_in_its_own_table(tmp_path, monkeypatch):
    monkeypatch.setattr(objectives, "TABLE", tmp_path / "objectives")
    rows = [
        {"arm": arm, "objective": arm[:3], "50": {"test": {}, "validation": {"values": [score]}}}
        for arm, score in (("plm_lr6e-4", 0.7), ("plm_lr1e-3", 0.8), ("clm_lr6e-4", 0.6))
    ]
    assert objectives.table_path(10, "bf16") == tmp_path / "objectives_bf16"
    assert objectives.table_path(30, "bf16") == tmp_path / "objectives_bf16_30min"
    assert objectives.shown_entries(rows, 10, "bf16") == {"plm": "plm_lr1e-3", "clm": "clm_lr6e-4"}
    assert objectives.shown_entries(rows, 30, "bf16") == {}  # before the choosing budget's table is written
    (tmp_path / "objectives_bf16.json").write_text(json.dumps({"entries": {"plm": "plm_lr6e-4", "mlm": "mlm_lr3e-4"}}))
    assert objectives.shown_entries(rows, 30, "bf16") == {"plm": "plm_lr6e-4"}  # chosen at 10 minutes, where it ran
    assert objectives._models("plm_lr6e-4") == ["pretrained", "random_init"]
    assert objectives._models("plm_lr6e-4", 30) == ["pretrained"]  # random init is the same at any budget
    monkeypatch.setattr(objectives, "TASK", "news_topic")
    assert objectives.table_path(30, "bf16") == tmp_path / "objectives_bf16_30min_news_topic"
    assert objectives.shown_entries(rows, 10, "bf16") == {"plm": "plm_lr6e-4"}


def test_a_lever_that_changes_a_steps_cost_trains_for_its_own_equal_time_steps(tmp_path, monkeypatch):
    cost = {"steps": {"10": {"plm": 3060, "mlm": 3915, "clm": 2791, "bert": 3445}}}
    cost["flops_per_step"] = {"plm": 6.6e10, "mlm": 5.8e10, "clm": 7.7e10, "bert": 6.5e10}
    monkeypatch.setattr(objectives, "STEP_COST", tmp_path / "step_cost.json")
    (tmp_path / "step_cost.json").write_text(json.dumps(cost))
    keys = {arm: objectives.cost_key(arm) for arm in objectives.ARMS}
    assert {k for k in keys.values() if k not in cost["steps"]["10"]} == set(objectives.COSTED_LEVERS)
    assert keys["plm_lr6e-4_p6"] == "plm_p6" and keys["bert_lr3e-4_m30"] == "bert_m30"
    assert keys["clm_lr6e-4_cosine"] == "clm" and keys["mlm_lr1e-3_linear"] == "mlm"  # a schedule costs nothing
    assert keys["mlm_lr6e-4_m30_seed2"] == "mlm_m30" and keys["plm_lr6e-4_seed1"] == "plm"  # a seed neither
    assert objectives.arm_steps("mlm_lr1e-3_linear", 10) == 3915
    with pytest.raises(SystemExit, match="no step cost of plm_p67: run .*step_cost --levers"):
        objectives.arm_steps("plm_lr6e-4_p67", 10)
    cost["levers"] = {key: {"steps": {"10": 1000 + i}} for i, key in enumerate(objectives.COSTED_LEVERS)}
    (tmp_path / "step_cost.json").write_text(json.dumps(cost))
    for arm, key in keys.items():
        if "_bf16time" in arm:  # below
            continue
        expected = cost["levers"][key]["steps"]["10"] if key in cost["levers"] else cost["steps"]["10"][key]
        assert objectives.arm_steps(arm, 10) == expected
    monkeypatch.setattr(objectives, "STEP_COST_BF16", tmp_path / "step_cost_bf16.json")
    with pytest.raises(SystemExit, match="step_cost_bf16.json is missing: run .*step_cost --out .*step_cost_bf16.json"):
        objectives.arm_steps("clm_lr6e-4_bf16time", 10)
    bf16 = {"steps": {"10": {**cost["steps"]["10"], "clm": 2459}}, "flops_per_step": cost["flops_per_step"]}
    (tmp_path / "step_cost_bf16.json").write_text(json.dumps(bf16))
    assert objectives.arm_steps("clm_lr6e-4_bf16time", 10) == 2459  # the causal LM timed in bf16
    assert (
        objectives.arm_steps("clm_lr6e-4", 10) == 2791 and objectives.arm_steps("clm_lr6e-4_bf16time_seed2", 10) == 2459
    )


def linear_output_dtypes(run):
    """run()'s result, and the dtypes of every torch.nn.Linear output while it ran."""
    import torch

    seen = set()
    hook = torch.nn.modules.module.register_module_forward_hook(
        lambda module, _, out: seen.add(out.dtype) if isinstance(module, torch.nn.Linear) else None
    )
    try:
        return run(), seen
    finally:
        hook.remove()


@pytest.mark.parametrize("mixed_precision", ["no", "bf16"])
def test_the_bert_arms_train_and_finetune_in_the_precision_they_are_given(
    pretrained, tmp_path, mixed_precision, one_thread
):
    """The BERT arms run in the precision the recipes pick on the machine (bf16 autocast, as accelerate's), so a bf16
    grid compares like with like: every Linear's output in training, evaluation and finetuning has its dtype."""
    import datasets
    import torch
    from recipe_helpers import BAD, GOOD
    from transformers import AutoTokenizer

    from benchmarks.baselines import bert_mlm
    from xlnet_lite.classification_data import Split

    tokenizer = AutoTokenizer.from_pretrained(pretrained)
    texts = [" ".join(GOOD + BAD)] * 4
    results, seen = linear_output_dtypes(
        lambda: bert_mlm.pretrain_mlm(
            texts,
            tokenizer,
            model_size=str(pretrained),
            max_steps=2,
            learning_rate=1e-3,
            output_dir=str(tmp_path / "bert"),
            batch_size=2,
            seq_len=16,
            eval_texts=texts[:1],
            mixed_precision=mixed_precision,
            log=lambda *_: None,
        )
    )
    dtype = torch.bfloat16 if mixed_precision == "bf16" else torch.float32
    assert seen == {dtype} and results["mixed_precision"] == mixed_precision
    assert results["steps"] == 2 and results["eval_mlm_loss"] > 0

    def labelled(texts):
        data = datasets.Dataset.from_dict({"sentence": texts, "label": [int(t in BAD) for t in texts]})
        return Split(data, "reviews")

    splits = {name: labelled(GOOD + BAD) for name in ("train", "validation", "test")}
    bert_tokenizer = AutoTokenizer.from_pretrained(tmp_path / "bert")
    record, seen = linear_output_dtypes(
        lambda: bert_mlm.finetune_bert_classifier(
            str(tmp_path / "bert"),
            bert_tokenizer,
            splits,
            seed=0,
            epochs=1,
            max_seq_length=16,
            mixed_precision=mixed_precision,
        )
    )
    assert seen == {dtype} and record["mixed_precision"] == mixed_precision
    assert 0 <= record["test_accuracy"] <= 1
    with pytest.raises(ValueError, match="mixed_precision"):
        bert_mlm.finetune_bert_classifier(
            str(tmp_path / "bert"), bert_tokenizer, splits, seed=0, mixed_precision="fp16"
        )


def test_step_cost_times_each_objective_in_the_machines_precision_into_the_file_asked(tiny_benchmark, monkeypatch):
    """`step_cost --out FILE` measures every objective (in bf16 autocast where the recipes pick bf16) and writes FILE,
    leaving the step-cost file that every run's steps come from as it was."""
    import torch

    committed = objectives.STEP_COST.read_text()
    monkeypatch.setattr(objectives, "precision", lambda: "bf16")
    out = tiny_benchmark / "check.json"
    argv = ["step_cost", "--rounds", "1", "--steps", "1", "--threads", "1", "--out", str(out)]
    _, seen = linear_output_dtypes(lambda: objectives.main(argv))
    assert seen == {torch.bfloat16} and objectives.STEP_COST.read_text() == committed
    result = json.loads(out.read_text())
    assert result["mixed_precision"] == "bf16" and sorted(result["steps"]["10"]) == ["bert", "clm", "mlm", "plm"]
    assert result["steps"]["10"]["plm"] == objectives.MAIN_JOB_STEPS[10]
    assert result["scored_tokens_per_step"]["clm"] > result["scored_tokens_per_step"]["plm"] > 0
    # BERT at the XLNet arms' size, rows and batch (here the tests' tiny ones; the recipe's defaults in the benchmark):
    # a step of the same order of FLOPs as the permutation LM's (a `small` BERT's would be ~100x the tiny model's)
    assert result["batch"].startswith("4 x 32 tokens, memory 24 (BERT: none), tiny preset")
    assert result["tokens_per_step"] == 128 and 0.2 < result["relative_flops"]["bert"] < 5
