"""XLNet's attention alone, one layer's content stream, forward and backward: the fused Triton kernels
(xlnet_lite.triton_attention) at each tile size and warp count against the SDPA path's work (the positional scores
as one (B, N, T, R) product shifted to (B, N, T, K), the segment term added, perm_mask filled in as -inf, then
scaled_dot_product_attention with that bias, as XLNet-Lite's SDPA kernel does).

    python -m benchmarks.bench_triton_attention [--shape base] [--runs 20] [--warmup 3] [--dropout 0.1]
                                                [--out benchmarks/results/gpu/triton_attention.json]

Shapes: "base" is a `base` layer at XLNet's pretraining shapes (B 32, 12 heads of 64, T 512 queries, a 384-token
memory: K 896 keys, R 1408 distances), with the collator's factorization masks and two segments; "tiny" runs on a
CPU in Triton's interpreter (TRITON_INTERPRET=1) to check the script. bf16 on CUDA (fp32 on the CPU). Each row: the
median of --runs forward + backward passes (CUDA events; perf_counter on the CPU) after --warmup, the rows
alternating; the most memory the step held above its inputs; and the largest difference of its output, and of its
gradients of every input, from the SDPA path's at dropout 0 (its check). On CUDA, rows with SDPA held to each fused
backend that takes a bias; one that refuses the inputs is named in the JSON's "refused". TFLOP/s counts the SDPA
path's matmuls (q.k, the positional product, p.v and their gradients), the work both do. Not a test.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

from benchmarks import bench_gpu
from benchmarks.environment import environment
from xlnet_lite.collator import random_factorization_masks
from xlnet_lite.modeling_xlnet_lite import KernelForms, kernel_forms, positional_term
from xlnet_lite.training import write_json

SHAPES = {"base": dict(B=32, N=12, Q=512, M=384, D=64, P=85), "tiny": dict(B=2, N=2, Q=24, M=8, D=16, P=4)}
GRADS = ("qw", "qr", "k", "v", "kr", "gain")  # the inputs a step takes gradients of
# the fused SDPA backends that take a bias (flash takes none); on CUDA a row each, the backend held
SDPA_BACKENDS = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]
# (rows per tile, keys per tile, warps, the mask as ranks or as the (B, Q, K) block, the positional term's form:
# triton_attention.POSITIONAL); 32 x 32 at 4 warps, ranks and the band the bf16 defaults; 64 x 32 at 4 warps gives each
# warp 16 whole rows of the scores (on an H100 warpgroup MMA); "matmul": the positional scores one cuBLAS product read
# shifted (at 64 x 64 the fewest instructions a block of scores, nothing spilled: results/gpu/
# triton_matmul_sm90_bf16.json). Timed before and left out (results/gpu/h200_triton_attention_base.log): the band at
# 64 x 64 tiles and at 8 warps, 1.5x slower; the mask as the block: bench_triton_kernels' "block" row.
TILES = {
    "cuda": [
        (32, 32, 4, True, "band"),
        (32, 32, 4, True, "matmul"),
        (64, 32, 4, True, "band"),
        (64, 32, 4, True, "matmul"),
        (64, 64, 4, True, "matmul"),
    ],
    "cpu": [(16, 16, 1, False, "band"), (16, 16, 1, True, "band"), (16, 16, 1, True, "matmul")],
}


def make_inputs(shape, device, dtype, seed=0):
    """Queries (with u and with v, scaled), keys, values, positional keys shared by the batch, the segment gain and
    ids, perm_mask over the current segment (the memory never blocked) as the block and what the model's
    kernel_forms finds in it (its ranks, the ids' count, the memory every row sees: KernelForms), and an output
    gradient."""
    B, N, Q, M, D = (shape[k] for k in "BNQMD")
    K, R = Q + M, 2 * Q + M
    gen = torch.Generator().manual_seed(seed)

    def rand(*size, scale=1.0):
        return (scale * torch.randn(*size, generator=gen)).to(device, dtype).requires_grad_()

    perm_mask, _ = random_factorization_masks(B, Q, shape["P"], seed=seed)
    blocked = torch.cat([torch.zeros(B, Q, M, dtype=torch.bool), perm_mask.bool()], dim=-1)  # (B, Q, K)
    segments = torch.cat([torch.zeros(B, K // 2, dtype=torch.long), torch.ones(B, K - K // 2, dtype=torch.long)], 1)
    ranks, facts, _, _ = kernel_forms(blocked, None, segments, M)  # as the model gives the kernels
    blocked[:, torch.arange(Q), M + torch.arange(Q)] = False  # the content stream sees its own token
    return dict(
        qw=rand(B, N, Q, D, scale=D**-0.5),
        qr=rand(B, N, Q, D, scale=D**-0.5),
        k=rand(B, N, K, D),
        v=rand(B, N, K, D),
        kr=rand(1, N, D, R),
        gain=rand(B, N, Q, scale=0.1),
        seg_q=segments[:, M:].to(device),
        seg_k=segments.to(device),
        seg_classes=2,  # the ids counted, as the model counts them
        blocked=blocked.to(device),
        forms=KernelForms(ranks.to(device), facts),
        grad=torch.randn(B, Q, N, D, generator=gen).to(device, dtype),
        Q=Q,
        K=K,
    )


def sdpa_path(x, dropout):
    """What XLNet-Lite's SDPA kernel computes around the call: the dense positional bias and its masking."""
    pos = positional_term(x["qr"], x["kr"], qlen=x["Q"], klen=x["K"], query_pos=None)  # (B, N, Q, K)
    same = x["seg_q"][:, None, :, None] == x["seg_k"][:, None, None, :]
    bias = (pos + x["gain"][..., None] * same).masked_fill(x["blocked"][:, None], float("-inf"))
    out = F.scaled_dot_product_attention(x["qw"], x["k"], x["v"], attn_mask=bias, dropout_p=dropout, scale=1.0)
    return out.transpose(1, 2)  # (B, Q, N, D)


def triton_path(x, dropout, ranks=False):
    from xlnet_lite.triton_attention import relative_attention

    return relative_attention(
        x["qw"],
        x["k"],
        x["v"],
        qr=x["qr"],
        kr=x["kr"],
        gain=x["gain"],
        seg_q=x["seg_q"],
        seg_k=x["seg_k"],
        seg_classes=x["seg_classes"],
        blocked=x["blocked"],
        forms=x["forms"] if ranks else None,
        dropout_p=dropout,
        qlen=x["Q"],
    )


class HeldTo:
    """The SDPA path with scaled_dot_product_attention held to one of its CUDA backends
    (`torch.nn.attention.sdpa_kernel`): which kernel takes XLNet's bias (and gives its gradient) fastest; the plain
    row is the one the dispatcher picks."""

    def __init__(self, backend):
        self.backend = backend

    def __call__(self, x, dropout, backward=True):
        from torch.nn.attention import sdpa_kernel

        with sdpa_kernel([self.backend]):  # as bench_gpu.held_to holds a model's
            return step(sdpa_path, x, dropout, backward)


class Tiled:
    """The Triton path with every kernel at one tile (rows, and keys: the rows unless given) and warp count, as
    bench_triton_kernels' ROWSxKEYS/WARPS setting gives them, each at its own pipeline stages; the mask as ranks or as
    the block; the positional term's form (triton_attention.POSITIONAL); forward and backward (the module's launch
    settings and form changed for the step only)."""

    def __init__(self, tile, warps, ranks=False, keys=None, form="band"):
        self.tile, self.warps, self.ranks, self.keys, self.form = tile, warps, ranks, keys or tile, form

    def __call__(self, x, dropout, backward=True):
        from benchmarks.bench_triton_kernels import launch_settings_changed, parse_setting, positional_changed
        from xlnet_lite import triton_attention as ta

        table = ta.launch_settings(x["qw"].device, x["qw"].dtype)
        tiled = parse_setting(f"{self.tile}x{self.keys}/{self.warps}/1")  # each kernel at its own stages below
        changes = {k: tiled[k]._replace(stages=s.stages) for k, s in table.items() if s is not None}
        with launch_settings_changed(table, changes), positional_changed(self.form):
            return step(lambda x, dropout: triton_path(x, dropout, self.ranks), x, dropout, backward)


def step(path, x, dropout, backward=True):
    """The path's output; with backward, its backward pass run too (the inputs' gradients cleared first)."""
    if not backward:
        return path(x, dropout)
    for name in GRADS:
        x[name].grad = None
    out = path(x, dropout)
    out.backward(x["grad"])
    return out


def checked(rows, x):
    """The rows that run forward and backward at dropout 0 (a row holding SDPA to a backend that cannot take the
    inputs is refused, with its error; any other row's error stops the run), and each one's largest difference from
    the SDPA path's output and from its gradients of every input (NaN included)."""
    results, refused = {}, {}
    for n, fn in rows.items():
        try:
            out = fn(x, 0.0).detach().float()
        except RuntimeError as exc:  # "No available kernel" and the like
            if not isinstance(fn, HeldTo):
                raise
            refused[n] = bench_gpu.refusal(exc)
            continue
        results[n] = (out, [x[k].grad.detach().float().clone() for k in GRADS])
    out_ref, grads_ref = results["sdpa_path"]

    def largest(a, b):
        d = (a - b).abs().max()
        return float("nan") if d.isnan() else d.item()

    error = {n: largest(out, out_ref) for n, (out, _) in results.items()}
    grad_error = {
        n: max((largest(g, r) for g, r in zip(grads, grads_ref)), key=lambda d: (d != d, d))
        for n, (_, grads) in results.items()
    }
    return {n: fn for n, fn in rows.items() if n in results}, refused, error, grad_error


def timed_step(fn, x, dropout, device):
    """Seconds of one forward + backward (bench_gpu's CUDA events on a GPU)."""
    if device.type == "cuda":
        return bench_gpu.cuda_seconds(lambda: fn(x, dropout))
    t0 = time.perf_counter()
    fn(x, dropout)
    return time.perf_counter() - t0


def matmul_flops(shape):
    """q.k, (q+v).R over R distances and p.v, forward; twice that backward."""
    B, N, Q, M, D = (shape[k] for k in "BNQMD")
    K, R = Q + M, 2 * Q + M
    return 3 * 2 * B * N * Q * D * (2 * K + R)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=list(SHAPES), default="base")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--dropout", type=float, default=0.0, help="dropout on the probabilities (default 0)")
    parser.add_argument("--out", default="benchmarks/results/gpu/triton_attention.json")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and args.shape != "tiny":
        parser.error("without CUDA only --shape tiny runs (in Triton's interpreter, to check the script)")
    shape = SHAPES[args.shape]
    x = make_inputs(shape, device, torch.bfloat16 if device.type == "cuda" else torch.float32)
    rows = {
        "sdpa_path": lambda x, dropout, backward=True: step(sdpa_path, x, dropout, backward),
        **({f"sdpa_path_{b.name.lower()}": HeldTo(b) for b in SDPA_BACKENDS} if device.type == "cuda" else {}),
        **{
            f"triton_tile{t}{f'x{k}' * (k != t)}_warps{w}{'_ranks' * r}{'_matmul' * (f == 'matmul')}": Tiled(
                t, w, r, k, f
            )
            for t, k, w, r, f in TILES[device.type]
        },
    }
    rows, refused, error, grad_error = checked(rows, x)
    for n, why in refused.items():
        print(f"{n:<24} refused: {why}", flush=True)
    times = {n: [] for n in rows}
    for i in range(args.warmup + args.runs):
        for n in list(rows)[i % len(rows) :] + list(rows)[: i % len(rows)]:  # the order rotating every run
            t = timed_step(rows[n], x, args.dropout, device)
            if i >= args.warmup:
                times[n].append(t)
    flops = matmul_flops(shape)
    results = {}
    for n, fn in rows.items():
        t = statistics.median(times[n])
        results[n] = dict(
            median_s=t,
            times_s=times[n],
            tflop_per_s=flops / t / 1e12,
            step_memory_bytes=bench_gpu.step_memory(lambda: fn(x, args.dropout)) if device.type == "cuda" else None,
            max_abs_diff_vs_sdpa=error[n],
            max_abs_grad_diff_vs_sdpa=grad_error[n],
        )
        memory = results[n]["step_memory_bytes"]
        print(
            f"{n:<24} {1000 * t:9.2f} ms {flops / t / 1e12:7.1f} TFLOP/s "
            f"{'' if memory is None else f'{memory / 2**30:6.2f} GiB'}  max |diff| {error[n]:.2e}"
            f"  grad {grad_error[n]:.2e}",
            flush=True,
        )
    command = "python -m benchmarks.bench_triton_attention " + " ".join(sys.argv[1:] if argv is None else argv)
    write_json(
        args.out,
        dict(
            command=command,
            environment=environment(),
            shape=shape,
            dropout=args.dropout,
            matmul_flops=flops,
            rows=results,
            refused=refused,
        ),
    )


if __name__ == "__main__":
    main()
