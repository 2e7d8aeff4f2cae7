"""What pretraining buys downstream, at equal wall-clock pretraining budgets on this machine: XLNet-Lite's
permutation LM, the same architecture from random initialisation, and a BERT of the same size and tokenizer
pretrained with transformers' BertForMaskedLM + DataCollatorForLanguageModeling on the same text (its learning rate
from a short sweep); each finetuned on the in-domain news-topic task and on Rotten Tomatoes, several seeds.

    python -m benchmarks.bench_pretraining_value --budgets 3 6 --seeds 0 1 2 \
        --out benchmarks/results/pretraining_value.json --plot benchmarks/results/pretraining_value.png
    python -m benchmarks.bench_pretraining_value --budgets 6 12 --xlnet_variant default= \
        --xlnet_variant "span1_const=--max_span_length 1 --lr_scheduler_type constant_with_warmup"

--xlnet_variant NAME=FLAGS adds an XLNet-Lite arm pretrained with extra run_pretraining.py flags (a pretraining
lever: span length, schedule, plm_probability, ...), finetuned and tabled like the others.

Pretraining: `pretrain/run_pretraining.py --max_train_minutes M` (the small preset, its defaults: batch 16, seq_len
128, lr 3e-4, 100 warmup steps, then a constant rate to the deadline) and `benchmarks.baselines.bert_mlm.pretrain_mlm`
(the same batch, sequence length and warmup, a linear decay to zero at the deadline, on the same documents, with the
tokenizer the XLNet-Lite run trained). The results in benchmarks/RESULTS.md ran when the recipe's defaults were
XLNet's settings, a linear decay to the deadline as BERT's; `--xlnet_variant "xlnet=--max_span_length 5
--plm_probability 0.16666666666666666 --lr_scheduler_type linear"` runs that arm again (a `default` run cached before
the defaults changed is reused as it is: delete it from --runs_dir). The clock counts only optimizer steps in both. Finetuning: the main job's budget (3 epochs,
lr 3e-4, the first 128 tokens, dropout 0.1, batch 16); Rotten Tomatoes on its first --rt_train_samples training
reviews. Each finished run is written to --runs_dir at once and skipped when the command is run again, so a killed
benchmark loses at most the run in flight (delete --runs_dir to start over).
"""

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

TASKS = ("news_topic", "rotten_tomatoes")
FINETUNE = [
    "--num_train_epochs",
    "3",
    "--learning_rate",
    "3e-4",
    "--max_seq_length",
    "128",
    "--checkpointing_steps",
    "0",
    "--overwrite_output_dir",
]


def sh(cmd, env):
    start = time.perf_counter()
    result = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if result.returncode:
        sys.exit(f"failed ({result.returncode}): {' '.join(cmd)}\n{result.stderr[-3000:]}")
    return time.perf_counter() - start


class Runs:
    """One JSON per finished run under runs_dir; a run found there is not run again."""

    def __init__(self, root):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def get(self, name, compute):
        path = self.root / f"{name}.json"
        if path.is_file():
            return json.loads(path.read_text())
        print(f"[{time.strftime('%H:%M:%S')}] {name}", flush=True)
        record = {"name": name, "load_average_before": os.getloadavg(), **compute()}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=2) + "\n")
        os.replace(tmp, path)
        return record


def xlnet_arm(variant, minutes):
    """Run and table names of an XLNet-Lite arm: `xlnet_6min` for the recipe's defaults, `xlnet_span1_6min` for the
    variant named span1."""
    return f"xlnet_{minutes:g}min" if variant == "default" else f"xlnet_{variant}_{minutes:g}min"


def xlnet_column(variant):
    """The results table's column of an XLNet-Lite arm: xlnet_lite (defaults) or xlnet_lite_NAME."""
    return "xlnet_lite" if variant == "default" else f"xlnet_lite_{variant}"


def parse_variant(text):
    """--xlnet_variant NAME=FLAGS -> (NAME, [flags]); FLAGS are run_pretraining.py flags."""
    name, sep, flags = text.partition("=")
    if not sep or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"expected NAME=FLAGS (NAME a word), got {text!r}")
    if name == "default" and flags.strip():
        raise argparse.ArgumentTypeError(
            f"'default' is the recipe's defaults and takes no flags; name this arm otherwise: {text!r}"
        )
    return name, shlex.split(flags)


def pretrain_xlnet(runs, minutes, env, variant="default", flags=()):
    out = runs.root / xlnet_arm(variant, minutes)
    cmd = [
        sys.executable,
        str(REPO / "pretrain" / "run_pretraining.py"),
        *flags,
        "--max_train_minutes",
        str(minutes),
        "--output_dir",
        str(out),
        "--checkpointing_steps",
        "0",
        "--overwrite_output_dir",
    ]

    def compute():
        wall = sh(cmd, env)
        results = json.loads((out / "results.json").read_text())
        return {"command": " ".join(cmd[1:]), "wall_seconds": wall, "model": str(out), "results": results}

    record = runs.get(f"pretrain_{xlnet_arm(variant, minutes)}", compute)
    recorded = record["command"].split()[1:]  # the script, then the variant's flags, then --max_train_minutes
    if recorded[: recorded.index("--max_train_minutes")] != list(flags):  # a finished run of this name, other flags
        sys.exit(
            f"--xlnet_variant {variant}: {runs.root} holds a run of that name made with other flags "
            f"({record['command']}); rename the variant or delete that run"
        )
    return record


