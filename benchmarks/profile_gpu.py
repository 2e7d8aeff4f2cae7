"""Where a GPU training step's time goes: torch.profiler over bench_gpu's training steps, CUDA kernels by total time.

    python -m benchmarks.profile_gpu [--config base] [--variant lite_sdpa_bf16] [--steps 3] [--shapes] [--out FILE]

The variant is built and moved to the GPU as benchmarks/bench_gpu.py does (same weights, batch and memory); after
--steps warm-up steps, --steps steps are profiled and the kernels' table (sorted by CUDA time) is printed and, with
--out, written; --shapes adds the ops by their input shapes (which of the step's `aten::copy_` is which). Not a test.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks import bench_gpu


def tables(prof, rows, *, shapes=False):
    """The profile's ops by device time; with `shapes`, then again by op and input shapes."""
    table = prof.key_averages().table(sort_by="device_time_total", row_limit=rows, max_name_column_width=70)
    if shapes:
        by_shape = prof.key_averages(group_by_input_shape=True).table(
            sort_by="device_time_total", row_limit=rows, max_name_column_width=40, max_shapes_column_width=90
        )
        table += "\nby op and input shapes\n" + by_shape
    return table


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_gpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", choices=list(bench_gpu.CONFIGS), default="base")
    parser.add_argument("--variant", choices=bench_gpu.NAMES, default="lite_sdpa_bf16")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rows", type=int, default=30)
    parser.add_argument("--shapes", action="store_true", help="also the ops by input shape (shapes recorded)")
    parser.add_argument("--out", help="also write the table to this file")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device (torch.cuda.is_available() is False)")
    torch.backends.cuda.matmul.allow_tf32 = True
    device = torch.device("cuda")
    variant = bench_gpu.to_gpu(bench_gpu.build(bench_gpu.CONFIGS[args.config], [args.variant])[args.variant], device)
    for _ in range(args.steps):
        variant.train_step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=args.shapes) as prof:
        for _ in range(args.steps):
            variant.train_step()
        torch.cuda.synchronize()
    table = tables(prof, args.rows, shapes=args.shapes)
    header = f"{args.variant} on {args.config} ({torch.cuda.get_device_name(device)}), {args.steps} training steps\n"
    print(header + table)
    if args.out:
        Path(args.out).write_text(header + table)


if __name__ == "__main__":
    main()
