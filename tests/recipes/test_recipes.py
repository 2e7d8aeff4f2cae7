"""What both recipes promise through the shared core (xlnet_lite.training), tested as a new user meets it: --help,
the output folder guard, resume checks, warmup, file modes, the saved config, SIGTERM, NaN, push_to_hub."""

import copy
import json
import os
import signal
import stat
import subprocess
import sys
import time
from types import SimpleNamespace

import prewarmed
import pytest
import torch
from fake_hub import FakeHub
from model_helpers import nan_at_training_forward
from recipe_helpers import (
    FINETUNE,
    PRETRAIN,
    cli,
    command,
    one_line_error,
    read_metrics,
    run,
    sentiment_rows,
    tiny_args,
    write_rows,
)

import xlnet_lite
from finetune import run_glue
from pretrain import run_pretraining
from xlnet_lite import training
from xlnet_lite.training import RecipeArguments, parse_args

pytestmark = pytest.mark.recipes  # runs the recipes end to end


BAD_TEXT = {"empty": b"", "whitespace": b"  \n\n \t\n", "not_utf8": b"a fine first line\n\xff\xfe bytes\n"}


@pytest.mark.parametrize("flag", ["--train_file", "--validation_file"])
@pytest.mark.parametrize(
    "kind,says",
    [
        ("empty", "empty or holds only whitespace"),
        ("whitespace", "empty or holds only whitespace"),
        ("not_utf8", "line 2 is not valid UTF-8"),
    ],
)
def test_a_bad_pretraining_text_file_is_one_line(corpus, tmp_path, flag, kind, says):
    bad = tmp_path / f"{kind}.txt"
    bad.write_bytes(BAD_TEXT[kind])
    args = tiny_args(corpus, tmp_path / "out")
    args[args.index(flag) + 1] = str(bad)
    run_command = cli if (kind, flag) == ("not_utf8", "--validation_file") else command  # one as a real command
    one_line_error(run_command(PRETRAIN, *args), flag, str(bad), says)


@pytest.mark.parametrize("split,flag", [("training", "--train_file"), ("validation", "--validation_file")])
def test_a_corpus_too_short_for_its_batch_is_one_line(corpus, tmp_path, split, flag):
    short = tmp_path / "short.txt"
    short.write_text("one short document\n\nand another one\n")
    args = tiny_args(corpus, tmp_path / "out")
    args[args.index(flag) + 1] = str(short)
    run_command = cli if split == "validation" else command  # one as a real command
    one_line_error(run_command(PRETRAIN, *args), f"the {split} corpus ({flag} {short}", "the corpus is too short")


@pytest.mark.parametrize(
    "content,says",
    [
        (b"", "the file is empty"),
        (b"  \n\n \t\n", "the file holds no rows"),
        (b"sentence,label\na fine film,pos\n\xff\xfe,neg\n", "line 3 is not valid UTF-8"),
        (b'sentence,label\n"an open quote,pos\nbad,neg\n', "not a readable csv file"),
        (b"sentence,verdict\na fine film,pos\nbad,neg\n", "no `label` column"),
        (b"label\npos\nneg\n", "no text column"),
    ],
)
def test_a_bad_finetuning_file_is_one_line(pretrained, tmp_path, content, says):
    train, good = tmp_path / "train.csv", write_rows(tmp_path / "good.csv", sentiment_rows(1))
    train.write_bytes(content)
    args = [
        "--model_name_or_path",
        pretrained,
        "--train_file",
        train,
        "--validation_file",
        good,
        "--output_dir",
        tmp_path / "out",
    ]
    if says == "not a readable csv file":  # one as a real command
        result = cli(FINETUNE, *args, env={"HF_HOME": str(tmp_path / "hf")})
    else:
        result = command(FINETUNE, *args)
    one_line_error(result, str(train), says)
    assert not (tmp_path / "out" / "model.safetensors").exists()


@pytest.mark.parametrize("script,cls", [(PRETRAIN, "PretrainingArguments"), (FINETUNE, "FinetuneArguments")])
def test_help_shows_every_flag_with_its_default_and_choices(script, cls):
    result = cli(script, "--help")
    assert result.returncode == 0, result.stderr
    module = run_pretraining if script == PRETRAIN else run_glue
    import dataclasses

    names = [f.name for f in dataclasses.fields(getattr(module, cls))]
    text = " ".join(result.stdout.split())
    for name in names:
        assert f"--{name}" in text, name
    assert text.count("(default:") >= len(names)
    assert "--mixed_precision {auto,no,bf16,fp16}" in text and "--lr_scheduler_type {linear," in text
    assert "[--push_to_hub [true|false]]" in text  # one bool convention: --flag, --flag true|false


