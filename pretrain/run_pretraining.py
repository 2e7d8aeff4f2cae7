#!/usr/bin/env python
"""XLNet permutation-LM pretraining with accelerate, the Transformer-XL memory carried across steps.

    accelerate launch pretrain/run_pretraining.py [--config FILE.yaml|json] [--flag value ...]
    python pretrain/run_pretraining.py ...                     (one process)

With no flags: the `small` preset on the training text of 20 Newsgroups (without the validation and test messages of
finetune/run_glue.py's default task; --embedded_corpus news for the embedded news articles, newsgroups+news for both,
rotten_tomatoes for the plot summaries and reviews of the Rotten Tomatoes training movies),
a Unigram tokenizer trained on it, and the model in outputs/pretrain. --max_train_minutes trains to a wall-clock
deadline instead of --max_steps. The objective follows XLNet except three defaults that made pretraining pay
soonest at small budgets (benchmarks/RESULTS.md): single-token targets, a third of the tokens predicted, and a constant
learning rate after warmup (6e-4, the best of 3e-4 / 6e-4 / 1e-3 there); XLNet's own are `--max_span_length 5
--plm_probability 0.16666666666666666 --lr_scheduler_type linear`. Each batch row is a contiguous stream: step t+1 continues step t, so the mems of
step t feed step t+1.
The corpus is tokenized once into a memory-mapped token store (xlnet_lite.token_store) that every rank and every later
run on the same corpus and tokenizer reads; --prepare_only builds it alone, --token_store DIR trains from one. The
training machinery (flags, output folder, checkpoints, metrics, signals) is xlnet_lite.training, shared with
finetune/run_glue.py.
"""

import dataclasses
import json
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from tqdm.auto import tqdm

import xlnet_lite
from xlnet_lite import token_store, training
from xlnet_lite.collator import DataCollatorForXLNetPretraining
from xlnet_lite.data import (
    PretrainingStream,
    TextFileDocuments,
    build_eval_batches,
    count_text_documents,
    held_out_positions,
    spread_documents,
)
from xlnet_lite.embedded_datasets import (
    embedded_news_pretraining_texts,
    embedded_newsgroups_pretraining_texts,
    embedded_rotten_tomatoes_pretraining_texts,
)
from xlnet_lite.model_utils import (
    MODEL_PRESETS,
    PRETRAINING_ONLY_FIELDS,
    init_lm_bias_at_unigram,
    load_model,
    model_from_config,
    unigram_cross_entropy,
    unigram_log_probs,
)
from xlnet_lite.tokenization_xlnet_lite import load_tokenizer, train_tokenizer

UNLIMITED_STEPS = 10**9  # --max_steps under a time budget without a step limit
# XLNet's objective settings, which three of this recipe's defaults replace (the docstring says why)
XLNET_OBJECTIVE = {"max_span_length": 5, "plm_probability": 1 / 6, "lr_scheduler_type": "linear"}
OUTPUTS = (
    "tokenizer",
    "metrics.jsonl",
    "results.json",
    "loss.png",
    "config.json",
    "model.safetensors",
    "generation_config.json",
    "modeling_xlnet_lite.py",
    "configuration_xlnet_lite.py",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "runs",
)


