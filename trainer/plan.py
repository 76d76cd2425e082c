"""What the loop runs, built once from the run's config (:func:`trainer.run.build_loop`): the
components, the values and the callables a step applies. The step reads these, never the config."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from common.strategies import SyncStrategy

from .components import LossFn
from .data import Dataset
from .distributed import DistContext
from .loss_scale import LossScaler
from .precision import AutocastFactory


@dataclass(frozen=True)
class StepPlan:
    """One training step's components and recipe (what every method alike gets)."""

    ctx: DistContext
    train_set: Dataset
    model: nn.Module
    strategy: SyncStrategy
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    trainable: list[nn.Parameter]  # what local gradient clipping clips
    trainable_names: list[str]  # their names (a non-finite gradient's error names it)
    loss_fn: LossFn  # the training loss (label smoothing included)
    autocast: AutocastFactory  # the compute precision of a forward and its backward
    augment: Callable[[Tensor, int], Tensor] | None  # (images, step) -> augmented; None: not augmented
    grad_clip_norm: float | None  # local clipping, before anything is sent
    channels_last: bool  # image batches in channels_last memory format (the model is already)
    loss_scaler: LossScaler | None  # precision fp16
    steps_per_epoch: int


@dataclass(frozen=True)
class BatchSource:
    """Where each step's example indices come from: an epoch's batches (``sampling: epochs``), or
    one draw per step (``sampling: draws``)."""

    train_set: Dataset
    epoch_batches: Callable[[int], list[Tensor]] | None  # this rank's batches of an epoch; None: draws
    drawn_batch: Callable[[int], Tensor] | None  # this rank's batch of a run step; None: epochs
    workers: int | None  # data_workers: an epoch's batches decoded ahead by a DataLoader
    pin_memory: bool


@dataclass(frozen=True)
class Loop:
    """Everything the loop runs: the step, its batches, when to log, evaluate and checkpoint."""

    plan: StepPlan
    batches: BatchSource
    test_set: Dataset
    eval_batch_size: int
    total_steps: int
    log_every: int
    eval_every: int
    checkpoint_every: int
    stop_at: Mapping[str, float]  # an evaluation that reaches it ends the run ({}: none)
    artifacts_dir: Path  # where rank 0 saves the model of the last evaluation
