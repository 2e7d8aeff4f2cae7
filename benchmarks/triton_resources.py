"""What the fused attention kernels (xlnet_lite.triton_attention) need of a GPU, found without one. One training step
of a two-layer XLNet-Lite with `base`'s attention (12 heads of 64, 512 tokens, a 384-token memory, 85 predicted, XLNet's
factorization masks, two segments) runs on this machine's CPU with the kernels' launches recorded instead of run; each
launch is then compiled by Triton for a CUDA architecture as its JIT compiles it on such a GPU (the same arguments,
specialized alike: what is divisible by 16 is known to be, a 1 is a constant) and assembled by the ptxas Triton ships,
at each launch setting (rows per tile, warps, pipeline stages) and precision. Reports the shared memory a program
needs (Triton refuses to launch past the device's limit: 227 KiB a block on an H100 or H200, 163 KiB on an A100, 99 KiB
on sm_86/89), the registers per thread and the bytes spilled to local memory; and, from the machine code (cuobjdump,
shipped with Triton), what one warp executes in the kernel's innermost loop, one tile of scores a turn: its
instructions, how many are tensor-core matrix multiplies (HMMA, or HGMMA where Triton uses Hopper's warpgroup MMA),
and how many move data (shuffles between threads, shared-memory loads and stores, barriers, global loads, local memory);
and whether ptxas issues the warpgroup MMAs synchronously, each waited for before the next ("serial": its info C7515).

    python -m benchmarks.triton_resources [--arch 90] [--tiles 64 32] [--keys square half double] [--warps 4 8]
                                          [--stages 1 2 3] [--dtypes bf16 fp32]
                                          [--variants dropout block nomask noseg atomic matmul]
                                          [--out FILE]
    python -m benchmarks.triton_resources --defaults [--dtypes bf16] ...   (each kernel at the library's setting)
    python -m benchmarks.triton_resources --settings 128x64/8/3/matmul ...  (bench_triton_kernels' settings)

The step is the pretraining recipe's default: dropout 0, the masks as ranks (MaskRanks, as the model passes
factorization masks); --variants adds a step for each change named (several joined by '+'): dropout 0.1 on the
probabilities, the masks as (B, Q, K) blocks (as the model passes masks of no such form), no mask, no segments, dkr
added up in dq by atomic adds (no dkr kernel), the content stream's positional term as one matmul's product read shifted
(triton_attention.POSITIONAL "matmul": its kernels in the dense form, no dkr kernel).

A check of settings before a GPU is at hand, not a timing: which settings run at all, which spill, and how much of a
tile's work is other than the matrix multiplies.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)  # compile, do not interpret
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton's default, said out loud (3.9 warns otherwise)

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.compiler.compiler import make_backend  # noqa: E402
from triton.runtime.jit import create_function_from_signature  # noqa: E402

from benchmarks.bench_triton_kernels import (  # noqa: E402
    kernels_replaced,
    launch_settings_changed,
    parse_setting,
    positional_changed,
)
from benchmarks.environment import environment  # noqa: E402
from xlnet_lite import triton_attention as ta  # noqa: E402
from xlnet_lite.collator import random_factorization_masks  # noqa: E402
from xlnet_lite.training import write_json  # noqa: E402

TRITON_BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")  # ptxas, cuobjdump
SHARED_LIMIT = {90: 232448, 80: 166912, 86: 101376, 89: 101376}  # bytes of shared memory a block may use
SHAPE = dict(B=2, N=12, T=512, M=384, D=64, P=85)  # `base`'s attention at XLNet's pretraining shapes (B: see below)
CHANGES = ("dropout", "block", "nomask", "noseg", "atomic", "matmul")


def recorded_launches(dtype, settings, variant=None):
    """[(stream, name, kernel, args, kwargs)]: the kernel launches of one training step (forward with labels,
    backward) of a two-layer XLNet-Lite with `base`'s attention (the first layer runs both streams, the last only the
    query stream; each launch kept once) on attn_implementation="xlnet_lite_triton", recorded
    instead of run, at these launch settings ({kernel: triton_attention.Launch}), under bf16 autocast or in fp32. The
    pretraining default (dropout 0, the mask as ranks), changed by `variant`: names of CHANGES joined by '+'. B is 2:
    the batch size is a launch's grid, not its code, but for dkr's outer loop bound (at B 32 Triton would also know
    it divisible by 16)."""
    from xlnet_lite import modeling_xlnet_lite as modeling

    changes = set(variant.split("+")) if variant else set()
    if "atomic" in changes:
        settings = {**settings, "dkr": None}  # no dkr kernel: dq adds dkr up
    B, N, T, M, D, P = (SHAPE[k] for k in "BNTMDP")
    calls = []

    class Recorder:
        def __init__(self, kernel, name):
            self.kernel, self.name = kernel, name

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                stream = "content" if args[0].shape[2] == T else "query"  # qw's rows: T or the P predicted
                if not any(call[:2] == (stream, self.name) for call in calls):  # the second layer's query stream
                    calls.append((stream, self.name, self.kernel, args, kwargs))

            return launch

    config = modeling.XLNetLiteConfig(
        vocab_size=64,
        d_model=N * D,
        n_layer=2,
        n_head=N,
        d_inner=64,
        mem_len=M,
        reuse_len=T // 2,
        dropout=0.1 if "dropout" in changes else 0.0,
    )
    config._attn_implementation = modeling.TRITON_ATTENTION
    model = modeling.XLNetLiteLMHeadModel(config).train()
    perm_mask, target_mapping = random_factorization_masks(B, T, P, seed=0)
    inputs = dict(
        input_ids=torch.randint(0, 64, (B, T)),
        perm_mask=None if "nomask" in changes else perm_mask,
        target_mapping=target_mapping,
        token_type_ids=None if "noseg" in changes else (torch.arange(T) >= T // 2).long().expand(B, -1),
        labels=torch.randint(0, 64, (B, P)),
        mems=[torch.zeros(B, M, N * D)] * 2,
    )
    saved_env = os.environ.get("TRITON_INTERPRET")
    saved_forms = modeling.kernel_forms
    table = ta.launch_settings(torch.device("cpu"), torch.float32)  # what the kernels read on this CPU
    try:
        form = "matmul" if "matmul" in changes else "band"
        with kernels_replaced(Recorder), launch_settings_changed(table, settings), positional_changed(form):
            os.environ["TRITON_INTERPRET"] = "1"  # relative_attention takes CPU tensors only so; nothing is run
            if "block" in changes:  # the forms the data allows, the masks' ranks left out
                modeling.kernel_forms = lambda *args: [
                    None if i % 2 == 0 else x for i, x in enumerate(saved_forms(*args))
                ]
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
                loss = model(**inputs).loss
            loss.backward()
    finally:
        modeling.kernel_forms = saved_forms
        os.environ.pop("TRITON_INTERPRET", None)
        if saved_env is not None:
            os.environ["TRITON_INTERPRET"] = saved_env
    return calls


def compile_launch(kernel, args, kwargs, arch):
    """The launch compiled as Triton's JIT compiles it on a GPU of this architecture: its arguments bound and
    specialized (divisibility by 16, ones) by Triton's own binder (a private API of Triton 3.x)."""
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound_args, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound_args, specialization, options)
    return triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=target, options=options.__dict__)


