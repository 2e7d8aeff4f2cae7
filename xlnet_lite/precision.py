"""`--mixed_precision auto`: bf16 where the hardware runs it fast, fp32 elsewhere; an explicit choice wins.

On CPUs bf16 is fast only with AMX or AVX512-BF16 units (about twice fp32's speed); a CPU without them emulates bf16
many times slower than fp32 (benchmarks/RESULTS.md). On CUDA, bf16 where the GPU supports it.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

PRECISIONS = ("auto", "no", "bf16", "fp16")


def cpu_bf16_units() -> list[str]:
    """The bf16 matmul units of this CPU (AMX, AVX512-BF16), as torch sees them."""
    return [
        name
        for name, has in (
            ("AMX", torch.cpu._is_amx_tile_supported()),
            ("AVX512-BF16", torch.cpu._is_avx512_bf16_supported()),
        )
        if has
    ]


def fast_bf16(device_type: str) -> tuple[bool, str]:
    """Whether bf16 runs fast on this kind of device, and why."""
    if device_type == "cuda":
        ok = torch.cuda.is_bf16_supported()
        return ok, f"{torch.cuda.get_device_name()} {'supports' if ok else 'does not support'} bf16"
    if device_type == "cpu":
        units = cpu_bf16_units()
        if units:
            return True, f"this CPU has {' and '.join(units)}"
        return False, f"this CPU ({torch.backends.cpu.get_cpu_capability()}) has no AMX or AVX512-BF16"
    return False, f"no bf16 rule for {device_type} devices"


def launcher_precision() -> str | None:
    """The precision `accelerate launch` was given (its --mixed_precision or its config file), or None when it was
    left unset. accelerate passes an unset precision on as "no", the same as an explicit `--mixed_precision no`; the
    two are told apart by the launcher's command line (the parent process's, on Linux)."""
    value = os.environ.get("ACCELERATE_MIXED_PRECISION")
    if value is None or value != "no":
        return value
    try:
        parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    return "no" if any(arg.startswith(b"--mixed_precision") for arg in parent) else None


def launch_device_type() -> str:
    """The kind of device accelerate will train on, read before the Accelerator exists: "cuda" when a GPU is visible
    and the launcher did not ask for the CPU (ACCELERATE_USE_CPU), else "cpu". (Building accelerate's PartialState
    this early would fix its distributed setup before the Accelerator reads its own flags.)"""
    from accelerate.utils import parse_flag_from_env

    return "cuda" if torch.cuda.is_available() and not parse_flag_from_env("ACCELERATE_USE_CPU") else "cpu"


def resolve_precision(requested: str | None, device_type: str) -> tuple[str, str]:
    """(precision, why) for the Accelerator: the recipe's --mixed_precision when it is not auto, else the one given
    to `accelerate launch`, else bf16 where it is fast on `device_type` and "no" (fp32) elsewhere."""
    if requested not in (None, "auto"):
        return requested, f"--mixed_precision {requested}"
    launched = launcher_precision()
    if launched is not None:
        return launched, f"accelerate launch --mixed_precision {launched}"
    ok, why = fast_bf16(device_type)
    return ("bf16" if ok else "no"), f"auto: {why}"
