"""The long tables benchmarks/RESULTS.md links to, generated from the JSON result files in benchmarks/results/.

    python -m benchmarks.results_tables                  # check: exit 1 naming each generated file that differs
    python -m benchmarks.results_tables --write          # rewrite every_arm.md and compute_curve.md
    python -m benchmarks.results_tables --write --lever "NAME=FILE" --curve "SERIES=FILE"

every_arm.md: every pretrained arm measured on 20 Newsgroups, one row per (result file, labels): its pretraining
(beside the name, the flags that differ from XLNet's objective settings, spans of up to 5 tokens, 1/6 predicted,
linear decay, and from the recipe's other defaults), finetuning flags, test accuracy (mean ± std over the seeds),
validation accuracy and the gain over random initialisation with the same labels, finetuning flags and model size.
The arms, NAME=FILE pairs of a lever's name and a `benchmarks.bench_newsgroups` result file, and the files read for
their reference arms only are listed in every_arm.json. A pretrained arm is held against the file's own random-init
and TF-IDF arms, else a reference file's, else another listed file's (as `benchmarks.compute_curve` joins them); an
arm no random-init arm shares flags with keeps an empty gain.

compute_curve.md: the two tables printed by the command recorded in compute_curve.json (`python -m
benchmarks.compute_curve ...`, which writes that JSON and compute_curve.png).

--lever adds an arm to every_arm.json; --curve adds a result file to a line of the compute curve (SERIES is one of
its `--series` names or its main line's `--name`). Both need --write. A check changes nothing: it runs the curve's
command with its outputs in a temporary folder and compares. --write does the same first (a failing command stops it
with one line and leaves every file as it was), then reruns the curve's command as recorded when its table or
command changed, and writes what differs. Run from the repository's root: the files name repository paths.
"""

import argparse
import dataclasses
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.compute_curve import load_points
from main_job.compare import precision_name
from xlnet_lite.training import RecipeArguments

RESULTS = Path("benchmarks/results")
EVERY_ARM_JSON = "every_arm.json"
CURVE_JSON = "compute_curve.json"
TABLES = {"every_arm": "every_arm.md", "compute_curve": "compute_curve.md"}
HEADINGS = {
    "every_arm": (
        "Every pretrained arm measured on 20 Newsgroups: its pretraining, finetuning, test accuracy (mean ± std over "
        "the seeds), validation accuracy and gain over random initialisation in points. The arms: `every_arm.json`."
    ),
    "compute_curve": (
        "The compute curve: each point's gain over random initialisation and over TF-IDF against pretraining tokens, "
        "then where each line reaches 0, +5 and +10 points and TF-IDF. The command: `compute_curve.json`."
    ),
}

