"""The recipes under accelerate's FSDP (FSDP2, two CPU processes over gloo, tests/fsdp_on_cpu.py): the losses and
weights of DDP on the same processes and batches, a sharded checkpoint that resumes, a final model saved whole that
loads as the model's own class, and the finetuning recipe's best epoch loaded back into the sharded model."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from recipe_helpers import (
    FINETUNE,
    PRETRAIN,
    assert_same_losses,
    read_metrics,
    sentiment_rows,
    small_args,
    write_rows,
)
from safetensors.torch import load_file

from pretrain import run_pretraining
from xlnet_lite.errors import RecipeError
from xlnet_lite.training import checkpoints, parse_args

pytestmark = pytest.mark.recipes  # runs the recipe end to end

LAUNCHER = str(Path(__file__).resolve().parents[1] / "fsdp_on_cpu.py")


PER_LAYER = {"FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP"}  # each XLNetLiteLayer sharded on its own


def launch(script, args, *, fsdp, cache=None, status=0, **env):
    """`script args` on two CPU processes by torchrun, under FSDP2 (fsdp: the whole model one unit, or as `env` sets
    accelerate's FSDP_* variables) or DDP; fp32, so that the two agree to the last bits the sums' order leaves. The
    run must end with exit status `status` (torchrun's: 1 for any failure)."""
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "FSDP_VERSION": "2", **env}
    env.update(ACCELERATE_USE_FSDP=str(fsdp).lower(), **({"XLNET_LITE_CACHE": str(cache)} if cache else {}))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd += [LAUNCHER, script, *map(str, args), "--mixed_precision", "no"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == status, done.stderr[-4000:]
    return done.stdout if status == 0 else done.stderr


def assert_same_weights(ours: Path, theirs: Path):
    ours, theirs = load_file(str(ours / "model.safetensors")), load_file(str(theirs / "model.safetensors"))
    assert ours.keys() == theirs.keys()  # the tied LM head saved once, as without FSDP
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], rtol=0, atol=1e-6)


