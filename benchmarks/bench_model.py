"""Side-by-side benchmark: transformers' XLNetLMHeadModel vs XLNet-Lite, same weights, same pretraining batch.

    python -m benchmarks.bench_model [--config reference small large | all] [--runs 8] [--threads 2]
                                     [--precisions auto|fp32|fp32,bf16] [--no-compile]
                                     [--out benchmarks/results/model.json] [--profile]

Per config it builds transformers' XLNetLMHeadModel (dropout 0 at the reference and small configs, as the recipe
pretrains; 0.1 at the large one; train mode) and its XLNet-Lite twins
(`xlnet_lite.from_hf_xlnet`, identical weights), and times, in ONE process and alternating (the order rotates
every run), these variants:

    hf_fp32          transformers, fp32                        (the baseline of every ratio)
    lite_eager_fp32  XLNet-Lite, eager attention, fp32
    lite_sdpa_fp32   XLNet-Lite, scaled_dot_product_attention, fp32
    lite_compiled_fp32  XLNet-Lite, SDPA, torch.compile(model, fullgraph=True, dynamic=False) (inductor)
    lite_eager_compiled_fp32  XLNet-Lite, eager attention, compiled the same way (what --torch_compile runs on CPU)
    hf_bf16          transformers under torch.autocast("cpu", dtype=torch.bfloat16)
    lite_eager_bf16  XLNet-Lite, eager attention, under the same autocast
    lite_sdpa_bf16   XLNet-Lite, SDPA, under the same autocast
    lite_compiled_bf16  XLNet-Lite, SDPA, compiled, under the same autocast
    lite_eager_compiled_bf16  XLNet-Lite, eager attention, compiled, under the same autocast

Configs: "reference" (the reference shapes), "small" (the pretraining recipe's shapes with XLNet's 1/6 predicted: the
small preset, B 16, T 128, P 22, a full 96-token memory; the recipe's default predicts a third, P 43), "large".
--precisions auto (the default) runs the bf16 rows only on a CPU with bf16 matmul units (AVX512-BF16 or AMX): elsewhere
bf16 is emulated (measured on an AVX2 AMD EPYC: matmuls 100-250x slower than fp32, a small-preset training step 19 s
against 0.7 s), so the rows would take most of an hour; the skip and its reason go into the JSON. The compiled rows'
first steps (compilation, about a minute on 2 cores) are reported apart (first_train_step_s, first_eval_forward_s,
first_classify_s).

on (1) a training step: zero_grad + forward with labels + backward + AdamW step (fused, as the recipes use it;
train mode),
(2) an inference forward (eval mode, no_grad) of the same batch (PLM scoring), and (3) eval-mode sequence
classification (transformers' XLNetForSequenceClassification and its twins) of a left-padded B x T batch with
segment ids, what finetuning's evaluation and prediction run. Tokens/s = B * T / step time (median of
--runs runs after --warmup runs). Each variant has its own model copy and optimizer.

Peak memory of a training step is measured in a separate process per variant (this script re-invoked with
--memory-child): after building the model, optimizer and batch and a gc, it resets the peak-RSS counter
(/proc/self/clear_refs "5") and records the RSS (/proc/self/statm); it then runs --mem-steps training steps (the
first allocates AdamW's state) and reports the peak RSS (VmHWM, /proc/self/status) minus that baseline. Not
getrusage's ru_maxrss: on Linux it is inherited through fork/exec from the parent (here the benchmark process,
already ~2 GB), so a child's ru_maxrss never drops below it (it is still recorded, as ru_maxrss_delta). This is
what the OS sees (torch's CPU allocator does not cache: RSS follows the live tensors plus glibc's free lists).

Model FLOP utilisation: torch.utils.flop_counter.FlopCounterMode counts the matmul FLOPs (mm/addmm/bmm/...)
of one training step (forward + backward) and of one inference forward of each variant; achieved FLOP/s =
counted FLOPs / median step time; MFU = achieved / the machine's matmul peak, measured at the start and the end of
each config (median of 2048^3 matmuls, fp32 for the fp32 rows, bf16 for the bf16 rows): a shared machine's speed
drifts (here 87 -> 128 GFLOP/s fp32 within one run), so an MFU is only as good as its peak. Each variant is charged its
own FLOPs: XLNet-Lite does less work (query stream on P rows), so "hf-equivalent MFU" (the baseline's FLOPs /
this variant's time) is reported too. The "ceiling" is the MFU the step would reach if everything but its matmuls
took no time: its recorded mm/bmm/addmm calls replayed alone on fresh tensors of the same shapes and dtypes.

The collator (xlnet_lite.collator.DataCollatorForXLNetPretraining, if present) is timed on B examples of T
tokens (synthetic ids with XLNet's `A <sep> B <sep> <cls>` layout, a synthetic 8000-piece vocabulary) as a
fraction of a training step.

--profile runs torch.profiler over training steps of XLNet-Lite (the explicit kernel, the CPU default) and
transformers at the reference config, fp32 and (on a CPU with bf16 units) bf16 autocast, and prints the top ops by
self CPU time.

Not a test: never run it in CI. Step times on a shared machine are noisy; read medians, not single runs.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch._functorch.config
import torch._inductor.config
import transformers
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

import xlnet_lite
from xlnet_lite.collator import random_factorization_masks as xlnet_masks

REPO = Path(__file__).resolve().parents[1]

CONFIGS = {
    "reference": dict(
        vocab_size=8000,
        d_model=256,
        n_layer=4,
        n_head=4,
        d_inner=1024,
        batch=8,
        seq_len=256,
        num_predict=43,
        mem_len=None,
        reuse_len=None,
        dropout=0.0,
    ),
    "small": dict(
        vocab_size=8000,
        d_model=256,
        n_layer=4,
        n_head=4,
        d_inner=1024,
        batch=16,
        seq_len=128,
        num_predict=22,
        mem_len=96,
        reuse_len=64,
        dropout=0.0,
    ),  # the recipe pretrains without dropout;
    # P 22 is XLNet's 1/6 of 128, the recipe's default before it predicted a third (P 43): the speed tables keep it
    "large": dict(
        vocab_size=8000,
        d_model=512,
        n_layer=6,
        n_head=8,
        d_inner=2048,
        batch=4,
        seq_len=512,
        num_predict=85,
        mem_len=256,
        reuse_len=256,
    ),
}
# name -> (implementation, attention path, autocast dtype, compiled)
VARIANTS = {
    "hf_fp32": ("hf", None, None, False),
    "lite_eager_fp32": ("lite", "eager", None, False),
    "lite_sdpa_fp32": ("lite", "sdpa", None, False),
    "lite_compiled_fp32": ("lite", "sdpa", None, True),
    "lite_eager_compiled_fp32": ("lite", "eager", None, True),
    "hf_bf16": ("hf", None, torch.bfloat16, False),
    "lite_eager_bf16": ("lite", "eager", torch.bfloat16, False),
    "lite_sdpa_bf16": ("lite", "sdpa", torch.bfloat16, False),
    "lite_compiled_bf16": ("lite", "sdpa", torch.bfloat16, True),
    "lite_eager_compiled_bf16": ("lite", "eager", torch.bfloat16, True),
}
BASELINE = "hf_fp32"
SAME_PRECISION_BASELINE = {n: "hf_bf16" for n in VARIANTS if n.startswith("lite_") and n.endswith("_bf16")}
EAGER_TWIN = {
    "lite_compiled_fp32": "lite_sdpa_fp32",
    "lite_compiled_bf16": "lite_sdpa_bf16",  # same FLOPs
    "lite_eager_compiled_fp32": "lite_eager_fp32",
    "lite_eager_compiled_bf16": "lite_eager_bf16",
}
MODEL_KEYS = ("vocab_size", "d_model", "n_layer", "n_head", "d_inner", "mem_len", "reuse_len")


# ---------------------------------------------------------------------------------------------------------
# Building models and batches


def hf_config(cfg):
    return transformers.XLNetConfig(**{k: cfg[k] for k in MODEL_KEYS}, dropout=cfg.get("dropout", 0.1))


def make_batch(cfg, seed=0):
    """The pretraining batch: input ids with XLNet's segment layout, perm_mask, one-hot target_mapping, labels."""
    B, T, P, V = cfg["batch"], cfg["seq_len"], cfg["num_predict"], cfg["vocab_size"]
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(8, V, (B, T), generator=gen)
    token_type_ids = torch.zeros(B, T, dtype=torch.long)
    sep = T // 2  # A <sep> B <sep> <cls>
    input_ids[:, sep], input_ids[:, -2], input_ids[:, -1] = 4, 4, 3
    token_type_ids[:, sep + 1 : -1], token_type_ids[:, -1] = 1, 2
    perm_mask, target_mapping = xlnet_masks(B, T, P, seed=seed)
    labels = input_ids.gather(1, target_mapping.argmax(-1))
    return dict(
        input_ids=input_ids,
        token_type_ids=token_type_ids,
        perm_mask=perm_mask,
        target_mapping=target_mapping,
        labels=labels,
    )


