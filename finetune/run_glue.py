"""Finetune XLNet-Lite for GLUE-style sequence classification or regression, with accelerate.

    accelerate launch --cpu --num_processes 1 --num_machines 1 --dynamo_backend no --mixed_precision no \
        finetune/run_glue.py --model_name_or_path outputs/pretrain --output_dir outputs/finetune

`python finetune/run_glue.py ...` works too, and `main(args)` takes a list of CLI strings or a
`FinetuneArguments`. Data: `--task_name` (GLUE from the Hub), `--train_file/--validation_file/--test_file`
(CSV, TSV or JSON lines with `sentence` or `sentence1` + `sentence2`, and `label`), or by default the
embedded Rotten Tomatoes split of `xlnet_lite.data`.

Inputs are XLNet's `A <sep> B <sep> <cls>` padded on the LEFT, and the model classifies from the last
position (<cls>). With `--long_document_mode mems` a text longer than `--max_seq_length` is read as
consecutive segments of `max_seq_length` tokens, left to right, carrying the Transformer-XL memory;
only the last segment (which ends with `<sep> <cls>`) gets gradients, the earlier ones run without
gradient (the model's memory is detached, as in Transformer-XL), and the class comes from the last <cls>.
"""

import argparse
import dataclasses
import json
import math
import os
import re
import shutil
import sys
import time
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from tqdm.auto import tqdm
from transformers import AutoConfig, AutoModelForSequenceClassification, get_scheduler

import xlnet_lite
from xlnet_lite.glue_metrics import GLUE_TASKS, file_metrics, glue_metrics, primary_metric
from xlnet_lite.tokenization_xlnet_lite import load_tokenizer

DEFAULT_PRETRAINED = "outputs/pretrain"
PRETRAIN_COMMAND = (
    "accelerate launch --cpu --num_processes 1 --num_machines 1 --dynamo_backend no --mixed_precision no "
    "pretrain/run_pretraining.py"
)
# GLUE column names (nyu-mll/glue), the validation / test splits, and the suffix of each validation split's metrics.
TASK_TO_KEYS = {
    "cola": ("sentence", None), "sst2": ("sentence", None), "mrpc": ("sentence1", "sentence2"),
    "qqp": ("question1", "question2"), "stsb": ("sentence1", "sentence2"), "mnli": ("premise", "hypothesis"),
    "qnli": ("question", "sentence"), "rte": ("sentence1", "sentence2"), "wnli": ("sentence1", "sentence2"),
}
FILE_FORMATS = {".csv": ("csv", {}), ".tsv": ("csv", {"delimiter": "\t"}), ".json": ("json", {}), ".jsonl": ("json", {})}


class RecipeError(ValueError):
    """Bad arguments or bad data: the message names the file (or flag) and the column."""


