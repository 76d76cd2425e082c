"""What a run has done so far: its step, time, curves and tracking, the per-step bookkeeping kept
on the device, and the checkpoint that holds them with the components' own state."""

from __future__ import annotations

import time
from dataclasses import InitVar, dataclass, field
from typing import Any

import torch
from torch import Tensor

from common.finite import NonFiniteGradient

from .plan import StepPlan
from .step_time import StepTimes


@dataclass
class RunState:
    """A run's progress (the rest of what a checkpoint holds: :func:`checkpoint_state`)."""

    device: InitVar[torch.device]
    step: int = 0
    elapsed: float = 0.0
    window_steps: int = 0  # steps since the last log (their loss sum: window_loss)
    non_comm: list[float] = field(default_factory=list)  # per step: this rank's time outside communication
    train_rows: list[dict[str, Any]] = field(default_factory=list)
    eval_rows: list[dict[str, Any]] = field(default_factory=list)
    run_id: str | None = None
    tracking_partial: bool = False  # a previous attempt lost its tracking mid-run
    stopped: bool = False  # stop_at reached (a time-to-target run ends at that evaluation)
    resumed_at: list[int] = field(default_factory=list)  # the steps this run was resumed from (restarts)
    started_at: float = field(default_factory=time.time)  # unix seconds of its first start (kept on resume)
    step_seconds: float = 0.0  # the last step's time (StepInfo.seconds)
    # On the device, read at log steps and checkpoints only (no host read inside a step): the loss
    # sum since the last log, the first step whose loss was not finite (0: none) and that loss.
    window_loss: Tensor = field(init=False)
    first_bad_step: Tensor = field(init=False)
    first_bad_loss: Tensor = field(init=False)
    # The first step with a gradient that was not finite (0: none) and that tensor's position among
    # the step's gradients (trainable parameters that had one: ``grad_names``), on the device.
    first_bad_grad_step: Tensor = field(init=False)
    first_bad_grad_index: Tensor = field(init=False)
    grad_names: list[str] = field(default_factory=list)
    step_times: StepTimes = field(init=False)  # feeds non_comm, resolved with the window

    def __post_init__(self, device: torch.device) -> None:
        self.window_loss = torch.zeros((), dtype=torch.float64, device=device)
        self.first_bad_step = torch.zeros((), dtype=torch.int64, device=device)
        self.first_bad_loss = torch.zeros((), dtype=torch.float64, device=device)
        self.first_bad_grad_step = torch.zeros((), dtype=torch.int64, device=device)
        self.first_bad_grad_index = torch.zeros((), dtype=torch.int64, device=device)
        self.step_times = StepTimes(device)

    def add_to_window(self, loss: Tensor) -> None:
        """Add this step's loss to the window's sum and, where it is the first loss that is not
        finite, remember the step and the loss: all on the device, without waiting for it."""
        loss = loss.to(self.window_loss.device, torch.float64)
        self.window_loss += loss
        self.window_steps += 1
        first_bad = torch.isfinite(loss).logical_not_().logical_and_(self.first_bad_step == 0)
        self.first_bad_step = torch.where(first_bad, self.step, self.first_bad_step)
        self.first_bad_loss = torch.where(first_bad, loss, self.first_bad_loss)

    def add_gradient_check(self, names: list[str], grads: list[Tensor]) -> None:
        """Where a gradient of this step is the first that is not finite, remember the step and
        which tensor: on the device (one ``_foreach_norm``: a NaN or inf propagates into a norm)."""
        bad = torch.stack(torch._foreach_norm(grads)).isfinite().logical_not_()
        first = bad.any().logical_and_(self.first_bad_grad_step == 0)
        self.first_bad_grad_step = torch.where(first, self.step + 1, self.first_bad_grad_step)
        self.first_bad_grad_index = torch.where(first, bad.to(torch.int8).argmax(), self.first_bad_grad_index)
        self.grad_names = names

    def any_bad(self) -> Tensor:
        """1.0 where this rank saw a gradient or a loss that was not finite (summed over ranks at
        a log step, so that every rank stops together)."""
        return ((self.first_bad_grad_step > 0) | (self.first_bad_step > 0)).to(self.window_loss.dtype)

    def settle(self) -> None:
        """Read what the steps left on the device: NonFiniteGradient naming the first step and
        tensor whose gradient was not finite, FloatingPointError naming the first step whose loss was
        not finite (before anything is logged or checkpointed as good), then the steps' times."""
        bad_grad, bad_step = int(self.first_bad_grad_step), int(self.first_bad_step)
        if bad_step and (not bad_grad or bad_step <= bad_grad):  # the loss went first: name it
            raise FloatingPointError(
                f"training loss became {float(self.first_bad_loss)} at step {bad_step}: lower lr"
            )
        if bad_grad:
            name = self.grad_names[int(self.first_bad_grad_index)]
            raise NonFiniteGradient(
                f"gradient of {name} is not finite at step {bad_grad}: lower lr, clip gradients "
                f"(grad_clip_norm), or look for a NaN or inf in the data or the loss"
            )
        self.non_comm.extend(self.step_times.take())


def checkpoint_state(plan: StepPlan, state: RunState, tracking_partial: bool) -> dict[str, Any]:
    """What a checkpoint holds (its keys are the format: a resume reads checkpoints written before)."""
    state.settle()
    return {
        "step": state.step,
        "model": plan.model.state_dict(),
        "optimizer": plan.optimizer.state_dict(),
        "scheduler": plan.scheduler.state_dict(),
        "strategy": plan.strategy.state_dict(),
        "torch_rng": torch.get_rng_state(),
        "elapsed": state.elapsed,
        "window": [float(state.window_loss), state.window_steps],  # loss sum, steps since the last log
        "non_comm": state.non_comm,
        "train_rows": state.train_rows,
        "eval_rows": state.eval_rows,
        "mlflow_run_id": state.run_id,
        "tracking_partial": tracking_partial,
        "resumed_at": state.resumed_at,
        "started_at": state.started_at,
        "loss_scale": plan.loss_scaler.state_dict() if plan.loss_scaler is not None else None,
        "stopped": state.stopped,  # stop_at reached: a resume of the last checkpoint trains no further
    }


def restore(plan: StepPlan, state: RunState, saved: dict[str, Any]) -> None:
    """Continue from a checkpoint (:func:`checkpoint_state`): the components' state and the progress."""
    plan.model.load_state_dict(saved["model"])
    plan.optimizer.load_state_dict(saved["optimizer"])
    plan.scheduler.load_state_dict(saved["scheduler"])
    plan.strategy.load_state_dict(saved["strategy"])
    if plan.loss_scaler is not None:
        plan.loss_scaler.load_state_dict(saved["loss_scale"])
    torch.set_rng_state(saved["torch_rng"])
    state.step, state.elapsed = saved["step"], saved["elapsed"]
    state.window_loss.fill_(saved["window"][0])
    state.window_steps = int(saved["window"][1])
    state.non_comm = saved.get("non_comm", [])
    state.train_rows, state.eval_rows = saved["train_rows"], saved["eval_rows"]
    state.run_id = saved["mlflow_run_id"]
    state.tracking_partial = bool(saved.get("tracking_partial", False))
    state.resumed_at = [*saved.get("resumed_at", []), state.step]
    state.started_at = float(saved.get("started_at", state.started_at))
    state.stopped = bool(saved.get("stopped", False))
