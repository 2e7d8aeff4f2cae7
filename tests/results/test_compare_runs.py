"""main_job.compare_runs: two main-job outputs folders are the same run when everything but timings and the
pretraining budget is identical, and any other difference, in any model folder or JSON file, is named."""

import json
import subprocess
import sys

import pytest
from recipe_helpers import REPO

from main_job import compare_runs


def write_outputs(root, *, seconds=1.0, minutes=10.0):
    """A main job's outputs folder in miniature: the pretrained model, two finetuned arms, TF-IDF, the comparison."""
    for name, arm in (("pretrain", None), ("newsgroups/pretrained", 0.66), ("newsgroups/random_init", 0.47)):
        folder = root / name
        (folder / "checkpoints" / "step_8").mkdir(parents=True)
        (folder / "checkpoints" / "step_8" / "model.safetensors").write_bytes(bytes([int(seconds)]))
        (folder / "model.safetensors").write_bytes(bytes(range(64)))
        (folder / "tokenizer.json").write_text('{"model": "unigram"}')
        (folder / "metrics.jsonl").write_text(
            "\n".join(
                json.dumps(
                    {"step": step, "loss": 1.0 / step, "elapsed": seconds * step, "tokens_per_second": 9.0 / seconds}
                )
                for step in (1, 2)
            )
        )
        if arm is None:
            (folder / "results.json").write_text(
                json.dumps({"steps": 2, "max_train_minutes": minutes, "train_seconds": seconds, "eval_loss": 4.0})
            )
        else:
            (folder / "all_results.json").write_text(
                json.dumps({"test_accuracy": arm, "train_runtime_s": seconds, "test_runtime_s": seconds})
            )
            (folder / "predict_results.tsv").write_text("index\tprediction\n0\t3\n")
    (root / "newsgroups" / "tfidf.json").write_text(json.dumps({"test_accuracy": 0.688, "wall_time_s": seconds}))
    (root / "comparison.json").write_text(
        json.dumps(
            {
                "pretrained": {"test_accuracy": 0.66, "train_runtime_s": seconds},
                "pretraining": {"steps": 2, "max_train_minutes": minutes, "tokens_per_second": 9.0 / seconds},
            }
        )
    )
    return root


def test_runs_differing_in_timings_and_budget_only_are_the_same(tmp_path, capsys):
    a = write_outputs(tmp_path / "a")
    b = write_outputs(tmp_path / "b", seconds=3.0, minutes=None)
    assert compare_runs.main(a, b) == 0
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 16 and all(line.endswith("identical") for line in printed)
    assert not any("checkpoints" in line for line in printed)


@pytest.mark.parametrize(
    "changed, edit",
    [
        ("newsgroups/random_init/model.safetensors", lambda p: p.write_bytes(bytes(range(63)) + b"\xff")),
        ("pretrain/metrics.jsonl", lambda p: p.write_text(p.read_text().replace('"loss": 0.5', '"loss": 0.51'))),
        ("comparison.json", lambda p: p.write_text(p.read_text().replace('"steps": 2', '"steps": 3'))),
        ("newsgroups/pretrained/predict_results.tsv", lambda p: p.write_text("index\tprediction\n0\t4\n")),
    ],
)
def test_any_other_difference_is_named(tmp_path, capsys, changed, edit):
    a, b = write_outputs(tmp_path / "a"), write_outputs(tmp_path / "b")
    before = (b / changed).read_bytes()
    edit(b / changed)
    assert (b / changed).read_bytes() != before
    assert compare_runs.main(a, b) == 1
    different = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.endswith("DIFFERENT")]
    assert different == [changed]


def test_a_file_of_one_run_only_is_named(tmp_path, capsys):
    a, b = write_outputs(tmp_path / "a"), write_outputs(tmp_path / "b")
    (b / "newsgroups" / "tfidf.json").unlink()
    assert compare_runs.main(a, b) == 1
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("newsgroups/tfidf.json")]
    assert line.endswith(f"only in {a}")


def compare(*args):
    return subprocess.run(
        [sys.executable, "-m", "main_job.compare_runs", *map(str, args)], cwd=REPO, capture_output=True, text=True
    )


def test_a_folder_without_a_run_stops_with_one_line(tmp_path):
    a = write_outputs(tmp_path / "a")
    checkpoints_only = tmp_path / "b" / "pretrain" / "checkpoints" / "step_8"
    checkpoints_only.mkdir(parents=True)
    (checkpoints_only / "model.safetensors").write_bytes(b"0")
    for args, line in (
        ((a, tmp_path / "b"), f"{tmp_path / 'b'} holds no model.safetensors outside checkpoints"),
        ((tmp_path / "missing", a), f"{tmp_path / 'missing'} does not exist"),
    ):
        done = compare(*args)
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr.splitlines() == [f"compare_runs: error: {line}: give the outputs folders of two runs"]


def test_bad_arguments_and_broken_json_stop_with_one_line(tmp_path):
    a, b = write_outputs(tmp_path / "a"), write_outputs(tmp_path / "b")
    done = compare(a)
    assert done.returncode == 2 and done.stderr.splitlines() == [
        "usage: python -m main_job.compare_runs OUTPUTS_A OUTPUTS_B"
    ]
    (b / "comparison.json").write_text('{"pretrained": ')
    done = compare(a, b)
    assert done.returncode == 2
    assert len(done.stderr.splitlines()) == 1
    assert done.stderr.startswith("compare_runs: error: comparison.json is not valid JSON in one of the runs")