def pretraining_texts():
    """The XLNet-Lite run's (train, validation) documents: the recipe's default corpus."""
    from pretrain.run_pretraining import PretrainingArguments, load_corpus
    from xlnet_lite.training import parse_args

    return load_corpus(parse_args(PretrainingArguments, []))


def pretrain_bert(runs, minutes, learning_rate, tokenizer_path, tag=""):
    out = runs.root / f"bert_{minutes:g}min_lr{learning_rate:g}{tag}"

    def compute():
        from benchmarks.baselines.bert_mlm import pretrain_mlm
        from xlnet_lite.tokenization_xlnet_lite import load_tokenizer

        train, valid = pretraining_texts()
        start = time.perf_counter()
        results = pretrain_mlm(
            train,
            load_tokenizer(tokenizer_path),
            minutes=minutes,
            learning_rate=learning_rate,
            output_dir=str(out),
            eval_texts=valid,
        )
        return {
            "command": f"benchmarks.baselines.bert_mlm.pretrain_mlm(minutes={minutes}, learning_rate={learning_rate})",
            "wall_seconds": time.perf_counter() - start,
            "model": str(out),
            "results": results,
        }

    return runs.get(f"pretrain_bert_{minutes:g}min_lr{learning_rate:g}{tag}", compute)


def finetune_xlnet(runs, name, model_flags, task, seed, rt_samples, env):
    out = runs.root / "finetune" / name / f"{task}_seed{seed}"
    cmd = [
        sys.executable,
        str(REPO / "finetune" / "run_glue.py"),
        *model_flags,
        "--embedded_task",
        task,
        "--seed",
        str(seed),
        "--output_dir",
        str(out),
        *FINETUNE,
    ]
    if task == "rotten_tomatoes":
        cmd += ["--max_train_samples", str(rt_samples)]

    def compute():
        sh(cmd, env)
        r = json.loads((out / "all_results.json").read_text())
        return {
            "command": " ".join(cmd[1:]),
            "eval_accuracy": r["eval_accuracy"],
            "test_accuracy": r["test_accuracy"],
            "best_epoch": r["best_epoch"],
            "train_seconds": r["train_runtime_s"],
        }

    return runs.get(f"finetune_{name}_{task}_seed{seed}", compute)


def finetune_bert(runs, name, model_path, task, seed, rt_samples):
    def compute():
        from benchmarks.baselines.bert_mlm import finetune_bert_classifier
        from xlnet_lite.classification_data import load_splits
        from xlnet_lite.tokenization_xlnet_lite import load_tokenizer

        r = finetune_bert_classifier(
            model_path,
            load_tokenizer(model_path),
            load_splits(embedded_task=task),
            seed=seed,
            max_train_samples=rt_samples if task == "rotten_tomatoes" else None,
        )
        return {
            "command": f"benchmarks.baselines.bert_mlm.finetune_bert_classifier({model_path}, {task}, seed={seed})",
            **r,
        }

    return runs.get(f"finetune_{name}_{task}_seed{seed}", compute)


def summarize(records):
    accs = [r["test_accuracy"] for r in records]
    return {"mean": statistics.mean(accs), "std": statistics.stdev(accs) if len(accs) > 1 else 0.0, "runs": accs}


