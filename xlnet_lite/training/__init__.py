"""The training core of both recipes (pretrain/run_pretraining.py and finetune/run_glue.py).

A recipe declares its flags as a dataclass deriving from `RecipeArguments`, builds its data and model, and
hands each optimizer step's losses to `TrainLoop.step`. Everything a user relies on lives in this package, once
(arguments, run, checkpoints, optim, loop, metrics, hub), and every name is importable from it:

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
  `--torch_compile`;
- on a CPU, glibc's malloc keeps the blocks a step frees for the next step (`reuse_freed_memory`).
"""

from ..atomic_io import atomic_write_text, default_file_mode, fsync_path, publish_folder, replace_folder, write_json
from ..errors import RecipeError
from ..faults import CRASH_ENV, DISK_FULL_ENV, crash_point
from ..integrity import SaveError
from .arguments import (
    SCHEDULES,
    RecipeArguments,
    check_common_args,
    flag,
    parse_args,
    raise_problems,
    read_config_file,
    run_flags,
)
from .checkpoints import (
    Checkpoints,
    agree_on_failure,
    check_resume,
    check_resume_model,
    flag_differences,
    load_final_model,
    model_fields,
    save_final_model,
)
from .cpu_allocator import reuse_freed_memory
from .hub import push_output_dir
from .loop import TrainLoop
from .metrics import MetricsLog, plot_metrics
from .optim import (
    TimeBudget,
    compiled_frames,
    make_adamw,
    make_budget_scheduler,
    make_optimizer_and_scheduler,
    parameter_groups,
    warmup_steps,
)
from .run import (
    RUN_FILE,
    RecipeRun,
    StopSignal,
    bad_input,
    end_run,
    exit_on_recipe_error,
    make_accelerator,
    prepare,
    release_output_lock,
    set_up_run,
    start_run,
    start_tracking,
    take_output_lock,
)

__all__ = [
    "flag",
    "CRASH_ENV",
    "DISK_FULL_ENV",
    "RUN_FILE",
    "SCHEDULES",
    "Checkpoints",
    "MetricsLog",
    "RecipeArguments",
    "RecipeError",
    "RecipeRun",
    "SaveError",
    "StopSignal",
    "TimeBudget",
    "TrainLoop",
    "agree_on_failure",
    "atomic_write_text",
    "bad_input",
    "check_common_args",
    "check_resume",
    "check_resume_model",
    "compiled_frames",
    "crash_point",
    "default_file_mode",
    "end_run",
    "exit_on_recipe_error",
    "flag_differences",
    "fsync_path",
    "make_accelerator",
    "make_adamw",
    "make_budget_scheduler",
    "make_optimizer_and_scheduler",
    "model_fields",
    "parameter_groups",
    "parse_args",
    "plot_metrics",
    "prepare",
    "publish_folder",
    "push_output_dir",
    "raise_problems",
    "read_config_file",
    "release_output_lock",
    "replace_folder",
    "reuse_freed_memory",
    "run_flags",
    "load_final_model",
    "save_final_model",
    "set_up_run",
    "start_run",
    "start_tracking",
    "take_output_lock",
    "warmup_steps",
    "write_json",
]
