#!/usr/bin/env python
"""Finetune XLNet-Lite for GLUE-style sequence classification or regression, with accelerate.

    accelerate launch finetune/run_glue.py [--config FILE.yaml|json] [--flag value ...]
    python finetune/run_glue.py ...                            (one process)

Data: --task_name (GLUE from the Hub), --train_file/--validation_file/--test_file (CSV, TSV or JSON lines: a `label`
column, strings or numbers, and the text in `sentence`, `text`, or `sentence1` + `sentence2`, else in the other
columns as in transformers' run_glue, or as --text_column / --text_pair_column name), or an embedded task
(--embedded_task). Model: the pretraining output (outputs/pretrain), an XLNet-Lite or transformers XLNet checkpoint
(--model_name_or_path) or a random initialisation (--config_name). Inputs are `A <sep> B <sep> <cls>` padded on the
LEFT, classified from <cls> (xlnet_lite.inference); the training machinery is xlnet_lite.training.
"""

import itertools
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from accelerate.utils import DistributedType
from tqdm.auto import tqdm

from xlnet_lite import embedded_datasets, inference, training
from xlnet_lite.classification_data import (
    EMBEDDED_TASKS,
    LONG_DOCUMENT_MODES,
    Labels,
    SegmentCollator,
    default_head_len,
    layout_problems,
    load_splits,
    make_loaders,
    read_task,
    text_labels,
    tokenize_splits,
)
from xlnet_lite.glue_metrics import GLUE_TASKS, primary_metric
from xlnet_lite.inference import classify, evaluate, predict  # also run_glue's names: tests call and patch them
from xlnet_lite.model_utils import PRETRAINING_ONLY_FIELDS
from xlnet_lite.training import flag

DEFAULT_PRETRAINED = "outputs/pretrain"
PRETRAIN_COMMAND = (
    "accelerate launch --cpu --num_processes 1 --num_machines 1 --dynamo_backend no pretrain/run_pretraining.py"
)
OUTPUTS = (
    *("config.json", "model.safetensors", "modeling_xlnet_lite.py", "configuration_xlnet_lite.py", "tokenizer.json"),
    *("tokenizer_config.json", "special_tokens_map.json", "metrics.jsonl", "eval_results.json", "all_results.json"),
    *("history.json", "predict_results.tsv", "training_curves.png", "triton_attention.py", "runs"),
)