def make_hf_mems(hf, cfg, seed=1):
    """A full memory (mem_len tokens) from previous steps, transformers' layout: n_layer tensors (M, B, H)."""
    if not cfg["mem_len"]:
        return None
    was_training = hf.training
    hf.eval()
    mems = None
    with torch.no_grad():
        while mems is None or mems[0].shape[0] < cfg["mem_len"]:
            prev = make_batch(cfg, seed=seed)
            mems = hf(input_ids=prev["input_ids"], token_type_ids=prev["token_type_ids"], mems=mems, use_mems=True).mems
            seed += 1
    hf.train(was_training)
    return [m.detach() for m in mems]


class Variant:
    device_type = "cpu"  # of the autocast (benchmarks/bench_gpu.py moves variants to the GPU)

    def __init__(self, name, model, batch, mems, autocast_dtype, compiled=False):
        self.name, self.model, self.autocast_dtype = name, model, autocast_dtype
        self.forward = torch.compile(model, fullgraph=True, dynamic=False) if compiled else model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)  # as xlnet_lite.training
        self.inputs = dict(batch)
        if mems is not None:
            self.inputs.update(mems=mems, use_mems=True)
        self.infer_inputs = {k: v for k, v in self.inputs.items() if k != "labels"}

    def autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.autocast_dtype)

    def forward_backward(self):
        with self.autocast():
            loss = self.forward(**self.inputs).loss
        loss.backward()
        return loss

    def train_step(self):
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.forward_backward()
        self.optimizer.step()
        return loss

    def infer(self):
        with torch.no_grad(), self.autocast():
            return self.forward(**self.infer_inputs).logits


