"""What pretraining buys on 20 Newsgroups, per number of labelled documents: the finetuning recipe from a pretrained
XLNet-Lite and from the same architecture at random initialisation, each at the learning rate that scores best on
the validation split (one grid, seed 0), then at that rate over several seeds; TF-IDF + logistic regression on the
same labelled documents beside them. --embedded_task news_topic or rotten_tomatoes runs the same comparison on the
other embedded tasks (a lever checked beyond 20 Newsgroups).

    python -m benchmarks.bench_newsgroups --pretrained outputs/pretrain --labels_per_class 20 100 all \
        --seeds 0 1 2 --out benchmarks/results/newsgroups.json [--plot benchmarks/results/newsgroups.png]

Every run is the real command (`accelerate launch finetune/run_glue.py --embedded_task TASK ...`) with the
recipe's defaults except the learning rate, the seed and `--max_train_samples_per_class`; --finetune_flags adds
flags to every run (the same for both arms). The test accuracy of a run is that of its best epoch on validation;
test scores never choose anything. Each finished run is written to --runs_dir at once and reused when the command
runs again (delete the folder to start over), so a killed benchmark loses at most the run in flight; TF-IDF rows
are kept the same way in a `tfidf` folder beside --runs_dir.
"""

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.environment import environment
from main_job.tfidf import MODEL as TFIDF_MODEL
from main_job.tfidf import tfidf_baseline
from xlnet_lite.classification_data import EMBEDDED_TASKS, first_per_class, load_splits
from xlnet_lite.training import write_json

ARMS = ("pretrained", "random_init")


def finetune(args, arm, budget, lr, seed):
    """One finetuning run; returns its record (cached under runs_dir)."""
    name = f"{arm}_{budget}pc_lr{lr:g}_seed{seed}" if budget != "all" else f"{arm}_all_lr{lr:g}_seed{seed}"
    path = Path(args.runs_dir, name + ".json")
    if path.is_file():
        record = json.loads(path.read_text())
        ran = (record["pretrained"], record["finetune_flags"], record.get("embedded_task", "newsgroups"))
        if ran != (args.pretrained, args.finetune_flags, args.embedded_task):
            sys.exit(
                f"{path} was run with --pretrained {ran[0]} --finetune_flags {ran[1]!r} --embedded_task {ran[2]}: "
                "use another --runs_dir, or delete it"
            )
        return record
    out = Path(args.runs_dir, name)
    init = ["--model_name_or_path", args.pretrained] if arm == "pretrained" else ["--config_name", args.pretrained]
    cmd = [
        *args.launcher,
        "finetune/run_glue.py",
        "--embedded_task",
        args.embedded_task,
        *init,
        "--learning_rate",
        f"{lr:g}",
        "--seed",
        str(seed),
        "--output_dir",
        str(out),
        "--overwrite_output_dir",
        "--checkpointing_steps",
        "0",
        "--save_total_limit",
        "1",
        *shlex.split(args.finetune_flags),
    ]
    if budget != "all":
        cmd += ["--max_train_samples_per_class", str(budget)]
    print(f"[{time.strftime('%H:%M:%S')}] {name}", flush=True)
    start, load = time.perf_counter(), os.getloadavg()
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"failed ({done.returncode}): {shlex.join(cmd)}\n{done.stderr[-3000:]}")
    results = json.loads((out / "all_results.json").read_text())
    history = json.loads((out / "history.json").read_text())
    record = {
        "name": name,
        "arm": arm,
        "labels_per_class": budget,
        "learning_rate": lr,
        "seed": seed,
        "pretrained": args.pretrained,
        "finetune_flags": args.finetune_flags,
        "embedded_task": args.embedded_task,
        "command": shlex.join(cmd),
        "wall_seconds": round(time.perf_counter() - start, 1),
        "load_average_before": load,
        "validation_accuracy": results["eval_accuracy"],
        "test_accuracy": results["test_accuracy"],
        "best_epoch": results["best_epoch"],
        "validation_curve": [h.get("eval_accuracy") for h in history],
        "train_loss_curve": [h["train_loss"] for h in history],
        "mixed_precision": results.get("mixed_precision"),
    }
    write_json(path, record)  # atomic: processes sharing runs_dir read each other's records
    return record


def mean_std(values):
    return {
        "mean": statistics.mean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "n": len(values),
        "values": values,
    }


def run_arm(args, arm, budget):
    """The learning-rate grid at the first seed (chosen on validation), then every seed at the chosen rate."""
    grid = [finetune(args, arm, budget, lr, args.seeds[0]) for lr in args.lr_grid]
    best = max(grid, key=lambda r: r["validation_accuracy"])
    runs = [finetune(args, arm, budget, best["learning_rate"], seed) for seed in args.seeds]
    return {
        "learning_rate": best["learning_rate"],
        "grid_validation_accuracy": {f"{r['learning_rate']:g}": r["validation_accuracy"] for r in grid},
        "validation_accuracy": mean_std([r["validation_accuracy"] for r in runs]),
        "test_accuracy": mean_std([r["test_accuracy"] for r in runs]),
    }


