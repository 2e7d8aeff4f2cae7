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
import time

import numpy as np
import torch


def windows(ids: list[int], *, max_len: int, sep: int, cls: int) -> list[list[int]]:
    """A message's token ids (no specials) as consecutive windows of max_len - 2 tokens, each closed with <sep> <cls>;
    the first is what truncation keeps."""
    body = max_len - 2
    return [ids[i : i + body] + [sep, cls] for i in range(0, max(len(ids), 1), body)]


@torch.no_grad()
def window_log_probs(model, rows: list[list[int]], *, pad: int, cls_type: int, batch_size: int, bf16: bool):
    """(len(rows), num_labels) log-probabilities, batches of similar length padded on the left."""
    out = np.zeros((len(rows), model.config.num_labels), dtype=np.float32)
    order = np.argsort([-len(r) for r in rows], kind="stable")
    for start in range(0, len(rows), batch_size):
        idx = order[start : start + batch_size]
        width = max(len(rows[i]) for i in idx)
        ids = torch.tensor([[pad] * (width - len(rows[i])) + rows[i] for i in idx])
        mask = torch.tensor([[0] * (width - len(rows[i])) + [1] * len(rows[i]) for i in idx])
        types = torch.zeros_like(ids)
        types[:, -1] = cls_type  # <cls> has its own segment id, as the tokenizer gives it
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(input_ids=ids, attention_mask=mask, token_type_ids=types).logits.float()
        out[idx] = torch.log_softmax(logits, -1).numpy()
    return out


def probe(model_dir, texts, labels, *, max_len, max_windows, batch_size, bf16):
    from transformers import AutoTokenizer

    import xlnet_lite

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = xlnet_lite.XLNetLiteForSequenceClassification.from_pretrained(model_dir).eval()
    cls_type = tokenizer("x")["token_type_ids"][-1]
    rows, owner, position = [], [], []
    for doc, ids in enumerate(tokenizer(texts, add_special_tokens=False)["input_ids"]):
        for k, window in enumerate(windows(ids, max_len=max_len, sep=tokenizer.sep_token_id, cls=tokenizer.cls_token_id)[:max_windows]):
            rows.append(window), owner.append(doc), position.append(k)
    owner, position = np.array(owner), np.array(position)
    start = time.perf_counter()
    log_probs = window_log_probs(model, rows, pad=tokenizer.pad_token_id, cls_type=cls_type, batch_size=batch_size, bf16=bf16)
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

        write_json(args.out, {"command": "python -m benchmarks.probe_window_average " + " ".join(argv if argv is not None else __import__("sys").argv[1:]),
                              "environment": environment(), "precision": "bf16" if bf16 else "fp32", "args": vars(args),
                              "results": results})


if __name__ == "__main__":
    main()