def make_lite(hf, attn):
    lite = xlnet_lite.from_hf_xlnet(hf)
    lite.config._attn_implementation = attn
    return lite


def build_variants(cfg, names, seed=0):
    torch.manual_seed(seed)
    hf = transformers.XLNetLMHeadModel(hf_config(cfg)).train()
    batch = make_batch(cfg)
    hf_mems = make_hf_mems(hf, cfg)
    lite_mems = None if hf_mems is None else [m.transpose(0, 1).contiguous() for m in hf_mems]  # (B, M, H)
    variants = {}
    for name in names:
        impl, attn, dtype, compiled = VARIANTS[name]
        if impl == "hf":
            variants[name] = Variant(name, copy.deepcopy(hf).train(), batch, hf_mems, dtype)
        else:
            variants[name] = Variant(name, make_lite(hf, attn).train(), batch, lite_mems, dtype, compiled)
    return hf, batch, hf_mems, lite_mems, variants


class Classifier:
    """Eval-mode sequence classification of a left-padded batch: what finetuning's evaluation and prediction run."""

    def __init__(self, model, batch, autocast_dtype, compiled=False):
        self.model, self.batch, self.autocast_dtype = model.eval(), batch, autocast_dtype
        self.forward = torch.compile(model, fullgraph=True, dynamic=False) if compiled else model

    def infer(self):
        with torch.no_grad(), Variant.autocast(self):
            return self.forward(**self.batch).logits


