"""Checkpoints and the final model: written whole or not at all on every process, checked before a resume."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from accelerate.utils import DistributedType
from safetensors.torch import load_file, save_file

from ..atomic_io import publish_folder, replace_folder
from ..errors import RecipeError
from ..faults import crash_point
from ..integrity import MANIFEST, SaveError, folder_size, save_error, verify_checkpoint, write_manifest
from .arguments import RecipeArguments


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


@contextlib.contextmanager
def own_class(model):
    """The model as its own class for a while. FSDP2 (fully_shard) gives a sharded module a class of its own,
    FSDP<Name> with FSDPModule first among its bases, which save_pretrained would name in the saved auto_map and whose
    module (torch's) it would copy as the model's code."""
    cls = type(model)
    fsdp = sys.modules.get("torch.distributed.fsdp")  # imported where a model was sharded
    if fsdp is None or not isinstance(model, fsdp.FSDPModule):
        yield model
        return
    (model.__class__,) = [base for base in cls.__bases__ if base is not fsdp.FSDPModule]
    try:
        yield model
    finally:
        model.__class__ = cls


def tie_gathered(model, weights):
    """Give the names of one parameter (tied: the LM head's weight and the input embedding) one tensor in `weights`
    again, as save_pretrained finds ties by storage; weights gathered from shards are a tensor a name."""
    first = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if name in weights:
            weights[name] = weights[first.setdefault(id(param), name)]


def gathered_weights(accelerator, model) -> dict | None:
    """Under FSDP, the model's whole weights, gathered by accelerator.get_state_dict (which every process must call)
    onto the main process (the others get none); None elsewhere, where save_pretrained reads the model's own."""
    if accelerator.distributed_type != DistributedType.FSDP:
        return None
    return accelerator.get_state_dict(model)


def save_final_model(accelerator, model, tokenizer, output_dir, *, config_updates=None):
    """save_pretrained of the unwrapped model and the tokenizer into output_dir, file by file atomically.
    `config_updates` are set on the saved config only (training-only fields back to their inference values). Under
    FSDP every process takes part in gathering the weights (`gathered_weights`) and the main process saves them."""
    accelerator.wait_for_everyone()
    weights = gathered_weights(accelerator, model)
    failure = None
    if accelerator.is_main_process:
        model = accelerator.unwrap_model(model, keep_torch_compile=False)
        if weights is not None:
            tie_gathered(model, weights)
        needed = sum(t.numel() * t.element_size() for t in (weights or model.state_dict()).values())
        config_updates = config_updates or {}
        before = {k: getattr(model.config, k) for k in config_updates}
        tmp = Path(output_dir, ".final.tmp")
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            try:
                for key, value in config_updates.items():
                    setattr(model.config, key, value)
                with own_class(model):  # save_pretrained empties the dict it is given: `needed` is counted before
                    model.save_pretrained(tmp, state_dict=weights, safe_serialization=True)
            finally:
                for key, value in before.items():
                    setattr(model.config, key, value)
            tokenizer.save_pretrained(tmp)
            crash_point("final_model_written")
        except Exception as error:  # noqa: BLE001 (a full disk: OSError, RuntimeError, SafetensorError); nothing reached output_dir
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


def load_final_model(accelerator, model, output_dir):
    """The weights save_final_model wrote into output_dir, back into the prepared model on every process: under FSDP
    each process takes its shards of them (torch's set_model_state_dict), elsewhere load_state_dict."""
    weights = load_file(str(Path(output_dir, "model.safetensors")))
    if accelerator.distributed_type == DistributedType.FSDP:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True))
    else:
        accelerator.unwrap_model(model, keep_torch_compile=False).load_state_dict(weights)


