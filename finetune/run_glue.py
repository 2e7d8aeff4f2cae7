#!/usr/bin/env python
"""Finetune XLNet-Lite for GLUE-style sequence classification or regression, with accelerate.

    accelerate launch finetune/run_glue.py [--config FILE.yaml|json] [--flag value ...]
    python finetune/run_glue.py ...                            (one process)

Data: --task_name (GLUE from the Hub), --train_file/--validation_file/--test_file (CSV, TSV or JSON lines with
`sentence` or `sentence1` + `sentence2`, and `label`), or an embedded task (--embedded_task): by default newsgroups,
20 Newsgroups (20 classes; the default pretraining reads its training text, without this task's validation and test
messages), news_topic (the topic of an embedded news article) or rotten_tomatoes (movie-review sentiment).
--max_train_samples_per_class N finetunes on the first N labelled examples of each class. Model: the
pretraining output (default outputs/pretrain), any XLNet-Lite or transformers XLNet checkpoint (--model_name_or_path,
folder or Hub id), or a random initialisation (--config_name).

Inputs are XLNet's `A <sep> B <sep> <cls>` padded on the LEFT; the model classifies from the last position (<cls>).
With --long_document_mode mems a text longer than --max_seq_length is read as consecutive segments carrying the
Transformer-XL memory (xlnet_lite.model_utils.read_segments), and the class comes from the last segment's <cls>;
with --long_document_mode head_tail it keeps its first --head_len tokens and its last ones (Sun et al. 2019); with
--long_document_mode windows every window of --max_seq_length tokens is an example of its own, trained on with the
text's label, and a text's prediction is the class of the highest mean probability over its windows.
The training machinery (flags, output folder, checkpoints, metrics, signals) is xlnet_lite.training, shared with
pretrain/run_pretraining.py.
"""

import itertools
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from safetensors.torch import load_file
from tqdm.auto import tqdm
from transformers import AutoConfig

import xlnet_lite
from xlnet_lite import training
from xlnet_lite.classification_data import (
    EMBEDDED_TASKS,
    LONG_DOCUMENT_MODES,
    Labels,
    SegmentCollator,
    check_long_document_mode,
    check_split,
    default_head_len,
    first_per_class,
    load_splits,
    make_loader,
    pool_windows,
    read_labels,
    text_columns,
    text_labels,
    tokenize_split,
)
from xlnet_lite.glue_metrics import GLUE_TASKS, file_metrics, glue_metrics, primary_metric
from xlnet_lite.model_utils import (
    PRETRAINING_ONLY_FIELDS,
    load_model,
    model_from_config,
    read_segments,
    reinit_top_layers,
)
from xlnet_lite.tokenization_xlnet_lite import load_tokenizer

DEFAULT_PRETRAINED = "outputs/pretrain"
PRETRAIN_COMMAND = (
    "accelerate launch --cpu --num_processes 1 --num_machines 1 --dynamo_backend no pretrain/run_pretraining.py"
)
OUTPUTS = (
    "config.json",
    "model.safetensors",
    "modeling_xlnet_lite.py",
    "configuration_xlnet_lite.py",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "metrics.jsonl",
    "eval_results.json",
    "all_results.json",
    "history.json",
    "predict_results.tsv",
    "training_curves.png",
    "runs",
)


