"""Why XLNet-Lite's flex_attention rows are slower than its SDPA rows on a GPU: the attention core alone at the
`base` preset's shapes (B 32, N 12, Q 512 queries, K 896 keys = 384 memory + 512, head size 64, bf16), forward and
backward, each way of adding XLNet's relative positional term timed side by side (CUDA-event medians):

  sdpa_bias        SDPA with the shifted positional term as a dense (B, N, Q, K) additive bias with a gradient
  flex_plain       flex_attention with no score_mod: the kernel's own floor
  flex_dense_bias  flex with a score_mod that reads that dense bias, with a gradient (the model's flex kernel)
  flex_shift       flex reading the unshifted (B, N, Q, R) scores at rel_shift's index, with a gradient (the model's
                   flex kernel before it took the dense operand)
  flex_shift_nograd  the same with the scores detached (no gradient to the captured tensor)

Each timed run starts with the leaves' gradients cleared. max_rel_diff: the largest difference from the SDPA arm's
output over that output's largest magnitude (bf16: about 0.004 is one rounding); none for flex_plain.

    python -m benchmarks.flex_probe [--runs 10] [--out F]
"""

import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.flex_probe", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--shape", type=int, nargs=5, default=[32, 12, 512, 896, 64], metavar=("B", "N", "Q", "K", "D"))
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device")
    from torch.nn.attention.flex_attention import flex_attention

    for knob in ("recompile_limit", "cache_size_limit"):  # one compiled kernel per arm and mode
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 64)
    flex = torch.compile(flex_attention, dynamic=False)
    B, N, Q, K, D = args.shape
    R = K + Q
    dev, dt = torch.device("cuda"), torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)

    def leaf(*shape):
        return torch.randn(*shape, device=dev, dtype=dt, generator=g).requires_grad_()

    q, k, v = leaf(B, N, Q, D), leaf(B, N, K, D), leaf(B, N, K, D)
    raw = leaf(B, N, Q, R)
    index = (Q - torch.arange(Q, device=dev)[:, None] + torch.arange(K, device=dev)).clamp(max=R - 1)  # (Q, K)
    dense = raw.detach().gather(-1, index.expand(B, N, Q, K)).clone().requires_grad_()

    def shift_mod(table):
        def score_mod(score, b, h, i, j):
            return score + table[b, h, i, torch.clamp(Q - i + j, max=R - 1)]

        return score_mod

    def dense_mod(score, b, h, i, j):
        return score + dense[b, h, i, j]

    mod_shift, mod_shift_nograd = shift_mod(raw), shift_mod(raw.detach())
    arms = {
        "sdpa_bias": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=dense),
        "flex_plain": lambda: flex(q, k, v),
        "flex_dense_bias": lambda: flex(q, k, v, score_mod=dense_mod),
        "flex_shift": lambda: flex(q, k, v, score_mod=mod_shift),
        "flex_shift_nograd": lambda: flex(q, k, v, score_mod=mod_shift_nograd),
    }
    grad_out = torch.randn(B, N, Q, D, device=dev, dtype=dt, generator=g)

    def step(fn):
        out = fn()
        out.backward(grad_out)

    def forward(fn):
        with torch.no_grad():
            fn()

    result = dict(
        command=" ".join(["python -m benchmarks.flex_probe"] + sys.argv[1:]),
        device=torch.cuda.get_device_name(),
        torch=torch.__version__,
        shape=dict(B=B, N=N, Q=Q, K=K, D=D),
        arms={},
    )
    with torch.no_grad():
        reference = arms["sdpa_bias"]().float()
    leaves = (q, k, v, raw, dense)
    for name, fn in arms.items():
        step(fn)  # compile
        torch.cuda.synchronize()
        err = None
        if name != "flex_plain":  # the one arm without the positional term
            with torch.no_grad():
                err = ((fn().float() - reference).abs().max() / reference.abs().max()).item()
        row = {}
        for what, run in (("forward_backward", step), ("forward", forward)):
            times = []
            for r in range(args.runs + 2):
                for t in leaves:
                    t.grad = None
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                run(fn)
                b.record()
                torch.cuda.synchronize()
                if r >= 2:
                    times.append(a.elapsed_time(b))
            row[f"{what}_ms"] = statistics.median(times)
        row["max_rel_diff_vs_sdpa_bias"] = err
        result["arms"][name] = row
        print(
            f"{name:<18} fwd+bwd {row['forward_backward_ms']:8.2f} ms  fwd {row['forward_ms']:7.2f} ms"
            + ("" if err is None else f"  max rel diff {err:.3g}"),
            flush=True,
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
