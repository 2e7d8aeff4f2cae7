"""Finetuning and inference speed of the sequence classifier: the last layer at the pooled position only (what
XLNetLiteForSequenceClassification does) against the whole last layer, beside transformers' XLNet.

    python -m benchmarks.bench_classifier [--model_size small] [--batch_size 16] [--max_seq_length 128]
        [--num_labels 20] [--runs 10] [--warmup 2] [--threads 2] [--out benchmarks/results/classifier.json]

One process, three models with the same weights (transformers' XLNetForSequenceClassification and two XLNet-Lite
twins converted from it), finetuning's settings (dropout 0.1, summary `last`, fused AdamW, train mode): the
"pooled position" twin runs as the library does, the "whole last layer" twin with its sequence summary told to
keep every position (as when hidden states are asked for). Each run times a training step (zero_grad, forward
with labels, backward, optimizer step) and an inference forward (eval mode, no_grad) of every model, the models'
order rotating every run; medians after `--warmup` untimed runs. The batch: B x T random tokens with XLNet's
`A <sep> B <sep> <cls>` segment ids, a quarter of the rows left-padded by a quarter of T. The logits of the three
models on it (eval mode) are compared too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from xlnet_lite.model_utils import MODEL_PRESETS

VARIANTS = ("transformers", "xlnet_lite_pooled_position", "xlnet_lite_whole_last_layer")


def batch(batch_size, length, vocab_size, num_labels, seed=0):
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, vocab_size, (batch_size, length), generator=gen)
    token_type_ids = torch.zeros(batch_size, length, dtype=torch.long)
    token_type_ids[:, length // 2 :], token_type_ids[:, -1] = 1, 2
    attention_mask = torch.ones(batch_size, length, dtype=torch.long)
    attention_mask[: batch_size // 4, : length // 4] = 0
    labels = torch.randint(0, num_labels, (batch_size,), generator=gen)
    return dict(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask, labels=labels)


def models(args):
    import transformers

    import xlnet_lite

    torch.manual_seed(0)
    config = transformers.XLNetConfig(
        vocab_size=8000, num_labels=args.num_labels, dropout=0.1, mem_len=None, **MODEL_PRESETS[args.model_size]
    )
    hf = transformers.XLNetForSequenceClassification(config)
    pooled, whole = xlnet_lite.from_hf_xlnet(hf), xlnet_lite.from_hf_xlnet(hf)
    whole.sequence_summary.positions = lambda *args, **kwargs: None  # every position of the last layer
    built = {}
    for name, model in zip(VARIANTS, (hf, pooled, whole)):
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        built[name] = (model, optimizer)
    return built


def train_step(model, optimizer, inputs):
    model.train()
    optimizer.zero_grad(set_to_none=True)
    model(**inputs).loss.backward()
    optimizer.step()


@torch.no_grad()
def inference(model, inputs):
    model.eval()
    return model(**{k: v for k, v in inputs.items() if k != "labels"}).logits


def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_classifier", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model_size", choices=list(MODEL_PRESETS), default="small")
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--num_labels", type=int, default=20)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.warmup < 0 or args.batch_size < 1 or args.max_seq_length < 2:
        parser.error("--runs, --batch_size must be >= 1, --warmup >= 0, --max_seq_length >= 2")

    from benchmarks.environment import environment
    from xlnet_lite.training import write_json

    torch.set_num_threads(args.threads)
    built = models(args)
    inputs = batch(args.batch_size, args.max_seq_length, 8000, args.num_labels)
    logits, last_layer_rows = {}, {}
    for name, (model, _) in built.items():  # and how many positions XLNet-Lite's last feed-forward computes
        last_ff = model.transformer.layer[-1].ff
        hook = (
            None
            if name == "transformers"
            else last_ff.register_forward_hook(
                lambda module, args, out, name=name: last_layer_rows.update({name: out.shape[1]})
            )
        )
        logits[name] = inference(model, inputs)
        if hook is not None:
            hook.remove()
    times = {name: {"train_step_s": [], "inference_s": []} for name in VARIANTS}
    for run in range(args.warmup + args.runs):
        order = VARIANTS[run % 3 :] + VARIANTS[: run % 3]
        for name in order:
            model, optimizer = built[name]
            step = timed(lambda: train_step(model, optimizer, inputs))
            forward = timed(lambda: inference(model, inputs))
            if run >= args.warmup:
                times[name]["train_step_s"].append(round(step, 4))
                times[name]["inference_s"].append(round(forward, 4))
        print(f"run {run + 1}/{args.warmup + args.runs}", flush=True)
    tokens = args.batch_size * args.max_seq_length
    rows = {}
    for name in VARIANTS:
        train_s, infer_s = (statistics.median(times[name][k]) for k in ("train_step_s", "inference_s"))
        rows[name] = {
            "train_step_s": train_s,
            "train_tokens_per_s": round(tokens / train_s),
            "inference_s": infer_s,
            "inference_tokens_per_s": round(tokens / infer_s),
            "runs": times[name],
        }
    base = rows["xlnet_lite_whole_last_layer"]
    for name in VARIANTS:
        rows[name]["train_time_vs_whole_last_layer"] = round(rows[name]["train_step_s"] / base["train_step_s"], 3)
        rows[name]["inference_time_vs_whole_last_layer"] = round(rows[name]["inference_s"] / base["inference_s"], 3)
    result = {
        "command": "python -m benchmarks.bench_classifier " + " ".join(argv if argv is not None else sys.argv[1:]),
        "environment": environment(),
        "shapes": {
            "model_size": args.model_size,
            "batch_size": args.batch_size,
            "max_seq_length": args.max_seq_length,
            "num_labels": args.num_labels,
            "threads": args.threads,
            "runs": args.runs,
            "warmup": args.warmup,
        },
        "variants": rows,
        "last_layer_rows": last_layer_rows,  # positions XLNet-Lite's last feed-forward computed, per sequence
        "logits_max_abs_diff": {
            "pooled_vs_whole_last_layer": float((logits[VARIANTS[1]] - logits[VARIANTS[2]]).abs().max()),
            "pooled_vs_transformers": float((logits[VARIANTS[1]] - logits[VARIANTS[0]]).abs().max()),
        },
    }
    print(
        json.dumps(
            {k: v for k, v in result.items() if k != "variants"}
            | {"variants": {n: {k: v for k, v in r.items() if k != "runs"} for n, r in rows.items()}},
            indent=2,
        )
    )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        write_json(args.out, result)
    return result


if __name__ == "__main__":
    main()
