"""Kill-proof runs: SIGKILL at named moments of both recipes (tokenizer training and save, model building, the token
store being written, a step, a checkpoint write, the metrics rewrite on resume, a metrics line, the final save, the
results), each followed by `--resume_from_checkpoint latest`, ends exactly where an uninterrupted run ends: the same
per-step losses, a complete metrics history, the same final weights and results. The kills are deterministic: the
process stops itself at a named point (xlnet_lite.training.crash_point), no wall-clock sleeps."""

import json
import os
import subprocess
import sys

import prewarmed
import pytest
from recipe_helpers import FINETUNE, PRETRAIN, sentiment_rows, write_rows
from safetensors.torch import load_file

pytestmark = pytest.mark.recipes  # runs the recipes end to end


# In order: each run is killed at its point, the next one resumes (with the next kill), the last one finishes.
PRETRAINING_KILLS = [
    "tokenizer_trained",
    "replace:tokenizer",
    "model_built",
    "token_store_chunk",
    "step@3",
    "write:metrics.jsonl",
    "checkpoint_state@1",
    "checkpoint@1",
    "metrics_append@3",
    "publish@2",
    "write:results.json",
]
FINETUNING_KILLS = [
    "step@2",
    "write:metrics.jsonl",
    "checkpoint@1",
    "metrics_append@3",
    "publish@1",
    "write:all_results.json",
]


def launch(script, args, *, crash_at=None):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("XLNET_LITE_CRASH_AT", None)
    if crash_at:
        env["XLNET_LITE_CRASH_AT"] = crash_at
    return prewarmed.run([sys.executable, script, *args], env=env, timeout=600)


def history(out):
    """Metrics records as (step, kind) -> values compared between runs (no timings)."""
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    keys = ("loss", "eval_loss", "eval_loss_no_memory", "train_loss", "eval_accuracy", "learning_rate")
    return [(r["step"], {k: r[k] for k in keys if k in r}) for r in records]


