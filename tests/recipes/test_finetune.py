"""The finetuning recipe (finetune/run_glue.py) end to end on tiny data, its metrics against hand-computed
values, its errors on bad data, and the long-document modes (head and tail, windows, mems)."""

import json
import math
import os
import shutil
import subprocess
import sys

import datasets
import numpy as np
import pytest
import torch
import transformers
from accelerate import Accelerator
from recipe_helpers import (
    BAD,
    FINETUNE,
    GOOD,
    cli,
    command,
    one_line_error,
    run,
    sentiment_rows,
    write_rows,
)
from recipe_helpers import (
    CLASSIFIER_TINY as TINY,
)
from recipe_helpers import (
    REPO as ROOT,
)
from safetensors.torch import load_file

import xlnet_lite
from finetune import run_glue
from xlnet_lite import glue_metrics
from xlnet_lite.classification_data import (
    SegmentCollator,
    SegmentCountBatchSampler,
    Split,
    make_loader,
    pool_windows,
    read_labels,
    text_labels,
    tokenize_split,
)
from xlnet_lite.model_utils import reinit_top_layers
from xlnet_lite.training import parameter_groups

pytestmark = [pytest.mark.recipes, pytest.mark.usefixtures("one_thread")]  # the recipes end to end, on one thread

# ----------------------------------------------------------------------------------------------------------
# Metrics against hand-computed values


def test_accuracy_and_f1_by_hand():
    preds, refs = [1, 0, 1, 1, 0, 1], [1, 0, 0, 1, 1, 1]
    # tp = 3 (positions 0, 3, 5), fp = 1 (position 2), fn = 1 (position 4): precision 3/4, recall 3/4
    assert glue_metrics.glue_metrics("mrpc", preds, refs) == pytest.approx({"accuracy": 4 / 6, "f1": 0.75})
    assert glue_metrics.glue_metrics("sst2", preds, refs) == pytest.approx({"accuracy": 4 / 6})