# pretraining arguments that name places or bookkeeping, not the pretraining itself: the recipes' flags that never
# make a run different (but torch_compile, which an arm's table row shows) and the data pipeline's housekeeping
NOT_A_LEVER = {*RecipeArguments.NOT_PART_OF_THE_RUN} - {"torch_compile"} | {
    "token_store_cache_dir",
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
        field.name: field.default
        for field in dataclasses.fields(PretrainingArguments)
        if field.default is not dataclasses.MISSING
    }
    defaults |= XLNET_OBJECTIVE
    return " ".join(
        f"--{name} {value:.4g}" if isinstance(value, float) else f"--{name} {value}"
        for name, value in sorted(recorded.items())
        if name in defaults and name not in NOT_A_LEVER and value != defaults[name]
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


def every_arm_rows(named_files, reference_paths=()):
    """The rows in the order the arms are named, each file read once."""
    paths = list(dict.fromkeys(path for _, path in named_files))
    points = load_points(paths, reference_paths, require_random_init=False, prefer_own=True)
    rows = []
    for name, path in named_files:
        environment = json.loads(Path(path).read_text()).get("environment", {})
        rows += [
            {
                "lever": name,
                **point,
                "pretraining_flags": changed_pretraining_flags(point["pretraining_args"]),
                "machine": machine(environment, point["device"], point["machine"]),
            }
            for point in points
            if point["file"] == path
        ]
    return rows


def plus_minus(mean, std, seeds=None):
    if mean is None:
        return ""
    return f"{mean:.3f}" + (f" ± {std:.3f}" if seeds is None or seeds > 1 else " (1 seed)")


def every_arm_markdown(rows):
    lines = [
        "| lever | labels/group | finetuning | pretraining | PLM loss - unigram | test | validation | random init "
        "| gain | machine, precision | file |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        flags = f" (`{row['pretraining_flags']}`)" if row["pretraining_flags"] else ""
        gain = "" if row["gain_over_random_init"] is None else f"{100 * row['gain_over_random_init']:+.1f}"
        validation = "" if row["pretrained_validation"] is None else format(row["pretrained_validation"], ".3f")
        test = plus_minus(row["pretrained"], row["pretrained_std"], row["seeds"])
        random_init = plus_minus(row["random_init"], row["random_init_std"], row["random_init_seeds"])
        lines.append(
            f"| {row['lever']}{flags} | {row['labels_per_class']} | {row['finetune_flags'] or 'defaults'} | "
            f"{row['pretraining_steps']:,} steps, {row['pretraining_tokens'] / 1e6:.1f}M tokens | "
            f"{row['eval_loss_minus_unigram']:+.2f} | {test} | {validation} | {random_init} | "
            f"{gain} | {row['machine']}, {precision_name(row['pretraining_precision'])} | {Path(row['file']).name} |"
        )
    return "\n".join(lines)


def with_curve_point(argv, series, path):
    """benchmarks.compute_curve arguments with one more result file on the line named `series` (a `--series` line,
    or the main line named by `--name`, default "defaults")."""
    argv = list(argv)
    main_name = argv[argv.index("--name") + 1] if "--name" in argv else "defaults"
    if series == main_name:
        argv.insert(next(i for i, word in enumerate(argv) if word.startswith("--")), path)
        return argv
    for i, word in enumerate(argv[:-1]):
        if word == "--series" and argv[i + 1] == series:
            end = i + 2
            while end < len(argv) and not argv[end].startswith("--"):
                end += 1
            argv.insert(end, path)
            return argv
    names = [main_name] + [argv[i + 1] for i, word in enumerate(argv[:-1]) if word == "--series"]
    raise ValueError(f"--curve: the compute curve has no line {series!r}; its lines: {', '.join(map(repr, names))}")


def recorded_argv(result_file):
    """The recorded command's module and its arguments after `python -m MODULE`."""
    words = shlex.split(json.loads(Path(result_file).read_text())["command"])
    if words[:2] != ["python", "-m"]:
        raise ValueError(f"{result_file}: its command does not start with `python -m`: {words[:3]}")
    return words[2], words[3:]


def run_module(module, argv, outputs_to=None):
    """Run `python -m module argv` (with --out / --plot moved into `outputs_to` when given); its stdout."""
    argv = list(argv)
    if outputs_to is not None:
        for flag in ("--out", "--plot"):
            if flag in argv:
                argv[argv.index(flag) + 1] = str(Path(outputs_to) / Path(argv[argv.index(flag) + 1]).name)
    done = subprocess.run([sys.executable, "-m", module, *argv], capture_output=True, text=True)
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"python -m {module} failed (exit status {done.returncode}): {last}")
    return done.stdout


def generated_file(name, table):
    """A generated table as its file holds it: a heading, where it comes from, the table."""
    return (
        f"<!-- generated by `python -m benchmarks.results_tables --write`; edits are overwritten -->\n\n"
        f"{HEADINGS[name]}\n\n{table.strip()}\n"
    )


def generated_tables(arms, reference, curve_module, curve_argv):
    """{name: file text} for every generated table; the curve's command runs with its outputs in a scratch folder."""
    rows = every_arm_rows(arms, reference)
    with tempfile.TemporaryDirectory() as scratch:
        curve = run_module(curve_module, curve_argv, outputs_to=scratch)
    return {
        "every_arm": generated_file("every_arm", every_arm_markdown(rows)),
        "compute_curve": generated_file("compute_curve", curve),
    }


def parse_pairs(parser, flag, values):
    """NAME=FILE values as (name, path) pairs; one error line for a malformed one or a missing file."""
    pairs = []
    for value in values:
        name, sep, path = value.rpartition("=")
        if not sep or not name:
            parser.error(f"{flag} {value!r} is not {'NAME' if flag == '--lever' else 'SERIES'}=FILE")
        if not Path(path).is_file():
            parser.error(f"{flag}: no result file {path} (for {name!r})")
        pairs.append((name, path))
    return pairs


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="Write the generated files that differ.")
    parser.add_argument(
        "--lever", action="append", default=[], metavar="NAME=FILE", help="Add an arm to the every-arm table."
    )
    parser.add_argument(
        "--curve", action="append", default=[], metavar="SERIES=FILE", help="Add a file to a compute-curve line."
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=RESULTS,
        help=f"The folder of {EVERY_ARM_JSON}, {CURVE_JSON} and the tables (default {RESULTS}).",
    )
    args = parser.parse_args(argv)
    if (args.lever or args.curve) and not args.write:
        parser.error("--lever and --curve change what the tables are made of: pass --write too")
    new_arms = parse_pairs(parser, "--lever", args.lever)
    new_points = parse_pairs(parser, "--curve", args.curve)
    for name in (EVERY_ARM_JSON, CURVE_JSON):
        if not (args.dir / name).is_file():
            parser.error(f"no file {args.dir / name} (run from the repository's root)")
    every_arm = json.loads((args.dir / EVERY_ARM_JSON).read_text())
    arms = [(arm["name"], arm["file"]) for arm in every_arm["arms"]] + new_arms
    curve_module, recorded = recorded_argv(args.dir / CURVE_JSON)
    curve_argv = recorded
    try:
        for series, path in new_points:
            curve_argv = with_curve_point(curve_argv, series, path)
    except ValueError as error:
        parser.error(str(error))

    try:
        texts = generated_tables(arms, every_arm["reference"], curve_module, curve_argv)
    except (RuntimeError, ValueError) as error:
        print(f"results_tables.py: error: {error}", file=sys.stderr)
        return 2
    paths = {name: args.dir / file_name for name, file_name in TABLES.items()}
    stale = [name for name, path in paths.items() if not path.is_file() or path.read_text() != texts[name]]
    if args.write:
        if new_arms:
            every_arm["arms"] += [{"name": name, "file": path} for name, path in new_arms]
            (args.dir / EVERY_ARM_JSON).write_text(json.dumps(every_arm, indent=2, ensure_ascii=False) + "\n")
        if curve_argv != recorded or "compute_curve" in stale:
            run_module(curve_module, curve_argv)  # as recorded: its JSON (with the new command) and its plot
        for name in stale:
            paths[name].write_text(texts[name])
        print(f"{args.dir}: {', '.join(TABLES[name] for name in stale) or 'nothing'} written")
        return 0
    for name in stale:
        print(f"{paths[name]} differs from what its result files give", file=sys.stderr)
    if stale:
        print("python -m benchmarks.results_tables --write rewrites it", file=sys.stderr)
        return 1
    print(f"{args.dir}: {', '.join(TABLES.values())} are what their result files give")
    return 0


if __name__ == "__main__":
    sys.exit(main())
