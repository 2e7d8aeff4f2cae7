"""Compare the outputs of two runs of the README's first command (e.g. this checkout and a fresh clone):

    python -m benchmarks.compare_runs outputs /tmp/run2/outputs

Prints, for pretraining and finetuning, whether the metrics (every record but timings), results (but timings),
tokenizer, model weights and predictions are identical. Exit status 0 when everything but the timings is."""

import json
import sys
from pathlib import Path

TIMINGS = ("train_seconds", "tokens_per_second", "elapsed", "eval_seconds", "train_runtime_s", "test_runtime_s")


def records(path):
    return [{k: v for k, v in json.loads(line).items() if k not in TIMINGS} for line in path.read_text().splitlines()]


def results(path):
    return {k: v for k, v in json.loads(path.read_text()).items() if k not in TIMINGS}


def main(a, b):
    a, b = Path(a), Path(b)
    checks = {
        "pretrain metrics.jsonl": lambda d: records(d / "pretrain" / "metrics.jsonl"),
        "pretrain results.json": lambda d: results(d / "pretrain" / "results.json"),
        "pretrain tokenizer.json": lambda d: (d / "pretrain" / "tokenizer.json").read_bytes(),
        "pretrain model.safetensors": lambda d: (d / "pretrain" / "model.safetensors").read_bytes(),
        "finetune metrics.jsonl": lambda d: records(d / "finetune" / "metrics.jsonl"),
        "finetune all_results.json": lambda d: results(d / "finetune" / "all_results.json"),
        "finetune model.safetensors": lambda d: (d / "finetune" / "model.safetensors").read_bytes(),
        "finetune predict_results.tsv": lambda d: (d / "finetune" / "predict_results.tsv").read_bytes(),
    }
    same = {name: read(a) == read(b) for name, read in checks.items()}
    for name, equal in same.items():
        print(f"{name:30s} {'identical' if equal else 'DIFFERENT'}")
    return 0 if all(same.values()) else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
