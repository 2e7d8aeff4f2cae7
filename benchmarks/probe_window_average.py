"""Does a classifier finetuned on each message's first window classify better from all of its windows? Test accuracy
from the first max_seq_length tokens (what `--long_document_mode truncate` trains and predicts on) against the mean
over the message's consecutive windows of max_seq_length tokens, cut as the recipe's `--long_document_mode windows`
cuts them (each closed with <sep> <cls> as a truncated message is; windows after `--max_windows` dropped).

    python -m benchmarks.probe_window_average MODEL [MODEL ...] [--embedded_task newsgroups] [--split test]
        [--max_windows 8] [--out FILE.json]

Each MODEL is a finetuned classifier folder (its tokenizer and labels). The windows' class probabilities are averaged
(`mean_probability`) and so are their log-probabilities (`mean_log_probability`), over the first 2, 4 and
--max_windows windows. bf16 autocast where the CPU runs it fast (as `--mixed_precision auto`), fp32 elsewhere. The
first-window accuracy equals the recipe's own test accuracy for the same model (a check that the windows are cut as
the recipe cuts them).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch


def window_rows(tokenizer, split, *, max_len: int, max_windows: int):
    """The split's texts as the finetuning recipe's windows mode cuts them (tokenize_split), with each window's
    position in its text."""
    from xlnet_lite.classification_data import Split, read_labels, tokenize_split

    split = Split(split, "the probe's split")
    dataset = tokenize_split(
        split,
        tokenizer,
        read_labels(split),
        split.source,
        max_len=max_len,
        mode="windows",
        max_samples=None,
        max_windows=max_windows,
    )
    owner = np.array(dataset["text_index"])
    position = np.arange(len(owner)) - np.searchsorted(owner, owner)  # rows of a text are consecutive
    return dataset, owner, position


@torch.no_grad()
def window_log_probs(model, tokenizer, dataset, *, max_len: int, batch_size: int, bf16: bool):
    """(len(dataset), num_labels) log-probabilities, batched as the recipe batches evaluation (make_loader: similar
    lengths together; SegmentCollator: padded on the left)."""
    from xlnet_lite.classification_data import SegmentCollator, make_loader

    collator = SegmentCollator(tokenizer.pad_token_id, tokenizer.pad_token_type_id, max_len)
    loader, _ = make_loader(dataset, collator, batch_size=batch_size, shuffle=False, seed=0)
    out = np.zeros((len(dataset), model.config.num_labels), dtype=np.float32)
    for batch in loader:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                token_type_ids=batch["token_type_ids"],
            ).logits.float()
        out[batch["index"].numpy()] = torch.log_softmax(logits, -1).numpy()
    return out


def probe(model_dir, split, *, max_len, max_windows, batch_size, bf16):
    from transformers import AutoTokenizer

    import xlnet_lite

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = xlnet_lite.XLNetLiteForSequenceClassification.from_pretrained(model_dir).eval()
    dataset, owner, position = window_rows(tokenizer, split, max_len=max_len, max_windows=max_windows)
    labels, n_texts = np.array(split["label"]), len(split)
    start = time.perf_counter()
    log_probs = window_log_probs(model, tokenizer, dataset, max_len=max_len, batch_size=batch_size, bf16=bf16)
    result = {
        "model": str(model_dir),
        "messages": n_texts,
        "windows": len(dataset),
        "seconds": round(time.perf_counter() - start, 1),
        "first_window": float((log_probs[position == 0].argmax(-1) == labels).mean()),
    }
    from xlnet_lite.classification_data import pool_windows

    for cap in sorted({2, 4, max_windows}):
        keep = position < cap  # every text keeps its first window
        mean_probability = pool_windows(log_probs[keep], owner[keep], is_regression=False)  # the recipe's rule
        mean_log_probability = pool_windows(log_probs[keep], owner[keep], is_regression=True).argmax(-1)  # plain mean
        result[f"mean_probability_{cap}"] = float((mean_probability == labels).mean())
        result[f"mean_log_probability_{cap}"] = float((mean_log_probability == labels).mean())
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.probe_window_average", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("models", nargs="+", help="Finetuned XLNet-Lite classifier folders.")
    parser.add_argument("--embedded_task", default="newsgroups")
    parser.add_argument("--split", default="test")
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--max_windows", type=int, default=8)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    if args.max_seq_length < 3 or args.max_windows < 1:
        parser.error("--max_seq_length must be at least 3 and --max_windows at least 1")

    from xlnet_lite.classification_data import load_splits
    from xlnet_lite.precision import fast_bf16

    from .environment import environment

    split = load_splits(embedded_task=args.embedded_task)[args.split].data
    bf16 = fast_bf16("cpu")[0]
    results = [
        probe(
            m, split, max_len=args.max_seq_length, max_windows=args.max_windows, batch_size=args.batch_size, bf16=bf16
        )
        for m in args.models
    ]
    for r in results:
        print(json.dumps(r))
    if args.out:
        from xlnet_lite.training import write_json

        write_json(
            args.out,
            {
                "command": "python -m benchmarks.probe_window_average "
                + " ".join(argv if argv is not None else sys.argv[1:]),
                "environment": environment(),
                "precision": "bf16" if bf16 else "fp32",
                "args": vars(args),
                "results": results,
            },
        )


if __name__ == "__main__":
    main()
