"""XLNet-Lite against transformers' XLNet on a CUDA GPU: training tokens/s, step memory and MFU, in bf16 autocast.

    python -m benchmarks.bench_gpu [--config base small] [--runs 10] [--no-compile] [--variants ROW ...]
                                   [--out benchmarks/results/gpu/model.json]

Configs: "base" is XLNet-base's layout (d_model 768, 12 layers, 12 heads, d_inner 3072, vocab 32,000) at XLNet's
pretraining shapes (B 32, T 512, reuse_len 256, a full 384-token memory, P 85 = T/6, dropout 0.1); "small" is
benchmarks/bench_model.py's (the pretraining recipe's preset and shapes). The variants are bench_model's bf16 ones,
built the same way (same weights, batch and memory) and moved to the GPU: transformers under torch.autocast("cuda",
bf16); XLNet-Lite's explicit kernel and SDPA under the same autocast; SDPA with the segment term added to the
positional bias instead of one-hot dims on q and k (lite_sdpa_segbias_bf16: head size D rather than D + 8);
flex_attention (lite_flex_bf16: the positional term a dense (B, N, T, K) operand, as SDPA's bias; the segment term
and the masks read inside the kernel; dropout 0, as it takes none on the probabilities, beside SDPA rows with dropout 0
as well); the fused Triton kernels (lite_triton_bf16, xlnet_lite.triton_attention: the content stream's positional term
computed inside from the positional keys, the dropout on the probabilities drawn inside; at dropout 0 beside SDPA's:
lite_triton_nodrop_bf16; compiled whole too, the kernels as operators in the graph: lite_triton_compiled_bf16,
lite_triton_compiled_nodrop_bf16; the positional term as one matmul's product the kernels read shifted,
triton_attention.POSITIONAL "matmul", at 64 x 64 tiles: lite_triton_matmul_nodrop_bf16,
lite_triton_matmul_compiled_nodrop_bf16); SDPA at dropout 0 held to cuDNN's kernel (lite_sdpa_cudnn_nodrop_bf16;
a backend that refuses the inputs is set aside and named in the JSON's "refused"); SDPA with Dropout's mask drawn from
random integers as on a CPU (lite_sdpa_bitsdrop_bf16; on a GPU it is F.dropout's fused kernel); the kernels compiled
(torch.compile(fullgraph=True, dynamic=False); the first step, compilation included, is reported apart).

A training step is zero_grad + forward with labels + backward + fused AdamW, timed with CUDA events; medians of
--runs runs after --warmup, the variants alternating (the order rotating every run). Memory: the most the CUDA
allocator held during a training step above what it held before the step (activations, gradients, temporaries;
the weights and AdamW state of every variant stay resident and are left out), torch.cuda.max_memory_allocated.
MFU: the step's matmul FLOPs (torch.utils.flop_counter, a compiled variant charged its eager twin's) / median step
time / the bf16 matmul peak measured at the start and end of each config (8192^3, CUDA events). Not a test.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from unittest import mock

import torch
from accelerate.utils import send_to_device
from torch.nn.attention import SDPBackend

from benchmarks import bench_model as bm
from benchmarks.environment import environment
from xlnet_lite.training import write_json

CONFIGS = {
    "base": dict(
        vocab_size=32000,
        d_model=768,
        n_layer=12,
        n_head=12,
        d_inner=3072,
        batch=32,
        seq_len=512,
        num_predict=85,
        mem_len=384,
        reuse_len=256,
        dropout=0.1,
    ),
    "small": bm.CONFIGS["small"],
}
NAMES = [
    "hf_bf16",
    "lite_eager_bf16",
    "lite_sdpa_bf16",
    "lite_sdpa_segbias_bf16",
    "lite_sdpa_nodrop_bf16",
    "lite_flex_bf16",
    "lite_compiled_bf16",
    "lite_eager_compiled_bf16",
    "lite_compiled_nodrop_bf16",
    "lite_flex_compiled_bf16",
    "lite_triton_bf16",
    "lite_triton_nodrop_bf16",
    "lite_triton_compiled_bf16",
    "lite_triton_compiled_nodrop_bf16",
    "lite_triton_matmul_nodrop_bf16",
    "lite_triton_matmul_compiled_nodrop_bf16",
    "lite_sdpa_cudnn_nodrop_bf16",
    "lite_sdpa_bitsdrop_bf16",
]
# rows that are a bench_model variant changed: name -> (that variant, attention kernel, segment term as a bias,
# dropout 0 (flex_attention takes none on the probabilities; the no-dropout SDPA row is its like-for-like twin))
DERIVED = {
    "lite_sdpa_segbias_bf16": ("lite_sdpa_bf16", "sdpa", True, False),
    "lite_sdpa_nodrop_bf16": ("lite_sdpa_bf16", "sdpa", False, True),
    "lite_flex_bf16": ("lite_sdpa_bf16", "flex_attention", False, True),
    "lite_compiled_nodrop_bf16": ("lite_compiled_bf16", "sdpa", False, True),
    "lite_flex_compiled_bf16": ("lite_compiled_bf16", "flex_attention", False, True),
    "lite_triton_bf16": ("lite_sdpa_bf16", "xlnet_lite_triton", False, False),
    "lite_triton_nodrop_bf16": ("lite_sdpa_bf16", "xlnet_lite_triton", False, True),
    "lite_triton_compiled_bf16": ("lite_compiled_bf16", "xlnet_lite_triton", False, False),
    "lite_triton_compiled_nodrop_bf16": ("lite_compiled_bf16", "xlnet_lite_triton", False, True),
    "lite_triton_matmul_nodrop_bf16": ("lite_sdpa_bf16", "xlnet_lite_triton", False, True),
    "lite_triton_matmul_compiled_nodrop_bf16": ("lite_compiled_bf16", "xlnet_lite_triton", False, True),
    "lite_sdpa_cudnn_nodrop_bf16": ("lite_sdpa_bf16", "sdpa", False, True),
    "lite_sdpa_bitsdrop_bf16": ("lite_sdpa_bf16", "sdpa", False, False),
}
# rows whose Triton kernels take the content stream's positional term as one matmul's product read shifted
# (triton_attention.POSITIONAL "matmul") instead of the band, every kernel at a launch setting (bench_triton_kernels'
# ROWSxKEYS/WARPS/STAGES): 64 x 64 tiles at 4 warps, the fewest instructions a block of scores with nothing spilled
# in that form (benchmarks/RESULTS.md, GPU)
MATMUL = {"lite_triton_matmul_nodrop_bf16": "64x64/4/3", "lite_triton_matmul_compiled_nodrop_bf16": "64x64/4/3"}
# rows whose scaled_dot_product_attention is held to one backend (torch.nn.attention.sdpa_kernel): the dispatcher
# gives XLNet's bias with a gradient to the memory-efficient kernel; cuDNN's (wgmma on Hopper) may take it faster
HELD = {"lite_sdpa_cudnn_nodrop_bf16": SDPBackend.CUDNN_ATTENTION}
# rows whose Dropout draws its mask from random integers on the GPU too (modeling's CHEAP_MASK_DEVICES), as on a CPU
BITS_DROPOUT = {"lite_sdpa_bitsdrop_bf16"}
# the FLOPs of a row are those of the eager row doing the same matmuls (flop_counter sees no fused/compiled kernel):
# flex's q.k is D wide, as the segment-bias row's (the one-hot segment dims make the other SDPA rows' D + 8 on CUDA)
FLOP_TWIN = {
    **bm.EAGER_TWIN,
    "lite_compiled_nodrop_bf16": "lite_sdpa_bf16",
    "lite_flex_bf16": "lite_sdpa_segbias_bf16",
    "lite_flex_compiled_bf16": "lite_sdpa_segbias_bf16",
    **{
        n: "lite_sdpa_segbias_bf16"
        for n in (
            "lite_triton_bf16",
            "lite_triton_nodrop_bf16",
            "lite_triton_compiled_bf16",
            "lite_triton_compiled_nodrop_bf16",
            *MATMUL,
        )
    },
    "lite_sdpa_cudnn_nodrop_bf16": "lite_sdpa_bf16",
    "lite_sdpa_bitsdrop_bf16": "lite_sdpa_bf16",
}


def compiled(name):
    return bm.VARIANTS[DERIVED[name][0] if name in DERIVED else name][3]


def forward_inside(variant, context):
    """The variant with its forward pass run inside `context()`, a fresh context manager each call (the backward runs
    what the forward chose)."""
    inner = variant.forward

    def forward(*args, **kwargs):
        with context():
            return inner(*args, **kwargs)

    variant.forward = forward
    return variant


def segment_as_bias(variant):
    """The variant with the segment term added to the positional bias (as under torch.compile) instead of one-hot
    dims on q and k: SDPA's head size stays D (64 in base, its 64-wide kernels) where the padded dims make it 72."""
    from xlnet_lite import modeling_xlnet_lite as modeling

    return forward_inside(variant, lambda: mock.patch.object(modeling, "segment_dims", lambda seg_keys, d_head: 0))