def test_matthews_by_hand():
    preds, refs = [1, 1, 0, 0, 1], [1, 0, 0, 0, 1]
    tp, tn, fp, fn = 2, 2, 1, 0
    mcc = (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    assert glue_metrics.glue_metrics("cola", preds, refs)["matthews_correlation"] == pytest.approx(mcc)  # 2/sqrt(6)


def test_pearson_spearman_by_hand():
    preds, refs = [1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 2.0, 5.0]
    dp, dr = np.array(preds) - 2.5, np.array(refs) - 2.75
    pearson = (dp * dr).sum() / math.sqrt((dp**2).sum() * (dr**2).sum())
    # ranks of refs: 1, 3, 2, 4; Spearman = 1 - 6 * sum(d^2) / (n (n^2 - 1)) = 1 - 6 * 2 / 60
    scores = glue_metrics.glue_metrics("stsb", preds, refs)
    assert scores["pearson"] == pytest.approx(pearson)
    assert scores["spearmanr"] == pytest.approx(0.8)


def test_file_metrics_regression_and_multiclass():
    reg = glue_metrics.file_metrics([1.0, 2.0, 4.0], [1.0, 2.0, 3.0], is_regression=True, num_labels=1)
    assert reg["mse"] == pytest.approx(1 / 3)
    multi = glue_metrics.file_metrics([0, 1, 2, 2], [0, 1, 1, 2], is_regression=False, num_labels=3)
    assert multi == {"accuracy": 0.75}
    with pytest.raises(ValueError, match="task_name"):
        glue_metrics.glue_metrics("imdb", [0], [0])


# ----------------------------------------------------------------------------------------------------------
# End to end


def test_end_to_end_csv(tmp_path, pretrained):
    train = write_rows(tmp_path / "train.csv", sentiment_rows())
    valid = write_rows(tmp_path / "valid.csv", sentiment_rows(1))
    test = write_rows(tmp_path / "test.csv", [{"sentence": s} for s in GOOD[:3] + BAD[:2]])
    results, out = run(tmp_path, pretrained, "--train_file", train, "--validation_file", valid, "--test_file", test)
    eval_results = json.loads((out / "eval_results.json").read_text())
    assert set(eval_results) == {"accuracy", "f1"}
    all_results = json.loads((out / "all_results.json").read_text())
    assert all_results["eval_accuracy"] == eval_results["accuracy"] == results["eval_accuracy"]
    assert all_results["epochs"] == 2 and 1 <= all_results["best_epoch"] <= 2
    lines = (out / "predict_results.tsv").read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == 6
    assert {line.split("\t")[1] for line in lines[1:]} <= {"neg", "pos"}
    assert (out / "training_curves.png").stat().st_size > 1000
    history = json.loads((out / "history.json").read_text())
    assert [h["epoch"] for h in history] == [1, 2] and all(np.isfinite(h["train_loss"]) for h in history)

    # the best model reloads through the Auto class with remote code, in eval mode equal to the recipe's predictions
    model = transformers.AutoModelForSequenceClassification.from_pretrained(out, trust_remote_code=True).eval()
    assert model.config.id2label == {0: "neg", 1: "pos"} and model.config.num_labels == 2
    assert model.config.dropout == 0.1  # --dropout default
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    enc = tokenizer(GOOD[:3] + BAD[:2], padding=True, return_tensors="pt")
    assert tokenizer.padding_side == "left"
    with torch.no_grad():
        predicted = model(**enc).logits.argmax(-1)
    assert [model.config.id2label[int(i)] for i in predicted] == [line.split("\t")[1] for line in lines[1:]]


def test_attn_type_finetunes_a_bidirectional_model_causally(tmp_path, pretrained):
    """--attn_type uni: the classifier trains and is saved causal (as --objective clm pretrains), and computes
    causal attention, not the pretrained model's bidirectional one (weights scaled up so that attention is far from
    uniform: at the initial scale the two differ by 1e-4)."""
    train = write_rows(tmp_path / "train.jsonl", sentiment_rows())
    _, out = run(tmp_path, pretrained, "--train_file", train, "--validation_file", train, "--attn_type", "uni")
    assert json.loads((pretrained / "config.json").read_text())["attn_type"] == "bi"
    model = transformers.AutoModelForSequenceClassification.from_pretrained(out, trust_remote_code=True).eval()
    assert model.config.attn_type == "uni"
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    enc = tokenizer(GOOD[:3] + BAD[:2], padding=True, return_tensors="pt")
    bidirectional = xlnet_lite.XLNetLiteForSequenceClassification.from_pretrained(out, attn_type="bi").eval()
    with torch.no_grad():
        for a, b in zip(model.parameters(), bidirectional.parameters(), strict=True):
            a.mul_(8.0), b.mul_(8.0)
        causal, both = model(**enc).logits, bidirectional(**enc).logits
    # <cls>, last, reads every position either way, but in a causal model the others never read a later one
    assert (causal - both).abs().max() > 0.1


def test_learns_the_tiny_task(tmp_path, pretrained):
    """A few epochs on 24 sentences separate the two classes of the training data (the validation set here)."""
    train = write_rows(tmp_path / "train.jsonl", sentiment_rows(label=lambda good: int(good)))
    results, _ = run(
        tmp_path,
        pretrained,
        "--train_file",
        train,
        "--validation_file",
        train,
        "--learning_rate",
        "3e-3",
        "--per_device_train_batch_size",
        "8",
        epochs=10,
    )
    assert results["eval_accuracy"] >= 0.9


def test_eval_strategy_no_keeps_the_last_epoch_and_scores_validation_once(tmp_path, pretrained, monkeypatch):
    train = write_rows(tmp_path / "train.csv", sentiment_rows(2))
    calls, evaluate = [], run_glue.evaluate
    monkeypatch.setattr(run_glue, "evaluate", lambda *args, **kwargs: calls.append(1) or evaluate(*args, **kwargs))
    run(tmp_path / "every", pretrained, "--train_file", train, "--validation_file", train, epochs=3)
    assert len(calls) == 3
    results, out = run(
        tmp_path / "last",
        pretrained,
        "--train_file",
        train,
        "--validation_file",
        train,
        "--eval_strategy",
        "no",
        epochs=3,
    )
    assert len(calls) == 4
    history = json.loads((out / "history.json").read_text())
    every = json.loads((tmp_path / "every" / "out" / "history.json").read_text())
    assert ["eval_accuracy" in r for r in history] == [False, False, True]
    assert results["best_epoch"] == 3 and results["eval_accuracy"] == history[-1]["eval_accuracy"]
    # evaluating draws no randomness: the same training, and the last epoch scores as in the run that scored each
    assert [r["train_loss"] for r in history] == [r["train_loss"] for r in every]
    assert history[-1]["eval_accuracy"] == every[-1]["eval_accuracy"]


def test_tsv_pairs_regression(tmp_path, pretrained):
    rows = [
        {"sentence1": a, "sentence2": b, "label": float(i % 5)} for i, (a, b) in enumerate(zip(GOOD + BAD, BAD + GOOD))
    ]
    train = write_rows(tmp_path / "train.tsv", rows)
    results, out = run(
        tmp_path,
        pretrained,
        "--train_file",
        train,
        "--validation_file",
        train,
        "--test_file",
        train,
        epochs=1,
    )
    assert set(json.loads((out / "eval_results.json").read_text())) == {"pearson", "spearmanr", "mse"}
    model = transformers.AutoModelForSequenceClassification.from_pretrained(out)
    assert model.config.num_labels == 1 and model.config.problem_type == "regression"
    assert "test_pearson" in results
    float((out / "predict_results.tsv").read_text().splitlines()[1].split("\t")[1])


def test_glue_task_layout_mnli(tmp_path, pretrained, monkeypatch):
    """--task_name reads nyu-mll/glue (stubbed here: no Hub in tests): columns renamed, matched and mismatched
    validation scored (accuracy, accuracy_mm), test labels (-1) ignored."""
    import datasets

    features = datasets.Features(
        {
            "premise": datasets.Value("string"),
            "hypothesis": datasets.Value("string"),
            "label": datasets.ClassLabel(names=["entailment", "neutral", "contradiction"]),
            "idx": datasets.Value("int32"),
        }
    )

    def split(n, labelled=True):
        return datasets.Dataset.from_dict(
            {
                "premise": (GOOD + BAD)[:n],
                "hypothesis": (BAD + GOOD)[:n],
                "label": [i % 3 if labelled else -1 for i in range(n)],
                "idx": list(range(n)),
            },
            features=features,
        )

    glue = datasets.DatasetDict(
        {
            "train": split(12),
            "validation_matched": split(6),
            "validation_mismatched": split(5),
            "test_matched": split(4, labelled=False),
        }
    )
    calls = []
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: calls.append(a) or glue)
    results, out = run(tmp_path, pretrained, "--task_name", "mnli", epochs=1)
    assert calls == [("nyu-mll/glue", "mnli")]
    assert set(json.loads((out / "eval_results.json").read_text())) == {"accuracy", "accuracy_mm"}
    assert not any(k.startswith("test_accuracy") for k in results)
    predictions = (out / "predict_results.tsv").read_text().splitlines()[1:]
    assert len(predictions) == 4 and {p.split("\t")[1] for p in predictions} <= {
        "entailment",
        "neutral",
        "contradiction",
    }