def test_fsdp_trains_resumes_and_saves_as_ddp_does(corpus, tmp_path):
    """Pretraining: DDP for 4 steps against FSDP for 2 (the model one unit), then resumed from its sharded checkpoint
    to 4 with each layer a unit of its own (the layers read their parameters in their own forward): the same losses
    and final weights. The saved model names its own class (not FSDP's) and carries its own code. The processes'
    LM bias starts from the corpus's unigram counts, the same on both (FSDP keeps each process's own values where DDP
    broadcast the first's). Then finetuning from each under the same: the same epochs, metrics, weights and test
    predictions, made by the best epoch's model loaded back into the sharded one."""
    ddp, fsdp = tmp_path / "ddp", tmp_path / "fsdp"
    launch(PRETRAIN, small_args(corpus, ddp), fsdp=False, cache=tmp_path / "cache")
    first = small_args(corpus, fsdp)
    first[first.index("--max_steps") + 1] = "2"
    launch(PRETRAIN, first, fsdp=True, cache=tmp_path / "cache")
    assert any((fsdp / "checkpoints" / "step_2").glob("pytorch_model_fsdp*"))  # the shards, as FSDP saves them
    out = launch(PRETRAIN, small_args(corpus, fsdp, "--resume_from_checkpoint", "latest"), fsdp=True, **PER_LAYER)
    assert f"resumed from {fsdp / 'checkpoints' / 'step_2'} at step 2" in out
    assert_same_losses(read_metrics(ddp), [m for m in read_metrics(fsdp) if "loss" in m])
    assert_same_weights(fsdp, ddp)
    config = json.loads((fsdp / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_xlnet_lite.XLNetLiteLMHeadModel"
    assert config["architectures"] == ["XLNetLiteLMHeadModel"]
    assert sorted(p.name for p in fsdp.glob("*.py")) == sorted(p.name for p in ddp.glob("*.py"))

    # finetuning a score (regression: its predictions show which epoch's model made them) for 3 epochs at a rate
    # whose best epoch on validation is the first: the test split's predictions must come from that model, loaded back
    score = dict(label=lambda good: 1.0 if good else 0.0)
    rows = [{**row, "label": row["label"] + 0.05 * (i % 3)} for i, row in enumerate(sentiment_rows(2, **score)[:16])]
    train, dev = write_rows(tmp_path / "train.csv", rows), write_rows(tmp_path / "dev.csv", sentiment_rows(1, **score))
    for name, fsdp_on in (("ddp", False), ("fsdp", True)):
        args = ["--model_name_or_path", tmp_path / name, "--train_file", train, "--validation_file", dev]
        args += ["--test_file", dev, "--output_dir", tmp_path / f"ft_{name}", "--num_train_epochs", "3"]
        args += ["--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "4", "--learning_rate", "3e-3"]
        args += ["--max_seq_length", "16", "--num_warmup_steps", "1", "--logging_steps", "1"]
        launch(FINETUNE, args, fsdp=fsdp_on, **PER_LAYER)
    ft_ddp, ft_fsdp = tmp_path / "ft_ddp", tmp_path / "ft_fsdp"
    losses = [[m for m in read_metrics(out) if "loss" in m] for out in (ft_ddp, ft_fsdp)]
    assert [m["step"] for m in losses[0]] == list(range(1, 7))
    assert_same_losses(*losses)
    histories = [json.loads((out / "history.json").read_text()) for out in (ft_ddp, ft_fsdp)]
    assert len(histories[0]) == len(histories[1]) == 3
    for a, b in zip(*histories):
        assert a == pytest.approx(b, abs=1e-3)  # fp32, the sums in another order: 3e-5 here
    results = json.loads((ft_fsdp / "all_results.json").read_text())
    best = histories[1][results["best_epoch"] - 1]
    assert results["best_epoch"] < 3 and histories[1][-1]["eval_pearson"] != pytest.approx(best["eval_pearson"])
    assert results["test_pearson"] == pytest.approx(best["eval_pearson"], abs=1e-6)  # the test split is validation's
    predictions = [np.loadtxt(out / "predict_results.tsv", skiprows=1) for out in (ft_ddp, ft_fsdp)]
    assert predictions[0].shape == (12, 2)
    np.testing.assert_allclose(predictions[1], predictions[0], rtol=0, atol=1e-5)
    assert_same_weights(ft_fsdp, ft_ddp)

    # the memory's mode reads a text's first segments by the transformer alone, which FSDP leaves sharded: refused
    args[args.index("--output_dir") + 1] = tmp_path / "ft_mems"
    err = launch(FINETUNE, [*args, "--long_document_mode", "mems"], fsdp=True, status=1)
    assert "run_glue.py: error: --long_document_mode mems reads" in err
    assert 'run_glue.py", line' not in err  # one line, no traceback of the recipe's (torchrun adds its own)


def test_a_resume_across_fsdp_is_one_line(tmp_path):
    """accelerate loads an FSDP checkpoint (its shards or full state dict, pytorch_model_fsdp*) back under FSDP only,
    and a checkpoint saved without FSDP outside it only: the resume is refused before any work, saying which."""
    step = tmp_path / "step_2"
    step.mkdir()
    (step / "trainer_state.json").write_text(json.dumps({"flags": {}, "num_processes": 2, "model": {}}))
    args = parse_args(run_pretraining.PretrainingArguments, [])
    checkpoints.check_resume(args, step, num_processes=2, fsdp=False)
    with pytest.raises(RecipeError, match="saved without FSDP and this run uses it"):
        checkpoints.check_resume(args, step, num_processes=2, fsdp=True)
    (step / "pytorch_model_fsdp_0").mkdir()
    checkpoints.check_resume(args, step, num_processes=2, fsdp=True)
    with pytest.raises(RecipeError, match="saved under FSDP and this run does not use it"):
        checkpoints.check_resume(args, step, num_processes=2, fsdp=False)


SAVE_COMPILED = """
import json, sys
import torch
from accelerate import Accelerator
from safetensors.torch import load_file
import xlnet_lite
from xlnet_lite.training import save_final_model

torch.manual_seed(0)
model = xlnet_lite.XLNetLiteLMHeadModel(xlnet_lite.XLNetLiteConfig(vocab_size=40, d_model=16, n_layer=1, n_head=2))
weights = {name: tensor.clone() for name, tensor in model.state_dict().items()}
tokenizer = xlnet_lite.tokenization_xlnet_lite.train_tokenizer(["a b c d e f"] * 4, vocab_size=40)
accelerator = Accelerator()
assert accelerator.distributed_type == "FSDP", accelerator.distributed_type
save_final_model(accelerator, torch.compile(accelerator.prepare(model)), tokenizer, sys.argv[1])
if accelerator.is_main_process:
    saved = load_file(sys.argv[1] + "/model.safetensors")
    assert saved.keys() == weights.keys() - {"lm_loss.weight"}, sorted(saved)  # the tied head once
    assert all(torch.equal(saved[name], weights[name]) for name in saved)
    auto_map = json.load(open(sys.argv[1] + "/config.json"))["auto_map"]
    assert auto_map["AutoModelForCausalLM"] == "modeling_xlnet_lite.XLNetLiteLMHeadModel", auto_map
    print("saved as the model")
"""


def test_a_compiled_sharded_model_is_saved_under_its_own_names(tmp_path):
    """A model sharded by FSDP and compiled (--torch_compile) is gathered and saved under the model's own names and
    class, the tied LM head once, the weights as they were."""
    script = tmp_path / "save_compiled.py"
    script.write_text(SAVE_COMPILED)  # it reads its folder from argv[1] (launch's recipe flags follow, unread)
    assert "saved as the model" in launch(script, [tmp_path / "out"], fsdp=True)
