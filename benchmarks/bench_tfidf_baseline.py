"""TF-IDF + logistic regression on the embedded Rotten Tomatoes split: the baseline finetuned models must beat.

    python benchmarks/bench_tfidf_baseline.py [--out benchmarks/results/tfidf_rotten_tomatoes.json]

Word 1-2 grams (sublinear tf), L2 logistic regression; C chosen on the validation split, then test accuracy
of that model. Wall time covers vectorising, fitting every C, selecting, and predicting the test split;
fit_time_best_C_s is one fit at the chosen C.
"""

import argparse
import json
import time
from pathlib import Path

from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression

from xlnet_lite.data import embedded_rotten_tomatoes
from xlnet_lite.glue_metrics import accuracy

C_GRID = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/results/tfidf_rotten_tomatoes.json")
    args = parser.parse_args(argv)
    ds = embedded_rotten_tomatoes()
    start = time.perf_counter()
    vectorizer = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=1)
    x_train = vectorizer.fit_transform(ds["train"]["sentence"])
    x_val, x_test = vectorizer.transform(ds["validation"]["sentence"]), vectorizer.transform(ds["test"]["sentence"])
    y_train, y_val, y_test = list(ds["train"]["label"]), list(ds["validation"]["label"]), list(ds["test"]["label"])
    scores = {}
    for c in C_GRID:
        model = LogisticRegression(C=c, max_iter=2000).fit(x_train, y_train)
        scores[c] = (accuracy(model.predict(x_val), y_val), model)
    best_c = max(scores, key=lambda c: scores[c][0])
    fit_start = time.perf_counter()
    LogisticRegression(C=best_c, max_iter=2000).fit(x_train, y_train)
    fit_best = time.perf_counter() - fit_start
    test_accuracy = accuracy(scores[best_c][1].predict(x_test), y_test)
    results = {
        "model": "tfidf(1-2 grams, sublinear tf) + logistic regression",
        "best_C": best_c,
        "validation_accuracy": scores[best_c][0],
        "validation_accuracy_by_C": {str(c): s for c, (s, _) in scores.items()},
        "test_accuracy": test_accuracy,
        "majority_class_test_accuracy": max(sum(y_test), len(y_test) - sum(y_test)) / len(y_test),
        "wall_time_s": round(time.perf_counter() - start - fit_best, 2),
        "fit_time_best_C_s": round(fit_best, 2),
        "train_examples": len(y_train),
        "test_examples": len(y_test),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
