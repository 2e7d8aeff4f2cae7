"""What pretraining bought on a downstream task: the test accuracy of the classifier finetuned from the pretrained
model, of the same architecture finetuned from random initialisation, and of TF-IDF + logistic regression.

    python -m main_job.compare outputs/newsgroups [--pretraining outputs/pretrain] [--out outputs/comparison.json]

Reads FOLDER/pretrained/ and FOLDER/random_init/ (finetune/run_glue.py output folders: all_results.json and
run_args.json) and FOLDER/tfidf.json (main_job.tfidf), and the pretraining run's results.json if given;
prints a table and writes it as JSON: {"pretrained": {"test_accuracy": ...}, "random_init": {...}, "tfidf": {...},
"majority_class": {...}, "pretraining_gain_points": ..., ...}.
"""

import argparse
import json
import sys
from pathlib import Path

ROWS = (
    ("pretrained", "XLNet-Lite, pretrained here"),
    ("random_init", "same architecture, random init"),
    ("tfidf", "TF-IDF + logistic regression"),
    ("majority_class", "majority class"),
)
PRETRAINING_KEYS = (
    "steps",
    "max_train_minutes",
    "train_tokens_seen",
    "train_seconds",
    "tokens_per_second",
    "eval_loss",
    "unigram_baseline_loss",
    "mixed_precision",
    "parameters",
    "device",
)


def precision_name(mixed_precision):
    """How a run's --mixed_precision reads in a table: "no" is fp32."""
    return "fp32" if mixed_precision == "no" else mixed_precision


def read_json(path: Path) -> dict:
    if not path.is_file():
        sys.exit(f"compare: error: no {path} (run scripts/main_job.sh first)")
    return json.loads(path.read_text())


def finetuned_row(folder: Path) -> dict:
    results, flags = read_json(folder / "all_results.json"), read_json(folder / "run_args.json")
    return {
        "test_accuracy": results["test_accuracy"],
        "validation_accuracy": results.get("eval_accuracy"),
        "learning_rate": flags.get("learning_rate"),
        "best_epoch": results.get("best_epoch"),
        "epochs": results.get("epochs"),
        "train_samples": results.get("train_samples"),
        "train_runtime_s": results.get("train_runtime_s"),
        "mixed_precision": results.get("mixed_precision"),
    }


def compare(folder: Path, pretraining: Path | None = None) -> dict:
    tfidf = read_json(folder / "tfidf.json")
    table = {
        "pretrained": finetuned_row(folder / "pretrained"),
        "random_init": finetuned_row(folder / "random_init"),
        "tfidf": {
            "test_accuracy": tfidf["test_accuracy"],
            "validation_accuracy": tfidf["validation_accuracy"],
            "C": tfidf["best_C"],
            "train_samples": tfidf["train_examples"],
        },
        "majority_class": {"test_accuracy": tfidf["majority_class_test_accuracy"]},
    }
    accuracy = {name: table[name]["test_accuracy"] for name, _ in ROWS}
    table.update(
        test_examples=tfidf["test_examples"],
        pretraining_gain_points=round(100 * (accuracy["pretrained"] - accuracy["random_init"]), 2),
        pretrained_minus_tfidf_points=round(100 * (accuracy["pretrained"] - accuracy["tfidf"]), 2),
    )
    if pretraining is not None:
        results = read_json(pretraining / "results.json")
        table["pretraining"] = {k: results.get(k) for k in PRETRAINING_KEYS}
        flags = pretraining / "run_args.json"
        table["pretraining"]["lr_scheduler_type"] = (
            json.loads(flags.read_text()).get("lr_scheduler_type") if flags.is_file() else None
        )
    return table


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m main_job.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--pretraining", type=Path, help="The pretraining output folder (its results.json).")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    table = compare(args.folder, args.pretraining)
    print(f"\ntest accuracy on {args.folder.name} ({table['test_examples']} test examples):")
    for name, title in ROWS:
        print(f"  {title:<34} {table[name]['test_accuracy']:.3f}")
    print(
        f"pretraining: {table['pretraining_gain_points']:+.1f} points over random initialisation, "
        f"{table['pretrained_minus_tfidf_points']:+.1f} over TF-IDF"
    )
    run = table.get("pretraining")
    if run and run.get("steps") and run.get("train_tokens_seen") and run.get("train_seconds"):
        budget = (
            f"a {run['max_train_minutes']:g}-minute budget"
            if run.get("max_train_minutes")
            else f"a {run['steps']:,}-step budget"
        )
        precision = precision_name(run.get("mixed_precision")) or "precision not recorded"
        if run.get("device") not in (None, "cpu"):  # where a GPU ran it
            precision += f" on {run['device']}"
        print(
            f"pretraining: {budget}, {run['steps']:,} steps, {run['train_tokens_seen'] / 1e6:.1f}M tokens in "
            f"{run['train_seconds'] / 60:.1f} min ({precision}); validation PLM loss "
            f"{run.get('eval_loss') or float('nan'):.2f} against a unigram baseline of "
            f"{run.get('unigram_baseline_loss') or float('nan'):.2f}"
        )
        if run.get("max_train_minutes") and run.get("lr_scheduler_type") == "constant_with_warmup":
            # the rate does not depend on the step count: the step-bounded run takes the same steps
            print(
                f"the same steps by count (bit-identical on the same machine and precision): bash scripts/main_job.sh "
                f"--pretraining_steps {run['steps']} --overwrite_output_dir"
            )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(table, indent=2) + "\n")
    return table


if __name__ == "__main__":
    main()
