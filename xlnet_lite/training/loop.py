"""Optimizer steps: gradient accumulation, clipping, the schedule, the non-finite guard and the metrics window."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable

import torch

from ..faults import crash_point
from . import optim  # compiled_frames is looked up at each step, so a test can replace it
from .arguments import RecipeArguments


class TrainLoop:
    """Optimizer steps (gradient accumulation, clipping, schedule, non-finite guard) and their metrics.

    A metrics record's tokens_per_second is the training throughput since the previous record: the tokens of its steps
    over the wall-clock time between the records (data, collator, logging included) less the time spent in `paused()`
    blocks (evaluation, checkpoints), which train nothing and are timed on their own.
    """

    def __init__(
        self, args: RecipeArguments, accelerator, model, optimizer, scheduler, *, checkpoints_dir, budget=None
    ):
        self.args, self.accelerator, self.model = args, accelerator, model
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
        frames = optim.compiled_frames() if self.budget is not None else 0
        acc, start, losses, skip, ticked = self.accelerator, time.perf_counter(), [], False, None
        for compute_loss in micro_batches:
            with acc.accumulate(self.model):
                loss = compute_loss()
                skip = skip or self._nonfinite(loss, step)
                if not skip:
                    acc.backward(loss)
                    losses.append(loss.detach().float())
                    if acc.sync_gradients:
                        if self.args.max_grad_norm > 0:
                            acc.clip_grad_norm_(self.model.parameters(), self.args.max_grad_norm)
                        self.optimizer.step()
                        if self.budget is not None:  # the next learning rate from the clock at this step's end
                            took = time.perf_counter() - start
                            self._tick_budget(self.elapsed + took, took if optim.compiled_frames() > frames else 0.0)
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
        if not self.args.skip_nonfinite:
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
