"""Evaluation batches in dataset order against longest first (what finetune/run_glue.py does): prediction time on a
split of an embedded task, and whether every prediction is the same.

    python -m benchmarks.bench_eval_order --model outputs/newsgroups/random_init [--embedded_task newsgroups]
        [--split test] [--repeats 2] [--out benchmarks/results/eval_order.json]

`--model` is a finetuned classifier folder (its tokenizer and labels); the split is tokenized as the recipe does
(`--max_seq_length`, truncating), then `run_glue.predict` runs over both orders `--repeats` times each, after a
warm-up pass over two batches, the order of the two flipping every repeat (A B, B A, ...).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch


def padded_tokens(loader) -> int:
    return sum(batch["input_ids"].numel() for batch in loader)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_eval_order", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="A finetuned XLNet-Lite classifier folder.")
    parser.add_argument("--embedded_task", default="newsgroups")
    parser.add_argument("--split", default="test")
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out")
    args = parser.parse_args(argv)

    from accelerate import Accelerator

    from benchmarks.environment import environment
    from finetune import run_glue
    from xlnet_lite import XLNetLiteForSequenceClassification
    from xlnet_lite.classification_data import (
        EMBEDDED_TASKS,
        SegmentCollator,
        SegmentCountBatchSampler,
        load_splits,
        make_loader,
        read_labels,
        tokenize_split,
    )
    from xlnet_lite.tokenization_xlnet_lite import load_tokenizer
    from xlnet_lite.training import write_json

    if args.embedded_task not in EMBEDDED_TASKS:
        parser.error(f"--embedded_task must be one of {', '.join(EMBEDDED_TASKS)}")
    tokenizer, model = load_tokenizer(args.model), XLNetLiteForSequenceClassification.from_pretrained(args.model).eval()
    splits = load_splits(embedded_task=args.embedded_task)
    data = tokenize_split(
        splits[args.split],
        tokenizer,
        read_labels(splits["train"]),
        splits["train"].source,
        max_len=args.max_seq_length,
        mode="truncate",
        max_samples=None,
    )
    collator = SegmentCollator(tokenizer.pad_token_id, tokenizer.pad_token_type_id, args.max_seq_length)
    loaders = {
        "dataset order": torch.utils.data.DataLoader(
            data,
            collate_fn=collator,
            batch_sampler=SegmentCountBatchSampler(data["n_segments"], args.batch_size, shuffle=False),
        ),
        "longest first": make_loader(data, collator, batch_size=args.batch_size, shuffle=False, seed=0)[0],
    }
    accelerator, seconds, predictions = Accelerator(cpu=True), {name: [] for name in loaders}, {}
    warmup = data.select(range(min(len(data), 2 * args.batch_size)))
    run_glue.predict(
        model,
        make_loader(warmup, collator, batch_size=args.batch_size, shuffle=False, seed=0)[0],
        accelerator,
        is_regression=False,
    )
    for repeat in range(args.repeats):
        for name in list(loaders)[:: 1 if repeat % 2 == 0 else -1]:
            loader = loaders[name]
            start = time.perf_counter()
            predictions[name] = run_glue.predict(model, loader, accelerator, is_regression=False)
            seconds[name].append(round(time.perf_counter() - start, 2))
            print(f"{name}: {seconds[name][-1]} s", flush=True)
    labels = np.asarray(data["labels"])
    result = {
        "command": "python -m benchmarks.bench_eval_order " + " ".join(argv if argv is not None else sys.argv[1:]),
        "environment": environment(),
        "examples": len(data),
        "real_tokens": int(sum(len(x) for x in data["input_ids"])),
        "orders": {
            name: {
                "seconds": seconds[name],
                "median_s": statistics.median(seconds[name]),
                "padded_tokens": padded_tokens(loader),
                "accuracy": float((predictions[name] == labels).mean()),
            }
            for name, loader in loaders.items()
        },
        "predictions_differing": int((predictions["dataset order"] != predictions["longest first"]).sum()),
    }
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        write_json(args.out, result)
    return result


if __name__ == "__main__":
    main()
