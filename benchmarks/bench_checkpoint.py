"""What proving bytes costs: a checkpoint's manifest and a token store's verification.

Checkpoints: the recipes' checkpoint (accelerate's state: model, optimizer, scheduler, RNG; the trainer state) written
with `xlnet_lite.training.Checkpoints.save`, and the manifest (xxh3-128, and sha256 beside it) of the same folder
timed on its own, per model preset, medians of --runs writes.

    python -m benchmarks.bench_checkpoint [--presets small base] [--runs 5] [--out benchmarks/results/checkpoint.json]

Goal: the manifest adds < 10% to a checkpoint's write time. The checkpoints go to a temporary folder on the disk
that holds --dir (default: the system's temporary folder).

Token stores (--store_gb): a real store of the embedded 20 Newsgroups training text (a 2000-piece tokenizer) is built
and timed, then its training stream is repeated to a store of about --store_gb GB (hashed as `write_token_store`
hashes); `TokenStore.verify` of that store is timed --runs times with the store in the page cache (warm) and, where
this process may drop the page cache (root: /proc/sys/vm/drop_caches), from the disk (cold); beside them, xxh3 over
the stream at other chunk sizes, and the pass over every training token the pretraining recipe makes before its first
step anyway (`PretrainingStream.token_counts`, the unigram baseline).

    python -m benchmarks.bench_checkpoint --store_gb 1 [--runs 3] --out benchmarks/results/token_store_verify.json

Goal: verifying a 1 GB store takes < 2 s on 2 cores with a warm page cache.
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from accelerate import Accelerator

import xlnet_lite
from benchmarks.environment import environment
from xlnet_lite import integrity, token_store
from xlnet_lite.data import PretrainingStream
from xlnet_lite.embedded_datasets import embedded_newsgroups_pretraining_texts
from xlnet_lite.integrity import ALGORITHM, file_digest, folder_size, write_manifest
from xlnet_lite.model_utils import MODEL_PRESETS
from xlnet_lite.tokenization_xlnet_lite import train_tokenizer
from xlnet_lite.training import Checkpoints, write_json


def measure(preset: str, runs: int, root: Path) -> dict:
    model = xlnet_lite.XLNetLiteLMHeadModel(xlnet_lite.XLNetLiteConfig(**MODEL_PRESETS[preset], vocab_size=8000))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randint(0, 8000, (2, 16)), labels=torch.randint(0, 8000, (2, 16))).loss.backward()
    optimizer.step()  # the optimizer state exists, as in a real checkpoint
    accelerator = Accelerator(cpu=True)
    model, optimizer = accelerator.prepare(model, optimizer)
    checkpoints = Checkpoints(accelerator, root / preset, save_total_limit=1)
    saves, manifests, sha256 = [], [], []
    for step in range(1, runs + 1):
        start = time.perf_counter()
        path = checkpoints.save(step, trainer_state={"step": step}, rank_state={})
        saves.append(time.perf_counter() - start)
        start = time.perf_counter()
        write_manifest(path)  # the same work again, timed alone
        manifests.append(time.perf_counter() - start)
        start = time.perf_counter()
        for file in path.rglob("*"):
            if file.is_file():
                file_digest(file, "sha256")
        sha256.append(time.perf_counter() - start)
    save, manifest, slow = statistics.median(saves), statistics.median(manifests), statistics.median(sha256)
    without = save - manifest  # the checkpoint without its manifest
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "checkpoint_bytes": folder_size(path),
        "algorithm": ALGORITHM,
        "save_seconds_median": round(save, 4),
        "manifest_seconds_median": round(manifest, 4),
        "manifest_share_of_save": round(manifest / without, 4),
        "sha256_seconds_median": round(slow, 4),
        "sha256_share_of_save": round(slow / without, 4),
        "save_seconds": saves,
        "manifest_seconds": manifests,
        "sha256_seconds": sha256,
    }


def drop_page_cache() -> bool:
    """Write dirty pages out and drop the page cache (root only); False where that is refused (a container)."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def build_real_store(root: Path) -> tuple[token_store.TokenStore, dict]:
    """A store of the embedded 20 Newsgroups training text in one process, with its build and hash times."""
    texts = embedded_newsgroups_pretraining_texts()
    tokenizer = train_tokenizer(texts[::5], vocab_size=2000)
    start = time.perf_counter()
    store = token_store.write_token_store(
        root / "real", {"train": texts, "validation": texts[:200]}, tokenizer, log=None
    )
    seconds = time.perf_counter() - start
    size = folder_size(store.path)
    return store, {
        "text_bytes": sum(len(t.encode()) for t in texts),
        "tokens": store.num_tokens("train"),
        "store_bytes": size,
        "build_seconds": round(seconds, 3),
        "hash_seconds_at_build": store.meta["hash_seconds"],
        "build_seconds_per_gb_of_store": round(seconds / (size / 1e9), 1),
    }