@dataclass
class FinetuneArguments(training.RecipeArguments):
    """Sequence classification / regression finetuning (finetune/run_glue.py)."""

    # data
    task_name: str | None = flag(None, "GLUE task, loaded from the Hub (nyu-mll/glue).", choices=GLUE_TASKS)
    train_file: str | None = flag(None, "CSV / TSV / JSON lines: a `label` column and one or two text columns.")
    validation_file: str | None = flag(None, "Same columns as --train_file.")
    test_file: str | None = flag(None, "Same text columns; `label` optional. Writes predict_results.tsv.")
    text_column: str | None = flag(None, "Text column of the files (default: `sentence`, `text`, ...: see above).")
    text_pair_column: str | None = flag(None, "Second text column of a pair (with --text_column).")
    embedded_task: Literal[EMBEDDED_TASKS] = flag("newsgroups", "Without --task_name / --train_file: an embedded task.")
    max_seq_length: int = flag(128, "Tokens per input (per segment in mems mode), <sep>/<cls> included.")
    long_document_mode: Literal[LONG_DOCUMENT_MODES] = flag(
        "truncate",
        "Texts longer than max_seq_length: keep the first tokens (truncate), the first --head_len and the last ones "
        "(head_tail, Sun et al. 2019), average the class probabilities of every window of max_seq_length tokens, each "
        "trained on with the text's label (windows), or read every segment carrying the memory, classifying the last "
        "(mems).",
    )
    head_len: int | None = flag(None, "head_tail mode: tokens kept from the start (default: max_seq_length / 4).")
    max_windows: int | None = flag(None, "windows mode: the first N windows of each text (default: all of them).")
    max_train_samples: int | None = flag(None, "Keep the first N training examples.")
    max_train_samples_per_class: int | None = flag(None, "Keep the first N training examples of each class.")
    max_eval_samples: int | None = flag(None, "Keep the first N examples of each validation split.")
    max_predict_samples: int | None = flag(None, "Keep the first N test examples.")
    # model
    model_name_or_path: str | None = flag(None, f"XLNet-Lite or XLNet checkpoint (default: {DEFAULT_PRETRAINED}).")
    config_name: str | None = flag(None, "Random initialisation from this config (instead of --model_name_or_path).")
    tokenizer_name: str | None = flag(None, "Tokenizer (default: the model or config folder).")
    mem_len: int | None = flag(None, "mems mode: memory tokens per layer (default: the model's; 0: all segments).")
    mems_backprop: Literal["last", "all"] = flag("last", "mems mode: gradient through the last segment, or all.")
    dropout: float = flag(0.1, "Dropout while finetuning, set on the loaded config (XLNet finetunes with 0.1).")
    summary_type: Literal["last", "mean"] | None = flag(
        None, "Pooling: last (<cls>, XLNet's) or mean (of the real tokens); default: the model's."
    )
    attn_type: Literal["bi", "uni"] | None = flag(
        None, "Attention: bi (XLNet's) or uni (causal, as --objective clm pretrains); default: the model's."
    )
    reinit_layers: int = flag(0, "Draw the top N pretrained layers afresh (N = n_layer keeps the embeddings alone).")
    trust_remote_code: bool = flag(False, "Allow code from the checkpoint's folder / Hub repo.")
    # optimisation (defaults differ from pretraining)
    output_dir: str = flag("outputs/finetune", "Best model, tokenizer, results, metrics, plot, checkpoints/.")
    learning_rate: float = flag(3e-4, "Peak learning rate (the best for the small preset: benchmarks/RESULTS.md).")
    warmup_ratio: float = flag(0.1, "Linear warmup as a fraction of the run's steps.")
    num_warmup_steps: int | None = flag(None, "Linear warmup steps instead of --warmup_ratio.")
    adam_epsilon: float = flag(1e-6, "AdamW epsilon (XLNet: 1e-6).")
    per_device_eval_batch_size: int = flag(64, "Evaluation batch size per process.")
    eval_strategy: Literal["epoch", "no"] = flag(
        "epoch", "epoch: score every epoch, keep the best; no: keep the last epoch, scored once at the end."
    )
    layerwise_lr_decay: float = flag(1.0, "Layer l of L gets lr * decay^(L-1-l), embeddings lr * decay^L.")
    num_train_epochs: int = flag(3, "Epochs (0: only evaluate and predict).")
    max_train_steps: int | None = flag(None, "Total optimizer steps; overrides --num_train_epochs.")

    RESUME_MUST_MATCH = training.RecipeArguments.RESUME_MUST_MATCH + (
        *("task_name", "train_file", "validation_file", "text_column", "text_pair_column", "embedded_task"),
        *("model_name_or_path", "config_name", "tokenizer_name", "max_seq_length", "long_document_mode", "head_len"),
        *("max_windows", "max_train_samples", "max_train_samples_per_class", "mem_len", "mems_backprop", "dropout"),
        *("summary_type", "attn_type", "reinit_layers"),
    )


