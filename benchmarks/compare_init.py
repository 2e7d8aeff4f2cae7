"""What pretraining bought on a downstream task: the test accuracy of the classifier finetuned from the pretrained
model, of the same architecture finetuned from random initialisation, and of TF-IDF + logistic regression.

    python -m benchmarks.compare_init outputs/news_topic [--out outputs/news_topic/comparison.json]

Reads FOLDER/pretrained/all_results.json, FOLDER/random_init/all_results.json and FOLDER/tfidf.json (as
scripts/main_job.sh leaves them), prints a table and writes it as JSON.
"""

import argparse
import json
import sys
from pathlib import Path

ROWS = (("pretrained", "XLNet-Lite, pretrained here"), ("random_init", "same architecture, random init"),
        ("tfidf", "TF-IDF + logistic regression"))


def read_results(folder: Path) -> dict:
    paths = {"pretrained": folder / "pretrained" / "all_results.json", "random_init": folder / "random_init" / "all_results.json",
             "tfidf": folder / "tfidf.json"}
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:
        sys.exit(f"compare_init: error: no {', '.join(missing)} (run scripts/main_job.sh first)")
    return {name: json.loads(path.read_text()) for name, path in paths.items()}


def compare(results: dict) -> dict:
    accuracy = {name: results[name]["test_accuracy"] for name, _ in ROWS}
    return {
        "test_accuracy": accuracy,
        "validation_accuracy": {"pretrained": results["pretrained"].get("eval_accuracy"),
                                "random_init": results["random_init"].get("eval_accuracy"),
                                "tfidf": results["tfidf"]["validation_accuracy"]},
        "majority_class_test_accuracy": results["tfidf"]["majority_class_test_accuracy"],
        "test_examples": results["tfidf"]["test_examples"],
        "pretraining_gain_points": round(100 * (accuracy["pretrained"] - accuracy["random_init"]), 2),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compare_init", description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    summary = compare(read_results(args.folder))
    print(f"\ntest accuracy on {args.folder.name} ({summary['test_examples']} test examples):")
    for name, title in ROWS:
        print(f"  {title:<34} {summary['test_accuracy'][name]:.3f}")
    print(f"  {'majority class':<34} {summary['majority_class_test_accuracy']:.3f}")
    print(f"pretraining: {summary['pretraining_gain_points']:+.1f} points over random initialisation")
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2) + "\n")
    return summary


if __name__ == "__main__":
    main()
