"""The training core of both recipes (pretrain/run_pretraining.py and finetune/run_glue.py).

A recipe declares its flags as a dataclass deriving from `RecipeArguments`, builds its data and model, and
hands each optimizer step's losses to `TrainLoop.step`. Everything a user relies on lives here, once:

- flags: transformers' `HfArgumentParser` (help, default and choices of every flag; `--flag`, `--flag true|false`
  and `--no_flag` for booleans), plus `--config FILE.yaml|json` whose values the command line overrides;
- the output folder: a folder holding another run is refused unless `--overwrite_output_dir` (which clears that
  run's outputs) or `--resume_from_checkpoint`; a resume is checked against the checkpoint (flags, model shape,
  vocabulary, task, processes) before any expensive work, and the message names what differs;
- checkpoints: `accelerator.save_state` plus the recipe's per-rank state, written under a temporary name, fsynced and
  renamed (a kill never leaves a checkpoint that looks complete), rotated to `--save_total_limit`; `latest` means the
  newest complete checkpoint, or a fresh start when there is none yet;
- every other output (metrics, results, the final model) written atomically with the mode a plain `open()` gives;
- one optimizer-parameter-group rule, one warmup rule, SIGTERM/SIGINT save-and-exit agreed across ranks
  (`set_trigger` / `check_trigger`), a non-finite-loss guard agreed across ranks, one `--push_to_hub` path,
  `--torch_compile`.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import dataclasses
import errno
import json
import logging
import math
import os
import re
import shutil
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import HfArgumentParser, get_scheduler
from transformers.trainer_pt_utils import get_parameter_names

from .errors import RecipeError
from .integrity import MANIFEST, OutputLock, SaveError, folder_size, save_error, verify_checkpoint, write_manifest
from .precision import PRECISIONS, cpu_bf16_units, launch_device_type, resolve_precision

# ---------------------------------------------------------------------------------------------------------
# Flags

# transformers schedules that need nothing but warmup and total steps.
SCHEDULES = [
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
]


@dataclass
class RecipeArguments:
    """Flags shared by both recipes; each recipe derives from this and may change the defaults."""

    output_dir: str = field(
        default="outputs", metadata={"help": "Where the model, metrics, results and checkpoints/ go."}
    )
    overwrite_output_dir: bool = field(
        default=False, metadata={"help": "Replace the outputs of another run in --output_dir."}
    )
    resume_from_checkpoint: str | None = field(
        default=None,
        metadata={
            "help": "'latest' (the newest complete checkpoint in output_dir/checkpoints; a fresh start if there is none "
            "yet) or a checkpoint folder."
        },
    )
    seed: int = field(default=42, metadata={"help": "Seed of initialisation, data order, targets and dropout."})
    per_device_train_batch_size: int = field(default=16, metadata={"help": "Training batch size per process."})
    per_device_eval_batch_size: int = field(default=16, metadata={"help": "Evaluation batch size per process."})
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "Batches per optimizer step."})
    learning_rate: float = field(default=5e-5, metadata={"help": "Peak learning rate."})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay (never on biases and LayerNorm)."})
    adam_epsilon: float = field(default=1e-8, metadata={"help": "AdamW epsilon."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping norm (0: off)."})
    lr_scheduler_type: str = field(
        default="linear", metadata={"help": "transformers learning-rate schedule.", "choices": SCHEDULES}
    )
    num_warmup_steps: int = field(default=0, metadata={"help": "Linear warmup steps (or use --warmup_ratio)."})
    warmup_ratio: float = field(
        default=0.0, metadata={"help": "Warmup as a fraction of the run's steps (overrides --num_warmup_steps)."}
    )
    mixed_precision: str = field(
        default="auto",
        metadata={
            "help": "auto: bf16 where the CPU has AMX or AVX512-BF16 or the GPU supports bf16, fp32 elsewhere; a precision "
            "given to `accelerate launch` (--mixed_precision or its config) is used instead. no, bf16 or fp16 here "
            "win over both.",
            "choices": list(PRECISIONS),
        },
    )
    torch_compile: bool = field(
        default=False,
        metadata={
            "help": "Compile the model with torch.compile (inductor): the first steps take about a minute more, the rest "
            "run faster (benchmarks/RESULTS.md, model speed)."
        },
    )
    skip_nonfinite: bool = field(
        default=False, metadata={"help": "Skip optimizer steps whose loss is NaN/inf (default: stop)."}
    )
    logging_steps: int = field(default=10, metadata={"help": "Write a metrics.jsonl record every N optimizer steps."})
    checkpointing_steps: int = field(
        default=500,
        metadata={"help": "Save a checkpoint every N optimizer steps (0: only on signals and at epoch ends)."},
    )
    save_total_limit: int = field(default=2, metadata={"help": "Keep at most this many checkpoints (the newest)."})
    with_tracking: bool = field(default=False, metadata={"help": "Also log to the trackers of --report_to."})
    report_to: str = field(
        default="tensorboard", metadata={"help": "accelerate tracker(s): tensorboard, wandb, ... or all."}
    )
    push_to_hub: bool = field(
        default=False, metadata={"help": "Upload the final outputs (not the checkpoints) to the Hub."}
    )
    hub_model_id: str | None = field(
        default=None, metadata={"help": "Hub repo id (default: the name of --output_dir)."}
    )
    hub_token: str | None = field(default=None, metadata={"help": "Hub token (default: the logged-in one)."})

    # Flags that must be equal to resume a run (a recipe lists its own; these are the core's).
    RESUME_MUST_MATCH = ("seed", "per_device_train_batch_size", "gradient_accumulation_steps")
    # True in a recipe whose training batches all have one shape: --torch_compile then builds static graphs
    # (dynamic=False), faster than the dynamic-shape graph torch.compile switches to once a second shape (a memory)
    # appears. False (batches padded to their longest example): torch.compile decides.
    STATIC_SHAPES = False
    # Flags that never make a run different (where it is, how it reports).
    NOT_PART_OF_THE_RUN = (
        "output_dir",
        "overwrite_output_dir",
        "resume_from_checkpoint",
        "logging_steps",
        "checkpointing_steps",
        "save_total_limit",
        "with_tracking",
        "report_to",
        "push_to_hub",
        "hub_model_id",
        "hub_token",
        "torch_compile",
    )


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Every flag's default in --help, and the recipe's docstring as written."""


