"""A recipe's run: the accelerator, the output folder (fresh, overwrite or resume) and its lock, signals, the exit."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import datetime
import logging
import os
import re
import shutil
import signal
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate.utils import DistributedType

from ..atomic_io import write_json
from ..errors import RecipeError
from ..integrity import OutputLock, SaveError
from ..precision import cpu_bf16_units, launch_device_type, resolve_precision
from .arguments import RecipeArguments, parse_args, run_flags
from .checkpoints import Checkpoints, check_resume, flag_differences, model_fields, read_json
from .cpu_allocator import reuse_freed_memory
from .loop import TrainLoop
from .metrics import MetricsLog

RUN_FILE = "run_args.json"  # written first: the flags of the run this folder holds


def start_run(args: RecipeArguments, accelerator, checkpoints: Checkpoints, *, outputs: Iterable[str]) -> Path | None:
    """Decide, before any expensive work, whether this run starts fresh or resumes, and never touch another
    run's outputs unasked. Returns the checkpoint to resume from, or None. `outputs` are the names this recipe
    writes into output_dir (removed by --overwrite_output_dir)."""
    out = Path(args.output_dir)
    ours = [RUN_FILE, "checkpoints", *outputs]
    held = sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) if out.is_dir() else []
    trained = [name for name in held if name not in (RUN_FILE, "tokenizer")]  # a run that never trained left only these
    checkpoint = checkpoints.resolve(args.resume_from_checkpoint)
    previous = read_json(out / RUN_FILE)
    same_run = previous is not None and not flag_differences(args, previous)
    if checkpoint is not None:
        fsdp = accelerator.distributed_type == DistributedType.FSDP
        check_resume(args, checkpoint, num_processes=accelerator.num_processes, fsdp=fsdp)
    elif args.overwrite_output_dir or (held and not trained and not same_run):
        if trained:
            accelerator.print(f"--overwrite_output_dir: removing the previous run's outputs in {out}")
        if accelerator.is_main_process:
            for name in ours:
                path = out / name
                shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    elif trained and not (args.resume_from_checkpoint == "latest" and same_run):
        listed = ", ".join(trained[:6]) + (", ..." if len(trained) > 6 else "")
        raise RecipeError(
            f"--output_dir {out} already holds the outputs of another run ({listed}); pass --overwrite_output_dir "
            f"to replace them, --resume_from_checkpoint latest to continue that run, or another --output_dir"
        )
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / RUN_FILE, run_flags(args))
    accelerator.wait_for_everyone()
    return checkpoint


def set_up_run(cls, argv, *, check, outputs, description=None):
    """The start of every recipe: parse and `check` the flags, make the accelerator, decide fresh start or resume
    (`start_run`) and seed everything. Returns (args, accelerator, checkpoints, checkpoint to resume or None)."""
    from accelerate.utils import set_seed

    args = parse_args(cls, argv, description=description)
    check(args)
    release_output_lock()  # of a run that ended before, in this process
    _MULTI_PROCESS_RUN.clear()
    _RUN_SETTINGS.update(timeout=args.process_group_timeout, checkpoints=Path(args.output_dir, "checkpoints"))
    accelerator = make_accelerator(args)
    take_output_lock(args.output_dir, accelerator)
    checkpoints = Checkpoints(accelerator, args.output_dir, args.save_total_limit)
    resume = start_run(args, accelerator, checkpoints, outputs=outputs)
    set_seed(args.seed)
    return args, accelerator, checkpoints, resume


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


def start_tracking(accelerator, args: RecipeArguments, project_name):
    if args.with_tracking:
        flags = {k: v for k, v in dataclasses.asdict(args).items() if isinstance(v, (int, float, str, bool))}
        accelerator.init_trackers(project_name, config=flags)


class _DropSharedTensorNote(logging.Filter):
    """accelerate's save_state notes that the tied LM head shares the embedding's tensor; load_state ties it again."""

    def filter(self, record):
        return "Removed shared tensor" not in record.getMessage()


# How long the processes wait for each other while the data is prepared (the main process tokenizes the corpus while
# the others wait: minutes on a large corpus): torch's own default for gloo. Training then waits
# --process_group_timeout (`prepare`).
PREPARATION_TIMEOUT_S = 1800.0


_MADE_STATE: list = []  # an object of the accelerate state a recipe run made (its dynamo plugin), while it lasts


def forget_earlier_runs():
    """accelerate keeps one state a process, set by the first Accelerator made: a later run in the same process (a
    notebook, a sweep calling `main` in turn) would silently keep the first run's --torch_compile setting and refuse
    another --mixed_precision. The state an earlier recipe run made is reset, unless a process group is still up (one
    `end_run` could not destroy, as under accelerate's notebook_launcher); a state the caller made is left as it is."""
    from accelerate.state import AcceleratorState, GradientState

    made = bool(_MADE_STATE) and AcceleratorState._shared_state.get("dynamo_plugin") is _MADE_STATE[0]
    if not made or (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    _MADE_STATE.clear()


def make_accelerator(args: RecipeArguments):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import InitProcessGroupKwargs, TorchDynamoPlugin

    logging.getLogger("accelerate.utils.other").addFilter(_DropSharedTensorNote())
    forget_earlier_runs()
    device_type = launch_device_type()
    memory_line = reuse_freed_memory() if device_type == "cpu" else None  # before the run allocates its memory
    precision, why = resolve_precision(args.mixed_precision, device_type)
    timeout = (
        args.process_group_timeout
        if _set_pg_timeout() is None
        else max(args.process_group_timeout, PREPARATION_TIMEOUT_S)
    )
    kwargs = {
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "mixed_precision": precision,
        "kwargs_handlers": [InitProcessGroupKwargs(timeout=datetime.timedelta(seconds=timeout))],
    }
    if args.with_tracking:
        kwargs.update(log_with=args.report_to, project_dir=args.output_dir)
    if args.torch_compile:
        kwargs["dynamo_plugin"] = TorchDynamoPlugin(backend="inductor", dynamic=False if args.STATIC_SHAPES else None)
    fresh = not AcceleratorState._shared_state and not PartialState._shared_state
    accelerator = Accelerator(**kwargs)
    _MADE_STATE[:] = [AcceleratorState._shared_state["dynamo_plugin"]] if fresh else []
    accelerator.print(f"mixed precision: {accelerator.mixed_precision} ({why})")
    if memory_line is not None:
        accelerator.print(memory_line)
    if accelerator.mixed_precision == "bf16" and device_type == "cpu" and not cpu_bf16_units():
        accelerator.print(
            f"warning: bf16 on this CPU ({torch.backends.cpu.get_cpu_capability()}, no AVX512-BF16/AMX) is "
            "emulated and many times slower than fp32; pass --mixed_precision no (or launch without bf16)"
        )
    return accelerator


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


# The running recipe's --process_group_timeout and checkpoints folder (for `prepare` and `exit_on_recipe_error`).
_RUN_SETTINGS: dict = {}

# What `prepare` returned in a multi-process run (the DDP-wrapped model above all), kept until `exit_on_recipe_error`
# ends the process.
_MULTI_PROCESS_RUN: list = []


def prepare(accelerator, *objects):
    """`accelerator.prepare(*objects)`; in a multi-process run the prepared objects are also kept for the life of the
    process (see `exit_on_recipe_error`), and from here on the processes wait --process_group_timeout for each other
    instead of the preparation's longer limit (`PREPARATION_TIMEOUT_S`)."""
    prepared = accelerator.prepare(*objects)
    if accelerator.num_processes > 1:
        _MULTI_PROCESS_RUN.append(prepared)
        timeout = _RUN_SETTINGS.get("timeout")
        set_timeout = _set_pg_timeout()
        if timeout is not None and set_timeout is not None and torch.distributed.is_initialized():
            set_timeout(datetime.timedelta(seconds=timeout))
    return prepared


def _set_pg_timeout():
    """torch's (private) setter of a live process group's timeout, or None where this torch has none (the whole run
    then waits --process_group_timeout)."""
    return (
        getattr(torch.distributed.distributed_c10d, "_set_pg_timeout", None)
        if torch.distributed.is_available()
        else None
    )


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
    except Exception as error:
        if not _MULTI_PROCESS_RUN:
            raise
        if (lost := lost_process(error)) is not None:
            sys.stderr.write(f"{prog}: error: {lost}\n")
        else:
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


# What gloo says when a collective's peer is gone (killed, its node down) or never answers (NCCL raises DistError).
_LOST_PEER = ("Timed out", "timed out", "Connection closed by peer", "Connection reset by peer", "Broken pipe")


def lost_process(error: Exception) -> str | None:
    """The one line for a collective that failed because another process of the run died or stopped answering (a
    killed process, a node gone, a hang), or None for any other error."""
    text = next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)
    said_by_gloo = "gloo" in text and any(s in text for s in _LOST_PEER)
    if not (isinstance(error, getattr(torch.distributed, "DistError", ())) or said_by_gloo):
        return None
    text = re.sub(r"^\[[^\]]*\]\s*", "", text).split(". ")[0].rstrip(".")  # gloo's "[file.cc:123] what. Hint..."
    where = _RUN_SETTINGS.get("checkpoints")
    return (
        f"lost contact with another process of this run ({text[:160]}): a process or its node stopped, or did not "
        f"answer within --process_group_timeout {_RUN_SETTINGS.get('timeout', PREPARATION_TIMEOUT_S):g} s; resume with "
        "--resume_from_checkpoint latest" + (f" (checkpoints in {where})" if where else "")
    )


@dataclass
class RecipeRun:
    """What a recipe's stages share once the run is set up: flags, accelerator, the prepared model, tokenizer,
    training loop, checkpoints and metrics log. A recipe subclasses it with its own data (stream, labels, ...)."""

    args: RecipeArguments
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
            "flags": run_flags(self.args),
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