def ptxas(ptx, arch):
    """Registers and spill bytes per thread, by `ptxas -v` on the PTX, and why ptxas issues the kernel's warpgroup MMAs
    synchronously (each waited for before the next), where it does."""
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    gpu = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"
    for name in ("ptxas", "ptxas-blackwell"):  # the second takes the newer PTX versions some Triton builds emit
        binary = os.path.join(TRITON_BIN, name)
        out = subprocess.run(
            [binary, "-v", "--gpu-name", gpu, f.name, "-o", os.devnull], capture_output=True, text=True
        )
        if out.returncode == 0:
            break
    os.unlink(f.name)
    text = out.stdout + out.stderr
    number = lambda pattern: int(m.group(1)) if (m := re.search(pattern, text)) else None  # noqa: E731
    serialized = re.search(r"wgmma.mma_async instructions are serialized due to (.*?) in the function", text)
    return dict(
        registers=number(r"Used (\d+) registers"),
        spill_stores=number(r"(\d+) bytes spill stores"),
        spill_loads=number(r"(\d+) bytes spill loads"),
        wgmma_serialized=serialized.group(1) if serialized else None,  # ptxas' reason (its info C7515), or None
        ptxas_returncode=out.returncode,
    )


# SASS opcodes by what they do, for the loop's instruction mix
MIX = {
    "mma": ("HMMA", "HGMMA"),
    "shuffles": ("SHFL",),
    "shared": ("LDS", "LDSM", "STS", "STSM"),
    "barriers": ("BAR",),
    "global_loads": ("LDG", "LDGSTS"),
    "spills": ("LDL", "STL"),
    "special": ("MUFU",),
}