def parse_args(cls, argv=None, *, description=None):
    """`cls` from the command line (a list of strings, default sys.argv) over an optional `--config` file over
    the dataclass defaults. An instance of `cls` is returned as it is."""
    if isinstance(argv, cls):
        return argv
    parser = HfArgumentParser(cls, description=description or cls.__doc__, formatter_class=_HelpFormatter)
    for action in parser._actions:
        if action.nargs == "?" and action.const is True:  # booleans: --flag, --flag true|false (and --no_flag)
            action.metavar = "true|false"
    parser.add_argument(
        "--config", default=None, help="YAML or JSON file of flag values; command-line flags override it."
    )
    known, _ = parser.parse_known_args(argv)
    if known.config:
        parser.set_defaults(**read_config_file(known.config, cls))
    namespace = parser.parse_args(argv)  # an unknown flag or a bad value: argparse's one-line error, exit status 2
    return cls(**{f.name: getattr(namespace, f.name) for f in dataclasses.fields(cls) if f.init})


def read_config_file(path, cls):
    path = Path(path)
    if not path.is_file():
        raise RecipeError(f"--config: no such file {path}")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            values = yaml.safe_load(text) or {}
        else:
            values = json.loads(text)
    except Exception as error:  # noqa: BLE001 - any parse error becomes one line naming the file
        raise RecipeError(
            f"--config {path}: not valid {'YAML' if path.suffix in ('.yaml', '.yml') else 'JSON'} ({error})"
        )
    if not isinstance(values, dict):
        raise RecipeError(f"--config {path}: expected a mapping of flag names to values")
    unknown = sorted(set(values) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise RecipeError(f"--config {path}: unknown keys {unknown}; the keys are the flag names without '--'")
    return values


def check_common_args(a: RecipeArguments):
    """The core's flag checks: a list of problems (empty when all is well)."""
    problems = []
    for name in (
        "per_device_train_batch_size",
        "per_device_eval_batch_size",
        "gradient_accumulation_steps",
        "logging_steps",
        "save_total_limit",
    ):
        if getattr(a, name) < 1:
            problems.append(f"--{name} must be >= 1, got {getattr(a, name)}")
    if a.learning_rate <= 0:
        problems.append(f"--learning_rate must be > 0, got {a.learning_rate}")
    if a.num_warmup_steps < 0 or a.checkpointing_steps < 0 or a.max_grad_norm < 0 or a.weight_decay < 0:
        problems.append("--num_warmup_steps, --checkpointing_steps, --max_grad_norm and --weight_decay must be >= 0")
    if not 0 <= a.warmup_ratio < 1:
        problems.append(f"--warmup_ratio must be in [0, 1), got {a.warmup_ratio}")
    if a.resume_from_checkpoint not in (None, "", "latest") and not Path(a.resume_from_checkpoint).is_dir():
        problems.append(f"--resume_from_checkpoint: no such folder {a.resume_from_checkpoint} (or pass 'latest')")
    return problems


def raise_problems(problems):
    if problems:
        raise RecipeError("invalid arguments: " + "; ".join(problems))


def warmup_steps(a: RecipeArguments, max_steps: int) -> int:
    """--warmup_ratio of the run, else --num_warmup_steps; a warmup longer than the run is refused."""
    steps = math.ceil(a.warmup_ratio * max_steps) if a.warmup_ratio else a.num_warmup_steps
    if steps > max_steps:
        raise RecipeError(
            f"--num_warmup_steps ({steps}) is longer than the run ({max_steps} optimizer steps): the learning rate "
            f"would never reach --learning_rate; lower it or pass --warmup_ratio (e.g. 0.1)"
        )
    return steps


def run_flags(a: RecipeArguments) -> dict:
    """The flags that define the run (saved with it, compared on resume)."""
    return {k: v for k, v in dataclasses.asdict(a).items() if k not in a.NOT_PART_OF_THE_RUN}


# ---------------------------------------------------------------------------------------------------------
# Files: atomic writes with the mode a plain open() gives


CRASH_ENV = "XLNET_LITE_CRASH_AT"
DISK_FULL_ENV = "XLNET_LITE_DISK_FULL_AT"
_crash_counts: dict[tuple[str, str], int] = {}


def crash_point(name: str):
    """A named moment of a run where the kill tests stop it. With XLNET_LITE_CRASH_AT=name or name@n in the
    environment the process SIGKILLs itself the n-th time (default: the first) it passes `name`; with
    XLNET_LITE_DISK_FULL_AT=name or name@n it raises OSError(ENOSPC) there instead, as a full disk would; otherwise
    nothing."""
    for env in (CRASH_ENV, DISK_FULL_ENV):
        spec = os.environ.get(env)
        if not spec or spec.partition("@")[0] != name:
            continue
        key = (env, name)
        _crash_counts[key] = _crash_counts.get(key, 0) + 1
        if _crash_counts[key] != int(spec.partition("@")[2] or 1):
            continue
        if env == CRASH_ENV:
            os.kill(os.getpid(), signal.SIGKILL)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), name)


