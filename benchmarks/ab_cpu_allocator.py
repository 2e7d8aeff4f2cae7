"""The pretraining recipe on a CPU with freed memory kept for reuse (the recipe as it is) or glibc's own malloc settings
(`reuse_freed_memory` replaced by nothing), alternating in fresh processes: tokens/s, page faults, system time, RSS.

    python -m benchmarks.ab_cpu_allocator --rounds 4 --steps 120 --out benchmarks/results/ab_cpu_allocator.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.environment import environment

REPO = Path(__file__).resolve().parents[1]
ARMS = ("kept", "glibc")
RUN = """
import runpy, sys
import xlnet_lite.training.run as run
if sys.argv[1] == "glibc":
    run.reuse_freed_memory = lambda: "CPU memory: glibc's own malloc settings"
sys.argv = ["pretrain/run_pretraining.py", *sys.argv[2:]]
runpy.run_path("pretrain/run_pretraining.py", run_name="__main__")
"""


def run_arm(arm, steps, out_dir):
    out = Path(out_dir, arm)
    flags = ["--embedded_corpus", "newsgroups", "--max_steps", str(steps), "--checkpointing_steps", "0"]
    flags += ["--overwrite_output_dir", "--output_dir", str(out)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    env.setdefault("OMP_NUM_THREADS", "2")
    start = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-c", RUN, arm, *flags],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    log = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"{arm}: exit {child.returncode}\n{log[-3000:]}")
    line = next(x for x in log.splitlines() if x.startswith("CPU memory:"))
    results = json.loads(Path(out, "results.json").read_text())
    return {
        "arm": arm,
        "memory_line": line,
        "tokens_per_second": round(results["tokens_per_second"], 1),
        "train_seconds": round(results["train_seconds"], 2),
        "wall_s": round(time.perf_counter() - start, 2),
        "user_s": round(usage.ru_utime, 2),
        "system_s": round(usage.ru_stime, 2),
        "minor_faults": usage.ru_minflt,
        "max_rss_mb": round(usage.ru_maxrss / 1024, 1),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as out_dir:
        for round_ in range(args.rounds):
            for arm in ARMS if round_ % 2 == 0 else ARMS[::-1]:
                rows.append({"round": round_, **run_arm(arm, args.steps, out_dir)})
                print(json.dumps(rows[-1]), flush=True)
    summary = {}
    for arm in ARMS:
        mine = [r for r in rows if r["arm"] == arm]
        summary[arm] = {
            key: statistics.median(r[key] for r in mine)
            for key in rows[0]
            if key not in ("arm", "round", "memory_line")
        }
    ratios = [
        next(r for r in rows if r["round"] == k and r["arm"] == "kept")["tokens_per_second"]
        / next(r for r in rows if r["round"] == k and r["arm"] == "glibc")["tokens_per_second"]
        for k in range(args.rounds)
    ]
    summary["kept_over_glibc_tokens_per_second"] = [round(x, 3) for x in ratios]
    record = {"environment": environment(), "steps": args.steps, "rows": rows, "medians": summary}
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
