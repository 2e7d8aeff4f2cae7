"""Side-by-side generation: XLNet-Lite generate() vs transformers' XLNet generate() vs GPT-2 with its KV cache.

    python -m benchmarks.bench_generate [--new-tokens 200] [--prompt 64] [--batches 1 8] [--runs 3] [--threads 1]
                                        [--out benchmarks/results/generate.json]

Models of the same size (vocab 8000, d_model 256, 4 layers, 4 heads, d_inner 1024, fp32, eval mode, random
weights): transformers' XLNetLMHeadModel (mem_len None, as xlnet-base-cased), its XLNet-Lite twin
(`xlnet_lite.from_hf_xlnet`, identical weights) and transformers' GPT2LMHeadModel (n_positions 512, its default
DynamicCache). Greedy decoding, no end-of-sequence token (every run makes exactly --new-tokens tokens), the same
random prompt of --prompt tokens for all three.

Per batch size, each variant generates --new-tokens tokens (`total`) and 1 token (`prefill`: the prompt pass
and one step), --runs times after one warm-up, in ONE process and alternating (the order rotates every run).
Reported per variant: median seconds of the total, ms per new token (total / new tokens, prompt included, the
headline measure), ms per decoding step ((total - prefill) / (new tokens - 1)), and the ratios to GPT-2 and to
transformers' XLNet. The tokens XLNet-Lite generates are compared with transformers' XLNet's (greedy; same
weights): `same_tokens_as_transformers_xlnet`.

Not a test: never run it in CI. Times on a shared machine are noisy; the load average is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers

import xlnet_lite

SIZE = dict(vocab_size=8000, d_model=256, n_layer=4, n_head=4, d_inner=1024)


def build_models(seed=0):
    """transformers' XLNet, its XLNet-Lite twin and a GPT-2 of the same size, eval mode, no end-of-sequence token."""
    torch.manual_seed(seed)
    hf_xlnet = transformers.XLNetLMHeadModel(transformers.XLNetConfig(**SIZE, dropout=0.0, mem_len=None)).eval()
    lite = xlnet_lite.from_hf_xlnet(hf_xlnet).eval()
    gpt2_config = transformers.GPT2Config(
        vocab_size=SIZE["vocab_size"],
        n_embd=SIZE["d_model"],
        n_layer=SIZE["n_layer"],
        n_head=SIZE["n_head"],
        n_inner=SIZE["d_inner"],
        n_positions=512,
        bos_token_id=1,
        eos_token_id=2,
    )
    gpt2 = transformers.GPT2LMHeadModel(gpt2_config).eval()
    models = {"xlnet_lite": lite, "transformers_xlnet": hf_xlnet, "transformers_gpt2": gpt2}
    for model in models.values():
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
    return models


def timed_generate(model, prompt, new_tokens):
    with torch.no_grad():
        start = time.perf_counter()
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens, do_sample=False)
        return time.perf_counter() - start, out


def bench_batch(models, batch, args):
    gen = torch.Generator().manual_seed(batch)
    prompt = torch.randint(10, SIZE["vocab_size"], (batch, args.prompt), generator=gen)
    names = list(models)
    times = {name: {"total": [], "prefill": []} for name in names}
    outputs = {}
    for run in range(args.runs + 1):  # run 0 is the warm-up
        order = names[run % len(names) :] + names[: run % len(names)]
        for name in order:
            total, out = timed_generate(models[name], prompt, args.new_tokens)
            prefill, _ = timed_generate(models[name], prompt, 1)
            assert out.shape == (batch, args.prompt + args.new_tokens), out.shape
            outputs[name] = out
            if run:
                times[name]["total"].append(total)
                times[name]["prefill"].append(prefill)
                print(f"  B={batch} run {run} {name}: {total:.2f} s", flush=True)
    result = {
        "batch": batch,
        "same_tokens_as_transformers_xlnet": bool(torch.equal(outputs["xlnet_lite"], outputs["transformers_xlnet"])),
    }
    for name in names:
        total, prefill = statistics.median(times[name]["total"]), statistics.median(times[name]["prefill"])
        result[name] = {
            "total_s": total,
            "prefill_s": prefill,
            "runs_total_s": times[name]["total"],
            "ms_per_token": 1000 * total / args.new_tokens,
            "ms_per_decode_step": 1000 * (total - prefill) / (args.new_tokens - 1),
        }
    for name in names:
        for base in ("transformers_gpt2", "transformers_xlnet"):
            result[name][f"time_per_token_vs_{base}"] = result[name]["total_s"] / result[base]["total_s"]
    return result


def print_table(results, args):
    print(f"\n{args.new_tokens} new tokens from a {args.prompt}-token prompt, greedy, {args.threads} thread(s)")
    print(f"{'B':>2} {'model':<20} {'total s':>8} {'ms/token':>9} {'ms/step':>8} {'vs GPT-2':>9} {'vs HF XLNet':>12}")
    for r in results:
        for name in ("xlnet_lite", "transformers_xlnet", "transformers_gpt2"):
            x = r[name]
            print(
                f"{r['batch']:>2} {name:<20} {x['total_s']:>8.2f} {x['ms_per_token']:>9.2f} "
                f"{x['ms_per_decode_step']:>8.2f} {x['time_per_token_vs_transformers_gpt2']:>8.2f}x "
                f"{x['time_per_token_vs_transformers_xlnet']:>11.2f}x"
            )
        print(f"   greedy tokens identical to transformers' XLNet: {r['same_tokens_as_transformers_xlnet']}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--new-tokens", type=int, default=200)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--runs", type=int, default=3, help="timed runs per variant and batch (medians)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="benchmarks/results/generate.json")
    args = parser.parse_args()
    if args.new_tokens < 2:
        parser.error("--new-tokens must be >= 2")
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    models = build_models()
    results = [bench_batch(models, batch, args) for batch in args.batches]
    print_table(results, args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            dict(
                command=" ".join([Path(sys.executable).name] + sys.argv),
                models=SIZE,
                prompt_tokens=args.prompt,
                new_tokens=args.new_tokens,
                runs=args.runs,
                threads=args.threads,
                results=results,
                machine=dict(
                    platform=platform.platform(),
                    processor=platform.processor(),
                    cpus=os.cpu_count(),
                    torch=torch.__version__,
                    transformers=transformers.__version__,
                    loadavg_before=load_before,
                    loadavg_after=os.getloadavg(),
                ),
            ),
            indent=1,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
