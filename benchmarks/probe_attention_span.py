"""Where the classifying position (<cls>, the last token) looks before any finetuning: for the first N validation
messages of 20 Newsgroups (first 128 tokens, left-padded), per layer, the entropy of <cls>'s attention (in nats,
averaged over heads and messages; uniform attention over n real tokens gives log n) and the share of it on the last
8 tokens. At random initialisation attention is uniform, so <cls> starts as an average of the whole message (a bag
of words); a permutation-LM pretraining teaches local attention, so <cls> starts reading the message's end.

    python -m benchmarks.probe_attention_span --model outputs/pretrain [--model DIR ...] [--messages 64] \
        [--out benchmarks/results/attention_span.json]
"""

import argparse
import sys

import torch

import xlnet_lite
from benchmarks.environment import environment
from xlnet_lite.classification_data import load_splits
from xlnet_lite.tokenization_xlnet_lite import load_tokenizer
from xlnet_lite.training import write_json

LAST = 8


@torch.no_grad()
def attention_span(model, enc) -> list[dict]:
    """Per layer: <cls> attention entropy and its share on the last LAST tokens."""
    out = model(
        input_ids=enc["input_ids"],
        attention_mask=enc["attention_mask"],
        token_type_ids=enc["token_type_ids"],
        output_attentions=True,
    )
    rows = []
    for attention in out.attentions:  # (B, N, T, K)
        cls = attention[:, :, -1, :].float()  # (B, N, K): what <cls> attends to
        entropy = -(cls.clamp_min(1e-12).log() * cls).sum(-1).mean().item()
        rows.append({"cls_entropy": entropy, f"cls_share_on_last_{LAST}": cls[..., -LAST:].sum(-1).mean().item()})
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", required=True, help="A pretraining output folder (repeatable).")
    parser.add_argument("--messages", type=int, default=64)
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    texts = list(load_splits(embedded_task="newsgroups")["validation"].data["sentence"][: args.messages])
    results = {
        "command": "python -m benchmarks.probe_attention_span " + " ".join(sys.argv[1:] if argv is None else argv),
        "environment": environment(),
        "messages": len(texts),
    }
    for path in args.model:
        tokenizer = load_tokenizer(path)
        tokenizer.padding_side = "left"
        enc = tokenizer(texts, truncation=True, max_length=args.max_seq_length, padding=True, return_tensors="pt")
        torch.manual_seed(0)
        config = xlnet_lite.XLNetLiteConfig.from_pretrained(path)
        models = {
            "random_init": xlnet_lite.XLNetLiteModel(config),
            "pretrained": xlnet_lite.XLNetLiteModel.from_pretrained(path),
        }
        uniform = enc["attention_mask"].sum(1).float().log().mean().item()
        results[path] = {
            "uniform_entropy": uniform,
            "uniform_share_on_last": LAST / enc["attention_mask"].sum(1).float().mean().item(),
            **{name: attention_span(m.eval(), enc) for name, m in models.items()},
        }
        for name in models:
            print(
                path,
                name,
                [f"{r['cls_entropy']:.2f}/{r[f'cls_share_on_last_{LAST}']:.2f}" for r in results[path][name]],
                f"(uniform {uniform:.2f}/{results[path]['uniform_share_on_last']:.2f})",
                flush=True,
            )
    if args.out:
        write_json(args.out, results)
    return results


if __name__ == "__main__":
    main()
