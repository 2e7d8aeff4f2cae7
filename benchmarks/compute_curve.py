"""What pretraining compute buys on 20 Newsgroups: the gain of the pretrained model over random initialisation and
over TF-IDF, against the pretraining tokens and FLOPs, one line per number of labelled documents per group.

    python -m benchmarks.compute_curve benchmarks/results/newsgroups_pt*_*.json \
        --out benchmarks/results/compute_curve.json --plot benchmarks/results/compute_curve.png

Reads result files of `benchmarks.bench_newsgroups`. Each file gives, per number of labels, the pretrained arm (its
pretraining's steps and tokens come with it) and possibly the random-init arm and TF-IDF; a file run with `--arms
pretrained` takes its random-init reference from another file with the same labels and finetuning flags (the random
arm depends only on the architecture, the tokenizer and those flags, not on the pretraining), also from the files
given with --reference, which add no points. A point finetuned on a GPU (`--device gpu`) is held against a random-init
arm finetuned on a GPU too; TF-IDF does not depend on the device. FLOPs are the usual
estimate, 6 x parameters x tokens. Beside the table: the tokens at which the gain over random init reaches 0, +5
and +10 points and the pretrained model reaches TF-IDF, per line: at or below the smallest budget, interpolated
between two budgets, or extrapolated at the last two budgets' gain per doubling, unless those two budgets are level
within their finetuning seeds' spread (`milestones`). The result files make the main line and should share one
pretraining objective and schedule (`--name` names it; default "defaults"). Another pretraining recipe goes beside it as
its own line with `--series NAME FILE [FILE ...]` (repeatable); every point carries its line's name as `"series"`.
"""

import argparse
import json
import math
import shlex
import sys
from pathlib import Path

from main_job.compare import precision_name


def load_points(paths, reference_paths=(), require_random_init=True, prefer_own=False):
    """One point per (file, labels) pretrained arm, joined with its random-init and TF-IDF references (of the same
    labels and flags, and for random init the same model size and tokenizer: a `medium` pretrained arm is never held
    against a `small` random one; where several files have one, the last given, references last). With prefer_own a
    file's own random-init and TF-IDF arms come first. Without require_random_init a point whose reference is missing
    gets None for it and for the gains instead of an error."""
    files = [(str(p), json.loads(Path(p).read_text())) for p in paths]
    random_arms, tfidf_rows = {}, {}  # random_key -> random-init arm; (labels, flags) -> row

    def random_key(data, labels):
        # the tokenizer too: a random init shares its pretrained arm's (files without the pretraining's arguments
        # predate the flags: 8,000 pieces from the corpus's first 2,000 documents, which 20 Newsgroups and 20
        # Newsgroups + news share). A tokenizer from documents spread over all of the corpus (today's default, up
        # to 100,000) depends on every one of them: the text as it cut it (corpus_tokens) tells apart two trained
        # with the same flags on other documents (another validation split)
        pretraining_args = data.get("pretraining_args") or {}
        tokenizer = pretraining_args.get("vocab_size", 8000), pretraining_args.get("tokenizer_train_documents", 2000)
        pretraining = data["pretraining_results"]
        corpus = pretraining.get("corpus_tokens") if tokenizer[1] != 2000 else None
        return (labels, data["finetune_flags"], data.get("device", "cpu"), pretraining["parameters"], tokenizer, corpus)

    for _, data in files + [(str(p), json.loads(Path(p).read_text())) for p in reference_paths]:
        for labels, arms in data["summary"].items():
            if "random_init" in arms:
                random_arms[random_key(data, labels)] = arms["random_init"]
            if "tfidf" in arms:
                tfidf_rows[(labels, data["finetune_flags"])] = arms["tfidf"]
    points = []
    for path, data in files:
        pretraining = data["pretraining_results"]
        device = data.get("device", "cpu")
        for labels, arms in data["summary"].items():
            if "pretrained" not in arms:
                continue
            ref = {"tfidf": tfidf_rows.get((labels, data["finetune_flags"]), {})}
            if (key := random_key(data, labels)) in random_arms:
                ref["random_init"] = random_arms[key]
            if prefer_own:
                ref.update({arm: arms[arm] for arm in ("random_init", "tfidf") if arm in arms})
            if "random_init" not in ref and require_random_init:
                raise SystemExit(
                    f"{path}: no random-init arm for {labels} labels per group with finetuning flags "
                    f"{data['finetune_flags']!r} on the {device} for a model of "
                    f"{pretraining['parameters']:,} parameters in any file given"
                )
            p = arms["pretrained"]["test_accuracy"]
            r = ref["random_init"]["test_accuracy"] if "random_init" in ref else {"mean": None, "std": None}
            tfidf = ref.get("tfidf", {}).get("test_accuracy")
            points.append(
                {
                    "labels_per_class": labels,
                    "finetune_flags": data["finetune_flags"],
                    "file": path,
                    "machine": data.get("environment", {}).get("gpu" if device == "gpu" else "cpu"),
                    "device": device,
                    "train_examples": ref.get("tfidf", {}).get("train_examples"),
                    "pretraining_steps": pretraining["steps"],
                    "pretraining_tokens": pretraining["train_tokens_seen"],
                    "pretraining_flops": 6 * pretraining["parameters"] * pretraining["train_tokens_seen"],
                    "pretraining_minutes": round(pretraining["train_seconds"] / 60, 1),
                    "pretraining_precision": pretraining.get("mixed_precision"),
                    "eval_loss_minus_unigram": pretraining["eval_loss"] - pretraining["unigram_baseline_loss"],
                    "pretrained": p["mean"],
                    "pretrained_std": p["std"],
                    "seeds": p["n"],
                    "pretrained_validation": arms["pretrained"].get("validation_accuracy", {}).get("mean"),
                    "pretraining_args": data.get("pretraining_args"),
                    "random_init": r["mean"],
                    "random_init_std": r["std"],
                    "random_init_seeds": r.get("n"),
                    "tfidf": tfidf,
                    "gain_over_random_init": None if r["mean"] is None else p["mean"] - r["mean"],
                    "gain_std": None if r["mean"] is None else math.hypot(p["std"], r["std"]),
                    "gain_over_tfidf": None if tfidf is None else p["mean"] - tfidf,
                }
            )
    return sorted(points, key=lambda q: (_labels_key(q["labels_per_class"]), q["pretraining_tokens"]))