@dataclass
class FinetuneArguments(training.RecipeArguments):
    """Sequence classification / regression finetuning (finetune/run_glue.py)."""

    # data
    task_name: str | None = field(
        default=None, metadata={"help": "GLUE task, loaded from the Hub (nyu-mll/glue).", "choices": GLUE_TASKS}
    )
    train_file: str | None = field(
        default=None, metadata={"help": "CSV / TSV / JSON lines: `sentence` or `sentence1`+`sentence2`, and `label`."}
    )
    validation_file: str | None = field(default=None, metadata={"help": "Same columns as --train_file."})
    test_file: str | None = field(
        default=None, metadata={"help": "Same text columns; `label` optional. Writes predict_results.tsv."}
    )
    embedded_task: Literal[EMBEDDED_TASKS] = field(
        default="newsgroups",
        metadata={
            "help": "Without --task_name / --train_file: 20 Newsgroups, the embedded news topics or Rotten Tomatoes."
        },
    )
    max_seq_length: int = field(
        default=128, metadata={"help": "Tokens per input (per segment in mems mode), <sep>/<cls> included."}
    )
    long_document_mode: Literal[LONG_DOCUMENT_MODES] = field(
        default="truncate",
        metadata={
            "help": "Texts longer than max_seq_length: keep the first tokens (truncate), the first --head_len and the last ones (head_tail), classify every window of max_seq_length tokens alone and average the windows' probabilities (windows), or read the whole text as segments carrying the memory (mems)."
        },
    )
    head_len: int | None = field(
        default=None,
        metadata={
            "help": "head_tail mode: tokens kept from the start (default: a quarter of max_seq_length, as Sun et al. 2019's 128 of 512); the rest of max_seq_length comes from the end."
        },
    )
    max_windows: int | None = field(
        default=None, metadata={"help": "windows mode: the first N windows of each text (default: all of them)."}
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep the first N training examples."})
    max_train_samples_per_class: int | None = field(
        default=None, metadata={"help": "Keep the first N training examples of each class (few-label runs)."}
    )
    max_eval_samples: int | None = field(
        default=None, metadata={"help": "Keep the first N examples of each validation split."}
    )
    max_predict_samples: int | None = field(default=None, metadata={"help": "Keep the first N test examples."})
    # model
    model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": f"XLNet-Lite or transformers XLNet checkpoint, folder or Hub id (default: {DEFAULT_PRETRAINED})."
        },
    )
    config_name: str | None = field(
        default=None, metadata={"help": "Random initialisation from this config (instead of --model_name_or_path)."}
    )
    tokenizer_name: str | None = field(
        default=None, metadata={"help": "Tokenizer (default: the model or config folder)."}
    )
    mem_len: int | None = field(
        default=None,
        metadata={
            "help": "mems mode: memory tokens kept per layer (default: the model's mem_len; 0: every earlier segment, as a model pretrained with --mem_len 0 has)."
        },
    )
    mems_backprop: Literal["last", "all"] = field(
        default="last", metadata={"help": "mems mode: gradient through the last segment only, or through all."}
    )
    dropout: float = field(
        default=0.1, metadata={"help": "Dropout while finetuning, set on the loaded config (XLNet finetunes with 0.1)."}
    )
    summary_type: Literal["last", "mean"] | None = field(
        default=None,
        metadata={
            "help": "Pooling, set on the loaded config: last (<cls>, XLNet's) or mean (of the real tokens); default: the model's."
        },
    )
    reinit_layers: int = field(
        default=0,
        metadata={
            "help": "Draw the top N layers of the pretrained model afresh before finetuning (N = n_layer keeps only the embeddings)."
        },
    )
    trust_remote_code: bool = field(
        default=False, metadata={"help": "Allow code from the checkpoint's folder / Hub repo."}
    )
    # optimisation (defaults differ from pretraining)
    output_dir: str = field(
        default="outputs/finetune", metadata={"help": "Best model, tokenizer, results, metrics, plot, checkpoints/."}
    )
    learning_rate: float = field(
        default=3e-4,
        metadata={
            "help": "Peak learning rate (3e-4 for the small preset on 20 Newsgroups: 1e-4 scored 18 points lower; see benchmarks/RESULTS.md)."
        },
    )
    warmup_ratio: float = field(default=0.1, metadata={"help": "Linear warmup as a fraction of the run's steps."})
    num_warmup_steps: int | None = field(
        default=None, metadata={"help": "Linear warmup steps instead of --warmup_ratio."}
    )
    adam_epsilon: float = field(default=1e-6, metadata={"help": "AdamW epsilon (XLNet: 1e-6)."})
    per_device_eval_batch_size: int = field(default=64, metadata={"help": "Evaluation batch size per process."})
    eval_strategy: Literal["epoch", "no"] = field(
        default="epoch",
        metadata={
            "help": "epoch: score the validation split after every epoch and keep the best epoch's model; no: keep the last epoch's model and score the validation split once, at the end."
        },
    )
    layerwise_lr_decay: float = field(
        default=1.0, metadata={"help": "Layer l of L gets lr * decay^(L-1-l), embeddings lr * decay^L."}
    )
    num_train_epochs: int = field(default=3, metadata={"help": "Epochs (0: only evaluate and predict)."})
    max_train_steps: int | None = field(
        default=None, metadata={"help": "Total optimizer steps; overrides --num_train_epochs."}
    )

    RESUME_MUST_MATCH = training.RecipeArguments.RESUME_MUST_MATCH + (
        "task_name",
        "train_file",
        "validation_file",
        "embedded_task",
        "model_name_or_path",
        "config_name",
        "tokenizer_name",
        "max_seq_length",
        "long_document_mode",
        "head_len",
        "max_windows",
        "max_train_samples",
        "max_train_samples_per_class",
        "mem_len",
        "mems_backprop",
        "dropout",
        "summary_type",
        "reinit_layers",
    )


