"""Pretraining corpora of growing size: tokenization time, token store size, peak RSS, time to the first step.

    python -m benchmarks.bench_data_scale [--sizes_mb 50 500 2000] [--work_dir /tmp/xlnet_lite_data_scale]
                                          [--out benchmarks/results/data_scale.json] [--old_commit REV]

For each size, a text file of that many MB is made on the fly from the embedded 20 Newsgroups training text, repeated
(documents separated by blank lines), and removed afterwards. Then, each a fresh process of pretrain/run_pretraining.py
with the recipe's defaults and 50 steps:
  - `--prepare_only` with 1 tokenizing process (the default) and with 2, each into an empty cache: tokenization time,
    store size;
  - a first run (empty cache: tokenizer, store, 50 steps) and a second run on the same corpus with another output
    folder (the cache kept): peak RSS of the pretraining process (its own maximum resident set, read by the process
    at exit; the tokenizing workers are separate processes, reported apart), and the seconds from the process start to
    its "data:" line (the stream and the validation batches built, the first step next).
With --old_commit, the first run is repeated with the recipe of that commit (checked out into the work folder) for a
side-by-side of the in-memory pipeline.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.environment import REPO, environment

# Runs the recipe as __main__, then prints its own peak RSS and its children's (KiB, Linux) and the CPU seconds of
# both on stderr.
WRAPPER = """
import resource, runpy, sys
script = sys.argv[1]
sys.argv = sys.argv[1:]
try:
    runpy.run_path(script, run_name="__main__")
finally:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
    print(f"BENCH_RSS_KIB {own.ru_maxrss} {children.ru_maxrss} {cpu:.1f}", file=sys.stderr, flush=True)
"""


def make_corpus(path: Path, megabytes: float) -> dict:
    """The embedded 20 Newsgroups training text repeated to `megabytes` MB; each copy's documents in the same order."""
    from xlnet_lite.embedded_datasets import embedded_newsgroups_pretraining_texts

    docs = [t.replace("\n\n", "\n").strip() for t in embedded_newsgroups_pretraining_texts() if t.strip()]
    block = ("\n\n".join(docs) + "\n\n").encode()
    target = int(megabytes * 1e6)
    with open(path, "wb") as f:
        written = 0
        while written < target:
            piece = block[: target - written]
            f.write(piece)
            written += len(piece)
    return {"bytes": path.stat().st_size, "documents_per_copy": len(docs), "copies": target / len(block)}