def _labels_key(labels):
    return math.inf if labels == "all" else int(labels)


DEFAULT_SERIES = "defaults"
# each --series line's marker and line style, in the order given (one pair per line)
SERIES_MARKERS = "D^vP*X"
SERIES_STYLES = (":", "-.", (0, (1, 3)), (0, (5, 2, 1, 2)), (0, (3, 3)), (0, (1, 1)))
# (name, the point's field, the target): where the gain over random init reaches 0, +5 and +10 points, and where the
# pretrained model reaches TF-IDF
MILESTONES = (
    ("random init", "gain_over_random_init", 0.0),
    ("random init + 5", "gain_over_random_init", 0.05),
    ("random init + 10", "gain_over_random_init", 0.10),
    ("TF-IDF", "gain_over_tfidf", 0.0),
)


def standard_error(q):
    """Of a point's mean pretrained accuracy over its finetuning seeds (0 for one seed or no spread recorded)."""
    return (q.get("pretrained_std") or 0.0) / math.sqrt(q.get("seeds") or 1)


def milestones(points):
    """Per recipe, number of labels and finetuning flags (CPU points; points of equal tokens, e.g. two machines'
    runs of one budget, averaged): the pretraining tokens at which each milestone is reached. "at or below": met at
    the smallest budget measured; "interpolated": between two budgets, the gain taken as straight in log tokens (a
    milestone met exactly at a budget is interpolated to it); "extrapolated": past the largest budget, at the points
    per doubling of the last two budgets (where the gain per doubling falls with the budget, as with XLNet's settings
    on 20 Newsgroups, it takes more than that); None where that slope is not positive or one budget was measured, and
    "level" where the last two budgets' gains differ by no more than one standard error of the difference of their
    pretrained accuracies over the seeds (the random-init and TF-IDF references are shared along a line): a slope the
    seeds cannot tell from zero extrapolates nowhere."""
    rows, lines = [], {}
    for q in points:
        if q.get("device") != "gpu":
            lines.setdefault((q.get("series", DEFAULT_SERIES), q["labels_per_class"], q["finetune_flags"]), []).append(
                q
            )
    for key, line in lines.items():
        flops_per_token = line[-1]["pretraining_flops"] / line[-1]["pretraining_tokens"]
        for name, field, target in MILESTONES:
            budgets = {}  # tokens -> (gain, standard error of the pretrained accuracy) of each run of that budget
            for q in line:
                if q[field] is not None:
                    budgets.setdefault(q["pretraining_tokens"], []).append((q[field], standard_error(q)))
            budgets = sorted(budgets.items())  # the runs of one budget averaged, their standard errors with them
            measured = [(math.log2(t), sum(g for g, _ in runs) / len(runs)) for t, runs in budgets]
            noise = [math.sqrt(sum(e * e for _, e in runs)) / len(runs) for _, runs in budgets]
            if not measured:
                continue
            reached, how, slope = None, None, None
            if measured[0][1] >= target:
                reached, how = measured[0][0], "at or below"
            for (x0, g0), (x1, g1) in zip(measured, measured[1:]):
                if reached is None and g0 < target <= g1:
                    reached, how = x0 + (target - g0) / (g1 - g0) * (x1 - x0), "interpolated"
            if len(measured) >= 2:
                (x0, g0), (x1, g1) = measured[-2:]
                slope = (g1 - g0) / (x1 - x0)
                if reached is None and abs(g1 - g0) <= math.hypot(*noise[-2:]):
                    how = "level"
                elif reached is None and slope > 0:
                    reached, how = x1 + (target - g1) / slope, "extrapolated"
            tokens = None if reached is None else 2.0**reached
            rows.append(
                {
                    "series": key[0],
                    "labels_per_class": key[1],
                    "finetune_flags": key[2],
                    "milestone": name,
                    "how": how,
                    "tokens": tokens,
                    "flops": None if tokens is None else flops_per_token * tokens,
                    "points_per_doubling_last": None if slope is None else 100 * slope,
                    "largest_measured_tokens": 2.0 ** measured[-1][0],
                }
            )
    return rows