def check_args(a: FinetuneArguments):
    if a.num_warmup_steps is None:
        a.num_warmup_steps = 0
    else:  # warmup given in steps replaces the default ratio
        a.warmup_ratio = 0.0
    problems = training.check_common_args(a)
    if a.task_name and (a.train_file or a.validation_file):
        problems.append("pass either --task_name or --train_file/--validation_file, not both")
    if (a.validation_file or a.test_file) and not a.task_name and not a.train_file:
        problems.append(
            "--validation_file/--test_file need a --train_file (the label set comes from the training data)"
        )
    if a.config_name and a.model_name_or_path:
        problems.append(
            "pass --model_name_or_path (pretrained weights) or --config_name (random initialisation), not both"
        )
    if a.max_seq_length < 3:
        problems.append(f"--max_seq_length must be at least 3 (text, <sep>, <cls>), got {a.max_seq_length}")
    if a.head_len is not None and a.long_document_mode != "head_tail":
        problems.append(f"--head_len is for --long_document_mode head_tail, not {a.long_document_mode}")
    elif a.head_len is not None and not 0 <= a.head_len <= a.max_seq_length - 2:
        problems.append(
            f"--head_len must be in [0, max_seq_length - 2 = {a.max_seq_length - 2}] (the tail keeps <sep> <cls>), got {a.head_len}"
        )
    if a.max_windows is not None and a.long_document_mode != "windows":
        problems.append(f"--max_windows is for --long_document_mode windows, not {a.long_document_mode}")
    elif a.max_windows is not None and a.max_windows < 1:
        problems.append(f"--max_windows must be >= 1, got {a.max_windows}")
    if a.max_train_samples_per_class is not None and a.max_train_samples_per_class < 1:
        problems.append(f"--max_train_samples_per_class must be >= 1, got {a.max_train_samples_per_class}")
    if a.reinit_layers < 0:
        problems.append(f"--reinit_layers must be >= 0, got {a.reinit_layers}")
    if a.reinit_layers and a.config_name:
        problems.append(
            "--reinit_layers re-initialises layers of a pretrained model (--model_name_or_path); "
            "--config_name starts from random initialisation already"
        )
    if a.layerwise_lr_decay <= 0:
        problems.append(f"--layerwise_lr_decay must be > 0, got {a.layerwise_lr_decay}")
    if not 0 <= a.dropout < 1:
        problems.append(f"--dropout must be in [0, 1), got {a.dropout}")
    if a.num_train_epochs < 0 or (a.max_train_steps is not None and a.max_train_steps < 1):
        problems.append("--num_train_epochs must be >= 0 and --max_train_steps >= 1")
    for name in ("train_file", "validation_file", "test_file"):
        if getattr(a, name) and not os.path.isfile(getattr(a, name)):
            problems.append(f"--{name}: no such file {getattr(a, name)}")
    training.raise_problems(problems)
    if a.long_document_mode == "head_tail" and a.head_len is None:
        a.head_len = default_head_len(a.max_seq_length)
    if a.max_train_steps:  # otherwise the run's length is known once the data is read (make_optimizer_and_scheduler)
        training.warmup_steps(a, a.max_train_steps)
    if a.config_name is None and a.model_name_or_path is None:
        if not os.path.isdir(DEFAULT_PRETRAINED):
            raise training.RecipeError(
                f"no pretrained model in {DEFAULT_PRETRAINED}/ (the default --model_name_or_path): run the "
                f"pretraining first ({PRETRAIN_COMMAND}), or pass --model_name_or_path (or --config_name "
                "for random initialisation)"
            )
        a.model_name_or_path = DEFAULT_PRETRAINED


