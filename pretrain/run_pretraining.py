#!/usr/bin/env python
"""XLNet permutation-LM pretraining with accelerate, the Transformer-XL memory carried across steps (--objective mlm
or clm trains the same backbone on the same data as BERT's masked LM or a causal LM instead).

    accelerate launch pretrain/run_pretraining.py [--config FILE.yaml|json] [--flag value ...]
    python pretrain/run_pretraining.py ...                     (one process)

With no flags: the `small` preset on the training text of 20 Newsgroups (--embedded_corpus picks another embedded
corpus; --train_file or --dataset_name your own), a Unigram tokenizer trained on it, and the model in
outputs/pretrain. --max_train_minutes trains to a wall-clock deadline instead of --max_steps. The objective follows
XLNet except three defaults that pay sooner at small budgets (benchmarks/RESULTS.md): single-token targets, a third of
the tokens predicted and a constant learning rate after warmup; XLNet's own are `--max_span_length 5
--plm_probability 0.16666666666666666 --lr_scheduler_type linear`. Each batch row is a contiguous stream, so the mems
of step t feed step t+1. The corpus is tokenized once into a token store (xlnet_lite.token_store) that every
rank and later run reads; --prepare_only builds it alone, --token_store DIR trains from one. The training machinery
(flags, output folder, checkpoints, metrics, signals) is xlnet_lite.training, shared with finetune/run_glue.py.
"""

import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from tqdm.auto import tqdm

from xlnet_lite import embedded_datasets, token_store, training
from xlnet_lite.collator import DataCollatorForXLNetPretraining
from xlnet_lite.data import PretrainingStream
from xlnet_lite.model_utils import (
    MODEL_PRESETS,
    PRETRAINING_ONLY_FIELDS,
    init_lm_bias_at_unigram,
    unigram_cross_entropy,
    unigram_log_probs,
)
from xlnet_lite.objectives import OBJECTIVES
from xlnet_lite.pretraining import build_data, build_model, evaluate, get_token_store, get_tokenizer, load_corpus
from xlnet_lite.training import flag