def tfidf_row(args, splits, budget):
    """TF-IDF + logistic regression on the same labelled messages, cached beside the runs folders (it depends on the
    data and the number of labels only; a row from another solver is fitted again)."""
    path = Path(args.runs_dir).parent / "tfidf" / f"{args.embedded_task}_{budget}.json"
    cached = json.loads(path.read_text()) if path.is_file() else None
    if cached and cached.get("model") == TFIDF_MODEL:
        return cached
    if budget != "all":
        splits = dict(splits, train=first_per_class(splits["train"], budget))
    row = tfidf_baseline(splits)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, row)
    return row


def plot(summary, path, *, num_classes=20, task="20 Newsgroups"):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    budgets = list(summary)
    # "all": the training split without its validation messages, per class
    x = [summary[b]["tfidf"]["train_examples"] / num_classes if b == "all" else b for b in budgets]
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in (
        ("pretrained", "XLNet-Lite, pretrained"),
        ("random_init", "same, random init"),
        ("tfidf", "TF-IDF + LR"),
    ):
        if key not in summary[budgets[0]]:
            continue
        means = [
            summary[b][key]["test_accuracy"]["mean"] if key != "tfidf" else summary[b][key]["test_accuracy"]
            for b in budgets
        ]
        stds = [summary[b][key]["test_accuracy"]["std"] if key != "tfidf" else 0 for b in budgets]
        ax.errorbar(x, means, yerr=stds, marker="o", capsize=3, label=label)
    ax.set_xscale("log")
    ax.set_xticks(x, [f"all ({v:.0f})" if b == "all" else str(b) for b, v in zip(budgets, x)])
    ax.minorticks_off()
    ax.set_xlabel("labelled documents per class")
    ax.set_ylabel(f"{task} test accuracy")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--embedded_task", choices=EMBEDDED_TASKS, default="newsgroups")
    parser.add_argument(
        "--pretrained", required=True, help="A pretraining output folder (also the random arm's config)."
    )
    parser.add_argument("--labels_per_class", nargs="+", default=["100"], help="Numbers, or 'all'.")
    parser.add_argument("--lr_grid", nargs="+", type=float, default=[1e-4, 3e-4, 1e-3])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument(
        "--arms",
        nargs="+",
        choices=ARMS,
        default=list(ARMS),
        help="Which arms to run (e.g. only the pretrained one with a pooling the random arm lacks).",
    )
    parser.add_argument(
        "--no_tfidf",
        action="store_true",
        help="Leave out the TF-IDF row (it depends on the labelled messages only, not on the device or "
        "the pretraining: read it from a CPU run of the same budget).",
    )
    parser.add_argument("--finetune_flags", default="", help="More run_glue.py flags for every run (quoted).")
    parser.add_argument("--runs_dir", default="benchmarks/runs/newsgroups")
    parser.add_argument("--out", default="benchmarks/results/newsgroups.json")
    parser.add_argument("--plot")
    parser.add_argument(
        "--device",
        choices=["cpu", "gpu"],
        default="cpu",
        help="Where the finetuning runs train: the CPU (OMP_NUM_THREADS threads) or one GPU.",
    )
    args = parser.parse_args(argv)
    if args.plot and args.no_tfidf:
        parser.error("--plot places the 'all' point by the TF-IDF row's training examples: drop --no_tfidf")
    args.labels_per_class = [b if b == "all" else int(b) for b in args.labels_per_class]
    where = (
        ["--cpu", "--num_cpu_threads_per_process", os.environ.get("OMP_NUM_THREADS", "2")]
        if args.device == "cpu"
        else ["--gpu_ids", "0"]
    )
    args.launcher = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        *where,
        "--num_processes",
        "1",
        "--num_machines",
        "1",
        "--dynamo_backend",
        "no",
    ]
    Path(args.runs_dir).mkdir(parents=True, exist_ok=True)
    splits = load_splits(embedded_task=args.embedded_task)
    summary = {}
    for budget in args.labels_per_class:
        summary[budget] = {arm: run_arm(args, arm, budget) for arm in args.arms}
        if not args.no_tfidf:
            summary[budget]["tfidf"] = tfidf_row(args, splits, budget)
        row = summary[budget]
        print(json.dumps({"labels_per_class": budget, **{k: row[k]["test_accuracy"] for k in row}}), flush=True)
    results = {
        "command": "python -m benchmarks.bench_newsgroups " + shlex.join(sys.argv[1:] if argv is None else argv),
        "environment": environment(),
        "pretrained": args.pretrained,
        "pretraining_results": json.loads(Path(args.pretrained, "results.json").read_text()),
        "pretraining_args": (
            json.loads(Path(args.pretrained, "run_args.json").read_text())
            if Path(args.pretrained, "run_args.json").is_file()
            else None
        ),
        "embedded_task": args.embedded_task,
        "finetune_flags": args.finetune_flags,
        "lr_grid": args.lr_grid,
        "seeds": args.seeds,
        "arms": args.arms,
        "device": args.device,
        "summary": {str(k): v for k, v in summary.items()},
        "runs": sorted(
            (json.loads(p.read_text()) for p in Path(args.runs_dir).glob("*.json")), key=lambda r: r["name"]
        ),
    }
    write_json(args.out, results)
    if args.plot:
        plot(
            summary,
            args.plot,
            num_classes=splits["train"].data.features["label"].num_classes,
            task="20 Newsgroups" if args.embedded_task == "newsgroups" else args.embedded_task,
        )
    return results


if __name__ == "__main__":
    main()