# ---------------------------------------------------------------------------------------------------------
# Model, forward, evaluation


def load_model_and_tokenizer(a, labels: Labels, train_source):
    """(model, tokenizer): the classifier from a checkpoint (a head sized for `labels`) or from a config."""
    path = a.model_name_or_path or a.config_name
    remote = {"trust_remote_code": a.trust_remote_code}
    tokenizer = load_tokenizer(a.tokenizer_name or path, **remote)
    tokenizer.padding_side = "left"
    cls = xlnet_lite.XLNetLiteForSequenceClassification
    if a.config_name:
        model = model_from_config(a.config_name, cls, **remote, **labels.model_kwargs(), **head_kwargs(a))
    else:
        config = AutoConfig.from_pretrained(path, **remote)
        kwargs = {**checkpoint_label_kwargs(config, labels, path, train_source), **head_kwargs(a)}
        model = load_model(path, cls, **remote, **kwargs)
        if a.reinit_layers > model.config.n_layer:
            raise training.RecipeError(f"--reinit_layers {a.reinit_layers}: {path} has {model.config.n_layer} layers")
        reinit_top_layers(model, a.reinit_layers)
    if len(tokenizer) > model.config.vocab_size:
        raise training.RecipeError(
            f"the tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {model.config.vocab_size}"
        )
    if a.mem_len is not None:
        model.config.mem_len = a.mem_len
    model.transformer.mask_emb.requires_grad_(
        False
    )  # classification never runs the query stream (and DDP needs every trained parameter used)
    return model, tokenizer


def head_kwargs(a) -> dict:
    """Config fields the finetuning flags set on the loaded model."""
    return {"dropout": a.dropout, **({"summary_type": a.summary_type} if a.summary_type else {})}


def checkpoint_label_kwargs(config, labels: Labels, path, train_source):
    """Head arguments for from_pretrained. A checkpoint that already has a classifier must have as many outputs as
    the data has labels (its label order is kept when the names match)."""
    kwargs = labels.model_kwargs()
    if not any(arch.endswith("ForSequenceClassification") for arch in (config.architectures or [])):
        return kwargs  # a pretraining output: the head is newly initialised
    if config.num_labels != labels.num_labels:
        raise training.RecipeError(
            f"{path} has a classification head with {config.num_labels} labels ({list(config.id2label.values())}), "
            f"but column `label` of {train_source} has {labels.num_labels} ({labels.names or 'regression'}); "
            f"start from a checkpoint without a classification head (a pretraining output) or use matching data"
        )
    if not labels.is_regression and set(config.label2id) == set(labels.names):
        labels.names[:] = sorted(labels.names, key=config.label2id.get)
        kwargs = labels.model_kwargs()
    return kwargs


