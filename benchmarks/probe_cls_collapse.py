"""How input-dependent is the feature the classifier starts from? For each model, the last layer's hidden state at
the classifying position (`<cls>`) for the first N validation articles of the news-topic task (first 128 tokens),
reported two ways: the mean pairwise cosine of those vectors (1.0: every article gives the same vector) and the share
of their variance (around the mean) in the top principal component (1.0: the articles differ along one direction
only). A model that learned to ignore its input, as on the unigram plateau, concentrates the variation.

    python -m benchmarks.probe_cls_collapse --xlnet outputs/pretrain [--xlnet DIR ...] [--bert DIR ...] \
        [--out benchmarks/results/cls_collapse.json]

Random initialisation (XLNet-Lite, from the first --xlnet folder's config, seed 0) is always included.
"""

import argparse
import json
import sys

import torch

from xlnet_lite.embedded_datasets import embedded_news_topics
from xlnet_lite.tokenization_xlnet_lite import load_tokenizer
from xlnet_lite.training import write_json


def stats(vectors):
    v = vectors.double()
    unit = torch.nn.functional.normalize(v, dim=-1)
    n = len(v)
    cosine = ((unit @ unit.T).sum() - n) / (n * (n - 1))
    centered = v - v.mean(0)
    s = torch.linalg.svdvals(centered) ** 2
    return {
        "mean_pairwise_cosine": float(cosine),
        "top_component_variance_share": float(s[0] / s.sum()),
        "mean_norm": float(v.norm(dim=-1).mean()),
    }


@torch.no_grad()
def xlnet_features(model, tokenizer, texts, max_len):
    tokenizer.padding_side = "left"
    enc = tokenizer(texts, truncation=True, max_length=max_len, padding=True, return_tensors="pt")
    out = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], token_type_ids=enc["token_type_ids"])
    return out.last_hidden_state[:, -1]  # <cls>, the last position (left padding)


@torch.no_grad()
def bert_features(path, texts, max_len):
    from transformers import BertModel

    tokenizer = load_tokenizer(path)
    enc = tokenizer(texts, truncation=True, max_length=max_len, padding=True, return_tensors="pt")
    model = BertModel.from_pretrained(path, add_pooling_layer=False).eval()
    return model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).last_hidden_state[:, 0]  # <cls>


def main():
    import xlnet_lite

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--xlnet", action="append", default=[])
    parser.add_argument("--bert", action="append", default=[])
    parser.add_argument("--articles", type=int, default=64)
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--out")
    args = parser.parse_args()
    texts = list(embedded_news_topics()["validation"]["sentence"][: args.articles])
    results = {"command": "python -m benchmarks.probe_cls_collapse " + " ".join(sys.argv[1:])}
    tokenizer = load_tokenizer(args.xlnet[0])
    torch.manual_seed(0)
    config = xlnet_lite.XLNetLiteConfig.from_pretrained(args.xlnet[0])
    results["random_init"] = stats(
        xlnet_features(xlnet_lite.XLNetLiteModel(config).eval(), tokenizer, texts, args.max_seq_length)
    )
    for path in args.xlnet:
        model = xlnet_lite.XLNetLiteModel.from_pretrained(path).eval()
        results[path] = stats(xlnet_features(model, load_tokenizer(path), texts, args.max_seq_length))
    for path in args.bert:
        results[path] = stats(bert_features(path, texts, args.max_seq_length))
    print(json.dumps(results, indent=2))
    if args.out:
        write_json(args.out, results)


if __name__ == "__main__":
    main()
