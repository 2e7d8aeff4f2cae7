"""What the permutation objective buys over masked and causal LM at equal compute, on the main job's text and protocol.

    python -m benchmarks.objectives step_cost [--rounds 5 --steps 20] [--levers] [--out FILE]
    python -m benchmarks.objectives pretrain ARM [ARM ...] [--budget 10] [--threads 2]
    python -m benchmarks.objectives finetune ARM [ARM ...] [--labels_per_class 50] [--seeds 0] [--lr_grid 3e-4]
    python -m benchmarks.objectives probe ARM [ARM ...] [--labels_per_class 50]
    python -m benchmarks.objectives table [--precision fp32|bf16] [--budget 10]
    (each with --task news_topic | rotten_tomatoes: the held-out tasks, each pretrained on its own text)

The arms (ARMS) train the main job's XLNet-Lite `small` on 20 Newsgroups' training text with
`pretrain/run_pretraining.py --objective plm|mlm|clm`: the same tokenizer, token store, rows, batch (16 x 128),
memory and optimizer; only the objective and its grid point differ. The BERT arms train transformers'
`BertForMaskedLM` of the same size, tokenizer, rows and batch, without memory (benchmarks/baselines/bert_mlm.py).
Equal compute: `step_cost` times one training
step of each objective side by side in one process (rounds of interleaved steps, the median per objective) and
counts its FLOPs (torch's FlopCounterMode, forward and backward); an arm of budget B minutes then trains
`MAIN_JOB_STEPS[B] * plm_step_seconds / its_step_seconds` steps (`--max_steps`), so a run reproduces on any machine:
3,060 steps are the permutation LM's 10 minutes in the README's main job.

The grid, fixed before any test figure was seen, the same number of points per objective: the learning rate 3e-4 / 6e-4
/ 1e-3 at the recipe's defaults (a constant rate after 100 warmup steps; plm predicting a third of the tokens, mlm 15%);
then, at the learning rate that finetunes best on validation, a linear decay, and one lever of the objective's own (plm:
XLNet's 1/6 predicted; mlm: 30% masked; clm: a cosine decay; a lever that changes what a step costs trains for its own
equal-time steps, `step_cost --levers`). Outside the grid and never an entry: plm predicting two thirds of each step
(`_p67`), XLNet's own lever once the causal LM, which scores every token, led the grid's first points (and its probes:
the frozen features follow targets per step); the causal LM for its equal time in bf16 (`_bf16time`: the steps of
benchmarks/results/objectives_step_cost_bf16_zen5.json); the causal LM's model finetuned with bidirectional attention
(`_bi`: its entry finetunes causally, as it pretrained); and other pretraining seeds of each point of plm, clm and mlm,
in the grid or not (`<point>_seed1`, `_seed2`), how far a pretraining's own randomness moves an arm beside the
finetuning seeds. Each objective's point with the best validation accuracy at 50 labels per group (seed 0, finetuning
rate 3e-4, the main job's) is its entry; entries are finetuned at 20 / 50 / all labels per group over seeds 0, 1, 2 (16
/ 8 / 3 epochs, the last epoch's model, as the main job does at 50), beside random initialisation and TF-IDF
(benchmarks.bench_newsgroups), which come with plm_lr6e-4's finetuning at 10 minutes at each number of labels. Every run
is cached under benchmarks/results/objective_runs and reused: the records (each pretraining's results, command and
machine; each finetuning run's record; the summaries) are committed, the models stay on the machine that trained them
(ignored by git). Finetuning that its records cover runs nothing; a model that more finetuning needs and that is missing
is pretrained again, the same model on the same kind of machine, precision and threads: its committed records stay, the
new run is noted in record.json (a warning where its loss differs). Runs are kept per precision
(`<arm>_<budget>min_fp32` or `_bf16`: what the recipes pick on the machine). `probe` asks what each model learnt without
finetuning it: linear probes of its frozen features (benchmarks.probes; the untrained architecture beside plm_lr6e-4),
kept as probe_<labels>.json. `table` writes benchmarks/results/objectives_<precision>.json and .md from one precision's
records (`_30min` with `--budget 30`: the entries the 10-minute grid chose, trained 3x longer).

Held-out tasks (`--task news_topic` or `rotten_tomatoes`): an arm pretrained on that task's own text (the embedded
news corpus, the Rotten Tomatoes training movies; the same steps) and finetuned on it as above, kept in
`<arm>_<budget>min_<precision>_<task>`; random init and TF-IDF come with the permutation LM's entry, and the table
(`objectives_<precision>_<task>`) plots the entries 20 Newsgroups chose.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.baselines import bert_mlm
from benchmarks.environment import environment

RUNS = Path("benchmarks/results/objective_runs")  # records committed, models ignored (.gitignore)
STEP_COST = Path("benchmarks/results/objectives_step_cost.json")
# The same, timed in bf16 on EPYC-Zen5 (`step_cost --out`): the steps of the `_bf16time` arms
STEP_COST_BF16 = Path("benchmarks/results/objectives_step_cost_bf16_zen5.json")
TABLE = Path("benchmarks/results/objectives")  # + _fp32 or _bf16 (.json, .md)
MAIN_JOB_STEPS = {10: 3060, 30: 9180}  # the permutation LM's steps in the main job's 10 (and 30) minutes
CHOOSING_BUDGET = 10  # the budget whose grid chooses each objective's entry; the entries alone run at the others
LEARNING_RATES = ("3e-4", "6e-4", "1e-3")
EPOCHS = {"20": 16, "50": 8, "all": 3}
# The embedded tasks, each with the embedded corpus of its own text that pretrains its arms (--embedded_corpus) and
# its name in the tables: 20 Newsgroups chooses the entries; the other two are held out.
TASKS = {
    "newsgroups": ("newsgroups", "20 Newsgroups"),
    "news_topic": ("news", "the news topics"),
    "rotten_tomatoes": ("rotten_tomatoes", "Rotten Tomatoes"),
}
CHOOSING_TASK = "newsgroups"  # the task whose validation chooses each objective's entry; the others are held out
TASK = CHOOSING_TASK  # the task the arms pretrain and finetune on (--task)
FINETUNE_FLAGS = ""  # more run_glue.py flags for every finetuning run (the BERT arm reads --max_seq_length)
LAUNCH = [sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes", "1", "--num_machines", "1"]
LAUNCH += ["--dynamo_backend", "no"]


def precision() -> str:
    """The precision the recipes pick on this machine (`--mixed_precision auto`), the BERT arms' too: runs are kept
    and compared per precision, `<arm>_<budget>min_<precision>`, so a bf16 machine never continues an fp32 grid or
    the reverse."""
    from xlnet_lite.precision import fast_bf16

    return "bf16" if fast_bf16("cpu")[0] else "fp32"


def _mixed_precision() -> str:
    """The BERT arms' precision, as the recipes' `--mixed_precision auto` picks it (recorded in their results)."""
    return "bf16" if precision() == "bf16" else "no"


def folder(arm: str, budget: int, precision_: str | None = None) -> Path:
    """`<arm>_<budget>min_<precision>`, and `_<task>` on a held-out task."""
    return RUNS / f"{arm}_{budget}min_{precision_ or precision()}{_task_suffix()}"


def held_out() -> bool:
    """Whether the task asked is a held-out one (it shows the entries, it does not choose them)."""
    return TASK != CHOOSING_TASK


def _task_suffix() -> str:
    return f"_{TASK}" if held_out() else ""


def table_path(budget: int, precision_: str) -> Path:
    """The table's files without their suffix: `objectives_<precision>`, then `_<budget>min` at a budget other than
    the choosing one's and `_<task>` on a held-out task."""
    return Path(f"{TABLE}_{precision_}{'' if budget == CHOOSING_BUDGET else f'_{budget}min'}{_task_suffix()}")


