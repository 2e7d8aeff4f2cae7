"""The CPU's cross-entropy in chunks of rows against F.cross_entropy(logits.float()): a training step and the loss.

    python -m benchmarks.ab_cpu_loss [--config small] [--num_predict 43] [--runs 16] [--repeats 1] [--out F.json]

Both arms in one process on the same batch, alternating (the order flipped every run): (1) bench_model's eager bf16
training step (zero_grad, forward with labels, backward, fused AdamW) of two copies of one model, one computing its
loss as the library does on a CPU (modeling_xlnet_lite.cross_entropy: _ChunkedCrossEntropy) and one by
F.cross_entropy(logits.float(), labels) as before; (2) the loss alone, forward and backward, on the (B * P, V) bf16
logits of that batch. Medians of --runs runs after 3 warm-ups, --repeats times (each a fresh pair of models); bf16
autocast as the recipes on a CPU with bf16 units.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from benchmarks import bench_model as bm
from benchmarks.environment import environment
from xlnet_lite import modeling_xlnet_lite as modeling
from xlnet_lite.training import write_json

CHUNKED = modeling.cross_entropy


def plain(logits, labels, num_items_in_batch=None):
    return F.cross_entropy(logits.float(), labels, ignore_index=-100)


def alternating(arms, runs):
    """{name: fn} -> {name: median seconds}, the arms alternating, the order flipped every run, 3 warm-ups each."""
    for fn in arms.values():
        for _ in range(3):
            fn()
    times = {name: [] for name in arms}
    for i in range(runs):
        for name, fn in arms.items() if i % 2 == 0 else reversed(arms.items()):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def training_steps(cfg, runs):
    _, _, _, _, variants = bm.build_variants(cfg, ["lite_eager_bf16"])
    first = variants["lite_eager_bf16"]
    second = bm.Variant("chunked", copy.deepcopy(first.model), first.inputs, None, first.autocast_dtype)
    second.inputs = first.inputs

    def step(variant, loss_fn):
        def run():
            modeling.cross_entropy = loss_fn
            return variant.train_step()

        return run

    try:
        return alternating({"plain": step(first, plain), "chunked": step(second, CHUNKED)}, runs)
    finally:
        modeling.cross_entropy = CHUNKED


def loss_alone(cfg, runs):
    generator = torch.Generator().manual_seed(0)
    rows = cfg["batch"] * cfg["num_predict"]
    logits = torch.randn(rows, cfg["vocab_size"], generator=generator).to(torch.bfloat16)
    labels = torch.randint(0, cfg["vocab_size"], (rows,), generator=generator)

    def run(loss_fn):
        def fn():
            x = logits.detach().requires_grad_(True)
            loss_fn(x, labels).backward()

        return fn

    return alternating({"plain": run(plain), "chunked": run(CHUNKED)}, runs)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ab_cpu_loss", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", choices=list(bm.CONFIGS), default="small")
    parser.add_argument("--num_predict", type=int, default=43, help="P: the recipe's default predicts a third")
    parser.add_argument("--runs", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=1, help="the whole comparison this many times")
    parser.add_argument("--out", help="write the medians here (JSON)")
    args = parser.parse_args(argv)
    cfg = {**bm.CONFIGS[args.config], "num_predict": args.num_predict}
    repeats = []
    for _ in range(args.repeats):
        rows = {"training_step": training_steps(cfg, args.runs), "loss_forward_backward": loss_alone(cfg, args.runs)}
        for name, medians in rows.items():
            ratio = medians["chunked"] / medians["plain"]
            plain_ms, chunked_ms = medians["plain"] * 1e3, medians["chunked"] * 1e3
            print(f"{name}: plain {plain_ms:.1f} ms, chunked {chunked_ms:.1f} ms ({ratio:.3f}x)", flush=True)
            medians["chunked_over_plain"] = ratio
        repeats.append(rows)
    if args.out:
        command = "python -m benchmarks.ab_cpu_loss " + " ".join(sys.argv[1:] if argv is None else argv)
        record = {"command": command, "config": cfg, "runs": args.runs, "environment": environment()}
        write_json(args.out, {**record, "repeats": repeats})


if __name__ == "__main__":
    main()