def check_args(args: FinetuneArguments):
    """Every inconsistency, named by flag, before anything is loaded."""
    if args.num_warmup_steps is not None:  # warmup given in steps replaces the default ratio
        args.warmup_ratio = 0.0
    args.num_warmup_steps = args.num_warmup_steps or 0
    problems = training.check_common_args(args)
    if args.task_name and (args.train_file or args.validation_file):
        problems.append("pass either --task_name or --train_file/--validation_file, not both")
    if (args.validation_file or args.test_file) and not args.task_name and not args.train_file:
        problems.append(
            "--validation_file/--test_file need a --train_file (the label set comes from the training data)"
        )
    if args.config_name and args.model_name_or_path:
        problems.append(
            "pass --model_name_or_path (pretrained weights) or --config_name (random initialisation), not both"
        )
    if args.max_seq_length < 3:
        problems.append(f"--max_seq_length must be at least 3 (text, <sep>, <cls>), got {args.max_seq_length}")
    problems += layout_problems(args.long_document_mode, args.max_seq_length, args.head_len, args.max_windows)
    if args.max_train_samples_per_class is not None and args.max_train_samples_per_class < 1:
        problems.append(f"--max_train_samples_per_class must be >= 1, got {args.max_train_samples_per_class}")
    if args.reinit_layers < 0:
        problems.append(f"--reinit_layers must be >= 0, got {args.reinit_layers}")
    if args.reinit_layers and args.config_name:
        problems.append(
            "--reinit_layers re-initialises layers of a pretrained model (--model_name_or_path); "
            "--config_name starts from random initialisation already"
        )
    if args.layerwise_lr_decay <= 0:
        problems.append(f"--layerwise_lr_decay must be > 0, got {args.layerwise_lr_decay}")
    if not 0 <= args.dropout < 1:
        problems.append(f"--dropout must be in [0, 1), got {args.dropout}")
    if args.num_train_epochs < 0 or (args.max_train_steps is not None and args.max_train_steps < 1):
        problems.append("--num_train_epochs must be >= 0 and --max_train_steps >= 1")
    for name in ("train_file", "validation_file", "test_file"):
        if getattr(args, name) and not os.path.isfile(getattr(args, name)):
            problems.append(f"--{name}: no such file {getattr(args, name)}")
    if (args.text_column or args.text_pair_column) and not args.train_file:
        problems.append("--text_column / --text_pair_column name columns of --train_file")
    if args.text_pair_column and not args.text_column:
        problems.append("--text_pair_column needs --text_column (the first text of the pair)")
    training.raise_problems(problems)
    if not (args.task_name or args.train_file) and (missing := embedded_datasets.missing_package(args.embedded_task)):
        raise training.RecipeError(f"--embedded_task {args.embedded_task}: {missing}; or pass --train_file")
    if args.long_document_mode == "head_tail" and args.head_len is None:
        args.head_len = default_head_len(args.max_seq_length)
    if args.max_train_steps:  # otherwise the run's length is known once the data is read (make_optimizer_and_scheduler)
        training.warmup_steps(args, args.max_train_steps)
    if args.config_name is None and args.model_name_or_path is None:
        if not os.path.isdir(DEFAULT_PRETRAINED):
            raise training.RecipeError(
                f"no pretrained model in {DEFAULT_PRETRAINED}/ (the default --model_name_or_path): run the "
                f"pretraining first ({PRETRAIN_COMMAND}), or pass --model_name_or_path (or --config_name "
                "for random initialisation)"
            )
        args.model_name_or_path = DEFAULT_PRETRAINED