def chosen_entries(precision_: str | None = None) -> dict[str, str]:
    """{objective: its entry}, as 20 Newsgroups' table of this precision chose them ({} before it is written)."""
    table = Path(f"{TABLE}_{precision_ or precision()}.json")
    return json.loads(table.read_text())["entries"] if table.is_file() else {}


def shown_entries(rows: list[dict], budget: int, precision_: str) -> dict[str, str]:
    """The entries a table plots: chosen from its rows on 20 Newsgroups at the choosing budget; elsewhere (a held-out
    task, another budget) those 20 Newsgroups' grid chose, where they ran."""
    if not held_out() and budget == CHOOSING_BUDGET:
        return entries(rows)
    ran = {row["arm"] for row in rows}
    return {objective: arm for objective, arm in chosen_entries(precision_).items() if arm in ran}


def reference_arm(precision_: str | None = None) -> str:
    """The arm whose finetuning brings random init and TF-IDF: plm_lr6e-4 on 20 Newsgroups; on a held-out task the
    permutation LM's entry (plm_lr6e-4 until the entries are chosen)."""
    return chosen_entries(precision_).get("plm", "plm_lr6e-4") if held_out() else "plm_lr6e-4"


LEVERS = {  # each objective's own lever in the grid
    "plm": ("p6", ["--plm_probability", str(1 / 6)]),
    "mlm": ("m30", ["--mlm_probability", "0.3"]),
    "clm": ("cosine", ["--lr_scheduler_type", "cosine"]),
    "bert": ("m30", ["--mlm_probability", "0.3"]),
}
# Outside the grid (never an entry): XLNet's own answer where an objective with more targets a step leads, the
# permutation LM predicting two thirds of each step's tokens; the causal LM for its equal time in bf16 (`_bf16time`:
# its step costs 1.24x a permutation step there, 1.10x in fp32, whose times set every arm's steps); and other
# pretraining seeds of every point of plm, clm and mlm (the recipe's is 42: the initialisation, the data order, the
# targets), how far a pretraining's own randomness moves an arm.
RECIPE_SEED = 42  # pretrain/run_pretraining.py's --seed
PRETRAINING_SEEDS = (RECIPE_SEED, 1, 2)
SEED_NAMES = {seed: f"seed{seed}" for seed in PRETRAINING_SEEDS[1:]}  # an arm of another seed: `<point>_<name>`
SEEDS = [(name, ["--seed", str(seed)]) for seed, name in SEED_NAMES.items()]
SEEDED = ("plm", "clm", "mlm")  # the objectives whose points also run with the other pretraining seeds
# Levers of the causal LM's finetuning alone: `<point>_bi` finetunes `<point>`'s model with bidirectional attention
# (run_glue.py --attn_type bi), where the causal LM's entry finetunes as it pretrained, `uni` (its classifier's <cls>,
# last, reads every token either way; bidirectional, every other token reads the whole text too).
FINETUNE_LEVERS = {"bi": ["--attn_type", "bi"]}
WHY_LEVERS = {
    "plm": [("p67", ["--plm_probability", str(2 / 3)])],
    "clm": [("bf16time", []), *((name, []) for name in FINETUNE_LEVERS)],  # a finetuning lever trains nothing
}
# Levers that change what a step costs: their arms train for their own equal-time steps (`step_cost --levers`).
COST_FLAGS = {"--plm_probability", "--mlm_probability"}
COSTED_LEVERS = {
    f"{objective}_{name}": (objective, flags)
    for objective, (name, flags) in [*LEVERS.items(), *((o, lever) for o, ls in WHY_LEVERS.items() for lever in ls)]
    if COST_FLAGS & set(flags)
}


def _arms() -> dict[str, tuple[str, list[str]]]:
    """Every point of the grid at every rate (the linear decay and the own lever run only at each objective's best
    rate, which validation decides), and the arms outside it (`<point>_seed1`: a point's other seeds)."""
    arms = {}
    for objective, (lever, lever_flags) in LEVERS.items():
        for lr in LEARNING_RATES:
            points = {  # the grid's, then those outside it
                f"{objective}_lr{lr}": ["--learning_rate", lr],
                f"{objective}_lr{lr}_linear": ["--learning_rate", lr, "--lr_scheduler_type", "linear"],
                f"{objective}_lr{lr}_{lever}": ["--learning_rate", lr, *lever_flags],
            }
            for name, flags in WHY_LEVERS.get(objective, []):
                points[f"{objective}_lr{lr}_{name}"] = ["--learning_rate", lr, *flags]
            arms.update({arm: (objective, flags) for arm, flags in points.items()})
            for arm, flags in points.items() if objective in SEEDED else ():
                arms.update({f"{arm}_{name}": (objective, [*flags, *seed]) for name, seed in SEEDS})
    return arms