@dataclass
class PretrainingArguments(training.RecipeArguments):
    """XLNet permutation-LM pretraining (pretrain/run_pretraining.py)."""

    # model
    model_size: Literal[tuple(MODEL_PRESETS)] = field(
        default="small", metadata={"help": "Architecture preset (random init)."}
    )
    config_name: str | None = field(
        default=None, metadata={"help": "Random init from this config folder (XLNet-Lite or transformers XLNet)."}
    )
    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Continue pretraining these weights (XLNet-Lite or transformers XLNet; folder or Hub id)."},
    )
    tokenizer_name: str | None = field(
        default=None, metadata={"help": "Tokenizer folder or Hub id (default: trained on the corpus)."}
    )
    vocab_size: int = field(default=8000, metadata={"help": "Pieces of the tokenizer trained on the corpus."})
    tokenizer_train_documents: int = field(
        default=100000,
        metadata={
            "help": "Train the tokenizer on N documents spread evenly over the corpus (all of a smaller one; a stream: its first N)."
        },
    )
    dropout: float = field(
        default=0.0,
        metadata={
            "help": "Dropout, also replacing that of --model_name_or_path or --config_name (one pass over the data: 0.1 measured 6.41 vs 6.18 nats)."
        },
    )
    # data
    train_file: str | None = field(default=None, metadata={"help": "Text file, documents separated by blank lines."})
    validation_file: str | None = field(
        default=None, metadata={"help": "Text file for validation (default: split off --train_file)."}
    )
    embedded_corpus: Literal["newsgroups", "news", "newsgroups+news", "rotten_tomatoes"] = field(
        default="newsgroups",
        metadata={
            "help": "Without --train_file / --dataset_name: the training text of 20 Newsgroups, the embedded news articles, both, or the Rotten Tomatoes training movies (plots and reviews), each without its task's validation and test texts."
        },
    )
    dataset_name: str | None = field(
        default=None, metadata={"help": "datasets name or local folder (instead of --train_file)."}
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "The dataset's configuration."})
    text_column: str = field(default="text", metadata={"help": "Text column of --dataset_name."})
    streaming: bool = field(
        default=False,
        metadata={"help": "Stream --dataset_name instead of downloading it whole (read once into the token store)."},
    )
    token_store: str | None = field(
        default=None,
        metadata={
            "help": "Train from this token store (printed by --prepare_only) instead of a corpus; its tokenizer comes with it."
        },
    )
    token_store_cache_dir: str | None = field(
        default=None,
        metadata={
            "help": "Where token stores and trained tokenizers are kept, one per corpus and tokenizer (default: $XLNET_LITE_CACHE or $HF_HOME/xlnet_lite)."
        },
    )
    preprocessing_num_workers: int = field(
        default=1,
        metadata={
            "help": "Processes that tokenize the corpus into the token store. 1: this process, the tokenizers library encoding on every core (the fastest on 2 cores); more where Python's sentence splitting limits it."
        },
    )
    prepare_only: bool = field(
        default=False,
        metadata={
            "help": "Build the token store (and train the tokenizer), print its path and exit: tokenize on CPU nodes first."
        },
    )
    validation_split_percentage: float = field(
        default=2.0,
        metadata={
            "help": "Percent of the documents held out for validation where the corpus has no validation part, "
            "spread evenly over it (one from the middle of each of that many equal strides)."
        },
    )
    seq_len: int = field(default=128, metadata={"help": "Tokens per sample: reuse_len + A <sep> B <sep> <cls>."})
    reuse_len: int = field(default=64, metadata={"help": "Tokens the next step reuses through the memory."})
    mem_len: int = field(
        default=96, metadata={"help": "Memory tokens kept per layer (0: no memory: each step reads its batch alone)."}
    )
    perm_size: int | None = field(
        default=None, metadata={"help": "Factorization-order chunk length (default: reuse_len)."}
    )
    plm_probability: float = field(
        default=1 / 3,
        metadata={"help": "Fraction of tokens predicted (XLNet: 1/6; 1/3 learns more per token on small budgets)."},
    )
    max_span_length: int = field(
        default=1,
        metadata={
            "help": "Longest span of predicted tokens, each starting at a word (XLNet: 5; single tokens leave the unigram "
            "plateau sooner)."
        },
    )
    bi_data: bool = field(
        default=False, metadata={"help": "Half the rows read the text backwards (needs even batches)."}
    )
    # optimisation and evaluation (defaults differ from finetuning)
    output_dir: str = field(
        default="outputs/pretrain", metadata={"help": "Model, tokenizer, metrics, results, loss.png, checkpoints/."}
    )
    learning_rate: float = field(
        default=6e-4,
        metadata={
            "help": "Peak learning rate (with the other defaults 6e-4 beat 3e-4 and 1e-3 at equal steps on 20 Newsgroups; "
            "with XLNet's span targets and decay 1e-3 and 3e-3 kept the small preset on the unigram plateau)."
        },
    )
    lr_scheduler_type: str = field(
        default="constant_with_warmup",
        metadata={
            "help": "transformers learning-rate schedule (XLNet: linear; a constant rate after warmup pays sooner on small "
            "budgets, and a run can be extended: its schedule does not depend on --max_steps).",
            "choices": training.SCHEDULES,
        },
    )
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay (never on biases and LayerNorm)."})
    num_warmup_steps: int = field(default=100, metadata={"help": "Linear warmup steps (or use --warmup_ratio)."})
    max_steps: int | None = field(
        default=None, metadata={"help": "Optimizer steps (default: 1000; with --max_train_minutes, no step limit)."}
    )
    max_train_minutes: float | None = field(
        default=None,
        metadata={
            "help": "Train for this many minutes of optimizer steps; a linear or cosine schedule decays to zero at the deadline."
        },
    )
    eval_steps: int = field(default=250, metadata={"help": "Evaluate every N steps (and at the end)."})
    eval_batches: int = field(default=16, metadata={"help": "Validation batches per evaluation."})

    STATIC_SHAPES = True  # B x seq_len batches, a memory of mem_len from the second step on
    RESUME_MUST_MATCH = training.RecipeArguments.RESUME_MUST_MATCH + (
        "model_size",
        "config_name",
        "model_name_or_path",
        "tokenizer_name",
        "vocab_size",
        "tokenizer_train_documents",
        "dropout",
        "train_file",
        "validation_file",
        "embedded_corpus",
        "dataset_name",
        "dataset_config_name",
        "text_column",
        "token_store",
        "seq_len",
        "reuse_len",
        "mem_len",
        "perm_size",
        "plm_probability",
        "max_span_length",
        "bi_data",
        "lr_scheduler_type",
    )