def repeat_store(real: token_store.TokenStore, path: Path, target_bytes: int) -> token_store.TokenStore:
    """`real` with its training stream (tokens and sentence ends) repeated to about `target_bytes`, hashed and
    described as `write_token_store` does: a store as large as a corpus of ~2 GB of text gives."""
    shutil.copytree(real.path, path)
    train = real.split("train")
    tokens = np.asarray(train.tokens)
    ends = np.append(np.asarray(train.sentence_starts), len(tokens)).astype(np.int64)
    bytes_per_copy = tokens.nbytes + ends.nbytes
    copies = max(1, round(target_bytes / bytes_per_copy))
    with open(path / "train.tokens", "wb") as t, open(path / "train.sentence_ends", "wb") as e:
        for i in range(copies):
            tokens.tofile(t)
            (ends + i * len(tokens)).tofile(e)
    meta = dict(real.meta)
    meta["splits"] = dict(meta["splits"], train=dict(meta["splits"]["train"]))
    for key in ("tokens", "sentences", "documents"):
        meta["splits"]["train"][key] *= copies
    start = time.perf_counter()
    meta["files"] = token_store.hash_files(path, meta["chunk_bytes"])
    meta["hash_seconds"] = round(time.perf_counter() - start, 3)
    (path / token_store.STORE_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return token_store.TokenStore(path)


def timed(function, runs: int, *, before=None) -> list[float]:
    seconds = []
    for _ in range(runs):
        if before is not None:
            before()
        start = time.perf_counter()
        function()
        seconds.append(round(time.perf_counter() - start, 4))
    return seconds


def measure_store(gigabytes: float, runs: int, root: Path) -> dict:
    real, build = build_real_store(root)
    store = repeat_store(real, root / "large", int(gigabytes * 1e9))
    size = folder_size(store.path)
    store.verify()  # into the page cache
    warm = timed(store.verify, runs)
    cold = timed(store.verify, runs, before=drop_page_cache) if drop_page_cache() else None
    stream = store.path / "train.tokens"
    chunk_sizes = {}
    for mib in (1, 16, 64, 256):
        seconds = timed(lambda: integrity.chunk_digests(stream, mib * 2**20), runs)
        chunk_sizes[f"{mib}_MiB"] = round(stream.stat().st_size / statistics.median(seconds) / 1e9, 2)
    tokenizer = real.tokenizer()
    counts = PretrainingStream(store.split("train"), tokenizer, batch_size=8, seq_len=512, reuse_len=256)
    start = time.perf_counter()
    counts.token_counts(len(tokenizer))
    token_counts = time.perf_counter() - start
    return {
        "build_of_a_real_store": build,
        "store_bytes": size,
        "train_tokens": store.num_tokens("train"),
        "chunk_bytes": store.meta["chunk_bytes"],
        "chunks": sum(len(f["chunks"]) for f in store.meta["files"].values()),
        "hash_seconds_at_build": store.meta["hash_seconds"],
        "verify_warm_seconds": warm,
        "verify_warm_seconds_median": statistics.median(warm),
        "verify_warm_gb_per_second": round(size / statistics.median(warm) / 1e9, 2),
        "verify_cold_seconds": cold,
        "verify_cold_gb_per_second": round(size / statistics.median(cold) / 1e9, 2) if cold else None,
        "cold_measured": cold is not None,
        "xxh3_gb_per_second_by_chunk_size_warm": chunk_sizes,
        "token_counts_seconds_warm": round(token_counts, 3),
        "verify_share_of_token_counts_warm": round(statistics.median(warm) / token_counts, 4),
        "verify_warm_seconds_per_gb": round(statistics.median(warm) / (size / 1e9), 3),
        "build_seconds_estimate": round(build["build_seconds_per_gb_of_store"] * size / 1e9, 1),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=["small", "base"], choices=sorted(MODEL_PRESETS))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--dir", default=None, help="Write the checkpoints under this folder (a temporary one inside).")
    parser.add_argument("--out", default="benchmarks/results/checkpoint.json")
    parser.add_argument("--store_gb", type=float, default=None, help="Time a token store's verification instead.")
    args = parser.parse_args(argv)
    command = "python -m benchmarks.bench_checkpoint " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.store_gb:
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            row = measure_store(args.store_gb, args.runs, Path(tmp))
        cold = f"{row['verify_cold_gb_per_second']} GB/s" if row["cold_measured"] else "not measured (no root)"
        print(
            f"store {row['store_bytes'] / 1e9:.2f} GB: verify warm {row['verify_warm_seconds_median']:.3f} s "
            f"({row['verify_warm_gb_per_second']} GB/s), cold {cold}; the recipe's token count pass "
            f"{row['token_counts_seconds_warm']:.1f} s; building it ~{row['build_seconds_estimate']} s"
        )
        results = {"command": command, "environment": environment(), "token_store": row}
        write_json(args.out, results)
        return results
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        rows = {preset: measure(preset, args.runs, Path(tmp)) for preset in args.presets}
    for preset, row in rows.items():
        print(
            f"{preset}: {row['checkpoint_bytes'] / 2**20:,.0f} MB, save {row['save_seconds_median']:.3f} s (manifest "
            f"included), manifest {row['manifest_seconds_median']:.3f} s = {row['manifest_share_of_save']:.1%} more "
            f"(sha256 would be {row['sha256_share_of_save']:.1%})"
        )
    results = {
        "command": command,
        "environment": environment(),
        "presets": rows,
    }
    write_json(args.out, results)
    return results


if __name__ == "__main__":
    main()