def innermost_loop(sass):
    """The instruction mix of the innermost loop holding a matrix multiply in cuobjdump's SASS (a backward branch
    closes a loop; the smallest such span with an MMA): {'instructions': n, 'mma': n, 'shuffles': n, ...}, or None."""
    code = []
    for line in sass.splitlines():
        if m := re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)(.*?);", line):
            code.append((int(m.group(1), 16), m.group(2), m.group(3)))
    loops = []
    for address, opcode, operands in code:
        if opcode == "BRA" and (m := re.search(r"0x([0-9a-f]+)", operands)) and int(m.group(1), 16) < address:
            body = [op for a, op, _ in code if int(m.group(1), 16) <= a <= address]
            if any(op in MIX["mma"] for op in body):
                loops.append(body)
    if not loops:
        return None
    body = min(loops, key=len)
    return dict(instructions=len(body), **{kind: sum(op in ops for op in body) for kind, ops in MIX.items()})


def mma_layouts(ttgir):
    """How the kernel's tensor-core layouts share a tile among the warps, from Triton's GPU IR: one
    "v<MMA version> <warps along rows>x<warps along columns>" per distinct layout, e.g. "v2 1x4" (mma.sync, four warps
    side by side along the keys: a row's softmax is reduced across warps and the probabilities pass through shared
    memory to reach the next product, as in FlashAttention 1) or "v3 4x1" (warpgroup MMA, each warp 16 whole rows,
    as in FlashAttention 2)."""
    layouts = re.findall(r"nvidia_mma<\{versionMajor = (\d+).*?warpsPerCTA = \[(\d+), (\d+)\]", ttgir)
    return sorted({f"v{version} {rows}x{columns}" for version, rows, columns in layouts})


def measure(compiled, arch):
    return dict(
        shared_bytes=compiled.metadata.shared,
        **ptxas(compiled.asm["ptx"], arch),
        mma_layouts=mma_layouts(compiled.asm["ttgir"]),
        loop=innermost_loop(cuobjdump(compiled.asm["cubin"])),
    )


