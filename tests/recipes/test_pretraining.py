"""The pretraining recipe end to end on a tiny corpus: outputs, memory across steps, exact resume, two processes,
a fresh-environment load of the result, the token store (built once, reused, prepared alone), and flag validation."""

import json
import math
import os
import shutil
import subprocess
import sys

import pytest
import torch
from recipe_helpers import (
    PRETRAIN,
    REPO,
    assert_same_losses,
    cli,
    command,
    cut_at_step_6,
    one_line_error,
    read_metrics,
    tiny_args,
)

from pretrain import run_pretraining
from xlnet_lite import pretraining
from xlnet_lite.training import parse_args

pytestmark = pytest.mark.recipes  # runs the recipes end to end


def test_outputs_of_a_run(straight_run):
    out, results = straight_run
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "modeling_xlnet_lite.py",
        "loss.png",
        "results.json",
    ):
        assert (out / name).is_file(), name
    metrics = read_metrics(out)
    assert [m["step"] for m in metrics if "loss" in m] == list(range(1, 13))
    for key in ("loss", "learning_rate", "tokens_per_second", "elapsed"):
        assert all(key in m for m in metrics if "loss" in m)
    evals = [m for m in metrics if "eval_loss" in m]
    assert [m["step"] for m in evals] == [6, 12]
    assert all(m["eval_loss"] > 0 and "eval_loss_no_memory" in m for m in evals)
    assert results["eval_loss"] == evals[-1]["eval_loss"] and results["unigram_baseline_loss"] > 0
    # from scratch the LM bias starts at the unigram log-probabilities: the first loss is near that baseline, far
    # below the log(vocab) = 5.99 nats of a uniform prediction
    assert abs(metrics[0]["loss"] - results["unigram_baseline_loss"]) < 0.5
    assert all(math.isfinite(m["loss"]) for m in metrics if "loss" in m)
    assert [p.name for p in sorted((out / "checkpoints").iterdir())] == ["step_12", "step_6"]
    assert not list((out / "checkpoints").glob(".*tmp"))


def test_memory_is_carried_across_steps(straight_run, corpus):
    """The memory changes the validation loss, and the checkpoint holds the mems of the last step."""
    out, results = straight_run
    assert results["eval_loss"] != results["eval_loss_no_memory"]
    mems_file = out / "checkpoints" / "step_12" / "rank0_tensors.safetensors"
    from safetensors.torch import load_file

    mems = load_file(str(mems_file))
    assert len(mems) == 2 and mems["mems.0"].shape == (4, 24, 64)  # (B, mem_len, d_model), full after 12 steps


def test_mem_len_0_carries_no_memory(corpus, tmp_path):
    """--mem_len 0 pretrains without a memory: the model (as transformers' XLNet) would keep every step's states, a
    memory growing by reuse_len tokens a step; the recipe carries none, and its validation loss is the memoryless
    one."""
    results = run_pretraining.main(tiny_args(corpus, tmp_path, "--mem_len", "0"))
    assert results["eval_loss"] == results["eval_loss_no_memory"]
    from safetensors.torch import load_file

    tensors = tmp_path / "checkpoints" / "step_12" / "rank0_tensors.safetensors"
    assert not tensors.exists() or not load_file(str(tensors))
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["mem_len"] == 0 and config["use_mems_train"] is False


def test_resume_reproduces_the_uninterrupted_run(straight_run, corpus, tmp_path):
    """12 steps straight vs. 6 steps + resume: the same losses (the checkpoint at step 6 is what an interrupted run
    leaves; the resumed run restores model, optimizer, scheduler, RNG, data position and mems)."""
    out, _ = straight_run
    cut_at_step_6(out, tmp_path)
    (tmp_path / "checkpoints" / ".step_9.tmp").mkdir()  # a partial checkpoint a crash left behind: ignored
    run_pretraining.main(tiny_args(corpus, tmp_path, "--resume_from_checkpoint", "latest"))
    assert_same_losses(read_metrics(out), read_metrics(tmp_path))