@dataclass
class FinetuneArguments:
    # data
    task_name: str | None = field(default=None, metadata={"help": "GLUE task, loaded from the Hub (nyu-mll/glue).", "choices": GLUE_TASKS})
    train_file: str | None = field(default=None, metadata={"help": "CSV / TSV / JSON lines: `sentence` or `sentence1`+`sentence2`, and `label`."})
    validation_file: str | None = field(default=None, metadata={"help": "Same columns as --train_file."})
    test_file: str | None = field(default=None, metadata={"help": "Same text columns; `label` optional. Writes predict_results.tsv."})
    max_seq_length: int = field(default=128, metadata={"help": "Tokens per input (per segment in mems mode), <sep>/<cls> included."})
    long_document_mode: str = field(default="truncate", metadata={"help": "Texts longer than max_seq_length: truncate, or read as segments carrying the memory.", "choices": ("truncate", "mems")})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep the first N training examples."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep the first N examples of each validation split."})
    max_predict_samples: int | None = field(default=None, metadata={"help": "Keep the first N test examples."})
    # model
    model_name_or_path: str | None = field(default=None, metadata={"help": f"Pretraining output, XLNet(-Lite) checkpoint folder or Hub id (default: {DEFAULT_PRETRAINED})."})
    config_name: str | None = field(default=None, metadata={"help": "Random initialisation from this config (instead of --model_name_or_path)."})
    tokenizer_name: str | None = field(default=None, metadata={"help": "Tokenizer (default: the model or config folder)."})
    mem_len: int | None = field(default=None, metadata={"help": "Override the model's mem_len (memory tokens kept per layer) in mems mode."})
    mems_backprop: str = field(default="last", metadata={"help": "mems mode: gradient through the last segment only, or through all segments.", "choices": ("last", "all")})
    dropout: float = field(default=0.1, metadata={"help": "Dropout while finetuning, set on the loaded config (XLNet finetunes with 0.1; the pretraining recipe trains without)."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow code from the checkpoint's folder / Hub repo."})
    # optimisation
    learning_rate: float = field(default=5e-5, metadata={"help": "Peak learning rate (of the classification head)."})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay (not on biases and LayerNorm)."})
    layerwise_lr_decay: float = field(default=1.0, metadata={"help": "Layer l of L gets lr * decay^(L-1-l), embeddings lr * decay^L."})
    adam_epsilon: float = field(default=1e-6, metadata={"help": "AdamW epsilon (XLNet: 1e-6)."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping norm (0: off)."})
    num_train_epochs: int = field(default=3, metadata={"help": "Epochs (0: only evaluate and predict)."})
    max_train_steps: int | None = field(default=None, metadata={"help": "Total optimizer steps; overrides --num_train_epochs."})
    per_device_train_batch_size: int = field(default=16, metadata={"help": "Training batch size per process."})
    per_device_eval_batch_size: int = field(default=64, metadata={"help": "Evaluation batch size per process."})
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "Batches per optimizer step."})
    lr_scheduler_type: str = field(default="linear", metadata={"help": "transformers scheduler name."})
    num_warmup_steps: int = field(default=0, metadata={"help": "Linear warmup steps."})
    seed: int = field(default=42, metadata={"help": "Seed of initialisation, dropout and shuffling."})
    # outputs
    output_dir: str = field(default="outputs/finetune", metadata={"help": "Best model, tokenizer, results, plot, checkpoints/."})
    checkpointing_steps: str | None = field(default=None, metadata={"help": "Save state every N optimizer steps, or 'epoch'."})
    resume_from_checkpoint: str | None = field(default=None, metadata={"help": "A checkpoints/step_N folder, or 'latest'."})
    with_tracking: bool = field(default=False, metadata={"help": "Log to the trackers of --report_to."})
    report_to: str = field(default="all", metadata={"help": "accelerate tracker(s): tensorboard, wandb, ... or all."})
    push_to_hub: bool = field(default=False, metadata={"help": "Upload the best model and results to the Hub."})
    hub_model_id: str | None = field(default=None, metadata={"help": "Hub repo id (default: the output_dir name)."})
    hub_token: str | None = field(default=None, metadata={"help": "Hub token (default: the logged-in one)."})


def parse_args(argv=None) -> FinetuneArguments:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for f in dataclasses.fields(FinetuneArguments):
        kind = _base_type(f.type)
        help_text = f.metadata.get("help", "")
        if kind is bool:
            parser.add_argument(f"--{f.name}", action="store_true", help=help_text)
        else:
            parser.add_argument(f"--{f.name}", type=kind, default=f.default, choices=f.metadata.get("choices"), help=help_text)
    return FinetuneArguments(**vars(parser.parse_args(argv)))


def _base_type(annotation):
    """str | None -> str."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return next(a for a in typing.get_args(annotation) if a is not type(None))
    return annotation


def check_args(args):
    if args.task_name and (args.train_file or args.validation_file):
        raise RecipeError("Pass either --task_name or --train_file/--validation_file, not both")
    if (args.validation_file or args.test_file) and not args.task_name and not args.train_file:
        raise RecipeError("--validation_file/--test_file need a --train_file (the label set comes from the training data)")
    if args.config_name and args.model_name_or_path:
        raise RecipeError("Pass --model_name_or_path (pretrained weights) or --config_name (random initialisation), not both")
    if args.max_seq_length < 3:
        raise RecipeError(f"--max_seq_length must be at least 3 (text, <sep>, <cls>), got {args.max_seq_length}")
    if args.checkpointing_steps not in (None, "epoch") and not str(args.checkpointing_steps).isdigit():
        raise RecipeError(f"--checkpointing_steps must be a number of steps or 'epoch', got {args.checkpointing_steps!r}")
    if args.config_name is None and args.model_name_or_path is None:
        if not os.path.isdir(DEFAULT_PRETRAINED):
            raise FileNotFoundError(
                f"No pretrained model in {DEFAULT_PRETRAINED}/ (the default --model_name_or_path). Run the pretraining "
                f"first ({PRETRAIN_COMMAND}), or pass --model_name_or_path (or --config_name for random initialisation)"
            )
        args.model_name_or_path = DEFAULT_PRETRAINED
    if args.layerwise_lr_decay <= 0:
        raise RecipeError(f"--layerwise_lr_decay must be > 0, got {args.layerwise_lr_decay}")
    if not 0 <= args.dropout < 1:
        raise RecipeError(f"--dropout must be in [0, 1), got {args.dropout}")


# ----------------------------------------------------------------------------------------------------------
# Data: raw splits, labels, tokenization, batches


@dataclass
class Split:
    """A raw split and where it came from (named in every error message)."""

    data: object  # datasets.Dataset
    source: str


def load_splits(args) -> dict[str, Split]:
    """train, validation (validation_mismatched for MNLI) and optionally test."""
    if args.task_name:
        return _glue_splits(args.task_name)
    if args.train_file:
        files = {"train": args.train_file, "validation": args.validation_file, "test": args.test_file}
        return {name: Split(load_data_file(path), path) for name, path in files.items() if path}
    import xlnet_lite.data

    ds = xlnet_lite.data.embedded_rotten_tomatoes()
    return {name: Split(ds[name].select_columns(["sentence", "label"]), f"embedded Rotten Tomatoes ({name} split)") for name in ds}


def _glue_splits(task):
    import datasets

    ds = datasets.load_dataset("nyu-mll/glue", task)
    names = {"train": "train", "validation": "validation", "test": "test"}
    if task == "mnli":
        names = {"train": "train", "validation": "validation_matched", "validation_mismatched": "validation_mismatched",
                 "test": "test_matched"}
    keys = [k for k in TASK_TO_KEYS[task] if k]
    renamed = dict(zip(keys, ["sentence"] if len(keys) == 1 else ["sentence1", "sentence2"]))
    splits = {ours: Split(ds[theirs].rename_columns(renamed), f"nyu-mll/glue/{task} ({theirs})") for ours, theirs in names.items()}
    splits["test"].data = splits["test"].data.remove_columns("label")  # GLUE hides test labels (-1)
    return splits


def load_data_file(path):
    """A CSV / TSV / JSON lines file as a datasets.Dataset; ValueError for a missing or empty file."""
    import datasets

    suffix = Path(path).suffix.lower()
    if suffix not in FILE_FORMATS:
        raise RecipeError(f"{path}: unsupported file type {suffix!r}; use one of {sorted(FILE_FORMATS)}")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such file")
    if os.path.getsize(path) == 0:
        raise RecipeError(f"{path}: the file is empty")
    builder, kwargs = FILE_FORMATS[suffix]
    if _count_lines(path, limit=2) < (2 if builder == "csv" else 1):
        raise RecipeError(f"{path}: the file holds no rows (header only?)")
    data = datasets.load_dataset(builder, data_files={"data": str(path)}, split="data", **kwargs)
    if len(data) == 0:
        raise RecipeError(f"{path}: the file holds no rows (header only?)")
    return data


def _count_lines(path, *, limit):
    """Non-blank lines of a text file, counting up to `limit`."""
    count = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            count += bool(line.strip())
            if count >= limit:
                break
    return count


def text_columns(split: Split):
    columns = split.data.column_names
    if "sentence1" in columns and "sentence2" in columns:
        return "sentence1", "sentence2"
    if "sentence" in columns:
        return "sentence", None
    raise RecipeError(
        f"{split.source}: no text column: expected `sentence`, or `sentence1` and `sentence2`; found columns {columns}"
    )


def check_split(split: Split, columns, *, needs_label):
    for column in columns:
        if column is None:
            continue
        bad = [i for i, text in enumerate(split.data[column]) if not isinstance(text, str)]
        if bad:
            raise RecipeError(f"{split.source}: column `{column}` has a missing or non-text value in row {bad[0]}")
    if needs_label and "label" not in split.data.column_names:
        raise RecipeError(f"{split.source}: no `label` column (found columns {split.data.column_names})")
    if "label" in split.data.column_names and needs_label:
        missing = [i for i, v in enumerate(split.data["label"]) if v is None]
        if missing:
            raise RecipeError(f"{split.source}: column `label` is empty in row {missing[0]}")


@dataclass
class Labels:
    """The label set, read from the training split: names for classification, or regression."""

    names: list[str]  # [] for regression
    is_regression: bool

    @property
    def num_labels(self):
        return 1 if self.is_regression else len(self.names)

    def model_kwargs(self):
        if self.is_regression:
            return {"num_labels": 1, "problem_type": "regression"}
        return {
            "num_labels": self.num_labels,
            "id2label": dict(enumerate(self.names)),
            "label2id": {name: i for i, name in enumerate(self.names)},
            "problem_type": "single_label_classification",
        }


def read_labels(train: Split) -> Labels:
    """ClassLabel -> its names; floats -> regression; ints or strings -> their sorted distinct values."""
    import datasets

    feature = train.data.features["label"]
    if isinstance(feature, datasets.ClassLabel):
        return Labels(list(feature.names), False)
    if isinstance(feature, datasets.Value) and feature.dtype.startswith("float"):
        return Labels([], True)
    values = sorted(set(train.data["label"]), key=lambda v: (isinstance(v, str), v))
    if len(values) < 2:
        raise RecipeError(f"{train.source}: column `label` has a single value {values}: nothing to classify")
    return Labels([str(v) for v in values], False)


def label_ids(split: Split, labels: Labels, train_source):
    """Label values of a split as model targets (class ids or floats); None where the split has no labels."""
    import datasets

    if "label" not in split.data.column_names:
        return None
    values = list(split.data["label"])
    if labels.is_regression:
        return [float(v) for v in values]
    if isinstance(split.data.features["label"], datasets.ClassLabel):
        ids = list(values)
        if all(i < 0 for i in ids):  # GLUE test splits: -1
            return None
        return ids
    index = {name: i for i, name in enumerate(labels.names)}
    unseen = sorted({str(v) for v in values} - set(index))
    if unseen:
        raise RecipeError(
            f"{split.source}: column `label` has values {unseen} that the training data ({train_source}) never has; "
            f"known labels: {labels.names}"
        )
    return [index[str(v)] for v in values]


def tokenize_split(split: Split, tokenizer, labels: Labels, train_source, *, max_len, mode, max_samples):
    """input_ids / token_type_ids (whole texts in mems mode, truncated otherwise), labels, index, n_segments."""
    import datasets

    data = split.data if max_samples is None else split.data.select(range(min(max_samples, len(split.data))))
    split = Split(data, split.source)
    first, second = text_columns(split)
    targets = label_ids(split, labels, train_source)
    texts = [list(data[c]) for c in (first, second) if c]
    truncate = mode == "truncate"
    enc = tokenizer(*texts, truncation=truncate, max_length=max_len if truncate else None, add_special_tokens=True)
    columns = {
        "input_ids": enc["input_ids"],
        "token_type_ids": enc["token_type_ids"],
        "index": list(range(len(data))),
        "n_segments": [math.ceil(len(ids) / max_len) for ids in enc["input_ids"]],
    }
    if targets is not None:
        columns["labels"] = targets
    return datasets.Dataset.from_dict(columns)


class SegmentCountBatchSampler:
    """Batches of examples with the same number of segments (always 1 when truncating), so every segment
    but the last is full and the memory never holds padding. Shuffled from (seed, epoch) when training."""

    def __init__(self, n_segments, batch_size, *, shuffle, seed=0):
        self.n_segments = np.asarray(n_segments)
        self.batch_size, self.shuffle, self.seed, self.epoch = batch_size, shuffle, seed, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def batches(self):
        rng = np.random.default_rng([self.seed, self.epoch])
        batches = []
        for n in np.unique(self.n_segments):
            idx = np.flatnonzero(self.n_segments == n)
            if self.shuffle:
                idx = rng.permutation(idx)
            batches += [idx[i : i + self.batch_size].tolist() for i in range(0, len(idx), self.batch_size)]
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def __iter__(self):
        return iter(self.batches())

    def __len__(self):
        _, counts = np.unique(self.n_segments, return_counts=True)
        return int(sum(math.ceil(c / self.batch_size) for c in counts))


@dataclass
class SegmentCollator:
    """Cuts each example into segments of `segment_len` tokens from the start: full segments first
    (prefix_*: (B, S-1, T)), then the last segment, which ends with <sep> <cls>, padded on the left."""

    pad_token_id: int
    pad_token_type_id: int
    segment_len: int

    def __call__(self, examples):
        counts = {ex["n_segments"] for ex in examples}
        if len(counts) != 1:
            raise RecipeError(f"a batch mixes documents of {sorted(counts)} segments; batches must come from SegmentCountBatchSampler")
        n_prefix = (counts.pop() - 1) * self.segment_len
        prefix_ids = torch.tensor([ex["input_ids"][:n_prefix] for ex in examples], dtype=torch.long)
        prefix_types = torch.tensor([ex["token_type_ids"][:n_prefix] for ex in examples], dtype=torch.long)
        batch = {
            "prefix_input_ids": prefix_ids.view(len(examples), -1, self.segment_len),  # (B, S-1, T)
            "prefix_token_type_ids": prefix_types.view(len(examples), -1, self.segment_len),
            **self.pad_left([ex["input_ids"][n_prefix:] for ex in examples], [ex["token_type_ids"][n_prefix:] for ex in examples]),
            "index": torch.tensor([ex["index"] for ex in examples], dtype=torch.long),
        }
        if "labels" in examples[0]:
            batch["labels"] = torch.tensor([ex["labels"] for ex in examples])
        return batch

    def pad_left(self, ids, types):
        width = max(len(x) for x in ids)
        pad = [width - len(x) for x in ids]
        return {
            "input_ids": torch.tensor([[self.pad_token_id] * p + x for p, x in zip(pad, ids)]),  # (B, T)
            "token_type_ids": torch.tensor([[self.pad_token_type_id] * p + x for p, x in zip(pad, types)]),
            "attention_mask": torch.tensor([[0] * p + [1] * len(x) for p, x in zip(pad, ids)]),
        }


def make_loader(dataset, collator, *, batch_size, shuffle, seed):
    sampler = SegmentCountBatchSampler(dataset["n_segments"], batch_size, shuffle=shuffle, seed=seed)
    # Its own generator: starting an iterator draws a seed, which must not move the global RNG (dropout),
    # or a resumed run would drift from the uninterrupted one.
    generator = torch.Generator().manual_seed(seed)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=collator, generator=generator)
    return loader, sampler


# ----------------------------------------------------------------------------------------------------------
# Model, tokenizer, optimizer


def load_model_and_tokenizer(args, labels: Labels, train_source):
    """(model, tokenizer): a pretrained / finetuned XLNet-Lite, a converted transformers XLNet, or a random
    initialisation from --config_name; the classification head sized for `labels`."""
    path = args.model_name_or_path
    remote = {"trust_remote_code": args.trust_remote_code}
    tokenizer = load_tokenizer(args.tokenizer_name or path or args.config_name, **remote)
    tokenizer.padding_side = "left"
    if args.config_name:
        config = AutoConfig.from_pretrained(args.config_name, **remote, **labels.model_kwargs(), dropout=args.dropout)
        model = _random_init(config)
    else:
        config = AutoConfig.from_pretrained(path, **remote)
        kwargs = {**checkpoint_label_kwargs(config, labels, path, train_source), "dropout": args.dropout}
        model = _from_pretrained(path, config.model_type, kwargs, remote)
    if len(tokenizer) > model.config.vocab_size:
        raise RecipeError(f"the tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {model.config.vocab_size}")
    model.config.reuse_len = None  # cache whole segments: reuse_len is a pretraining setting
    if args.mem_len is not None:
        model.config.mem_len = args.mem_len
    return model, tokenizer


def _random_init(config):
    if config.model_type == "xlnet":
        from transformers import XLNetForSequenceClassification

        return xlnet_lite.from_hf_xlnet(XLNetForSequenceClassification(config))
    return xlnet_lite.XLNetLiteForSequenceClassification(config)


def _from_pretrained(path, model_type, kwargs, remote):
    if model_type == "xlnet":  # transformers' XLNet: load it, then copy the weights into XLNet-Lite
        from transformers import XLNetForSequenceClassification

        return xlnet_lite.from_hf_xlnet(XLNetForSequenceClassification.from_pretrained(path, **kwargs))
    return AutoModelForSequenceClassification.from_pretrained(path, **remote, **kwargs)


def checkpoint_label_kwargs(config, labels: Labels, path, train_source):
    """Head arguments for from_pretrained. A checkpoint that already has a classifier must have as many
    outputs as the data has labels (its label order is kept when the names match)."""
    kwargs = labels.model_kwargs()
    has_head = any(a.endswith("ForSequenceClassification") for a in (config.architectures or []))
    if not has_head:
        return kwargs  # a pretraining output: the head is newly initialised
    if config.num_labels != labels.num_labels:
        raise RecipeError(
            f"{path} has a classification head with {config.num_labels} labels ({list(config.id2label.values())}), "
            f"but column `label` of {train_source} has {labels.num_labels} ({labels.names or 'regression'}); "
            f"start from a checkpoint without a classification head (a pretraining output) or use matching data"
        )
    if not labels.is_regression and set(config.label2id) == set(labels.names):
        order = sorted(labels.names, key=config.label2id.get)
        labels.names[:] = order
        kwargs = labels.model_kwargs()
    return kwargs


def parameter_groups(model, *, learning_rate, weight_decay, layerwise_lr_decay):
    """AdamW groups. Layer l of L: lr * decay^(L-1-l); the rest of the transformer (embeddings, mask_emb,
    shared biases): lr * decay^L; the classification head: lr. No weight decay on biases and LayerNorm."""
    n_layer = model.config.n_layer
    groups = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        depth = n_layer
        match = re.match(r"transformer\.layer\.(\d+)\.", name)
        if match:
            depth = n_layer - 1 - int(match.group(1))
        elif not name.startswith("transformer."):
            depth = 0  # the head
        no_decay = name.endswith(".bias") or "layer_norm" in name or name.endswith(("r_w_bias", "r_r_bias", "r_s_bias"))
        key = (depth, 0.0 if no_decay else weight_decay)
        groups.setdefault(key, []).append(param)
    return [
        {"params": params, "lr": learning_rate * layerwise_lr_decay**depth, "weight_decay": wd}
        for (depth, wd), params in sorted(groups.items())
    ]


# ----------------------------------------------------------------------------------------------------------
# Forward, evaluation


def classify(model, batch, accelerator, *, labels=None, backprop_all=False):
    """Read the prefix segments in order, carrying the memory, then classify the last segment from its <cls>.
    The prefix runs without gradient unless `backprop_all` (then the memory keeps its graph: backpropagation
    through every segment of the document)."""
    mems = None
    if batch["prefix_input_ids"].shape[1]:
        core = accelerator.unwrap_model(model).transformer
        with torch.set_grad_enabled(backprop_all and torch.is_grad_enabled()), accelerator.autocast():
            mems = read_prefix(core, batch["prefix_input_ids"], batch["prefix_token_type_ids"], keep_graph=backprop_all)
    return model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], token_type_ids=batch["token_type_ids"],
        mems=mems, use_mems=False, labels=labels,
    )


def read_prefix(core, prefix_ids, prefix_types, *, keep_graph):
    """The memory after reading prefix segments (B, S-1, T) in order: one (B, M, H) tensor per layer.
    keep_graph builds it from the layer inputs (output_hidden_states) instead of the model's detached cache."""
    mems, mem_len = None, core.config.mem_len
    for k in range(prefix_ids.shape[1]):
        out = core(input_ids=prefix_ids[:, k], token_type_ids=prefix_types[:, k], mems=mems,
                   use_mems=not keep_graph, output_hidden_states=keep_graph)
        if not keep_graph:
            mems = out.mems
            continue
        inputs = out.hidden_states[:-1]  # the input of each layer, (B, T, H): what the cache would hold
        mems = list(inputs) if mems is None else [torch.cat([m, h], dim=1) for m, h in zip(mems, inputs)]  # (B, M, H)
        if mem_len:
            mems = [m[:, -mem_len:] for m in mems]
    return mems


@torch.no_grad()
def predict(model, loader, accelerator, *, is_regression):
    """Predictions for every example of the loader's dataset, in dataset order (class ids or scores)."""
    model.eval()
    predictions, indices = [], []
    for batch in tqdm(loader, desc="eval", leave=False, disable=not accelerator.is_local_main_process):
        logits = classify(model, batch, accelerator).logits
        pred = logits.squeeze(-1).float() if is_regression else logits.argmax(-1)
        predictions.append(accelerator.gather(pred).cpu())
        indices.append(accelerator.gather(batch["index"]).cpu())
    predictions, indices = torch.cat(predictions).numpy(), torch.cat(indices).numpy()
    order, first = np.unique(indices, return_index=True)  # sorts, and drops duplicates added for even batches
    return predictions[first]


def compute_metrics(args, predictions, references, labels: Labels):
    if args.task_name:
        return glue_metrics(args.task_name, predictions, references)
    return file_metrics(predictions, references, is_regression=labels.is_regression, num_labels=labels.num_labels)


def evaluate(args, model, eval_sets, accelerator, labels):
    """{"accuracy": ..., "accuracy_mm": ...}: metrics of every labelled validation split (suffix _mm for MNLI mismatched)."""
    metrics = {}
    for name, (loader, references) in eval_sets.items():
        suffix = "_mm" if name == "validation_mismatched" else ""
        scores = compute_metrics(args, predict(model, loader, accelerator, is_regression=labels.is_regression), references, labels)
        metrics.update({k + suffix: v for k, v in scores.items()})
    return metrics


# ----------------------------------------------------------------------------------------------------------
# Checkpoints, outputs


def save_checkpoint(accelerator, output_dir, step, state):
    """accelerator.save_state into checkpoints/step_N, written to a temporary folder and renamed into place."""
    root = Path(output_dir) / "checkpoints"
    final, tmp = root / f"step_{step}", root / f".tmp_step_{step}"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        root.mkdir(parents=True, exist_ok=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    if accelerator.is_main_process:
        (tmp / "trainer_state.json").write_text(json.dumps(state, indent=2))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    accelerator.wait_for_everyone()


def find_checkpoint(output_dir, resume_from_checkpoint):
    if resume_from_checkpoint != "latest":
        if not (Path(resume_from_checkpoint) / "trainer_state.json").is_file():
            raise FileNotFoundError(f"{resume_from_checkpoint} is not a checkpoint folder (no trainer_state.json)")
        return Path(resume_from_checkpoint)
    root = Path(output_dir) / "checkpoints"
    steps = [int(p.name[5:]) for p in root.glob("step_*") if p.name[5:].isdigit()] if root.is_dir() else []
    if not steps:
        raise FileNotFoundError(f"--resume_from_checkpoint latest: no checkpoints/step_N folder in {output_dir}")
    return root / f"step_{max(steps)}"


def save_best(accelerator, model, tokenizer, output_dir):
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        accelerator.unwrap_model(model).save_pretrained(output_dir, safe_serialization=True)
        tokenizer.save_pretrained(output_dir)
    accelerator.wait_for_everyone()


def load_best(accelerator, model, output_dir):
    from safetensors.torch import load_file

    state = load_file(str(Path(output_dir) / "model.safetensors"))
    accelerator.unwrap_model(model).load_state_dict(state, strict=True)


def plot_history(history, step_losses, metric_name, path):
    """Training loss per step (faint) and per epoch, validation metric per epoch, against epochs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [h["epoch"] for h in history]
    fig, ax = plt.subplots(figsize=(6, 4))
    if step_losses:
        ax.plot(*zip(*step_losses), color="tab:blue", alpha=0.25, linewidth=0.8, label="train loss (step)")
    ax.plot(epochs, [h["train_loss"] for h in history], "o-", color="tab:blue", label="train loss (epoch mean)")
    ax.set_xlabel("epoch")
    ax.set_ylabel("train loss", color="tab:blue")
    ax.legend(loc="upper left", fontsize=8)
    other = ax.twinx()
    other.plot(epochs, [h.get(f"eval_{metric_name}") for h in history], "s-", color="tab:red")
    other.set_ylabel(f"validation {metric_name}", color="tab:red")
    ax.set_title("finetuning")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_predictions(path, predictions, labels: Labels):
    with open(path, "w") as f:
        f.write("index\tprediction\n")
        for i, p in enumerate(predictions):
            f.write(f"{i}\t{p:.6f}\n" if labels.is_regression else f"{i}\t{labels.names[int(p)]}\n")


def push_to_hub(args):
    from huggingface_hub import HfApi

    api = HfApi(token=args.hub_token)
    repo_id = args.hub_model_id or Path(args.output_dir).name
    repo_id = api.create_repo(repo_id, exist_ok=True).repo_id
    api.upload_folder(repo_id=repo_id, folder_path=args.output_dir, commit_message="Finetuned with finetune/run_glue.py",
                      ignore_patterns=["checkpoints/*", "checkpoints/**"])


# ----------------------------------------------------------------------------------------------------------
# The recipe


def prepare_data(args, tokenizer, labels, splits):
    """Tokenized train set and {split: (dataset, references)} for validation and test splits."""
    train_source = splits["train"].source
    common = dict(max_len=args.max_seq_length, mode=args.long_document_mode)
    train = tokenize_split(splits["train"], tokenizer, labels, train_source, max_samples=args.max_train_samples, **common)
    others = {}
    for name in ("validation", "validation_mismatched", "test"):
        if name in splits:
            limit = args.max_predict_samples if name == "test" else args.max_eval_samples
            others[name] = tokenize_split(splits[name], tokenizer, labels, train_source, max_samples=limit, **common)
    return train, others


def main(args=None):
    args = args if isinstance(args, FinetuneArguments) else parse_args(args)
    check_args(args)
    tracking = {"log_with": args.report_to, "project_dir": args.output_dir} if args.with_tracking else {}
    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps, **tracking)
    set_seed(args.seed)
    if accelerator.is_main_process:
        os.makedirs(args.output_dir, exist_ok=True)

    splits = load_splits(args)
    for name, split in splits.items():  # fail on bad columns before loading the model
        check_split(split, text_columns(split), needs_label=name != "test")
    labels = read_labels(splits["train"])
    model, tokenizer = load_model_and_tokenizer(args, labels, splits["train"].source)
    train_set, other_sets = prepare_data(args, tokenizer, labels, splits)
    collator = SegmentCollator(tokenizer.pad_token_id, tokenizer.pad_token_type_id, args.max_seq_length)
    train_loader, train_sampler = make_loader(train_set, collator, batch_size=args.per_device_train_batch_size, shuffle=True, seed=args.seed)
    loaders = {name: make_loader(ds, collator, batch_size=args.per_device_eval_batch_size, shuffle=False, seed=0)[0]
               for name, ds in other_sets.items()}

    optimizer = torch.optim.AdamW(
        parameter_groups(model, learning_rate=args.learning_rate, weight_decay=args.weight_decay,
                         layerwise_lr_decay=args.layerwise_lr_decay),
        lr=args.learning_rate, eps=args.adam_epsilon,
    )
    steps_per_epoch = math.ceil(len(train_loader) / args.gradient_accumulation_steps)
    max_steps = args.max_train_steps or args.num_train_epochs * steps_per_epoch
    num_epochs = math.ceil(max_steps / steps_per_epoch) if max_steps else 0
    scheduler = get_scheduler(args.lr_scheduler_type, optimizer, num_warmup_steps=args.num_warmup_steps * accelerator.num_processes,
                              num_training_steps=max(max_steps, 1) * accelerator.num_processes)
    model, optimizer, train_loader, scheduler, *prepared = accelerator.prepare(model, optimizer, train_loader, scheduler, *loaders.values())
    loaders = dict(zip(loaders, prepared))
    eval_sets = {name: (loaders[name], other_sets[name]["labels"]) for name in ("validation", "validation_mismatched")
                 if name in loaders and "labels" in other_sets[name].column_names}
    main_metric = primary_metric(args.task_name, is_regression=labels.is_regression)

    if args.with_tracking:
        accelerator.init_trackers("run_glue", config={k: v for k, v in dataclasses.asdict(args).items() if v is not None})
    state = {"completed_steps": 0, "epoch": 0, "loss_sum": 0.0, "loss_count": 0, "history": [], "best": None}
    if args.resume_from_checkpoint:
        path = find_checkpoint(args.output_dir, args.resume_from_checkpoint)
        accelerator.print(f"Resuming from {path}")
        accelerator.load_state(str(path))
        state = json.loads((path / "trainer_state.json").read_text())

    accelerator.print(
        f"{len(train_set)} training examples, {steps_per_epoch} steps/epoch, {max_steps} steps, "
        f"{model.num_parameters() if hasattr(model, 'num_parameters') else ''} parameters, mode {args.long_document_mode}"
    )
    start = time.perf_counter()
    state = train(args, accelerator, model, optimizer, scheduler, train_loader, train_sampler, eval_sets, tokenizer,
                  labels, state, steps_per_epoch=steps_per_epoch, max_steps=max_steps, num_epochs=num_epochs, main_metric=main_metric)
    train_runtime = time.perf_counter() - start

    if state["best"] is None:  # no training (or no validation split): the current model is the result
        eval_metrics = evaluate(args, model, eval_sets, accelerator, labels) if eval_sets else {}
        state["best"] = {"epoch": state["epoch"], "metrics": eval_metrics}
        save_best(accelerator, model, tokenizer, args.output_dir)
    load_best(accelerator, model, args.output_dir)
    results = finish(args, accelerator, model, loaders, other_sets, labels, state, train_runtime, len(train_set), main_metric)
    if args.with_tracking:
        accelerator.end_training()
    return results


def train(args, accelerator, model, optimizer, scheduler, train_loader, sampler, eval_sets, tokenizer, labels, state, *,
          steps_per_epoch, max_steps, num_epochs, main_metric):
    """The training loop; returns the trainer state (history per epoch, best epoch and its metrics)."""
    progress = tqdm(total=max_steps, initial=state["completed_steps"], desc="train", disable=not accelerator.is_local_main_process)
    save_every = int(args.checkpointing_steps) if str(args.checkpointing_steps).isdigit() else None
    for epoch in range(state["epoch"], num_epochs):
        model.train()
        sampler.set_epoch(epoch)
        loader = train_loader
        done_batches = (state["completed_steps"] - epoch * steps_per_epoch) * args.gradient_accumulation_steps
        if done_batches > 0:  # resuming inside this epoch
            loader = accelerator.skip_first_batches(train_loader, done_batches)
        for batch in loader:
            with accelerator.accumulate(model):
                loss = classify(model, batch, accelerator, labels=batch["labels"], backprop_all=args.mems_backprop == "all").loss
                accelerator.backward(loss)
                if accelerator.sync_gradients and args.max_grad_norm > 0:
                    accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            state["loss_sum"] += loss.item()
            state["loss_count"] += 1
            if not accelerator.sync_gradients:
                continue
            state["completed_steps"] += 1
            state.setdefault("step_losses", []).append([state["completed_steps"] / steps_per_epoch, loss.item()])
            progress.update(1)
            progress.set_postfix(loss=f"{loss.item():.4f}")
            if args.with_tracking:
                accelerator.log({"train_loss": loss.item(), "lr": scheduler.get_last_lr()[-1]}, step=state["completed_steps"])
            if save_every and state["completed_steps"] % save_every == 0:
                save_checkpoint(accelerator, args.output_dir, state["completed_steps"], state)
            if state["completed_steps"] >= max_steps:
                break
        end_epoch(args, accelerator, model, eval_sets, tokenizer, labels, state, epoch, main_metric)
        if args.checkpointing_steps == "epoch" or (save_every and state["completed_steps"] % save_every == 0):
            save_checkpoint(accelerator, args.output_dir, state["completed_steps"], state)
        if state["completed_steps"] >= max_steps:
            break
    progress.close()
    return state


def end_epoch(args, accelerator, model, eval_sets, tokenizer, labels, state, epoch, main_metric):
    """Evaluate, record the epoch, keep the best model in output_dir."""
    mean_loss = accelerator.gather(torch.tensor([state["loss_sum"], state["loss_count"]], dtype=torch.float64)).view(-1, 2).sum(0)
    record = {"epoch": epoch + 1, "step": state["completed_steps"], "train_loss": float(mean_loss[0] / max(mean_loss[1], 1))}
    metrics = evaluate(args, model, eval_sets, accelerator, labels) if eval_sets else {}
    record.update({f"eval_{k}": v for k, v in metrics.items()})
    accelerator.print(json.dumps(record))
    if args.with_tracking:
        accelerator.log(record, step=state["completed_steps"])
    state["history"].append(record)
    state.update(epoch=epoch + 1, loss_sum=0.0, loss_count=0)
    score, best = metrics.get(main_metric), state["best"]
    best_score = None if best is None else best["metrics"].get(main_metric)
    if score is None or best_score is None or score > best_score:  # without validation data: the latest epoch
        state["best"] = {"epoch": epoch + 1, "metrics": metrics}
        save_best(accelerator, model, tokenizer, args.output_dir)


def finish(args, accelerator, model, loaders, other_sets, labels, state, train_runtime, n_train, main_metric):
    """Predict the test split with the best model; write eval_results.json, all_results.json,
    predict_results.tsv and the training curves."""
    results = {f"eval_{k}": v for k, v in state["best"]["metrics"].items()}
    results.update(best_epoch=state["best"]["epoch"], epochs=state["epoch"], train_samples=n_train,
                   train_runtime_s=round(train_runtime, 2), long_document_mode=args.long_document_mode,
                   max_seq_length=args.max_seq_length)
    if state["history"]:
        results["train_loss"] = state["history"][-1]["train_loss"]
    if "test" in loaders:
        start = time.perf_counter()
        predictions = predict(model, loaders["test"], accelerator, is_regression=labels.is_regression)
        results["test_runtime_s"] = round(time.perf_counter() - start, 2)
        if "labels" in other_sets["test"].column_names:
            scores = compute_metrics(args, predictions, other_sets["test"]["labels"], labels)
            results.update({f"test_{k}": v for k, v in scores.items()})
        if accelerator.is_main_process:
            write_predictions(Path(args.output_dir) / "predict_results.tsv", predictions, labels)
    if accelerator.is_main_process:
        out = Path(args.output_dir)
        (out / "eval_results.json").write_text(json.dumps(state["best"]["metrics"], indent=2))
        (out / "all_results.json").write_text(json.dumps(results, indent=2))
        (out / "history.json").write_text(json.dumps(state["history"], indent=2))
        if state["history"]:
            plot_history(state["history"], state.get("step_losses"), main_metric, out / "training_curves.png")
        if args.push_to_hub:
            push_to_hub(args)
    accelerator.print(json.dumps(results))
    return results


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except (RecipeError, FileNotFoundError) as error:
        sys.exit(f"run_glue.py: error: {error}")
