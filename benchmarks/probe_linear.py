"""How much of the news-topic label can be read off a model's features before any finetuning? A linear probe: for
every article of the news-topic task (first 128 tokens), the last layer's hidden state at the classifying position
(`<cls>`: last for XLNet-Lite, first for BERT) and the mean over the article's tokens; a logistic regression
(standardised features, C chosen on validation from a grid) trained on the train split, scored on validation and
test. Features that carry the topic give a probe well above the same architecture at random initialisation; if they
do not, finetuning starts with nothing the random model lacks.

    python -m benchmarks.probe_linear --xlnet outputs/pretrain [--xlnet DIR ...] [--bert DIR ...] \
        [--out benchmarks/results/linear_probe.json]

Random initialisation (XLNet-Lite, the first --xlnet folder's config, seed 0) is always included.
"""

import argparse
import sys

import numpy as np
import torch

from xlnet_lite.embedded_datasets import embedded_news_topics
from xlnet_lite.tokenization_xlnet_lite import load_tokenizer
from xlnet_lite.training import write_json

SPLITS = ("train", "validation", "test")
C_GRID = (0.001, 0.01, 0.1, 1.0, 10.0)


@torch.no_grad()
def features(model, tokenizer, texts, *, cls_position, max_len, batch_size=64):
    """{"cls": (N, d), "mean": (N, d)} from the last hidden layer."""
    tokenizer.padding_side = "left" if cls_position == -1 else "right"
    cls, mean = [], []
    for i in range(0, len(texts), batch_size):
        enc = tokenizer(
            texts[i : i + batch_size], truncation=True, max_length=max_len, padding=True, return_tensors="pt"
        )
        inputs = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
        if cls_position == -1:  # XLNet: segment ids mark <cls> as its own segment
            inputs["token_type_ids"] = enc["token_type_ids"]
        hidden = model(**inputs).last_hidden_state
        mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        cls.append(hidden[:, cls_position])
        mean.append((hidden * mask).sum(1) / mask.sum(1))
    return {"cls": torch.cat(cls).double().numpy(), "mean": torch.cat(mean).double().numpy()}


def probe(feats, labels):
    """Logistic regression on train, C picked by validation accuracy: {validation, test, C}."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    scaler = StandardScaler().fit(feats["train"])
    x = {s: scaler.transform(feats[s]) for s in SPLITS}
    best = None
    for c in C_GRID:
        clf = LogisticRegression(C=c, max_iter=5000).fit(x["train"], labels["train"])
        val = clf.score(x["validation"], labels["validation"])
        if best is None or val > best["validation_accuracy"]:
            best = {"validation_accuracy": val, "test_accuracy": clf.score(x["test"], labels["test"]), "C": c}
    return best


def probe_model(model, tokenizer, data, *, cls_position, max_len):
    per_split = {
        s: features(model, tokenizer, list(data[s]["sentence"]), cls_position=cls_position, max_len=max_len)
        for s in SPLITS
    }
    labels = {s: np.asarray(data[s]["label"]) for s in SPLITS}
    return {kind: probe({s: per_split[s][kind] for s in SPLITS}, labels) for kind in ("cls", "mean")}


def main():
    from transformers import BertModel

    import xlnet_lite

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--xlnet", action="append", required=True, help="XLNet-Lite folder (repeatable).")
    parser.add_argument(
        "--bert", action="append", default=[], help="BERT folder from benchmarks.baselines.bert_mlm (repeatable)."
    )
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    data = embedded_news_topics()
    results = {
        "command": "python -m benchmarks.probe_linear " + " ".join(sys.argv[1:]),
        "examples": {s: len(data[s]) for s in SPLITS},
        "C_grid": C_GRID,
    }
    torch.manual_seed(0)
    config = xlnet_lite.XLNetLiteConfig.from_pretrained(args.xlnet[0])
    models = [("random_init", lambda: xlnet_lite.XLNetLiteModel(config), args.xlnet[0], -1)]
    models += [(p, lambda p=p: xlnet_lite.XLNetLiteModel.from_pretrained(p), p, -1) for p in args.xlnet]
    models += [(p, lambda p=p: BertModel.from_pretrained(p, add_pooling_layer=False), p, 0) for p in args.bert]
    for name, make, tokenizer_path, cls_position in models:
        results[name] = probe_model(
            make().eval(), load_tokenizer(tokenizer_path), data, cls_position=cls_position, max_len=args.max_seq_length
        )
        print(name, {k: round(v["test_accuracy"], 3) for k, v in results[name].items()}, flush=True)
    if args.out:
        write_json(args.out, results)


if __name__ == "__main__":
    main()