ARMS = _arms()
WHY_NAMES = [name for levers in WHY_LEVERS.values() for name, _ in levers] + [name for name, _ in SEEDS]
WHY_ARMS = {arm for arm in ARMS if any(arm.endswith("_" + name) for name in WHY_NAMES)}


def _seedless(arm: str) -> str:
    """The point an arm of another pretraining seed trains again (the arm itself otherwise)."""
    for name, _ in SEEDS:
        arm = arm.removesuffix("_" + name)
    return arm


def pretrained_arm(arm: str) -> str:
    """The arm whose model the arm finetunes: itself, or for `<point>_bi` (a lever of finetuning alone) `<point>`."""
    return "_".join(part for part in arm.split("_") if part not in FINETUNE_LEVERS)


def finetune_flags(arm: str) -> list[str]:
    """run_glue.py flags of the arm's finetuning levers (FINETUNE_LEVERS)."""
    return [flag for part in arm.split("_") for flag in FINETUNE_LEVERS.get(part, [])]


def cost_key(arm: str) -> str:
    """Where the arm's step cost is kept: its objective, or `<objective>_<lever>` for a lever that changes it."""
    objective = ARMS[arm][0]
    key = f"{objective}_{_seedless(arm).rsplit('_', 1)[1]}"
    return key if key in COSTED_LEVERS else objective


def recipe_flags(objective: str, output_dir: str) -> list[str]:
    return ["--embedded_corpus", TASKS[TASK][0], "--objective", objective, "--output_dir", output_dir]


def step_cost(args) -> dict:
    """Seconds and FLOPs of one training step per objective at the main job's shapes, interleaved in one process.
    With --levers: each lever that changes a step's cost beside its objective, its steps in the budgets scaled from
    the objective's committed ones by the ratio of their step times (added to the file; the objectives' own steps,
    which earlier runs trained for, stay). The steps run in the precision the recipes pick on the machine (bf16
    autocast where it is fast); `--out` writes another file than the one every run's steps come from (a check on
    another machine or precision)."""
    import torch
    from accelerate import Accelerator
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import BertForMaskedLM

    from pretrain.run_pretraining import PretrainingArguments, check_args
    from xlnet_lite import pretraining, training

    torch.set_num_threads(args.threads)
    accelerator, tmp = Accelerator(cpu=True), tempfile.mkdtemp()
    mixed_precision = _mixed_precision()  # the steps as the runs on this machine train them
    autocast = bert_mlm._autocast(torch.device("cpu"), mixed_precision)
    variants = {o: (o, []) for o in ("plm", "mlm", "clm", "bert")}
    if args.levers:
        variants = {**{o: variants[o] for o in dict.fromkeys(o for o, _ in COSTED_LEVERS.values())}, **COSTED_LEVERS}
        if not args.out.is_file():
            sys.exit(f"{args.out} is missing: run `python -m benchmarks.objectives step_cost` first")
    setups, store, blocks = {}, None, None
    shape = bert_shape(tmp)  # every objective's (BERT's from the XLNet arms')
    for key, (objective, flags) in variants.items():
        if objective == "bert":  # <cls> A <sep> blocks, no memory
            if blocks is None:
                texts, _, bert_tokenizer = main_job_text()
                blocks = bert_mlm.mlm_blocks(texts, bert_tokenizer, shape["seq_len"])
            size, pad = shape["model_size"], bert_tokenizer.pad_token_id
            config = bert_mlm.bert_config_like(size, len(bert_tokenizer), pad_token_id=pad)
            torch.manual_seed(0)
            bert = BertForMaskedLM(config).train()
            order = bert_mlm._block_order(len(blocks), shape["batch_size"], 0)
            collate = bert_mlm._mlm_collator(bert_tokenizer, _flag(flags, "--mlm_probability", 0.15), 0)
            setups[key] = dict(model=bert, optimizer=torch.optim.AdamW(bert.parameters(), lr=1e-4))
            setups[key]["next"] = lambda order=order, collate=collate: {
                k: v for k, v in collate(list(blocks[next(order)])).items() if k != "attention_mask"
            }
            continue
        run = training.parse_args(PretrainingArguments, recipe_flags(objective, tmp) + flags)
        check_args(run)
        if store is None:  # one text, tokenizer and token store for all (only the objective differs)
            docs = pretraining.load_corpus(run)
            tokenizer = pretraining.get_tokenizer(run, docs[0], accelerator)
            store = pretraining.get_token_store(run, tokenizer, *docs, accelerator)
        stream, collator, _ = pretraining.build_data(run, tokenizer, store, accelerator)
        torch.manual_seed(0)
        model = pretraining.build_model(run, tokenizer).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        setups[key] = dict(stream=stream, collator=collator, model=model, optimizer=optimizer, mems=None)

    def step(s):
        with autocast:
            if "next" in s:
                batch = s["next"]()
                out = s["model"](**batch)
            else:
                batch = s["collator"](s["stream"].next_batch())
                out = s["model"](**batch, mems=s["mems"], use_mems=True)
                s["mems"] = out.mems
        out.loss.backward()
        s["optimizer"].step()
        s["optimizer"].zero_grad(set_to_none=True)
        return batch

    flops, scored = {}, {}
    for key, s in setups.items():
        for _ in range(3):  # warm up, and a memory from the second step on
            step(s)
        with FlopCounterMode(display=False) as counter:
            batch = step(s)
        flops[key] = counter.get_total_flops()
        scored[key] = int((batch["labels"] != -100).sum())
        print(f"{key}: {flops[key]:.3e} FLOPs a step, {scored[key]} tokens scored", flush=True)
    seconds = {key: [] for key in setups}
    for _ in range(args.rounds):
        for key, s in setups.items():
            start = time.perf_counter()
            for _ in range(args.steps):
                step(s)
            seconds[key].append((time.perf_counter() - start) / args.steps)
            print(f"round {len(seconds[key])} {key}: {seconds[key][-1]:.3f} s a step", flush=True)
    median = {key: statistics.median(v) for key, v in seconds.items()}
    measured = {
        "command": "python -m benchmarks.objectives step_cost " + shlex.join(args.argv),
        "environment": environment(),
        "threads": args.threads,
        "mixed_precision": mixed_precision,
    }
    if args.levers:
        result = json.loads(args.out.read_text())
        result["levers"] = {
            key: {
                "flags": flags,
                "step_seconds": {"median": median[key], "rounds": seconds[key]},
                f"{objective}_step_seconds": {"median": median[objective], "rounds": seconds[objective]},
                "relative_step_time": median[key] / median[objective],
                "flops_per_step": flops[key],
                "relative_flops": flops[key] / flops[objective],
                "scored_tokens_per_step": scored[key],
                "steps": {b: round(n[objective] * median[objective] / median[key]) for b, n in result["steps"].items()},
                **measured,
            }
            for key, (objective, flags) in COSTED_LEVERS.items()
        }
        shown = {key: {k: v[k] for k in ("relative_step_time", "steps")} for key, v in result["levers"].items()}
    else:
        objectives = list(setups)
        tokens = shape["batch_size"] * shape["seq_len"]
        result = {
            **measured,
            "batch": f"{shape['batch_size']} x {shape['seq_len']} tokens, memory {run.mem_len} (BERT: none), "
            f"{shape['model_size']} preset, vocab {len(tokenizer)} (the main job's)",
            "step_seconds": {o: {"median": median[o], "rounds": seconds[o]} for o in objectives},
            "relative_step_time": {o: median[o] / median["plm"] for o in objectives},
            "flops_per_step": flops,
            "relative_flops": {o: flops[o] / flops["plm"] for o in objectives},
            "tokens_per_step": tokens,
            "scored_tokens_per_step": scored,
            "steps": {
                str(b): {o: round(n * median["plm"] / median[o]) for o in objectives} for b, n in MAIN_JOB_STEPS.items()
            },
        }
        shown = {k: result[k] for k in ("relative_step_time", "relative_flops", "steps")}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(shown, indent=2))
    return result