def test_the_default_constant_rate_lets_a_finished_run_be_extended_exactly(corpus, tmp_path):
    """With the default schedule (constant after warmup) a 6-step run, resumed with --max_steps 12, is the 12-step
    run: its schedule did not depend on the step count. Under a linear decay the 6-step run ends at rate 0."""

    def default_schedule(args):  # tiny_args without its --lr_scheduler_type linear
        i = args.index("--lr_scheduler_type")
        return args[:i] + args[i + 2 :]

    straight = tmp_path / "straight"
    run_pretraining.main(default_schedule(tiny_args(corpus, straight)))
    rates = [m["learning_rate"] for m in read_metrics(straight) if "loss" in m]
    assert rates == pytest.approx([1.5e-3] + [3e-3] * 11)  # 2 warmup steps, then the peak rate to the end
    short = tmp_path / "short"
    args = default_schedule(tiny_args(corpus, short))
    args[args.index("--max_steps") + 1] = "6"
    run_pretraining.main(args)
    longer = tmp_path / "longer"
    (longer / "checkpoints").mkdir(parents=True)
    shutil.copytree(short / "checkpoints" / "step_6", longer / "checkpoints" / "step_6")
    shutil.copy(short / "metrics.jsonl", longer / "metrics.jsonl")
    run_pretraining.main(default_schedule(tiny_args(corpus, longer, "--resume_from_checkpoint", "latest")))
    assert_same_losses(read_metrics(straight), read_metrics(longer))
    linear = tmp_path / "linear"
    run_pretraining.main(
        args[: args.index("--output_dir")] + ["--output_dir", str(linear), "--lr_scheduler_type", "linear"]
    )
    assert [m["learning_rate"] for m in read_metrics(linear) if "loss" in m][-1] == 0.0


def test_dropout_replaces_that_of_the_weights_or_config_it_starts_from(straight_run, corpus, tmp_path):
    """--dropout is the run's dropout whatever it starts from: weights or a config saved with dropout 0, continued
    at --dropout 0.25, train and save a model whose every dropout layer drops a quarter."""
    from xlnet_lite import XLNetLiteLMHeadModel
    from xlnet_lite.modeling_xlnet_lite import Dropout

    out, _ = straight_run
    assert json.loads((out / "config.json").read_text())["dropout"] == 0.0
    for flag in ("--model_name_or_path", "--config_name"):
        dest = tmp_path / flag.strip("-")
        run_pretraining.main(
            tiny_args(
                corpus, dest, flag, str(out), "--dropout", "0.25", "--max_steps", "3", "--checkpointing_steps", "0"
            )
        )
        assert json.loads((dest / "config.json").read_text())["dropout"] == 0.25, flag
        rates = {m.p for m in XLNetLiteLMHeadModel.from_pretrained(dest).modules() if isinstance(m, Dropout)}
        assert rates == {0.25}, flag


def test_pretraining_from_a_transformers_xlnet_folder_continues_as_from_the_same_weights(
    straight_run, corpus, tmp_path
):
    """--model_name_or_path a transformers XLNetLMHeadModel folder (the recipe's model saved by to_hf_xlnet): the run
    converts it on load and trains as from the XLNet-Lite folder it came from, the same losses at every step, the
    same weights saved, as an XLNet-Lite model."""
    from safetensors.torch import load_file

    import xlnet_lite

    out, _ = straight_run
    hf_folder = tmp_path / "transformers_xlnet"
    xlnet_lite.to_hf_xlnet(xlnet_lite.XLNetLiteLMHeadModel.from_pretrained(out)).save_pretrained(hf_folder)
    assert json.loads((hf_folder / "config.json").read_text())["model_type"] == "xlnet"
    runs = {}
    for name, start in (("lite", out), ("transformers", hf_folder)):
        dest = tmp_path / name
        flags = (
            "--model_name_or_path",
            str(start),
            "--max_steps",
            "3",
            "--eval_steps",
            "3",
            "--checkpointing_steps",
            "0",
        )
        run_pretraining.main(tiny_args(corpus, dest, *flags))
        runs[name] = dest
    assert_same_losses(read_metrics(runs["lite"]), read_metrics(runs["transformers"]))
    assert json.loads((runs["transformers"] / "config.json").read_text())["model_type"] == "xlnet_lite"
    lite, converted = (load_file(runs[name] / "model.safetensors") for name in ("lite", "transformers"))
    assert lite.keys() == converted.keys()
    assert all(torch.equal(lite[k], converted[k]) for k in lite)


