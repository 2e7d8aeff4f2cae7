"""Each fused attention kernel (xlnet_lite.triton_attention) timed alone, one `base` layer's content stream forward
and backward (bench_triton_attention's inputs), at each launch setting and with each term of the scores changed:
where the kernels' time goes and which setting suits each kernel.

    python -m benchmarks.bench_triton_kernels [--shape base] [--runs 10] [--warmup 2] [--settings 64x32/4/3 ...]
                                              [--variants dkr_atomic matmul block dense nomask noseg dropout]
                                              [--out benchmarks/results/gpu/triton_kernels.json]

Every launch of the four kernels (forward; the backward's dk/dv, dq and dkr) is timed by CUDA events around it,
the steps queued without a wait between them (on a CPU by the clock, in Triton's interpreter: TRITON_INTERPRET=1
and --shape tiny, to check the script); a kernel's time is the median over --runs steps after --warmup of its
launches' sum in a step, and a row's total the sum of those medians; its step the median of the whole forward
and backward (events around it: the launches, the work between and around them). Rows, in this order (each written
to --out as it ends, so a run stopped by a time limit keeps the rows before):

- "default": every kernel at the library's settings (LAUNCH), the mask as ranks (as the model gives factorization
  masks), dropout 0;
- "dkr_atomic" (of --variants): dkr added up in dq by atomic adds (dkr's setting None: no dkr kernel);
- "matmul" (of --variants): the positional term as one matmul's product read shifted (triton_attention.POSITIONAL
  "matmul": the dense form's kernels, no dkr kernel; the matmuls are in the step's time, no kernel's);
- each --settings ROWSxKEYS/WARPS/STAGES[/atomic|/matmul] other than the defaults, every kernel at it (each timed
  alone, so one row gives each kernel's time at the setting; dkr's tile is KEYS distances; with KEYS = 2 ROWS, dk/dv
  at ROWS rows by KEYS keys, held keys by rows, the forward and dq at KEYS rows by ROWS keys, dkr at ROWS; /atomic:
  no dkr kernel, dq adding dkr up, so compare its total; /matmul: the positional term by one matmul, so compare its
  step, and ROWS and KEYS any powers of two, more keys than rows read as KEYS = 2 ROWS; "fastest" leaves both out);
  a setting the device cannot compile or launch, such as one past its shared memory, is named with its error in the
  JSON's "refused". The default list, in order of promise (benchmarks/RESULTS.md, GPU): the positional term by one
  matmul at the tiles with the fewest instructions a block of scores (64 x 64 at 4 warps, 128 x 64 at 8), then
  tiles of 16 rows a warp, each warp whole rows of the scores (64 rows by 32 keys at 4 warps: on an H100 warpgroup
  MMA), then the square tiles around the default;
- the other --variants at the defaults, where the time goes: the mask as the (B, Q, K) block (as a compiled model
  passes it), the positional term dense (the (B, N, Q, K) shifted scores made contiguous by the caller and read, as
  the query stream's, instead of the band computed inside), no mask, no segments, dropout 0.1.

"fastest" gives each kernel's fastest setting. The check: each setting's output and input gradients against the
default row's (a setting changes only the order of sums), and the block's, the dense term's, the matmul's and the
atomic dkr's against it too (the same scores); the other variants compute other scores (None). Not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time

import torch

from benchmarks.bench_triton_attention import GRADS, SHAPES, make_inputs
from benchmarks.environment import environment
from xlnet_lite.modeling_xlnet_lite import positional_term
from xlnet_lite.training import write_json

KERNELS = {"_attn_fwd": "forward", "_attn_bwd_dkdv": "dk_dv", "_attn_bwd_dq": "dq", "_attn_bwd_dkr": "dkr"}
VARIANTS = ("dkr_atomic", "matmul", "block", "dense", "nomask", "noseg", "dropout")
SETTINGS = (
    "64x64/4/3/matmul",
    "128x64/8/3/matmul",
    "32x64/4/3/matmul",
    "64x32/4/3",
    "64x32/4/3/atomic",
    "32x64/4/3",
    "64x32/4/2",
    "32x32/4/2",
    "64x64/4/2",
    "128x64/8/2",
    "32x16/2/3",
    "32x32/4/1",
    "32x32/8/3",
)


def parse_setting(text):
    """ROWSxKEYS/WARPS/STAGES[/atomic|/matmul] -> {kernel: triton_attention.Launch or None}: the forward, dk/dv and dq
    at tiles of ROWS rows by KEYS keys (KEYS = ROWS or ROWS / 2), dkr at KEYS distances a tile, or with /atomic None
    (no dkr kernel: dq adds dkr up); KEYS = 2 ROWS: dk/dv at ROWS rows by KEYS keys (held keys by rows), the forward
    and dq at KEYS rows by ROWS keys, dkr at ROWS (FlashAttention 2's arrangement). /matmul, the positional term's
    form (POSITIONAL "matmul", no dkr kernel), is not a launch setting, but its dense-form kernels take any ROWS and
    KEYS powers of two: KEYS more than ROWS as KEYS = 2 ROWS is read (dk/dv held keys by rows, the forward and dq at
    KEYS rows by ROWS keys), else every kernel at ROWS by KEYS. ValueError if the text is not of that form."""
    from xlnet_lite import triton_attention as ta

    try:
        tile, warps, stages, *flag = text.split("/")
        rows, keys = (int(n) for n in tile.split("x"))
        warps, stages = int(warps), int(stages)
        if flag not in ([], ["atomic"], ["matmul"]):
            raise ValueError
    except ValueError:
        raise ValueError(f"{text!r} is not ROWSxKEYS/WARPS/STAGES[/atomic|/matmul] (e.g. 64x32/4/3)") from None
    atomic, dense = flag == ["atomic"], flag == ["matmul"]
    if min(rows, keys) < 16 or keys & (keys - 1) or rows & (rows - 1):
        raise ValueError(f"{text!r}: ROWS and KEYS powers of two of at least 16 (tl.dot's smallest)")
    if rows not in (keys, 2 * keys, keys // 2) and not dense:
        raise ValueError(f"{text!r}: ROWS KEYS, twice or half it (any powers of two with /matmul)")
    if warps < 1 or warps & (warps - 1) or stages < 1:
        raise ValueError(f"{text!r}: WARPS a power of two, STAGES at least 1")
    if keys > rows:
        tall = ta.Launch(keys, warps, stages, rows)
        settings = dict(forward=tall, dk_dv=ta.Launch(rows, warps, stages, keys), dq=tall)
        return {**settings, "dkr": None if atomic else ta.Launch(rows, warps, stages)}
    half = None if keys == rows else keys
    settings = {k: ta.Launch(rows, warps, stages, half) for k in ta.KERNELS}
    return {**settings, "dkr": None if atomic else ta.Launch(keys, warps, stages)}


@contextlib.contextmanager
def kernels_replaced(wrap):
    """The module's kernels replaced by wrap(kernel, name) for the block (name: forward, dk_dv, dq, dkr), put
    back after it."""
    from xlnet_lite import triton_attention as ta

    saved = {attr: getattr(ta, attr) for attr in KERNELS}
    try:
        for attr, name in KERNELS.items():
            setattr(ta, attr, wrap(saved[attr], name))
        yield
    finally:
        for attr, kernel in saved.items():
            setattr(ta, attr, kernel)


@contextlib.contextmanager
def positional_changed(form):
    """triton_attention.POSITIONAL at `form` ("band" or "matmul") everywhere for the block, put back after it."""
    from xlnet_lite import triton_attention as ta

    saved = dict(ta.POSITIONAL)
    try:
        ta.POSITIONAL.update(dict.fromkeys(saved, form))
        yield
    finally:
        ta.POSITIONAL.update(saved)


@contextlib.contextmanager
def launch_settings_changed(table, changes):
    """A table of triton_attention.LAUNCH (launch_settings(device, dtype)) with {kernel: Launch} changed for the
    block, put back after it."""
    saved = dict(table)
    try:
        table.update(changes)
        yield
    finally:
        table.clear()
        table.update(saved)


def mark(cuda):
    """A moment of the GPU's stream (a recorded CUDA event) or, in the interpreter, of the clock."""
    if not cuda:
        return time.perf_counter()
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def elapsed(start, end, cuda):
    """Seconds between two marks (the events complete)."""
    return start.elapsed_time(end) / 1000 if cuda else end - start


class Timed:
    """A kernel whose launches are timed into the last log of `logs` (one a step) as (name, start, end): CUDA events
    on a GPU, the clock in the interpreter."""

    def __init__(self, kernel, name, logs, cuda):
        self.kernel, self.name, self.logs, self.cuda = kernel, name, logs, cuda

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            start = mark(self.cuda)
            self.kernel[grid](*args, **kwargs)
            self.logs[-1].append((self.name, start, mark(self.cuda)))

        return launch


def kernel_seconds(log, cuda):
    """{kernel: seconds} summed over the launches logged (their events complete)."""
    seconds = dict.fromkeys(KERNELS.values(), 0.0)
    for name, start, end in log:
        seconds[name] += elapsed(start, end, cuda)
    return seconds


def attention(x, variant):
    """One forward of the content stream's attention with the variant's change, on bench_triton_attention's
    inputs."""
    from xlnet_lite.triton_attention import relative_attention

    positional = dict(qr=x["qr"], kr=x["kr"])
    if variant == "dense":
        positional = dict(pos=positional_term(x["qr"], x["kr"], qlen=x["Q"], klen=x["K"], query_pos=None))
    segments = (
        {}
        if variant == "noseg"
        else dict(gain=x["gain"], seg_q=x["seg_q"], seg_k=x["seg_k"], seg_classes=x["seg_classes"])
    )
    return relative_attention(
        x["qw"],
        x["k"],
        x["v"],
        **positional,
        **segments,
        blocked=None if variant == "nomask" else x["blocked"],
        forms=None if variant == "block" else x["forms"],  # the ranks the model finds, or the block
        dropout_p=0.1 if variant == "dropout" else 0.0,
        qlen=x["Q"],
    )


def run(x, variant, runs, warmup, cuda):
    """(median seconds of each kernel over `runs` steps after `warmup`, the median seconds of a whole step, the first
    step's output and gradients). The steps are queued back to back and their events read after the last, so no
    launch waits on the CPU."""
    logs, steps, first = [], [], None
    form = "matmul" if variant == "matmul" else "band"
    with kernels_replaced(lambda kernel, name: Timed(kernel, name, logs, cuda)), positional_changed(form):
        for _ in range(warmup + runs):
            for name in GRADS:
                x[name].grad = None
            logs.append([])
            start = mark(cuda)
            out = attention(x, variant)
            out.backward(x["grad"])
            steps.append((start, mark(cuda)))
            if first is None:
                grads = [x[k].grad.detach().float().clone() for k in GRADS if x[k].grad is not None]
                first = (out.detach().float(), grads)
    if cuda:
        torch.cuda.synchronize()
    times = [kernel_seconds(log, cuda) for log in logs[warmup:]]
    step = [elapsed(start, end, cuda) for start, end in steps[warmup:]]
    return {k: statistics.median(t[k] for t in times) for k in KERNELS.values()}, statistics.median(step), first


def largest_difference(a, b):
    """The largest |a - b| over an output and its gradients (NaN if any is NaN)."""
    (out_a, grads_a), (out_b, grads_b) = a, b
    diffs = [(out_a - out_b).abs().max()] + [(g - h).abs().max() for g, h in zip(grads_a, grads_b)]
    worst = torch.stack(diffs)
    return float("nan") if worst.isnan().any() else worst.max().item()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=list(SHAPES), default="base")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--settings",
        nargs="*",
        default=list(SETTINGS),
        help="launch settings ROWSxKEYS/WARPS/STAGES[/atomic|/matmul] (KEYS = ROWS, ROWS / 2 or 2 ROWS; /atomic: dq "
        "adds dkr up; /matmul: the positional term by one matmul), each a row with every kernel at it",
    )
    parser.add_argument("--variants", nargs="*", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--out", default="benchmarks/results/gpu/triton_kernels.json")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and args.shape != "tiny":
        parser.error("without CUDA only --shape tiny runs (in Triton's interpreter, to check the script)")
    if args.runs < 1 or args.warmup < 0:
        parser.error("--runs must be at least 1 and --warmup at least 0")
    try:
        settings = {text: parse_setting(text) for text in args.settings}
    except ValueError as error:
        parser.error(f"--settings: {error}")
    from xlnet_lite import triton_attention as ta

    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    table = ta.launch_settings(device, dtype)
    defaults = dict(table)
    x = make_inputs(SHAPES[args.shape], device, dtype)
    rows, refused = [], {}
    command = "python -m benchmarks.bench_triton_kernels " + " ".join(sys.argv[1:] if argv is None else argv)
    machine = environment()

    def save(fastest=None):  # after every row: a run stopped by a time limit keeps the rows it finished
        write_json(
            args.out,
            dict(
                command=command,
                environment=machine,
                shape=SHAPES[args.shape],
                dtype=str(dtype),
                defaults={k: s and s._asdict() for k, s in defaults.items()},
                rows=rows,
                refused=refused,
                fastest=fastest,
            ),
        )

    reference = None  # the default row's output and gradients

    def measure(label, variant, changes=None):
        nonlocal reference
        changes = dict(changes or {})
        if variant == "dkr_atomic":
            changes["dkr"] = None  # no dkr kernel: dq adds dkr up
        try:
            with launch_settings_changed(table, changes):
                seconds, step, result = run(x, variant, args.runs, args.warmup, cuda)
        except Exception as error:  # a setting past the device (shared memory, registers) or its compiler
            refused[label] = f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}"
            print(f"{label:<28} refused: {refused[label]}", flush=True)
            save()
            return
        if label == "default":
            reference = result
        same_scores = variant in ("ranks", "block", "dense", "matmul", "dkr_atomic") and reference is not None
        row = dict(
            label=label,
            variant=variant,
            settings={k: s and s._asdict() for k, s in {**defaults, **changes}.items()},
            median_s=seconds,
            total_s=sum(seconds.values()),
            step_s=step,
            max_abs_diff_vs_default=largest_difference(result, reference) if same_scores else None,
        )
        rows.append(row)
        timed = "  ".join(f"{k} {1000 * s:7.3f}" for k, s in seconds.items())
        diff = "-" if row["max_abs_diff_vs_default"] is None else f"{row['max_abs_diff_vs_default']:.1e}"
        print(
            f"{label:<28} ms: {timed}  total {1000 * row['total_s']:8.3f}  step {1000 * step:8.3f}  diff {diff}",
            flush=True,
        )
        save()

    measure("default", "ranks")
    for variant in ("dkr_atomic", "matmul"):  # the alternatives to the defaults' dkr kernel first
        if variant in args.variants:
            measure(variant, variant)
    for text, setting in settings.items():
        rows_keys, warps, stages, *flag = text.split("/")
        if setting != defaults or flag == ["matmul"]:
            label = f"tile{rows_keys}_warps{warps}_stages{stages}" + "".join(f"_{f}" for f in flag)
            measure(label, {"atomic": "dkr_atomic", "matmul": "matmul"}[flag[0]] if flag else "ranks", setting)
    for variant in args.variants:
        if variant not in ("dkr_atomic", "matmul"):
            measure(variant, variant)
    fastest = {}
    timed = [r for r in rows if r["variant"] == "ranks"]
    for kernel in defaults if timed else ():
        best = min(timed, key=lambda r: r["median_s"][kernel])
        fastest[kernel] = dict(setting=best["settings"][kernel], median_s=best["median_s"][kernel])
        default = next((r["median_s"][kernel] for r in timed if r["label"] == "default"), None)
        print(
            f"{kernel:<6} fastest at {best['settings'][kernel]}: {1000 * best['median_s'][kernel]:.3f} ms"
            + ("" if default is None else f" (default {1000 * default:.3f})")
        )
    save(fastest)


if __name__ == "__main__":
    main()
