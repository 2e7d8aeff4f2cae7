"""Kill soak for a human to run: a tiny pretraining SIGKILLed at random moments, resumed each time with
`--resume_from_checkpoint latest`, then run to the end; compared with an uninterrupted run of the same command
(tokenizer trained in the run). Reports per kill when it landed and whether the final run matches.

    python -m benchmarks.soak_kills --kills 10 --seed 0 --out benchmarks/results/soak_kills.json

The CI version (tests/training/test_kill_points.py) stops the run at named points instead of random times.
"""

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "pretrain" / "run_pretraining.py")


def make_corpus(folder: Path):
    from xlnet_lite.embedded_datasets import embedded_news_texts

    texts = [t.replace("\n\n", "\n") for t in embedded_news_texts() if t.strip()]
    (folder / "train.txt").write_text("\n\n".join(texts[:60]), encoding="utf-8")
    (folder / "valid.txt").write_text("\n\n".join(texts[60:66]), encoding="utf-8")


def command(corpus: Path, out: Path, steps: int):
    return [
        sys.executable,
        SCRIPT,
        "--model_size",
        "tiny",
        "--train_file",
        str(corpus / "train.txt"),
        "--validation_file",
        str(corpus / "valid.txt"),
        "--vocab_size",
        "500",
        "--tokenizer_train_documents",
        "60",
        "--seq_len",
        "64",
        "--reuse_len",
        "32",
        "--mem_len",
        "48",
        "--per_device_train_batch_size",
        "4",
        "--per_device_eval_batch_size",
        "4",
        "--eval_batches",
        "2",
        "--max_steps",
        str(steps),
        "--eval_steps",
        "20",
        "--logging_steps",
        "1",
        "--checkpointing_steps",
        "5",
        "--num_warmup_steps",
        "5",
        "--output_dir",
        str(out),
        "--resume_from_checkpoint",
        "latest",
    ]


def outcome(out: Path):
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {
        "losses": [(r["step"], r.get("loss"), r.get("eval_loss")) for r in records],
        "model": (out / "model.safetensors").read_bytes(),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        make_corpus(tmp)
        start = time.perf_counter()
        subprocess.run(command(tmp, tmp / "straight", args.steps), env=env, check=True, capture_output=True)
        full = time.perf_counter() - start
        kills = []
        while len(kills) < args.kills:
            delay = rng.uniform(1.0, 0.6 * full)  # start-up, tokenizer, steps, checkpoints: anywhere
            proc = subprocess.Popen(
                command(tmp, tmp / "killed", args.steps),
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            try:
                proc.wait(timeout=delay)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                metrics = tmp / "killed" / "metrics.jsonl"
                lines = len(metrics.read_text().splitlines()) if metrics.exists() else 0
                kills.append({"after_s": round(delay, 2), "metrics_lines_then": lines})
                print(f"kill {len(kills)}: after {delay:.1f} s ({lines} metrics lines)", flush=True)
                continue
            if proc.returncode != 0:
                raise SystemExit(f"a resumed run failed:\n{proc.stderr.read()[-3000:]}")
            break  # it finished before the kill: the soak is over
        proc = subprocess.run(command(tmp, tmp / "killed", args.steps), env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"the final resume failed:\n{proc.stderr[-3000:]}")
        straight, killed = outcome(tmp / "straight"), outcome(tmp / "killed")
        report = {
            "command": "python -m benchmarks.soak_kills " + " ".join(sys.argv[1:]),
            "uninterrupted_run_s": round(full, 1),
            "kills": kills,
            "same_losses_and_history": straight["losses"] == killed["losses"],
            "same_final_weights_bytes": straight["model"] == killed["model"],
            "steps_logged": sorted({s for s, loss, _ in killed["losses"] if loss is not None})
            == list(range(1, args.steps + 1)),
        }
    print(json.dumps(report, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return (
        0 if report["same_losses_and_history"] and report["same_final_weights_bytes"] and report["steps_logged"] else 1
    )


if __name__ == "__main__":
    sys.exit(main())