def plot(points, path, main=DEFAULT_SERIES):
    """The gains against tokens; `main` is the series drawn as the main line (CPU line, GPU points apart), every other
    series as a line of its own marker and style (its GPU points apart too)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots()  # sized below, once the legend's entries are known
    x_all = [q["pretraining_tokens"] / 1e6 for q in points]
    colors = {}  # labels -> the main line's colour, which another recipe's line of the same labels shares
    named = "" if main == DEFAULT_SERIES else f", {main}"

    def gains(group, label, color, gpu, **style):
        """The gains over random init of one group of points, in `color` (None: the next); GPU points (another
        schedule, their own random arm) stand apart as hollow markers. Returns the colour drawn."""
        shown = ax.errorbar(
            [q["pretraining_tokens"] / 1e6 for q in group],
            [100 * q["gain_over_random_init"] for q in group],
            yerr=[100 * q["gain_std"] for q in group],
            capsize=3,
            color=color,
            label=label + (" (GPU)" if gpu else ""),
            **(style | ({"ls": "none", "mfc": "none", "ms": 8} if gpu else {})),
        )
        return shown[0].get_color()

    for labels in sorted({q["labels_per_class"] for q in points}, key=_labels_key):
        # a line through the CPU points; a GPU point stands apart in its colour
        ours = [q for q in points if q["labels_per_class"] == labels and q.get("series", DEFAULT_SERIES) == main]
        line = [q for q in ours if q.get("device") != "gpu"]
        apart = [q for q in ours if q.get("device") == "gpu"]
        color = None
        for group, gpu in ((line, False), (apart, True)):
            if not group:
                continue
            color = colors[labels] = gains(
                group, f"{labels} labels/group{named}: pretrained - random init", color, gpu, marker="s" if gpu else "o"
            )
            if all(q["gain_over_tfidf"] is not None for q in group):
                ax.plot(
                    [q["pretraining_tokens"] / 1e6 for q in group],
                    [100 * q["gain_over_tfidf"] for q in group],
                    ls="none" if gpu else "--",
                    marker="x",
                    color=color,
                    label=None if gpu else f"{labels} labels/group{named}: pretrained - TF-IDF",
                )
    others = dict.fromkeys(q["series"] for q in points if q.get("series", DEFAULT_SERIES) != main)
    for series, marker, ls in zip(others, SERIES_MARKERS, SERIES_STYLES):
        for labels in sorted({q["labels_per_class"] for q in points if q.get("series") == series}, key=_labels_key):
            group = [q for q in points if q.get("series") == series and q["labels_per_class"] == labels]
            for gpu in (False, True):  # its CPU line, then its GPU points apart, in one colour
                part = [q for q in group if (q.get("device") == "gpu") == gpu]
                if part:
                    colors.setdefault(
                        labels,
                        gains(
                            part,
                            f"{labels} labels/group, {series}: pretrained - random init",
                            colors.get(labels),
                            gpu,
                            marker=marker,
                            ls=ls,
                        ),
                    )
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xscale("log")
    ticks = [t for t in (0.5, 1, 2, 5, 10, 20, 50, 100, 200) if min(x_all) / 1.5 <= t <= max(x_all) * 1.5]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("pretraining tokens (millions; FLOPs: 6 x parameters x tokens)")
    ax.set_ylabel("test accuracy difference (points)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the lines, not over them
    ax.grid(alpha=0.3)
    # 12 inches wide, tall enough for the legend's entries (about 0.15 inch each at this font size)
    fig.set_size_inches(12, max(4.2, 0.15 * len(ax.get_legend_handles_labels()[1]) + 0.8))
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")  # the legend beside the axes included
    return ax


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", help="bench_newsgroups result files")
    parser.add_argument(
        "--reference",
        nargs="+",
        default=[],
        help="Result files read for their random-init and TF-IDF arms only (e.g. another objective's).",
    )
    parser.add_argument(
        "--name",
        default=DEFAULT_SERIES,
        help="The result files' pretraining recipe, as the table and the legend name it.",
    )
    parser.add_argument(
        "--series",
        nargs="+",
        action="append",
        default=[],
        metavar=("NAME", "FILE"),
        help="Another pretraining recipe's result files (at least one), drawn as their own line named "
        f"NAME (up to {len(SERIES_MARKERS)} such recipes); give it after the result files, which it "
        "would take in.",
    )
    parser.add_argument("--out", default=None, help="Write the points as JSON here.")
    parser.add_argument("--plot", default=None, help="Write the plot here (PNG).")
    args = parser.parse_args(argv)
    for series in args.series:
        if len(series) < 2:
            parser.error(f"--series {' '.join(series)}: give a name and at least one result file")
        if series[0] == args.name or [s[0] for s in args.series].count(series[0]) > 1:
            parser.error(
                f"--series {series[0]}: the name is taken (the result files are {args.name!r}; one --series per name)"
            )
    if len(args.series) > len(SERIES_MARKERS):
        parser.error(f"--series: at most {len(SERIES_MARKERS)} other recipes in one plot")
    for path in args.results + args.reference + [f for series in args.series for f in series[1:]]:
        if not Path(path).is_file():
            parser.error(f"no result file {path}")
    points = [q | {"series": args.name} for q in load_points(args.results, args.reference)]
    for name, *files in args.series:  # their random-init and TF-IDF references may come from any file given
        points += [q | {"series": name} for q in load_points(files, args.reference + args.results)]
    order = {args.name: 0, **{name: i + 1 for i, (name, *_) in enumerate(args.series)}}
    points.sort(key=lambda q: (order[q["series"]], _labels_key(q["labels_per_class"]), q["pretraining_tokens"]))
    recipe = (lambda q: f"{q['series']} | ") if args.series else (lambda q: "")
    print(
        f"| {'recipe | ' if args.series else ''}labels/group | steps | tokens | FLOPs | minutes | PLM loss - unigram | "
        "pretrained | random init | gain | TF-IDF | vs TF-IDF |"
    )
    print("|---" * (12 if args.series else 11) + "|")
    for q in points:
        tfidf = "" if q["tfidf"] is None else f"{q['tfidf']:.3f} | {100 * q['gain_over_tfidf']:+.1f}"
        print(
            f"| {recipe(q)}{q['labels_per_class']} | {q['pretraining_steps']:,} | "
            f"{q['pretraining_tokens'] / 1e6:.1f}M | "
            f"{q['pretraining_flops']:.1e} | {q['pretraining_minutes']} ({precision_name(q['pretraining_precision'])}"
            f"{', ' + str(q['machine']) if q['device'] == 'gpu' else ''}) | "
            f"{q['eval_loss_minus_unigram']:+.2f} | {q['pretrained']:.3f} ± {q['pretrained_std']:.3f} | "
            f"{q['random_init']:.3f} ± {q['random_init_std']:.3f} | {100 * q['gain_over_random_init']:+.1f} | "
            f"{tfidf or ' | '} |"
        )
    reached = milestones(points)
    print(
        "\n| recipe | labels/group (finetuning) | reaches | at tokens | FLOPs | how "
        "| points per doubling (last two) |\n"
        "|---|---|---|---|---|---|---|"
    )
    for m in reached:
        at = (
            f"{m['tokens'] / 1e6:,.1f}M | {m['flops']:.1e}"
            if m["tokens"] is not None
            else "not: the last two budgets level within the seeds' spread | "
            if m["how"] == "level"
            else "not, at the last slope | "
            if m["points_per_doubling_last"] is not None
            else "one budget measured | "
        )
        slope = "" if m["points_per_doubling_last"] is None else f"{m['points_per_doubling_last']:+.1f}"
        flags = f" ({m['finetune_flags']})" if m["finetune_flags"] else ""
        print(
            f"| {m['series']} | {m['labels_per_class']}{flags} | {m['milestone']} | {at} | {m['how'] or ''} | {slope} |"
        )
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "command": "python -m benchmarks.compute_curve "
                    + shlex.join(argv if argv is not None else sys.argv[1:]),
                    "points": points,
                    "milestones": reached,
                },
                indent=2,
            )
            + "\n"
        )
    if args.plot:
        plot(points, args.plot, main=args.name)


if __name__ == "__main__":
    main()