def check_args(a: PretrainingArguments):
    """Every inconsistency, named by flag, before anything is loaded."""
    problems = training.check_common_args(a)
    if not 0 < a.reuse_len < a.seq_len - 4:
        problems.append(
            f"--reuse_len ({a.reuse_len}) must be in [1, seq_len - 5 = {a.seq_len - 5}]: A <sep> B <sep> <cls> need room"
        )
    if a.perm_size is not None and not 0 < a.perm_size <= a.reuse_len:
        problems.append(f"--perm_size ({a.perm_size}) must be in [1, reuse_len = {a.reuse_len}]")
    if a.mem_len < 0:
        problems.append(f"--mem_len must be >= 0, got {a.mem_len}")
    if a.bi_data and (a.per_device_train_batch_size % 2 or a.per_device_eval_batch_size % 2):
        problems.append("--bi_data needs even --per_device_train_batch_size and --per_device_eval_batch_size")
    if not 0 < a.plm_probability < 1:
        problems.append(f"--plm_probability must be in (0, 1), got {a.plm_probability}")
    if a.max_train_minutes is not None and a.max_train_minutes <= 0:
        problems.append(f"--max_train_minutes must be > 0, got {a.max_train_minutes}")
    if a.max_train_minutes is not None and a.warmup_ratio:
        problems.append("--warmup_ratio needs a known step count; with --max_train_minutes pass --num_warmup_steps")
    if a.max_steps is None:
        a.max_steps = 1000 if a.max_train_minutes is None else UNLIMITED_STEPS
    for name in (
        "max_steps",
        "eval_steps",
        "max_span_length",
        "vocab_size",
        "eval_batches",
        "tokenizer_train_documents",
    ):
        if getattr(a, name) < 1:
            problems.append(f"--{name} must be >= 1, got {getattr(a, name)}")
    if a.train_file and a.dataset_name:
        problems.append("pass only one of --train_file or --dataset_name")
    if a.token_store and (a.train_file or a.dataset_name or a.tokenizer_name):
        problems.append(
            "--token_store holds the corpus and its tokenizer: pass it without --train_file, --dataset_name "
            "and --tokenizer_name"
        )
    if a.token_store and not token_store.is_token_store(Path(a.token_store)):
        problems.append(f"--token_store {a.token_store}: not a complete token store (build one with --prepare_only)")
    if a.preprocessing_num_workers < 1:
        problems.append(f"--preprocessing_num_workers must be >= 1, got {a.preprocessing_num_workers}")
    if a.validation_file and not a.train_file:
        problems.append("--validation_file needs --train_file")
    for name in ("train_file", "validation_file"):
        if getattr(a, name) and not Path(getattr(a, name)).is_file():
            problems.append(f"--{name}: no such file {getattr(a, name)}")
    if a.model_name_or_path and a.config_name:
        problems.append("pass only one of --model_name_or_path (weights) or --config_name (random init)")
    if not 0 < a.validation_split_percentage < 50:
        problems.append(f"--validation_split_percentage must be in (0, 50), got {a.validation_split_percentage}")
    training.raise_problems(problems)
    training.warmup_steps(a, a.max_steps)  # a warmup longer than the run stops here, before any work
    if a.max_train_minutes is not None:
        training.TimeBudget(
            a.max_train_minutes, warmup_steps=0, schedule=a.lr_scheduler_type
        )  # refuses other schedules