def test_config_file_and_overrides_for_finetuning(tmp_path):
    config = tmp_path / "ft.json"
    config.write_text(json.dumps({"learning_rate": 1e-4, "num_train_epochs": 7, "long_document_mode": "mems"}))
    args = parse_args(run_glue.FinetuneArguments, ["--config", str(config), "--num_train_epochs", "2"])
    assert (args.learning_rate, args.num_train_epochs, args.long_document_mode) == (1e-4, 2, "mems")
    assert args.adam_epsilon == 1e-6 and args.output_dir == "outputs/finetune"  # the recipe's own defaults
    assert parse_args(RecipeArguments, []).adam_epsilon == 1e-8


def test_a_folder_holding_another_run_is_refused_then_overwritten_on_request(straight_run, corpus, tmp_path):
    out, _ = straight_run
    folder = tmp_path / "run"
    import shutil

    shutil.copytree(out, folder)
    before = (folder / "model.safetensors").read_bytes()
    args = tiny_args(corpus, folder)
    args[args.index("--model_size") + 1] = "small"
    args[args.index("--max_steps") + 1] = "2"
    args[args.index("--eval_steps") + 1] = "2"
    args[args.index("--checkpointing_steps") + 1] = "2"
    result = cli(PRETRAIN, *args)
    one_line_error(result, "--output_dir", "--overwrite_output_dir", "--resume_from_checkpoint latest")
    assert (folder / "model.safetensors").read_bytes() == before and (folder / "checkpoints" / "step_12").is_dir()

    # resuming the tiny run as a `small` one: the difference is named before the corpus is tokenized
    result = cli(PRETRAIN, *args, "--resume_from_checkpoint", "latest")
    one_line_error(result, "cannot resume", "--model_size: 'tiny' in the checkpoint, 'small' now")
    assert "Tokenizing" not in result.stderr + result.stdout

    result = cli(PRETRAIN, *args, "--overwrite_output_dir")
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in (folder / "checkpoints").iterdir()) == ["step_2"]  # the old run's are gone
    assert json.loads((folder / "results.json").read_text())["steps"] == 2


def test_warmup_longer_than_the_run_stops_with_a_message(corpus, tmp_path, pretrained):  # noqa: F811
    args = tiny_args(corpus, tmp_path / "pre")
    args[args.index("--max_steps") + 1] = "30"
    one_line_error(cli(PRETRAIN, *args, "--num_warmup_steps", "100"), "--num_warmup_steps (100)", "30")
    assert not (tmp_path / "pre").exists()

    train = write_rows(tmp_path / "train.csv", sentiment_rows(1))  # 12 rows, batch 4: 3 steps per epoch, 6 in all
    with pytest.raises(ValueError, match=r"--num_warmup_steps \(10\) is longer than the run \(6 optimizer steps\)"):
        run(tmp_path / "ft", pretrained, "--train_file", train, "--num_warmup_steps", "10")
    results, _ = run(tmp_path / "ft2", pretrained, "--train_file", train, "--warmup_ratio", "0.5", epochs=1)
    assert results["epochs"] == 1