def classify(model, batch, accelerator, *, labels=None, backprop_all=False):
    """Read the prefix segments in order, carrying the memory, then classify the last segment from its <cls>. The
    prefix runs without gradient unless `backprop_all` (then gradient flows through every segment)."""
    mems = None
    if batch["prefix_input_ids"].shape[1]:
        core = accelerator.unwrap_model(model).transformer
        with torch.set_grad_enabled(backprop_all and torch.is_grad_enabled()), accelerator.autocast():
            mems = read_segments(
                core,
                batch["prefix_input_ids"],
                batch["prefix_token_type_ids"],
                mem_len=core.config.mem_len,
                keep_graph=backprop_all,
            )
    return model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        token_type_ids=batch["token_type_ids"],
        mems=mems,
        use_mems=False,
        labels=labels,
    )


@torch.no_grad()
def predict(model, loader, accelerator, *, is_regression):
    """Predictions for every text of the loader's dataset (class ids or scores), in the split's row order whatever
    order the batches came in: rows are put back in the order of the `index` column (as tokenize_split numbers them),
    and in windows mode a text's windows are pooled (pool_windows)."""
    model.eval()
    outputs, indices = [], []
    for batch in tqdm(loader, desc="eval", leave=False, disable=not accelerator.is_local_main_process):
        logits = classify(model, batch, accelerator).logits.float()
        # the processes' batches of one round may differ in size (a segment count's last batch is short): pad to
        # gather, index -1 marking the padding
        outputs.append(accelerator.gather(accelerator.pad_across_processes(logits, pad_index=-1)).cpu())
        indices.append(accelerator.gather(accelerator.pad_across_processes(batch["index"], pad_index=-1)).cpu())
    outputs, indices = torch.cat(outputs).numpy(), torch.cat(indices).numpy()
    real = indices >= 0
    outputs, indices = outputs[real], indices[real]
    _, first = np.unique(indices, return_index=True)  # sorts, and drops duplicates added for even batches
    outputs = outputs[first][:, 0] if is_regression else outputs[first]
    dataset = loader.dataset
    if "text_index" in dataset.column_names:
        return pool_windows(outputs, dataset["text_index"], is_regression=is_regression)
    return outputs if is_regression else outputs.argmax(-1)


def compute_metrics(a, predictions, references, labels: Labels):
    if a.task_name:
        return glue_metrics(a.task_name, predictions, references)
    return file_metrics(predictions, references, is_regression=labels.is_regression, num_labels=labels.num_labels)


def evaluate(a, model, eval_sets, accelerator, labels):
    """{"accuracy": ..., "accuracy_mm": ...}: every labelled validation split (suffix _mm for MNLI mismatched)."""
    metrics = {}
    for name, (loader, references) in eval_sets.items():
        suffix = "_mm" if name == "validation_mismatched" else ""
        scores = compute_metrics(
            a, predict(model, loader, accelerator, is_regression=labels.is_regression), references, labels
        )
        metrics.update({k + suffix: v for k, v in scores.items()})
    return metrics


# ---------------------------------------------------------------------------------------------------------
# The recipe