def default_file_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path, text: str):
    """Write under a temporary name, fsync, rename: readers see the old file or the new one, never a part."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    crash_point(f"write:{path.name}")
    os.replace(tmp, path)
    fsync_path(path.parent)


def write_json(path, obj):
    atomic_write_text(path, json.dumps(obj, indent=2) + "\n")


def replace_folder(tmp: Path, final: Path):
    """Make the folder `tmp` appear as `final` in one rename, after fsyncing its files: a kill leaves either no
    `final` or a complete one."""
    mode = default_file_mode()
    for file in tmp.rglob("*"):
        if file.is_file():
            os.chmod(file, mode)
            fsync_path(file)
    fsync_path(tmp)
    crash_point(f"replace:{final.name}")
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    fsync_path(final.parent)


def publish_folder(tmp: Path, directory: Path):
    """Move every file of `tmp` into `directory`, each fsynced, given the default mode and renamed into place
    (transformers writes model.safetensors through a 0600 temporary file); then remove `tmp`."""
    mode = default_file_mode()
    for file in sorted(tmp.rglob("*")):
        if not file.is_file():
            continue
        target = directory / file.relative_to(tmp)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(file, mode)
        fsync_path(file)
        os.replace(file, target)
        crash_point("publish")
    fsync_path(directory)
    shutil.rmtree(tmp, ignore_errors=True)


def agree_on_failure(accelerator, failure: SaveError | None, others: str, *, cleanup: Callable | None = None):
    """Every process learns whether a write failed on any of them. If one did, the main process runs `cleanup`
    (removing the partial files) and all raise SaveError (the failing one with its own message, the others with
    `others`); otherwise all go on, each having finished its writes."""
    failed = failure is not None
    if accelerator.num_processes > 1:  # the all-reduce is also the barrier: every process has finished its writes
        failed = bool(accelerator.reduce(torch.tensor([float(failed)], device=accelerator.device), "sum").item() > 0)
    if not failed:
        return
    if cleanup is not None and accelerator.is_main_process:
        cleanup()
    raise failure or SaveError(others)


def save_final_model(accelerator, model, tokenizer, output_dir, *, config_updates=None):
    """save_pretrained of the unwrapped model and the tokenizer into output_dir, file by file atomically.
    `config_updates` are set on the saved config only (training-only fields back to their inference values)."""
    accelerator.wait_for_everyone()
    failure = None
    if accelerator.is_main_process:
        model = accelerator.unwrap_model(model)
        config_updates = config_updates or {}
        before = {k: getattr(model.config, k) for k in config_updates}
        tmp = Path(output_dir, ".final.tmp")
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            try:
                for key, value in config_updates.items():
                    setattr(model.config, key, value)
                model.save_pretrained(tmp, safe_serialization=True)
            finally:
                for key, value in before.items():
                    setattr(model.config, key, value)
            tokenizer.save_pretrained(tmp)
            crash_point("final_model_written")
        except Exception as error:  # noqa: BLE001 (a full disk: OSError, RuntimeError, SafetensorError); nothing reached output_dir
            needed = sum(t.numel() * t.element_size() for t in model.state_dict().values())
            shutil.rmtree(tmp, ignore_errors=True)
            failure = save_error(output_dir, error, needed_bytes=needed, what="the final model")
        else:
            publish_folder(tmp, Path(output_dir))
    agree_on_failure(
        accelerator,
        failure,
        "the final model could not be saved (the error is on the main process)",
        cleanup=lambda: shutil.rmtree(Path(output_dir, ".final.tmp"), ignore_errors=True),
    )


# ---------------------------------------------------------------------------------------------------------
# The output folder: fresh, overwrite or resume


RUN_FILE = "run_args.json"  # written first: the flags of the run this folder holds


def start_run(a: RecipeArguments, accelerator, checkpoints: Checkpoints, *, outputs: Iterable[str]) -> Path | None:
    """Decide, before any expensive work, whether this run starts fresh or resumes, and never touch another
    run's outputs unasked. Returns the checkpoint to resume from, or None. `outputs` are the names this recipe
    writes into output_dir (removed by --overwrite_output_dir)."""
    out = Path(a.output_dir)
    ours = [RUN_FILE, "checkpoints", *outputs]
    held = sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) if out.is_dir() else []
    trained = [name for name in held if name not in (RUN_FILE, "tokenizer")]  # a run that never trained left only these
    checkpoint = checkpoints.resolve(a.resume_from_checkpoint)
    previous = _read_json(out / RUN_FILE)
    same_run = previous is not None and not flag_differences(a, previous)
    if checkpoint is not None:
        check_resume(a, checkpoint)
    elif a.overwrite_output_dir or (held and not trained and not same_run):
        if trained:
            accelerator.print(f"--overwrite_output_dir: removing the previous run's outputs in {out}")
        if accelerator.is_main_process:
            for name in ours:
                path = out / name
                shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    elif trained and not (a.resume_from_checkpoint == "latest" and same_run):
        listed = ", ".join(trained[:6]) + (", ..." if len(trained) > 6 else "")
        raise RecipeError(
            f"--output_dir {out} already holds the outputs of another run ({listed}); pass --overwrite_output_dir "
            f"to replace them, --resume_from_checkpoint latest to continue that run, or another --output_dir"
        )
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / RUN_FILE, run_flags(a))
    accelerator.wait_for_everyone()
    return checkpoint


def _read_json(path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def flag_differences(a: RecipeArguments, saved_flags: dict) -> list[str]:
    keys = a.RESUME_MUST_MATCH
    return [
        f"--{k}: {saved_flags.get(k)!r} in the checkpoint, {getattr(a, k)!r} now"
        for k in keys
        if k in saved_flags and saved_flags[k] != getattr(a, k)
    ]


def check_resume(a: RecipeArguments, checkpoint: Path):
    """Refuse a resume whose flags change the model, data or task (`RESUME_MUST_MATCH`), naming each difference."""
    state = _read_json(checkpoint / "trainer_state.json") or {}
    saved = state.get("flags", {})
    differences = flag_differences(a, saved)
    if differences:
        raise RecipeError(
            f"cannot resume from {checkpoint}: "
            + "; ".join(differences)
            + " (pass --overwrite_output_dir to start a new run instead)"
        )


def check_resume_model(checkpoint: Path, model_fields: dict, *, num_processes: int):
    """After the model is built (before tokenizing the data): its shape, vocabulary and task must be the
    checkpoint's, and so must the number of processes (each rank's data position is saved)."""
    state = _read_json(checkpoint / "trainer_state.json") or {}
    saved = state.get("model", {})
    differences = [
        f"{k}: {saved[k]!r} in the checkpoint, {v!r} now"
        for k, v in model_fields.items()
        if k in saved and saved[k] != v
    ]
    if state.get("num_processes", num_processes) != num_processes:
        differences.append(f"processes: {state['num_processes']} in the checkpoint, {num_processes} now")
    if differences:
        raise RecipeError(f"cannot resume from {checkpoint}: " + "; ".join(differences))


def model_fields(model) -> dict:
    """What a checkpoint must agree on: the architecture, the vocabulary and the task."""
    config = model.config
    keys = (
        "vocab_size",
        "d_model",
        "n_layer",
        "n_head",
        "d_inner",
        "untie_r",
        "attn_type",
        "num_labels",
        "problem_type",
    )
    fields = {k: getattr(config, k, None) for k in keys}
    if getattr(config, "id2label", None) and type(model).__name__.endswith("Classification"):
        fields["labels"] = [config.id2label[i] for i in sorted(config.id2label)]
    return fields


def set_up_run(cls, argv, *, check, outputs, description=None):
    """The start of every recipe: parse and `check` the flags, make the accelerator, decide fresh start or resume
    (`start_run`) and seed everything. Returns (args, accelerator, checkpoints, checkpoint to resume or None)."""
    from accelerate.utils import set_seed

    a = parse_args(cls, argv, description=description)
    check(a)
    release_output_lock()  # of a run that ended before, in this process
    _MULTI_PROCESS_RUN.clear()
    accelerator = make_accelerator(a)
    take_output_lock(a.output_dir, accelerator)
    checkpoints = Checkpoints(accelerator, a.output_dir, a.save_total_limit)
    resume = start_run(a, accelerator, checkpoints, outputs=outputs)
    set_seed(a.seed)
    return a, accelerator, checkpoints, resume


_OUTPUT_LOCK: list[OutputLock] = []  # the lock this process holds on its run's output_dir


def take_output_lock(output_dir, accelerator):
    """The main process locks output_dir (one run per folder) before any work; a refusal (the lock is held by a
    live run) reaches every process, and all stop with one line naming the holder."""
    refusal, warning = None, None
    if accelerator.is_main_process:
        lock = OutputLock(output_dir)
        try:
            warning = lock.acquire()
            _OUTPUT_LOCK[:] = [lock]
        except RecipeError as error:
            refusal = str(error)
    if accelerator.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        refusal = broadcast_object_list([refusal])[0]
    if refusal:
        raise RecipeError(refusal)
    if warning:
        accelerator.print(f"warning: {warning}")


def release_output_lock():
    while _OUTPUT_LOCK:
        _OUTPUT_LOCK.pop().release()


atexit.register(release_output_lock)


def end_run(accelerator):
    """The end of a recipe's run: trackers finished, the process group destroyed, output_dir unlocked."""
    accelerator.end_training()
    release_output_lock()


