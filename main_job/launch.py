"""Where scripts/main_job.sh runs its recipes: one process on the GPU where torch sees one, else on the CPU with
`--threads` threads. Prints the `accelerate launch` prefix on one line (no argument holds a space); on a CPU without
AMX or AVX512-BF16 it also prints, on stderr, what the job's timed budget buys there.

    python -m main_job.launch [--cpu] [--threads 2] [--timed]

The precision is the recipes' own (`--mixed_precision auto`: bf16 on a GPU that supports it and on a CPU with bf16
units, else fp32), so the launcher is given none. `--cpu` keeps the job on the CPU where a GPU is.
"""

from __future__ import annotations

import argparse
import sys

SLOW_CPU_NOTE = (
    "main_job.sh: note: this CPU has no AMX or AVX512-BF16, so the job runs in fp32: about 30 minutes on 2 cores, "
    "and 10 minutes of pretraining reach about 1.2M tokens there, short of the ~1.5M where pretraining starts to pay "
    'on this task (benchmarks/RESULTS.md, "CPU without bf16 units"); --pretraining_steps 3060 takes the README\'s '
    "run's 6.3M tokens (about 50 minutes of fp32 steps there)"
)


def launch_prefix(*, gpu: bool, threads: int) -> list[str]:
    """The `accelerate launch` arguments before a recipe's path: one process, no dynamo, on the GPU or on the CPU."""
    if gpu:
        return ["accelerate", "launch", "--num_processes", "1", "--num_machines", "1", "--dynamo_backend", "no"]
    return [
        "accelerate", "launch", "--cpu", "--num_processes", "1", "--num_machines", "1",
        "--num_cpu_threads_per_process", str(threads), "--dynamo_backend", "no",
    ]  # fmt: skip


def main(argv=None) -> list[str]:
    parser = argparse.ArgumentParser(prog="python -m main_job.launch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="Run on the CPU even where a GPU is.")
    parser.add_argument("--threads", type=int, default=2, help="The CPU threads of a CPU run.")
    parser.add_argument("--timed", action="store_true", help="The pretraining is a timed budget (the note's case).")
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error(f"--threads must be at least 1, got {args.threads}")
    import torch

    from xlnet_lite.precision import fast_bf16

    gpu = not args.cpu and torch.cuda.is_available()
    if not gpu and args.timed and not fast_bf16("cpu")[0]:
        print(SLOW_CPU_NOTE, file=sys.stderr)
    prefix = launch_prefix(gpu=gpu, threads=args.threads)
    print(" ".join(prefix))
    return prefix


if __name__ == "__main__":
    main()
