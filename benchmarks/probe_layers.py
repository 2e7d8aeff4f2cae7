"""What a pretrained XLNet-Lite's features carry about 20 Newsgroups before any finetuning, layer by layer: for the
first N labelled messages of each group (first 128 tokens), every layer's hidden state at <cls> (the last position)
and the mean over the message's tokens; a logistic regression (standardised features, C from a small grid) trained
on them and scored on the validation split. The same architecture at random initialisation (seed 0) beside it.

    python -m benchmarks.probe_layers --model outputs/pretrain [--labels_per_class 100] \
        [--out benchmarks/results/probe_layers.json]
"""

import argparse
import sys

import numpy as np
import torch

import xlnet_lite
from benchmarks.environment import environment
from xlnet_lite.classification_data import first_per_class, load_splits
from xlnet_lite.tokenization_xlnet_lite import load_tokenizer
from xlnet_lite.training import write_json

C_GRID = (0.01, 0.1, 1.0)


@torch.no_grad()
def layer_features(model, tokenizer, texts, *, max_len, batch_size=64):
    """{("cls" | "mean", layer): (N, d)} for the embeddings (layer 0) and every layer's output."""
    tokenizer.padding_side = "left"
    out = {}
    for i in range(0, len(texts), batch_size):
        enc = tokenizer(
            texts[i : i + batch_size], truncation=True, max_length=max_len, padding=True, return_tensors="pt"
        )
        hidden = model(
            input_ids=enc["input_ids"],
            attention_mask=enc["attention_mask"],
            token_type_ids=enc["token_type_ids"],
            output_hidden_states=True,
        ).hidden_states
        keep = enc["attention_mask"].unsqueeze(-1).float()  # (B, T, 1)
        for layer, h in enumerate(hidden):
            out.setdefault(("cls", layer), []).append(h[:, -1])
            out.setdefault(("mean", layer), []).append((h * keep).sum(1) / keep.sum(1))
    return {key: torch.cat(parts).double().numpy() for key, parts in out.items()}


def probe(train_x, train_y, valid_x, valid_y):
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    scaler = StandardScaler().fit(train_x)
    return max(
        LogisticRegression(C=c, max_iter=3000)
        .fit(scaler.transform(train_x), train_y)
        .score(scaler.transform(valid_x), valid_y)
        for c in C_GRID
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="A pretraining output folder.")
    parser.add_argument("--labels_per_class", type=int, default=100)
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    splits = load_splits(embedded_task="newsgroups")
    train, valid = first_per_class(splits["train"], args.labels_per_class).data, splits["validation"].data
    tokenizer = load_tokenizer(args.model)
    torch.manual_seed(0)
    models = {
        "random_init": xlnet_lite.XLNetLiteModel(xlnet_lite.XLNetLiteConfig.from_pretrained(args.model)),
        "pretrained": xlnet_lite.XLNetLiteModel.from_pretrained(args.model),
    }
    results = {
        "command": "python -m benchmarks.probe_layers " + " ".join(sys.argv[1:] if argv is None else argv),
        "environment": environment(),
        "train_examples": len(train),
        "validation_examples": len(valid),
    }
    for name, model in models.items():
        model.eval()
        tr = layer_features(model, tokenizer, list(train["sentence"]), max_len=args.max_seq_length)
        va = layer_features(model, tokenizer, list(valid["sentence"]), max_len=args.max_seq_length)
        results[name] = {
            f"{kind}_layer{layer}": probe(
                tr[(kind, layer)], np.asarray(train["label"]), va[(kind, layer)], np.asarray(valid["label"])
            )
            for kind, layer in tr
        }
        print(name, {k: round(v, 3) for k, v in results[name].items()}, flush=True)
    if args.out:
        write_json(args.out, results)
    return results


if __name__ == "__main__":
    main()
