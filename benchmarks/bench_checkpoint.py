"""What a checkpoint's manifest costs: the recipes' checkpoint (accelerate's state: model, optimizer, scheduler, RNG;
the trainer state) written with `xlnet_lite.training.Checkpoints.save`, and the manifest (xxh3-128, and sha256 beside
it) of the same folder timed on its own, per model preset, medians of --runs writes.

    python -m benchmarks.bench_checkpoint [--presets small base] [--runs 5] [--out benchmarks/results/checkpoint.json]

Goal: the manifest adds < 10% to a checkpoint's write time. The checkpoints go to a temporary folder on the disk
that holds --dir (default: the system's temporary folder).
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from accelerate import Accelerator

import xlnet_lite
from benchmarks.environment import environment
from xlnet_lite.integrity import ALGORITHM, file_digest, folder_size, write_manifest
from xlnet_lite.model_utils import MODEL_PRESETS
from xlnet_lite.training import Checkpoints, write_json


def measure(preset: str, runs: int, root: Path) -> dict:
    model = xlnet_lite.XLNetLiteLMHeadModel(xlnet_lite.XLNetLiteConfig(**MODEL_PRESETS[preset], vocab_size=8000))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randint(0, 8000, (2, 16)), labels=torch.randint(0, 8000, (2, 16))).loss.backward()
    optimizer.step()  # the optimizer state exists, as in a real checkpoint
    accelerator = Accelerator(cpu=True)
    model, optimizer = accelerator.prepare(model, optimizer)
    checkpoints = Checkpoints(accelerator, root / preset, save_total_limit=1)
    saves, manifests, sha256 = [], [], []
    for step in range(1, runs + 1):
        start = time.perf_counter()
        path = checkpoints.save(step, trainer_state={"step": step}, rank_state={})
        saves.append(time.perf_counter() - start)
        start = time.perf_counter()
        write_manifest(path)  # the same work again, timed alone
        manifests.append(time.perf_counter() - start)
        start = time.perf_counter()
        for file in path.rglob("*"):
            if file.is_file():
                file_digest(file, "sha256")
        sha256.append(time.perf_counter() - start)
    save, manifest, slow = statistics.median(saves), statistics.median(manifests), statistics.median(sha256)
    without = save - manifest  # the checkpoint without its manifest
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "checkpoint_bytes": folder_size(path),
        "algorithm": ALGORITHM,
        "save_seconds_median": round(save, 4),
        "manifest_seconds_median": round(manifest, 4),
        "manifest_share_of_save": round(manifest / without, 4),
        "sha256_seconds_median": round(slow, 4),
        "sha256_share_of_save": round(slow / without, 4),
        "save_seconds": saves,
        "manifest_seconds": manifests,
        "sha256_seconds": sha256,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=["small", "base"], choices=sorted(MODEL_PRESETS))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--dir", default=None, help="Write the checkpoints under this folder (a temporary one inside).")
    parser.add_argument("--out", default="benchmarks/results/checkpoint.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        rows = {preset: measure(preset, args.runs, Path(tmp)) for preset in args.presets}
    for preset, row in rows.items():
        print(
            f"{preset}: {row['checkpoint_bytes'] / 2**20:,.0f} MB, save {row['save_seconds_median']:.3f} s (manifest "
            f"included), manifest {row['manifest_seconds_median']:.3f} s = {row['manifest_share_of_save']:.1%} more "
            f"(sha256 would be {row['sha256_share_of_save']:.1%})"
        )
    results = {
        "command": "python -m benchmarks.bench_checkpoint " + " ".join(sys.argv[1:] if argv is None else argv),
        "environment": environment(),
        "presets": rows,
    }
    write_json(args.out, results)
    return results


if __name__ == "__main__":
    main()