def bert_shape(output_dir: str) -> dict:
    """The XLNet arms' size, rows and batch as their recipe parses them (its defaults: `small`, 16 x 128), which the
    BERT arms take."""
    from pretrain.run_pretraining import PretrainingArguments
    from xlnet_lite import training

    run = training.parse_args(PretrainingArguments, recipe_flags("plm", output_dir))
    return dict(model_size=run.model_size, seq_len=run.seq_len, batch_size=run.per_device_train_batch_size)


def main_job_text():
    """The main job's pretraining documents (training, validation) and its tokenizer, from the recipe's cache."""
    from accelerate import Accelerator

    from pretrain.run_pretraining import PretrainingArguments, check_args
    from xlnet_lite import pretraining, training

    run = training.parse_args(PretrainingArguments, recipe_flags("plm", tempfile.mkdtemp()))
    check_args(run)
    train, validation = pretraining.load_corpus(run)
    return train, validation, pretraining.get_tokenizer(run, train, Accelerator(cpu=True))


def _flag(flags: list[str], name: str, default):
    return type(default)(flags[flags.index(name) + 1]) if name in flags else default


def pretrain_bert(arm: str, budget: int, out: Path, threads: int) -> Path:
    """transformers' BertForMaskedLM of the same size, tokenizer and text (benchmarks/baselines/bert_mlm.py), for its
    equal-compute steps, in this process."""
    import torch

    torch.set_num_threads(threads)
    _, flags = ARMS[arm]
    steps = arm_steps(arm, budget)
    print(f"[{time.strftime('%H:%M:%S')}] pretrain {arm}: {steps} steps", flush=True)
    train, validation, tokenizer = main_job_text()
    results = bert_mlm.pretrain_mlm(
        list(train),
        tokenizer,
        **bert_shape(str(out)),
        max_steps=steps,
        learning_rate=_flag(flags, "--learning_rate", 6e-4),
        lr_scheduler_type=_flag(flags, "--lr_scheduler_type", "constant_with_warmup"),
        mlm_probability=_flag(flags, "--mlm_probability", 0.15),
        eval_texts=list(validation),
        output_dir=str(out),
        mixed_precision=_mixed_precision(),
    )
    results.update(train_tokens_seen=results["tokens_seen"], eval_loss=results["eval_mlm_loss"])
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    return out