def test_random_init_from_config_and_layerwise_decay(tmp_path, pretrained):
    train = write_rows(tmp_path / "train.csv", sentiment_rows(1))
    out = tmp_path / "out"
    results = run_glue.main(
        [
            "--config_name",
            str(pretrained),
            "--tokenizer_name",
            str(pretrained),
            "--train_file",
            train,
            "--output_dir",
            str(out),
            "--num_train_epochs",
            "2",
            "--layerwise_lr_decay",
            "0.5",
            "--dropout",
            "0.25",
        ]
    )
    assert "eval_accuracy" not in results and (out / "model.safetensors").is_file()
    assert json.loads((out / "config.json").read_text())["dropout"] == 0.25  # --dropout overrides the config's 0.1
    assert results["best_epoch"] == 2  # no validation split: the last epoch is the result

    model = xlnet_lite.XLNetLiteForSequenceClassification(
        xlnet_lite.XLNetLiteConfig(vocab_size=60, **{**TINY, "n_layer": 3})
    )
    groups = parameter_groups(model, learning_rate=1.0, weight_decay=0.01, layerwise_lr_decay=0.5)
    lr_of = {id(p): g["lr"] for g in groups for p in g["params"]}
    named = dict(model.named_parameters())
    assert lr_of[id(named["logits_proj.weight"])] == 1.0
    assert lr_of[id(named["transformer.layer.2.ff.layer_1.weight"])] == 1.0
    assert lr_of[id(named["transformer.layer.1.rel_attn.q"])] == 0.5
    assert lr_of[id(named["transformer.layer.0.rel_attn.q"])] == 0.25
    assert lr_of[id(named["transformer.word_embedding.weight"])] == 0.125
    wd_of = {id(p): g["weight_decay"] for g in groups for p in g["params"]}
    assert wd_of[id(named["transformer.layer.0.ff.layer_1.bias"])] == 0.0
    assert wd_of[id(named["transformer.layer.0.ff.layer_1.weight"])] == 0.01
    assert sum(len(g["params"]) for g in groups) == len(named)


@pytest.mark.parametrize("untie_r", [True, False])
def test_reinit_top_layers_redraws_those_layers_only(untie_r):
    torch.manual_seed(0)
    model = xlnet_lite.XLNetLiteForSequenceClassification(
        xlnet_lite.XLNetLiteConfig(vocab_size=60, untie_r=untie_r, **{**TINY, "n_layer": 3})
    )
    with torch.no_grad():  # every tensor away from its initial value (zero biases, LayerNorms at 1 and 0)
        for param in model.parameters():
            param.add_(0.5)
    before = {name: param.detach().clone() for name, param in model.named_parameters()}
    reinit_top_layers(model, 0)
    assert all(torch.equal(before[name], param) for name, param in model.named_parameters())
    reinit_top_layers(model, 2)
    for name, param in model.named_parameters():
        redrawn = name.startswith(("transformer.layer.1.", "transformer.layer.2."))
        assert torch.equal(before[name], param) != redrawn, name
        if redrawn and ("layer_norm" in name or name.endswith(".bias")):
            assert torch.all(param == (1.0 if name.endswith("layer_norm.weight") else 0.0)), name
        elif redrawn and param.dim() == 2 and param.numel() > 500:
            assert abs(param.std().item() - model.config.initializer_range) < 0.005, name
    with pytest.raises(ValueError, match="n_layer=3"):
        reinit_top_layers(model, 4)


def test_finetuning_with_reinit_layers(tmp_path, pretrained):
    train = write_rows(tmp_path / "train.csv", sentiment_rows(1))
    results, out = run(
        tmp_path, pretrained, "--train_file", train, "--validation_file", train, "--reinit_layers", "2", epochs=1
    )
    assert "eval_accuracy" in results and (out / "model.safetensors").is_file()
    assert json.loads((out / "run_args.json").read_text())["reinit_layers"] == 2


@pytest.mark.parametrize(
    "extra,says",
    [
        (["--reinit_layers", "3"], "has 2 layers"),
        (["--reinit_layers", "-1"], "must be >= 0"),
        (["--reinit_layers", "1", "--config_name", "CONFIG"], "--config_name"),
    ],
)
def test_bad_reinit_layers_is_one_line(tmp_path, pretrained, extra, says):
    train = write_rows(tmp_path / "train.csv", sentiment_rows(1))
    init = [] if "--config_name" in extra else ["--model_name_or_path", pretrained]
    extra = [str(pretrained) if x == "CONFIG" else x for x in extra]
    args = [*init, *extra, "--train_file", train, "--output_dir", tmp_path / "out"]
    if says == "has 2 layers":  # one as a real command (found once the model is loaded)
        result = cli(FINETUNE, *args, env={"HF_HOME": str(tmp_path / "hf")})
    else:
        result = command(FINETUNE, *args)
    one_line_error(result, "--reinit_layers", says)
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_converted_transformers_xlnet_checkpoint(tmp_path, pretrained):
    hf_dir = tmp_path / "hf_xlnet"
    config = transformers.XLNetConfig(vocab_size=60, **TINY)
    transformers.XLNetLMHeadModel(config).save_pretrained(hf_dir)
    train = write_rows(tmp_path / "train.csv", sentiment_rows(1))
    results, out = run(
        tmp_path,
        hf_dir,
        "--tokenizer_name",
        str(pretrained),
        "--train_file",
        train,
        "--validation_file",
        train,
        epochs=1,
    )
    assert json.loads((out / "config.json").read_text())["model_type"] == "xlnet_lite"
    assert "eval_accuracy" in results


def test_checkpoint_resume_matches_uninterrupted_run(tmp_path, pretrained):
    """Resuming from checkpoints/step_4 (inside epoch 2: 3 steps per epoch) retraces the uninterrupted run:
    same batches, same dropout (the pretrained fixture has dropout 0.1), same losses and metrics."""
    train = write_rows(tmp_path / "train.csv", sentiment_rows(1))
    common = ["--train_file", train, "--validation_file", train, "--checkpointing_steps", "4"]
    straight, out = run(tmp_path / "a", pretrained, *common, epochs=2)
    ckpt = out / "checkpoints" / "step_4"
    assert ckpt.is_dir() and not list(ckpt.parent.glob(".tmp*"))
    assert json.loads((ckpt / "trainer_state.json").read_text())["step"] == 4

    interrupted = tmp_path / "b" / "out"
    shutil.copytree(out, interrupted)
    shutil.rmtree(interrupted / "checkpoints" / "step_6")  # killed after the checkpoint of step 4
    for name in ("all_results.json", "eval_results.json", "history.json", "training_curves.png"):
        (interrupted / name).unlink()
    resumed, _ = run(tmp_path / "b", pretrained, *common, "--resume_from_checkpoint", "latest", epochs=2)
    history = json.loads((interrupted / "history.json").read_text())
    assert history == json.loads((out / "history.json").read_text())
    assert [h["step"] for h in history] == [3, 6]
    assert {k: v for k, v in resumed.items() if "runtime" not in k} == {
        k: v for k, v in straight.items() if "runtime" not in k
    }


