"""Where a 20 Newsgroups message's class is: TF-IDF + logistic regression fitted and scored on the part of each
message that a finetuned XLNet-Lite classifies from, against the whole message.

    python -m benchmarks.probe_document_window --tokenizer outputs/pretrain [--labels_per_class 50|all]
        [--windows first whole ...] [--max_seq_length 128] [--mem_len 96] [--out FILE.json]

It also reports how long the messages are in those tokens: each split's median and the share of its messages a
first-N-token window holds whole (`message_lengths`; `--windows` given no window reports only that).

Windows, in the model's tokens (the pretraining's tokenizer, <sep> <cls> included as the finetuning recipe adds
them): `first` the first max_seq_length tokens (what `--long_document_mode truncate` reads); `last_segment` the
last of the max_seq_length-token segments the message is cut into from its start (the segment whose <cls> `mems`
mode classifies from); `last_segment_and_memory` that segment and the mem_len tokens before it (what its attention
reaches directly: deeper history only through the memory's own hidden states); `whole` the full message. Each
window's tokens are decoded back to text, then the TF-IDF baseline (benchmarks.baselines.tfidf: 1-2 grams, C chosen
on validation) runs on every split cut the same way. A window that holds the class gives TF-IDF a high score on it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

WINDOWS = ("first", "last_segment", "last_segment_and_memory", "whole")
WHOLE_AT = (128, 256, 512, 1024)


def window_ids(ids: list[int], window: str, *, max_seq_length: int, mem_len: int) -> list[int]:
    """The token ids of one window of a message's ids (specials included), as defined in the module docstring."""
    if window == "first":
        return ids[:max_seq_length]
    last_start = (max(1, -(-len(ids) // max_seq_length)) - 1) * max_seq_length
    if window == "last_segment":
        return ids[last_start:]
    if window == "last_segment_and_memory":
        return ids[max(0, last_start - mem_len) :]
    if window == "whole":
        return ids
    raise ValueError(f"unknown window {window!r}; choose from {WINDOWS}")


def token_ids(splits, tokenizer):
    """Each split's texts as token ids, <sep> <cls> included: split name -> list of id lists."""
    from xlnet_lite.classification_data import text_columns

    return {
        name: tokenizer(list(split.data[text_columns(split)[0]]), add_special_tokens=True)["input_ids"]
        for name, split in splits.items()
    }


def message_lengths(ids) -> dict:
    """Per split (ids: token_ids of the splits): the messages, their median length in tokens and the share of them
    that the first N tokens hold whole, for each N in WHOLE_AT."""
    import statistics

    return {
        name: dict(
            messages=len(x),
            median_tokens=statistics.median(len(i) for i in x),
            whole_within={n: sum(len(i) <= n for i in x) / len(x) for n in WHOLE_AT},
        )
        for name, x in ids.items()
    }


def cut_splits(splits, ids, tokenizer, window: str, *, max_seq_length: int, mem_len: int):
    """Every split's text replaced by the decoded tokens of its window (ids: token_ids of the splits)."""
    from xlnet_lite.classification_data import Split, text_columns

    out = {}
    for name, split in splits.items():
        column, _ = text_columns(split)
        texts = tokenizer.batch_decode(
            [window_ids(x, window, max_seq_length=max_seq_length, mem_len=mem_len) for x in ids[name]],
            skip_special_tokens=True,
        )
        out[name] = Split(split.data.remove_columns(column).add_column(column, texts), f"{split.source} ({window})")
    return out


def main(argv=None):
    from benchmarks.baselines.tfidf import tfidf_baseline
    from xlnet_lite import load_tokenizer
    from xlnet_lite.classification_data import first_per_class, load_splits

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.probe_document_window", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--tokenizer", required=True, help="A pretraining output folder (its tokenizer).")
    parser.add_argument("--labels_per_class", default="50", help="A number, or 'all'.")
    parser.add_argument("--windows", nargs="*", choices=WINDOWS, default=list(WINDOWS))
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--mem_len", type=int, default=96)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    if args.labels_per_class != "all" and not (args.labels_per_class.isdigit() and int(args.labels_per_class) > 0):
        parser.error(f"--labels_per_class must be a positive number or 'all', got {args.labels_per_class!r}")
    tokenizer = load_tokenizer(args.tokenizer)
    splits = load_splits(embedded_task="newsgroups")
    if args.labels_per_class != "all":
        splits["train"] = first_per_class(splits["train"], int(args.labels_per_class))
    ids = token_ids(splits, tokenizer)
    lengths = message_lengths(ids)
    for name, row in lengths.items():
        shares = ", ".join(f"{n} tokens {share:.1%}" for n, share in row["whole_within"].items())
        print(f"{name}: {row['messages']} messages, median {row['median_tokens']} tokens; whole within {shares}")
    rows = {}
    for window in args.windows:
        cut = cut_splits(splits, ids, tokenizer, window, max_seq_length=args.max_seq_length, mem_len=args.mem_len)
        result = tfidf_baseline(cut)
        rows[window] = {k: result[k] for k in ("validation_accuracy", "test_accuracy", "best_C", "wall_time_s")}
        print(
            f"{window:<26} validation {result['validation_accuracy']:.3f}  test {result['test_accuracy']:.3f}",
            flush=True,
        )
    report = dict(
        task="newsgroups",
        labels_per_class=args.labels_per_class,
        train_examples=len(splits["train"].data),
        max_seq_length=args.max_seq_length,
        mem_len=args.mem_len,
        tokenizer=args.tokenizer,
        windows=rows,
        message_lengths=lengths,
    )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