def run_recipe(args: list[str], *, cwd: Path, env: dict) -> dict:
    """One recipe process: wall seconds, seconds to its "data:" line, peak RSS (MB) of it and of its children, CPU
    seconds of both (over the wall seconds: the cores it kept busy)."""
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as err:  # a file, not a pipe: progress bars would fill a pipe nobody reads yet
        proc = subprocess.Popen(
            [sys.executable, "-c", WRAPPER, "pretrain/run_pretraining.py", *args],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
        first_line_at, data_line_at, lines = None, None, []
        for line in proc.stdout:
            lines.append(line)
            first_line_at = first_line_at or time.perf_counter() - start
            if data_line_at is None and line.startswith("data:"):
                data_line_at = time.perf_counter() - start
        proc.wait()
        err.seek(0)
        stderr = err.read()
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{args}: exit {proc.returncode}\n{''.join(lines)[-2000:]}\n{stderr[-3000:]}")
    rss = next(line.split()[1:] for line in stderr.splitlines() if line.startswith("BENCH_RSS_KIB"))
    return {
        "wall_seconds": round(wall, 2),
        "seconds_to_first_line": round(first_line_at, 2),
        "seconds_to_data_line": None if data_line_at is None else round(data_line_at, 2),
        "peak_rss_mb": round(int(rss[0]) / 1024),
        "children_peak_rss_mb": round(int(rss[1]) / 1024),
        "cpu_seconds": float(rss[2]),
    }


def folder_mb(path: Path) -> float:
    return round(sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6, 1)


def bench_size(megabytes: float, work: Path, *, old_repo: Path | None, steps: int, two_processes: bool) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    corpus = work / "corpus.txt"
    record = {"megabytes": megabytes, "corpus": make_corpus(corpus, megabytes)}
    env = {**os.environ, "OMP_NUM_THREADS": "2", "TOKENIZERS_PARALLELISM": "true"}
    common = [
        "--train_file",
        str(corpus),
        "--max_steps",
        str(steps),
        "--eval_steps",
        str(steps),
        "--logging_steps",
        "10",
        "--num_warmup_steps",
        "10",
        "--checkpointing_steps",
        "0",
    ]

    for workers in [1, 2] if two_processes else [1]:
        cache = work / f"cache-prepare-{workers}"
        r = run_recipe(
            [
                *common,
                "--prepare_only",
                "--preprocessing_num_workers",
                str(workers),
                "--output_dir",
                str(work / f"prepare-{workers}"),
                "--token_store_cache_dir",
                str(cache),
            ],
            cwd=REPO,
            env=env,
        )
        store = next(cache.glob("store-*"))
        meta = json.loads((store / "store.json").read_text())
        record[f"prepare_{workers}_processes"] = {
            **r,
            "store_build_seconds": meta["build_seconds"],
            "store_mb": folder_mb(store),
            "tokens": meta["splits"]["train"]["tokens"] + meta["splits"]["validation"]["tokens"],
        }
        shutil.rmtree(cache)
        print(megabytes, f"prepare {workers}", record[f"prepare_{workers}_processes"], flush=True)

    cache = work / "cache"
    for name in ("first_run", "second_run"):
        record[name] = run_recipe(
            [*common, "--output_dir", str(work / name), "--token_store_cache_dir", str(cache)], cwd=REPO, env=env
        )
        print(megabytes, name, record[name], flush=True)
    shutil.rmtree(cache)
    if old_repo is not None:
        record["first_run_old_commit"] = run_recipe([*common, "--output_dir", str(work / "old")], cwd=old_repo, env=env)
        print(megabytes, "old", record["first_run_old_commit"], flush=True)
    for name in ("first_run", "second_run", "old", "prepare-1", "prepare-2"):
        shutil.rmtree(work / name, ignore_errors=True)
    corpus.unlink()
    return record


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes_mb", type=float, nargs="+", default=[50, 500, 2000])
    parser.add_argument("--work_dir", default="/tmp/xlnet_lite_data_scale")
    parser.add_argument("--out", default="benchmarks/results/data_scale.json")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--old_commit", default=None, help="Also run the first run with the recipe of this commit.")
    parser.add_argument("--old_max_mb", type=float, default=600, help="Run --old_commit only up to this size.")
    parser.add_argument(
        "--two_processes_max_mb",
        type=float,
        default=600,
        help="Time tokenization with 2 processes (beside 1, the recipe's default) up to this size.",
    )
    args = parser.parse_args(argv)
    work = Path(args.work_dir)
    old_repo = None
    if args.old_commit:
        old_repo = work / "old_repo"
        shutil.rmtree(old_repo, ignore_errors=True)
        subprocess.run(["git", "worktree", "prune"], cwd=REPO, check=True)  # a worktree left by a killed run
        subprocess.run(["git", "worktree", "add", "--detach", str(old_repo), args.old_commit], cwd=REPO, check=True)
    results = {
        "environment": environment(),
        "command": "python -m benchmarks.bench_data_scale " + " ".join(argv or sys.argv[1:]),
        "old_commit": args.old_commit,
        "sizes": [],
    }
    try:
        for mb in args.sizes_mb:
            results["sizes"].append(
                bench_size(
                    mb,
                    work / f"{mb:g}mb",
                    old_repo=old_repo if mb <= args.old_max_mb else None,
                    steps=args.steps,
                    two_processes=mb <= args.two_processes_max_mb,
                )
            )
            Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    finally:
        if old_repo is not None:
            subprocess.run(["git", "worktree", "remove", "--force", str(old_repo)], cwd=REPO)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
