"""Time DataCollatorForXLNetPretraining on a paper-sized batch: 16 x 512, reuse_len 256, perm_size 256.

    python -m benchmarks.bench_collator

One thread (torch.set_num_threads(1)), median of 20 calls after 3 warm-up calls; the examples
are synthetic pretraining-layout samples over a 32,000-piece vocabulary. Prints the median in ms
and writes benchmarks/results/collator.json.
"""

import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, models

from xlnet_lite.collator import DataCollatorForXLNetPretraining
from xlnet_lite.tokenization_xlnet_lite import SPECIAL_TOKENS, wrap_tokenizer

BATCH, SEQ_LEN, REUSE_LEN, PERM_SIZE, VOCAB, RUNS = 16, 512, 256, 256, 32000, 20


def synthetic_tokenizer():
    pieces = [(t, 0.0) for t in SPECIAL_TOKENS]
    pieces += [(f"▁w{i}" if i % 3 else f"x{i}", -1.0) for i in range(VOCAB - len(pieces))]
    return wrap_tokenizer(Tokenizer(models.Unigram(pieces, unk_id=0)))


def synthetic_examples(rng):
    examples = []
    for _ in range(BATCH):
        ids = rng.integers(8, VOCAB, size=SEQ_LEN)
        a_end = int(rng.integers(REUSE_LEN + 1, SEQ_LEN - 3))
        ids[a_end], ids[-2], ids[-1] = 4, 4, 3
        types = np.zeros(SEQ_LEN, dtype=np.int64)
        types[a_end + 1 : -1], types[-1] = 1, 2
        examples.append({"input_ids": ids, "token_type_ids": types})
    return examples


def main():
    torch.set_num_threads(1)
    collator = DataCollatorForXLNetPretraining(synthetic_tokenizer(), reuse_len=REUSE_LEN, perm_size=PERM_SIZE, seed=0)
    examples = synthetic_examples(np.random.default_rng(0))
    for _ in range(3):
        collator(examples)
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        collator(examples)
        times.append((time.perf_counter() - start) * 1000)
    result = {
        "batch": BATCH,
        "seq_len": SEQ_LEN,
        "reuse_len": REUSE_LEN,
        "perm_size": PERM_SIZE,
        "threads": 1,
        "runs": RUNS,
        "median_ms": round(statistics.median(times), 2),
        "min_ms": round(min(times), 2),
        "max_ms": round(max(times), 2),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.processor() or platform.machine(),
    }
    print(
        f"collator {BATCH}x{SEQ_LEN} (reuse {REUSE_LEN}, perm {PERM_SIZE}), 1 thread: "
        f"median {result['median_ms']} ms over {RUNS} runs (min {result['min_ms']}, max {result['max_ms']})"
    )
    out = Path(__file__).parent / "results" / "collator.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