# ---------------------------------------------------------------------------------------------------------
# Checkpoints


class Checkpoints:
    """output_dir/checkpoints/step_N: accelerate's state (model, optimizer, scheduler, RNGs), the trainer state
    (main process) and each rank's data state (JSON) and tensors (safetensors, e.g. the memory)."""

    def __init__(self, accelerator, output_dir, save_total_limit):
        self.accelerator, self.root, self.limit = accelerator, Path(output_dir, "checkpoints"), save_total_limit

    def complete(self) -> list[Path]:
        """Completed checkpoints, oldest first (a checkpoint is renamed into place only once complete)."""
        if not self.root.is_dir():
            return []
        found = [
            p for p in self.root.iterdir() if re.fullmatch(r"step_\d+", p.name) and (p / "trainer_state.json").is_file()
        ]
        return sorted(found, key=lambda p: int(p.name[5:]))

    def resolve(self, resume_from_checkpoint) -> Path | None:
        """The checkpoint to resume from: `latest` is the newest one that verifies (each damaged one skipped with a
        line naming it, and left in place); a checkpoint named explicitly must verify."""
        if not resume_from_checkpoint:
            return None
        if resume_from_checkpoint == "latest":
            for path in reversed(self.complete()):
                problem = self._verify(path)
                if problem is None:
                    return path
                self.accelerator.print(f"warning: checkpoint {path} is damaged ({problem}); skipped (left in place)")
            return None
        path = Path(resume_from_checkpoint)
        if not (path / "trainer_state.json").is_file():
            raise RecipeError(f"--resume_from_checkpoint {path}: not a complete checkpoint (no trainer_state.json)")
        if (problem := self._verify(path)) is not None:
            raise RecipeError(f"--resume_from_checkpoint {path}: the checkpoint is damaged ({problem})")
        return path

    def _verify(self, path: Path) -> str | None:
        problem, has_manifest = verify_checkpoint(path)
        if problem is None and not has_manifest:
            self.accelerator.print(
                f"warning: checkpoint {path} has no {MANIFEST} (written by an older xlnet-lite); every file of it loads"
            )
        return problem

    def save(self, step, *, trainer_state: dict, rank_state: dict, rank_tensors: dict | None = None) -> Path:
        """Write checkpoint `step` under a temporary name, its manifest last, and rename it into place. A write that
        fails on any process (a full disk) removes the partial checkpoint and raises SaveError on every process; the
        checkpoints before it are untouched."""
        acc = self.accelerator
        final, tmp = self.root / f"step_{step}", self.root / f".step_{step}.tmp"
        failure = None
        if acc.is_main_process:
            try:
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir(parents=True)
            except Exception as error:  # noqa: BLE001 (a full disk surfaces as OSError, RuntimeError or SafetensorError)
                failure = self._failure(tmp, error, step)
        self._settle(tmp, step, failure)
        try:
            acc.save_state(str(tmp))
            crash_point("checkpoint_state")
            rank = acc.process_index
            (tmp / f"rank{rank}_state.json").write_text(json.dumps(rank_state))
            if rank_tensors:
                save_file(
                    {k: v.contiguous() for k, v in rank_tensors.items()}, str(tmp / f"rank{rank}_tensors.safetensors")
                )
        except Exception as error:  # noqa: BLE001
            failure = self._failure(tmp, error, step)
        self._settle(tmp, step, failure)
        if acc.is_main_process:
            try:
                (tmp / "trainer_state.json").write_text(json.dumps({**trainer_state, "step": step}, indent=2))
                crash_point("checkpoint")
                write_manifest(tmp)
                crash_point("checkpoint_manifest")
                replace_folder(tmp, final)
            except Exception as error:  # noqa: BLE001 (a full disk surfaces as OSError, RuntimeError or SafetensorError)
                failure = self._failure(tmp, error, step)
            else:
                for old in self.complete()[: -self.limit]:
                    shutil.rmtree(old, ignore_errors=True)
        self._settle(tmp, step, failure)
        return final

    def _failure(self, tmp: Path, error: Exception, step: int) -> SaveError:
        """The SaveError of a failed write: the folder, and the space a checkpoint takes (the previous one's size, or
        what this one had written when it failed)."""
        previous = self.complete()
        needed = max(folder_size(tmp), folder_size(previous[-1]) if previous else 0)
        if self.accelerator.is_main_process:  # before measuring the free space (other ranks may still be writing)
            shutil.rmtree(tmp, ignore_errors=True)
        return save_error(self.root, error, needed_bytes=needed, what=f"checkpoint step_{step}")

    def _settle(self, tmp: Path, step: int, failure: SaveError | None):
        agree_on_failure(
            self.accelerator,
            failure,
            f"checkpoint step_{step} could not be written (the error is on another process)",
            cleanup=lambda: shutil.rmtree(tmp, ignore_errors=True),
        )

    def load(self, path: Path, *, device) -> tuple[dict, dict, dict]:
        """(trainer_state, this rank's state, this rank's tensors) after accelerator.load_state."""
        acc = self.accelerator
        rank_file = path / f"rank{acc.process_index}_state.json"
        if not rank_file.is_file():
            raise RecipeError(
                f"{path}: no state for process {acc.process_index}; resume with the same number of processes"
            )
        acc.load_state(str(path))
        tensors_file = path / f"rank{acc.process_index}_tensors.safetensors"
        tensors = load_file(str(tensors_file), device=str(device)) if tensors_file.is_file() else {}
        return json.loads((path / "trainer_state.json").read_text()), json.loads(rank_file.read_text()), tensors


