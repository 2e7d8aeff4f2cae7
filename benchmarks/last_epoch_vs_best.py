"""How much keeping the best epoch on validation buys over keeping the last one, from the validation curves that
benchmarks.bench_newsgroups records (one accuracy per epoch for every finetuning run).

    python -m benchmarks.last_epoch_vs_best benchmarks/results/newsgroups_*50pc_8ep*.json \
        [--out benchmarks/results/last_epoch_vs_best.json]

A run that appears in several files (the same command) counts once; `--finetune_flags "--num_train_epochs 8"
--learning_rate 3e-4` keeps one protocol's runs. For each run: best − last validation accuracy,
and best − epoch k for every k, so a shorter schedule's cost can be read off too (within the same schedule: a run
stopped at epoch k would have decayed its learning rate sooner).
"""

import argparse
import json
import statistics
import sys
from pathlib import Path


def runs_with_curves(paths, *, flags=None, learning_rate=None):
    """{command: run} over the files' runs that scored every epoch on validation (with these finetuning flags and
    learning rate, where given)."""
    runs = {}
    for path in paths:
        for run in json.loads(Path(path).read_text()).get("runs", []):
            curve = run.get("validation_curve")
            if not curve or None in curve:  # --eval_strategy no scores only the last epoch
                continue
            if (flags is not None and run.get("finetune_flags") != flags) or (
                learning_rate is not None and run.get("learning_rate") != learning_rate
            ):
                continue
            runs.setdefault(run["command"], {**run, "file": Path(path).name})
    return runs


def summary(runs) -> dict:
    curves = [r["validation_curve"] for r in runs]
    epochs = min(len(c) for c in curves)
    gaps = [max(c) - c[-1] for c in curves]
    by_epoch = {k + 1: [max(c) - c[k] for c in curves] for k in range(epochs)}
    return {
        "runs": len(curves),
        "best_minus_last": {"mean": statistics.mean(gaps), "max": max(gaps), "last_is_best": sum(g == 0 for g in gaps)},
        "best_minus_epoch_mean": {k: statistics.mean(v) for k, v in by_epoch.items()},
        "best_epoch_counts": {
            e: sum(r["best_epoch"] == e for r in runs) for e in sorted({r["best_epoch"] for r in runs})
        },
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", help="benchmarks.bench_newsgroups result files")
    parser.add_argument("--finetune_flags", help="only runs with exactly these finetuning flags")
    parser.add_argument("--learning_rate", type=float, help="only runs at this finetuning learning rate")
    parser.add_argument("--out", help="write the summary here as JSON")
    args = parser.parse_args(argv)
    missing = [f for f in args.files if not Path(f).is_file()]
    if missing:
        parser.exit(2, f"last_epoch_vs_best: error: no such file {missing[0]}\n")
    runs = list(runs_with_curves(args.files, flags=args.finetune_flags, learning_rate=args.learning_rate).values())
    if not runs:
        parser.exit(2, "last_epoch_vs_best: error: no run with a validation curve in these files\n")
    report = {
        "files": sorted({r["file"] for r in runs}),
        "finetune_flags": args.finetune_flags,
        "learning_rate": args.learning_rate,
        "all": summary(runs),
        "by_arm": {arm: summary([r for r in runs if r["arm"] == arm]) for arm in sorted({r["arm"] for r in runs})},
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return report


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
