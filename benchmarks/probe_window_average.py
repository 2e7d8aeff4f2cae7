"""Does a classifier finetuned on each message's first window classify better from all of its windows? Test accuracy
from the first max_seq_length tokens (what `--long_document_mode truncate` trains and predicts on) against the mean
over the message's consecutive windows of max_seq_length tokens, each cut from its start and closed with <sep> <cls>
as the recipe closes a truncated message (windows after `--max_windows` dropped).

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


def windows(ids: list[int], *, max_len: int, sep: int, cls: int) -> list[list[int]]:
    """A message's token ids (no specials) as consecutive windows of max_len - 2 tokens, each closed with <sep> <cls>;
    the first is what truncation keeps."""
    body = max_len - 2
    return [ids[i : i + body] + [sep, cls] for i in range(0, max(len(ids), 1), body)]


@torch.no_grad()
def window_log_probs(model, tokenizer, rows: list[list[int]], *, max_len: int, batch_size: int, bf16: bool):
    """(len(rows), num_labels) log-probabilities, batched as the recipe batches evaluation (make_loader: similar
    lengths together; SegmentCollator: padded on the left). Token types as the tokenizer gives them: 0, and <cls>'s
    own id last."""
    import datasets

    from xlnet_lite.classification_data import SegmentCollator, make_loader

    cls_type = tokenizer("x")["token_type_ids"][-1]
    dataset = datasets.Dataset.from_dict({"input_ids": rows, "token_type_ids": [[0] * (len(r) - 1) + [cls_type] for r in rows],
                                          "index": list(range(len(rows))), "n_segments": [1] * len(rows)})
    collator = SegmentCollator(tokenizer.pad_token_id, tokenizer.pad_token_type_id, max_len)
    loader, _ = make_loader(dataset, collator, batch_size=batch_size, shuffle=False, seed=0)
    out = np.zeros((len(rows), model.config.num_labels), dtype=np.float32)
    for batch in loader:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                           token_type_ids=batch["token_type_ids"]).logits.float()
        out[batch["index"].numpy()] = torch.log_softmax(logits, -1).numpy()
    return out


def probe(model_dir, texts, labels, *, max_len, max_windows, batch_size, bf16):
    from transformers import AutoTokenizer

    import xlnet_lite

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = xlnet_lite.XLNetLiteForSequenceClassification.from_pretrained(model_dir).eval()
    rows, owner, position = [], [], []
    for doc, ids in enumerate(tokenizer(texts, add_special_tokens=False)["input_ids"]):
        for k, window in enumerate(windows(ids, max_len=max_len, sep=tokenizer.sep_token_id, cls=tokenizer.cls_token_id)[:max_windows]):
            rows.append(window), owner.append(doc), position.append(k)
    owner, position = np.array(owner), np.array(position)
    start = time.perf_counter()
    log_probs = window_log_probs(model, tokenizer, rows, max_len=max_len, batch_size=batch_size, bf16=bf16)
    result = {"model": str(model_dir), "messages": len(texts), "windows": len(rows), "seconds": round(time.perf_counter() - start, 1),
              "first_window": float((log_probs[position == 0].argmax(-1) == labels).mean())}
    for cap in sorted({2, 4, max_windows}):
        keep = position < cap
        for name, values in (("mean_probability", np.exp(log_probs)), ("mean_log_probability", log_probs)):
            total = np.zeros((len(texts), log_probs.shape[1]))
            np.add.at(total, owner[keep], values[keep])
            result[f"{name}_{cap}"] = float((total.argmax(-1) == labels).mean())
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.probe_window_average", description=__doc__.split("\n\n")[0])
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
    texts, labels = list(split["sentence"]), np.array(split["label"])
    bf16 = fast_bf16("cpu")[0]
    results = [probe(m, texts, labels, max_len=args.max_seq_length, max_windows=args.max_windows,
                     batch_size=args.batch_size, bf16=bf16) for m in args.models]
    for r in results:
        print(json.dumps(r))
    if args.out:
        from xlnet_lite.training import write_json

        write_json(args.out, {"command": "python -m benchmarks.probe_window_average " + " ".join(argv if argv is not None else sys.argv[1:]),
                              "environment": environment(), "precision": "bf16" if bf16 else "fp32", "args": vars(args),
                              "results": results})


if __name__ == "__main__":
    main()
