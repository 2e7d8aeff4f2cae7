"""What the fused attention kernels (xlnet_lite.triton_attention) need of a GPU, found without one: each kernel
compiled by Triton for a CUDA architecture on this machine, then assembled by the ptxas that Triton ships, for each
launch setting (rows per tile, warps, pipeline stages) and precision, with every term on (banded positional term,
segments, mask, dropout; `base`'s head size 64). Reports the shared memory a program needs (Triton refuses to launch
past the device's limit: 227 KiB a block on an H100 or H200, 163 KiB on an A100, 99 KiB on sm_86/89), the registers
per thread and the bytes spilled to local memory; and, from the machine code (cuobjdump, shipped with Triton), what
one warp executes in the kernel's innermost loop, one tile of scores a turn: its instructions, how many are tensor-core
matrix multiplies (HMMA, or HGMMA where Triton uses Hopper's warpgroup MMA), and how many move data between threads or
memories (shuffles, shared-memory loads and stores, barriers, global loads, local-memory spills).

    python -m benchmarks.triton_resources [--arch 90] [--tiles 64 32] [--warps 4 8] [--stages 1 2 3]
                                          [--variants dropout mask seg band ranked dropout+ranked] [--out FILE]

--variants compiles the kernels once more for each change named: a term off (dropout, the mask, the segment term,
the banded positional term: the dense one instead), or the mask as ranks (MaskRanks: two vectors a tile instead of a
block of the mask), several joined by '+': what each term costs the loop.

A check of settings before a GPU is at hand, not a timing: which settings run at all, which spill, and how much of
a tile's work is other than the matrix multiplies.
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

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from benchmarks.environment import environment  # noqa: E402
from xlnet_lite import triton_attention as ta  # noqa: E402
from xlnet_lite.training import write_json  # noqa: E402

SHARED_LIMIT = {90: 232448, 80: 166912, 86: 101376, 89: 101376}  # bytes of shared memory a block may use
FP32_POINTERS = {"GAIN", "LSE", "DELTA", "DGAIN", "DKR"}
INT64_POINTERS = {"SEGQ", "SEGK", "SEED"}
SCALARS = {"B", "N", "Q", "K", "R", "D"}


def signature(kernel, dtype, ranked=False):
    """Triton's argument types: tensors in the model's precision, fp32 statistics, int64 ids, the mask uint8 (or int32
    ranks)."""
    types = {}
    for param in kernel.params:
        name = param.name
        if param.is_constexpr:
            types[name] = "constexpr"
        elif name == "DROP_P":
            types[name] = "fp32"
        elif name in FP32_POINTERS:
            types[name] = "*fp32"
        elif name in INT64_POINTERS:
            types[name] = "*i64"
        elif name == "BLK":
            types[name] = "*i32" if ranked else "*u8"
        elif name.isupper() and name not in SCALARS:
            types[name] = f"*{dtype}"
        else:
            types[name] = "i32"
    return types


TERMS = {"dropout": "HAS_DROPOUT", "mask": "HAS_MASK", "seg": "HAS_SEG", "band": "BAND"}
VARIANTS = [*TERMS, "ranked"]  # a term off, or the mask as ranks (MaskRanks) instead of a uint8 block


def kernels(tile, dtype, variant=None):
    """(name, kernel, compile-time constants) of the four kernels with every term on, changed by `variant`: names
    of VARIANTS joined by '+' (without the band the positional term is the dense one and there is no dkr kernel)."""
    changes = set(variant.split("+")) if variant else set()
    flags = dict(HAS_SEG=True, HAS_MASK=True, RANKED="ranked" in changes, PREC="ieee" if dtype == "fp32" else "tf32")
    flags["HAS_DROPOUT"] = True
    for term in changes & {"dropout", "mask", "seg"}:
        flags[TERMS[term]] = False
    tiles = dict(BLOCK_M=tile, BLOCK_N=tile, BLOCK_D=64, BAND="band" not in changes, **flags)
    chosen = [
        ("forward", ta._attn_fwd, tiles),
        ("dk_dv", ta._attn_bwd_dkdv, tiles),
        ("dq", ta._attn_bwd_dq, tiles),
    ]
    if "band" not in changes:
        chosen.append(("dkr", ta._attn_bwd_dkr, dict(BLOCK=tile, BLOCK_D=64, **flags)))
    return chosen


def ptxas(ptx, arch):
    """Registers and spill bytes per thread, by `ptxas -v` on the PTX."""
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    gpu = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"
    for name in ("ptxas", "ptxas-blackwell"):  # the second takes the newer PTX versions some Triton builds emit
        binary = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
        out = subprocess.run(
            [binary, "-v", "--gpu-name", gpu, f.name, "-o", os.devnull], capture_output=True, text=True
        )
        if out.returncode == 0:
            break
    os.unlink(f.name)
    text = out.stdout + out.stderr
    number = lambda pattern: int(m.group(1)) if (m := re.search(pattern, text)) else None  # noqa: E731
    return dict(
        registers=number(r"Used (\d+) registers"),
        spill_stores=number(r"(\d+) bytes spill stores"),
        spill_loads=number(r"(\d+) bytes spill loads"),
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


def measure(kernel, dtype, constants, arch, warps, stages):
    source = ASTSource(kernel, signature(kernel, dtype, constants["RANKED"]), constexprs=constants)
    compiled = triton.compile(
        source, target=GPUTarget("cuda", arch, 32), options=dict(num_warps=warps, num_stages=stages)
    )
    return dict(
        shared_bytes=compiled.metadata.shared,
        **ptxas(compiled.asm["ptx"], arch),
        loop=innermost_loop(cuobjdump(compiled.asm["cubin"])),
    )


def cuobjdump(cubin):
    """The SASS of a compiled kernel, by the cuobjdump Triton ships."""
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin", delete=False) as f:
        f.write(cubin)
    binary = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    out = subprocess.run([binary, "-sass", f.name], capture_output=True, text=True)
    os.unlink(f.name)
    return out.stdout


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability x 10 (90: H100, H200)")
    parser.add_argument("--tiles", type=int, nargs="+", default=[64, 32])
    parser.add_argument("--warps", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--stages", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--dtypes", nargs="+", choices=["bf16", "fp32"], default=["bf16", "fp32"])
    parser.add_argument(
        "--variants",
        nargs="*",
        default=[],
        help=f"Also these changes, each alone: {', '.join(VARIANTS)}, or several joined by '+' (dropout+ranked).",
    )
    parser.add_argument("--out", default="benchmarks/results/gpu/triton_resources_sm90.json")
    args = parser.parse_args(argv)
    for variant in args.variants:
        if not set(variant.split("+")) <= set(VARIANTS):
            parser.error(f"--variants: {variant!r} is not one of {', '.join(VARIANTS)} or several joined by '+'")
    limit = SHARED_LIMIT.get(args.arch)
    rows = []
    print(
        f"{'dtype':<5} {'kernel':<8} {'variant':<14} {'tile':>4} {'warps':>5} {'stages':>6} {'shared KiB':>10} "
        f"{'fits':>5} {'regs':>5} {'spill st':>8} {'spill ld':>8} | loop: {'instr':>5} {'mma':>4} {'shfl':>4} "
        f"{'smem':>4} {'bar':>4} {'ldg':>4} {'spill':>5}"
    )
    settings = itertools.product(args.dtypes, args.tiles, args.warps, args.stages, [None, *args.variants])
    for dtype, tile, warps, stages, variant in settings:
        for name, kernel, constants in kernels(tile, dtype, variant):
            row = dict(
                dtype=dtype,
                kernel=name,
                variant=variant,
                tile=tile,
                warps=warps,
                stages=stages,
                **measure(kernel, dtype, constants, args.arch, warps, stages),
            )
            row["fits"] = None if limit is None else row["shared_bytes"] <= limit
            rows.append(row)
            loop = row["loop"] or dict.fromkeys(("instructions", *MIX), "-")
            print(
                f"{dtype:<5} {name:<8} {variant or '':<14} {tile:>4} {warps:>5} {stages:>6} "
                f"{row['shared_bytes'] / 1024:10.1f} {str(row['fits']):>5} {row['registers']!s:>5} "
                f"{row['spill_stores']!s:>8} {row['spill_loads']!s:>8} |       {loop['instructions']:>5} "
                f"{loop['mma']:>4} {loop['shuffles']:>4} {loop['shared']:>4} {loop['barriers']:>4} "
                f"{loop['global_loads']:>4} {loop['spills']:>5}",
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
