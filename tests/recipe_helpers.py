"""What the recipe tests share: the recipes' paths, tiny arguments and data, and how a command is run and judged."""

import contextlib
import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import prewarmed
import pytest

from finetune import run_glue

REPO = Path(__file__).resolve().parents[1]
PRETRAIN = str(REPO / "pretrain" / "run_pretraining.py")
FINETUNE = str(REPO / "finetune" / "run_glue.py")

# A tiny classifier and its sentiment data (the `pretrained` fixture in conftest.py)
CLASSIFIER_TINY = dict(d_model=32, n_layer=2, n_head=4, d_inner=64, dropout=0.0, summary_last_dropout=0.0, mem_len=None)
GOOD = [
    "a wonderful film",
    "great acting and a moving story",
    "i loved every minute",
    "a delight from start to end",
    "the best movie of the year",
    "funny and warm",
]
BAD = [
    "a dull mess",
    "boring and far too long",
    "i hated the ending",
    "the worst script in years",
    "a tedious waste of time",
    "flat and lifeless",
]


def tiny_args(corpus, output_dir, *extra):
    """The pretraining recipe on the `corpus` fixture: the tiny preset, 12 steps, checkpoints at 6 and 12."""
    return [
        "--model_size",
        "tiny",
        "--train_file",
        str(corpus / "train.txt"),
        "--validation_file",
        str(corpus / "valid.txt"),
        "--tokenizer_name",
        str(corpus / "tokenizer"),
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
        "3",
        "--max_steps",
        "12",
        "--eval_steps",
        "6",
        "--logging_steps",
        "1",
        "--checkpointing_steps",
        "6",
        "--num_warmup_steps",
        "2",
        "--learning_rate",
        "3e-3",
        "--output_dir",
        str(output_dir),
        "--lr_scheduler_type",
        "linear",  # a rate that changes every step: a resumed run must restore the schedule
        *extra,
    ]


def read_metrics(output_dir):
    return [json.loads(line) for line in Path(output_dir, "metrics.jsonl").read_text().splitlines()]


def cut_at_step_6(straight, resumed):
    """`resumed` as a run of `straight` (tiny_args) killed after its step-6 checkpoint: that checkpoint and the
    first six steps' metrics; `--resume_from_checkpoint latest` continues it."""
    (resumed / "checkpoints").mkdir(parents=True)
    shutil.copytree(straight / "checkpoints" / "step_6", resumed / "checkpoints" / "step_6")
    first_half = [m for m in read_metrics(straight) if m["step"] <= 6]
    (resumed / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in first_half))


def assert_same_losses(expected, actual):
    """Two runs logged the same steps with the same training (and validation) losses, within 1e-5."""
    assert [m["step"] for m in actual] == [m["step"] for m in expected]
    for a, b in zip(expected, actual):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5), a["step"]
        if "eval_loss" in a:
            assert a["eval_loss"] == pytest.approx(b["eval_loss"], abs=1e-5)


def small_args(corpus, out, *extra):
    """The tiny recipe at a global batch of 4 rows (2 per process): 4 steps, a checkpoint every 2, a learning rate
    that a run stopped at step 2 shares (warmup, then constant)."""
    args = tiny_args(corpus, out, "--lr_scheduler_type", "constant_with_warmup", *extra)
    for name, value in (("per_device_train_batch_size", "2"), ("per_device_eval_batch_size", "2")):
        args[args.index(f"--{name}") + 1] = value
    for name, value in (("max_steps", "4"), ("eval_steps", "4"), ("checkpointing_steps", "2"), ("eval_batches", "2")):
        args[args.index(f"--{name}") + 1] = value
    return args


def write_rows(path, rows):
    """rows (dicts) as CSV, TSV or JSON lines by the suffix; returns the path as a string."""
    path = Path(path)
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]), delimiter="\t" if path.suffix == ".tsv" else ",")
            writer.writeheader()
            writer.writerows(rows)
    return str(path)


def sentiment_rows(repeat=2, label=lambda good: "pos" if good else "neg"):
    return [
        {"sentence": s, "label": label(good)}
        for _ in range(repeat)
        for good, group in ((True, GOOD), (False, BAD))
        for s in group
    ]


def run(tmp_path, model, *extra, epochs=2):
    """The finetuning recipe in this process; (results, output_dir)."""
    out = tmp_path / "out"
    args = [
        "--model_name_or_path",
        str(model),
        "--output_dir",
        str(out),
        "--num_train_epochs",
        str(epochs),
        "--per_device_train_batch_size",
        "4",
        "--per_device_eval_batch_size",
        "5",
        "--learning_rate",
        "1e-3",
        "--max_seq_length",
        "16",
        *extra,
    ]
    return run_glue.main(args), out


def cli(script, *args, env=None, cwd=None, timeout=300):
    """A recipe as a command, `python script args`, in a process of its own (forked from a warm one where the
    environment allows: tests/prewarmed.py)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return prewarmed.run([sys.executable, script, *args], env=env, cwd=cwd, timeout=timeout)


def run_recording_python3(script, cwd, **env):
    """A bash script of the repository (the GPU commands) run in `cwd` with a `python3` on PATH that only records
    its arguments (no GPU, no run). Returns the finished process and each python3 call's arguments."""
    bin_dir, calls = cwd / "bin", cwd / "calls"
    bin_dir.mkdir(exist_ok=True)
    calls.mkdir(exist_ok=True)
    fake = bin_dir / "python3"
    fake.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "$(mktemp -p "$CALLS")"\n')
    fake.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "CALLS": str(calls), **env}
    done = subprocess.run(["bash", str(REPO / script)], capture_output=True, text=True, cwd=cwd, env=env)
    return done, [f.read_text().splitlines() for f in calls.iterdir()]


def command(script, *args):
    """A recipe's command line in this process, judged like `cli`'s: what `python script args` writes to stdout and
    stderr and its exit status, through the same entry point (xlnet_lite.training.exit_on_recipe_error), without the
    fresh interpreter's imports (about 8 s on 2 cores). Not captured: logging handlers made earlier with the original
    stderr, and warnings (pytest's). The error-path tests run the variants of one kind of bad input here and one of
    them through `cli` as a real command."""
    from pretrain import run_pretraining
    from xlnet_lite import training

    module = run_pretraining if script == PRETRAIN else run_glue
    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            training.exit_on_recipe_error(module.main, [str(a) for a in args], Path(script).name)
        except SystemExit as stop:  # as the interpreter ends: None is 0, a message is printed and is 1
            code = 0 if stop.code is None else stop.code if isinstance(stop.code, int) else 1
            if not isinstance(stop.code, (int, type(None))):
                print(stop.code, file=sys.stderr)
    return subprocess.CompletedProcess([sys.executable, script, *map(str, args)], code, out.getvalue(), err.getvalue())


def one_line_error(result, *fragments, status=2):
    """The command stopped with exit status `status` and one `error:` line naming what is wrong, no traceback."""
    assert result.returncode == status, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, result.stderr[-2000:]
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]
