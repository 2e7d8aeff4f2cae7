"""How fast does a from-scratch XLNet leave the unigram plateau? Training-loss curves of recipe variants.

    python -m benchmarks.probe_plateau --variant lr=3e-3 --variant lr=3e-4 [--variant lr=3e-4,max_span_length=1]
        [--steps 500 --every 100] [--d_model 256 --n_layer 4] [--threads 2] [--out benchmarks/results/plateau_probe.json]

A variant is a comma-separated list of overrides of BASE (XLNet's settings in the recipe: lr, warmup, dropout, adam_epsilon,
max_span_length, leak); no --variant runs BASE. Every variant trains the same architecture on the same batches (the
embedded news corpus, the default collator, the memory carried across steps, bf16 autocast, linear decay after
warmup reaching 0 at --schedule_steps, the recipe's max_steps) and is reported every --every steps as the mean
training PLM loss minus the mean unigram loss of the same targets (negative = below the unigram baseline, i.e. the
model uses context). Variants run one after the other in this process. `leak=1` hides each target only from itself
(its neighbours stay visible): how fast context could be picked up if the objective were easy.
"""

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from xlnet_lite import XLNetLiteConfig, XLNetLiteLMHeadModel
from xlnet_lite.collator import DataCollatorForXLNetPretraining
from xlnet_lite.data import PretrainingStream
from xlnet_lite.embedded_datasets import embedded_news_texts
from xlnet_lite.model_utils import init_lm_bias_at_unigram, unigram_log_probs  # the recipe's own start
from xlnet_lite.tokenization_xlnet_lite import load_tokenizer, train_tokenizer

BASE = dict(lr=3e-4, warmup=100, dropout=0.0, adam_epsilon=1e-8, max_span_length=5, leak=0)


def parse_variant(text: str) -> dict:
    """ "lr=3e-3,dropout=0" -> {"lr": 0.003, "dropout": 0.0}; unknown keys are an error."""
    overrides = {}
    for item in filter(None, text.split(",") if text != "base" else []):
        key, sep, value = item.partition("=")
        if not sep or key not in BASE:
            raise SystemExit(f"--variant wants key=value pairs with keys in {sorted(BASE)}, got {item!r}")
        overrides[key] = type(BASE[key])(float(value)) if isinstance(BASE[key], int) else float(value)
    return overrides


def run_variant(name, settings, args, tokenizer, texts):
    torch.manual_seed(args.seed)
    reuse = args.seq_len // 2
    stream = PretrainingStream(texts, tokenizer, batch_size=args.batch_size, seq_len=args.seq_len, reuse_len=reuse)
    collator = DataCollatorForXLNetPretraining(
        tokenizer, reuse_len=reuse, seed=args.seed, max_span_length=settings["max_span_length"]
    )
    config = XLNetLiteConfig(
        vocab_size=len(tokenizer),
        d_model=args.d_model,
        n_layer=args.n_layer,
        n_head=max(1, args.d_model // 64),
        d_inner=4 * args.d_model,
        mem_len=reuse,
        reuse_len=reuse,
        dropout=settings["dropout"],
    )
    model = XLNetLiteLMHeadModel(config).train()
    log_prior = unigram_log_probs(stream.token_counts(minlength=config.vocab_size), config.vocab_size)
    init_lm_bias_at_unigram(model, log_prior)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=settings["lr"], eps=settings["adam_epsilon"], weight_decay=0.01
    )
    warmup, horizon = settings["warmup"], max(args.steps, args.schedule_steps)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda i: min((i + 1) / warmup, max(0.0, (horizon - i) / max(1, horizon - warmup)))
    )
    mems, gaps, curve, start = None, [], [], time.perf_counter()
    for step in range(1, args.steps + 1):
        batch = collator(stream.next_batch())
        if settings["leak"]:
            targets = batch["target_mapping"].sum(1)  # (B, T) 1 at target positions
            batch["perm_mask"] = torch.diag_embed(targets)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(**batch, mems=mems, use_mems=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
        mems = out.mems
        labels = batch["labels"][batch["labels"] >= 0].numpy()
        gaps.append(out.loss.item() + log_prior[labels].mean())
        if step % args.every == 0:
            curve.append({"step": step, "loss_minus_unigram": round(float(np.mean(gaps[-args.every :])), 4)})
            print(
                f"{name:20s} step {step:5d}  loss - unigram {curve[-1]['loss_minus_unigram']:+.4f}  "
                f"{time.perf_counter() - start:.0f}s",
                flush=True,
            )
    return {"settings": settings, "curve": curve, "seconds": round(time.perf_counter() - start, 1)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", action="append", help="key=value[,key=value]; repeatable; default: BASE")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument(
        "--schedule_steps",
        type=int,
        default=1000,
        help="linear decay reaches 0 here (the recipe's max_steps), so a short probe sees its first steps",
    )
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--d_model", type=int, default=256)
    parser.add_argument("--n_layer", type=int, default=4)
    parser.add_argument("--seq_len", type=int, default=128)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--documents", type=int, default=3000)
    parser.add_argument("--tokenizer", help="a saved tokenizer; else one is trained on the first 2,000 documents")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    variants = {name: {**BASE, **parse_variant(name)} for name in args.variant or ["base"]}
    torch.set_num_threads(args.threads)
    texts = embedded_news_texts()[: args.documents]
    tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else train_tokenizer(texts[:2000], vocab_size=8000)
    results = {"args": vars(args), "variants": {}}
    for name, settings in variants.items():
        results["variants"][name] = run_variant(name, settings, args, tokenizer, texts)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