def main(argv=None):
    a, accelerator, checkpoints, resume = training.set_up_run(
        FinetuneArguments, argv, check=check_args, outputs=OUTPUTS, description=__doc__
    )
    splits = load_splits(
        task_name=a.task_name,
        train_file=a.train_file,
        validation_file=a.validation_file,
        test_file=a.test_file,
        embedded_task=a.embedded_task,
    )
    for name, split in splits.items():  # bad columns stop us before the model is loaded
        check_split(split, text_columns(split), needs_label=name != "test")
        check_long_document_mode(split, a.long_document_mode)
    labels = read_labels(splits["train"])
    if a.max_train_samples_per_class:
        if labels.is_regression:
            raise training.RecipeError(
                f"--max_train_samples_per_class: column `label` of {splits['train'].source} "
                "holds regression targets, not classes"
            )
        splits["train"] = first_per_class(splits["train"], a.max_train_samples_per_class)
    model, tokenizer = load_model_and_tokenizer(a, labels, splits["train"].source)
    training.crash_point("model_built")
    if resume is not None:
        training.check_resume_model(resume, training.model_fields(model), num_processes=accelerator.num_processes)
    common = dict(max_len=a.max_seq_length, mode=a.long_document_mode, head_len=a.head_len, max_windows=a.max_windows)
    source = splits["train"].source
    train_set = tokenize_split(splits["train"], tokenizer, labels, source, max_samples=a.max_train_samples, **common)
    other_sets = {
        name: tokenize_split(
            splits[name],
            tokenizer,
            labels,
            source,
            **common,
            max_samples=a.max_predict_samples if name == "test" else a.max_eval_samples,
        )
        for name in ("validation", "validation_mismatched", "test")
        if name in splits
    }
    collator = SegmentCollator(tokenizer.pad_token_id, tokenizer.pad_token_type_id, a.max_seq_length)
    train_loader, sampler = make_loader(
        train_set, collator, batch_size=a.per_device_train_batch_size, shuffle=True, seed=a.seed
    )
    loaders = {
        name: make_loader(ds, collator, batch_size=a.per_device_eval_batch_size, shuffle=False, seed=0)[0]
        for name, ds in other_sets.items()
    }

    train_loader = accelerator.prepare(train_loader)  # sharded: the run is sized per process
    loaders = {name: accelerator.prepare(loader) for name, loader in loaders.items()}
    steps_per_epoch = math.ceil(len(train_loader) / a.gradient_accumulation_steps)
    max_steps = a.max_train_steps or a.num_train_epochs * steps_per_epoch
    optimizer, scheduler = training.make_optimizer_and_scheduler(
        a, model, max_steps=max_steps, num_processes=accelerator.num_processes, layerwise_lr_decay=a.layerwise_lr_decay
    )
    model, optimizer, scheduler = training.prepare(accelerator, model, optimizer, scheduler)
    eval_sets = {
        name: (loaders[name], text_labels(other_sets[name]))
        for name in ("validation", "validation_mismatched")
        if name in loaders and "labels" in other_sets[name].column_names
    }
    training.start_tracking(accelerator, a, "run_glue")
    loop = training.TrainLoop(a, accelerator, model, optimizer, scheduler, checkpoints_dir=checkpoints.root)
    state, records = {"step": 0, "epoch": 0, "loss_sum": 0.0, "loss_count": 0, "history": [], "best": None}, 0
    if resume is not None:
        trainer_state, _, _ = checkpoints.load(resume, device=accelerator.device)
        state, records = trainer_state["recipe"], trainer_state["metrics_records"]
        loop.load_state_dict(trainer_state["loop"])
        accelerator.print(f"resumed from {resume} at step {state['step']}")
    metrics = training.MetricsLog(accelerator, a.output_dir, with_tracking=a.with_tracking)
    metrics.start(records)
    n_train = len(text_labels(train_set))  # texts (in windows mode fewer than the rows)
    windows = f" in {len(train_set)} windows" if a.long_document_mode == "windows" else ""
    accelerator.print(
        f"{n_train} training examples{windows}, {steps_per_epoch} steps/epoch, {max_steps} steps, "
        f"{accelerator.unwrap_model(model).num_parameters():,} parameters, mode {a.long_document_mode}"
    )
    run = Finetuning(
        a,
        accelerator,
        model,
        tokenizer,
        loop,
        checkpoints,
        metrics,
        labels=labels,
        eval_sets=eval_sets,
        main_metric=primary_metric(a.task_name, is_regression=labels.is_regression),
    )
    start = time.perf_counter()
    if not train(run, state, train_loader, sampler, steps_per_epoch=steps_per_epoch, max_steps=max_steps):
        training.end_run(accelerator)
        return None
    if state["best"] is None:  # no training (or no validation data): the current model is the result
        state["best"] = {
            "epoch": state["epoch"],
            "metrics": evaluate(a, model, eval_sets, accelerator, labels) if eval_sets else {},
        }
        training.save_final_model(accelerator, model, tokenizer, a.output_dir, config_updates=PRETRAINING_ONLY_FIELDS)
    accelerator.unwrap_model(model).load_state_dict(load_file(str(Path(a.output_dir, "model.safetensors"))))
    return finish(
        run,
        state,
        loaders,
        other_sets,
        train_runtime=time.perf_counter() - start,
        n_train=n_train,
        n_windows=len(train_set) if a.long_document_mode == "windows" else None,
    )