def held_to(variant, backend):
    """The variant with scaled_dot_product_attention held to one backend (an SDPBackend) in its forward pass (the
    backward runs the kernel the forward chose)."""
    from torch.nn.attention import sdpa_kernel

    return forward_inside(variant, lambda: sdpa_kernel([backend]))


def dropout_by_bits(variant):
    """The variant with Dropout's mask drawn from random integers on every device (the CPU's way) in its forward (the
    backward uses the mask the forward saved)."""
    from xlnet_lite import modeling_xlnet_lite as modeling

    return forward_inside(variant, lambda: mock.patch.object(modeling, "CHEAP_MASK_DEVICES", {"cpu", "cuda"}))


def positional_by_matmul(variant, setting):
    """The variant with the Triton kernels' positional term by one matmul (triton_attention.POSITIONAL "matmul") and
    every kernel at `setting` (ROWSxKEYS/WARPS/STAGES) in its forward and backward passes."""
    from benchmarks.bench_triton_kernels import launch_settings_changed, parse_setting, positional_changed
    from xlnet_lite import triton_attention as ta

    launches = parse_setting(setting)

    class ByMatmul(type(variant)):
        def forward_backward(self):
            table = ta.launch_settings(torch.device(self.device_type), torch.bfloat16)
            with positional_changed("matmul"), launch_settings_changed(table, launches):
                return super().forward_backward()

    variant.__class__ = ByMatmul
    return variant


