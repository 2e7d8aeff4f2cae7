"""The recipes' training throughput against the bare training step of the same model, shapes and precision.

    python -m benchmarks.bench_recipe_overhead [--pretrain-steps 60] [--finetune-steps 40] [--runs 10] [--repeats 3]
                                               [--precision fp32|bf16] [--out benchmarks/results/recipe_overhead.json]

--precision bf16 runs the recipes with `--mixed_precision bf16` and the bare steps under the same autocast (a CPU
without AVX512-BF16/AMX emulates bf16: there it measures nothing useful).

Pretraining: `pretrain/run_pretraining.py` with its defaults (small preset, the default corpus, fp32, B 16,
T 128, P 43 (22 before the recipe predicted a third), a 96-token memory) runs --pretrain-steps optimizer steps (warmup
10 steps, checkpoints off, one evaluation at the end); its throughput is the median of its metrics.jsonl
tokens_per_second records (one every 10 steps, the first dropped: it holds the warm-up). The bare step is what the
recipe's loop cannot do without: zero_grad, forward with labels and the memory, backward, gradient clipping at 1.0 and
AdamW (`training.make_adamw`) on the same model config (the recipe's saved config.json), on a synthetic batch of the
recipe's shapes with a full memory, timed in this process (--runs steps after 3 warm-up steps) before and after the
recipe runs; the ratio uses the mean of the two medians. Everything is repeated --repeats times (the machine's speed
drifts by up to a quarter within minutes) and the median ratio reported.

Finetuning: `finetune/run_glue.py` on the embedded news-topic task from that pretrained model (max_seq_length 128,
B 16, dropout 0.1, --finetune-steps steps), tokens = padded tokens of its batches, against the bare step of
XLNetLiteForSequenceClassification on left-padded (B 16, T 128) batches with the recipe's segment ids.

Run it alone on the machine: the recipes and the bare steps must not share the CPU with anything else.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import xlnet_lite
from benchmarks.environment import environment
from pretrain import run_pretraining
from xlnet_lite import training

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def recipe_throughput(folder: Path) -> dict:
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    rates = [r["tokens_per_second"] for r in records if "tokens_per_second" in r][1:]
    if not rates:
        raise SystemExit(f"{folder}/metrics.jsonl has fewer than two tokens_per_second records: run more steps")
    return dict(median=statistics.median(rates), records=rates)


def run(cmd: list[str]) -> float:
    print("$", " ".join(cmd), flush=True)
    start = time.perf_counter()
    subprocess.run(cmd, cwd=REPO, env=ENV, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def bare_steps(
    model, batch, *, runs: int, bf16: bool, learning_rate: float, weight_decay: float, eps: float
) -> list[float]:
    """Seconds of each of `runs` bare training steps (after 3 untimed ones), under bf16 autocast with bf16."""
    optimizer = training.make_adamw(model, learning_rate=learning_rate, weight_decay=weight_decay, eps=eps)
    model.train()
    times = []
    for i in range(3 + runs):
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if i >= 3:
            times.append(time.perf_counter() - start)
    return times


def pretraining_batch(config, *, batch, seq_len, num_predict, seed=0):
    """bench_model's pretraining batch at these shapes, with a full memory (mem_len tokens per layer)."""
    from benchmarks.bench_model import make_batch

    inputs = make_batch(dict(batch=batch, seq_len=seq_len, num_predict=num_predict, vocab_size=config.vocab_size), seed)
    gen = torch.Generator().manual_seed(seed)
    mems = [torch.randn(batch, config.mem_len, config.d_model, generator=gen) for _ in range(config.n_layer)]
    return dict(inputs, mems=mems, use_mems=True)


