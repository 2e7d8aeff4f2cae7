"""What the fused attention kernels (xlnet_lite.triton_attention) need of a GPU, found without one: each kernel
compiled by Triton for a CUDA architecture on this machine, then assembled by the ptxas that Triton ships, for each
launch setting (rows per tile, warps, pipeline stages) and precision, with every term on (banded positional term,
segments, mask, dropout; `base`'s head size 64). Reports the shared memory a program needs (Triton refuses to launch
past the device's limit: 227 KiB a block on an H100 or H200, 163 KiB on an A100, 99 KiB on sm_86/89), the registers
per thread and the bytes spilled to local memory.

    python -m benchmarks.triton_resources [--arch 90] [--tiles 64 32] [--warps 4 8] [--stages 1 2 3]
                                          [--out benchmarks/results/gpu/triton_resources_sm90.json]

A check of settings before a GPU is at hand, not a timing: which settings run at all, and which spill.
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


def signature(kernel, dtype):
    """Triton's argument types: tensors in the model's precision, fp32 statistics, int64 ids, uint8 mask."""
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
            types[name] = "*u8"
        elif name.isupper() and name not in SCALARS:
            types[name] = f"*{dtype}"
        else:
            types[name] = "i32"
    return types


def kernels(tile, dtype):
    """(name, kernel, compile-time constants) of the four kernels with every term on."""
    flags = dict(HAS_SEG=True, HAS_MASK=True, PREC="ieee" if dtype == "fp32" else "tf32", HAS_DROPOUT=True)
    tiles = dict(BLOCK_M=tile, BLOCK_N=tile, BLOCK_D=64, BAND=True, **flags)
    return [
        ("forward", ta._attn_fwd, tiles),
        ("dk_dv", ta._attn_bwd_dkdv, tiles),
        ("dq", ta._attn_bwd_dq, tiles),
        ("dkr", ta._attn_bwd_dkr, dict(BLOCK=tile, BLOCK_D=64, **flags)),
    ]


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


def measure(kernel, dtype, constants, arch, warps, stages):
    source = ASTSource(kernel, signature(kernel, dtype), constexprs=constants)
    compiled = triton.compile(
        source, target=GPUTarget("cuda", arch, 32), options=dict(num_warps=warps, num_stages=stages)
    )
    return dict(shared_bytes=compiled.metadata.shared, **ptxas(compiled.asm["ptx"], arch))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability x 10 (90: H100, H200)")
    parser.add_argument("--tiles", type=int, nargs="+", default=[64, 32])
    parser.add_argument("--warps", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--stages", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--dtypes", nargs="+", choices=["bf16", "fp32"], default=["bf16", "fp32"])
    parser.add_argument("--out", default="benchmarks/results/gpu/triton_resources_sm90.json")
    args = parser.parse_args(argv)
    limit = SHARED_LIMIT.get(args.arch)
    rows = []
    print(
        f"{'dtype':<5} {'kernel':<8} {'tile':>4} {'warps':>5} {'stages':>6} {'shared KiB':>10} {'fits':>5} "
        f"{'regs':>5} {'spill st':>8} {'spill ld':>8}"
    )
    for dtype, tile, warps, stages in itertools.product(args.dtypes, args.tiles, args.warps, args.stages):
        for name, kernel, constants in kernels(tile, dtype):
            row = dict(
                dtype=dtype,
                kernel=name,
                tile=tile,
                warps=warps,
                stages=stages,
                **measure(kernel, dtype, constants, args.arch, warps, stages),
            )
            row["fits"] = None if limit is None else row["shared_bytes"] <= limit
            rows.append(row)
            print(
                f"{dtype:<5} {name:<8} {tile:>4} {warps:>5} {stages:>6} {row['shared_bytes'] / 1024:10.1f} "
                f"{str(row['fits']):>5} {row['registers']!s:>5} {row['spill_stores']!s:>8} "
                f"{row['spill_loads']!s:>8}",
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