# ---------------------------------------------------------------------------------------------------------
# Data, tokenizer, model


# The embedded corpora, each without the validation and test texts of its downstream task (finetune/run_glue.py
# --embedded_task newsgroups / news_topic / rotten_tomatoes); a name joined by "+" is their union, each corpus
# holding out its own validation documents.
EMBEDDED_CORPORA = {
    "newsgroups": (embedded_newsgroups_pretraining_texts, "the embedded 20 Newsgroups training text"),
    "news": (embedded_news_pretraining_texts, "the embedded news corpus"),
    "rotten_tomatoes": (embedded_rotten_tomatoes_pretraining_texts, "the embedded Rotten Tomatoes training movies"),
}


def load_corpus(a: PretrainingArguments):
    """(train, validation) documents, none of them read yet where that can wait: a --train_file is read lazily
    (TextFileDocuments), a dataset stays Arrow-backed or a stream; the embedded corpora are lists."""
    if a.train_file:
        if a.validation_file:
            return TextFileDocuments(a.train_file), TextFileDocuments(a.validation_file)
        return tuple(
            TextFileDocuments(a.train_file, hold_out=a.validation_split_percentage, part=part)
            for part in ("train", "validation")
        )
    if a.dataset_name:
        import datasets

        raw = datasets.load_dataset(a.dataset_name, a.dataset_config_name, streaming=a.streaming)
        if "train" not in raw:
            raise training.RecipeError(f"--dataset_name {a.dataset_name}: no 'train' split (has {list(raw)})")
        if a.text_column not in (raw["train"].column_names or [a.text_column]):
            raise training.RecipeError(
                f"--dataset_name {a.dataset_name}: no column {a.text_column!r} (--text_column); "
                f"has {raw['train'].column_names}"
            )
        if "validation" in raw:
            return raw["train"], raw["validation"]
        if a.streaming:  # hold out the first documents of the stream
            return raw["train"].skip(200), raw["train"].take(200)
        return split_off_validation(raw["train"], a.validation_split_percentage, f"--dataset_name {a.dataset_name}")
    # the embedded news without the validation and test articles of the news-topic task (finetune/run_glue.py)
    train, validation = [], []
    for name in a.embedded_corpus.split("+"):
        texts, source = EMBEDDED_CORPORA[name]
        parts = split_off_validation(texts(), a.validation_split_percentage, source)
        train, validation = train + parts[0], validation + parts[1]
    return train, validation


def split_off_validation(documents, percentage, source):
    """(train, validation): `percentage` percent of the documents (a list of texts, its blank ones dropped, or a
    `datasets.Dataset`) held out for validation, spread over the corpus (`held_out_positions`), each part in order."""
    if isinstance(documents, list):
        documents = [t for t in documents if t.strip()]
    n = len(documents)
    with training.bad_input(source):  # fewer than two (non-empty) documents
        held_out = held_out_positions(n, percentage)
    keep = np.ones(n, dtype=bool)
    keep[held_out] = False
    if isinstance(documents, list):
        return [t for t, k in zip(documents, keep) if k], [documents[i] for i in held_out]
    return documents.select(np.flatnonzero(keep)), documents.select(held_out)


