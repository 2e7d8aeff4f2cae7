"""The flags both recipes share: `RecipeArguments`, parsed from the command line over an optional config file."""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from transformers import HfArgumentParser

from ..errors import RecipeError
from ..precision import PRECISIONS

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


def flag(default, help, **metadata):
    """A dataclass field with its --help line."""
    return field(default=default, metadata={"help": help, **metadata})


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
            "help": "'latest' (the newest complete checkpoint in output_dir/checkpoints; a fresh start if there is "
            "none yet) or a checkpoint folder."
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
            "help": "auto: bf16 where the CPU has AMX or AVX512-BF16 or the GPU supports bf16, fp32 elsewhere; a "
            "precision given to `accelerate launch` (--mixed_precision or its config) is used instead. no, bf16 or "
            "fp16 here win over both.",
            "choices": list(PRECISIONS),
        },
    )
    torch_compile: bool = field(
        default=False,
        metadata={
            "help": "Compile the model with torch.compile (inductor): the first steps take about a minute more, the "
            "rest run faster (benchmarks/RESULTS.md, model speed)."
        },
    )
    process_group_timeout: float = field(
        default=300.0,
        metadata={
            "help": "Seconds a process of a multi-process run waits for the others at a step before the run stops "
            "with one line (a process or node that died or hangs); preparing the data (tokenizing the corpus on "
            "the main process while the others wait) keeps torch's 30 minutes, or this if longer."
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
        "process_group_timeout",
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
        ) from error
    if not isinstance(values, dict):
        raise RecipeError(f"--config {path}: expected a mapping of flag names to values")
    unknown = sorted(set(values) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise RecipeError(f"--config {path}: unknown keys {unknown}; the keys are the flag names without '--'")
    return values


def check_common_args(args: RecipeArguments):
    """The core's flag checks: a list of problems (empty when all is well)."""
    problems = []
    for name in (
        "per_device_train_batch_size",
        "per_device_eval_batch_size",
        "gradient_accumulation_steps",
        "logging_steps",
        "save_total_limit",
    ):
        if getattr(args, name) < 1:
            problems.append(f"--{name} must be >= 1, got {getattr(args, name)}")
    if not args.process_group_timeout > 0:
        problems.append(f"--process_group_timeout must be > 0 seconds, got {args.process_group_timeout}")
    if args.learning_rate <= 0:
        problems.append(f"--learning_rate must be > 0, got {args.learning_rate}")
    if args.num_warmup_steps < 0 or args.checkpointing_steps < 0 or args.max_grad_norm < 0 or args.weight_decay < 0:
        problems.append("--num_warmup_steps, --checkpointing_steps, --max_grad_norm and --weight_decay must be >= 0")
    if not 0 <= args.warmup_ratio < 1:
        problems.append(f"--warmup_ratio must be in [0, 1), got {args.warmup_ratio}")
    if args.resume_from_checkpoint not in (None, "", "latest") and not Path(args.resume_from_checkpoint).is_dir():
        problems.append(f"--resume_from_checkpoint: no such folder {args.resume_from_checkpoint} (or pass 'latest')")
    if args.with_tracking:
        problems.extend(tracker_problems(args.report_to))
    return problems


def tracker_problems(report_to: str) -> list[str]:
    """--report_to must name a tracker accelerate knows whose package is installed (accelerate leaves out, without a
    word, a tracker it cannot import), a tracker class registered with accelerate.tracking.register_tracker_class, or
    "all" with at least one installed."""
    from accelerate import tracking
    from accelerate.utils import LoggerType

    installed = {LoggerType(t).value for t in tracking.get_available_trackers()}
    if report_to == "all":
        return [] if installed else ["--report_to all: no tracker is installed (pip install tensorboard)"]
    if report_to in LoggerType.list():
        return [] if report_to in installed else [f"--report_to {report_to}: not installed (pip install {report_to})"]
    if report_to in tracking.LOGGER_TYPE_TO_CLASS:  # a tracker class registered by name
        return []
    known = ", ".join(t for t in LoggerType.list() if t != "all")
    return [f"--report_to {report_to}: not a tracker accelerate knows ({known}, all, or a registered tracker class)"]


def raise_problems(problems):
    if problems:
        raise RecipeError("invalid arguments: " + "; ".join(problems))


def run_flags(args: RecipeArguments) -> dict:
    """The flags that define the run (saved with it, compared on resume)."""
    return {k: v for k, v in dataclasses.asdict(args).items() if k not in args.NOT_PART_OF_THE_RUN}