def test_same_seed_same_losses_in_one_process(straight_run, corpus, tmp_path):
    out, _ = straight_run
    args = tiny_args(corpus, tmp_path)
    args[args.index("--max_steps") + 1] = "5"
    args[args.index("--eval_steps") + 1] = "5"
    run_pretraining.main(args)
    again = read_metrics(tmp_path)
    run_pretraining.main(args + ["--overwrite_output_dir"])  # a fresh start in the same folder
    assert [(m["loss"], m.get("eval_loss")) for m in read_metrics(tmp_path)] == [
        (m["loss"], m.get("eval_loss")) for m in again
    ]


def test_output_loads_in_a_fresh_environment(straight_run, tmp_path):
    out, _ = straight_run
    code = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'xlnet_lite': raise ImportError('blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import torch\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "model = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True).eval()\n"
        "tok = AutoTokenizer.from_pretrained(sys.argv[1])\n"
        "ids = tok('The market rose today.', return_tensors='pt')['input_ids']\n"
        "T = ids.shape[1]\n"
        "perm = torch.zeros(1, T, T); perm[0, :, 2] = 1\n"
        "tm = torch.zeros(1, 1, T); tm[0, 0, 2] = 1\n"
        "print(type(model).__name__, tuple(model(ids, perm_mask=perm, target_mapping=tm).logits.shape))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1")
    result = subprocess.run(
        [sys.executable, "-c", code, str(out)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "XLNetLiteLMHeadModel (1, 1, 400)" in result.stdout


def test_two_processes_with_torchrun(corpus, tmp_path):
    """Two real processes (gloo, accelerate's MULTI_CPU): each rank its own rows, DDP gradients, one saved model; the
    tokenizer trained in the run (main process) and the same command twice give byte-identical outputs."""
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "HF_HOME": str(tmp_path / "hf")}
    args = tiny_args(corpus, tmp_path / "out")
    i = args.index("--tokenizer_name")
    args[i : i + 2] = ["--vocab_size", "300", "--tokenizer_train_documents", "40"]
    args[args.index("--max_steps") + 1] = "4"
    args[args.index("--eval_steps") + 1] = "4"
    args[args.index("--checkpointing_steps") + 1] = "2"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(REPO / "pretrain" / "run_pretraining.py"),
        *args,
    ]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    first = {name: (tmp_path / "out" / name).read_bytes() for name in ("model.safetensors", "tokenizer.json")}
    first_metrics = read_metrics(tmp_path / "out")
    result = subprocess.run(cmd + ["--overwrite_output_dir"], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    assert [m["loss"] for m in read_metrics(tmp_path / "out")] == [m["loss"] for m in first_metrics]
    assert [m.get("eval_loss") for m in read_metrics(tmp_path / "out")] == [m.get("eval_loss") for m in first_metrics]
    for name, data in first.items():
        assert (tmp_path / "out" / name).read_bytes() == data, name
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["num_processes"] == 2 and results["device"] == "cpu"
    cache = tmp_path / "hf" / "xlnet_lite"  # one tokenizer and one store for both ranks and both runs
    assert len(list(cache.glob("tokenizer-*"))) == 1 and len(list(cache.glob("store-*"))) == 1
    assert "tokenizing the corpus" not in result.stdout, "the second run tokenized the corpus again"
    step = tmp_path / "out" / "checkpoints" / "step_4"
    states = [json.loads((step / f"rank{r}_state.json").read_text()) for r in (0, 1)]
    assert states[0]["stream"]["layout"]["rank"] == 0 and states[1]["stream"]["layout"]["rank"] == 1
    assert (step / "rank0_tensors.safetensors").is_file() and (step / "rank1_tensors.safetensors").is_file()


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--perm_size", "20"], "perm_size"),
        (["--reuse_len", "32"], "reuse_len"),
        (["--bi_data", "--per_device_train_batch_size", "3"], "even"),
        (["--plm_probability", "1.5"], "plm_probability"),
        (["--train_file", "/nonexistent.txt"], "no such file"),
    ],
)
def test_inconsistent_flags_stop_at_once(corpus, tmp_path, flags, message):
    with pytest.raises(ValueError, match=message):
        run_pretraining.main(tiny_args(corpus, tmp_path) + flags)


