"""`--mixed_precision auto` (the recipes' default): bf16 where the hardware has bf16 units, fp32 elsewhere; a
precision given to the recipe, then one given to `accelerate launch`, wins; the choice is printed and recorded."""

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import prewarmed
import pytest
import torch

from xlnet_lite import precision
from xlnet_lite.precision import cpu_bf16_units, launcher_precision, resolve_precision
from xlnet_lite.tokenization_xlnet_lite import train_tokenizer
from xlnet_lite.training.cpu_allocator import glibc, user_malloc_settings

REPO = Path(__file__).resolve().parents[2]
WORDS = "the a of river stone light market city green slow quick north south music paper glass tree old new".split()


def fake_cpu(monkeypatch, units):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: "AMX" in units)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: "AVX512-BF16" in units)


@pytest.mark.parametrize("units", [(), ("AMX",), ("AVX512-BF16",), ("AMX", "AVX512-BF16")])
def test_auto_is_bf16_exactly_where_the_cpu_has_bf16_units(monkeypatch, units):
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    fake_cpu(monkeypatch, units)
    chosen, why = resolve_precision("auto", "cpu")
    assert chosen == ("bf16" if units else "no")
    assert why.startswith("auto: ") and all(unit in why for unit in units)


@pytest.mark.parametrize("launched", ["bf16", "fp16", "no"])
@pytest.mark.parametrize("requested", ["no", "bf16"])
def test_the_recipe_flag_wins_over_the_launcher_and_the_hardware(monkeypatch, requested, launched):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", launched)
    fake_cpu(monkeypatch, ("AMX",))
    assert resolve_precision(requested, "cpu") == (requested, f"--mixed_precision {requested}")


def test_a_launcher_precision_wins_over_auto(monkeypatch):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    fake_cpu(monkeypatch, ())
    assert resolve_precision("auto", "cpu")[0] == "fp16"


@pytest.mark.parametrize(
    "parent_args, expected", [(["--mixed_precision", "no"], "no"), (["--mixed_precision=no"], "no"), (["--cpu"], None)]
)
def test_an_unset_launcher_precision_is_told_from_an_explicit_no(monkeypatch, parent_args, expected):
    """accelerate passes "no" both for `--mixed_precision no` and for nothing; the launcher's command line decides."""
    parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *parent_args])
    cmdline = Path(f"/proc/{parent.pid}/cmdline")
    while b"time.sleep" not in cmdline.read_bytes():  # until the child has exec'd
        time.sleep(0.01)
    try:
        monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")
        monkeypatch.setattr(precision.os, "getppid", lambda: parent.pid)
        assert launcher_precision() == expected
    finally:
        parent.kill()
        parent.wait()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("precision_corpus")
    rng = random.Random(0)
    docs = ["\n".join(" ".join(rng.choices(WORDS, k=rng.randint(5, 12))) + "." for _ in range(6)) for _ in range(40)]
    (root / "train.txt").write_text("\n\n".join(docs[:34]), encoding="utf-8")
    (root / "valid.txt").write_text("\n\n".join(docs[34:]), encoding="utf-8")
    train_tokenizer(docs, vocab_size=120).save_pretrained(root / "tokenizer")
    return root