def finetune_bert(arm: str, pretrained: Path, runs: Path, labels: str, seeds: list[int], lr_grid: list[str]) -> dict:
    """The BERT arm finetuned as run_glue.py finetunes XLNet-Lite (benchmarks/baselines/bert_mlm.py's classifier,
    the last epoch's model, a 10% warmup), each run cached under `runs`; the summary in bench_newsgroups' layout."""
    from transformers import AutoTokenizer

    from benchmarks.bench_newsgroups import mean_std
    from xlnet_lite.classification_data import first_per_class, load_splits

    runs.mkdir(parents=True, exist_ok=True)
    splits = load_splits(embedded_task=TASK)
    if labels != "all":
        splits = dict(splits, train=first_per_class(splits["train"], int(labels)))
    tokenizer = AutoTokenizer.from_pretrained(pretrained)
    steps = EPOCHS[labels] * -(-len(splits["train"].data) // 16)

    def one(lr, seed):
        path = runs / f"pretrained_lr{float(lr):g}_seed{seed}.json"
        if not path.is_file():
            print(f"[{time.strftime('%H:%M:%S')}] {arm} {labels} lr {lr} seed {seed}", flush=True)
            record = bert_mlm.finetune_bert_classifier(
                str(pretrained),
                tokenizer,
                splits,
                seed=seed,
                epochs=EPOCHS[labels],
                learning_rate=float(lr),
                max_seq_length=_flag(FINETUNE_FLAGS.split(), "--max_seq_length", 128),
                warmup_steps=round(0.1 * steps),
                keep_last_epoch=True,
                mixed_precision=_mixed_precision(),
            )
            path.write_text(json.dumps({**record, "learning_rate": float(lr)}, indent=2) + "\n")
        return json.loads(path.read_text())

    best = max((one(lr, seeds[0]) for lr in lr_grid), key=lambda r: r["eval_accuracy"])
    done = [one(f"{best['learning_rate']:g}", seed) for seed in seeds]
    summary = {
        labels: {
            "pretrained": {
                "learning_rate": best["learning_rate"],
                "validation_accuracy": mean_std([r["eval_accuracy"] for r in done]),
                "test_accuracy": mean_std([r["test_accuracy"] for r in done]),
            }
        }
    }
    result = {"command": "python -m benchmarks.objectives finetune " + arm, "environment": environment()}
    result.update(pretrained=str(pretrained), seeds=seeds, lr_grid=[float(x) for x in lr_grid], arms=["pretrained"])
    result.update(summary=summary, runs=done)
    Path(str(runs) + ".json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def arm_cost(arm: str, cost: dict) -> dict:
    """The arm's entry of the step-cost file: {"steps": {budget: steps}, "flops_per_step": ...}, its lever's where
    the lever changes a step's cost, else its objective's."""
    key = cost_key(arm)
    if key in COSTED_LEVERS:
        if key not in cost.get("levers", {}):
            sys.exit(f"{STEP_COST} has no step cost of {key}: run `python -m benchmarks.objectives step_cost --levers`")
        return cost["levers"][key]
    return {"steps": {b: n[key] for b, n in cost["steps"].items()}, "flops_per_step": cost["flops_per_step"][key]}


def arm_steps(arm: str, budget: int) -> int:
    """The arm's steps in `budget` minutes of the main job's permutation LM (timed in bf16 on EPYC-Zen5 for a
    `_bf16time` arm)."""
    path = STEP_COST_BF16 if _seedless(arm).endswith("_bf16time") else STEP_COST
    if not path.is_file():
        out = "" if path == STEP_COST else f" --out {path}"
        sys.exit(f"{path} is missing: run `python -m benchmarks.objectives step_cost{out}` first")
    return arm_cost(arm, json.loads(path.read_text()))["steps"][str(budget)]


RECORDS = ("results.json", "record.json", "run_args.json")  # a pretraining's committed files


def pretrain(arm: str, budget: int, threads: int = 2) -> Path:
    """The arm's pretrained model: cached, resumed from its last checkpoint if a run was cut short, or trained again
    where only its committed records are here (they stay as committed; the new run is noted in record.json)."""
    if pretrained_arm(arm) != arm:  # a lever of finetuning alone: the point's own model
        return pretrain(pretrained_arm(arm), budget, threads)
    objective, flags = ARMS[arm]
    out = folder(arm, budget) / "pretrain"
    if (out / "model.safetensors").is_file() and (out / "results.json").is_file():
        return out
    recorded = {name: (out / name).read_text() for name in RECORDS if (out / name).is_file()}
    command = "python -m benchmarks.objectives pretrain " + arm + f" --budget {budget} --threads {threads}"
    if objective == "bert":
        pretrain_bert(arm, budget, out, threads)
    else:
        resume = ["--resume_from_checkpoint", "latest"] if (out / "checkpoints").is_dir() else []
        steps = arm_steps(arm, budget)
        cmd = [*LAUNCH, "--num_cpu_threads_per_process", str(threads), "pretrain/run_pretraining.py"]
        cmd += [*recipe_flags(objective, str(out)), *flags]
        cmd += ["--max_steps", str(steps), "--checkpointing_steps", "250", "--save_total_limit", "1"]
        cmd += resume or (["--overwrite_output_dir"] if recorded else [])
        print(f"[{time.strftime('%H:%M:%S')}] pretrain {arm}: {steps} steps", flush=True)
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"failed ({done.returncode}): {shlex.join(cmd)}\n{done.stderr[-3000:]}")
    now = {"command": command, "threads": threads, "environment": environment()}
    if "results.json" not in recorded:
        (out / "record.json").write_text(json.dumps(now, indent=2) + "\n")
        return out
    eval_loss = json.loads((out / "results.json").read_text())["eval_loss"]
    for name, text in recorded.items():  # the committed records describe the model the finetuning records came from
        (out / name).write_text(text)
    record = json.loads(recorded.get("record.json", "{}"))
    record.setdefault("pretrained_again", []).append({**now, "eval_loss": eval_loss})
    (out / "record.json").write_text(json.dumps(record, indent=2) + "\n")
    earlier = json.loads(recorded["results.json"])["eval_loss"]
    if abs(eval_loss - earlier) > 1e-3:
        print(
            f"warning: {arm} pretrained again to eval loss {eval_loss:.4f}, the record's {earlier:.4f} (another kind "
            "of machine, precision or threads): further finetuning of it is not the recorded model's",
            flush=True,
        )
    return out


def _covered(summary: Path, seeds: list[int], lr_grid: list[str], arms: list[str]) -> dict | None:
    """The committed finetuning summary when it holds these seeds, rates and arms (nothing to run), else None."""
    done = json.loads(summary.read_text()) if summary.is_file() else {}
    wanted = (seeds, [float(x) for x in lr_grid], arms)
    return done if (done.get("seeds"), done.get("lr_grid"), done.get("arms")) == wanted else None


def _models(arm: str, budget: int = CHOOSING_BUDGET) -> list[str]:
    """What an arm's finetuning and probes run: its model, and the untrained architecture (which no budget changes)
    beside the reference's at the choosing budget."""
    return ["pretrained", "random_init"] if (arm, budget) == (reference_arm(), CHOOSING_BUDGET) else ["pretrained"]


def finetune(arm: str, budget: int, labels: str, seeds: list[int], lr_grid: list[str], threads: int = 2) -> dict:
    """benchmarks.bench_newsgroups on the arm's model (random init and TF-IDF come with the reference arm's)."""
    from benchmarks import bench_newsgroups

    arms = _models(arm, budget)
    runs = folder(arm, budget) / f"finetune_{labels}"
    covered = _covered(Path(str(runs) + ".json"), seeds, lr_grid, arms)
    if covered:
        return covered
    pretrained = pretrain(arm, budget, threads)
    if ARMS[arm][0] == "bert":
        return finetune_bert(arm, pretrained, runs, labels, seeds, lr_grid)
    flags = shlex.join(["--num_train_epochs", str(EPOCHS[labels]), "--eval_strategy", "no", *finetune_flags(arm)])
    flags = f"{flags} {FINETUNE_FLAGS}".strip()
    argv = ["--pretrained", str(pretrained), "--embedded_task", TASK, "--labels_per_class", labels]
    argv += ["--lr_grid", *lr_grid]
    argv += ["--seeds", *map(str, seeds), "--arms", *arms, "--finetune_flags", flags, "--runs_dir", str(runs)]
    argv += ["--out", str(runs) + ".json"] + ([] if "random_init" in arms else ["--no_tfidf"])
    return bench_newsgroups.main(argv)


def probe(arm: str, budget: int, labels: str, threads: int = 2) -> dict:
    """Linear probes of the arm's frozen model on the task (benchmarks.probes), the untrained architecture beside
    the reference arm's; cached in probe_<labels>.json (committed)."""
    import torch

    from benchmarks import probes

    if pretrained_arm(arm) != arm:
        sys.exit(f"{arm} finetunes {pretrained_arm(arm)}'s model: probe {pretrained_arm(arm)}")
    path = folder(arm, budget) / f"probe_{labels}.json"
    done = json.loads(path.read_text()) if path.is_file() else {}
    models = _models(arm, budget)
    if all(name in done for name in models):
        return done
    torch.set_num_threads(threads)
    pretrained = pretrain(arm, budget, threads)
    max_len = _flag(FINETUNE_FLAGS.split(), "--max_seq_length", 128)
    for name in models:
        if name not in done:
            print(f"[{time.strftime('%H:%M:%S')}] probe {arm} {labels} {name}", flush=True)
            done[name] = probes.probe(
                str(pretrained),
                random_init=name == "random_init",
                embedded_task=TASK,
                labels_per_class=labels,
                max_len=max_len,
            )
            done[name].update(command=f"python -m benchmarks.objectives probe {arm} --labels_per_class {labels}")
            done[name].update(threads=threads, environment=environment())
    path.write_text(json.dumps(done, indent=2) + "\n")
    return done


def _summary(path: Path, labels: str) -> dict | None:
    return json.loads(path.read_text())["summary"][labels] if path.is_file() else None


def _best_probe(probed: dict | None) -> dict | None:
    """A probed model's feature set that probes best on validation, with its validation and test accuracy."""
    if probed is None:
        return None
    return {"features": probed["best_on_validation"], **probed["probes"][probed["best_on_validation"]]}


def write_table(budget: int = 10, precision_: str | None = None) -> dict:
    """Every arm that has run, from its cached files: steps, tokens, FLOPs, the validation accuracy that chose the
    entries, the test accuracy at each number of labels (mean ± std over seeds) and its gain over random init."""
    cost = json.loads(STEP_COST.read_text())
    precision_ = precision_ or precision()
    reference_name = reference_arm(precision_)  # random init and TF-IDF come with its finetuning
    reference = folder(reference_name, CHOOSING_BUDGET, precision_)  # random init and TF-IDF: the same at any budget
    rows, baselines, probed_models = [], {}, {labels: {} for labels in EPOCHS}  # labels -> {arm or baseline: probe}
    references = {labels: _summary(reference / f"finetune_{labels}.json", labels) for labels in EPOCHS}
    for arm, (objective, flags) in ARMS.items():
        runs, model = folder(arm, budget, precision_), folder(pretrained_arm(arm), budget, precision_) / "pretrain"
        if not (model / "results.json").is_file() or not runs.is_dir():
            continue
        pretrained = json.loads((model / "results.json").read_text())
        record = model / "record.json"
        record = json.loads(record.read_text()) if record.is_file() else {}
        env = record.get("environment", {})
        row = {"arm": arm, "objective": objective, "flags": " ".join(flags), "steps": pretrained["steps"]}
        row.update({"finetune_flags": " ".join(extra)} if (extra := finetune_flags(arm)) else {})
        row["tokens"] = pretrained["train_tokens_seen"]
        row["flops"] = pretrained["steps"] * arm_cost(arm, cost)["flops_per_step"]
        row["eval_loss"] = pretrained["eval_loss"]
        row["train_seconds"], row["threads"] = pretrained["train_seconds"], record.get("threads")
        trained_in = pretrained.get("mixed_precision", "no")
        row["machine"] = f"{env.get('cpu_capability', '?')}, {'fp32' if trained_in == 'no' else trained_in}"
        row["commit"] = env.get("commit")
        again = [r["eval_loss"] for r in record.get("pretrained_again", [])]
        if any(abs(loss - row["eval_loss"]) > 1e-3 for loss in again):
            row["machine"] += f"; pretrained again to loss {again[-1]:.3f}"
        for labels in EPOCHS:
            own, ref = _summary(runs / f"finetune_{labels}.json", labels), references[labels]
            path = runs / f"probe_{labels}.json"
            for model, probed in (json.loads(path.read_text()) if path.is_file() else {}).items():
                probed_models[labels][arm if model == "pretrained" else model] = probed
            if arm in probed_models[labels]:
                row.setdefault(labels, {})["probe"] = _best_probe(probed_models[labels][arm])
            if own is None:
                continue
            test = own["pretrained"]["test_accuracy"]
            row.setdefault(labels, {}).update(test=test, validation=own["pretrained"]["validation_accuracy"])
            row[labels]["learning_rate"] = own["pretrained"]["learning_rate"]
            if ref is not None:
                row[labels]["gain"] = test["mean"] - ref["random_init"]["test_accuracy"]["mean"]
                baselines.setdefault(labels, {}).update({k: ref[k]["test_accuracy"] for k in ("random_init", "tfidf")})
        rows.append(row)
    for labels, probed in probed_models.items():
        path = reference / f"probe_{labels}.json"  # at another budget: the untrained architecture's, probed beside
        if "random_init" not in probed and path.is_file():  # the reference's at the choosing budget
            probed.update({k: v for k, v in json.loads(path.read_text()).items() if k == "random_init"})
        if "random_init" in probed:
            baselines.setdefault(labels, {})["random_init_probe"] = _best_probe(probed["random_init"])
    result = {"budget_minutes": budget, "precision": precision_, "task": TASK, "step_cost": str(STEP_COST)}
    result.update(environment=environment(), arms=rows, baselines=baselines)

    def cell(t, gain=None):  # mean ± std (n) over seeds, a single seed without a std; TF-IDF is deterministic
        if isinstance(t, float):
            text = f"{t:.3f}"
        else:
            text = f"{t['mean']:.3f}" + (f" ± {t['std']:.3f}" if t["n"] > 1 else "") + f" (n={t['n']})"
        return text + ("" if gain is None else f" {gain * 100:+.1f}")

    def probe_cell(p):  # the test accuracy of the feature set chosen on validation
        layer = p["features"].removeprefix("mean_layer_")
        return f"{p['test_accuracy']:.3f} ({'read token' if layer == p['features'] else 'mean, layer ' + layer})"

    probed = [b for b in EPOCHS if any("probe" in row.get(b, {}) for row in rows)]
    at_choosing = "" if budget == CHOOSING_BUDGET else f" at {CHOOSING_BUDGET} minutes"
    lines = [
        f"# Pretraining objectives at equal compute ({budget} minutes of the main job's permutation LM), {precision_}"
        + (f", {TASKS[TASK][1]} (held out)" if held_out() else ""),
        "",
        f"Generated by `python -m benchmarks.objectives table --precision {precision_}"
        + ("" if budget == CHOOSING_BUDGET else f" --budget {budget}")
        + (f" --task {TASK}" if held_out() else "")
        + f"` from benchmarks/results/objective_runs/*_{budget}min_{precision_}{_task_suffix()}. Test accuracy on "
        f"{TASKS[TASK][1]} (each arm pretrained on its own text), mean ± std over seeds (n), then the gain in points "
        "over random initialisation of the same size and tokenizer (XLNet-Lite's; the random init and TF-IDF rows "
        f"come with {reference_name}'s finetuning{at_choosing}: without it the gains are blank); validation on 20 "
        f"Newsgroups (seed 0, finetuning rate 3e-4) chose each objective's entry{at_choosing}. "
        "The time is the pretraining's training steps on its machine, at the threads it had (beside other runs "
        "where runs shared the machine). The loss is each objective's own (not comparable across objectives). A linear "
        "probe is a logistic regression on the frozen model's features (benchmarks/probes.py): its test accuracy "
        "with the feature set that probes best on validation (a layer's mean over the tokens, or the last layer at "
        "the token the classifier reads).",
        "",
        "| arm | machine | steps | tokens | FLOPs | time (threads) | own loss | validation, 50 per group | "
        + " | ".join(f"test, {b} per group" if b != "all" else "test, every label" for b in EPOCHS)
        + "".join(f" | linear probe, {b} per group" if b != "all" else " | linear probe, every label" for b in probed)
        + " |",
        "|---|---|---:|---:|---:|---:|---:|---:|" + "---:|" * (len(EPOCHS) + len(probed)),
    ]
    for row in rows:
        selection = f"{row['50']['validation']['values'][0]:.3f}" if "test" in row.get("50", {}) else ""
        cells = [cell(row[b]["test"], row[b].get("gain")) if "test" in row.get(b, {}) else "" for b in EPOCHS]
        cells += [probe_cell(row[b]["probe"]) if "probe" in row.get(b, {}) else "" for b in probed]
        lines.append(
            f"| {row['arm']} | {row['machine']} | {row['steps']:,} | {row['tokens'] / 1e6:.1f}M | {row['flops']:.2e} | "
            f"{row['train_seconds'] / 60:.1f} min ({row['threads']}) | {row['eval_loss']:.3f} | {selection} | "
            + " | ".join(cells)
            + " |"
        )
    for name in ("random_init", "tfidf"):
        cells = [cell(baselines[b][name]) if name in baselines.get(b, {}) else "" for b in EPOCHS]
        cells += [probe_cell(p) if (p := baselines.get(b, {}).get(f"{name}_probe")) else "" for b in probed]
        lines.append(f"| {name} | | | | | | | | " + " | ".join(cells) + " |")
    result["pretraining_seeds"] = {labels: seeds for labels in EPOCHS if (seeds := pretraining_seeds(rows, labels))}
    for labels, seeds in result["pretraining_seeds"].items():
        lines += seed_table(seeds, labels)
    lines += probe_tables({labels: probed_models[labels] for labels in probed})
    table = table_path(budget, precision_)
    Path(f"{table}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    result["entries"] = shown_entries(rows, budget, precision_)
    plot(result, Path(f"{table}.png"))
    Path(f"{table}.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def pretraining_seeds(rows: list[dict], labels: str = "50") -> dict[str, dict]:
    """{arm: {seed: [validation, test], ..., "validation": stats, "test": stats}} for each arm also pretrained with
    other seeds (`_seed1`, `_seed2`): finetuning seed 0's accuracies at `labels` per group for each pretraining seed
    (the recipe's first), and their mean ± std over the pretraining seeds."""
    done = {row["arm"]: row[labels] for row in rows if "test" in row.get(labels, {})}
    keys, result = ("validation", "test"), {}
    for arm in done:
        names = {seed: arm if seed == RECIPE_SEED else f"{arm}_{SEED_NAMES[seed]}" for seed in PRETRAINING_SEEDS}
        firsts = {str(seed): [done[name][k]["values"][0] for k in keys] for seed, name in names.items() if name in done}
        if len(firsts) < 2:  # (a `_seed` arm itself has no seeds of its own)
            continue
        result[arm] = dict(firsts)
        for i, key in enumerate(keys):
            values = [pair[i] for pair in firsts.values()]
            result[arm][key] = {"mean": statistics.mean(values), "std": statistics.stdev(values), "n": len(values)}
    return result


def seed_table(seeds: dict[str, dict], labels: str = "50") -> list[str]:
    """Markdown: each arm's accuracies per pretraining seed, and their mean ± std."""
    if not seeds:
        return []
    per_group = "every label" if labels == "all" else f"{labels} labels per group"
    lines = [
        "",
        f"Pretraining seeds, {per_group}: validation / test accuracy of finetuning seed 0 on the model of each "
        f"pretraining seed (the recipe's {RECIPE_SEED}, then the `_seed` arms), and their mean ± std over the "
        "pretraining seeds.",
        "",
        "| arm | " + " | ".join(f"seed {seed}" for seed in PRETRAINING_SEEDS) + " | mean ± std |",
        "|---|" + "---:|" * (len(PRETRAINING_SEEDS) + 1),
    ]
    for arm, by_seed in seeds.items():
        cells = [
            " / ".join(f"{v:.3f}" for v in by_seed[str(seed)]) if str(seed) in by_seed else ""
            for seed in PRETRAINING_SEEDS
        ]
        stats = " / ".join(f"{by_seed[k]['mean']:.3f} ± {by_seed[k]['std']:.3f}" for k in ("validation", "test"))
        lines.append(f"| {arm} | " + " | ".join(cells) + f" | {stats} (n={by_seed['test']['n']}) |")
    return lines


def probe_tables(probed_models: dict[str, dict[str, dict]]) -> list[str]:
    """Markdown: per number of labels ({labels: {model: its probe file's entry}}), every probed model's test accuracy
    per feature set (validation's choice in bold)."""
    lines = []
    for labels, probed in probed_models.items():
        features = list(next(iter(probed.values()))["probes"])
        heads = [f.replace("mean_layer_0", "embeddings").replace("mean_layer_", "layer ") for f in features]
        heads = [h.replace("read_token_last_layer", "read token, last layer") for h in heads]
        lines += [
            "",
            f"Linear probes, {labels} training texts per group: test accuracy per feature set (the mean over "
            "the tokens of the embeddings and of each layer's output; the last layer at the token the classifier"
            " reads), the set chosen on validation in bold.",
            "",
        ]
        lines += ["| model | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(heads)]
        for name, result in probed.items():
            cells = [f"{result['probes'][f]['test_accuracy']:.3f}" for f in features]
            cells = [f"**{c}**" if f == result["best_on_validation"] else c for f, c in zip(features, cells)]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def entries(rows: list[dict]) -> dict[str, str]:
    """{objective: its arm of the grid with the best validation accuracy at 50 labels per group, seed 0} (the first
    on ties)."""
    best: dict[str, dict] = {}
    for row in rows:
        if "test" in row.get("50", {}) and row["arm"] not in WHY_ARMS:
            score = row["50"]["validation"]["values"][0]
            if row["objective"] not in best or score > best[row["objective"]]["50"]["validation"]["values"][0]:
                best[row["objective"]] = row
    return {objective: row["arm"] for objective, row in best.items()}


def plot(result: dict, path: Path) -> None:
    """Each objective's entry by number of labels: finetuned test accuracy (mean, std over seeds) beside random init
    and TF-IDF, and, where probed, the linear probe's test accuracy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = {row["arm"]: row for row in result["arms"]}
    arms = list(result["entries"].values())
    panels = [("test", "finetuned")] + (
        [("probe", "linear probe, frozen")] if any("probe" in rows[a].get(b, {}) for a in arms for b in EPOCHS) else []
    )
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False, sharey=True)
    width = 0.8 / (len(arms) + 2)
    for ax, (key, title) in zip(axes[0], panels):
        for g, labels in enumerate(EPOCHS):
            bars = [(a, rows[a][labels][key]) for a in arms if key in rows[a].get(labels, {})]
            base, suffix = result["baselines"].get(labels, {}), "_probe" if key == "probe" else ""
            bars += [(name, base[name + suffix]) for name in ("random_init", "tfidf") if name + suffix in base]
            for i, (name, value) in enumerate(bars):
                if key == "probe":
                    mean, std = value["test_accuracy"], 0.0
                else:
                    mean, std = (value, 0.0) if isinstance(value, float) else (value["mean"], value["std"])
                color = f"C{arms.index(name)}" if name in arms else {"random_init": "0.6", "tfidf": "0.3"}[name]
                ax.bar(
                    g + (i - len(bars) / 2 + 0.5) * width,
                    mean,
                    width,
                    yerr=std,
                    color=color,
                    capsize=2,
                    label=name,
                )
        ax.set_xticks(range(len(EPOCHS)), [f"{b} per group" if b != "all" else "every label" for b in EPOCHS])
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel(f"{TASKS[TASK][1]} test accuracy")
    handles, names = axes[0][0].get_legend_handles_labels()
    unique = dict(zip(names, handles))  # one entry per name (none before anything is finetuned)
    if unique:
        fig.legend(
            unique.values(),
            unique.keys(),
            loc="upper center",
            ncol=len(unique),
            frameon=False,
            bbox_to_anchor=(0.5, 1.05),
        )
    fig.suptitle(
        f"Pretraining objectives at equal compute ({result['budget_minutes']} min), {result['precision']}", y=1.12
    )
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def main(argv=None):
    global TASK  # every step below runs on the one task asked
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["step_cost", "pretrain", "finetune", "probe", "table"])
    parser.add_argument(
        "arms",
        nargs="*",
        help=f"Arms: {', '.join(a for a in ARMS if _seedless(a) == a)}; and for {', '.join(SEEDED)} each point's "
        + ", ".join(f"`_{name}`" for name, _ in SEEDS)
        + ".",
    )
    parser.add_argument("--budget", type=int, choices=sorted(MAIN_JOB_STEPS), default=10)
    parser.add_argument("--labels_per_class", nargs="+", choices=sorted(EPOCHS), default=["50"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--lr_grid", nargs="+", default=["3e-4"], help="Finetuning rates (chosen on validation).")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--levers", action="store_true", help="step_cost: the levers that change a step's cost.")
    parser.add_argument(
        "--out",
        type=Path,
        help=f"step_cost: the file it writes (default {STEP_COST}, whose steps every run trains for).",
    )
    parser.add_argument(
        "--precision", choices=["fp32", "bf16"], help="table: the runs of this precision (default: this machine's)."
    )
    parser.add_argument("--threads", type=int, default=2, help="Torch threads of pretraining, probe and step_cost.")
    parser.add_argument(
        "--task", choices=TASKS, default=TASK, help="The task, its own text pretraining the arms (others held out)."
    )
    args = parser.parse_args(argv)
    TASK = args.task
    args.argv = sys.argv[1:] if argv is None else argv
    unknown = [a for a in args.arms if a not in ARMS]
    if unknown:
        parser.error(f"unknown arm {unknown[0]}; the arms are {', '.join(ARMS)}")
    if args.command == "step_cost":
        args.out = args.out or STEP_COST
        return step_cost(args)
    for arm in args.arms:
        if args.command == "pretrain":
            pretrain(arm, args.budget, args.threads)
        elif args.command == "finetune":
            for labels in args.labels_per_class:
                finetune(arm, args.budget, labels, args.seeds, args.lr_grid, args.threads)
        elif args.command == "probe":
            for labels in args.labels_per_class:
                probe(arm, args.budget, labels, args.threads)
    if args.command == "table":
        return write_table(args.budget, args.precision)


if __name__ == "__main__":
    main()