def read_json(path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def flag_differences(args: RecipeArguments, saved_flags: dict) -> list[str]:
    keys = args.RESUME_MUST_MATCH
    return [
        f"--{k}: {saved_flags.get(k)!r} in the checkpoint, {getattr(args, k)!r} now"
        for k in keys
        if k in saved_flags and saved_flags[k] != getattr(args, k)
    ]


def resplittable(checkpoint: Path) -> bool:
    """Whether the checkpoint's data state re-splits over another number of processes (a pretraining stream's: see
    `resplit_rank_states`); others resume under their own number of processes only."""
    state = read_json(checkpoint / "rank0_state.json")
    return isinstance(state, dict) and isinstance(state.get("stream"), dict) and "layout" in state["stream"]


def saved_under_fsdp(checkpoint: Path) -> bool:
    """Whether accelerate saved the checkpoint's model under FSDP (pytorch_model_fsdp*: its shards, or its full state
    dict), which it loads back under FSDP only."""
    return any(checkpoint.glob("pytorch_model_fsdp*"))


def check_resume(
    args: RecipeArguments, checkpoint: Path, *, num_processes: int | None = None, fsdp: bool | None = None
):
    """Refuse a resume whose flags change the model, data or task (`RESUME_MUST_MATCH`), naming each difference, or
    (`fsdp`: whether this run shards the model by FSDP) that takes an FSDP checkpoint out of FSDP or the other way.
    Under another number of processes a re-splittable checkpoint resumes at the same global batch
    (--per_device_train_batch_size x processes), its per-process batch changed to keep it."""
    state = read_json(checkpoint / "trainer_state.json") or {}
    saved = state.get("flags", {})
    differences = flag_differences(args, saved)
    if fsdp is not None and saved_under_fsdp(checkpoint) != fsdp:
        differences.append(
            "the checkpoint was saved under FSDP and this run does not use it (resume under accelerate's FSDP config)"
            if fsdp is False
            else "the checkpoint was saved without FSDP and this run uses it (resume without FSDP)"
        )
    before = state.get("num_processes")
    if num_processes not in (None, before) and before and resplittable(checkpoint):
        batch = "--per_device_train_batch_size"
        differences = [d for d in differences if not d.startswith(f"{batch}:")]
        rows = saved.get("per_device_train_batch_size", args.per_device_train_batch_size) * before
        now = args.per_device_train_batch_size
        if now * num_processes != rows:
            per_process, halves = rows // num_processes, 2 if getattr(args, "bi_data", False) else 1
            hint = (
                f"pass {batch} {per_process}"
                if rows % num_processes == 0 and per_process % halves == 0
                else f"{rows} rows do not split evenly over {num_processes} processes"
            )
            differences.append(
                f"the global batch ({batch} x processes) is {rows // before} x {before} = {rows} in the checkpoint, "
                f"{now} x {num_processes} = {now * num_processes} now ({hint})"
            )
    if differences:
        raise RecipeError(
            f"cannot resume from {checkpoint}: "
            + "; ".join(differences)
            + " (pass --overwrite_output_dir to start a new run instead)"
        )


def check_resume_model(checkpoint: Path, model_fields: dict, *, num_processes: int):
    """After the model is built (before tokenizing the data): its shape, vocabulary and task must be the
    checkpoint's, and so must the number of processes unless the checkpoint's data state re-splits (`resplittable`)."""
    state = read_json(checkpoint / "trainer_state.json") or {}
    saved = state.get("model", {})
    differences = [
        f"{k}: {saved[k]!r} in the checkpoint, {v!r} now"
        for k, v in model_fields.items()
        if k in saved and saved[k] != v
    ]
    if state.get("num_processes", num_processes) != num_processes and not resplittable(checkpoint):
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
        """(trainer_state, this rank's state, this rank's tensors) after accelerator.load_state. A checkpoint of
        another number of processes (`resplittable`) is re-split for this one (`resplit_rank_states`), the learning
        rate schedule's position converted (a prepared scheduler steps once per process per optimizer step)."""
        acc = self.accelerator
        trainer_state = json.loads((path / "trainer_state.json").read_text())
        before = trainer_state.get("num_processes", acc.num_processes)
        if before != acc.num_processes and resplittable(path):
            acc.load_state(str(path))
            _rescale_schedules(acc, before)
            states = [json.loads((path / f"rank{q}_state.json").read_text()) for q in range(before)]
            tensors = [
                load_file(str(f)) if (f := path / f"rank{q}_tensors.safetensors").is_file() else {}
                for q in range(before)
            ]
            rank_state, rank_tensors = resplit_rank_states(
                states, tensors, rank=acc.process_index, num_processes=acc.num_processes
            )
            acc.print(
                f"{path}: the rows of {before} process{'es' if before > 1 else ''} re-split over {acc.num_processes} "
                "(the same global batch; the choice of B segments and of targets draws anew from here)"
            )
            return trainer_state, rank_state, {k: v.to(device) for k, v in rank_tensors.items()}
        rank_file = path / f"rank{acc.process_index}_state.json"
        if not rank_file.is_file():
            raise RecipeError(
                f"{path}: no state for process {acc.process_index}; resume with the same number of processes"
            )
        acc.load_state(str(path))
        tensors_file = path / f"rank{acc.process_index}_tensors.safetensors"
        # read on the CPU, then moved: safetensors refuses an indexed CPU device ("cpu:0", a multi-process CPU run's)
        tensors = {k: v.to(device) for k, v in load_file(str(tensors_file)).items()} if tensors_file.is_file() else {}
        return json.loads((path / "trainer_state.json").read_text()), json.loads(rank_file.read_text()), tensors


def resplit_rank_states(states: list[dict], tensors: list[dict], *, rank: int, num_processes: int) -> tuple[dict, dict]:
    """Process `rank` of `num_processes`'s (state, tensors) from those of every process of a pretraining checkpoint
    saved by another number of processes, at the same global batch: the stream's rows re-split
    (`PretrainingStream.resplit_state_dicts`), each memory row (`mems.{i}`, batch-first) following its stream row, and
    the collator's generator seeded anew from the saved ones (it drew one stream per process)."""
    from ..data import PretrainingStream

    unknown = sorted({k for s in states for k in s} - {"stream", "collator"})
    unknown += sorted({k for t in tensors for k in t if not re.fullmatch(r"mems\.\d+", k)})
    if unknown:
        raise RecipeError(
            f"cannot re-split this checkpoint's per-process state {unknown} over {num_processes} processes"
        )
    stream, sources = PretrainingStream.resplit_state_dicts(
        [s["stream"] for s in states], rank=rank, world_size=num_processes
    )
    state = {"stream": stream}
    if "collator" in states[0]:
        generators = [s["collator"].get("generator_state") for s in states]
        state["collator"] = {"seed": None, "generator_state": None}
        if generators[0] is not None:
            digest = hashlib.sha256(json.dumps([generators, rank, num_processes]).encode()).digest()
            seed = int.from_bytes(digest[:8], "little") >> 1
            state["collator"] = {
                "seed": seed,
                "generator_state": torch.Generator().manual_seed(seed).get_state().tolist(),
            }
    names = sorted(tensors[0], key=lambda k: int(k.split(".")[1]))
    resplit = {name: torch.cat([tensors[q][name][i : i + 1] for q, i in sources]) for name in names}
    return state, resplit


def _rescale_schedules(accelerator, before: int):
    """A prepared scheduler steps once per process per optimizer step: its position, saved by `before` processes, in
    steps of this run's number (the learning rates recomputed: every schedule here is a LambdaLR)."""
    for prepared in accelerator._schedulers:
        scheduler = getattr(prepared, "scheduler", prepared)
        if not hasattr(scheduler, "lr_lambdas"):
            raise RecipeError(f"cannot resume a {type(scheduler).__name__} schedule under another number of processes")
        scheduler.last_epoch = scheduler.last_epoch // before * accelerator.num_processes
        lrs = [base * fn(scheduler.last_epoch) for base, fn in zip(scheduler.base_lrs, scheduler.lr_lambdas)]
        for group, lr in zip(scheduler.optimizer.param_groups, lrs):
            group["lr"] = lr
        scheduler._last_lr = lrs