def plot(table, budgets, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(TASKS), figsize=(11, 4))
    for ax, task in zip(axes, TASKS):
        arms = [arm for arm in table[task] if arm.startswith("xlnet_lite")] + ["bert_mlm"]
        for arm, style in zip(arms, ("o-", "^-", "v-", "D-", "P-", "X-")[: len(arms) - 1] + ("s--",)):
            means = [table[task][arm][f"{m:g}"]["mean"] for m in budgets]
            stds = [table[task][arm][f"{m:g}"]["std"] for m in budgets]
            label = (
                "BERT MLM" if arm == "bert_mlm" else "XLNet-Lite PLM" + arm.removeprefix("xlnet_lite").replace("_", " ")
            )
            ax.errorbar(budgets, means, yerr=stds, fmt=style, capsize=4, label=label)
        rand = table[task]["random_init"]
        ax.axhspan(rand["mean"] - rand["std"], rand["mean"] + rand["std"], color="grey", alpha=0.25)
        ax.axhline(rand["mean"], color="grey", label="random init (XLNet-Lite)")
        ax.axhline(table[task]["tfidf"], color="black", linestyle=":", label="TF-IDF + logistic regression")
        ax.set_title(task.replace("_", " ") + " (test accuracy)")
        ax.set_xlabel("pretraining minutes (optimizer steps only)")
        ax.set_xticks(budgets)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("accuracy (mean ± std over seeds)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budgets", type=float, nargs="+", default=[3.0, 6.0], help="Pretraining minutes.")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="Finetuning seeds.")
    parser.add_argument(
        "--xlnet_variant",
        dest="xlnet_variants",
        type=parse_variant,
        action="append",
        metavar="NAME=FLAGS",
        help="An XLNet-Lite arm pretrained with these run_pretraining.py flags, e.g. "
        "'span1=--max_span_length 1'; repeatable; 'default=' is the recipe's defaults (the "
        "only arm when the flag is not given).",
    )
    parser.add_argument("--bert_lrs", type=float, nargs="+", default=[3e-4, 1e-3], help="BERT learning-rate sweep.")
    parser.add_argument("--sweep_minutes", type=float, default=1.5, help="Pretraining minutes of each sweep run.")
    parser.add_argument("--rt_train_samples", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs_dir", default="benchmarks/runs/pretraining_value")
    parser.add_argument("--out", default="benchmarks/results/pretraining_value.json")
    parser.add_argument("--plot", default="benchmarks/results/pretraining_value.png")
    args = parser.parse_args()
    os.environ.update(OMP_NUM_THREADS=str(args.threads), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    import torch

    torch.set_num_threads(args.threads)
    env = dict(os.environ)
    runs = Runs(args.runs_dir)
    budgets = sorted(args.budgets)

    variants = dict(args.xlnet_variants or [("default", [])])
    xlnet = {(v, m): pretrain_xlnet(runs, m, env, v, flags) for v, flags in variants.items() for m in budgets}
    tokenizer = str(
        Path(next(iter(xlnet.values()))["model"])
    )  # the tokenizer every run trains the same way, saved with the model
    sweep = {lr: pretrain_bert(runs, args.sweep_minutes, lr, tokenizer, tag="_sweep") for lr in args.bert_lrs}
    bert_lr = min(sweep, key=lambda lr: sweep[lr]["results"]["eval_mlm_loss"])
    bert = {m: pretrain_bert(runs, m, bert_lr, tokenizer) for m in budgets}

    from benchmarks.baselines.tfidf import tfidf_baseline
    from xlnet_lite.classification_data import load_splits

    table = {}
    for task in TASKS:
        rt = args.rt_train_samples
        splits = load_splits(embedded_task=task)
        if task == "rotten_tomatoes":
            splits["train"].data = splits["train"].data.select(range(rt))
        table[task] = {
            "tfidf": tfidf_baseline(splits)["test_accuracy"],
            **{xlnet_column(v): {} for v in variants},
            "bert_mlm": {},
        }
        table[task]["random_init"] = summarize(
            [finetune_xlnet(runs, "random_init", ["--config_name", tokenizer], task, s, rt, env) for s in args.seeds]
        )
        for m in budgets:
            for v in variants:
                table[task][xlnet_column(v)][f"{m:g}"] = summarize(
                    [
                        finetune_xlnet(
                            runs, xlnet_arm(v, m), ["--model_name_or_path", xlnet[v, m]["model"]], task, s, rt, env
                        )
                        for s in args.seeds
                    ]
                )
            table[task]["bert_mlm"][f"{m:g}"] = summarize(
                [finetune_bert(runs, f"bert_{m:g}min", bert[m]["model"], task, s, rt) for s in args.seeds]
            )

    report = {
        "command": "python -m benchmarks.bench_pretraining_value " + " ".join(sys.argv[1:]),
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "capability": torch.backends.cpu.get_cpu_capability(),
            "threads": args.threads,
            "load_average_at_end": os.getloadavg(),
        },
        "budgets_minutes": budgets,
        "seeds": args.seeds,
        "bert_learning_rate": bert_lr,
        "bert_sweep": {f"{lr:g}": s["results"]["eval_mlm_loss"] for lr, s in sweep.items()},
        "xlnet_variants": {v: shlex.join(flags) for v, flags in variants.items()},
        "pretraining": {
            **{xlnet_column(v): {f"{m:g}": xlnet[v, m]["results"] for m in budgets} for v in variants},
            "bert_mlm": {f"{m:g}": r["results"] for m, r in bert.items()},
        },
        "test_accuracy": table,
        "runs": [json.loads(p.read_text()) for p in sorted(runs.root.glob("*.json"))],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    plot(table, budgets, args.plot)
    for task in TASKS:
        t = table[task]
        print(
            f"\n{task}: TF-IDF {t['tfidf']:.3f}, random init {t['random_init']['mean']:.3f} ± {t['random_init']['std']:.3f}"
        )
        for m in budgets:
            cells = [(xlnet_column(v), t[xlnet_column(v)][f"{m:g}"]) for v in variants] + [
                ("bert_mlm", t["bert_mlm"][f"{m:g}"])
            ]
            print(f"  {m:g} min: " + "   ".join(f"{arm} {c['mean']:.3f} ± {c['std']:.3f}" for arm, c in cells))


if __name__ == "__main__":
    main()
