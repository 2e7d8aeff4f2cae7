"""Label efficiency on 20 Newsgroups: test accuracy of the pretrained model, of random initialisation and of TF-IDF
against the number of labelled documents per group, for one pretraining (same steps, tokens and size) across files.

    python -m benchmarks.label_efficiency benchmarks/results/newsgroups_pt5940_{20pc_16ep,50pc_8ep,100pc_8ep}.json \
        benchmarks/results/newsgroups_zen5_pt5940_all_3ep.json \
        --reference benchmarks/results/newsgroups_s1c1500_50pc_8ep.json \
        --out benchmarks/results/label_efficiency.json --plot benchmarks/results/label_efficiency.png

Reads result files of `benchmarks.bench_newsgroups` (each with its own finetuning flags, e.g. more epochs for fewer
labels); a file's own random-init and TF-IDF arms come first (they share its tokenizer), and a file run with `--arms
pretrained` takes them from another file, or a --reference file, with the same labels and finetuning flags, as
`benchmarks.compute_curve` does.
"""

import argparse
import json
import sys
from pathlib import Path

from benchmarks.bench_newsgroups import plot as plot_summary
from benchmarks.compute_curve import _labels_key, load_points


def one_pretraining(points):
    """The points, one per number of labels, after checking they share one pretraining."""
    runs = {(q["pretraining_steps"], q["pretraining_tokens"], q["pretraining_flops"]) for q in points}
    if len(runs) > 1:
        raise SystemExit(
            f"the files hold {len(runs)} pretrainings (steps, tokens, FLOPs: {sorted(runs)}): one pretraining per table"
        )
    labels = [q["labels_per_class"] for q in points]
    if len(set(labels)) != len(labels):
        raise SystemExit(f"two files hold the same number of labels per group ({sorted(labels, key=_labels_key)})")
    return points


def plot(points, path):
    """bench_newsgroups' plot of one summary, from the points."""
    summary = {
        (q["labels_per_class"] if q["labels_per_class"] == "all" else int(q["labels_per_class"])): {
            "pretrained": {"test_accuracy": {"mean": q["pretrained"], "std": q["pretrained_std"]}},
            "random_init": {"test_accuracy": {"mean": q["random_init"], "std": q["random_init_std"]}},
            "tfidf": {"test_accuracy": q["tfidf"], "train_examples": q["train_examples"]},
        }
        for q in points
    }
    plot_summary(summary, path)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", help="bench_newsgroups result files, one pretraining")
    parser.add_argument("--reference", nargs="+", default=[], help="Files read for their random-init and TF-IDF arms.")
    parser.add_argument("--out", help="Write the table as JSON here.")
    parser.add_argument("--plot", help="Write the plot here (PNG).")
    args = parser.parse_args(argv)
    points = one_pretraining(load_points(args.results, args.reference, prefer_own=True))
    q = points[0]
    print(
        f"pretraining: {q['pretraining_steps']:,} steps, {q['pretraining_tokens'] / 1e6:.1f}M tokens, "
        f"{q['pretraining_flops']:.1e} FLOPs"
    )
    print("| labels/group | finetuning | pretrained | random init | gain | TF-IDF | pretrained vs TF-IDF | CPU |")
    print("|---|---|---|---|---|---|---|---|")
    for q in points:
        print(
            f"| {q['labels_per_class']} | {q['finetune_flags'] or 'defaults'} | {q['pretrained']:.3f} ± "
            f"{q['pretrained_std']:.3f} | {q['random_init']:.3f} ± {q['random_init_std']:.3f} | "
            f"{100 * q['gain_over_random_init']:+.1f} | {q['tfidf']:.3f} | {100 * q['gain_over_tfidf']:+.1f} | "
            f"{q['machine']} |"
        )
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "command": "python -m benchmarks.label_efficiency "
                    + " ".join(argv if argv is not None else sys.argv[1:]),
                    "points": points,
                },
                indent=2,
            )
            + "\n"
        )
    if args.plot:
        plot(points, args.plot)


if __name__ == "__main__":
    main()