def classification_batch(config, *, batch, seq_len, num_labels, seed=0):
    gen = torch.Generator().manual_seed(seed)
    attention_mask = torch.ones(batch, seq_len, dtype=torch.long)
    for b, n in enumerate(torch.randint(0, seq_len // 4, (batch,), generator=gen).tolist()):
        attention_mask[b, :n] = 0  # left padding, as the recipe's collator pads
    token_type_ids = torch.zeros(batch, seq_len, dtype=torch.long)
    token_type_ids[:, -1] = 2  # text <sep> <cls>, as the recipe's tokenizer makes a single-text input
    return dict(
        input_ids=torch.randint(8, config.vocab_size, (batch, seq_len), generator=gen),
        attention_mask=attention_mask,
        token_type_ids=token_type_ids,
        labels=torch.randint(0, num_labels, (batch,), generator=gen),
    )


def compare(name, recipe, before, after, tokens_per_step, wall_s):
    bare = [tokens_per_step / statistics.median(t) for t in (before, after)]
    bare_mean = statistics.mean(bare)
    row = dict(
        recipe_tokens_per_s=recipe["median"],
        recipe_records=recipe["records"],
        bare_tokens_per_s=bare_mean,
        bare_before_after=bare,
        ratio=recipe["median"] / bare_mean,
        recipe_wall_s=wall_s,
    )
    print(
        f"{name}: recipe {recipe['median']:.0f} tok/s, bare step {bare_mean:.0f} tok/s "
        f"(before {bare[0]:.0f}, after {bare[1]:.0f}): recipe = {100 * row['ratio']:.1f}% of the bare step",
        flush=True,
    )
    return row


def summary(name, repeats):
    ratios = [r["ratio"] for r in repeats]
    print(
        f"{name}: recipe / bare step = {100 * statistics.median(ratios):.1f}% (median of {len(ratios)}; "
        f"{', '.join(f'{100 * x:.1f}%' for x in ratios)})",
        flush=True,
    )
    return dict(median_ratio=statistics.median(ratios), repeats=repeats)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pretrain-steps", type=int, default=60)
    parser.add_argument("--finetune-steps", type=int, default=40)
    parser.add_argument("--runs", type=int, default=10, help="timed bare steps, before and after each recipe run")
    parser.add_argument("--repeats", type=int, default=3, help="bare / recipe / bare measurements per recipe")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--out", default="benchmarks/results/recipe_overhead.json")
    args = parser.parse_args()
    if args.pretrain_steps < 20 or args.finetune_steps < 20:
        parser.error("--pretrain-steps and --finetune-steps must be >= 20 (two metrics records, the first dropped)")
    torch.set_num_threads(args.threads)
    launch = [
        "accelerate",
        "launch",
        "--cpu",
        "--num_processes",
        "1",
        "--num_machines",
        "1",
        "--num_cpu_threads_per_process",
        str(args.threads),
        "--dynamo_backend",
        "no",
        "--mixed_precision",
        "no" if args.precision == "fp32" else "bf16",
    ]
    result = dict(
        command=" ".join([Path(sys.executable).name] + sys.argv),
        loadavg_start=os.getloadavg(),
        threads=args.threads,
        precision=args.precision,
        environment=environment(),
    )
    with tempfile.TemporaryDirectory(prefix="recipe_overhead_") as tmp:
        pre, fin = Path(tmp, "pretrain"), Path(tmp, "finetune")
        # the recipe first (it writes the config the bare step uses), then bare / recipe again / bare
        run(
            [
                *launch,
                "pretrain/run_pretraining.py",
                "--output_dir",
                str(pre),
                "--max_steps",
                "20",
                "--eval_steps",
                "20",
                "--checkpointing_steps",
                "0",
                "--num_warmup_steps",
                "10",
            ]
        )
        config = xlnet_lite.XLNetLiteConfig.from_pretrained(pre)
        config.update(dict(reuse_len=64, use_mems_train=True))  # the recipe's training values (reset when saved)
        num_predict = math.ceil(128 * run_pretraining.PretrainingArguments.plm_probability)  # the recipe's P
        batch = pretraining_batch(config, batch=16, seq_len=128, num_predict=num_predict)
        model = xlnet_lite.XLNetLiteLMHeadModel(config)
        pre_hyper = dict(learning_rate=3e-4, weight_decay=0.01, eps=1e-8, bf16=args.precision == "bf16")
        pre_cmd = [
            *launch,
            "pretrain/run_pretraining.py",
            "--output_dir",
            str(pre),
            "--overwrite_output_dir",
            "--max_steps",
            str(args.pretrain_steps),
            "--eval_steps",
            str(args.pretrain_steps),
            "--checkpointing_steps",
            "0",
            "--num_warmup_steps",
            "10",
        ]
        cls_config = xlnet_lite.XLNetLiteConfig.from_pretrained(pre, num_labels=6, dropout=0.1)
        cls_batch = classification_batch(cls_config, batch=16, seq_len=128, num_labels=6)
        cls_model = xlnet_lite.XLNetLiteForSequenceClassification(cls_config)
        fin_hyper = dict(learning_rate=3e-4, weight_decay=0.0, eps=1e-6, bf16=args.precision == "bf16")
        fin_cmd = [
            *launch,
            "finetune/run_glue.py",
            "--embedded_task",
            "news_topic",
            "--model_name_or_path",
            str(pre),
            "--output_dir",
            str(fin),
            "--overwrite_output_dir",
            "--max_train_steps",
            str(args.finetune_steps),
            "--learning_rate",
            "3e-4",
            "--max_seq_length",
            "128",
            "--checkpointing_steps",
            "0",
        ]
        pretraining, finetuning = [], []
        for _ in range(args.repeats):
            before = bare_steps(model, batch, runs=args.runs, **pre_hyper)
            seconds = run(pre_cmd)
            after = bare_steps(model, batch, runs=args.runs, **pre_hyper)
            pretraining.append(compare("pretraining", recipe_throughput(pre), before, after, 16 * 128, seconds))
            before = bare_steps(cls_model, cls_batch, runs=args.runs, **fin_hyper)
            seconds = run(fin_cmd)
            after = bare_steps(cls_model, cls_batch, runs=args.runs, **fin_hyper)
            finetuning.append(compare("finetuning", recipe_throughput(fin), before, after, 16 * 128, seconds))
        result["pretraining"] = summary("pretraining", pretraining)
        result["finetuning"] = summary("finetuning", finetuning)
    result["loadavg_end"] = os.getloadavg()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
