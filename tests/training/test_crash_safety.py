"""Crash safety of the pretraining recipe: SIGKILL at random moments, resume with `latest`, and the run ends as if
never interrupted; SIGINT (Ctrl-C) saves a checkpoint before exiting, as SIGTERM does (the finetuning recipe's test
sends that one)."""

import json
import os
import random
import signal
import sys
import time

import prewarmed
import pytest
from model_helpers import nan_at_training_forward
from recipe_helpers import PRETRAIN as SCRIPT
from recipe_helpers import assert_same_losses, read_metrics, tiny_args
from safetensors.torch import load_file

from pretrain import run_pretraining

pytestmark = pytest.mark.recipes  # runs the recipes end to end


def launch(args, env):
    return prewarmed.start([sys.executable, SCRIPT, *args], env=env)


def lines_in(path):
    return len(path.read_text().splitlines()) if path.exists() else 0


def wait_for_lines(proc, path, count, timeout=240):
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if lines_in(path) >= count:
            return True
        time.sleep(0.05)
    return False


def run_args(corpus, out, steps=16):
    args = tiny_args(corpus, out, "--resume_from_checkpoint", "latest")
    args[args.index("--max_steps") + 1] = str(steps)
    args[args.index("--eval_steps") + 1] = "8"
    args[args.index("--checkpointing_steps") + 1] = "2"
    return args


@pytest.fixture
def env(tmp_path):
    return {**os.environ, "XLNET_LITE_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume_matches_uninterrupted(corpus, tmp_path, env):
    straight = tmp_path / "straight"
    proc = launch(run_args(corpus, straight), env)
    assert proc.wait(timeout=600) == 0, proc.communicate()[1][-3000:]

    out = tmp_path / "killed"
    rng = random.Random(1234)
    kills = 0
    for _ in range(3):
        proc = launch(run_args(corpus, out), env)
        done = lines_in(out / "metrics.jsonl")
        if not wait_for_lines(proc, out / "metrics.jsonl", done + rng.randint(1, 4)):
            break
        time.sleep(rng.uniform(0.0, 0.4))  # anywhere: mid-step, mid-checkpoint, mid-log
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait(timeout=60)
    assert kills >= 2
    proc = launch(run_args(corpus, out), env)
    assert proc.wait(timeout=600) == 0, proc.communicate()[1][-3000:]

    assert_same_losses(read_metrics(straight), read_metrics(out))
    wa, wb = load_file(str(straight / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert wa.keys() == wb.keys()
    for key in wa:
        assert (wa[key] - wb[key]).abs().max() < 1e-5, key
    assert not any(p.name.endswith(".tmp") for p in (out / "checkpoints").iterdir())


@pytest.mark.slow
def test_ctrl_c_saves_a_checkpoint_and_exits(corpus, tmp_path, env):
    out = tmp_path / "interrupted"
    args = run_args(corpus, out, steps=200)
    args[args.index("--checkpointing_steps") + 1] = "1000"
    proc = launch(args, env)
    assert wait_for_lines(proc, out / "metrics.jsonl", 3)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == 0, proc.communicate()[1][-3000:]
    checkpoints = sorted((out / "checkpoints").glob("step_*"))
    assert len(checkpoints) == 1
    step = int(checkpoints[0].name[5:])
    assert f"received signal {int(signal.SIGINT)}: checkpoint saved at step {step}, exiting" in proc.communicate()[0]
    assert step >= 3 and json.loads((checkpoints[0] / "trainer_state.json").read_text())["step"] == step


@pytest.fixture
def nan_at_fifth_training_step(monkeypatch):
    """The 5th training forward returns a NaN loss (evaluation forwards are not counted)."""
    import xlnet_lite

    nan_at_training_forward(monkeypatch, xlnet_lite.XLNetLiteLMHeadModel, 5)


def test_nonfinite_loss_stops_naming_the_step_and_keeps_the_checkpoint(corpus, tmp_path, nan_at_fifth_training_step):

    args = run_args(corpus, tmp_path, steps=8)
    with pytest.raises(FloatingPointError, match="at step 5"):
        run_pretraining.main(args)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_2", "step_4"]  # intact, no partial
    assert (tmp_path / "checkpoints" / "step_4" / "rank0_state.json").is_file()


def test_skip_nonfinite_skips_and_counts(corpus, tmp_path, nan_at_fifth_training_step):

    results = run_pretraining.main(run_args(corpus, tmp_path, steps=8) + ["--skip_nonfinite"])
    assert results["skipped_steps"] == 1
    metrics = read_metrics(tmp_path)
    assert metrics[-1]["skipped_steps"] == 1 and all(m["loss"] == m["loss"] for m in metrics if "loss" in m)