@pytest.mark.parametrize(
    "flags", [["--sequence_length", "5"], ["--model_size", "huge"], ["--lr_scheduler_type", "cosin"]]
)
def test_unknown_flag_or_choice_stops(corpus, tmp_path, flags):
    with pytest.raises(SystemExit):
        run_pretraining.main(tiny_args(corpus, tmp_path) + flags)


def test_model_size_choices_are_the_presets():
    """--model_size offers exactly the presets xlnet_lite.model_utils defines (a new preset is reachable from the
    recipe, a removed one is not offered)."""
    import dataclasses
    import typing

    from xlnet_lite.model_utils import MODEL_PRESETS

    field = next(f for f in dataclasses.fields(run_pretraining.PretrainingArguments) if f.name == "model_size")
    assert set(typing.get_args(field.type)) == set(MODEL_PRESETS)


def test_config_file_with_flag_override(corpus, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("seq_len: 32\nreuse_len: 16\nmax_steps: 99\n")
    args = parse_args(run_pretraining.PretrainingArguments, ["--config", str(config), "--max_steps", "3"])
    assert (args.seq_len, args.reuse_len, args.max_steps) == (32, 16, 3)
    config.write_text("seq_length: 32\n")
    with pytest.raises(ValueError, match="unknown keys"):
        parse_args(run_pretraining.PretrainingArguments, ["--config", str(config)])


def test_embedded_corpora_joined_hold_out_each_ones_validation(monkeypatch):
    """newsgroups+news trains on both corpora's training parts; each holds out its own documents (spread over it), so
    the validation text of either is never pretrained on whatever the other's size."""
    corpora = {
        "newsgroups": [f"group message {i}" for i in range(40)] + ["  "],
        "news": [f"news article {i}" for i in range(200)],
    }
    monkeypatch.setattr(
        pretraining,
        "EMBEDDED_CORPORA",
        {name: (lambda texts=texts: list(texts), name) for name, texts in corpora.items()},
    )
    args = parse_args(
        run_pretraining.PretrainingArguments,
        ["--embedded_corpus", "newsgroups+news", "--validation_split_percentage", "10"],
    )
    train, validation = pretraining.load_corpus(args)
    groups_held = [corpora["newsgroups"][i] for i in (5, 15, 25, 35)]  # 4 of the 40 non-blank, one per stride of 10
    news_held = [corpora["news"][i] for i in range(5, 200, 10)]
    assert validation == groups_held + news_held
    assert train == [t for t in corpora["newsgroups"][:40] if t not in groups_held] + [
        t for t in corpora["news"] if t not in news_held
    ]
    args = parse_args(
        run_pretraining.PretrainingArguments, ["--embedded_corpus", "news", "--validation_split_percentage", "10"]
    )
    alone = pretraining.load_corpus(args)
    assert alone == ([t for t in corpora["news"] if t not in news_held], news_held)


def test_dataset_without_a_validation_split_holds_out_rows_spread_over_it(tmp_path):
    """A dataset with only a train split, stored topic after topic: --validation_split_percentage holds out rows from
    every part of it (not its last rows, which would be one topic), and trains on the others in order."""
    folder = tmp_path / "sorted"
    folder.mkdir()
    rows = [f"topic{t} message {d}." for t in range(5) for d in range(20)]
    (folder / "train.jsonl").write_text("".join(json.dumps({"text": r}) + "\n" for r in rows), encoding="utf-8")
    args = parse_args(
        run_pretraining.PretrainingArguments, ["--dataset_name", str(folder), "--validation_split_percentage", "5"]
    )
    train, validation = pretraining.load_corpus(args)
    assert validation["text"] == [rows[i] for i in (10, 30, 50, 70, 90)]
    assert train["text"] == [r for r in rows if r not in validation["text"]]


@pytest.mark.parametrize("streaming", [False, True])
def test_dataset_name_from_a_local_folder(corpus, tmp_path, streaming, capsys):
    """--dataset_name with a datasets-loadable folder (json lines with a text column), streamed or not: read once into
    the token store either way, the stream saying so."""
    folder = tmp_path / "news"
    folder.mkdir()
    for split, name in (("train", "train.txt"), ("validation", "valid.txt")):
        docs = (corpus / name).read_text(encoding="utf-8").split("\n\n")
        (folder / f"{split}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    args = tiny_args(corpus, tmp_path / "out")
    for flag in ("--train_file", "--validation_file"):
        i = args.index(flag)
        del args[i : i + 2]
    args[args.index("--max_steps") + 1] = "3"
    args[args.index("--eval_steps") + 1] = "3"
    args += ["--dataset_name", str(folder), "--token_store_cache_dir", str(tmp_path / "cache")]
    results = run_pretraining.main(args + (["--streaming"] if streaming else []))
    assert results["eval_loss"] > 0 and results["corpus_tokens"] > 10_000
    said = capsys.readouterr().out
    assert ("--streaming: the stream is read once, in chunks, into a token store" in said) == streaming
    assert said.count("tokenizing the corpus into") == 1


def without_corpus_flags(args):
    for flag in ("--train_file", "--validation_file", "--tokenizer_name"):
        i = args.index(flag)
        del args[i : i + 2]
    return args


def test_prepare_only_then_train_from_the_token_store(straight_run, corpus, tmp_path, capsys):
    """--prepare_only builds the store (nothing trained), a second --prepare_only finds it; a run with --token_store and
    no corpus flags trains exactly as the run that read the corpus."""
    cache = ["--token_store_cache_dir", str(tmp_path / "cache")]
    prepared = run_pretraining.main(tiny_args(corpus, tmp_path / "prep") + cache + ["--prepare_only"])
    assert "tokenizing the corpus" in capsys.readouterr().out
    assert not (tmp_path / "prep" / "model.safetensors").exists() and prepared["train"]["tokens"] > 10_000
    again = run_pretraining.main(tiny_args(corpus, tmp_path / "prep2") + cache + ["--prepare_only"])
    assert again["token_store"] == prepared["token_store"] and "tokenizing" not in capsys.readouterr().out
    args = without_corpus_flags(tiny_args(corpus, tmp_path / "from_store")) + ["--token_store", prepared["token_store"]]
    run_pretraining.main(args)
    assert_same_losses(read_metrics(straight_run[0]), read_metrics(tmp_path / "from_store"))


@pytest.mark.parametrize(
    "extra,says",
    [
        (["--token_store", "{tmp}/nothing"], "--token_store {tmp}/nothing: not a complete token store"),
        (["--token_store", "{tmp}", "--train_file", "x.txt"], "--token_store holds the corpus and its tokenizer"),
        (["--preprocessing_num_workers", "0"], "--preprocessing_num_workers must be >= 1"),
    ],
)
def test_a_bad_token_store_flag_is_one_line(corpus, tmp_path, extra, says):
    args = without_corpus_flags(tiny_args(corpus, tmp_path / "out"))
    if "--token_store" not in extra:
        args += ["--train_file", corpus / "train.txt"]
    extra = [e.format(tmp=tmp_path) for e in extra]
    run_command = cli if "--preprocessing_num_workers" in extra else command  # one as a real command
    one_line_error(run_command(PRETRAIN, *args, *extra), says.format(tmp=tmp_path))


def test_tokenizer_trained_on_documents_spread_over_a_sorted_corpus(corpus, tmp_path, capsys):
    """A corpus stored by topic (as 20 Newsgroups' files are, group after group): the recipe's tokenizer, trained on
    fewer documents than the corpus holds, is the one trained on documents spread over all of it, and cuts the last
    topic's words into fewer pieces than a tokenizer of the first documents does."""
    from xlnet_lite.data import read_text_documents, spread_documents
    from xlnet_lite.tokenization_xlnet_lite import load_tokenizer, train_tokenizer

    last = ["xylophone", "yodeller", "zeppelin", "quasar", "walrus"]
    docs = read_text_documents(corpus / "train.txt")[:20] + [
        " ".join(last[(i + j) % 5] for j in range(60)) for i in range(20)
    ]
    (tmp_path / "train.txt").write_text("\n\n".join(docs), encoding="utf-8")
    args = without_corpus_flags(tiny_args(corpus, tmp_path / "out"))
    args += [
        "--train_file",
        str(tmp_path / "train.txt"),
        "--validation_file",
        str(corpus / "valid.txt"),
        "--vocab_size",
        "120",
        "--tokenizer_train_documents",
        "10",
        "--prepare_only",
        "--token_store_cache_dir",
        str(tmp_path / "cache"),
    ]
    run_pretraining.main(args)
    assert "on 10 training documents spread evenly over the corpus" in capsys.readouterr().out
    trained = load_tokenizer(tmp_path / "out" / "tokenizer")
    spread = train_tokenizer(spread_documents(docs, 10), vocab_size=120)
    assert trained.backend_tokenizer.to_str() == spread.backend_tokenizer.to_str()
    first_ten = train_tokenizer(docs[:10], vocab_size=120)
    pieces = [sum(len(t.tokenize(word)) for word in last) for t in (trained, first_ten)]
    assert pieces[0] < 0.75 * pieces[1], pieces


def test_a_damaged_token_store_is_caught_before_the_first_step(corpus, tmp_path, capsys):
    """Token ids in a prepared store's train.tokens rewritten to 0xFFFF (outside the 400-piece vocabulary): passed
    as --token_store, the command (in this process: `command`) stops before training with one error line naming the
    file (exit status 2, no traceback); found in the cache, the next run says so in one warning line, builds the
    store again and trains."""
    cache = ["--token_store_cache_dir", str(tmp_path / "cache")]
    prepared = run_pretraining.main(tiny_args(corpus, tmp_path / "prep") + cache + ["--prepare_only"])
    store = prepared["token_store"]
    damaged = os.path.join(store, "train.tokens")
    with open(damaged, "r+b") as f:
        f.seek(1000)
        f.write(b"\xff" * 128)
    explicit = [*without_corpus_flags(tiny_args(corpus, tmp_path / "explicit")), "--token_store", store]
    one_line_error(command(PRETRAIN, *explicit), f"--token_store {store}: {damaged}: chunk 0 of 1")
    assert not (tmp_path / "explicit" / "metrics.jsonl").exists()
    capsys.readouterr()
    args = tiny_args(corpus, tmp_path / "cached") + cache
    for flag, value in (("--max_steps", "2"), ("--eval_steps", "2"), ("--checkpointing_steps", "2")):
        args[args.index(flag) + 1] = value
    results = run_pretraining.main(args)
    said = capsys.readouterr().out
    warnings = [line for line in said.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: {damaged}: chunk 0 of 1 "), said[-2000:]
    assert said.count("tokenizing the corpus into") == 1 and math.isfinite(results["eval_loss"])
    assert [m["step"] for m in read_metrics(tmp_path / "cached") if "loss" in m] == [1, 2]