def cuobjdump(cubin):
    """The SASS of a compiled kernel, by the cuobjdump Triton ships."""
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin", delete=False) as f:
        f.write(cubin)
    out = subprocess.run([os.path.join(TRITON_BIN, "cuobjdump"), "-sass", f.name], capture_output=True, text=True)
    os.unlink(f.name)
    return out.stdout


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability x 10 (90: H100, H200)")
    parser.add_argument("--tiles", type=int, nargs="+", default=[64, 32], help="rows per tile")
    parser.add_argument(
        "--keys",
        nargs="+",
        choices=["square", "half", "double"],
        default=["square"],
        help="keys per tile of the forward, dk/dv and dq: the rows (square) or half as many (dkr's tile: the keys); "
        "double: dk/dv at TILE rows by 2 TILE keys (held keys by rows), the forward and dq at 2 TILE rows by TILE "
        "keys, dkr at TILE",
    )
    parser.add_argument("--warps", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--stages", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--dtypes", nargs="+", choices=["bf16", "fp32"], default=["bf16", "fp32"])
    parser.add_argument(
        "--defaults",
        action="store_true",
        help="Each kernel at the library's own CUDA setting for the precision (triton_attention.LAUNCH) instead of "
        "--tiles x --warps x --stages (dkr at one stage).",
    )
    parser.add_argument(
        "--settings",
        nargs="+",
        help="Instead of --tiles x --keys x --warps x --stages, these settings in bench_triton_kernels' form "
        "ROWSxKEYS/WARPS/STAGES[/atomic|/matmul] (dkr at one stage); /matmul runs each variant with the positional "
        "term by one matmul.",
    )
    parser.add_argument(
        "--variants",
        nargs="*",
        default=[],
        help=f"Also these changes, each alone: {', '.join(CHANGES)}, or several joined by '+' (dropout+block).",
    )
    parser.add_argument("--out", default="benchmarks/results/gpu/triton_resources_sm90.json")
    args = parser.parse_args(argv)
    for variant in args.variants:
        if not set(variant.split("+")) <= set(CHANGES):
            parser.error(f"--variants: {variant!r} is not one of {', '.join(CHANGES)} or several joined by '+'")
    texts = args.settings or [
        f"{tile}x{dict(square=tile, half=tile // 2, double=2 * tile)[keys]}/{warps}/{stages}"
        for tile, keys, warps, stages in itertools.product(args.tiles, args.keys, args.warps, args.stages)
    ]
    tables = []  # ({kernel: Launch}, the change every step of it makes): dkr at one stage
    for text in texts:
        try:
            settings = parse_setting(text)
        except ValueError as error:
            parser.error(f"{'--settings' if args.settings else '--tiles, --keys, --warps, --stages'}: {error}")
        dkr = settings["dkr"] and settings["dkr"]._replace(stages=1)
        tables.append(({**settings, "dkr": dkr}, "matmul" if text.endswith("/matmul") else None))
    limit = SHARED_LIMIT.get(args.arch)
    rows = []
    print(
        f"{'dtype':<5} {'stream':<7} {'kernel':<8} {'variant':<14} {'tile':>6} {'warps':>5} {'stages':>6} "
        f"{'shared KiB':>10} {'fits':>5} {'regs':>5} {'spill st':>8} {'spill ld':>8} | loop: {'instr':>5} "
        f"{'mma':>4} {'shfl':>4} {'smem':>4} {'bar':>4} {'ldg':>4} {'local':>5} | serial | warps (rows x keys)"
    )

    def launch_tables(dtype):
        if args.defaults:
            yield dict(ta.LAUNCH["cuda" if dtype == "bf16" else "cuda_fp32"]), None
            return
        yield from tables

    def with_change(variant, change):
        """The variant with the setting's change too (None: the variant)."""
        if change is None or change in (variant or "").split("+"):
            return variant or change
        return f"{variant}+{change}" if variant else change

    for dtype in args.dtypes:
        for settings, change in list(launch_tables(dtype)):
            variants = dict.fromkeys(with_change(variant, change) for variant in [None, *args.variants])
            for variant in variants:  # each once: a /matmul setting's "matmul" is its first step
                for stream, name, kernel, launch_args, launch_kwargs in recorded_launches(dtype, settings, variant):
                    # as the operators launched it (the settings asked for, if they read them right)
                    tile = launch_kwargs["BLOCK_M" if "BLOCK_M" in launch_kwargs else "BLOCK"]
                    keys = launch_kwargs.get("BLOCK_N", tile)
                    warps, stages = launch_kwargs["num_warps"], launch_kwargs["num_stages"]
                    row = dict(
                        dtype=dtype,
                        stream=stream,
                        kernel=name,
                        variant=variant,
                        tile=tile,
                        keys=keys,
                        warps=warps,
                        stages=stages,
                        **measure(compile_launch(kernel, launch_args, launch_kwargs, args.arch), args.arch),
                    )
                    row["fits"] = None if limit is None else row["shared_bytes"] <= limit
                    rows.append(row)
                    loop = row["loop"] or dict.fromkeys(("instructions", *MIX), "-")
                    print(
                        f"{dtype:<5} {stream:<7} {name:<8} {variant or '':<14} {f'{tile}x{keys}':>6} {warps:>5} "
                        f"{stages:>6} "
                        f"{row['shared_bytes'] / 1024:10.1f} {str(row['fits']):>5} {row['registers']!s:>5} "
                        f"{row['spill_stores']!s:>8} {row['spill_loads']!s:>8} |       {loop['instructions']:>5} "
                        f"{loop['mma']:>4} {loop['shuffles']:>4} {loop['shared']:>4} {loop['barriers']:>4} "
                        f"{loop['global_loads']:>4} {loop['spills']:>5} | "
                        f"{'yes' if row['wgmma_serialized'] else 'no':>6} | {', '.join(row['mma_layouts'])}",
                        flush=True,
                    )
    command = "python -m benchmarks.triton_resources " + " ".join(sys.argv[1:] if argv is None else argv)
    write_json(
        args.out,
        dict(
            command=command,
            environment=environment(),
            triton=triton.__version__,
            arch=args.arch,
            shared_limit_bytes=limit,
            rows=rows,
        ),
    )


if __name__ == "__main__":
    main()
