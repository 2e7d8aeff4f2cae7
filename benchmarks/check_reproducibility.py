"""What is bit-reproducible: a tiny pretraining (tokenizer trained in the run) run under variants of the same command,
each compared with the reference run (2 threads, fp32): the same command again, 1 thread, bf16, another seed.

    python -m benchmarks.check_reproducibility --out benchmarks/results/reproducibility.json
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.soak_kills import command, make_corpus, outcome

VARIANTS = {  # name: (threads, extra flags)
    "same command again": (2, []),
    "1 thread instead of 2": (1, []),
    "bf16 autocast": (2, ["--mixed_precision", "bf16"]),
    "another seed (control)": (2, ["--seed", "43"]),
}


def run(corpus, out, threads, extra, steps):
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1"}
    subprocess.run(command(corpus, out, steps) + extra, env=env, check=True, capture_output=True)
    result = outcome(out)
    result["tokenizer"] = (out / "tokenizer" / "tokenizer.json").read_bytes()
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    report = {"command": "python -m benchmarks.check_reproducibility " + " ".join(sys.argv[1:]), "variants": {}}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        make_corpus(tmp)
        reference = run(tmp, tmp / "reference", 2, [], args.steps)
        for i, (name, (threads, extra)) in enumerate(VARIANTS.items()):
            other = run(tmp, tmp / f"v{i}", threads, extra, args.steps)
            gaps = [abs(a[1] - b[1]) for a, b in zip(reference["losses"], other["losses"]) if a[1] is not None]
            report["variants"][name] = {
                "same_tokenizer_bytes": other["tokenizer"] == reference["tokenizer"],
                "same_losses": other["losses"] == reference["losses"],
                "max_loss_difference": max(gaps),
                "same_model_bytes": other["model"] == reference["model"],
            }
            print(name, report["variants"][name], flush=True)
    print(json.dumps(report, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