# ---------------------------------------------------------------------------------------------------------
# Metrics


class MetricsLog:
    """output_dir/metrics.jsonl, one JSON record per line, main process only; mirrored to the trackers."""

    def __init__(self, accelerator, output_dir, *, with_tracking):
        self.accelerator, self.path, self.with_tracking = accelerator, Path(output_dir, "metrics.jsonl"), with_tracking
        self.count = 0  # records in the log: saved with each checkpoint

    def start(self, records: int):
        """A fresh run (0) starts an empty log; a resumed one keeps the first `records` records, the ones written
        before its checkpoint (`self.count` when it was saved), and drops what the interrupted run wrote after it.
        The rewrite is atomic, so a kill during it loses nothing."""
        kept = self.records()[:records]
        self.count = len(kept)
        if self.accelerator.is_main_process:
            atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))

    def log(self, record: dict):
        self.count += 1
        if self.with_tracking:
            self.accelerator.log({k: v for k, v in record.items() if k != "step"}, step=record["step"])
        if self.accelerator.is_main_process:
            with open(self.path, "a") as f:
                f.write(json.dumps(record))
                f.flush()
                crash_point("metrics_append")  # a kill here leaves a line without its end: records() skips it
                f.write("\n")

    def records(self) -> list[dict]:
        """Every complete record (a line cut short by a kill is skipped)."""
        if not self.path.exists():
            return []
        records = []
        for line in self.path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
        return [r for r in records if isinstance(r, dict) and "step" in r]


