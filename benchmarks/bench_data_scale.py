"""Pretraining corpora of growing size: tokenization time, token store size, peak RSS, time to the first step; and the
tokenizer's quality against the size of its training sample.

    python -m benchmarks.bench_data_scale [--sizes_mb 50 500 2000] [--kinds short long]
                                          [--work_dir /tmp/xlnet_lite_data_scale] [--old_commit REV]
                                          [--out benchmarks/results/data_scale.json] [--steps 50] [--no_prepare]
                                          [--extra_args "--model_size tiny --vocab_size 2000"]
    python -m benchmarks.bench_data_scale --tokenizer_quality_mb 0.5 1 2 4 8 16 [--quality_corpora ...] --out F.json

For each kind and size, a text file of that many MB is made on the fly from the embedded 20 Newsgroups training text,
repeated (documents separated by blank lines), and removed afterwards: its messages (kind "short", ~1.4 KB a document)
or the messages joined into ~15 KB documents (kind "long", as story collections or transcripts). Then, each a fresh
process of pretrain/run_pretraining.py with the recipe's defaults (and --extra_args) and --steps steps:
  - `--prepare_only` with 1 tokenizing process (the default) and with 2, each into an empty cache: tokenization time,
    store size (left out with --no_prepare);
  - a first run (empty cache: tokenizer, store, the steps) and a second run on the same corpus with another output
    folder (the cache kept): peak RSS of the pretraining process (its own maximum resident set, read by the process
    at exit; the tokenizing workers are separate processes, reported apart), its resident and anonymous memory every
    2 s, and the seconds from the process start to its "data:" line (the stream and the validation batches built, the
    first step next).
With --old_commit, the first run is repeated with the recipe of that commit (checked out into the work folder) for a
side-by-side of the in-memory pipeline.

--tokenizer_quality_mb instead trains tokenizers (as the recipe does: TokenizerSample, train_tokenizer) on samples of
that many million characters of the embedded corpora, 10% of their messages held out, and reports the tokens per
character and the unigram loss per character of the held-out text, with the training seconds and memory.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
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


def newsgroups_documents(kind: str = "short", messages: list[str] | None = None) -> list[str]:
    """The embedded 20 Newsgroups training messages (blank lines inside a message closed up), or with kind "long"
    those messages joined in order into documents of ~15 KB on average (the first message past 12,500 characters ends
    one), as story collections or transcripts are."""
    if messages is None:
        from xlnet_lite.embedded_datasets import embedded_newsgroups_pretraining_texts

        messages = embedded_newsgroups_pretraining_texts()
    docs = [t.replace("\n\n", "\n").strip() for t in messages if t.strip()]
    if kind == "short":
        return docs
    long, current, size = [], [], 0
    for doc in docs:
        current.append(doc)
        size += len(doc) + 1
        if size >= LONG_DOCUMENT_CHARACTERS:
            long.append("\n".join(current))
            current, size = [], 0
    return long + (["\n".join(current)] if current else [])


LONG_DOCUMENT_CHARACTERS = 12_500


def make_corpus(path: Path, megabytes: float, kind: str = "short") -> dict:
    """The embedded 20 Newsgroups training text repeated to `megabytes` MB (`newsgroups_documents(kind)`: its messages,
    or ~15 KB documents of them); each copy's documents in the same order, separated by blank lines."""
    docs = newsgroups_documents(kind)
    block = ("\n\n".join(docs) + "\n\n").encode()
    target = int(megabytes * 1e6)
    with open(path, "wb") as f:
        written = 0
        while written < target:
            piece = block[: target - written]
            f.write(piece)
            written += len(piece)
    return {
        "kind": kind,
        "bytes": path.stat().st_size,
        "documents_per_copy": len(docs),
        "mean_document_bytes": round(len(block) / len(docs)),
        "copies": target / len(block),
    }