@dataclass
class Finetuning(training.RecipeRun):
    """The run's shared state, with the task: its labels, the validation sets and the metric that picks the best
    epoch."""

    labels: Labels
    eval_sets: dict
    main_metric: str


def train(run: Finetuning, state, train_loader, sampler, *, steps_per_epoch, max_steps):
    """Epochs of optimizer steps; at each epoch's end evaluate (every epoch, or the last with --eval_strategy no), keep
    the best model and save a checkpoint. Returns False when a signal stopped it (after a checkpoint)."""
    a, accelerator, model, loop = run.a, run.accelerator, run.model, run.loop
    G = a.gradient_accumulation_steps
    stop = training.StopSignal(accelerator)
    progress = tqdm(total=max_steps, initial=state["step"], desc="train", disable=not accelerator.is_local_main_process)

    def micro_batches(batches, first):  # pulled lazily, so accelerate sees the end of the loader at the right batch
        for batch in itertools.chain([first], itertools.islice(batches, G - 1)):
            loop.add_tokens(batch["input_ids"].numel() * accelerator.num_processes)  # padded tokens, all processes
            yield (
                lambda batch=batch: (
                    classify(
                        model, batch, accelerator, labels=batch["labels"], backprop_all=a.mems_backprop == "all"
                    ).loss
                )
            )

    try:
        for epoch in range(state["epoch"], math.ceil(max_steps / steps_per_epoch) if max_steps else 0):
            model.train()
            sampler.set_epoch(epoch)
            done = (state["step"] - epoch * steps_per_epoch) * G  # batches of this epoch trained before a resume
            loader = accelerator.skip_first_batches(train_loader, done) if done > 0 else train_loader
            if hasattr(loader, "set_epoch"):  # a prepared loader re-sets its sampler's epoch from its own count
                loader.set_epoch(epoch)
            batches = iter(loader)
            epoch_end = min((epoch + 1) * steps_per_epoch, max_steps)  # saved after end_epoch, with the epoch's record
            for first in batches:
                state["step"] += 1
                loss = loop.step(micro_batches(batches, first), step=state["step"])
                if loss is not None:
                    state["loss_sum"], state["loss_count"] = state["loss_sum"] + loss, state["loss_count"] + 1
                    progress.set_postfix(loss=f"{loss:.4f}")
                progress.update(1)
                if state["step"] % a.logging_steps == 0 and (record := loop.window_record(state["step"])):
                    run.metrics.log(record)
                stopping = stop.requested()
                periodic = (
                    a.checkpointing_steps and state["step"] % a.checkpointing_steps == 0 and state["step"] != epoch_end
                )
                if stopping or periodic:
                    with loop.paused():
                        run.save_checkpoint(state["step"], recipe_state=state)
                if stopping:
                    accelerator.print(
                        f"received signal {stop.signal or '(another process)'}: checkpoint saved at step "
                        f"{state['step']}, exiting"
                    )
                    return False
                if state["step"] >= max_steps:
                    break
            with loop.paused():
                end_epoch(run, state, epoch, last=state["step"] >= max_steps)
                run.save_checkpoint(state["step"], recipe_state=state)
            if state["step"] >= max_steps:
                break
    finally:
        stop.close()
        progress.close()
    return True