def check_text_files(a):
    """Read --train_file and --validation_file through once (UTF-8, not empty, enough documents to hold some out)
    before the tokenizer or the store is built from them."""
    for flag, path in (("--train_file", a.train_file), ("--validation_file", a.validation_file)):
        if path:
            with training.bad_input(flag):
                n = count_text_documents(path)
                if flag == "--train_file" and not a.validation_file and n < 2:
                    raise ValueError(f"{path}: needs at least two documents (one for validation), has {n}")


def corpus_fingerprint(a, documents, part):
    """What identifies documents without reading them (a stream: the flags that name it)."""
    known = token_store.documents_fingerprint(documents, a.text_column)
    if known is not None:
        return known
    return {
        "dataset": a.dataset_name,
        "config": a.dataset_config_name,
        "streaming": a.streaming,
        "part": part,
        "text_column": a.text_column,
    }


def cache_dir(a) -> Path:
    return Path(a.token_store_cache_dir) if a.token_store_cache_dir else token_store.default_cache_dir()


def get_tokenizer(a, train_docs, accelerator):
    """The run's tokenizer, also saved as output_dir/tokenizer (which a resumed run loads): that of --token_store,
    --tokenizer_name, the tokenizer of --model_name_or_path, or a Unigram tokenizer trained on documents spread
    over the corpus (by the main process, once per corpus and settings: kept in the cache)."""
    path = Path(a.output_dir, "tokenizer")
    if Path(path, "tokenizer.json").is_file():
        return load_tokenizer(path)
    if a.token_store:
        return token_store.TokenStore(a.token_store).tokenizer()
    if a.tokenizer_name:
        return load_tokenizer(a.tokenizer_name)
    if a.model_name_or_path and Path(a.model_name_or_path, "tokenizer.json").is_file():
        return load_tokenizer(a.model_name_or_path)
    key = {
        "corpus": corpus_fingerprint(a, train_docs, "train"),
        "vocab_size": a.vocab_size,
        "documents": a.tokenizer_train_documents,
        "spread": True,
        "text_column": a.text_column,
    }

    def train(final: Path):
        check_text_files(a)
        texts = spread_documents(train_docs, a.tokenizer_train_documents, text_column=a.text_column)
        accelerator.print(
            f"training a {a.vocab_size}-piece Unigram tokenizer on {len(texts):,} training documents "
            + ("(the first of the stream)" if a.streaming else "spread evenly over the corpus")
        )
        tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
        tokenizer = train_tokenizer(texts, vocab_size=a.vocab_size)
        training.crash_point("tokenizer_trained")
        tokenizer.save_pretrained(tmp)
        training.replace_folder(tmp, final)

    with accelerator.main_process_first():
        cached = token_store.cached_folder(
            cache_dir(a),
            f"tokenizer-{token_store.fingerprint(key)}",
            train,
            is_complete=lambda p: Path(p, "tokenizer.json").is_file(),
            log=accelerator.print,
        )
    if accelerator.is_main_process:
        tmp = Path(a.output_dir, ".tokenizer.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(cached, tmp)
        training.replace_folder(tmp, path)
    accelerator.wait_for_everyone()
    return load_tokenizer(path)


def get_token_store(a, tokenizer, train_docs, valid_docs, accelerator) -> token_store.TokenStore:
    """--token_store, or the store of this corpus and tokenizer in the cache, built by the main process while the
    others wait (and by one run while another run on the same corpus waits)."""
    if a.token_store:
        return token_store.TokenStore(a.token_store)
    key = {
        "format": token_store.FORMAT,
        "train": corpus_fingerprint(a, train_docs, "train"),
        "validation": corpus_fingerprint(a, valid_docs, "validation"),
        "tokenizer": token_store.tokenizer_fingerprint(tokenizer),
        "text_column": a.text_column,
    }
    workers = a.preprocessing_num_workers

    def build(final: Path):
        check_text_files(a)
        if a.streaming:
            accelerator.print(
                "--streaming: the stream is read once, in chunks, into a token store on disk (rows need "
                "the corpus's length); later runs on it read the store"
            )
        accelerator.print(f"tokenizing the corpus into {final} ({workers} process{'es' if workers > 1 else ''})")
        with training.bad_input(f"the corpus ({corpus_name(a)})"):
            token_store.write_token_store(
                final,
                {"train": train_docs, "validation": valid_docs},
                tokenizer,
                text_column=a.text_column,
                num_proc=workers,
                source=key,
                log=accelerator.print if accelerator.is_local_main_process else None,
            )

    with accelerator.main_process_first():
        path = token_store.cached_folder(
            cache_dir(a),
            f"store-{token_store.fingerprint(key)}",
            build,
            is_complete=token_store.is_token_store,
            log=accelerator.print,
        )
    return token_store.TokenStore(path)


def build_model(a, tokenizer):
    """XLNetLiteLMHeadModel: --model_name_or_path (converted if it is transformers' XLNet), --config_name or the
    --model_size preset; --dropout and the pretraining data settings on its config (a loaded model's own dropout is
    replaced by --dropout, as the finetuning recipe does)."""
    # mem_len 0 is no memory here; the model itself (as transformers' XLNet) would keep every step's states
    data_fields = dict(mem_len=a.mem_len, reuse_len=a.reuse_len, bi_data=a.bi_data, use_mems_train=a.mem_len > 0)
    if a.model_name_or_path:
        model = load_model(a.model_name_or_path, xlnet_lite.XLNetLiteLMHeadModel, dropout=a.dropout)
    elif a.config_name:
        model = model_from_config(a.config_name, xlnet_lite.XLNetLiteLMHeadModel, dropout=a.dropout)
    else:
        model = xlnet_lite.XLNetLiteLMHeadModel(
            xlnet_lite.XLNetLiteConfig(
                **MODEL_PRESETS[a.model_size],
                vocab_size=len(tokenizer),
                dropout=a.dropout,
                pad_token_id=tokenizer.pad_token_id,
                bos_token_id=None,
                eos_token_id=tokenizer.sep_token_id,
            )
        )
    for key, value in data_fields.items():
        setattr(model.config, key, value)
    model.config.check_fields()
    if model.config.vocab_size < len(tokenizer):
        raise training.RecipeError(
            f"the model's vocab_size {model.config.vocab_size} is smaller than the tokenizer's {len(tokenizer)}"
        )
    return model


def corpus_name(a, *, validation=False) -> str:
    """Where the (validation) documents came from, as the flags that chose them."""
    if validation and a.validation_file:
        return f"--validation_file {a.validation_file}"
    source = (
        f"--train_file {a.train_file}"
        if a.train_file
        else f"--dataset_name {a.dataset_name}"
        if a.dataset_name
        else f"--embedded_corpus {a.embedded_corpus}"
    )
    if not validation or a.dataset_name:  # a dataset's own validation split, or the documents held out of it
        return source
    return f"{source}, held out by --validation_split_percentage {a.validation_split_percentage}"


def build_data(a, tokenizer, store, accelerator):
    """The training stream, its collator and the fixed validation batches, read from the token store."""
    stream_kw = dict(
        seq_len=a.seq_len,
        reuse_len=a.reuse_len,
        bi_data=a.bi_data,
        rank=accelerator.process_index,
        world_size=accelerator.num_processes,
    )
    with training.bad_input(f"the training corpus ({corpus_name(a)})"):
        stream = PretrainingStream(
            store.split("train"), tokenizer, batch_size=a.per_device_train_batch_size, seed=a.seed, **stream_kw
        )
    collator = DataCollatorForXLNetPretraining(
        tokenizer,
        plm_probability=a.plm_probability,
        max_span_length=a.max_span_length,
        reuse_len=a.reuse_len,
        perm_size=a.perm_size or a.reuse_len,
        seed=a.seed * 1000 + accelerator.process_index,
    )
    eval_collator = dataclasses.replace(collator, seed=a.seed + 1)  # the same targets at every evaluation
    with training.bad_input(
        f"the validation corpus ({corpus_name(a, validation=True)}; --per_device_eval_batch_size "
        f"{a.per_device_eval_batch_size})"
    ):
        eval_batches = [
            eval_collator(b)
            for b in build_eval_batches(
                store.split("validation"),
                tokenizer,
                batch_size=a.per_device_eval_batch_size,
                max_batches=a.eval_batches,
                seed=a.seed + 1,
                **stream_kw,
            )
        ]
    return stream, collator, eval_batches


@torch.no_grad()
def evaluate(model, eval_batches, accelerator, *, with_memory):
    """Validation PLM loss over consecutive batches, carrying the mems from one to the next or not."""
    model.eval()
    total, count, mems = torch.zeros((), device=accelerator.device), torch.zeros((), device=accelerator.device), None
    for batch in eval_batches:
        batch = {k: v.to(accelerator.device) for k, v in batch.items()}
        with accelerator.autocast():
            out = model(**batch, mems=mems if with_memory else None, use_mems=with_memory)
        n = (batch["labels"] != -100).sum()
        total, count, mems = total + out.loss.float() * n, count + n, out.mems
    model.train()
    total, count = accelerator.reduce(total, "sum"), accelerator.reduce(count, "sum")
    return (total / count.clamp(min=1)).item()


# ---------------------------------------------------------------------------------------------------------
# The recipe


def main(argv=None):
    a, accelerator, checkpoints, resume = training.set_up_run(
        PretrainingArguments, argv, check=check_args, outputs=OUTPUTS, description=__doc__
    )
    train_docs, valid_docs = (None, None) if a.token_store else load_corpus(a)
    tokenizer = get_tokenizer(a, train_docs, accelerator)
    if a.prepare_only:
        store = get_token_store(a, tokenizer, train_docs, valid_docs, accelerator)
        accelerator.print(
            f"token store: {store.path} (train from it with --token_store {store.path}, or run the same flags again)"
        )
        training.end_run(accelerator)
        return {"token_store": str(store.path), **store.meta["splits"]}
    model = build_model(a, tokenizer)
    training.crash_point("model_built")
    if resume is not None:  # before tokenizing the corpus
        training.check_resume_model(resume, training.model_fields(model), num_processes=accelerator.num_processes)
    accelerator.print(
        f"model: {model.num_parameters() / 1e6:.2f}M parameters, {model.config.n_layer} layers, "
        f"d_model {model.config.d_model}; vocab {len(tokenizer)}"
    )
    store = get_token_store(a, tokenizer, train_docs, valid_docs, accelerator)
    stream, collator, eval_batches = build_data(a, tokenizer, store, accelerator)
    log_probs = unigram_log_probs(stream.token_counts(minlength=model.config.vocab_size), model.config.vocab_size)
    baseline = unigram_cross_entropy(log_probs, torch.cat([b["labels"].flatten() for b in eval_batches]))
    if not a.model_name_or_path:
        init_lm_bias_at_unigram(model, log_probs)
    accelerator.print(
        f"data: {stream.num_tokens:,} training tokens, {stream.steps_per_epoch} steps per epoch; "
        f"{len(eval_batches)} validation batches; unigram baseline {baseline:.3f} nats"
    )
    budget = (
        None
        if a.max_train_minutes is None
        else training.TimeBudget(
            a.max_train_minutes, warmup_steps=training.warmup_steps(a, a.max_steps), schedule=a.lr_scheduler_type
        )
    )
    optimizer, scheduler = training.make_optimizer_and_scheduler(
        a, model, max_steps=a.max_steps, budget=budget, num_processes=accelerator.num_processes
    )
    model, optimizer, scheduler = training.prepare(accelerator, model, optimizer, scheduler)
    training.start_tracking(accelerator, a, "xlnet_lite_pretraining")
    loop = training.TrainLoop(
        a, accelerator, model, optimizer, scheduler, checkpoints_dir=checkpoints.root, budget=budget
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
    metrics = training.MetricsLog(accelerator, a.output_dir, with_tracking=a.with_tracking)
    metrics.start(records)
    run = Pretraining(
        a,
        accelerator,
        model,
        tokenizer,
        loop,
        checkpoints,
        metrics,
        stream=stream,
        collator=collator,
        eval_batches=eval_batches,
        baseline=baseline,
    )
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


def train(run: Pretraining, *, step, mems):
    """Optimizer steps until --max_steps or the --max_train_minutes deadline (returns the step count) or a signal (a
    checkpoint, then 0)."""
    a, accelerator, model, loop, stream, collator = (
        run.a,
        run.accelerator,
        run.model,
        run.loop,
        run.stream,
        run.collator,
    )
    carried, use_mems = {"mems": mems}, a.mem_len > 0
    tokens_per_step = (
        a.per_device_train_batch_size * a.seq_len * a.gradient_accumulation_steps * accelerator.num_processes
    )

    def micro_batch():
        batch = {k: v.to(accelerator.device) for k, v in collator(stream.next_batch()).items()}
        out = model(**batch, mems=carried["mems"], use_mems=use_mems)
        carried["mems"] = out.mems
        return out.loss

    stop = training.StopSignal(accelerator)
    budget = loop.budget
    progress = tqdm(
        total=None if budget else a.max_steps,
        initial=step,
        disable=not accelerator.is_local_main_process,
        desc="pretraining",
    )
    model.train()
    try:
        last = step >= a.max_steps or (budget is not None and budget.expired())
        while not last:
            step += 1
            loop.step((micro_batch for _ in range(a.gradient_accumulation_steps)), step=step, tokens=tokens_per_step)
            last = step >= a.max_steps or (budget is not None and budget.expired())
            record = loop.window_record(step) if step % a.logging_steps == 0 or last else None
            if step % a.eval_steps == 0 or last:
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
            if stopping or (a.checkpointing_steps and step % a.checkpointing_steps == 0):
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
    a, accelerator, model, loop, baseline = run.a, run.accelerator, run.model, run.loop, run.baseline
    records = run.metrics.records()
    evals = [r for r in records if "eval_loss" in r]
    trained = [r for r in records if "tokens_per_second" in r]
    results = {
        "steps": steps,
        "max_train_minutes": a.max_train_minutes,
        "parameters": accelerator.unwrap_model(model).num_parameters(),
        "train_tokens_seen": steps
        * a.per_device_train_batch_size
        * a.seq_len
        * a.gradient_accumulation_steps
        * accelerator.num_processes,
        "corpus_tokens": run.stream.num_tokens * accelerator.num_processes,
        "train_seconds": loop.elapsed,
        "tokens_per_second": float(np.median([r["tokens_per_second"] for r in trained])) if trained else None,
        "final_train_loss": trained[-1]["loss"] if trained else None,
        "eval_loss": evals[-1]["eval_loss"] if evals else None,
        "eval_loss_no_memory": evals[-1]["eval_loss_no_memory"] if evals else None,
        "unigram_baseline_loss": baseline,
        "skipped_steps": loop.skipped,
        "mixed_precision": accelerator.mixed_precision,
        "num_processes": accelerator.num_processes,
    }
    training.save_final_model(accelerator, model, run.tokenizer, a.output_dir, config_updates=PRETRAINING_ONLY_FIELDS)
    if accelerator.is_main_process:
        training.write_json(Path(a.output_dir, "results.json"), results)
        training.plot_metrics(
            records,
            Path(a.output_dir, "loss.png"),
            title="XLNet-Lite permutation-LM pretraining",
            left={
                "loss": "train PLM loss",
                "eval_loss": "validation, with memory",
                "eval_loss_no_memory": "validation, no memory",
            },
            hline=(baseline, f"unigram baseline ({baseline:.2f})"),
        )
        accelerator.print(json.dumps(results, indent=2))
        if a.push_to_hub:
            training.push_output_dir(a, commit_message="Pretrained with pretrain/run_pretraining.py")
    training.end_run(accelerator)
    return results


if __name__ == "__main__":
    training.exit_on_recipe_error(main, sys.argv[1:], "run_pretraining.py")