def make_classify_batch(cfg, seed=0):
    """B sequences of T tokens, `A <sep> B <sep> <cls>` segments, left padding of 0 to T/4 tokens per row."""
    B, T, V = cfg["batch"], cfg["seq_len"], cfg["vocab_size"]
    gen = torch.Generator().manual_seed(seed)
    attention_mask = torch.ones(B, T, dtype=torch.long)
    for b, n in enumerate(torch.randint(0, T // 4, (B,), generator=gen).tolist()):
        attention_mask[b, :n] = 0
    token_type_ids = torch.zeros(B, T, dtype=torch.long)
    token_type_ids[:, T // 2 : -1], token_type_ids[:, -1] = 1, 2
    return dict(
        input_ids=torch.randint(8, V, (B, T), generator=gen),
        attention_mask=attention_mask,
        token_type_ids=token_type_ids,
    )


def build_classifiers(cfg, names, seed=0):
    """transformers' XLNetForSequenceClassification and its XLNet-Lite twins; the twins' largest logit difference."""
    torch.manual_seed(seed)
    hf = transformers.XLNetForSequenceClassification(hf_config(cfg)).eval()
    batch = make_classify_batch(cfg)
    classifiers, diffs = {}, {}
    with torch.no_grad():
        ref = hf(**batch).logits
    for name in names:
        impl, attn, dtype, compiled = VARIANTS[name]
        model = copy.deepcopy(hf) if impl == "hf" else make_lite(hf, attn)
        classifiers[name] = Classifier(model, batch, dtype, compiled)
        if impl == "lite" and dtype is None and not compiled:
            with torch.no_grad():
                diffs[attn] = float((model.eval()(**batch).logits - ref).abs().max())
    return classifiers, diffs


def equivalence_check(hf, batch, hf_mems, lite_mems):
    """Eval mode (no dropout), fp32: the twins must give the same loss and logits on this batch."""
    inputs = dict(batch)
    report = {}
    hf.eval()
    with torch.no_grad():
        ref = hf(**inputs, mems=hf_mems)
        for attn in ("eager", "sdpa"):
            lite = make_lite(hf, attn).eval()
            out = lite(**inputs, mems=lite_mems)
            report[attn] = dict(
                loss_abs_diff=abs(float(out.loss - ref.loss)),
                logits_max_abs_diff=float((out.logits - ref.logits).abs().max()),
            )
    hf.train()
    report["hf_loss"] = float(ref.loss)
    return report


# ---------------------------------------------------------------------------------------------------------
# Measurements


def median(xs):
    return statistics.median(xs)


def matmul_peak(dtype, n=2048, reps=8):
    """FLOP/s of an n^3 matmul: samples (FLOP/s per run)."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    for _ in range(2):
        a @ b
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        samples.append(2 * n**3 / (time.perf_counter() - t0))
    return samples


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def alternate(variants, fn, runs, warmup, clock=timed):
    """Every run calls fn on each variant once, the order rotating; returns name -> seconds (warm-up dropped).
    clock(f) runs f and returns its seconds (bench_gpu passes CUDA events)."""
    names = list(variants)
    times = {n: [] for n in names}
    for r in range(warmup + runs):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            dt = clock(lambda: fn(variants[name]))
            if r >= warmup:
                times[name].append(dt)
    return times


def count_flops(fn):
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


MATMULS = {
    torch.ops.aten.mm.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.baddbmm.default,
}


class _RecordMatmuls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in MATMULS:
            self.calls.append((func, [(a.shape, a.dtype) if isinstance(a, torch.Tensor) else a for a in args]))
        return func(*args, **(kwargs or {}))


def matmul_only_seconds(fn, reps=5):
    """The step's matmuls alone: every mm/bmm/addmm that fn runs (forward and backward) replayed on fresh
    contiguous tensors of the same shapes and dtypes; median of reps replays of the whole list. Counted FLOPs over
    this time is the step's FLOP rate if everything that is not a matmul took no time: the ceiling of its MFU at
    these shapes."""
    with _RecordMatmuls() as rec:
        fn()
    calls = [(f, [torch.randn(a[0]).to(a[1]) if isinstance(a, tuple) else a for a in args]) for f, args in rec.calls]
    samples = []
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        for f, args in calls:
            f(*args)
        samples.append(time.perf_counter() - t0)
    return median(samples[1:])


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def vm_hwm_bytes():
    """Peak RSS of this address space (VmHWM). Unlike ru_maxrss it is not inherited from the parent process."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmHWM in /proc/self/status")


def memory_child(args):
    """One variant, own process: peak RSS of training steps above the post-build RSS."""
    cfg = config_with_overrides(args, args.config[0])
    _, _, _, _, variants = build_variants(cfg, [args.memory_child])
    v = variants[args.memory_child]
    gc.collect()
    reset = False
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
        reset = True
    base_rss, base_hwm = rss_bytes(), vm_hwm_bytes()
    base_maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    for _ in range(args.mem_steps):
        v.train_step()
    hwm = vm_hwm_bytes()
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(
        json.dumps(
            dict(
                variant=args.memory_child,
                baseline_rss=base_rss,
                baseline_vmhwm=base_hwm,
                hwm_reset=reset,
                vmhwm_after=hwm,
                peak_delta=hwm - base_rss,
                baseline_ru_maxrss=base_maxrss,
                ru_maxrss_after=maxrss,
                ru_maxrss_delta=maxrss - base_rss,
                steps=args.mem_steps,
            )
        )
    )


def measure_memory(args, name, names):
    out = {}
    for variant in names:
        cmd = [
            sys.executable,
            __file__,
            "--memory-child",
            variant,
            "--config",
            name,
            "--threads",
            str(args.threads),
            "--mem-steps",
            str(args.mem_steps),
        ]
        if args.large_batch:
            cmd += ["--large-batch", str(args.large_batch)]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            out[variant] = dict(error=res.stderr[-2000:])
            continue
        out[variant] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


class _Tok:
    """Just enough of a tokenizer for the collator: a synthetic vocabulary of XLNet special tokens + pieces."""

    def __init__(self, vocab_size):
        specials = ["<unk>", "<s>", "</s>", "<cls>", "<sep>", "<pad>", "<mask>", "<eod>"]
        pieces = specials + [("▁w" if i % 3 == 0 else "x") + str(i) for i in range(len(specials), vocab_size)]
        self._vocab = {p: i for i, p in enumerate(pieces)}
        self._pieces = pieces
        self.sep_token_id, self.cls_token_id, self.pad_token_id = 4, 3, 5

    def get_vocab(self):
        return dict(self._vocab)

    def __len__(self):
        return len(self._pieces)

    def convert_ids_to_tokens(self, ids):
        return [self._pieces[i] for i in ids]


def time_collator(cfg, runs, batch):
    try:
        from xlnet_lite.collator import DataCollatorForXLNetPretraining
    except ImportError as e:
        return dict(skipped=f"xlnet_lite.collator.DataCollatorForXLNetPretraining not available ({e})")
    B, T = cfg["batch"], cfg["seq_len"]
    collator = DataCollatorForXLNetPretraining(
        tokenizer=_Tok(cfg["vocab_size"]),
        plm_probability=cfg["num_predict"] / T,
        reuse_len=cfg["reuse_len"],
        seed=0,
    )
    examples = [
        dict(
            input_ids=batch["input_ids"][b].numpy(),
            token_type_ids=batch["token_type_ids"][b].numpy(),
            is_reversed=False,
        )
        for b in range(B)
    ]
    out = collator(examples)
    for _ in range(2):
        collator(examples)
    times = [timed(lambda: collator(examples)) for _ in range(max(runs, 10))]
    return dict(
        median_s=median(times),
        times_s=times,
        shapes={k: list(v.shape) for k, v in out.items()},
        note="synthetic tokenizer/vocabulary; input_ids and token types of the benchmark batch",
    )


# ---------------------------------------------------------------------------------------------------------
# One config


def config_with_overrides(args, name):
    cfg = dict(CONFIGS[name])
    if name == "large" and args.large_batch:
        cfg["batch"] = args.large_batch
    return cfg


def run_config(args, name, names):
    cfg = config_with_overrides(args, name)
    tokens = cfg["batch"] * cfg["seq_len"]
    print(f"\n=== {name}: {cfg}", flush=True)
    # the matmul peak at this config's start and end: a shared machine's speed drifts over a run
    peak_samples = dict(
        fp32=matmul_peak(torch.float32),
        bf16=bf16_peak() if any(VARIANTS[n][2] is torch.bfloat16 for n in names) else [],
    )
    hf, batch, hf_mems, lite_mems, variants = build_variants(cfg, names)
    equiv = equivalence_check(hf, batch, hf_mems, lite_mems)
    print(f"equivalence (eval, fp32): {equiv}", flush=True)
    del hf

    first = {}  # one of each first (compilation for the compiled rows), to see where the time goes
    for n, v in variants.items():
        first[n] = dict(train_s=timed(v.train_step))
        print(f"  first training step {n}: {first[n]['train_s']:.2f} s", flush=True)
    t0 = time.perf_counter()
    train_times = alternate(variants, Variant.train_step, args.runs, args.warmup)
    print(f"training timed in {time.perf_counter() - t0:.0f} s", flush=True)
    for n, v in variants.items():
        v.model.eval()
        first[n]["infer_s"] = timed(v.infer)
    t0 = time.perf_counter()
    infer_times = alternate(variants, Variant.infer, args.runs, args.warmup)
    print(f"inference timed in {time.perf_counter() - t0:.0f} s", flush=True)

    flops = {}
    for n, v in variants.items():
        if EAGER_TWIN.get(n) in variants:
            continue  # a compiled model does its eager twin's FLOPs (counted below)
        v.model.train()
        v.optimizer.zero_grad(set_to_none=True)
        train_flops = count_flops(v.forward_backward)
        v.model.eval()
        params = [p for p in v.model.parameters() if p.requires_grad]
        for p in params:  # FlopCounterMode's module tracker trips on params requiring grad under no_grad
            p.requires_grad_(False)
        flops[n] = dict(train=train_flops, infer=count_flops(v.infer))
        for p in params:
            p.requires_grad_(True)
        v.model.train()
        flops[n]["matmul_only_s"] = matmul_only_seconds(v.forward_backward)
    for n in variants:
        if n not in flops:
            flops[n] = flops[EAGER_TWIN[n]]
    del variants
    gc.collect()

    classifiers, classify_diffs = build_classifiers(cfg, names)
    print(f"classification equivalence (eval, fp32, left padding): max |logit diff| {classify_diffs}", flush=True)
    for n, c in classifiers.items():
        first[n]["classify_s"] = timed(c.infer)
    t0 = time.perf_counter()
    classify_times = alternate(classifiers, Classifier.infer, args.runs, args.warmup)
    print(f"classification timed in {time.perf_counter() - t0:.0f} s", flush=True)
    del classifiers
    gc.collect()

    collator = time_collator(cfg, args.runs, batch)
    memory = {} if args.no_memory else measure_memory(args, name, names)

    peak_samples["fp32"] += matmul_peak(torch.float32)
    peak_samples["bf16"] += bf16_peak() if peak_samples["bf16"] else []
    peaks = {k: median(v) for k, v in peak_samples.items() if v}
    rows = {}
    for n in names:
        dtype = VARIANTS[n][2]
        peak = peaks["bf16"] if dtype is torch.bfloat16 else peaks["fp32"]
        tr, inf = median(train_times[n]), median(infer_times[n])
        rows[n] = dict(
            train_median_s=tr,
            train_tokens_per_s=tokens / tr,
            train_times_s=train_times[n],
            infer_median_s=inf,
            infer_tokens_per_s=tokens / inf,
            infer_times_s=infer_times[n],
            train_gflop=flops[n]["train"] / 1e9,
            infer_gflop=flops[n]["infer"] / 1e9,
            train_mfu=flops[n]["train"] / tr / peak,
            infer_mfu=flops[n]["infer"] / inf / peak,
            train_mfu_hf_equivalent=flops[BASELINE]["train"] / tr / peak,
            train_matmul_only_s=flops[n]["matmul_only_s"],
            train_mfu_ceiling=flops[n]["train"] / flops[n]["matmul_only_s"] / peak,
            peak_for_mfu="bf16" if dtype is torch.bfloat16 else "fp32",
            memory=memory.get(n),
            first_train_step_s=first[n]["train_s"],
            first_eval_forward_s=first[n]["infer_s"],
            classify_median_s=median(classify_times[n]),
            classify_tokens_per_s=tokens / median(classify_times[n]),
            classify_times_s=classify_times[n],
            first_classify_s=first[n]["classify_s"],
        )
    base = rows[BASELINE]
    for n, r in rows.items():
        r["train_speedup_vs_hf_fp32"] = base["train_median_s"] / r["train_median_s"]
        r["infer_speedup_vs_hf_fp32"] = base["infer_median_s"] / r["infer_median_s"]
        r["classify_speedup_vs_hf_fp32"] = base["classify_median_s"] / r["classify_median_s"]
        mem, base_mem = r["memory"] or {}, base["memory"] or {}
        if "peak_delta" in mem and "peak_delta" in base_mem:
            r["memory_ratio_vs_hf_fp32"] = mem["peak_delta"] / base_mem["peak_delta"]
        pair = SAME_PRECISION_BASELINE.get(n)
        if pair:
            r["train_speedup_vs_" + pair] = rows[pair]["train_median_s"] / r["train_median_s"]
            r["infer_speedup_vs_" + pair] = rows[pair]["infer_median_s"] / r["infer_median_s"]
            if "peak_delta" in mem and "peak_delta" in (rows[pair]["memory"] or {}):
                r["memory_ratio_vs_" + pair] = mem["peak_delta"] / rows[pair]["memory"]["peak_delta"]
    if "median_s" in collator:
        for n in ("lite_sdpa_fp32", "lite_sdpa_bf16"):
            if n in rows:
                collator[f"fraction_of_{n}_train_step"] = collator["median_s"] / rows[n]["train_median_s"]
    print_table(name, cfg, rows, collator)
    equiv["classification_max_abs_logit_diff"] = classify_diffs
    print(
        f"matmul peak at this config's start and end (2048^3, {args.threads} threads; MFU above uses the median): "
        + ", ".join(f"{k} {[round(x / 1e9) for x in v]} GFLOP/s" for k, v in peak_samples.items() if v),
        flush=True,
    )
    return dict(
        config=cfg,
        tokens_per_step=tokens,
        equivalence=equiv,
        variants=rows,
        collator=collator,
        matmul_peak_flops={k: dict(median=median(v), samples=v) for k, v in peak_samples.items() if v},
    )


def print_table(name, cfg, rows, collator):
    print(
        f"\n{name}: B {cfg['batch']}, T {cfg['seq_len']}, P {cfg['num_predict']}, d_model {cfg['d_model']}, "
        f"{cfg['n_layer']} layers, {cfg['n_head']} heads, mem {cfg['mem_len'] or 0}; medians; x = ratio vs hf_fp32"
    )
    head = (
        f"{'variant':<24} {'train tok/s':>11} {'x':>6} {'PLM infer tok/s':>15} {'x':>6} "
        f"{'classify tok/s':>14} {'x':>6} "
        f"{'peak MB':>8} {'x':>6} {'GFLOP/step':>10} {'MFU':>6} {'MFU(hf-eq)':>10} {'ceiling':>7}"
    )
    print(head)
    print("-" * len(head))
    for n, r in rows.items():
        mem = (r["memory"] or {}).get("peak_delta")
        mem_s = f"{mem / 2**20:8.0f}" if mem is not None else f"{'n/a':>8}"
        mem_x = f"{r['memory_ratio_vs_hf_fp32']:6.2f}" if "memory_ratio_vs_hf_fp32" in r else f"{'':>6}"
        print(
            f"{n:<24} {r['train_tokens_per_s']:11.0f} {r['train_speedup_vs_hf_fp32']:6.2f} "
            f"{r['infer_tokens_per_s']:15.0f} {r['infer_speedup_vs_hf_fp32']:6.2f} "
            f"{r['classify_tokens_per_s']:14.0f} {r['classify_speedup_vs_hf_fp32']:6.2f} {mem_s} {mem_x} "
            f"{r['train_gflop']:10.1f} {100 * r['train_mfu']:5.1f}% {100 * r['train_mfu_hf_equivalent']:9.1f}% "
            f"{100 * r['train_mfu_ceiling']:6.1f}%"
        )
    for n, r in rows.items():
        for pair in sorted(set(SAME_PRECISION_BASELINE.values())):
            if f"train_speedup_vs_{pair}" in r:
                extra = f", peak memory {r[f'memory_ratio_vs_{pair}']:.2f}x" if f"memory_ratio_vs_{pair}" in r else ""
                print(
                    f"{n} vs {pair}: train {r[f'train_speedup_vs_{pair}']:.2f}x, "
                    f"inference {r[f'infer_speedup_vs_{pair}']:.2f}x{extra}"
                )
    for n, r in rows.items():
        if r["first_train_step_s"] > 3 * r["train_median_s"]:
            print(
                f"{n}: first training step {r['first_train_step_s']:.1f} s, first eval-mode forward "
                f"{r['first_eval_forward_s']:.1f} s (compilation / warm-up)"
            )
    if "median_s" in collator:
        shares = ", ".join(
            f"{100 * v:.1f}% of a {k[len('fraction_of_') : -len('_train_step')]} training step"
            for k, v in collator.items()
            if k.startswith("fraction_of_")
        )
        print(f"collator: {1000 * collator['median_s']:.1f} ms per batch = {shares}")
    else:
        print(f"collator: {collator.get('skipped')}")
    print(
        "MFU = counted matmul FLOPs of the variant / median time / measured matmul peak (bf16 peak for bf16 rows); "
        "MFU(hf-eq) charges every variant transformers' FLOP count; "
        "ceiling = the MFU if only the step's matmuls took time (they replayed alone at the same shapes)",
        flush=True,
    )


# ---------------------------------------------------------------------------------------------------------
# Profile


def profile_steps(args):
    from torch.profiler import ProfilerActivity, profile

    cfg = CONFIGS["reference"]
    names = ["lite_eager_fp32", "hf_fp32"] + ([] if bf16_emulated() else ["lite_eager_bf16", "hf_bf16"])
    _, _, _, _, variants = build_variants(cfg, names)
    report = {}
    for name, v in variants.items():
        for _ in range(3):
            v.train_step()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(args.profile_steps):
                v.train_step()
        events = prof.key_averages()
        total = sum(e.self_cpu_time_total for e in events)
        top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:15]
        rows = [
            dict(
                op=e.key,
                self_cpu_ms_per_step=e.self_cpu_time_total / 1000 / args.profile_steps,
                share=e.self_cpu_time_total / total,
                calls_per_step=e.count / args.profile_steps,
            )
            for e in top
        ]
        report[name] = dict(steps=args.profile_steps, self_cpu_ms_per_step=total / 1000 / args.profile_steps, top=rows)
        print(
            f"\n{name} (reference config, {args.threads} threads): {total / 1000 / args.profile_steps:.0f} ms "
            f"self CPU per training step (mean of {args.profile_steps} profiled steps)"
        )
        print(f"{'op':<48} {'ms/step':>8} {'share':>6} {'calls/step':>10}")
        for r in rows:
            print(
                f"{r['op'][:48]:<48} {r['self_cpu_ms_per_step']:8.1f} {100 * r['share']:5.1f}% "
                f"{r['calls_per_step']:10.0f}"
            )
    return report


# ---------------------------------------------------------------------------------------------------------


def machine():
    cpu = ""
    with contextlib.suppress(OSError):
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return dict(
        cpu=cpu,
        cores=os.cpu_count(),
        python=platform.python_version(),
        torch=torch.__version__,
        transformers=transformers.__version__,
        xlnet_lite=xlnet_lite.__version__,
        loadavg=os.getloadavg(),
    )


def bf16_emulated():
    return not (torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def bf16_peak():
    """Where bf16 is emulated a 2048^3 matmul takes about a minute: a 512^3 one says as much."""
    return matmul_peak(torch.bfloat16, n=512, reps=3) if bf16_emulated() else matmul_peak(torch.bfloat16)


def variant_names(args):
    """The rows to run, and name -> why for the ones left out."""
    skipped = {}
    bf16 = args.precisions == "fp32,bf16" or (args.precisions == "auto" and not bf16_emulated())
    if not bf16:
        why = (
            "--precisions fp32"
            if args.precisions == "fp32"
            else f"this CPU ({torch.backends.cpu.get_cpu_capability()}) has no AVX512-BF16/AMX: "
            "bf16 matmuls are emulated (see the bf16 matmul peak below); "
            "pass --precisions fp32,bf16 to time them anyway"
        )
        skipped["bf16"] = f"bf16 rows: {why}"
    if args.no_compile:
        skipped["compiled"] = "compiled rows: --no-compile"
    names = [
        n
        for n, (_, _, dtype, compiled) in VARIANTS.items()
        if (bf16 or dtype is None) and not (compiled and args.no_compile)
    ]
    return names, skipped


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--config", nargs="+", choices=["reference", "small", "large", "all"], default=["reference", "small"]
    )
    parser.add_argument(
        "--precisions",
        choices=["auto", "fp32", "fp32,bf16"],
        default="auto",
        help="auto: bf16 rows only where the CPU has bf16 matmul units",
    )
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile rows")
    parser.add_argument("--runs", type=int, default=8, help="timed runs per variant (medians; >= 5)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs per variant first")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--large-batch", type=int, default=None, help="batch of the large config (default 4)")
    parser.add_argument("--mem-steps", type=int, default=3, help="training steps in each memory subprocess")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory subprocesses")
    parser.add_argument("--memory-only", action="store_true", help="only the memory subprocesses (no timing)")
    parser.add_argument("--profile", action="store_true", help="also profile a training step (reference config)")
    parser.add_argument("--profile-steps", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/model.json")
    parser.add_argument("--memory-child", choices=list(VARIANTS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    # compile from scratch every time, so the compiled rows' first step is the compilation a user's first run pays
    torch._inductor.config.fx_graph_cache = False
    torch._functorch.config.enable_autograd_cache = False
    if args.memory_child:
        return memory_child(args)
    if args.runs < 5:
        parser.error("--runs must be >= 5")
    configs = ["reference", "small", "large"] if "all" in args.config else args.config
    names, skipped = variant_names(args)
    for reason in skipped.values():
        print(f"skipped: {reason}")
    if args.memory_only:
        result = {name: measure_memory(args, name, names) for name in configs}
        for name, mem in result.items():
            base = mem[BASELINE].get("peak_delta")
            for n, m in mem.items():
                if "peak_delta" in m:
                    print(
                        f"{name} {n:<16} peak {m['peak_delta'] / 2**20:7.0f} MB  "
                        f"x{m['peak_delta'] / base:5.2f} vs hf_fp32"
                    )
                else:
                    print(f"{name} {n}: {m.get('error')}")
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(
            json.dumps(dict(command=" ".join([Path(sys.executable).name] + sys.argv), memory=result), indent=1)
        )
        return None

    result = dict(
        command=" ".join([Path(sys.executable).name] + sys.argv),
        machine=machine(),
        threads=args.threads,
        runs=args.runs,
        warmup=args.warmup,
        skipped=skipped,
    )
    if "bf16" in skipped:  # what the bf16 rows would be measured against
        result["bf16_matmul_peak_flops_512"] = bf16_peak()
        print(
            f"bf16 matmul peak here (512^3, emulated): {median(result['bf16_matmul_peak_flops_512']) / 1e9:.2f} GFLOP/s"
        )
    result["configs"] = {}
    for name in configs:
        result["configs"][name] = run_config(args, name, names)
    if args.profile:
        result["profile"] = profile_steps(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