def plot_metrics(records, path, *, title, left: dict, right: dict | None = None, hline=None, xlabel="optimizer step"):
    """Curves of metrics.jsonl against the step: `left` / `right` map record keys to labels (right: a second
    axis); `hline` = (value, label). Written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    styles = iter(["-", "o-", "s--", "^-."])
    for key, label in left.items():
        points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
        if points:
            ax.plot(*zip(*points), next(styles), label=label, lw=1, ms=4)
    if hline is not None:
        ax.axhline(hline[0], color="gray", ls=":", label=hline[1])
    ax.set_xlabel(xlabel)
    ax.set_ylabel("loss")
    ax.legend(loc="upper right", fontsize=8)
    for key, label in (right or {}).items():
        points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
        if points:
            other = ax.twinx()
            other.plot(*zip(*points), "s-", color="tab:red", label=label)
            other.set_ylabel(label, color="tab:red")
    ax.set_title(title)
    fig.tight_layout()
    tmp = Path(path).with_name(f".{Path(path).name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------------------
# Optimizer and schedule


def parameter_groups(model, *, learning_rate, weight_decay, layerwise_lr_decay=1.0):
    """AdamW groups, one rule for both recipes. No weight decay on biases (r_w/r_r/r_s_bias included) or
    LayerNorm weights, as XLNet's optimizer does. With layerwise_lr_decay < 1, layer l of L gets
    lr * decay^(L-1-l), the rest of the transformer (embeddings, mask_emb, shared biases) lr * decay^L and the
    head lr."""
    decay_names = {n for n in get_parameter_names(model, [torch.nn.LayerNorm]) if "bias" not in n}
    n_layer, has_head = (
        model.config.num_hidden_layers,
        hasattr(model, "transformer"),
    )  # transformers' name (XLNet: n_layer)
    groups = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        match = re.search(r"(?:^|\.)layer\.(\d+)\.", name)
        if match:
            depth = n_layer - 1 - int(match.group(1))
        elif has_head and not name.startswith("transformer."):
            depth = 0  # the head
        else:
            depth = n_layer  # embeddings, mask_emb, shared biases
        key = (depth if layerwise_lr_decay != 1.0 else 0, weight_decay if name in decay_names else 0.0)
        groups.setdefault(key, []).append(param)
    return [
        {"params": params, "lr": learning_rate * layerwise_lr_decay**depth, "weight_decay": wd}
        for (depth, wd), params in sorted(groups.items())
    ]


def make_adamw(model, *, learning_rate, weight_decay, eps, layerwise_lr_decay=1.0):
    """AdamW over `parameter_groups`, fused on CPU and CUDA (one kernel, not 5 per tensor)."""
    groups = parameter_groups(
        model, learning_rate=learning_rate, weight_decay=weight_decay, layerwise_lr_decay=layerwise_lr_decay
    )
    fused = all(p.device.type in ("cpu", "cuda") for g in groups for p in g["params"])
    return torch.optim.AdamW(groups, lr=learning_rate, eps=eps, fused=fused)


def make_optimizer_and_scheduler(
    a: RecipeArguments, model, *, max_steps, num_processes, layerwise_lr_decay=1.0, budget: "TimeBudget | None" = None
):
    """Fused AdamW over `parameter_groups`, and transformers' schedule over `max_steps` (or, with a `budget`, one that
    decays to zero at the budget's deadline)."""
    optimizer = make_adamw(
        model,
        learning_rate=a.learning_rate,
        weight_decay=a.weight_decay,
        eps=a.adam_epsilon,
        layerwise_lr_decay=layerwise_lr_decay,
    )
    if budget is not None:
        return optimizer, make_budget_scheduler(optimizer, budget, num_processes=num_processes)
    # A prepared scheduler steps once per process per optimizer step.
    scheduler = get_scheduler(
        a.lr_scheduler_type,
        optimizer,
        num_warmup_steps=warmup_steps(a, max_steps) * num_processes,
        num_training_steps=max(max_steps, 1) * num_processes,
    )
    return optimizer, scheduler


class TimeBudget:
    """A wall-clock budget for the optimizer steps (`--max_train_minutes`): the learning rate warms up over the first
    `warmup_steps` steps, then decays to zero at the deadline (linear or cosine in the fraction of the budget spent,
    as "How to Train BERT with an Academic Budget" and "Cramming" tie the schedule to the time left) or stays at its
    peak (constant_with_warmup), and training stops there. The clock counts the seconds inside optimizer steps (`TrainLoop.elapsed`, agreed across processes,
    kept in checkpoints), not evaluation or checkpoint writing. Steps during which `torch.compile` compiled count
    toward the deadline but not toward the schedule: the decay runs over the time left after them (`--torch_compile`
    spent the first 80 s of a 4-minute GPU run compiling), so compiling does not use up a short run's schedule. A
    run's step count then depends on the machine's speed, so two runs are not bit-identical as step-bounded ones are."""

    SCHEDULES = ("linear", "cosine", "constant_with_warmup")

    def __init__(self, minutes: float, *, warmup_steps: int, schedule: str = "linear"):
        if schedule not in self.SCHEDULES:
            raise RecipeError(
                f"--lr_scheduler_type {schedule} cannot follow a time budget (--max_train_minutes); use "
                f"one of {', '.join(self.SCHEDULES)}"
            )
        self.seconds, self.warmup_steps, self.schedule = minutes * 60.0, warmup_steps, schedule
        self.elapsed = 0.0  # set by the training loop before each scheduler step
        self.compiling = 0.0  # of which, seconds of steps that compiled

    def fraction(self) -> float:
        """The share of the budget spent, compiling left out of both: non-decreasing from step to step."""
        if self.elapsed >= self.seconds:
            return 1.0
        return max(self.elapsed - self.compiling, 0.0) / (self.seconds - self.compiling)

    def expired(self) -> bool:
        return self.elapsed >= self.seconds

    def lr_lambda(self, step: int) -> float:
        """The smaller of the warmup ramp (by steps) and the decay (by time): continuous at the warmup's end, and zero
        at the deadline even when the deadline falls inside the warmup. The ramp is transformers' (`step /
        warmup_steps`, so the first step's rate is 0): under constant_with_warmup a timed run is the step-bounded run
        of the step count it reached."""
        warmup = min(1.0, step / self.warmup_steps) if self.warmup_steps else 1.0
        if self.schedule == "constant_with_warmup":
            return warmup
        done = self.fraction()
        return min(warmup, 1.0 - done if self.schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * done)))


def compiled_frames() -> int:
    """How many frames torch.compile (dynamo) has compiled in this process so far: a step that raised it compiled."""
    from torch._dynamo.utils import counters

    return counters["frames"]["ok"]