def refusal(exc):
    """The first line of a held SDPA backend's error ("No available kernel..."), as the JSON's "refused" records
    it."""
    return str(exc).strip().splitlines()[0][:300]


def without_dropout(model):
    """Every dropout of the model at p = 0 (XLNet-Lite's own Dropout and torch's)."""
    from xlnet_lite.modeling_xlnet_lite import Dropout

    for module in model.modules():
        if isinstance(module, (torch.nn.Dropout, Dropout)):
            module.p = 0.0
    model.config.dropout = 0.0
    return model


def build(cfg, names):
    """bench_model's variants on the CPU (same weights, batch and memory); the derived rows built from the same
    model and batch as the variants they change."""
    hf, batch, _, lite_mems, variants = bm.build_variants(cfg, [n for n in names if n not in DERIVED])
    for n in names:
        if n in DERIVED:
            base, attn, segment_bias, no_dropout = DERIVED[n]
            _, _, dtype, is_compiled = bm.VARIANTS[base]
            model = bm.make_lite(hf, attn).train()
            variants[n] = bm.Variant(
                n, without_dropout(model) if no_dropout else model, batch, lite_mems, dtype, is_compiled
            )
            if segment_bias:
                variants[n] = segment_as_bias(variants[n])
            if n in HELD:
                variants[n] = held_to(variants[n], HELD[n])
            if n in MATMUL:
                variants[n] = positional_by_matmul(variants[n], MATMUL[n])
            if n in BITS_DROPOUT:
                variants[n] = dropout_by_bits(variants[n])
    return {n: variants[n] for n in names}


def to_gpu(variant, device):
    """A bench_model variant moved to the GPU, its autocast with it."""
    variant.device_type = device.type
    variant.model.to(device)  # in place: the optimizer keeps the same parameters
    variant.inputs = send_to_device(variant.inputs, device)  # tensors, and the lists of them (mems)
    variant.infer_inputs = {k: v for k, v in variant.inputs.items() if k != "labels"}
    return variant


def cuda_seconds(fn):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1000


