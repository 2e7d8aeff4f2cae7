"""The baseline a finetuned classifier has to beat: TF-IDF + logistic regression, on any of the finetuning
recipe's embedded tasks (or your own train / validation / test files).

    python -m main_job.tfidf [--embedded_task newsgroups|news_topic|rotten_tomatoes]
        [--max_train_samples_per_class N] [--out results.json]

Word 1-2 grams (sublinear tf), L2 logistic regression solved to convergence (Newton-CG, tolerance 1e-6, each C
of the grid started from the solution at the C before it); C chosen on the validation split, then the test accuracy
of that model. Wall time covers vectorising, fitting every C, selecting, and predicting the test split.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

C_GRID = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
# scikit-learn's default (lbfgs, tol 1e-4) stops short of the optimum on ~10^5 n-gram features, enough to change the
# chosen C; Newton-CG at tol 1e-6 reaches it in a few iterations per C (benchmarks/RESULTS.md).
SOLVER = dict(solver="newton-cg", tol=1e-6, max_iter=1000)
TOL = f"{SOLVER['tol']:.0e}".replace("e-0", "e-")  # 1e-6
MODEL = f"tfidf(1-2 grams, sublinear tf) + logistic regression ({SOLVER['solver']}, tol {TOL})"  # names cached rows


def _texts(split):
    from xlnet_lite.classification_data import text_columns

    first, second = text_columns(split)
    if second is not None:
        return [f"{a} {b}" for a, b in zip(split.data[first], split.data[second])]
    return list(split.data[first])


def vectorizer():
    """The baseline's features: word 1-2 grams, sublinear tf, every n-gram of the training texts."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    return TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=1)


def tfidf_baseline(splits) -> dict:
    """TF-IDF + logistic regression on `splits` (classification_data.load_splits: train, validation, test with
    labels): the validation accuracy of every C, the chosen C, and its test accuracy."""
    from sklearn.linear_model import LogisticRegression

    from xlnet_lite.glue_metrics import accuracy

    start = time.perf_counter()
    features = vectorizer()
    x_train = features.fit_transform(_texts(splits["train"]))
    x_val, x_test = features.transform(_texts(splits["validation"])), features.transform(_texts(splits["test"]))
    y_train, y_val, y_test = (list(splits[name].data["label"]) for name in ("train", "validation", "test"))
    model, scores = LogisticRegression(warm_start=True, **SOLVER), {}
    for c in sorted(C_GRID):  # warm_start: each fit starts from the previous C's weights
        model.set_params(C=c).fit(x_train, y_train)
        scores[c] = (accuracy(model.predict(x_val), y_val), model.predict(x_test))
    best_c = max(scores, key=lambda c: scores[c][0])  # the first of equal scores: the smallest C
    return {
        "model": MODEL,
        "best_C": best_c,
        "validation_accuracy": scores[best_c][0],
        "validation_accuracy_by_C": {str(c): s for c, (s, _) in scores.items()},
        "test_accuracy": accuracy(scores[best_c][1], y_test),
        "majority_class_test_accuracy": Counter(y_test).most_common(1)[0][1] / len(y_test),
        "wall_time_s": round(time.perf_counter() - start, 2),
        "train_examples": len(y_train),
        "test_examples": len(y_test),
    }


def main(argv=None):
    from xlnet_lite.classification_data import EMBEDDED_TASKS, first_per_class, load_splits

    parser = argparse.ArgumentParser(prog="python -m main_job.tfidf", description=__doc__.split("\n\n")[0])
    parser.add_argument("--embedded_task", choices=EMBEDDED_TASKS, default="newsgroups")
    parser.add_argument(
        "--train_file", help="CSV / TSV / JSON lines (instead of --embedded_task), as finetune/run_glue.py"
    )
    parser.add_argument("--validation_file")
    parser.add_argument("--test_file")
    parser.add_argument("--max_train_samples_per_class", type=int, help="Train on the first N examples of each class.")
    parser.add_argument("--out", help="Write the results here as JSON.")
    args = parser.parse_args(argv)
    if args.train_file and not (args.validation_file and args.test_file):
        parser.error("--train_file needs --validation_file and --test_file (C is chosen on one, scored on the other)")
    splits = load_splits(
        train_file=args.train_file,
        validation_file=args.validation_file,
        test_file=args.test_file,
        embedded_task=args.embedded_task,
    )
    if args.max_train_samples_per_class:
        splits["train"] = first_per_class(splits["train"], args.max_train_samples_per_class)
    results = {
        "task": args.train_file or args.embedded_task,
        "train_source": splits["train"].source,
        **tfidf_baseline(splits),
    }
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
