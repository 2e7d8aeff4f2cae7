"""Long documents: truncation against reading every segment through the memory (`--long_document_mode mems`).

    python -m benchmarks.bench_long_documents --model_name_or_path outputs/pretrain
    python -m benchmarks.bench_long_documents --config_name outputs/pretrain   (random initialisation)

Documents are built from the embedded Rotten Tomatoes snippets: each concatenates `--reviews_per_doc`
snippets, drawn from one split, `--majority` of them with the document's label and the rest with the other
label, in random order, so the evidence is spread over the whole document and a reader that stops after
`--max_seq_length` tokens sees only part of it. Modes: `truncate` (the first max_seq_length tokens),
`mems` (every segment, through the memory; gradient through the last one), `mems_all` (the same with
backpropagation through every segment) and `full` (one window of `--full_length` tokens that holds
the whole document: the no-memory reference, quadratic in length). Every mode finetunes the same model with the same budget
(epochs, batch size, learning rate, seed) through `finetune/run_glue.py`; the script records test accuracy,
wall times and tokens per second, and writes JSON to benchmarks/results/.
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from finetune import run_glue
from xlnet_lite.embedded_datasets import embedded_rotten_tomatoes


def build_documents(split, n_docs, *, reviews_per_doc, majority, seed):
    """n_docs rows {"sentence", "label"}: `majority` snippets of the label, the rest of the other label, shuffled."""
    rng = np.random.default_rng(seed)
    labels = np.asarray(split["label"])
    texts = np.asarray(split["sentence"], dtype=object)
    by_label = {y: np.flatnonzero(labels == y) for y in (0, 1)}
    rows = []
    for i in range(n_docs):
        y = int(i % 2)
        picks = list(rng.choice(by_label[y], majority, replace=False))
        picks += list(rng.choice(by_label[1 - y], reviews_per_doc - majority, replace=False))
        rows.append({"sentence": " ".join(texts[rng.permutation(picks)]), "label": y})
    return [rows[i] for i in rng.permutation(n_docs)]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model_name_or_path", default=None)
    parser.add_argument("--config_name", default=None)
    parser.add_argument("--tokenizer_name", default=None)
    parser.add_argument("--reviews_per_doc", type=int, default=8)
    parser.add_argument("--majority", type=int, default=6, help="snippets carrying the document's label")
    parser.add_argument("--train_docs", type=int, default=2000)
    parser.add_argument("--eval_docs", type=int, default=400)
    parser.add_argument("--max_seq_length", type=int, default=64)
    parser.add_argument("--mem_len", type=int, default=384, help="memory kept per layer in mems mode")
    parser.add_argument("--num_train_epochs", type=int, default=2)
    parser.add_argument("--learning_rate", type=float, default=1e-4)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--modes", default="truncate,mems", help="comma-separated: truncate, mems, mems_all, full")
    parser.add_argument("--full_length", type=int, default=512, help="max_seq_length of the 'full' mode")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (1 is steadier on a shared 2-core machine)"
    )
    parser.add_argument("--out", default="benchmarks/results/long_documents.json")
    args = parser.parse_args(argv)
    if not 0 < args.majority <= args.reviews_per_doc or 2 * args.majority <= args.reviews_per_doc:
        raise ValueError("--majority must be a strict majority of --reviews_per_doc")

    torch.set_num_threads(args.threads)
    ds = embedded_rotten_tomatoes()
    work = Path(tempfile.mkdtemp(prefix="bench_long_docs_"))
    docs = {
        name: build_documents(ds[name], n, reviews_per_doc=args.reviews_per_doc, majority=args.majority, seed=k)
        for k, (name, n) in enumerate(
            (("train", args.train_docs), ("validation", args.eval_docs), ("test", args.eval_docs))
        )
    }
    files = {name: write_jsonl(work / f"{name}.jsonl", rows) for name, rows in docs.items()}

    model_flags = (
        ["--model_name_or_path", args.model_name_or_path]
        if args.model_name_or_path
        else ["--config_name", args.config_name]
    )
    if args.tokenizer_name or args.config_name:
        model_flags += ["--tokenizer_name", args.tokenizer_name or args.config_name]
    results = {"setup": {k: v for k, v in vars(args).items() if k != "out"}, "modes": {}}
    for mode in args.modes.split(","):
        out_dir = work / mode
        # "full": one segment long enough for every document (no truncation, no memory), the reference point
        max_len = args.full_length if mode == "full" else args.max_seq_length
        flags = [
            *model_flags,
            "--train_file",
            files["train"],
            "--validation_file",
            files["validation"],
            "--test_file",
            files["test"],
            "--long_document_mode",
            "mems" if mode.startswith("mems") else "truncate",
            "--mems_backprop",
            "all" if mode == "mems_all" else "last",
            "--max_seq_length",
            str(max_len),
            "--mem_len",
            str(args.mem_len),
            "--num_train_epochs",
            str(args.num_train_epochs),
            "--learning_rate",
            str(args.learning_rate),
            "--per_device_train_batch_size",
            str(args.batch_size),
            "--seed",
            str(args.seed),
            "--output_dir",
            str(out_dir),
            "--overwrite_output_dir",
        ]
        start = time.perf_counter()
        scores = run_glue.main(flags)
        wall = time.perf_counter() - start
        tokens = document_tokens(run_glue, out_dir, docs)
        results.setdefault("model", model_summary(out_dir))
        results["modes"][mode] = {
            "test_accuracy": scores.get("test_accuracy"),
            "validation_accuracy": scores.get("eval_accuracy"),
            "best_epoch": scores.get("best_epoch"),
            "train_runtime_s": scores["train_runtime_s"],
            "test_runtime_s": scores.get("test_runtime_s"),
            "wall_time_s": round(wall, 2),
            "test_docs_per_s": round(args.eval_docs / scores["test_runtime_s"], 1)
            if scores.get("test_runtime_s")
            else None,
            "document_tokens": tokens,
            "max_seq_length": max_len,
            "truncated_docs_fraction": tokens["test"]["longer_than_max_seq_length"] / tokens["test"]["docs"]
            if not mode.startswith("mems")
            else 0.0,
        }
        print(json.dumps({mode: results["modes"][mode]}, indent=2))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return results


def model_summary(out_dir):
    config = json.loads((out_dir / "config.json").read_text())
    return {
        k: config.get(k)
        for k in ("model_type", "vocab_size", "d_model", "n_layer", "n_head", "d_inner", "mem_len", "dropout")
    }


def document_tokens(run_glue, out_dir, docs):
    """Token counts of the documents with the saved tokenizer (<sep> <cls> included)."""
    from xlnet_lite.tokenization_xlnet_lite import load_tokenizer

    tokenizer = load_tokenizer(out_dir)
    max_len = json.loads((out_dir / "all_results.json").read_text())["max_seq_length"]  # of this run
    counts = {}
    for name, rows in docs.items():
        lengths = np.array([len(ids) for ids in tokenizer([r["sentence"] for r in rows])["input_ids"]])
        counts[name] = {
            "docs": len(rows),
            "tokens": int(lengths.sum()),
            "mean_tokens": float(lengths.mean()),
            "longer_than_max_seq_length": int((lengths > max_len).sum()),
        }
    return counts


if __name__ == "__main__":
    sys.exit(main() and 0)