def make_budget_scheduler(optimizer, budget: TimeBudget, *, num_processes):
    """A LambdaLR following `budget` (a prepared scheduler steps once per process per optimizer step)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: budget.lr_lambda(s // num_processes))


def start_tracking(accelerator, a: RecipeArguments, project_name):
    if a.with_tracking:
        flags = {k: v for k, v in dataclasses.asdict(a).items() if isinstance(v, (int, float, str, bool))}
        accelerator.init_trackers(project_name, config=flags)


class _DropSharedTensorNote(logging.Filter):
    """accelerate's save_state notes that the tied LM head shares the embedding's tensor; load_state ties it again."""

    def filter(self, record):
        return "Removed shared tensor" not in record.getMessage()


def make_accelerator(a: RecipeArguments):
    from accelerate import Accelerator
    from accelerate.utils import TorchDynamoPlugin

    logging.getLogger("accelerate.utils.other").addFilter(_DropSharedTensorNote())
    device_type = launch_device_type()
    precision, why = resolve_precision(a.mixed_precision, device_type)
    kwargs = {"gradient_accumulation_steps": a.gradient_accumulation_steps, "mixed_precision": precision}
    if a.with_tracking:
        kwargs.update(log_with=a.report_to, project_dir=a.output_dir)
    if a.torch_compile:
        kwargs["dynamo_plugin"] = TorchDynamoPlugin(backend="inductor", dynamic=False if a.STATIC_SHAPES else None)
    accelerator = Accelerator(**kwargs)
    accelerator.print(f"mixed precision: {accelerator.mixed_precision} ({why})")
    if accelerator.mixed_precision == "bf16" and device_type == "cpu" and not cpu_bf16_units():
        accelerator.print(
            f"warning: bf16 on this CPU ({torch.backends.cpu.get_cpu_capability()}, no AVX512-BF16/AMX) is "
            "emulated and many times slower than fp32; pass --mixed_precision no (or launch without bf16)"
        )
    return accelerator


# ---------------------------------------------------------------------------------------------------------
# The step


class StopSignal:
    """SIGTERM / SIGINT on any rank set accelerate's trigger; `requested()` (every rank, once per step) agrees
    on it, so every rank saves the same checkpoint and exits. Restores the previous handlers on `close()`."""

    def __init__(self, accelerator):
        self.accelerator, self.signal = accelerator, None
        self.previous = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGTERM, signal.SIGINT)}

    def _handle(self, signum, frame):
        self.signal = signum
        self.accelerator.set_trigger()

    def requested(self) -> bool:
        return self.accelerator.check_trigger()

    def close(self):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


class TrainLoop:
    """Optimizer steps (gradient accumulation, clipping, schedule, non-finite guard) and their metrics.

    A metrics record's tokens_per_second is the training throughput since the previous record: the tokens of its steps
    over the wall-clock time between the records (data, collator, logging included) less the time spent in `paused()`
    blocks (evaluation, checkpoints), which train nothing and are timed on their own.
    """

    def __init__(self, a: RecipeArguments, accelerator, model, optimizer, scheduler, *, checkpoints_dir, budget=None):
        self.a, self.accelerator, self.model = a, accelerator, model
        self.optimizer, self.scheduler, self.checkpoints_dir = optimizer, scheduler, checkpoints_dir
        self.budget = budget
        self.skipped, self.elapsed = 0, 0.0
        self._window = [0.0, 0, 0, time.perf_counter()]  # loss sum, steps, tokens, start
        self._paused = 0.0  # seconds of the current window spent in paused() blocks

    @contextlib.contextmanager
    def paused(self):
        """Work between steps that is not training (evaluation, checkpointing): left out of tokens_per_second."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self._paused += time.perf_counter() - start

    def add_tokens(self, tokens: int):
        """Count tokens toward tokens_per_second (for steps whose size is known only once their batches are read)."""
        self._window[2] += tokens

    def step(self, micro_batches: Iterable[Callable[[], torch.Tensor]], *, step: int, tokens: int = 0):
        """One optimizer step: each item of `micro_batches` computes one micro-batch's loss. Returns the step's
        mean loss, or None when a non-finite loss made it skip (--skip_nonfinite)."""
        frames = compiled_frames() if self.budget is not None else 0
        acc, start, losses, skip, ticked = self.accelerator, time.perf_counter(), [], False, None
        for compute_loss in micro_batches:
            with acc.accumulate(self.model):
                loss = compute_loss()
                skip = skip or self._nonfinite(loss, step)
                if not skip:
                    acc.backward(loss)
                    losses.append(loss.detach().float())
                    if acc.sync_gradients:
                        if self.a.max_grad_norm > 0:
                            acc.clip_grad_norm_(self.model.parameters(), self.a.max_grad_norm)
                        self.optimizer.step()
                        if self.budget is not None:  # the next learning rate from the clock at this step's end
                            took = time.perf_counter() - start
                            self._tick_budget(self.elapsed + took, took if compiled_frames() > frames else 0.0)
                            ticked = time.perf_counter()
                        self.scheduler.step()
                if acc.sync_gradients:
                    self.optimizer.zero_grad(set_to_none=True)
        if ticked is None:
            self.elapsed += time.perf_counter() - start
        else:  # from the agreed clock, so that every process's next tick starts from it
            self.elapsed = self.budget.elapsed + time.perf_counter() - ticked
        crash_point("step")
        if skip:
            self.skipped += 1
            return None
        mean = torch.stack(losses).mean().item()
        w = self._window
        w[0], w[1], w[2] = w[0] + mean, w[1] + 1, w[2] + tokens
        return mean

    def _tick_budget(self, elapsed: float, compiling: float):
        """Every process takes the slowest one's clock and the longest compiling, so all set the same learning rate
        and stop at the same step; as every process then carries on from the agreed clock, the clock gains at least
        what compiling does, and the schedule's fraction never goes back."""
        clock = torch.tensor(
            [elapsed, self.budget.compiling + compiling], dtype=torch.float64, device=self.accelerator.device
        )
        if self.accelerator.num_processes > 1:
            clock = self.accelerator.reduce(clock, "max")
        self.budget.elapsed, self.budget.compiling = (float(x) for x in clock.tolist())

    def _nonfinite(self, loss, step) -> bool:
        """Agreed across ranks: one rank's NaN skips (or stops) every rank, so no rank waits for another."""
        flag = (~torch.isfinite(loss.detach())).float().reshape(1)
        if self.accelerator.num_processes > 1:
            flag = self.accelerator.reduce(flag, "sum")
        if not bool(flag.item() > 0):
            return False
        if not self.a.skip_nonfinite:
            raise FloatingPointError(
                f"non-finite training loss ({loss.item()}) at step {step}; the last good checkpoint in "
                f"{self.checkpoints_dir} is intact (resume with --resume_from_checkpoint latest, perhaps with a "
                "lower --learning_rate), or pass --skip_nonfinite to skip such steps"
            )
        return True

    def window_record(self, step: int) -> dict | None:
        """Mean loss, learning rate and tokens/s since the last record; None when nothing was trained."""
        loss_sum, steps, tokens, start = self._window
        seconds = time.perf_counter() - start - self._paused
        self._window, self._paused = [0.0, 0, 0, time.perf_counter()], 0.0
        if not steps:
            return None
        record = {
            "step": step,
            "loss": loss_sum / steps,
            "learning_rate": self.scheduler.get_last_lr()[0],
            "elapsed": self.elapsed,
            "skipped_steps": self.skipped,
        }
        if tokens:
            record["tokens_per_second"] = tokens / seconds
        return record

    def state_dict(self):
        state = {"skipped": self.skipped, "elapsed": self.elapsed}
        if self.budget is not None:
            state["compiling"] = self.budget.compiling
        return state

    def load_state_dict(self, state):
        self.skipped, self.elapsed = state.get("skipped", 0), state.get("elapsed", 0.0)
        if self.budget is not None:
            self.budget.elapsed, self.budget.compiling = self.elapsed, state.get("compiling", 0.0)