def end_epoch(run: Finetuning, state, epoch, *, last):
    """Evaluate (every epoch, or only the `last` with --eval_strategy no), record the epoch (metrics.jsonl and the
    state), keep the best model in output_dir (an epoch without a score replaces the one before it)."""
    a, accelerator, metric = run.a, run.accelerator, run.main_metric
    if (record := run.loop.window_record(state["step"])) is not None:
        run.metrics.log(record)
    mean = (
        accelerator.gather(torch.tensor([state["loss_sum"], state["loss_count"]], dtype=torch.float64))
        .view(-1, 2)
        .sum(0)
    )
    record = {"step": state["step"], "epoch": epoch + 1, "train_loss": float(mean[0] / max(mean[1], 1))}
    scored = run.eval_sets and (a.eval_strategy == "epoch" or last)
    scores = evaluate(a, run.model, run.eval_sets, accelerator, run.labels) if scored else {}
    record.update({f"eval_{k}": v for k, v in scores.items()})
    accelerator.print(json.dumps(record))
    run.metrics.log(record)
    state["history"].append(record)
    state.update(epoch=epoch + 1, loss_sum=0.0, loss_count=0)
    score, best = scores.get(metric), state["best"]
    best_score = None if best is None else best["metrics"].get(metric)
    if score is None or best_score is None or score > best_score:  # without validation data: the latest epoch
        state["best"] = {"epoch": epoch + 1, "metrics": scores}
        training.save_final_model(
            accelerator, run.model, run.tokenizer, a.output_dir, config_updates=PRETRAINING_ONLY_FIELDS
        )


def finish(run: Finetuning, state, loaders, other_sets, *, train_runtime, n_train, n_windows=None):
    """Predict the test split with the best model; write eval_results.json, all_results.json, history.json,
    predict_results.tsv and training_curves.png."""
    a, accelerator, labels = run.a, run.accelerator, run.labels
    results = {f"eval_{k}": v for k, v in state["best"]["metrics"].items()}
    results.update(
        best_epoch=state["best"]["epoch"],
        epochs=state["epoch"],
        train_samples=n_train,
        train_runtime_s=round(train_runtime, 2),
        long_document_mode=a.long_document_mode,
        head_len=a.head_len,
        max_windows=a.max_windows,
        max_seq_length=a.max_seq_length,
        mixed_precision=accelerator.mixed_precision,
    )
    if n_windows is not None:
        results["train_windows"] = n_windows
    if state["history"]:
        results["train_loss"] = state["history"][-1]["train_loss"]
    out = Path(a.output_dir)
    if "test" in loaders:
        start = time.perf_counter()
        predictions = predict(run.model, loaders["test"], accelerator, is_regression=labels.is_regression)
        results["test_runtime_s"] = round(time.perf_counter() - start, 2)
        if "labels" in other_sets["test"].column_names:
            scores = compute_metrics(a, predictions, text_labels(other_sets["test"]), labels)
            results.update({f"test_{k}": v for k, v in scores.items()})
        if accelerator.is_main_process:
            write_predictions(out / "predict_results.tsv", predictions, labels)
    if accelerator.is_main_process:
        training.write_json(out / "eval_results.json", state["best"]["metrics"])
        training.write_json(out / "all_results.json", results)
        training.write_json(out / "history.json", state["history"])
        if state["history"]:
            metric = run.main_metric
            training.plot_metrics(
                run.metrics.records(),
                out / "training_curves.png",
                title="finetuning",
                left={"loss": "train loss", "train_loss": "train loss (epoch mean)"},
                right={f"eval_{metric}": f"validation {metric}"},
            )
        if a.push_to_hub:
            training.push_output_dir(a, commit_message="Finetuned with finetune/run_glue.py")
    accelerator.print(json.dumps(results))
    training.end_run(accelerator)
    return results


def write_predictions(path, predictions, labels: Labels):
    rows = [
        f"{i}\t{p:.6f}" if labels.is_regression else f"{i}\t{labels.names[int(p)]}" for i, p in enumerate(predictions)
    ]
    training.atomic_write_text(path, "index\tprediction\n" + "".join(r + "\n" for r in rows))


if __name__ == "__main__":
    training.exit_on_recipe_error(main, sys.argv[1:], "run_glue.py")