def sample_memory(pid: int, start: float, timeline: list, stop: threading.Event, every: float = 2.0) -> None:
    """(seconds, resident MB, anonymous MB) of a process every `every` seconds until it ends or `stop` is set."""
    while not stop.is_set():
        try:
            seconds = round(time.perf_counter() - start, 1)
            resident, anonymous = _status_mb("VmRSS", pid), _status_mb("RssAnon", pid)
        except OSError:
            return
        if resident != resident or anonymous != anonymous:  # NaN: the process has exited, its status has no memory
            return
        timeline.append([seconds, round(resident), round(anonymous)])
        stop.wait(every)


def run_recipe(args: list[str], *, cwd: Path, env: dict) -> dict:
    """One recipe process: wall seconds, seconds to its "data:" line, peak RSS (MB) of it and of its children, CPU
    seconds of both (over the wall seconds: the cores it kept busy), its resident and anonymous memory every 2 s
    ("memory": [seconds, MB, MB]) and the times of its tokenizer, store and data lines ("log": [seconds, line])."""
    start = time.perf_counter()
    timeline, stop, log = [], threading.Event(), []
    with tempfile.TemporaryFile("w+") as err:  # a file, not a pipe: progress bars would fill a pipe nobody reads yet
        proc = subprocess.Popen(
            [sys.executable, "-c", WRAPPER, "pretrain/run_pretraining.py", *args],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
        sampler = threading.Thread(target=sample_memory, args=(proc.pid, start, timeline, stop), daemon=True)
        sampler.start()
        first_line_at, data_line_at, lines = None, None, []
        for line in proc.stdout:
            lines.append(line)
            first_line_at = first_line_at or time.perf_counter() - start
            if data_line_at is None and line.startswith("data:"):
                data_line_at = time.perf_counter() - start
            if any(word in line for word in ("tokenizer", "store", "data:")):
                log.append([round(time.perf_counter() - start, 1), line.strip()[:300]])
        proc.wait()
        stop.set()
        sampler.join()
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
        "peak_anonymous_mb_sampled": max((m[2] for m in timeline), default=None),
        "log": log,
        "memory": timeline,
    }


def folder_mb(path: Path) -> float:
    return round(sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6, 1)


def bench_size(
    megabytes: float,
    work: Path,
    *,
    old_repo: Path | None,
    steps: int,
    two_processes: bool,
    kind: str = "short",
    extra: tuple[str, ...] = (),
    prepare: bool = True,
) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    corpus = work / "corpus.txt"
    record = {"megabytes": megabytes, "corpus": make_corpus(corpus, megabytes, kind), "extra_args": list(extra)}
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
        *extra,
    ]

    for workers in ([1, 2] if two_processes else [1]) if prepare else []:
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


QUALITY_CORPORA = {
    "newsgroups": "the 20 Newsgroups training messages (~1.4 KB each)",
    "newsgroups_long": "the same messages joined into ~15 KB documents",
    "newsgroups+news": "the 20 Newsgroups messages and the embedded news articles",
}


def quality_corpus(name: str) -> tuple[list[str], list[str]]:
    """(training documents, held-out documents) of a QUALITY_CORPORA name: 10% of the messages (articles) held out,
    spread over the corpus; the long documents are made of the training messages only."""
    from xlnet_lite.data import held_out_positions
    from xlnet_lite.embedded_datasets import embedded_news_pretraining_texts, embedded_newsgroups_pretraining_texts

    messages = embedded_newsgroups_pretraining_texts()
    if name == "newsgroups+news":
        messages = messages + embedded_news_pretraining_texts()
    messages = newsgroups_documents("short", messages)
    held = set(held_out_positions(len(messages), 10))
    train = [t for i, t in enumerate(messages) if i not in held]
    held_out = [messages[i] for i in sorted(held)]
    return newsgroups_documents("long" if name.endswith("_long") else "short", train), held_out