def test_saved_files_get_the_mode_of_a_plain_open_and_no_training_fields(straight_run):
    out, _ = straight_run
    umask = os.umask(0)
    os.umask(umask)
    for name in ("model.safetensors", "config.json", "tokenizer.json", "results.json", "metrics.jsonl", "loss.png"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o666 & ~umask, name
    for file in (out / "checkpoints" / "step_12").iterdir():
        assert stat.S_IMODE(file.stat().st_mode) == 0o666 & ~umask, file.name
    config = json.loads((out / "config.json").read_text())
    assert (config["reuse_len"], config["bi_data"], config["use_mems_train"]) == (None, False, False)
    assert config["mem_len"] == 24  # the memory is used at inference
    trainer_state = json.loads((out / "checkpoints" / "step_12" / "trainer_state.json").read_text())
    assert trainer_state["flags"]["reuse_len"] == 16  # the run's own settings stay with its checkpoints


def test_finetuning_sigterm_saves_a_checkpoint_and_resumes_to_the_end(tmp_path, pretrained):  # noqa: F811
    train = write_rows(tmp_path / "train.csv", sentiment_rows(4))
    out = tmp_path / "out"
    args = [
        "--model_name_or_path",
        pretrained,
        "--train_file",
        train,
        "--validation_file",
        train,
        "--output_dir",
        out,
        "--num_train_epochs",
        "40",
        "--per_device_train_batch_size",
        "2",
        "--logging_steps",
        "1",
        "--max_seq_length",
        "16",
        "--checkpointing_steps",
        "0",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = prewarmed.start([sys.executable, FINETUNE, *args], env=env)
    metrics = out / "metrics.jsonl"
    deadline = time.time() + 240
    while (
        time.time() < deadline
        and proc.poll() is None
        and (not metrics.exists() or len(metrics.read_text().splitlines()) < 3)
    ):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0, proc.communicate()[1][-3000:]
    checkpoints = sorted((out / "checkpoints").glob("step_*"))
    assert len(checkpoints) == 1 and not (out / "all_results.json").exists()
    step = json.loads((checkpoints[0] / "trainer_state.json").read_text())["step"]
    assert step >= 3
    args[args.index("--num_train_epochs") + 1] = "40"
    result = cli(FINETUNE, *args, "--resume_from_checkpoint", "latest", "--max_train_steps", str(step + 2), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    steps = [r["step"] for r in map(json.loads, metrics.read_text().splitlines()) if "loss" in r]
    assert steps == list(range(1, step + 3))  # a complete history: nothing lost, nothing twice


def test_finetuning_nonfinite_loss_stops_naming_the_step_or_skips(tmp_path, pretrained, monkeypatch):  # noqa: F811
    calls = nan_at_training_forward(monkeypatch, xlnet_lite.XLNetLiteForSequenceClassification, 2)
    train = write_rows(tmp_path / "train.csv", sentiment_rows(1))
    with pytest.raises(FloatingPointError, match="at step 2"):
        run(tmp_path / "a", pretrained, "--train_file", train)
    calls["train"] = 0
    results, out = run(tmp_path / "b", pretrained, "--train_file", train, "--skip_nonfinite", "--logging_steps", "1")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert records[-2]["skipped_steps"] == 1 and all(r["loss"] == r["loss"] for r in records if "loss" in r)


def test_latest_without_a_checkpoint_starts_fresh_in_both_recipes(tmp_path, pretrained):  # noqa: F811
    train = write_rows(tmp_path / "train.csv", sentiment_rows(1))
    results, out = run(tmp_path, pretrained, "--train_file", train, "--resume_from_checkpoint", "latest", epochs=1)
    assert results["epochs"] == 1 and (out / "model.safetensors").is_file()


@pytest.mark.parametrize("recipe", ["pretraining", "finetuning"])
def test_push_to_hub_sends_the_outputs_without_checkpoints(recipe, corpus, tmp_path, pretrained):  # noqa: F811
    hub = FakeHub(tmp_path / "pushed")
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE",)}
    env.update(
        HF_ENDPOINT=hub.endpoint, HF_TOKEN="hf_fake_token", HF_HOME=str(tmp_path / "hf_home"), OMP_NUM_THREADS="1"
    )
    if recipe == "pretraining":
        args = tiny_args(corpus, tmp_path / "out")
        args[args.index("--max_steps") + 1] = "2"
        args[args.index("--eval_steps") + 1] = "2"
        args[args.index("--checkpointing_steps") + 1] = "1"
        script, expected = PRETRAIN, {"results.json", "loss.png", "metrics.jsonl"}
    else:
        train = write_rows(tmp_path / "train.csv", sentiment_rows(1))
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
        script, expected = FINETUNE, {"all_results.json", "training_curves.png", "metrics.jsonl"}
    result = subprocess.run(
        [sys.executable, script, *map(str, args), "--push_to_hub", "--hub_model_id", "someone/tiny"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    hub.server.shutdown()
    assert result.returncode == 0, result.stderr[-3000:]
    pushed = {p.relative_to(tmp_path / "pushed").as_posix() for p in (tmp_path / "pushed").rglob("*") if p.is_file()}
    assert hub.commits == 1
    assert expected | {"config.json", "model.safetensors", "modeling_xlnet_lite.py", "tokenizer.json"} <= pushed
    assert not any(p.startswith(("checkpoints", ".")) or p == "run_args.json" for p in pushed), sorted(pushed)
    assert (tmp_path / "out" / "checkpoints").is_dir()


def test_one_parameter_group_rule_for_both_recipes():
    """No weight decay on biases (r_w/r_r/r_s_bias too) and LayerNorm, decay on every other weight, in both recipes."""
    from xlnet_lite.training import parameter_groups

    config = xlnet_lite.XLNetLiteConfig(vocab_size=50, d_model=16, n_layer=2, n_head=2, d_inner=32)
    for model in (xlnet_lite.XLNetLiteLMHeadModel(config), xlnet_lite.XLNetLiteForSequenceClassification(config)):
        groups = parameter_groups(model, learning_rate=1.0, weight_decay=0.1)
        decay = {id(p): g["weight_decay"] for g in groups for p in g["params"]}
        for name, param in model.named_parameters():
            no_decay = "bias" in name or "layer_norm" in name
            assert decay[id(param)] == (0.0 if no_decay else 0.1), name
    assert torch.is_tensor(next(model.parameters()))


def test_one_loader_for_xlnet_lite_and_transformers_checkpoints(tmp_path):
    """model_utils.load_model: an XLNet-Lite folder as it is, a transformers XLNet folder converted exactly;
    model_from_config: the architecture of either, randomly initialised."""
    import transformers

    from xlnet_lite.model_utils import load_model, model_from_config

    hf_config = transformers.XLNetConfig(vocab_size=50, d_model=16, n_layer=2, n_head=2, d_inner=32, mem_len=8)
    torch.manual_seed(0)
    transformers.XLNetLMHeadModel(hf_config).save_pretrained(tmp_path / "hf")
    hf = transformers.XLNetLMHeadModel.from_pretrained(tmp_path / "hf")
    lite = load_model(tmp_path / "hf", xlnet_lite.XLNetLiteLMHeadModel)
    assert type(lite) is xlnet_lite.XLNetLiteLMHeadModel
    for name, tensor in hf.state_dict().items():
        assert torch.equal(lite.state_dict()[name], tensor), name
    lite.save_pretrained(tmp_path / "lite")
    again = load_model(tmp_path / "lite", xlnet_lite.XLNetLiteLMHeadModel)
    assert all(torch.equal(again.state_dict()[k], v) for k, v in lite.state_dict().items())
    for folder in ("hf", "lite"):
        fresh = model_from_config(tmp_path / folder, xlnet_lite.XLNetLiteForSequenceClassification, num_labels=3)
        assert (fresh.config.d_model, fresh.config.n_layer, fresh.config.num_labels) == (16, 2, 3)


def test_finetuning_output_folder_guard_resume_check_and_file_modes(tmp_path, pretrained):  # noqa: F811
    train = write_rows(tmp_path / "train.csv", sentiment_rows(1))
    results, out = run(tmp_path, pretrained, "--train_file", train, "--checkpointing_steps", "2", epochs=1)
    before = (out / "model.safetensors").read_bytes()
    with pytest.raises(ValueError, match="already holds the outputs of another run.*--overwrite_output_dir"):
        run(tmp_path, pretrained, "--train_file", train, "--learning_rate", "5e-4", epochs=1)
    assert (out / "model.safetensors").read_bytes() == before
    with pytest.raises(ValueError, match="cannot resume.*--max_seq_length: 16 in the checkpoint, 24 now"):
        run(tmp_path, pretrained, "--train_file", train, "--resume_from_checkpoint", "latest", "--max_seq_length", "24")
    umask = os.umask(0)
    os.umask(umask)
    for name in ("model.safetensors", "config.json", "all_results.json", "metrics.jsonl", "training_curves.png"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o666 & ~umask, name
    config = json.loads((out / "config.json").read_text())
    assert config["reuse_len"] is None and config["use_mems_train"] is False
    run(tmp_path, pretrained, "--train_file", train, "--overwrite_output_dir", epochs=1)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_3"]  # the old run's step_2 is gone


def test_time_budget_schedule_decays_to_zero_at_the_deadline():
    budget = training.TimeBudget(1.0, warmup_steps=4, schedule="linear")
    assert [budget.lr_lambda(s) for s in range(5)] == [
        0.0,
        0.25,
        0.5,
        0.75,
        1.0,
    ]  # warmup counts steps, as transformers'
    for elapsed, linear in ((0.0, 1.0), (15.0, 0.75), (30.0, 0.5), (60.0, 0.0), (90.0, 0.0)):
        budget.elapsed = elapsed
        assert budget.lr_lambda(10) == pytest.approx(linear) and budget.expired() == (elapsed >= 60)
    budget.elapsed = 59.0
    assert budget.lr_lambda(2) == pytest.approx(1 / 60)  # a deadline inside the warmup still ends at zero
    cosine = training.TimeBudget(1.0, warmup_steps=0, schedule="cosine")
    cosine.elapsed = 30.0
    assert cosine.lr_lambda(10) == pytest.approx(0.5)
    with pytest.raises(training.RecipeError, match="polynomial cannot follow a time budget"):
        training.TimeBudget(1.0, warmup_steps=0, schedule="polynomial")


def test_time_budget_schedule_leaves_compiling_out():
    """Steps that compiled count toward the deadline, not the schedule: after a 20 s compile of a 60 s budget the
    rate starts from the top and decays over the 40 s left, non-decreasing in its fraction; the compiling time is
    kept in checkpoints; and compiled_frames() sees torch.compile compile."""
    budget = training.TimeBudget(1.0, warmup_steps=0, schedule="linear")
    loop = training.TrainLoop(
        None, SimpleNamespace(device="cpu", num_processes=1), None, None, None, checkpoints_dir=None, budget=budget
    )
    fractions = []
    for elapsed, compiling in ((20.0, 20.0), (21.0, 0.0), (25.0, 4.0), (40.0, 0.0), (50.0, 0.0), (60.0, 0.0)):
        loop._tick_budget(elapsed, compiling)
        fractions.append(budget.fraction())
    assert fractions == pytest.approx([0.0, 1 / 40, 1 / 36, 16 / 36, 26 / 36, 1.0])  # 60 s would say 1/3 at first
    assert budget.lr_lambda(3) == 0.0 and budget.expired()
    loop.elapsed = 50.0
    resumed = training.TimeBudget(1.0, warmup_steps=0, schedule="linear")
    training.TrainLoop(None, None, None, None, None, checkpoints_dir=None, budget=resumed).load_state_dict(
        json.loads(json.dumps(loop.state_dict()))
    )  # as a checkpoint keeps it
    assert (resumed.elapsed, resumed.compiling) == (50.0, 24.0) and resumed.fraction() == pytest.approx(26 / 36)
    before = training.compiled_frames()
    torch.compile(lambda x: x * 2 + 1, backend="eager")(torch.ones(3))
    assert training.compiled_frames() > before


def test_a_step_that_compiled_counts_toward_the_deadline_not_the_schedule(monkeypatch):
    """TrainLoop.step: a step during which compiled_frames() rose adds its seconds to the budget's compiling time."""
    from accelerate import Accelerator

    frames = iter([0, 1, 1, 1])  # read before and after each step: the first step compiles, the second does not
    monkeypatch.setattr(training.optim, "compiled_frames", lambda: next(frames))
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    budget = training.TimeBudget(1.0, warmup_steps=0, schedule="linear")
    scheduler = training.make_budget_scheduler(optimizer, budget, num_processes=1)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    loop = training.TrainLoop(
        SimpleNamespace(max_grad_norm=0.0, skip_nonfinite=False),
        accelerator,
        model,
        optimizer,
        scheduler,
        checkpoints_dir=None,
        budget=budget,
    )

    def micro_batch():
        time.sleep(0.05)
        return model(torch.ones(4, 2)).pow(2).mean()

    loop.step([micro_batch], step=1)
    first = budget.compiling
    assert 0.05 <= first == budget.elapsed <= loop.elapsed and budget.fraction() == 0.0
    loop.step([micro_batch], step=2)
    assert budget.compiling == first and budget.elapsed - first >= 0.05 and budget.fraction() > 0.0


@pytest.mark.parametrize("max_grad_norm", [0.0, 0.05])
def test_accumulated_micro_batches_take_one_step_on_their_mean_gradient(max_grad_norm):
    """--gradient_accumulation_steps 3: TrainLoop.step takes three micro-batches' losses to one optimizer step on the
    gradient of their mean (clipped as a whole), one scheduler step, gradients cleared after; it returns the mean
    loss. Two steps in a row, each against SGD on the mean by hand."""
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=3)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))  # halves at step 1
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    args = SimpleNamespace(max_grad_norm=max_grad_norm, skip_nonfinite=False)
    loop = training.TrainLoop(args, accelerator, model, optimizer, scheduler, checkpoints_dir=None)
    gen = torch.Generator().manual_seed(0)
    for step, rate in ((1, 0.5), (2, 0.25)):
        batches = [(torch.randn(4, 3, generator=gen), torch.randn(4, 1, generator=gen)) for _ in range(3)]
        by_hand = copy.deepcopy(accelerator.unwrap_model(model))
        mean = sum(torch.nn.functional.mse_loss(by_hand(x), y) for x, y in batches) / 3
        mean.backward()
        if max_grad_norm:
            assert torch.nn.utils.clip_grad_norm_(by_hand.parameters(), max_grad_norm) > 2 * max_grad_norm
        with torch.no_grad():
            want = [p - rate * p.grad for p in by_hand.parameters()]
        calls = [lambda x=x, y=y: torch.nn.functional.mse_loss(model(x), y) for x, y in batches]
        assert loop.step(calls, step=step) == pytest.approx(mean.item(), rel=1e-6)
        for got, expected in zip(model.parameters(), want):
            torch.testing.assert_close(got.detach(), expected, atol=1e-6, rtol=1e-6)
            assert got.grad is None
    assert scheduler.get_last_lr() == [0.5 / 3]


@pytest.mark.parametrize("schedule", ["linear", "constant_with_warmup"])
def test_pretraining_under_a_time_budget_stops_at_the_deadline(corpus, tmp_path, schedule):
    args = tiny_args(
        corpus,
        tmp_path / "budget",
        "--max_train_minutes",
        "0.1",  # 6 s: a few steps on a loaded 2-core machine (the first is slow)
        "--eval_steps",
        "1000",
        "--lr_scheduler_type",
        schedule,
    )
    i = args.index("--max_steps")
    del args[i : i + 2]  # no step limit: the budget ends the run
    results = run_pretraining.main(args)
    records = [m for m in read_metrics(tmp_path / "budget") if "loss" in m]
    assert results["steps"] == records[-1]["step"] >= 1 and results["max_train_minutes"] == 0.1  # as many as fit
    assert results["train_seconds"] >= 6.0  # stopped at the deadline, not before
    rates = [m["learning_rate"] for m in records]
    if schedule == "linear":
        assert rates[-1] == 0.0 and all(b <= a for a, b in zip(rates[1:], rates[2:]))  # warmup, then down to zero
    else:  # the recipe's default: warmup, then the peak rate up to the deadline
        assert len(rates) >= 2 and rates[0] <= 3e-3 and rates[1:] == pytest.approx([3e-3] * (len(rates) - 1))
    assert "eval_loss" in read_metrics(tmp_path / "budget")[-1]  # the deadline's step is evaluated
    if schedule == "constant_with_warmup":  # the timed run is the step-bounded run of its step count
        steps = tiny_args(corpus, tmp_path / "steps", "--lr_scheduler_type", schedule)
        steps[steps.index("--max_steps") + 1] = str(results["steps"])
        run_pretraining.main(steps)
        assert [m["loss"] for m in read_metrics(tmp_path / "steps") if "loss" in m] == [m["loss"] for m in records]
        assert (tmp_path / "steps" / "model.safetensors").read_bytes() == (
            tmp_path / "budget" / "model.safetensors"
        ).read_bytes()


def test_time_budget_flags_are_checked_before_any_work(corpus, tmp_path):
    one_line_error(
        cli(PRETRAIN, *tiny_args(corpus, tmp_path / "a", "--max_train_minutes", "0")), "--max_train_minutes must be > 0"
    )
    one_line_error(
        command(PRETRAIN, *tiny_args(corpus, tmp_path / "b", "--max_train_minutes", "1", "--warmup_ratio", "0.1")),
        "--warmup_ratio needs a known step count",
    )
    one_line_error(
        command(
            PRETRAIN,
            *tiny_args(corpus, tmp_path / "c", "--max_train_minutes", "1", "--lr_scheduler_type", "polynomial"),
        ),
        "polynomial cannot follow a time budget",
    )