def bf16_peak(device, n=8192, reps=10):
    """FLOP/s samples of an n^3 bf16 matmul."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    return [2 * n**3 / cuda_seconds(lambda: a @ b) for _ in range(reps)]


def step_memory(step):
    """Bytes the allocator held at most during step() (a training step) above what it held before it."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def run_config(args, name, device):
    cfg = CONFIGS[name]
    tokens = cfg["batch"] * cfg["seq_len"]
    wanted = set(args.variants or NAMES) | {"hf_bf16"}  # transformers' row is the reference of every ratio
    wanted |= {FLOP_TWIN[n] for n in wanted if n in FLOP_TWIN}  # the eager row whose FLOPs a row is charged
    names = [n for n in NAMES if n in wanted and not (args.no_compile and compiled(n))]
    print(f"\n=== {name}: {cfg}", flush=True)
    peak = bf16_peak(device)
    variants = {n: to_gpu(v, device) for n, v in build(cfg, names).items()}  # built on the CPU, then moved
    first, refused = {}, {}
    for n, v in list(variants.items()):
        t0 = time.perf_counter()
        try:
            v.train_step()
        except RuntimeError as exc:  # a held SDPA backend that cannot take these inputs: set aside, not timed
            if n not in HELD:
                raise
            refused[n] = refusal(exc)
            print(f"  {n} refused: {refused[n]}", flush=True)
            del variants[n]
            continue
        torch.cuda.synchronize()
        first[n] = time.perf_counter() - t0
        print(f"  first training step {n}: {first[n]:.2f} s", flush=True)
    times = bm.alternate(variants, bm.Variant.train_step, args.runs, args.warmup, clock=cuda_seconds)
    flops = {n: bm.count_flops(v.forward_backward) for n, v in variants.items() if n not in FLOP_TWIN}
    memory = {n: step_memory(v.train_step) for n, v in variants.items()}
    peak += bf16_peak(device)
    peak_flops = bm.median(peak)
    rows = {}
    for n in variants:  # in NAMES' order, less any refused
        t = bm.median(times[n])
        f = flops[FLOP_TWIN.get(n, n)]  # a compiled or flex row does its eager twin's FLOPs (the segment bias: its own)
        rows[n] = dict(
            train_median_s=t,
            train_times_s=times[n],
            train_tokens_per_s=tokens / t,
            train_gflop=f / 1e9,
            train_mfu=f / t / peak_flops,
            step_memory_bytes=memory[n],
            first_train_step_s=first[n],
        )
    base = rows["hf_bf16"]
    print(
        f"\n{name}: B {cfg['batch']}, T {cfg['seq_len']}, P {cfg['num_predict']}, mem {cfg['mem_len'] or 0}; "
        f"bf16 peak {peak_flops / 1e12:.0f} TFLOP/s (8192^3)"
    )
    print(f"{'variant':<26} {'train tok/s':>11} {'x hf':>6} {'step GiB':>9} {'x hf':>6} {'MFU':>6} {'1st step':>9}")
    for n, r in rows.items():
        r["train_speedup_vs_hf_bf16"] = base["train_median_s"] / r["train_median_s"]
        r["memory_ratio_vs_hf_bf16"] = r["step_memory_bytes"] / base["step_memory_bytes"]
        print(
            f"{n:<26} {r['train_tokens_per_s']:11.0f} {r['train_speedup_vs_hf_bf16']:6.2f} "
            f"{r['step_memory_bytes'] / 2**30:9.2f} {r['memory_ratio_vs_hf_bf16']:6.2f} "
            f"{100 * r['train_mfu']:5.1f}% {r['first_train_step_s']:8.1f}s",
            flush=True,
        )
    return dict(
        config=cfg,
        tokens_per_step=tokens,
        variants=rows,
        refused=refused,
        bf16_matmul_peak_flops=dict(median=peak_flops, samples=peak),
    )


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_gpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile rows")
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=NAMES,
        metavar="ROW",
        help="the rows to time (default: all); transformers' row and the eager row each row's FLOPs "
        "are counted on come along (the like-for-like dropout-0 SDPA row of a flex row does not: name it). Rows: "
        + ", ".join(NAMES),
    )
    parser.add_argument("--out", default="benchmarks/results/gpu/model.json")
    args = parser.parse_args(argv)
    if args.no_compile and args.variants and all(compiled(n) for n in args.variants):
        parser.error("--no-compile leaves none of the --variants rows (all compiled)")
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device (torch.cuda.is_available() is False); bench_model.py times the CPU")
    if args.runs < 5:
        parser.error("--runs must be >= 5")
    device = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    result = dict(
        command=" ".join(["python"] + sys.argv),
        device=torch.cuda.get_device_name(device),
        environment=environment(),
        torch=torch.__version__,
        cuda=torch.version.cuda,
        runs=args.runs,
        warmup=args.warmup,
        configs={},
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for name in args.config:  # written after each config: a run stopped by a time limit keeps what it measured
        result["configs"][name] = run_config(args, name, device)
        write_json(out, result)  # atomic: a kill while writing keeps the last complete file
        print(f"\nwrote {out}")
    return result


if __name__ == "__main__":
    main()