# ----------------------------------------------------------------------------------------------------------
# Bad data stops with a message naming the file and the column


def test_missing_column(tmp_path, pretrained):
    train = write_rows(tmp_path / "train.csv", [{"label": i % 2} for i in range(len(GOOD))])
    with pytest.raises(ValueError, match=r"train\.csv: no text column"):
        run(tmp_path, pretrained, "--train_file", train)
    no_label = write_rows(tmp_path / "nolabel.csv", [{"sentence": s} for s in GOOD])
    with pytest.raises(ValueError, match=r"nolabel\.csv.*`label`"):
        run(tmp_path, pretrained, "--train_file", no_label)


def test_empty_file(tmp_path, pretrained):
    train = write_rows(tmp_path / "train.csv", sentiment_rows(1))
    empty = tmp_path / "valid.csv"
    empty.write_text("")
    with pytest.raises(ValueError, match=r"valid\.csv.*empty"):
        run(tmp_path, pretrained, "--train_file", train, "--validation_file", str(empty))
    header_only = tmp_path / "header.csv"
    header_only.write_text("sentence,label\n")
    with pytest.raises(ValueError, match=r"header\.csv.*no rows"):
        run(tmp_path, pretrained, "--train_file", str(header_only))


def test_unseen_validation_label(tmp_path, pretrained):
    train = write_rows(tmp_path / "train.csv", sentiment_rows(1))
    valid = write_rows(
        tmp_path / "valid.csv", [{"sentence": "so so", "label": "meh"}, {"sentence": "good", "label": "pos"}]
    )
    with pytest.raises(ValueError, match=r"valid\.csv.*`label`.*meh"):
        run(tmp_path, pretrained, "--train_file", train, "--validation_file", valid)


def test_checkpoint_with_other_number_of_labels(tmp_path, pretrained):
    train = write_rows(tmp_path / "train.csv", sentiment_rows(1))
    _, finetuned = run(tmp_path / "first", pretrained, "--train_file", train, epochs=1)
    three = write_rows(tmp_path / "three.csv", sentiment_rows(1) + [{"sentence": "it was fine", "label": "mixed"}])
    with pytest.raises(ValueError, match=r"out.*2 labels.*`label`.*three\.csv.*3"):
        run(tmp_path / "second", finetuned, "--train_file", three)
    # a head with the same label names in another order: the checkpoint's label ids are kept
    config = json.loads((finetuned / "config.json").read_text())
    config.update(id2label={"0": "pos", "1": "neg"}, label2id={"pos": 0, "neg": 1})
    (finetuned / "config.json").write_text(json.dumps(config))
    _, again = run(tmp_path / "third", finetuned, "--train_file", train, epochs=1)
    assert json.loads((again / "config.json").read_text())["id2label"] == {"0": "pos", "1": "neg"}


def test_missing_default_pretraining_output(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="run_pretraining.py.*--model_name_or_path"):
        run_glue.main(["--train_file", write_rows(tmp_path / "t.csv", sentiment_rows(1))])


# ----------------------------------------------------------------------------------------------------------
# Long documents: head and tail