UNLIMITED_STEPS = 10**9  # --max_steps under a time budget without a step limit
# XLNet's objective settings, which three of this recipe's defaults replace (the docstring says why)
XLNET_OBJECTIVE = {"max_span_length": 5, "plm_probability": 1 / 6, "lr_scheduler_type": "linear"}
OUTPUTS = (
    *("tokenizer", "metrics.jsonl", "results.json", "loss.png", "config.json", "model.safetensors"),
    *("generation_config.json", "modeling_xlnet_lite.py", "configuration_xlnet_lite.py", "triton_attention.py"),
    *("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "runs"),
)


@dataclass
class PretrainingArguments(training.RecipeArguments):
    """XLNet permutation-LM pretraining (pretrain/run_pretraining.py)."""

    # model
    model_size: Literal[tuple(MODEL_PRESETS)] = flag("small", "Architecture preset (random init).")
    config_name: str | None = flag(None, "Random init from this config folder (XLNet-Lite or transformers XLNet).")
    model_name_or_path: str | None = flag(
        None, "Continue pretraining these weights (XLNet-Lite or transformers XLNet; folder or Hub id)."
    )
    tokenizer_name: str | None = flag(None, "Tokenizer folder or Hub id (default: trained on the corpus).")
    vocab_size: int = flag(8000, "Pieces of the tokenizer trained on the corpus.")
    tokenizer_train_characters: int = flag(
        50_000_000,
        "Train the tokenizer on at most N characters of text spread evenly over the corpus, read as the trainer asks "
        '(a stream: its first N); every embedded corpus fits whole (benchmarks/RESULTS.md, "Data scale").',
    )
    tokenizer_train_documents: int = flag(
        100000, "...and on at most N documents spread over the corpus (a stream: its first N)."
    )
    dropout: float = flag(
        0.0, "Dropout, also replacing that of a loaded model (0 pretrains better in one pass: benchmarks/RESULTS.md)."
    )
    # data
    train_file: str | None = flag(None, "Text file, documents separated by blank lines.")
    validation_file: str | None = flag(None, "Text file for validation (default: split off --train_file).")
    embedded_corpus: Literal["newsgroups", "news", "newsgroups+news", "rotten_tomatoes"] = flag(
        "newsgroups",
        "Without --train_file / --dataset_name: an embedded corpus, without its task's validation and test texts.",
    )
    dataset_name: str | None = flag(None, "datasets name or local folder (instead of --train_file).")
    dataset_config_name: str | None = flag(None, "The dataset's configuration.")
    text_column: str = flag("text", "Text column of --dataset_name.")
    streaming: bool = flag(False, "Stream --dataset_name instead of downloading it whole (read once into the store).")
    token_store: str | None = flag(
        None, "Train from this token store (printed by --prepare_only) instead of a corpus; its tokenizer with it."
    )
    token_store_cache_dir: str | None = flag(
        None, "Where token stores and trained tokenizers are kept (default: $XLNET_LITE_CACHE or $HF_HOME/xlnet_lite)."
    )
    preprocessing_num_workers: int = flag(
        1, "Processes tokenizing the corpus (1: the tokenizers library already encodes on every core)."
    )
    prepare_only: bool = flag(
        False, "Build the token store (and train the tokenizer), print its path and exit: tokenize on CPU nodes first."
    )
    validation_split_percentage: float = flag(
        2.0, "Percent of the documents held out for validation where the corpus has no validation part."
    )
    seq_len: int = flag(128, "Tokens per sample: reuse_len + A <sep> B <sep> <cls>.")
    reuse_len: int = flag(64, "Tokens the next step reuses through the memory.")
    mem_len: int = flag(96, "Memory tokens kept per layer (0: no memory: each step reads its batch alone).")
    perm_size: int | None = flag(None, "Factorization-order chunk length (default: reuse_len).")
    objective: Literal[tuple(OBJECTIVES)] = flag(
        "plm", "XLNet's permutation LM, BERT's masked LM (content stream) or a causal LM: xlnet_lite.objectives."
    )
    mlm_probability: float = flag(0.15, "--objective mlm: fraction of tokens masked and predicted (BERT: 0.15).")
    plm_probability: float = flag(1 / 3, "Fraction of tokens predicted (XLNet: 1/6; 1/3 learns more per token).")
    max_span_length: int = flag(1, "Longest span of predicted tokens, each starting at a word (XLNet: 5).")
    bi_data: bool = flag(False, "Half the rows read the text backwards (needs even batches).")
    # optimisation and evaluation (defaults differ from finetuning)
    output_dir: str = flag("outputs/pretrain", "Model, tokenizer, metrics, results, loss.png, checkpoints/.")
    learning_rate: float = flag(
        6e-4, "Peak learning rate (the best of a sweep on 20 Newsgroups: benchmarks/RESULTS.md)."
    )
    lr_scheduler_type: str = flag(
        "constant_with_warmup",
        "transformers learning-rate schedule (XLNet: linear; a constant rate can be extended past --max_steps).",
        choices=training.SCHEDULES,
    )
    weight_decay: float = flag(0.01, "AdamW weight decay (never on biases and LayerNorm).")
    num_warmup_steps: int = flag(100, "Linear warmup steps (or use --warmup_ratio).")
    max_steps: int | None = flag(None, "Optimizer steps (default: 1000; with --max_train_minutes, no step limit).")
    max_train_minutes: float | None = flag(
        None, "Train for this many minutes; a linear or cosine schedule decays to zero at the deadline."
    )
    eval_steps: int = flag(250, "Evaluate every N steps (and at the end).")
    eval_batches: int = flag(16, "Validation batches per evaluation.")

    STATIC_SHAPES = True  # B x seq_len batches, a memory of mem_len from the second step on
    RESUME_MUST_MATCH = training.RecipeArguments.RESUME_MUST_MATCH + (
        *("model_size", "config_name", "model_name_or_path", "tokenizer_name", "vocab_size"),
        *("tokenizer_train_documents", "tokenizer_train_characters", "dropout", "train_file", "validation_file"),
        "embedded_corpus",
        *("dataset_name", "dataset_config_name", "text_column", "token_store", "seq_len", "reuse_len", "mem_len"),
        *("perm_size", "plm_probability", "max_span_length", "bi_data", "lr_scheduler_type", "objective"),
        "mlm_probability",
    )


def check_args(args: PretrainingArguments):
    """Every inconsistency, named by flag, before anything is loaded."""
    problems = training.check_common_args(args)
    if not 0 < args.reuse_len < args.seq_len - 4:
        problems.append(
            f"--reuse_len ({args.reuse_len}) must be in [1, seq_len - 5 = {args.seq_len - 5}]: "
            "A <sep> B <sep> <cls> need room"
        )
    if args.perm_size is not None and not 0 < args.perm_size <= args.reuse_len:
        problems.append(f"--perm_size ({args.perm_size}) must be in [1, reuse_len = {args.reuse_len}]")
    if args.mem_len < 0:
        problems.append(f"--mem_len must be >= 0, got {args.mem_len}")
    if args.bi_data and (args.per_device_train_batch_size % 2 or args.per_device_eval_batch_size % 2):
        problems.append("--bi_data needs even --per_device_train_batch_size and --per_device_eval_batch_size")
    for name in ("plm_probability", "mlm_probability"):
        if not 0 < getattr(args, name) < 1:
            problems.append(f"--{name} must be in (0, 1), got {getattr(args, name)}")
    if args.bi_data and args.objective != "plm":
        problems.append(f"--bi_data is a permutation-LM option; --objective {args.objective} reads rows forwards")
    if args.max_train_minutes is not None and args.max_train_minutes <= 0:
        problems.append(f"--max_train_minutes must be > 0, got {args.max_train_minutes}")
    if args.max_train_minutes is not None and args.warmup_ratio:
        problems.append("--warmup_ratio needs a known step count; with --max_train_minutes pass --num_warmup_steps")
    if args.max_steps is None:
        args.max_steps = 1000 if args.max_train_minutes is None else UNLIMITED_STEPS
    for name in ("max_steps", "eval_steps", "max_span_length", "vocab_size", "eval_batches"):
        if getattr(args, name) < 1:
            problems.append(f"--{name} must be >= 1, got {getattr(args, name)}")
    for name in ("tokenizer_train_documents", "tokenizer_train_characters"):
        if getattr(args, name) < 1:
            problems.append(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.train_file and args.dataset_name:
        problems.append("pass only one of --train_file or --dataset_name")
    if args.token_store and (args.train_file or args.dataset_name or args.tokenizer_name):
        problems.append(
            "--token_store holds the corpus and its tokenizer: pass it without --train_file, --dataset_name "
            "and --tokenizer_name"
        )
    if args.token_store and not token_store.is_token_store(Path(args.token_store)):
        problems.append(f"--token_store {args.token_store}: not a complete token store (build one with --prepare_only)")
    if args.preprocessing_num_workers < 1:
        problems.append(f"--preprocessing_num_workers must be >= 1, got {args.preprocessing_num_workers}")
    if args.validation_file and not args.train_file:
        problems.append("--validation_file needs --train_file")
    for name in ("train_file", "validation_file"):
        if getattr(args, name) and not Path(getattr(args, name)).is_file():
            problems.append(f"--{name}: no such file {getattr(args, name)}")
    if args.model_name_or_path and args.config_name:
        problems.append("pass only one of --model_name_or_path (weights) or --config_name (random init)")
    if not 0 < args.validation_split_percentage < 50:
        problems.append(f"--validation_split_percentage must be in (0, 50), got {args.validation_split_percentage}")
    training.raise_problems(problems)
    if not (args.token_store or args.train_file or args.dataset_name):
        for name in args.embedded_corpus.split("+"):
            if missing := embedded_datasets.missing_package(name):
                raise training.RecipeError(f"--embedded_corpus {name}: {missing}; or pass --train_file")
    training.warmup_steps(args, args.max_steps)  # a warmup longer than the run stops here, before any work
    if args.max_train_minutes is not None:
        training.TimeBudget(
            args.max_train_minutes, warmup_steps=0, schedule=args.lr_scheduler_type
        )  # refuses other schedules


# ---------------------------------------------------------------------------------------------------------
# The recipe


def main(argv=None):
    args, accelerator, checkpoints, resume = training.set_up_run(
        PretrainingArguments, argv, check=check_args, outputs=OUTPUTS, description=__doc__
    )
    train_docs, valid_docs = (None, None) if args.token_store else load_corpus(args)
    tokenizer = get_tokenizer(args, train_docs, accelerator)
    if args.prepare_only:
        store = get_token_store(args, tokenizer, train_docs, valid_docs, accelerator)
        accelerator.print(
            f"token store: {store.path} (train from it with --token_store {store.path}, or run the same flags again)"
        )
        training.end_run(accelerator)
        return {"token_store": str(store.path), **store.meta["splits"]}
    model = build_model(args, tokenizer)
    training.crash_point("model_built")
    if resume is not None:  # before tokenizing the corpus
        training.check_resume_model(resume, training.model_fields(model), num_processes=accelerator.num_processes)
    accelerator.print(
        f"model: {model.num_parameters() / 1e6:.2f}M parameters, {model.config.n_layer} layers, "
        f"d_model {model.config.d_model}; vocab {len(tokenizer)}"
    )
    store = get_token_store(args, tokenizer, train_docs, valid_docs, accelerator)
    stream, collator, eval_batches = build_data(args, tokenizer, store, accelerator)
    counts = stream.token_counts(minlength=model.config.vocab_size)[: model.config.vocab_size]
    if accelerator.num_processes > 1:  # the corpus's counts, so that every process starts from the same LM bias
        # (FSDP shards each process's own values; DDP would broadcast the main process's)
        counts = accelerator.reduce(torch.from_numpy(counts).to(accelerator.device), "sum").cpu().numpy()
    log_probs = unigram_log_probs(counts, model.config.vocab_size)
    baseline = unigram_cross_entropy(log_probs, torch.cat([b["labels"].flatten() for b in eval_batches]))
    if not args.model_name_or_path:
        init_lm_bias_at_unigram(model, log_probs)
    accelerator.print(
        f"data: {stream.num_tokens:,} training tokens, {stream.steps_per_epoch} steps per epoch; "
        f"{len(eval_batches)} validation batches; unigram baseline {baseline:.3f} nats"
    )
    budget = (
        None
        if args.max_train_minutes is None
        else training.TimeBudget(
            args.max_train_minutes,
            warmup_steps=training.warmup_steps(args, args.max_steps),
            schedule=args.lr_scheduler_type,
        )
    )
    optimizer, scheduler = training.make_optimizer_and_scheduler(
        args, model, max_steps=args.max_steps, budget=budget, num_processes=accelerator.num_processes
    )
    model, optimizer, scheduler = training.prepare(accelerator, model, optimizer, scheduler)
    training.start_tracking(accelerator, args, "xlnet_lite_pretraining")
    loop = training.TrainLoop(
        args, accelerator, model, optimizer, scheduler, checkpoints_dir=checkpoints.root, budget=budget
    )
    step, mems, records = 0, None, 0
    if resume is not None:
        trainer_state, rank_state, tensors = checkpoints.load(resume, device=accelerator.device)
        step, mems = trainer_state["step"], [tensors[f"mems.{i}"] for i in range(len(tensors))] or None
        stream.load_state_dict(rank_state["stream"])
        collator.load_state_dict(rank_state["collator"])
        loop.load_state_dict(trainer_state["loop"])
        records = trainer_state["metrics_records"]
        accelerator.print(f"resumed from {resume} at step {step}")
    metrics = training.MetricsLog(accelerator, args.output_dir, with_tracking=args.with_tracking)
    metrics.start(records)
    data = dict(stream=stream, collator=collator, eval_batches=eval_batches, baseline=baseline)
    run = Pretraining(args, accelerator, model, tokenizer, loop, checkpoints, metrics, **data)
    finished = train(run, step=step, mems=mems)
    if not finished:
        training.end_run(accelerator)
        return None
    return finish(run, steps=finished)


@dataclass
class Pretraining(training.RecipeRun):
    """The run's shared state, with the pretraining data: the stream, its collator, the validation batches and the
    unigram baseline loss."""

    stream: PretrainingStream
    collator: DataCollatorForXLNetPretraining
    eval_batches: list
    baseline: float


def tokens_per_step(args, accelerator):
    """Tokens one optimizer step trains on, over every process."""
    return (
        args.per_device_train_batch_size * args.seq_len * args.gradient_accumulation_steps * accelerator.num_processes
    )


def train(run: Pretraining, *, step, mems):
    """Optimizer steps until --max_steps or the --max_train_minutes deadline (returns the step count) or a signal (a
    checkpoint, then 0)."""
    args, accelerator, model, loop = run.args, run.accelerator, run.model, run.loop
    stream, collator = run.stream, run.collator
    carried, use_mems, step_tokens = {"mems": mems}, args.mem_len > 0, tokens_per_step(args, accelerator)

    def micro_batch():
        batch = {k: v.to(accelerator.device) for k, v in collator(stream.next_batch()).items()}
        out = model(**batch, mems=carried["mems"], use_mems=use_mems)
        carried["mems"] = out.mems
        return out.loss

    stop = training.StopSignal(accelerator)
    budget = loop.budget
    progress = tqdm(
        total=None if budget else args.max_steps,
        initial=step,
        disable=not accelerator.is_local_main_process,
        desc="pretraining",
    )
    model.train()
    try:
        last = step >= args.max_steps or (budget is not None and budget.expired())
        while not last:
            step += 1
            loop.step((micro_batch for _ in range(args.gradient_accumulation_steps)), step=step, tokens=step_tokens)
            last = step >= args.max_steps or (budget is not None and budget.expired())
            record = loop.window_record(step) if step % args.logging_steps == 0 or last else None
            if step % args.eval_steps == 0 or last:
                record, start = record or {"step": step}, time.perf_counter()
                with loop.paused():
                    record["eval_loss"] = evaluate(model, run.eval_batches, accelerator, with_memory=use_mems)
                    record["eval_loss_no_memory"] = (
                        evaluate(model, run.eval_batches, accelerator, with_memory=False)
                        if use_mems
                        else record["eval_loss"]
                    )  # without a memory: the same pass
                record["eval_perplexity"] = math.exp(min(record["eval_loss"], 50))
                record["eval_seconds"] = time.perf_counter() - start
            if record is not None:
                run.metrics.log(record)
                progress.set_postfix(loss=f"{record.get('loss', float('nan')):.3f}")
            progress.update(1)
            stopping = stop.requested()
            if stopping or (args.checkpointing_steps and step % args.checkpointing_steps == 0):
                with loop.paused():
                    run.save_checkpoint(
                        step,
                        rank_state={"stream": stream.state_dict(), "collator": collator.state_dict()},
                        rank_tensors={f"mems.{i}": m for i, m in enumerate(carried["mems"] or [])},
                    )
            if stopping:
                accelerator.print(
                    f"received signal {stop.signal or '(another process)'}: checkpoint saved at step {step}, exiting"
                )
                return 0
    finally:
        stop.close()
        progress.close()
    return step


def finish(run: Pretraining, *, steps):
    """results.json, loss.png and the model (training-only config fields reset), each written atomically."""
    args, accelerator, model, loop, baseline = run.args, run.accelerator, run.model, run.loop, run.baseline
    device = accelerator.device
    records = run.metrics.records()
    evals = [r for r in records if "eval_loss" in r]
    trained = [r for r in records if "tokens_per_second" in r]
    results = {
        "steps": steps,
        "max_train_minutes": args.max_train_minutes,
        "parameters": accelerator.unwrap_model(model).num_parameters(),
        "train_tokens_seen": steps * tokens_per_step(args, accelerator),
        "corpus_tokens": run.stream.num_tokens,
        "train_seconds": loop.elapsed,
        "tokens_per_second": float(np.median([r["tokens_per_second"] for r in trained])) if trained else None,
        "final_train_loss": trained[-1]["loss"] if trained else None,
        "eval_loss": evals[-1]["eval_loss"] if evals else None,
        "eval_loss_no_memory": evals[-1]["eval_loss_no_memory"] if evals else None,
        "unigram_baseline_loss": baseline,
        "skipped_steps": loop.skipped,
        "mixed_precision": accelerator.mixed_precision,
        "num_processes": accelerator.num_processes,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else device.type,  # where it trained
    }
    training.save_final_model(
        accelerator, model, run.tokenizer, args.output_dir, config_updates=PRETRAINING_ONLY_FIELDS
    )
    if accelerator.is_main_process:
        training.write_json(Path(args.output_dir, "results.json"), results)
        training.plot_metrics(
            records,
            Path(args.output_dir, "loss.png"),
            title=f"XLNet-Lite {OBJECTIVES[args.objective]} pretraining",
            left={
                "loss": f"train {args.objective.upper()} loss",
                "eval_loss": "validation, with memory",
                "eval_loss_no_memory": "validation, no memory",
            },
            hline=(baseline, f"unigram baseline ({baseline:.2f})"),
        )
        accelerator.print(json.dumps(results, indent=2))
        if args.push_to_hub:
            training.push_output_dir(args, commit_message="Pretrained with pretrain/run_pretraining.py")
    training.end_run(accelerator)
    return results


if __name__ == "__main__":
    training.exit_on_recipe_error(main, sys.argv[1:], "run_pretraining.py")
