"""Label efficiency on 20 Newsgroups: test accuracy of the pretrained model, of random initialisation and of TF-IDF
against the number of labelled documents per group, one pretraining (same recipe and steps) across the files.

    python -m benchmarks.label_efficiency benchmarks/results/newsgroups_pt5940_{20pc_16ep,50pc_8ep,100pc_8ep}.json \
        benchmarks/results/newsgroups_zen5_pt5940_all_3ep.json \
        --out benchmarks/results/label_efficiency.json --plot benchmarks/results/label_efficiency.png

Reads result files of `benchmarks.bench_newsgroups` (each may hold several label counts and its own finetuning
flags, e.g. more epochs for fewer labels) and refuses files whose pretrainings differ in steps, tokens or size.
"""

import argparse
import json
import sys
from pathlib import Path

from benchmarks.bench_newsgroups import plot as plot_summary
from benchmarks.compute_curve import _labels_key

PRETRAINING_KEYS = ("steps", "train_tokens_seen", "parameters")


def load_rows(paths):
    rows, pretraining = [], None
    for path in paths:
        data = json.loads(Path(path).read_text())
        this = {k: data["pretraining_results"][k] for k in PRETRAINING_KEYS}
        if pretraining is not None and this != pretraining:
            raise SystemExit(f"{path}: pretraining {this} differs from {pretraining}: one pretraining per table")
        pretraining = this
        for labels, arms in data["summary"].items():
            if not {"pretrained", "random_init", "tfidf"} <= set(arms):
                raise SystemExit(f"{path}: {labels} labels per group lacks an arm (pretrained, random_init, tfidf)")
            rows.append({"labels_per_class": labels, "file": str(path), "finetune_flags": data["finetune_flags"],
                         "machine": data["environment"].get("cpu"),
                         "eval_loss": data["pretraining_results"]["eval_loss"], **arms})
    if len({r["labels_per_class"] for r in rows}) != len(rows):
        raise SystemExit("two files hold the same number of labels per group")
    return sorted(rows, key=lambda r: _labels_key(r["labels_per_class"])), pretraining


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", help="bench_newsgroups result files, one pretraining")
    parser.add_argument("--out", help="Write the table as JSON here.")
    parser.add_argument("--plot", help="Write the plot here (PNG).")
    args = parser.parse_args(argv)
    rows, pretraining = load_rows(args.results)
    print(f"pretraining: {pretraining['steps']:,} steps, {pretraining['train_tokens_seen'] / 1e6:.1f}M tokens, "
          f"{pretraining['parameters'] / 1e6:.2f}M parameters")
    print("| labels/group | finetuning | pretrained | random init | gain | TF-IDF | pretrained vs TF-IDF | CPU |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        p, q, t = (r["pretrained"]["test_accuracy"], r["random_init"]["test_accuracy"],
                   r["tfidf"]["test_accuracy"])
        r["gain_over_random_init"], r["gain_over_tfidf"] = p["mean"] - q["mean"], p["mean"] - t
        print(f"| {r['labels_per_class']} | {r['finetune_flags'] or 'defaults'} | {p['mean']:.3f} ± {p['std']:.3f} | "
              f"{q['mean']:.3f} ± {q['std']:.3f} | {100 * r['gain_over_random_init']:+.1f} | {t:.3f} | "
              f"{100 * r['gain_over_tfidf']:+.1f} | {r['machine']} |")
    if args.out:
        Path(args.out).write_text(json.dumps({
            "command": "python -m benchmarks.label_efficiency " + " ".join(argv if argv is not None else sys.argv[1:]),
            "pretraining": pretraining, "rows": rows}, indent=2) + "\n")
    if args.plot:
        plot_summary({(n if n == "all" else int(n)): r for r in rows for n in [r["labels_per_class"]]}, args.plot)


if __name__ == "__main__":
    main()
