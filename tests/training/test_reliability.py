"""A user's bad day, through the real commands: a damaged checkpoint, a second run into a busy output folder, a full
disk. Each costs nothing that was saved before and ends in one line."""

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest
from recipe_helpers import (
    FINETUNE,
    PRETRAIN,
    assert_same_losses,
    cli,
    one_line_error,
    read_metrics,
    sentiment_rows,
    tiny_args,
    write_rows,
)
from safetensors.torch import load_file

from xlnet_lite.integrity import MANIFEST, OutputLock, folder_size, verify_checkpoint
from xlnet_lite.training import DISK_FULL_ENV

pytestmark = pytest.mark.recipes  # runs the recipes end to end


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    """The tiny pretraining run, uninterrupted, as the command (one thread, as every run below)."""
    out = tmp_path_factory.mktemp("reference")
    result = cli(PRETRAIN, *tiny_args(corpus, out))
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def assert_same_weights(a, b):
    left, right = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert left.keys() == right.keys() and all(left[k].equal(right[k]) for k in left)


def interrupted_copy(straight, folder, *, steps=(6, 12)):
    """The straight run's checkpoints `steps` and its metrics up to the first of them: what a run killed after its
    last checkpoint leaves."""
    for step in steps:
        shutil.copytree(straight / "checkpoints" / f"step_{step}", folder / "checkpoints" / f"step_{step}")
    first = [m for m in read_metrics(straight) if m["step"] <= steps[0]]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in first))


def truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def flip_a_bit(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def test_every_checkpoint_has_a_manifest_that_verifies(reference):
    out = reference
    for checkpoint in (out / "checkpoints").iterdir():
        files = json.loads((checkpoint / MANIFEST).read_text())["files"]
        on_disk = {str(p.relative_to(checkpoint)) for p in checkpoint.rglob("*") if p.is_file() and p.name != MANIFEST}
        assert set(files) == on_disk and "trainer_state.json" in files and "model.safetensors" in files
        assert verify_checkpoint(checkpoint) == (None, True)


@pytest.mark.parametrize("damage,file", [(truncate, "model.safetensors"), (flip_a_bit, "optimizer.bin")])
def test_latest_skips_a_damaged_newest_checkpoint(reference, corpus, tmp_path, damage, file):
    straight = reference
    interrupted_copy(straight, tmp_path)
    damage(tmp_path / "checkpoints" / "step_12" / file)
    assert verify_checkpoint(tmp_path / "checkpoints" / "step_12")[0].startswith(file)

    result = cli(PRETRAIN, *tiny_args(corpus, tmp_path, "--resume_from_checkpoint", "latest"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"checkpoint {tmp_path / 'checkpoints' / 'step_12'} is damaged ({file}" in result.stdout + result.stderr
    assert "resumed from" in result.stdout and "step_6 at step 6" in result.stdout
    assert_same_losses(read_metrics(straight), read_metrics(tmp_path))
    assert_same_weights(straight, tmp_path)


def test_a_damaged_checkpoint_named_explicitly_is_one_line(reference, corpus, tmp_path):
    straight = reference
    interrupted_copy(straight, tmp_path)
    truncate(tmp_path / "checkpoints" / "step_12" / "model.safetensors")
    named = tmp_path / "checkpoints" / "step_12"
    one_line_error(
        cli(PRETRAIN, *tiny_args(corpus, tmp_path, "--resume_from_checkpoint", named)),
        f"--resume_from_checkpoint {named}: the checkpoint is damaged (model.safetensors has",
    )
    assert (named / "model.safetensors").exists()  # left as it was


def test_a_checkpoint_from_before_manifests_resumes_after_loading(reference, corpus, tmp_path):
    straight = reference
    interrupted_copy(straight, tmp_path, steps=(6,))
    (tmp_path / "checkpoints" / "step_6" / MANIFEST).unlink()
    assert verify_checkpoint(tmp_path / "checkpoints" / "step_6") == (None, False)
    result = cli(PRETRAIN, *tiny_args(corpus, tmp_path, "--resume_from_checkpoint", "latest"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"has no {MANIFEST}" in result.stdout
    assert_same_weights(straight, tmp_path)


def test_a_busy_output_dir_is_refused_naming_its_holder(corpus, pretrained, tmp_path):
    lock = OutputLock(tmp_path)
    assert lock.acquire() is None
    try:
        result = cli(PRETRAIN, *tiny_args(corpus, tmp_path))
        one_line_error(result, f"--output_dir {tmp_path} is in use by another run", f"PID {os.getpid()}")
        result = cli(
            FINETUNE, "--model_name_or_path", pretrained, "--embedded_task", "rotten_tomatoes", "--output_dir", tmp_path
        )
        one_line_error(result, "is in use by another run", f"host {socket.gethostname()}")
    finally:
        lock.release()
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written by the refused runs, lock removed


def test_two_runs_started_together_into_one_folder(corpus, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    runs = [
        subprocess.Popen(
            [sys.executable, PRETRAIN, *tiny_args(corpus, tmp_path, "--seed", str(seed))],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in (1, 2)
    ]
    results = [(run.wait(timeout=600), *run.communicate()) for run in runs]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 2], [err[-2000:] for _, _, err in results]
    refused = next(err for code, _, err in results if code == 2)
    assert "is in use by another run" in refused and "Traceback" not in refused
    steps = [m["step"] for m in read_metrics(tmp_path) if "loss" in m]
    assert steps == sorted(set(steps))  # one run's records, not two interleaved
    assert not (tmp_path / OutputLock.NAME).exists()


def test_a_lock_left_by_a_dead_run_is_taken_over(corpus, tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    holder = {"host": socket.gethostname(), "pid": int(gone.stdout), "started": "2026-01-01T00:00:00+00:00"}
    (tmp_path / OutputLock.NAME).write_text(json.dumps(holder))
    result = cli(PRETRAIN, *tiny_args(corpus, tmp_path, "--max_steps", "2", "--num_warmup_steps", "0"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"taking over the lock of a run that is gone (host {holder['host']}, PID {holder['pid']}" in result.stdout
    assert (tmp_path / "model.safetensors").exists() and not (tmp_path / OutputLock.NAME).exists()


@pytest.mark.parametrize(
    "point,what", [("checkpoint_state@2", "checkpoint step_12"), ("final_model_written", "the final model")]
)
def test_a_full_disk_costs_nothing_saved_before(reference, corpus, tmp_path, point, what):
    straight = reference
    result = cli(PRETRAIN, *tiny_args(corpus, tmp_path), env={DISK_FULL_ENV: point})
    line = one_line_error(
        result, f"could not write {what} in {tmp_path}", "No space left on device", "MB free", status=1
    )
    assert "--resume_from_checkpoint latest" in line and "needs about 0.0 MB" not in line  # the model's size
    assert not [p.name for p in tmp_path.rglob("*") if p.name.endswith(".tmp")], "partial files left behind"
    assert verify_checkpoint(tmp_path / "checkpoints" / "step_6") == (None, True)
    assert not (tmp_path / "model.safetensors").exists()

    result = cli(PRETRAIN, *tiny_args(corpus, tmp_path, "--resume_from_checkpoint", "latest"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_losses(read_metrics(straight), read_metrics(tmp_path))
    assert_same_weights(straight, tmp_path)


def test_a_full_disk_while_finetuning(pretrained, tmp_path):
    train = write_rows(tmp_path / "train.csv", sentiment_rows(2))
    args = [
        "--model_name_or_path",
        pretrained,
        "--train_file",
        train,
        "--validation_file",
        train,
        "--output_dir",
        tmp_path / "out",
        "--num_train_epochs",
        "1",
        "--max_seq_length",
        "16",
    ]
    result = cli(FINETUNE, *args, env={DISK_FULL_ENV: "final_model_written", "HF_HOME": str(tmp_path / "hf")})
    one_line_error(result, f"could not write the final model in {tmp_path / 'out'}", "No space left", status=1)
    assert not (tmp_path / "out" / "model.safetensors").exists() and not (tmp_path / "out" / ".final.tmp").exists()


@pytest.fixture
def small_disk(tmp_path):
    """A 3 MB tmpfs (needs root; skipped where mount is refused): a disk that really fills up."""
    folder = tmp_path / "disk"
    folder.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(folder)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    yield folder
    subprocess.run(["umount", str(folder)], check=True)


def test_a_disk_that_really_fills_up(corpus, small_disk):
    out = small_disk / "run"
    result = cli(PRETRAIN, *tiny_args(corpus, out, "--checkpointing_steps", "3"))
    line = one_line_error(result, "could not write checkpoint step_", f"in {out / 'checkpoints'}", "MB free", status=1)
    assert not [p.name for p in small_disk.rglob("*") if p.name.endswith(".tmp")], line
    for checkpoint in (out / "checkpoints").iterdir():
        assert verify_checkpoint(checkpoint) == (None, True)


@pytest.mark.parametrize(
    "point,what",
    [
        ("checkpoint_state@2", "checkpoint step_4"),  # on both processes
        ("checkpoint_manifest@2", "checkpoint step_4"),
    ],
)  # on the main one alone
def test_a_full_disk_on_one_of_two_processes(corpus, tmp_path, point, what):
    """Every process learns of a failed save (on both, or on the main process alone: the manifest and the final
    model are its writes), and all stop; none waits for the other."""
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", DISK_FULL_ENV: point}
    args = tiny_args(corpus, tmp_path, "--max_steps", "4", "--eval_steps", "4", "--checkpointing_steps", "2")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", PRETRAIN, *args]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0, result.stderr[-3000:]
    ours = [line for line in result.stderr.splitlines() if 'run_pretraining.py", line' in line or "xlnet_lite/" in line]
    assert not ours, result.stderr[-3000:]  # torchrun reports a failed worker with its own traceback; the workers none
    errors = [line for line in result.stderr.splitlines() if "run_pretraining.py: error:" in line]
    assert any(f"could not write {what}" in line for line in errors), result.stderr[-3000:]
    assert not [p.name for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]
    assert verify_checkpoint(tmp_path / "checkpoints" / "step_2") == (None, True)
    assert not (tmp_path / "model.safetensors").exists()


def test_a_checkpoint_measured_while_another_process_removes_it(tmp_path, monkeypatch):
    """folder_size, which a process whose save failed runs on the partial checkpoint while the main process may be
    removing it: a file or a folder that goes while it reads counts 0, and it raises nothing (a raw "No such file"
    there once took the place of the one-line error)."""
    folder = tmp_path / ".step_4.tmp"
    (folder / "sub").mkdir(parents=True)
    (folder / "kept.bin").write_bytes(b"x" * 1000)
    (folder / "gone.bin").write_bytes(b"x" * 500)
    (folder / "sub" / "also_gone.bin").write_bytes(b"x" * 300)
    assert folder_size(folder) == 1800
    stat, scandir = os.stat, os.scandir

    def stat_after_removal(path, *args, **kwargs):
        if os.path.basename(path) == "gone.bin":  # listed, then removed before its size is read
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return stat(path, *args, **kwargs)

    def scandir_after_removal(path="."):
        if os.path.basename(path) == "sub":  # listed as a folder, then removed before it is read
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return scandir(path)

    monkeypatch.setattr(os, "stat", stat_after_removal)
    monkeypatch.setattr(os, "scandir", scandir_after_removal)
    assert folder_size(folder) == 1000
    monkeypatch.undo()
    shutil.rmtree(folder)
    assert folder_size(folder) == 0 and folder_size(tmp_path / "never") == 0


def test_a_compiled_model_is_saved_under_its_own_names(tmp_path):
    """save_final_model of a model compiled by torch.compile (--torch_compile) writes the model's parameter names,
    not the compiled wrapper's (_orig_mod.), so that from_pretrained loads every weight."""
    import torch
    from accelerate import Accelerator

    import xlnet_lite
    from xlnet_lite.training import save_final_model

    torch.manual_seed(0)
    model = xlnet_lite.XLNetLiteLMHeadModel(xlnet_lite.XLNetLiteConfig(vocab_size=40, d_model=16, n_layer=1, n_head=2))
    tokenizer = xlnet_lite.tokenization_xlnet_lite.train_tokenizer(["a b c d e f"] * 4, vocab_size=40)
    save_final_model(Accelerator(cpu=True), torch.compile(model), tokenizer, tmp_path / "out")
    saved = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert saved.keys() == {k for k in model.state_dict() if k != "lm_loss.weight"}  # the tied head once
    again = xlnet_lite.XLNetLiteLMHeadModel.from_pretrained(tmp_path / "out")
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(again.state_dict()[name], tensor, rtol=0, atol=0)
