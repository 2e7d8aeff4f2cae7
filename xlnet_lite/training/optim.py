"""The optimizer, its learning-rate schedule, and the wall-clock budget that can end the schedule instead."""

from __future__ import annotations

import math
import re

import torch
from transformers import get_scheduler
from transformers.trainer_pt_utils import get_parameter_names

from ..errors import RecipeError
from .arguments import RecipeArguments


def warmup_steps(args: RecipeArguments, max_steps: int) -> int:
    """--warmup_ratio of the run, else --num_warmup_steps; a warmup longer than the run is refused."""
    steps = math.ceil(args.warmup_ratio * max_steps) if args.warmup_ratio else args.num_warmup_steps
    if steps > max_steps:
        raise RecipeError(
            f"--num_warmup_steps ({steps}) is longer than the run ({max_steps} optimizer steps): the learning rate "
            f"would never reach --learning_rate; lower it or pass --warmup_ratio (e.g. 0.1)"
        )
    return steps


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
    args: RecipeArguments,
    model,
    *,
    max_steps,
    num_processes,
    layerwise_lr_decay=1.0,
    budget: "TimeBudget | None" = None,
):
    """Fused AdamW over `parameter_groups`, and transformers' schedule over `max_steps` (or, with a `budget`, one that
    decays to zero at the budget's deadline)."""
    optimizer = make_adamw(
        model,
        learning_rate=args.learning_rate,
        weight_decay=args.weight_decay,
        eps=args.adam_epsilon,
        layerwise_lr_decay=layerwise_lr_decay,
    )
    if budget is not None:
        return optimizer, make_budget_scheduler(optimizer, budget, num_processes=num_processes)
    # A prepared scheduler steps once per process per optimizer step.
    scheduler = get_scheduler(
        args.lr_scheduler_type,
        optimizer,
        num_warmup_steps=warmup_steps(args, max_steps) * num_processes,
        num_training_steps=max(max_steps, 1) * num_processes,
    )
    return optimizer, scheduler


class TimeBudget:
    """A wall-clock budget for the optimizer steps (`--max_train_minutes`): the learning rate warms up over the first
    `warmup_steps` steps, then decays to zero at the deadline (linear or cosine in the fraction of the budget spent,
    as "How to Train BERT with an Academic Budget" and "Cramming" tie the schedule to the time left) or stays at its
    peak (constant_with_warmup), and training stops there. The clock counts the seconds inside optimizer steps
    (`TrainLoop.elapsed`, agreed across processes, kept in checkpoints), not evaluation or checkpoint writing. Steps
    during which `torch.compile` compiled count toward the deadline but not toward the schedule: the decay runs over
    the time left after them, so compiling does not use up a short run's schedule. A run's step count then depends on
    the machine's speed, so two runs are not bit-identical as step-bounded ones are."""

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