def main(argv=None):
    args, accelerator, checkpoints, resume = training.set_up_run(
        FinetuneArguments, argv, check=check_args, outputs=OUTPUTS, description=__doc__
    )
    if args.long_document_mode == "mems" and accelerator.distributed_type == DistributedType.FSDP:
        raise training.RecipeError(
            "--long_document_mode mems reads a text's first segments by the model's transformer alone, outside the "
            "model's forward, where FSDP's parameters stay sharded: under FSDP use truncate, head_tail or windows"
        )
    splits = load_splits(
        task_name=args.task_name,
        train_file=args.train_file,
        validation_file=args.validation_file,
        test_file=args.test_file,
        embedded_task=args.embedded_task,
    )
    splits, columns, labels = read_task(  # bad columns and labels stop the run before the model is loaded
        splits,
        text_column=args.text_column,
        text_pair_column=args.text_pair_column,
        mode=args.long_document_mode,
        max_per_class=args.max_train_samples_per_class,
    )
    model, tokenizer = inference.load_model_and_tokenizer(args, labels, splits["train"].source)
    training.crash_point("model_built")
    if resume is not None:
        training.check_resume_model(resume, training.model_fields(model), num_processes=accelerator.num_processes)
    max_samples = {name: args.max_eval_samples for name in splits}
    max_samples.update(train=args.max_train_samples, test=args.max_predict_samples)
    layout = dict(max_len=args.max_seq_length, mode=args.long_document_mode, head_len=args.head_len)
    tokenized = tokenize_splits(
        splits, columns, tokenizer, labels, max_samples=max_samples, max_windows=args.max_windows, **layout
    )
    train_set, other_sets = tokenized.pop("train"), tokenized
    sizes = dict(train_batch_size=args.per_device_train_batch_size, eval_batch_size=args.per_device_eval_batch_size)
    collator = SegmentCollator(tokenizer.pad_token_id, tokenizer.pad_token_type_id, args.max_seq_length)
    train_loader, sampler, loaders = make_loaders(train_set, other_sets, collator, **sizes, seed=args.seed)
    train_loader = accelerator.prepare(train_loader)  # sharded: the run is sized per process
    loaders = {name: accelerator.prepare(loader) for name, loader in loaders.items()}
    steps_per_epoch = math.ceil(len(train_loader) / args.gradient_accumulation_steps)
    max_steps = args.max_train_steps or args.num_train_epochs * steps_per_epoch
    decay = args.layerwise_lr_decay
    optimizer, scheduler = training.make_optimizer_and_scheduler(
        args, model, max_steps=max_steps, num_processes=accelerator.num_processes, layerwise_lr_decay=decay
    )
    model, optimizer, scheduler = training.prepare(accelerator, model, optimizer, scheduler)
    eval_sets = inference.labelled_eval_sets(loaders, other_sets)
    training.start_tracking(accelerator, args, "run_glue")
    loop = training.TrainLoop(args, accelerator, model, optimizer, scheduler, checkpoints_dir=checkpoints.root)
    state, records = {"step": 0, "epoch": 0, "loss_sum": 0.0, "loss_count": 0, "history": [], "best": None}, 0
    if resume is not None:
        trainer_state, _, _ = checkpoints.load(resume, device=accelerator.device)
        state, records = trainer_state["recipe"], trainer_state["metrics_records"]
        loop.load_state_dict(trainer_state["loop"])
        accelerator.print(f"resumed from {resume} at step {state['step']}")
    metrics = training.MetricsLog(accelerator, args.output_dir, with_tracking=args.with_tracking)
    metrics.start(records)
    n_train = len(text_labels(train_set))  # texts (in windows mode fewer than the rows)
    windows = f" in {len(train_set)} windows" if args.long_document_mode == "windows" else ""
    accelerator.print(
        f"{n_train} training examples{windows}, {steps_per_epoch} steps/epoch, {max_steps} steps, "
        f"{accelerator.unwrap_model(model).num_parameters():,} parameters, mode {args.long_document_mode}"
    )
    metric = primary_metric(args.task_name, is_regression=labels.is_regression)
    task = dict(labels=labels, eval_sets=eval_sets, main_metric=metric)
    run = Finetuning(args, accelerator, model, tokenizer, loop, checkpoints, metrics, **task)
    start = time.perf_counter()
    if not train(run, state, train_loader, sampler, steps_per_epoch=steps_per_epoch, max_steps=max_steps):
        training.end_run(accelerator)
        return None
    if state["best"] is None:  # no training (or no validation data): the current model is the result
        scores = evaluate(model, eval_sets, accelerator, labels, task_name=args.task_name) if eval_sets else {}
        state["best"] = {"epoch": state["epoch"], "metrics": scores}
        training.save_final_model(
            accelerator, model, tokenizer, args.output_dir, config_updates=PRETRAINING_ONLY_FIELDS
        )
    training.load_final_model(accelerator, model, args.output_dir)
    return finish(run, state, loaders, other_sets, train_set, train_runtime=time.perf_counter() - start)


@dataclass
class Finetuning(training.RecipeRun):
    """The run's shared state, with the task: labels, validation sets, and the metric that picks the best epoch."""

    labels: Labels
    eval_sets: dict
    main_metric: str