def quality_point(corpus: str, megabytes: float, vocab_size: int) -> dict:
    """One tokenizer trained on `megabytes` million characters spread over `corpus` (TokenizerSample, as the recipe
    samples): its tokens per character and unigram loss (nats per character: minus the summed log-probability of
    the pieces of the best segmentation) on the held-out text, seconds, and the process's memory (MB) before and at
    the peak of training."""
    import resource

    import numpy as np

    from xlnet_lite.data import TokenizerSample
    from xlnet_lite.tokenization_xlnet_lite import train_tokenizer

    train, held_out = quality_corpus(corpus)
    sample = TokenizerSample(train, int(megabytes * 1e6))
    rss_before = _status_mb("VmRSS")
    start = time.perf_counter()
    tokenizer = train_tokenizer(sample, vocab_size=vocab_size)
    seconds = time.perf_counter() - start
    backend = tokenizer.backend_tokenizer
    scores = np.array([score for _, score in json.loads(backend.to_str())["model"]["vocab"]])
    ids = np.concatenate([e.ids for e in backend.encode_batch(held_out, add_special_tokens=False)])
    characters = sum(len(t) for t in held_out)
    return {
        "corpus": corpus,
        "sample_mb": megabytes,
        "vocab_size": vocab_size,
        "sample_characters": sample.characters,
        "sample_documents": sample.documents,
        "corpus_characters": sample.measure()[1],
        "tokens_per_character": round(len(ids) / characters, 5),
        "unigram_loss_per_character": round(float(-scores[ids].sum()) / characters, 5),
        "unknown_tokens": int((ids == 0).sum()),
        "train_seconds": round(seconds, 1),
        "rss_before_mb": round(rss_before),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }


def _status_mb(field: str, pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def tokenizer_quality(sizes_mb: list[float], vocab_sizes: list[int], corpora: list[str], out: Path) -> dict:
    """`quality_point` for each corpus, vocabulary size and sample size, each in a fresh process."""
    results = {
        "environment": environment(),
        "command": "python -m benchmarks.bench_data_scale " + " ".join(sys.argv[1:]),
        "corpora": {name: QUALITY_CORPORA[name] for name in corpora},
        "points": [],
    }
    for corpus in corpora:
        for vocab in vocab_sizes:
            for mb in sizes_mb:
                code = (
                    "import json; from benchmarks.bench_data_scale import quality_point; "
                    f"print(json.dumps(quality_point({corpus!r}, {mb!r}, {vocab!r})))"
                )
                run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
                point = json.loads(run.stdout.strip().splitlines()[-1])
                results["points"].append(point)
                print(point, flush=True)
                out.write_text(json.dumps(results, indent=2) + "\n")
    return results


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
    parser.add_argument(
        "--kinds",
        nargs="+",
        default=["short"],
        choices=["short", "long"],
        help="Corpora of 20 Newsgroups messages (short) and of ~15 KB documents made of them (long).",
    )
    parser.add_argument(
        "--tokenizer_quality_mb",
        type=float,
        nargs="+",
        default=None,
        help="Instead: tokenizer quality against its sample's size (these millions of characters) on the embedded "
        "corpora (--quality_corpora), at --quality_vocab_sizes.",
    )
    parser.add_argument("--quality_corpora", nargs="+", default=list(QUALITY_CORPORA), choices=list(QUALITY_CORPORA))
    parser.add_argument("--quality_vocab_sizes", type=int, nargs="+", default=[8000, 2000])
    parser.add_argument("--extra_args", default="", help="More recipe flags for every run (e.g. '--vocab_size 2000').")
    parser.add_argument("--no_prepare", action="store_true", help="Only the first and second runs (no --prepare_only).")
    args = parser.parse_args(argv)
    if args.tokenizer_quality_mb:
        results = tokenizer_quality(
            args.tokenizer_quality_mb, args.quality_vocab_sizes, args.quality_corpora, Path(args.out)
        )
        print(json.dumps(results, indent=2))
        return
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
        for kind in args.kinds:
            for mb in args.sizes_mb:
                results["sizes"].append(
                    bench_size(
                        mb,
                        work / f"{kind}-{mb:g}mb",
                        old_repo=old_repo if mb <= args.old_max_mb else None,
                        steps=args.steps,
                        two_processes=mb <= args.two_processes_max_mb,
                        kind=kind,
                        extra=tuple(args.extra_args.split()),
                        prepare=not args.no_prepare,
                    )
                )
                Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    finally:
        if old_repo is not None:
            subprocess.run(["git", "worktree", "remove", "--force", str(old_repo)], cwd=REPO)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