def pretrain(corpus, out, *, launcher=None, fake_units=None):
    """The real pretraining command, 2 steps of the tiny preset; returns (stdout, results.json)."""
    args = [
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
        "16",
        "--per_device_train_batch_size",
        "2",
        "--per_device_eval_batch_size",
        "2",
        "--eval_batches",
        "1",
        "--max_steps",
        "2",
        "--num_warmup_steps",
        "0",
        "--output_dir",
        str(out),
    ]
    if fake_units is not None:  # a CPU with these bf16 units (none: an AVX2-only CPU)
        prelude = (
            f"import torch; torch.cpu._is_amx_tile_supported = lambda: {'AMX' in fake_units}; "
            f"torch.cpu._is_avx512_bf16_supported = lambda: {'AVX512-BF16' in fake_units}; import runpy, sys; "
            "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
        )
        cmd = [sys.executable, "-c", prelude, "pretrain/run_pretraining.py", *args]
    elif launcher is not None:
        cmd = [
            "accelerate",
            "launch",
            "--cpu",
            "--num_processes",
            "1",
            "--num_machines",
            "1",
            "--dynamo_backend",
            "no",
            *launcher,
            "pretrain/run_pretraining.py",
            *args,
        ]
    else:
        cmd = [sys.executable, "pretrain/run_pretraining.py", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("ACCELERATE_MIXED_PRECISION", None)
    done = prewarmed.run(cmd, cwd=REPO, env=env, timeout=600)  # accelerate's command in a subprocess
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, json.loads(Path(out, "results.json").read_text())


@pytest.mark.recipes
def test_the_recipe_prints_and_records_the_choice_of_this_machine(corpus, tmp_path):
    stdout, results = pretrain(corpus, tmp_path / "run")
    units = cpu_bf16_units()
    expected = "bf16" if units else "no"
    assert results["mixed_precision"] == expected
    if units:
        assert f"mixed precision: bf16 (auto: this CPU has {' and '.join(units)})" in stdout
    else:
        assert "mixed precision: no (auto: this CPU (" in stdout and ") has no AMX or AVX512-BF16" in stdout
    assert "CPU memory: " in stdout
    if glibc() is not None and user_malloc_settings() is None and not os.environ.get("LD_PRELOAD"):
        assert "CPU memory: freed blocks kept for reuse (glibc's mmap threshold 32 MiB, no trimming" in stdout


@pytest.mark.recipes
def test_on_a_cpu_without_bf16_units_the_recipe_trains_in_fp32(corpus, tmp_path):
    stdout, results = pretrain(corpus, tmp_path / "run", fake_units=())
    assert results["mixed_precision"] == "no"
    assert "mixed precision: no (auto: this CPU" in stdout and "has no AMX or AVX512-BF16" in stdout


@pytest.mark.recipes
@pytest.mark.parametrize(
    "launcher, expected", [([], None), (["--mixed_precision", "no"], "no"), (["--mixed_precision", "bf16"], "bf16")]
)
def test_accelerate_launch_left_unset_means_auto_and_an_explicit_precision_wins(corpus, tmp_path, launcher, expected):
    stdout, results = pretrain(corpus, tmp_path / "run", launcher=launcher)
    if expected is None:
        expected = "bf16" if cpu_bf16_units() else "no"
        assert "(auto: " in stdout
    else:
        assert f"(accelerate launch --mixed_precision {expected})" in stdout
    assert results["mixed_precision"] == expected


@pytest.mark.recipes
def test_runs_in_turn_in_one_process_each_take_their_own_precision(corpus, tmp_path):
    """`main` called in turn in one process (a notebook, a sweep): each run trains in its own --mixed_precision
    (accelerate keeps one state a process, and refused a second precision before the recipes started each run from a
    fresh one); a state the caller made with an Accelerator of their own is kept."""
    from recipe_helpers import small_args

    from pretrain import run_pretraining

    for i, requested in enumerate(("no", "bf16", "no")):
        out = tmp_path / f"run{i}"
        results = run_pretraining.main(small_args(corpus, out, "--mixed_precision", requested, "--max_steps", "2"))
        assert results["mixed_precision"] == requested
        assert json.loads((out / "results.json").read_text())["mixed_precision"] == requested
    # an Accelerator the caller made before is left as it is: a run shares its state, as accelerate does, and the
    # next run does not reset it
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    from xlnet_lite.training import run

    AcceleratorState._reset_state(reset_partial_state=True)
    mine = Accelerator(cpu=True, mixed_precision="no")
    run_pretraining.main(small_args(corpus, tmp_path / "mine", "--mixed_precision", "no", "--max_steps", "2"))
    run.forget_earlier_runs()  # what the next run does first
    assert mine.mixed_precision == "no" and mine.device.type == "cpu"