def train(run: Finetuning, state, train_loader, sampler, *, steps_per_epoch, max_steps):
    """Epochs of optimizer steps; at each epoch's end evaluate (every epoch, or the last with --eval_strategy no), keep
    the best model and save a checkpoint. Returns False when a signal stopped it (after a checkpoint)."""
    args, accelerator, model, loop = run.args, run.accelerator, run.model, run.loop
    accumulation_steps, backprop = args.gradient_accumulation_steps, {"backprop_all": args.mems_backprop == "all"}
    stop = training.StopSignal(accelerator)
    progress = tqdm(total=max_steps, initial=state["step"], desc="train", disable=not accelerator.is_local_main_process)

    def micro_batches(batches, first):  # pulled lazily, so accelerate sees the end of the loader at the right batch
        for batch in itertools.chain([first], itertools.islice(batches, accumulation_steps - 1)):
            loop.add_tokens(batch["input_ids"].numel() * accelerator.num_processes)  # padded tokens, all processes
            yield lambda batch=batch: classify(model, batch, accelerator, labels=batch["labels"], **backprop).loss

    try:
        for epoch in range(state["epoch"], math.ceil(max_steps / steps_per_epoch) if max_steps else 0):
            model.train()
            sampler.set_epoch(epoch)
            # batches of this epoch trained before a resume
            done = (state["step"] - epoch * steps_per_epoch) * accumulation_steps
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
                if state["step"] % args.logging_steps == 0 and (record := loop.window_record(state["step"])):
                    run.metrics.log(record)
                stopping = stop.requested()
                every = args.checkpointing_steps
                periodic = every and state["step"] % every == 0 and state["step"] != epoch_end
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
    args, accelerator, metric = run.args, run.accelerator, run.main_metric
    if (record := run.loop.window_record(state["step"])) is not None:
        run.metrics.log(record)
    loss_sums = accelerator.gather(torch.tensor([state["loss_sum"], state["loss_count"]], dtype=torch.float64))
    mean = loss_sums.view(-1, 2).sum(0)
    record = {"step": state["step"], "epoch": epoch + 1, "train_loss": float(mean[0] / max(mean[1], 1))}
    scored = run.eval_sets and (args.eval_strategy == "epoch" or last)
    scores = evaluate(run.model, run.eval_sets, accelerator, run.labels, task_name=args.task_name) if scored else {}
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
            accelerator, run.model, run.tokenizer, args.output_dir, config_updates=PRETRAINING_ONLY_FIELDS
        )


def finish(run: Finetuning, state, loaders, other_sets, train_set, *, train_runtime):
    """Predict the test split with the best model; write eval_results.json, all_results.json, history.json,
    predict_results.tsv and training_curves.png."""
    args, accelerator, labels = run.args, run.accelerator, run.labels
    results = {f"eval_{k}": v for k, v in state["best"]["metrics"].items()}
    results.update(
        best_epoch=state["best"]["epoch"],
        epochs=state["epoch"],
        train_samples=len(text_labels(train_set)),  # texts (in windows mode fewer than the rows)
        train_runtime_s=round(train_runtime, 2),
    )
    layout = ("long_document_mode", "head_len", "max_windows", "max_seq_length")
    results.update({name: getattr(args, name) for name in layout}, mixed_precision=accelerator.mixed_precision)
    if args.long_document_mode == "windows":
        results["train_windows"] = len(train_set)
    if state["history"]:
        results["train_loss"] = state["history"][-1]["train_loss"]
    out = Path(args.output_dir)
    if "test" in loaders:
        start = time.perf_counter()
        predictions = predict(run.model, loaders["test"], accelerator, is_regression=labels.is_regression)
        results["test_runtime_s"] = round(time.perf_counter() - start, 2)
        if "labels" in other_sets["test"].column_names:
            scores = inference.compute_metrics(args.task_name, predictions, text_labels(other_sets["test"]), labels)
            results.update({f"test_{k}": v for k, v in scores.items()})
        if accelerator.is_main_process:
            training.atomic_write_text(out / "predict_results.tsv", inference.predictions_tsv(predictions, labels))
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
        if args.push_to_hub:
            training.push_output_dir(args, commit_message="Finetuned with finetune/run_glue.py")
    accelerator.print(json.dumps(results))
    training.end_run(accelerator)
    return results


if __name__ == "__main__":
    training.exit_on_recipe_error(main, sys.argv[1:], "run_glue.py")