def test_head_tail_keeps_the_first_and_the_last_tokens(pretrained):
    """A long text keeps its first head_len tokens and its last max_len - head_len (<sep> <cls> among them), token
    types cut alike; a text that fits is whole; truncate mode keeps the first max_len."""
    tokenizer = xlnet_lite.tokenization_xlnet_lite.load_tokenizer(pretrained)
    long_text, short_text = " . ".join(GOOD + BAD), GOOD[0]
    split = Split(datasets.Dataset.from_dict({"sentence": [long_text, short_text], "label": [1, 0]}), "t.csv")
    labels = read_labels(split)
    full = tokenizer([long_text, short_text])
    L, H = 16, 5
    assert len(full["input_ids"][0]) > 2 * L and len(full["input_ids"][1]) < L
    ht = tokenize_split(split, tokenizer, labels, "t.csv", max_len=L, mode="head_tail", head_len=H, max_samples=None)
    ids, types = full["input_ids"][0], full["token_type_ids"][0]
    assert ht["input_ids"][0] == ids[:H] + ids[-(L - H) :] and len(ht["input_ids"][0]) == L
    assert ht["token_type_ids"][0] == types[:H] + types[-(L - H) :]
    assert ht["input_ids"][0][-2:] == tokenizer.convert_tokens_to_ids(["<sep>", "<cls>"])
    assert ht["input_ids"][1] == full["input_ids"][1] and ht["n_segments"] == [1, 1]
    quarter = tokenize_split(split, tokenizer, labels, "t.csv", max_len=L, mode="head_tail", max_samples=None)
    assert quarter["input_ids"][0] == ids[: L // 4] + ids[-(L - L // 4) :]
    tail_only = tokenize_split(
        split, tokenizer, labels, "t.csv", max_len=L, mode="head_tail", head_len=0, max_samples=None
    )
    assert tail_only["input_ids"][0] == ids[-L:]
    head = tokenize_split(split, tokenizer, labels, "t.csv", max_len=L, mode="truncate", max_samples=None)
    assert head["input_ids"][0][: L - 2] == ids[: L - 2] and head["input_ids"][0] != ht["input_ids"][0]


def test_head_tail_mode_end_to_end(tmp_path, pretrained):
    train = write_rows(tmp_path / "train.jsonl", long_rows())
    results, out = run(
        tmp_path,
        pretrained,
        "--train_file",
        train,
        "--validation_file",
        train,
        "--test_file",
        train,
        "--long_document_mode",
        "head_tail",
        epochs=1,
    )
    assert results["long_document_mode"] == "head_tail" and results["head_len"] == 4  # a quarter of 16 tokens
    assert len((out / "predict_results.tsv").read_text().splitlines()) == 1 + len(long_rows())


@pytest.mark.parametrize(
    "extra,says",
    [
        (["--head_len", "3"], "--head_len is for --long_document_mode head_tail"),
        (["--long_document_mode", "head_tail", "--head_len", "15"], "[0, max_seq_length - 2 = 14]"),
        (["--long_document_mode", "head_tail", "PAIRS"], "`sentence1`, `sentence2`"),
        (["--max_windows", "2"], "--max_windows is for --long_document_mode windows"),
        (["--long_document_mode", "windows", "--max_windows", "0"], "--max_windows must be >= 1"),
        (["--long_document_mode", "windows", "PAIRS"], "windows reads one text column"),
    ],
)
def test_bad_head_tail_is_one_line(tmp_path, pretrained, extra, says):
    rows = sentiment_rows(1)
    if "PAIRS" in extra:
        rows = [{"sentence1": r["sentence"], "sentence2": r["sentence"], "label": r["label"]} for r in rows]
    train = write_rows(tmp_path / "train.csv", rows)
    extra = [x for x in extra if x != "PAIRS"]
    result = command(
        FINETUNE,
        "--model_name_or_path",
        pretrained,
        "--max_seq_length",
        "16",
        *extra,
        "--train_file",
        train,
        "--output_dir",
        tmp_path / "out",
    )
    one_line_error(result, says)
    assert not (tmp_path / "out" / "model.safetensors").exists()


# ----------------------------------------------------------------------------------------------------------
# Long documents: every window


def test_windows_tile_the_text_each_closed_like_a_truncated_one(pretrained):
    """A row per window: the first is what truncation keeps, their bodies tile the text in order, each ends with
    <sep> <cls> (token types alike), labels and text numbers repeat per window; --max_windows keeps the first N; a
    short text is one window; text_labels gives one label per text."""
    tokenizer = xlnet_lite.tokenization_xlnet_lite.load_tokenizer(pretrained)
    long_text, short_text = " . ".join(GOOD + BAD), GOOD[0]
    split = Split(
        datasets.Dataset.from_dict({"sentence": [short_text, long_text, short_text], "label": [0, 1, 0]}), "t.csv"
    )
    labels = read_labels(split)
    L = 16
    full = tokenizer(long_text)
    body, end, end_types = full["input_ids"][:-2], full["input_ids"][-2:], full["token_type_ids"][-2:]
    n = -(-len(body) // (L - 2))
    assert n >= 3 and end == tokenizer.convert_tokens_to_ids(["<sep>", "<cls>"])
    win = tokenize_split(split, tokenizer, labels, "t.csv", max_len=L, mode="windows", max_samples=None)
    head = tokenize_split(split, tokenizer, labels, "t.csv", max_len=L, mode="truncate", max_samples=None)
    assert win["text_index"] == [0] + [1] * n + [2] and win["labels"] == [0] + [1] * n + [0]
    assert win["index"] == list(range(n + 2)) and set(win["n_segments"]) == {1}
    rows, types = win["input_ids"][1 : n + 1], win["token_type_ids"][1 : n + 1]
    assert rows[0] == head["input_ids"][1] and types[0] == head["token_type_ids"][1]
    assert [i for r in rows for i in r[:-2]] == body and all(r[-2:] == end for r in rows)
    assert all(t[-2:] == end_types and set(t[:-2]) == {0} for t in types)
    assert all(len(r) == L for r in rows[:-1]) and len(rows[-1]) <= L
    assert win["input_ids"][0] == head["input_ids"][0] == tokenizer(short_text)["input_ids"]
    assert text_labels(win) == [0, 1, 0] == text_labels(head)
    capped = tokenize_split(
        split, tokenizer, labels, "t.csv", max_len=L, mode="windows", max_samples=None, max_windows=2
    )
    assert capped["text_index"] == [0, 1, 1, 2] and capped["input_ids"][1:3] == rows[:2]


def test_pool_windows_takes_the_highest_mean_probability():
    """Pooled per text in dataset order: the class of the highest mean probability (here not the class of the highest
    mean logit), a one-window text its own argmax; regression the mean score."""
    logits = np.array([[8.0, 0.0], [0.0, 2.0], [0.0, 2.0], [2.0, 0.0], [0.0, 0.5], [0.0, 0.5]])
    text_index = [0, 0, 0, 1, 2, 2]
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    assert probs[:3].mean(0).argmax() == 1 and logits[:3].mean(0).argmax() == 0  # the two rules differ on text 0
    assert pool_windows(logits, text_index, is_regression=False).tolist() == [1, 0, 1]
    np.testing.assert_allclose(pool_windows(np.array([1.0, 3.0, 5.0]), [0, 0, 1], is_regression=True), [2.0, 5.0])


def test_windows_predictions_pool_each_window_classified_alone(pretrained):
    """predict() in windows mode: per text, the pooled probabilities of its windows each classified alone, whatever
    order the evaluation batches take."""
    tokenizer = xlnet_lite.tokenization_xlnet_lite.load_tokenizer(pretrained)
    rows = long_rows(n_docs=6)
    split = Split(
        datasets.Dataset.from_dict({"sentence": [r["sentence"] for r in rows], "label": [r["label"] for r in rows]}),
        "t",
    )
    dataset = tokenize_split(split, tokenizer, read_labels(split), "t", max_len=12, mode="windows", max_samples=None)
    assert len(dataset) > 2 * len(rows)
    collator = SegmentCollator(tokenizer.pad_token_id, tokenizer.pad_token_type_id, 12)
    torch.manual_seed(0)
    # mean pooling and a large head: windows of one text get different classes (a <cls> head barely tells them apart)
    model = xlnet_lite.XLNetLiteForSequenceClassification.from_pretrained(
        pretrained, num_labels=3, summary_type="mean"
    ).eval()
    torch.nn.init.normal_(model.logits_proj.weight, std=3.0)
    accelerator = Accelerator(cpu=True)
    predictions = run_glue.predict(
        model, make_loader(dataset, collator, batch_size=4, shuffle=False, seed=0)[0], accelerator, is_regression=False
    )
    with torch.no_grad():
        alone = np.stack(
            [
                run_glue.classify(model, collator([dataset[i]]), accelerator).logits[0].numpy()
                for i in range(len(dataset))
            ]
        )
    probs = torch.tensor(alone).softmax(-1).numpy()
    expected = [probs[np.array(dataset["text_index"]) == t].mean(0).argmax() for t in range(len(rows))]
    assert predictions.tolist() == expected and len(predictions) == len(rows)
    first = [alone[dataset["text_index"].index(t)].argmax() for t in range(len(rows))]
    assert expected != first  # pooling decides something here


def test_windows_mode_end_to_end(tmp_path, pretrained):
    train = write_rows(tmp_path / "train.jsonl", long_rows())
    results, out = run(
        tmp_path,
        pretrained,
        "--train_file",
        train,
        "--validation_file",
        train,
        "--test_file",
        train,
        "--long_document_mode",
        "windows",
        "--max_windows",
        "3",
        epochs=1,
    )
    assert results["long_document_mode"] == "windows" and results["max_windows"] == 3
    assert results["train_samples"] == len(long_rows()) < results["train_windows"] <= 3 * len(long_rows())
    assert len((out / "predict_results.tsv").read_text().splitlines()) == 1 + len(long_rows())
    assert round(
        results["test_accuracy"] * len(long_rows()), 6
    ).is_integer()  # a share of the texts, not of the windows


# ----------------------------------------------------------------------------------------------------------
# Long documents through the memory


def long_rows(n_docs=8, sentences=6):
    rng = np.random.default_rng(0)
    rows = []
    for i in range(n_docs):
        good = i % 2 == 0
        pool = GOOD if good else BAD
        rows.append({"sentence": " . ".join(rng.choice(pool, sentences)), "label": int(good)})
    rows.append({"sentence": GOOD[0], "label": 1})  # one segment only
    return rows


def test_mems_mode_end_to_end(tmp_path, pretrained):
    train = write_rows(tmp_path / "train.jsonl", long_rows())
    results, out = run(
        tmp_path,
        pretrained,
        "--train_file",
        train,
        "--validation_file",
        train,
        "--test_file",
        train,
        "--long_document_mode",
        "mems",
        "--mems_backprop",
        "all",
        epochs=1,
    )
    assert results["long_document_mode"] == "mems" and "test_accuracy" in results
    assert len((out / "predict_results.tsv").read_text().splitlines()) == 1 + len(long_rows())


def test_mems_mode_segments_and_memory(pretrained):
    """Segments are cut from the start, the last one ends with <sep> <cls>; the class depends on the early
    segments through the memory; a left-padded last segment gives the same logits as alone."""
    tokenizer = xlnet_lite.tokenization_xlnet_lite.load_tokenizer(pretrained)
    texts = [" . ".join(GOOD), " . ".join(BAD[::-1]), " . ".join(GOOD[::-1] + BAD[:1])]
    enc = tokenizer(texts)
    S = 40
    rows = [
        {"input_ids": ids, "token_type_ids": tt, "index": i, "n_segments": math.ceil(len(ids) / S), "labels": 0}
        for i, (ids, tt) in enumerate(zip(enc["input_ids"], enc["token_type_ids"]))
    ]
    assert len({r["n_segments"] for r in rows}) == 1 and rows[0]["n_segments"] >= 3, [len(i) for i in enc["input_ids"]]
    collator = SegmentCollator(tokenizer.pad_token_id, tokenizer.pad_token_type_id, S)
    batch = collator(rows)
    n = rows[0]["n_segments"]
    assert tuple(batch["prefix_input_ids"].shape) == (3, n - 1, S)
    sep, cls = tokenizer.convert_tokens_to_ids(["<sep>", "<cls>"])
    assert batch["input_ids"][:, -2:].tolist() == [[sep, cls]] * 3
    assert torch.equal(
        torch.cat([batch["prefix_input_ids"][0].flatten(), batch["input_ids"][0][batch["attention_mask"][0] == 1]]),
        torch.tensor(enc["input_ids"][0]),
    )

    config = xlnet_lite.XLNetLiteConfig(vocab_size=len(tokenizer), **{**TINY, "num_labels": 2})
    torch.manual_seed(0)
    model = xlnet_lite.XLNetLiteForSequenceClassification(config).eval()
    accelerator = Accelerator(cpu=True)
    together = run_glue.classify(model, batch, accelerator).logits
    alone = torch.cat([run_glue.classify(model, collator([r]), accelerator).logits for r in rows])
    torch.testing.assert_close(together, alone)

    changed = dict(rows[0], input_ids=[7] + rows[0]["input_ids"][1:])  # only the first token of the first segment
    assert not torch.allclose(run_glue.classify(model, collator([changed]), accelerator).logits, alone[:1])

    # backpropagation through every segment: the same logits, and a gradient that reaches the first segment
    with_graph = run_glue.classify(model, batch, accelerator, backprop_all=True).logits
    torch.testing.assert_close(with_graph, together)
    embedding = model.transformer.word_embedding.weight
    for backprop_all, reaches in ((False, False), (True, True)):
        model.zero_grad()
        run_glue.classify(model, batch, accelerator, backprop_all=backprop_all).logits.sum().backward()
        first_segment_only = sorted(
            set(batch["prefix_input_ids"][:, 0].flatten().tolist()) - set(batch["input_ids"].flatten().tolist())
        )
        assert first_segment_only
        assert bool(embedding.grad[first_segment_only].abs().sum() > 0) == reaches


def test_segment_count_batches_cover_everything_once():
    counts = [1, 3, 1, 2, 3, 3, 1, 2, 1, 1]
    sampler = SegmentCountBatchSampler(counts, 2, shuffle=True, seed=3)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert len(batches) == len(sampler)
        assert sorted(i for b in batches for i in b) == list(range(len(counts)))
        assert all(len({counts[i] for i in b}) == 1 for b in batches)
    sampler.set_epoch(0)
    first = list(sampler)
    sampler.set_epoch(1)
    assert list(sampler) != first
    sampler.set_epoch(0)
    assert list(sampler) == first


@pytest.mark.parametrize("shuffle", [True, False])
def test_batches_dealt_to_two_processes_keep_one_segment_count_and_every_example(shuffle):
    """accelerate's sharding of the sampler for 2 processes (as Accelerator.prepare does it): groups of 7, 5 and 6
    examples in batches of 4 end in short batches mid-stream; every dealt batch still holds one segment count, every
    example is dealt, and both processes get as many batches as the loader's length says."""
    from accelerate.data_loader import prepare_data_loader

    counts = [1] * 7 + [2] * 5 + [3] * 6
    for epoch in (0, 1):
        dealt, lengths = [], []
        for rank in range(2):
            sampler = SegmentCountBatchSampler(counts, 4, shuffle=shuffle, seed=1)
            sampler.set_epoch(epoch)
            loader = torch.utils.data.DataLoader(list(range(len(counts))), batch_sampler=sampler, collate_fn=list)
            shard = prepare_data_loader(loader, num_processes=2, process_index=rank, put_on_device=False)
            batches = list(shard)
            assert len(batches) == len(shard) == math.ceil(len(sampler) / 2)
            assert all(len({counts[i] for i in b}) == 1 and 1 <= len(b) <= 4 for b in batches)
            dealt += [i for b in batches for i in b]
            lengths.append(len(batches))
        assert sorted(set(dealt)) == list(range(len(counts)))
        assert lengths[0] == lengths[1]


def test_evaluation_batches_go_longest_first_and_predictions_keep_dataset_order():
    """Evaluation batches hold examples of similar length (longest first within each segment count), every example
    once; predict() gives each example the score it gets alone, ordered by the `index` column."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(3, 30, size=23).tolist()
    S = 12
    rows = {
        "input_ids": [rng.integers(5, 60, size=n).tolist() for n in lengths],
        "token_type_ids": [[0] * (n - 2) + [1, 2] for n in lengths],
        "index": list(range(len(lengths))),
        "n_segments": [math.ceil(n / S) for n in lengths],
        "labels": [0.5] * len(lengths),
    }
    dataset = datasets.Dataset.from_dict(rows).select(
        list(range(len(lengths)))[::-1]
    )  # an index map: the lengths must follow it
    collator = SegmentCollator(0, 4, S)
    loader, sampler = make_loader(dataset, collator, batch_size=4, shuffle=False, seed=0)
    batches = list(sampler)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    order = [dataset[i]["input_ids"] for b in batches for i in b]
    keys = [(math.ceil(len(x) / S), -len(x)) for x in order]
    assert keys == sorted(keys)  # segment count, then longest first
    with pytest.raises(ValueError, match="shuffled"):
        SegmentCountBatchSampler(rows["n_segments"], 4, shuffle=True, lengths=lengths)

    config = xlnet_lite.XLNetLiteConfig(vocab_size=64, **{**TINY, "num_labels": 1})
    torch.manual_seed(0)
    model = xlnet_lite.XLNetLiteForSequenceClassification(config).eval()
    accelerator = Accelerator(cpu=True)
    scores = run_glue.predict(model, loader, accelerator, is_regression=True)
    with torch.no_grad():
        alone = {
            dataset[i]["index"]: run_glue.classify(model, collator([dataset[i]]), accelerator).logits.item()
            for i in range(len(dataset))
        }
    alone = [alone[i] for i in range(len(alone))]  # predict() orders by the `index` column
    np.testing.assert_allclose(scores, alone, rtol=1e-5, atol=1e-6)
    assert len(set(np.round(alone, 6))) == len(alone)  # every example scores differently: an order mix-up would show


def test_the_classifier_benchmark_times_three_models_with_the_same_logits(tmp_path):
    """bench_classifier's wiring: transformers' classifier and the two XLNet-Lite paths (pooled position, whole last
    layer) built with the same weights, timed, their logits equal, the JSON written."""
    from benchmarks import bench_classifier

    report = bench_classifier.main(
        [
            "--model_size",
            "tiny",
            "--batch_size",
            "4",
            "--max_seq_length",
            "16",
            "--runs",
            "2",
            "--warmup",
            "0",
            "--threads",
            "1",
            "--out",
            str(tmp_path / "classifier.json"),
        ]
    )
    assert set(report["variants"]) == set(bench_classifier.VARIANTS)
    for row in report["variants"].values():
        assert len(row["runs"]["train_step_s"]) == 2 and row["train_step_s"] > 0 and row["inference_s"] > 0
    assert report["last_layer_rows"] == {"xlnet_lite_pooled_position": 1, "xlnet_lite_whole_last_layer": 16}
    assert report["logits_max_abs_diff"]["pooled_vs_whole_last_layer"] < 1e-5
    assert report["logits_max_abs_diff"]["pooled_vs_transformers"] < 1e-4
    assert json.loads((tmp_path / "classifier.json").read_text())["shapes"]["model_size"] == "tiny"


def test_same_seed_same_losses(tmp_path, pretrained):
    """Reproducibility: two runs with the same seed give the same training losses and metrics."""
    train = write_rows(tmp_path / "train.csv", sentiment_rows())
    histories = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        results, out = run(tmp_path / name, pretrained, "--train_file", train, "--validation_file", train)
        histories.append((json.loads((out / "history.json").read_text()), results["eval_accuracy"]))
    assert histories[0] == histories[1]


def test_two_processes_size_the_run_per_process(pretrained, tmp_path):
    """With N processes each epoch is len(data) / (batch * N) optimizer steps: the schedule and the epoch ends are
    sized from the sharded loader (16 examples, batch 4, 2 ranks: 2 steps an epoch). Evaluation deals batches of 4
    and 3 validation examples to the two ranks, and gathers every prediction once."""
    rows = sentiment_rows(repeat=2)[:16]
    assert len(rows) == 16
    write_rows(tmp_path / "train.csv", rows)
    write_rows(tmp_path / "dev.csv", rows[:7])
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "HF_HOME": str(tmp_path / "hf")}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(ROOT / "finetune" / "run_glue.py"),
        "--model_name_or_path",
        str(pretrained),
        "--train_file",
        str(tmp_path / "train.csv"),
        "--validation_file",
        str(tmp_path / "dev.csv"),
        "--output_dir",
        str(tmp_path / "out"),
        "--num_train_epochs",
        "2",
        "--per_device_train_batch_size",
        "4",
        "--per_device_eval_batch_size",
        "4",
        "--max_seq_length",
        "16",
        "--learning_rate",
        "1e-3",
        "--num_warmup_steps",
        "1",
        "--logging_steps",
        "1",
    ]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    history = json.loads((tmp_path / "out" / "history.json").read_text())
    assert [(h["step"], h["epoch"]) for h in history] == [(2, 1), (4, 2)]
    assert all(round(h["eval_accuracy"] * 7, 6).is_integer() for h in history)  # a share of the 7 examples
    rates = [
        m["learning_rate"]
        for m in map(json.loads, (tmp_path / "out" / "metrics.jsonl").read_text().splitlines())
        if "learning_rate" in m
    ]
    assert rates[-1] == 0.0  # the linear schedule ends with the run, not half-way through it


def test_torch_compile_finetunes_and_loads_its_best_epoch_back(tmp_path, pretrained, monkeypatch):
    """--torch_compile: the compiled model (torch.compile's wrapper, here with the eager backend: inductor takes
    minutes on a CPU) trains, saves under the model's own names and takes the best epoch's weights back for the final
    predictions, as without it."""
    import accelerate.utils

    plugin, prepare, compiled_classes = accelerate.utils.TorchDynamoPlugin, Accelerator.prepare_model, []
    monkeypatch.setattr(accelerate.utils, "TorchDynamoPlugin", lambda **kw: plugin(**{**kw, "backend": "eager"}))

    def prepare_model(self, model, *args, **kwargs):
        prepared = prepare(self, model, *args, **kwargs)
        compiled_classes.append(type(prepared).__name__)
        return prepared

    monkeypatch.setattr(Accelerator, "prepare_model", prepare_model)
    train = write_rows(tmp_path / "train.csv", sentiment_rows(2))
    files = ["--train_file", train, "--validation_file", train, "--test_file", train, "--mixed_precision", "no"]
    runs = {}
    for name, flags in (("plain", []), ("compiled", ["--torch_compile"])):  # in turn in one process, as in a notebook
        (tmp_path / name).mkdir()
        runs[name] = run(tmp_path / name, pretrained, *files, *flags)
    (plain, plain_out), (compiled, out) = runs["plain"], runs["compiled"]
    assert "OptimizedModule" in compiled_classes
    assert compiled["best_epoch"] == plain["best_epoch"]
    for name in ("eval_accuracy", "test_accuracy"):
        assert compiled[name] == pytest.approx(plain[name])
    assert (out / "predict_results.tsv").read_text() == (plain_out / "predict_results.tsv").read_text()
    assert load_file(str(out / "model.safetensors")).keys() == load_file(str(plain_out / "model.safetensors")).keys()


def test_with_tracking_logs_every_record_to_the_tracker_of_report_to(tmp_path, pretrained, monkeypatch):
    """--with_tracking: the run's flags and every metrics.jsonl record (at its step) reach the tracker --report_to
    names (here a tracker class registered with accelerate, as a user's own would be). A tracker whose package is not
    installed (accelerate would leave it out without a word) or a name accelerate does not know is one line."""
    from accelerate import tracking

    calls = []

    class Recorder(tracking.GeneralTracker):
        name, requires_logging_directory, main_process_only = "recorder", False, False

        def __init__(self, run_name, **kwargs):
            super().__init__()
            calls.append(("start", run_name))

        @property
        def tracker(self):
            return self

        def store_init_configuration(self, values):
            calls.append(("config", values))

        def log(self, values, step=None, **kwargs):
            calls.append((step, values))

    monkeypatch.setitem(tracking.LOGGER_TYPE_TO_CLASS, "recorder", Recorder)
    train = write_rows(tmp_path / "train.csv", sentiment_rows(1))
    _, out = run(tmp_path, pretrained, "--train_file", train, "--with_tracking", "--report_to", "recorder", epochs=1)
    assert calls[0] == ("start", "run_glue")
    assert calls[1][0] == "config" and calls[1][1]["report_to"] == "recorder" and calls[1][1]["num_train_epochs"] == 1
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(records) >= 2 and calls[2:] == [
        (r["step"], {k: v for k, v in r.items() if k != "step"}) for r in records
    ]

    monkeypatch.setattr(tracking, "get_available_trackers", lambda: [])  # none installed, whatever this machine has
    for report_to, says in (("tensorboard", "not installed (pip install tensorboard)"), ("nope", "not a tracker")):
        result = command(
            FINETUNE,
            "--model_name_or_path",
            pretrained,
            "--train_file",
            train,
            "--output_dir",
            tmp_path / report_to,
            "--with_tracking",
            "--report_to",
            report_to,
        )
        one_line_error(result, f"--report_to {report_to}: {says}")