def killed_then_resumed(script, args, out, kills):
    for point in kills:
        result = launch(script, [*args, "--resume_from_checkpoint", "latest"], crash_at=point)
        assert result.returncode == -9, (
            f"{point}: the run was not killed there (exit {result.returncode})\n{result.stderr[-3000:]}"
        )
    result = launch(script, [*args, "--resume_from_checkpoint", "latest"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert not [p.name for p in out.rglob(".*tmp*")], "temporary files left behind"


def assert_same_weights(a, b):
    left, right = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert left.keys() == right.keys()
    for name in left:
        assert left[name].equal(right[name]), name


def pretraining_args(corpus, out):  # noqa: F811
    """Each output folder with a token store cache of its own (beside it): every run trains its tokenizer and writes
    its store, so the kills there are reached."""
    return [
        "--token_store_cache_dir",
        out.parent / f"{out.name}-cache",
        "--model_size",
        "tiny",
        "--train_file",
        corpus / "train.txt",
        "--validation_file",
        corpus / "valid.txt",
        "--vocab_size",
        "300",
        "--tokenizer_train_documents",
        "40",
        "--seq_len",
        "32",
        "--reuse_len",
        "16",
        "--mem_len",
        "24",
        "--per_device_train_batch_size",
        "4",
        "--per_device_eval_batch_size",
        "4",
        "--eval_batches",
        "2",
        "--max_steps",
        "8",
        "--eval_steps",
        "4",
        "--logging_steps",
        "1",
        "--checkpointing_steps",
        "2",
        "--num_warmup_steps",
        "2",
        "--learning_rate",
        "3e-3",
        "--lr_scheduler_type",
        "linear",
        "--output_dir",
        out,
    ]


@pytest.mark.slow
def test_pretraining_killed_at_every_moment_ends_as_the_uninterrupted_run(corpus, tmp_path):  # noqa: F811
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    result = launch(PRETRAIN, pretraining_args(corpus, straight))
    assert result.returncode == 0, result.stderr[-3000:]
    killed_then_resumed(PRETRAIN, pretraining_args(corpus, killed), killed, PRETRAINING_KILLS)

    assert (killed / "tokenizer" / "tokenizer.json").read_bytes() == (
        straight / "tokenizer" / "tokenizer.json"
    ).read_bytes()
    cache = tmp_path / "killed-cache"
    assert not [p.name for p in cache.glob(".*tmp*")], "a killed build left a temporary folder in the cache"
    assert len(list(cache.glob("store-*"))) == 1
    assert history(killed) == history(straight)
    assert [s for s, r in history(killed) if "loss" in r] == list(range(1, 9))  # complete, nothing twice
    assert_same_weights(killed, straight)
    drop = ("train_seconds", "tokens_per_second")
    results = [
        {k: v for k, v in json.loads((o / "results.json").read_text()).items() if k not in drop}
        for o in (killed, straight)
    ]
    assert results[0] == results[1]


@pytest.mark.slow
def test_finetuning_killed_at_every_moment_ends_as_the_uninterrupted_run(tmp_path, pretrained):  # noqa: F811
    train = write_rows(tmp_path / "train.csv", sentiment_rows(2))

    def args(out):
        return [
            "--model_name_or_path",
            pretrained,
            "--train_file",
            train,
            "--validation_file",
            train,
            "--test_file",
            train,
            "--output_dir",
            out,
            "--num_train_epochs",
            "2",
            "--per_device_train_batch_size",
            "4",
            "--learning_rate",
            "1e-3",
            "--max_seq_length",
            "16",
            "--logging_steps",
            "1",
            "--checkpointing_steps",
            "2",
        ]

    straight, killed = tmp_path / "straight", tmp_path / "killed"
    result = launch(FINETUNE, args(straight))
    assert result.returncode == 0, result.stderr[-3000:]
    killed_then_resumed(FINETUNE, args(killed), killed, FINETUNING_KILLS)

    assert history(killed) == history(straight)
    assert [s for s, r in history(killed) if "loss" in r] == list(range(1, 13))  # 6 steps per epoch
    assert_same_weights(killed, straight)
    assert (killed / "predict_results.tsv").read_text() == (straight / "predict_results.tsv").read_text()
    results = [
        {k: v for k, v in json.loads((o / "all_results.json").read_text()).items() if "runtime" not in k}
        for o in (killed, straight)
    ]
    assert results[0] == results[1]


def test_same_command_same_numbers_with_the_tokenizer_trained_in_the_run(corpus, tmp_path):  # noqa: F811
    """Pretraining twice with the same command: byte-identical tokenizer and model, identical losses."""
    outputs = []
    for name in ("a", "b"):
        result = launch(PRETRAIN, pretraining_args(corpus, tmp_path / name) + ["--max_steps", "4"])
        assert result.returncode == 0, result.stderr[-3000:]
        out = tmp_path / name
        outputs.append((history(out), (out / "model.safetensors").read_bytes(), (out / "tokenizer.json").read_bytes()))
    assert outputs[0] == outputs[1]


def test_finetuning_with_two_processes_twice_gives_the_same_numbers(tmp_path, pretrained):  # noqa: F811
    train = write_rows(tmp_path / "train.csv", sentiment_rows(2))
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "HF_HOME": str(tmp_path / "hf")}
    runs = []
    for name in ("a", "b"):
        out = tmp_path / name
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            FINETUNE,
            "--model_name_or_path",
            str(pretrained),
            "--train_file",
            train,
            "--validation_file",
            train,
            "--test_file",
            train,
            "--output_dir",
            str(out),
            "--num_train_epochs",
            "2",
            "--per_device_train_batch_size",
            "2",
            "--learning_rate",
            "1e-3",
            "--max_seq_length",
            "16",
            "--logging_steps",
            "1",
        ]
        result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-4000:]
        results = {k: v for k, v in json.loads((out / "all_results.json").read_text()).items() if "runtime" not in k}
        runs.append(
            (history(out), results, (out / "predict_results.tsv").read_text(), (out / "model.safetensors").read_bytes())
        )
    assert runs[0] == runs[1]
    assert len(runs[0][2].splitlines()) == 1 + 24  # every test row predicted once, in order, across both ranks
