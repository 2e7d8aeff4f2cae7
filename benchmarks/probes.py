"""What a pretrained model learnt, without finetuning it: linear probes of its frozen features on a classification
task.

    python -m benchmarks.probes --model PATH [--random_init] [--embedded_task newsgroups] [--labels_per_class 50]

Each text is read as the finetuning recipe reads it (finetune/run_glue.py's truncate mode: the first 126 tokens,
<sep>, <cls>, padded on the left; a BERT model: <cls> text <sep>, benchmarks/baselines/bert_mlm.py's classifier's
input); the frozen model gives, per layer, the mean of its hidden states over the text's tokens, and the last
layer's state at the token the classifier reads (XLNet's last token, <cls>; BERT's first). A multinomial logistic
regression (scikit-learn, features standardised on the training texts) is fitted on each feature set, its inverse
regularisation C chosen on validation from C_GRID; each set's validation and test accuracy are reported. The probes
are deterministic: no seeds. `--random_init`: the same architecture freshly initialised (torch seed 0), as the
baseline of what the architecture gives without pretraining.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

C_GRID = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0)


def load_model(path: str, *, random_init: bool):
    """(model, kind) from a pretraining folder: XLNet-Lite's base model, or BERT's for a BertForMaskedLM folder."""
    import torch
    from transformers import AutoConfig, AutoModel

    import xlnet_lite  # noqa: F401  (registers XLNet-Lite with the Auto classes)

    config = AutoConfig.from_pretrained(path)
    kind = "bert" if config.model_type == "bert" else "xlnet"
    if random_init:
        torch.manual_seed(0)
        model = AutoModel.from_config(config)
    else:
        model = AutoModel.from_pretrained(path)
    return model.eval(), kind


def batches(split, tokenizer, kind: str, *, max_len: int, batch_size: int):
    """(inputs, read_at) per batch in the split's order; read_at: the position the classifier reads, per row."""
    import torch

    from benchmarks.baselines import bert_mlm
    from xlnet_lite.classification_data import SegmentCollator, text_columns

    if kind == "bert":
        _, _, pad_id = bert_mlm._ids(tokenizer)
        rows = [ids for ids, _ in bert_mlm._encode(split, tokenizer, max_seq_length=max_len, targets=lambda s: None)]
        for start in range(0, len(rows), batch_size):
            input_ids, mask, _ = bert_mlm._collate(
                [(ids, None) for ids in rows[start : start + batch_size]], pad_id, "cpu"
            )
            yield {"input_ids": input_ids, "attention_mask": mask}, torch.zeros(len(input_ids), dtype=torch.long)
        return
    first, _ = text_columns(split)  # tokenized as classification_data.tokenize_split's truncate mode
    data = tokenizer(list(split.data[first]), truncation=True, max_length=max_len, add_special_tokens=True)
    collator = SegmentCollator(tokenizer.pad_token_id, tokenizer.pad_token_type_id, max_len)
    for start in range(0, len(data["input_ids"]), batch_size):
        end = start + batch_size
        inputs = collator.pad_left(data["input_ids"][start:end], data["token_type_ids"][start:end])
        yield inputs, torch.full((len(inputs["input_ids"]),), inputs["input_ids"].shape[1] - 1)


def features(model, kind: str, split, tokenizer, *, max_len: int = 128, batch_size: int = 64) -> dict:
    """{name: (N, d) array}: `mean_layer_<i>` (i = 0 the embeddings) and `read_token_last_layer`."""
    import numpy as np
    import torch

    out: dict[str, list] = {}
    with torch.inference_mode():
        for inputs, read_at in batches(split, tokenizer, kind, max_len=max_len, batch_size=batch_size):
            hidden = model(**inputs, output_hidden_states=True).hidden_states
            mask = inputs["attention_mask"].unsqueeze(-1).float()
            for i, h in enumerate(hidden):
                out.setdefault(f"mean_layer_{i}", []).append(((h * mask).sum(1) / mask.sum(1)).numpy())
            last = hidden[-1][torch.arange(len(read_at)), read_at]
            out.setdefault("read_token_last_layer", []).append(last.numpy())
    return {name: np.concatenate(parts) for name, parts in out.items()}


def fit(train: tuple, validation: tuple, test: tuple) -> dict:
    """The logistic regression of the C with the best validation accuracy (the smallest C on ties)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    scaler = StandardScaler().fit(train[0])
    x_train, x_val, x_test = (scaler.transform(x) for x in (train[0], validation[0], test[0]))
    best = None
    for c in C_GRID:
        clf = LogisticRegression(C=c, max_iter=3000).fit(x_train, train[1])
        accuracy = clf.score(x_val, validation[1])
        if best is None or accuracy > best[0]:
            best = (accuracy, c, clf)
    accuracy, c, clf = best
    return {"C": c, "validation_accuracy": accuracy, "test_accuracy": clf.score(x_test, test[1])}


def probe(model_path: str, *, random_init: bool, embedded_task: str, labels_per_class: str, max_len: int = 128) -> dict:
    """Every feature set's probe on the task's splits (the first `labels_per_class` training texts per class)."""
    import numpy as np
    from transformers import AutoTokenizer

    from xlnet_lite.classification_data import first_per_class, label_ids, load_splits, read_labels

    start = time.perf_counter()
    splits = load_splits(embedded_task=embedded_task)
    if labels_per_class != "all":
        splits = dict(splits, train=first_per_class(splits["train"], int(labels_per_class)))
    labels = read_labels(splits["train"])
    model, kind = load_model(model_path, random_init=random_init)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    sets = {}
    for name in ("train", "validation", "test"):
        y = np.array(label_ids(splits[name], labels, splits["train"].source))
        sets[name] = (features(model, kind, splits[name], tokenizer, max_len=max_len), y)
    probes = {
        feature: fit(*((sets[name][0][feature], sets[name][1]) for name in ("train", "validation", "test")))
        for feature in sets["train"][0]
    }
    best = max(probes, key=lambda f: (probes[f]["validation_accuracy"], f == "read_token_last_layer"))
    return {
        "model": model_path,
        "random_init": random_init,
        "kind": kind,
        "embedded_task": embedded_task,
        "labels_per_class": labels_per_class,
        "train_texts": len(sets["train"][1]),
        "max_len": max_len,
        "c_grid": list(C_GRID),
        "probes": probes,
        "best_on_validation": best,
        "seconds": round(time.perf_counter() - start, 1),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="A pretraining folder (XLNet-Lite or BERT).")
    parser.add_argument("--random_init", action="store_true", help="Probe the same architecture, untrained.")
    parser.add_argument("--embedded_task", default="newsgroups")
    parser.add_argument("--labels_per_class", default="50", help="Training texts per class, or all.")
    parser.add_argument("--out", help="Write the result here as JSON.")
    args = parser.parse_args(argv)
    if not Path(args.model, "config.json").is_file():
        parser.error(f"--model {args.model}: no config.json there (expected a pretraining folder)")
    if args.labels_per_class != "all" and not args.labels_per_class.isdigit():
        parser.error(f"--labels_per_class must be a whole number or all, got {args.labels_per_class}")
    result = probe(
        args.model,
        random_init=args.random_init,
        embedded_task=args.embedded_task,
        labels_per_class=args.labels_per_class,
    )
    for feature, r in result["probes"].items():
        print(f"{feature:24s} C {r['C']:<5g} validation {r['validation_accuracy']:.3f} test {r['test_accuracy']:.3f}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
