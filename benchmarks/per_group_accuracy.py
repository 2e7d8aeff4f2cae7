"""Test accuracy on 20 Newsgroups group by group, for finetuning runs of `benchmarks.bench_newsgroups` (the run
folders under its --runs_dir, each with predict_results.tsv), mean over the runs of each arm; and where the
pretraining recipe's validation split of the embedded 20 Newsgroups text falls, group by group.

    python -m benchmarks.per_group_accuracy \
        --arm "last 2%=/tmp/runs_a/pretrained_50pc_lr0.0003_seed*" --arm "spread=/tmp/runs_b/pretrained_50pc_*_seed*" \
        --validation_split_percentage 2 --out benchmarks/results/per_group.json

An arm is NAME=GLOB (the glob matches run folders). `--validation_split_percentage P` adds, for each group, how many
of its pretraining messages the recipe holds out for validation (P percent, spread over the text) and how many the
former split held out (the last P percent of the text, which is stored group after group).
"""

import argparse
import csv
import glob
import json
import sys
from pathlib import Path

import numpy as np

from xlnet_lite.data import held_out_positions
from xlnet_lite.embedded_datasets import (
    embedded_newsgroups,
    embedded_newsgroups_messages,
    embedded_newsgroups_pretraining_texts,
)


def per_group(run_dirs, test):
    """{group: [accuracy of each run]} from each run's predict_results.tsv against the test labels."""
    names = test.features["label"].names
    labels = test["label"]
    rows_of = {name: [i for i, label in enumerate(labels) if label == g] for g, name in enumerate(names)}
    out = {name: [] for name in names}
    for run in run_dirs:
        with open(Path(run, "predict_results.tsv"), encoding="utf-8") as f:
            predicted = {int(row["index"]): row["prediction"] for row in csv.DictReader(f, delimiter="\t")}
        if len(predicted) != len(labels):
            raise SystemExit(f"{run}: {len(predicted)} predictions for {len(labels)} test messages")
        for name, rows in rows_of.items():
            out[name].append(float(np.mean([predicted[i] == name for i in rows])))
    return out


def validation_by_group(percentage):
    """{group: (held out by the spread split, held out by the last-documents split, pretraining messages)}."""
    group_of = {text: group for group, text in embedded_newsgroups_messages("train")}
    texts = [t for t in embedded_newsgroups_pretraining_texts() if t.strip()]
    n = len(texts)
    spread = set(held_out_positions(n, percentage))
    last = set(range(n - len(spread), n))
    counts = {}
    for i, text in enumerate(texts):
        c = counts.setdefault(group_of[text.strip()], [0, 0, 0])
        c[0] += i in spread
        c[1] += i in last
        c[2] += 1
    return {g: tuple(c) for g, c in sorted(counts.items())}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arm", action="append", default=[], help="NAME=GLOB of run folders (repeat)")
    p.add_argument("--validation_split_percentage", type=float, default=None)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    arms = {}
    for spec in a.arm:
        name, _, pattern = spec.partition("=")
        runs = sorted(glob.glob(pattern))
        if not name or not runs:
            raise SystemExit(f"--arm {spec}: needs NAME=GLOB matching run folders, matched {len(runs)}")
        arms[name] = runs
    result = {
        "command": "python -m benchmarks.per_group_accuracy "
        + " ".join(f"--arm {json.dumps(s)}" for s in a.arm)
        + (
            f" --validation_split_percentage {a.validation_split_percentage:g}" if a.validation_split_percentage else ""
        ),
        "arms": {},
    }
    test = embedded_newsgroups()["test"] if arms else None
    groups = test.features["label"].names if arms else []
    for name, runs in arms.items():
        accuracy = per_group(runs, test)
        result["arms"][name] = {
            "runs": runs,
            "per_group": {g: {"mean": float(np.mean(v)), "runs": v} for g, v in accuracy.items()},
        }
    if a.validation_split_percentage:
        held_out = validation_by_group(a.validation_split_percentage)
        result["pretraining_validation"] = {
            g: {"spread": s, "last_documents": l, "pretraining_messages": m} for g, (s, l, m) in held_out.items()
        }
        groups = groups or list(result["pretraining_validation"])
    header = ["group"] + list(arms) + (["held out: spread / last / of"] if a.validation_split_percentage else [])
    print(" | ".join(header))
    for g in groups:
        cells = [g] + [f"{result['arms'][n]['per_group'][g]['mean']:.3f}" for n in arms]
        if a.validation_split_percentage:
            v = result["pretraining_validation"][g]
            cells.append(f"{v['spread']} / {v['last_documents']} / {v['pretraining_messages']}")
        print(" | ".join(cells))
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
