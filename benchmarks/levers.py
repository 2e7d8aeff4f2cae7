"""Every lever measured on 20 Newsgroups in one table: each arm's pretraining, finetuning flags, seeds, test accuracy
(mean ± std), validation accuracy and its gain over random initialisation with the same finetuning flags.

    python -m benchmarks.levers "600 steps=benchmarks/results/newsgroups_zen5_pt600_50pc_8ep.json" \
        "600 steps, 1/3 predicted=benchmarks/results/newsgroups_epyc_plm3_600_50pc_8ep.json" ... \
        --reference benchmarks/results/newsgroups_s1c1500_50pc_8ep.json --out benchmarks/results/levers.json

Each argument is NAME=FILE, a result file of `benchmarks.bench_newsgroups` and the lever it measures; the random-init
and TF-IDF references are joined as `benchmarks.compute_curve` joins them (same labels and finetuning flags; a GPU
point against a GPU random arm, a model size against the same size's): the file's own arms first, then a --reference
file's, then another named file's.
An arm whose finetuning flags no file's random arm shares keeps an empty gain.
Where the file records its pretraining's arguments (`pretraining_args`), the flags that differ from XLNet's objective
settings (spans of up to 5 tokens, 1/6 predicted, linear decay: where the levers start from) and the pretraining
recipe's other defaults are listed beside the name, so the name can be checked against what ran.
"""

import argparse
import dataclasses
import json
import shlex
import sys
from pathlib import Path

from benchmarks.compute_curve import load_points, precision_name

# arguments that name places or bookkeeping, not the pretraining itself
NOT_A_LEVER = {
    "output_dir",
    "overwrite_output_dir",
    "resume_from_checkpoint",
    "token_store_cache_dir",
    "logging_steps",
    "checkpointing_steps",
    "save_total_limit",
    "with_tracking",
    "report_to",
    "push_to_hub",
    "hub_model_id",
    "hub_token",
    "eval_steps",
    "eval_batches",
    "preprocessing_num_workers",
    "prepare_only",
    "max_steps",
}


def changed_pretraining_flags(recorded):
    """`--flag value` for each recorded pretraining argument that differs from XLNet's objective settings and the
    recipe's other defaults (None: not recorded)."""
    if recorded is None:
        return None
    from pretrain.run_pretraining import XLNET_OBJECTIVE, PretrainingArguments

    defaults = {
        f.name: f.default for f in dataclasses.fields(PretrainingArguments) if f.default is not dataclasses.MISSING
    }
    defaults |= XLNET_OBJECTIVE
    return " ".join(
        f"--{k} {v:.4g}" if isinstance(v, float) else f"--{k} {v}"
        for k, v in sorted(recorded.items())
        if k in defaults and k not in NOT_A_LEVER and v != defaults[k]
    )


def machine(environment, device, gpu):
    """A short name for where the arm ran: the GPU, or the CPU with the units that decide its bf16 speed."""
    if device == "gpu":
        return gpu
    units, cpu = environment.get("cpu_bf16_units") or {}, str(environment.get("cpu"))
    kind = (
        "AMX" if units.get("amx") else "AVX512-BF16" if units.get("avx512_bf16") else environment.get("cpu_capability")
    )
    name = next((short for short in ("Xeon", "EPYC") if short in cpu), cpu)
    return f"{name} ({kind})" if kind else name


def lever_rows(named_files, reference_paths=()):
    """The rows in the order the arms were named. Each file is read once: its own random-init and TF-IDF arms, where
    it has them, are the ones its pretrained arm is held against; otherwise a --reference file's, then another named
    file's with the same labels and flags."""
    paths = list(dict.fromkeys(path for _, path in named_files))
    points = load_points(paths, reference_paths, require_random_init=False, prefer_own=True)
    rows = []
    for name, path in named_files:
        environment = json.loads(Path(path).read_text()).get("environment", {})
        rows += [
            {
                "lever": name,
                **q,
                "pretraining_flags": changed_pretraining_flags(q["pretraining_args"]),
                "machine": machine(environment, q["device"], q["machine"]),
            }
            for q in points
            if q["file"] == path
        ]
    return rows


def _pm(mean, std, seeds=None):
    if mean is None:
        return ""
    return f"{mean:.3f}" + (f" ± {std:.3f}" if seeds is None or seeds > 1 else " (1 seed)")


def markdown(rows):
    lines = [
        "| lever | labels/group | finetuning | pretraining | PLM loss - unigram | test | validation | random init "
        "| gain | machine, precision | file |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for q in rows:
        flags = "" if not q["pretraining_flags"] else f" (`{q['pretraining_flags']}`)"
        gain = "" if q["gain_over_random_init"] is None else f"{100 * q['gain_over_random_init']:+.1f}"
        lines.append(
            f"| {q['lever']}{flags} | {q['labels_per_class']} | {q['finetune_flags'] or 'defaults'} | "
            f"{q['pretraining_steps']:,} steps, {q['pretraining_tokens'] / 1e6:.1f}M tokens | "
            f"{q['eval_loss_minus_unigram']:+.2f} | {_pm(q['pretrained'], q['pretrained_std'], q['seeds'])} | "
            f"{'' if q['pretrained_validation'] is None else format(q['pretrained_validation'], '.3f')} | "
            f"{_pm(q['random_init'], q['random_init_std'], q['random_init_seeds'])} | {gain} | {q['machine']}, "
            f"{precision_name(q['pretraining_precision'])} | {Path(q['file']).name} |"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "arms", nargs="+", metavar="NAME=FILE", help="a lever's name and its bench_newsgroups result file"
    )
    parser.add_argument("--reference", nargs="+", default=[], help="Files read for their random-init and TF-IDF arms.")
    parser.add_argument("--out", help="Write the rows as JSON here.")
    args = parser.parse_args(argv)
    named = []
    for arm in args.arms:
        name, sep, path = arm.rpartition("=")
        if not sep or not name:
            parser.error(f"{arm!r} is not NAME=FILE")
        if not Path(path).is_file():
            parser.error(f"no result file {path} (for {name!r})")
        named.append((name, path))
    for path in args.reference:
        if not Path(path).is_file():
            parser.error(f"no result file {path} (--reference)")
    rows = lever_rows(named, args.reference)
    print(markdown(rows))
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "command": "python -m benchmarks.levers " + shlex.join(argv if argv is not None else sys.argv[1:]),
                    "rows": rows,
                },
                indent=2,
            )
            + "\n"
        )
    return rows


if __name__ == "__main__":
    main()