# ---------------------------------------------------------------------------------------------------------
# The Hub


def push_output_dir(a: RecipeArguments, *, commit_message):
    """Upload output_dir (the model with its code, tokenizer, results, plots; not the checkpoints) to the Hub."""
    from huggingface_hub import HfApi

    api = HfApi(token=a.hub_token)
    repo_id = api.create_repo(a.hub_model_id or Path(a.output_dir).name, exist_ok=True).repo_id
    api.upload_folder(
        repo_id=repo_id,
        folder_path=a.output_dir,
        commit_message=commit_message,
        ignore_patterns=["checkpoints/*", "checkpoints/**", ".*", RUN_FILE],
    )
    return repo_id


@contextlib.contextmanager
def bad_input(name: str):
    """Turn the library's ValueError about an input (an empty or non-UTF-8 file, a corpus too short for its batch)
    into a RecipeError that names where the input came from (`name`: a flag and its value, or a split)."""
    try:
        yield
    except RecipeError:
        raise
    except ValueError as error:  # UnicodeDecodeError included
        raise RecipeError(f"{name}: {error}") from error


# What `prepare` returned in a multi-process run (the DDP-wrapped model above all), kept until `exit_on_recipe_error`
# ends the process.
_MULTI_PROCESS_RUN: list = []


def prepare(accelerator, *objects):
    """`accelerator.prepare(*objects)`; in a multi-process run the prepared objects are also kept for the life of the
    process (see `exit_on_recipe_error`)."""
    prepared = accelerator.prepare(*objects)
    if accelerator.num_processes > 1:
        _MULTI_PROCESS_RUN.append(prepared)
    return prepared


def exit_on_recipe_error(main, argv, prog):
    """Run `main(argv)` as a command: bad input ends in one line naming the flag, file or column (exit status 2); a
    non-finite loss in one line naming the step, a failed save (a full disk) in one naming the folder (exit status 1).

    A multi-process run ends with `os._exit` once its outputs are written and the process group is gone, without
    freeing DDP's reducer: freeing it joins gloo's worker threads while holding the GIL, and a worker still
    releasing the last collective's tensors waits for that GIL, so a rank could hang at exit, at random."""
    import sys
    import traceback

    code, result = 0, None
    try:
        result = main(argv)
    except (RecipeError, FileNotFoundError, FloatingPointError, SaveError) as error:
        sys.stderr.write(f"{prog}: error: {error}\n")
        code = 1 if isinstance(error, (FloatingPointError, SaveError)) else 2
    except Exception:
        if not _MULTI_PROCESS_RUN:
            raise
        traceback.print_exc()
        code = 1
    release_output_lock()
    if _MULTI_PROCESS_RUN:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if code:
        sys.exit(code)
    return result


# ---------------------------------------------------------------------------------------------------------
# A run's shared state


@dataclass
class RecipeRun:
    """What a recipe's stages share once the run is set up: flags, accelerator, the prepared model, tokenizer,
    training loop, checkpoints and metrics log. A recipe subclasses it with its own data (stream, labels, ...)."""

    a: RecipeArguments
    accelerator: object
    model: torch.nn.Module
    tokenizer: object
    loop: TrainLoop
    checkpoints: Checkpoints
    metrics: MetricsLog

    def save_checkpoint(
        self,
        step: int,
        *,
        recipe_state: dict | None = None,
        rank_state: dict | None = None,
        rank_tensors: dict | None = None,
    ) -> Path:
        """A checkpoint with the trainer state every resume checks (flags, model, processes) and restores (loop,
        metrics records), the recipe's own state, and each rank's state and tensors."""
        acc = self.accelerator
        trainer_state = {
            "flags": run_flags(self.a),
            "model": model_fields(acc.unwrap_model(self.model)),
            "num_processes": acc.num_processes,
            "loop": self.loop.state_dict(),
            "metrics_records": self.metrics.count,
        }
        if recipe_state is not None:
            trainer_state["recipe"] = recipe_state
        return self.checkpoints.save(
            step, trainer_state=trainer_state, rank_state=rank_state or {}, rank_tensors=rank_tensors
        )
