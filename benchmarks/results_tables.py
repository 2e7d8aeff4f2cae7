"""The generated tables of benchmarks/RESULTS.md, kept equal to what their commands print.

The every-arm table (`benchmarks.levers`) and the compute curve's two tables (`benchmarks.compute_curve`) are printed
by commands recorded in their result files (`command` in benchmarks/results/levers.json and compute_curve.json). This
reruns each recorded command and finds each markdown table it prints in RESULTS.md by its header row (which must
occur there once); the table there is the run of `|` lines from that row.

    python -m benchmarks.results_tables                  # check: exit 1 naming each table that differs
    python -m benchmarks.results_tables --write          # rerun the commands as recorded, replace the tables
    python -m benchmarks.results_tables --write --lever "NAME=FILE" --curve "SERIES=FILE"

--lever adds an arm to the every-arm table (NAME=FILE as `benchmarks.levers` takes it); --curve adds a result file to
a line of the compute curve: SERIES is the name of one of its `--series` lines or its main line's `--name`. Both
change the recorded command, so they need --write. A check reruns the commands with their outputs in a temporary
folder and changes nothing; --write does the same first (a command that fails stops it with one line and leaves
every file as it was), then reruns them as recorded (their JSON, with the new command, and the plot).
Run from the repository's root, as the recorded commands are.
"""

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

DOC = Path("benchmarks/RESULTS.md")
GENERATED = {
    "levers": Path("benchmarks/results/levers.json"),
    "compute_curve": Path("benchmarks/results/compute_curve.json"),
}


def markdown_tables(text):
    """Each run of consecutive lines starting with `|`, as a list of lines."""
    tables, current = [], []
    for line in text.splitlines():
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    if current:
        tables.append(current)
    return tables


def table_in_doc(doc_lines, table):
    """(start, end) of the table in the document whose header row is `table`'s; ValueError unless exactly one."""
    starts = [i for i, line in enumerate(doc_lines) if line == table[0]]
    if len(starts) != 1:
        raise ValueError(f"the table headed {table[0][:80]!r} occurs {len(starts)} times in the document, not once")
    end = starts[0]
    while end < len(doc_lines) and doc_lines[end].startswith("|"):
        end += 1
    return starts[0], end


def replace_tables(doc, tables):
    """The document with each table replaced by its new version (found by header row)."""
    lines = doc.split("\n")
    for table in tables:
        start, end = table_in_doc(lines, table)
        lines[start:end] = table
    return "\n".join(lines)


def differing_tables(doc, tables):
    """The header rows of the tables whose rows in the document are not these."""
    lines = doc.split("\n")
    return [table[0] for table in tables if lines[slice(*table_in_doc(lines, table))] != table]


def with_lever(argv, arm):
    """benchmarks.levers arguments with one more NAME=FILE arm, after the others."""
    argv = list(argv)
    at = (
        argv.index("--reference")
        if "--reference" in argv
        else next(i for i, a in enumerate(argv) if a.startswith("--"))
    )
    argv.insert(at, arm)
    return argv


def with_curve_point(argv, series, path):
    """benchmarks.compute_curve arguments with one more result file on the line named `series` (a `--series` line,
    or the main line named by `--name`, default "defaults")."""
    argv = list(argv)
    main_name = argv[argv.index("--name") + 1] if "--name" in argv else "defaults"
    if series == main_name:
        argv.insert(next(i for i, a in enumerate(argv) if a.startswith("--")), path)
        return argv
    for i, a in enumerate(argv[:-1]):
        if a == "--series" and argv[i + 1] == series:
            end = i + 2
            while end < len(argv) and not argv[end].startswith("--"):
                end += 1
            argv.insert(end, path)
            return argv
    names = [main_name] + [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--series"]
    raise ValueError(f"--curve: the compute curve has no line {series!r}; its lines: {', '.join(map(repr, names))}")


def recorded_argv(result_file):
    """The recorded command's arguments after `python -m MODULE`, and the module."""
    words = shlex.split(json.loads(result_file.read_text())["command"])
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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="Rerun the commands as recorded and replace the tables.")
    parser.add_argument(
        "--lever", action="append", default=[], metavar="NAME=FILE", help="Add an arm to the every-arm table."
    )
    parser.add_argument(
        "--curve", action="append", default=[], metavar="SERIES=FILE", help="Add a file to a compute-curve line."
    )
    parser.add_argument("--doc", type=Path, default=DOC, help="The results document (default benchmarks/RESULTS.md).")
    args = parser.parse_args(argv)
    if (args.lever or args.curve) and not args.write:
        parser.error("--lever and --curve change the recorded commands: pass --write too")
    for flag, value in [("--lever", v) for v in args.lever] + [("--curve", v) for v in args.curve]:
        name, sep, path = value.rpartition("=")
        if not sep or not name:
            parser.error(f"{flag} {value!r} is not {'NAME' if flag == '--lever' else 'SERIES'}=FILE")
        if not Path(path).is_file():
            parser.error(f"{flag}: no result file {path}")
    for path in [args.doc, *GENERATED.values()]:
        if not path.is_file():
            parser.error(f"no file {path} (run from the repository's root)")
    commands = {key: recorded_argv(path) for key, path in GENERATED.items()}
    module, lever_argv = commands["levers"]
    for arm in args.lever:
        lever_argv = with_lever(lever_argv, arm)
    commands["levers"] = module, lever_argv
    module, curve_argv = commands["compute_curve"]
    try:
        for value in args.curve:
            series, _, path = value.rpartition("=")
            curve_argv = with_curve_point(curve_argv, series, path)
    except ValueError as error:
        parser.error(str(error))
    commands["compute_curve"] = module, curve_argv

    doc = args.doc.read_text()
    try:  # every command first with its outputs in a scratch folder: a failing one leaves no file half rewritten
        with tempfile.TemporaryDirectory() as scratch:
            tables = [
                table
                for module, margv in commands.values()
                for table in markdown_tables(run_module(module, margv, outputs_to=scratch))
            ]
        stale = differing_tables(doc, tables)
    except (RuntimeError, ValueError) as error:
        print(f"results_tables.py: error: {error}", file=sys.stderr)
        return 2
    if args.write:
        for module, margv in commands.values():
            run_module(module, margv)
        new = replace_tables(doc, tables)
        if new != doc:
            args.doc.write_text(new)
        print(f"{args.doc}: {len(tables)} tables written ({sum(len(t) - 2 for t in tables)} rows)")
        return 0
    for header in stale:
        print(f"{args.doc}: the table headed {header[:100]!r} differs from what its command prints", file=sys.stderr)
    if stale:
        print("python -m benchmarks.results_tables --write replaces them", file=sys.stderr)
        return 1
    print(f"{args.doc}: its {len(tables)} generated tables are what their commands print")
    return 0


if __name__ == "__main__":
    sys.exit(main())
