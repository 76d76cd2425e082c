"""The steps of a run over its built components (:class:`~trainer.plan.Loop`): train, log,
evaluate, call back, checkpoint. Nothing here reads the run's config: run assembly
(:mod:`trainer.run`) built everything a step applies, once."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor

from common.config import stop_reached
from common.finite import checked_by_caller

from .checkpoint import Checkpointer
from .data.loader import epoch_loader
from .evaluate import evaluate
from .outputs import save_model
from .plan import BatchSource, Loop, StepPlan
from .state import RunState, checkpoint_state
from .tracking import Tracker

log = logging.getLogger(__name__)


@dataclass
class StepInfo:
    """What callbacks see after each step (rank-local except where noted)."""

    step: int
    total_steps: int
    epoch: int
    rank: int
    step_loss: Tensor  # this rank's loss at this step, on the device (see ``loss``)
    logged: dict[str, float] = field(default_factory=dict)  # mean-over-ranks values, on log steps
    last: bool = False  # the run's last step (total_steps, or where stop_at was reached)
    seconds: float = 0.0  # this step's time on this rank, as the loop times it (not the evaluation)

    @property
    def loss(self) -> float:
        """This rank's loss at this step. Reading it waits for the device (the loop itself reads
        losses only at log steps): a callback that needs no per-step value reads ``logged``."""
        return float(self.step_loss)


Callback = Callable[[StepInfo], None]


def run_steps(
    loop: Loop, state: RunState, checkpointer: Checkpointer, tracker: Tracker, callbacks: Sequence[Callback]
) -> None:
    """Every step from ``state.step`` on: train, log, evaluate, call back, checkpoint."""
    plan = loop.plan

    def checkpoint(complete: bool = False) -> None:
        tracker.flush(through_step=state.step)  # first: the checkpoint records whether that failed
        checkpointer.save(state.step, checkpoint_state(plan, state, tracker.partial), complete=complete)

    plan.model.train()
    batches = _Batches(loop.batches)
    while state.step < loop.total_steps and not state.stopped:
        start = time.perf_counter()  # a step's time includes drawing its epoch's batches
        epoch, index = divmod(state.step, plan.steps_per_epoch)
        batch, loaded = batches.at(epoch, index, state.step)
        loss = _train_step(plan, state, batch, start, loaded)
        info = _after_step(loop, state, tracker, epoch, loss)
        for callback in callbacks:
            callback(info)
        if state.stopped:
            log.info(
                "step %d: %s reached stop_at %s; stopping", state.step, state.eval_rows[-1], loop.stop_at
            )
            break
        if state.step % loop.checkpoint_every == 0 and state.step < loop.total_steps:
            checkpoint()
    # The last step's checkpoint, not yet marked complete: train() marks it once the outputs are
    # written, so a kill in between resumes here and writes them without retraining. A run resumed
    # from this very checkpoint has it already.
    if checkpointer.resumed != state.step:
        checkpoint()


class _Batches:
    """The loop's place in its batch source: the current epoch's batches and, with data workers,
    the loader decoding them ahead."""

    def __init__(self, source: BatchSource) -> None:
        self.source = source
        self.batches: list[Tensor] = []
        self.epoch = -1
        self.loaded: Iterator[tuple[Tensor, Tensor]] | None = None

    def at(self, epoch: int, index: int, step: int) -> tuple[Tensor, tuple[Tensor, Tensor] | None]:
        """Step ``step``'s batch of indices (``index`` of ``epoch``) and, where a DataLoader decodes
        them, its examples."""
        source = self.source
        if epoch != self.epoch:
            if source.epoch_batches is not None:
                self.batches = source.epoch_batches(epoch)
            self.epoch = epoch
            if hasattr(source.train_set, "set_epoch"):  # augments as it decodes (ImageNet)
                source.train_set.set_epoch(epoch)
            if source.workers is not None:  # the epoch's batches from this step on, decoded ahead
                self.loaded = epoch_loader(
                    source.train_set,
                    self.batches[index:],
                    workers=source.workers,
                    pin_memory=source.pin_memory,
                )
        batch = self.batches[index] if source.drawn_batch is None else source.drawn_batch(step)
        return batch, next(self.loaded) if self.loaded is not None else None


def _train_step(
    plan: StepPlan, state: RunState, batch: Tensor, start: float, loaded: tuple[Tensor, Tensor] | None = None
) -> Tensor:
    """One step on the batch of indices ``batch`` (timed from ``start``; ``loaded``: its examples,
    already decoded by a DataLoader); returns this rank's loss, on the device.

    No device value is read on the host here (the loss is checked and summed on the device, read at
    log steps), except fp16's skip decision (:meth:`LossScaler.unscale_`)."""
    ctx, strategy = plan.ctx, plan.strategy
    state.step_times.start(strategy.stats)
    strategy.set_epoch(state.step / plan.steps_per_epoch)  # e.g. DGC's warm-up densities
    x, y = loaded if loaded is not None else plan.train_set.get_batch(batch)
    x, y = x.to(ctx.device, non_blocking=True), y.to(ctx.device, non_blocking=True)
    if plan.augment is not None:
        x = plan.augment(x, state.step)
    if plan.channels_last and x.dim() == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    plan.optimizer.zero_grad(set_to_none=True)
    scaler = plan.loss_scaler
    with plan.autocast(), checked_by_caller():
        loss = strategy.forward_backward(
            plan.model, x, y, plan.loss_fn if scaler is None else scaler.scaled(plan.loss_fn)
        )
    finite = True
    if scaler is None:  # (fp16: a non-finite gradient skips the step, below)
        _check_gradients(plan, state)
    if scaler is not None:  # fp16: true gradients before anything is clipped or sent; all ranks agree
        loss = loss / scaler.scale
        finite = scaler.unscale_(plan.trainable, ctx.device)
        scaler.update(finite)
    if finite:
        if plan.grad_clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(plan.trainable, plan.grad_clip_norm)
        with checked_by_caller():
            strategy.after_backward(plan.model)
        plan.optimizer.step()
    plan.scheduler.step()  # the schedule keeps its length; a skipped step is a step with no update
    if finite:
        strategy.after_step(plan.model)
    state.step += 1
    loss = loss.detach()
    state.add_to_window(loss)
    step_seconds = time.perf_counter() - start
    state.step_seconds = step_seconds
    state.elapsed += step_seconds
    state.step_times.stop(strategy.stats, step_seconds)
    return loss


def _check_gradients(plan: StepPlan, state: RunState) -> None:
    """Remember the first NaN or inf gradient (this rank's own, or the mean a DDP hook already
    wrote) and which tensor, on the device; the next log step stops every rank, naming it."""
    named = [
        (n, p.grad) for n, p in zip(plan.trainable_names, plan.trainable, strict=True) if p.grad is not None
    ]
    if named:
        state.add_gradient_check([n for n, _ in named], [g for _, g in named])


def _after_step(loop: Loop, state: RunState, tracker: Tracker, epoch: int, loss: Tensor) -> StepInfo:
    """Log and evaluate where this step is due to; what the callbacks see."""
    logged: dict[str, float] = {}
    if state.step % loop.log_every == 0 or state.step == loop.total_steps:
        logged = _log_step(loop.plan, state, tracker, epoch)
    if state.step % loop.eval_every == 0 or state.step == loop.total_steps:
        logged.update(_evaluate_step(loop, state, tracker, epoch))
    return StepInfo(
        step=state.step,
        total_steps=loop.total_steps,
        epoch=epoch,
        rank=loop.plan.ctx.rank,
        step_loss=loss,
        logged=logged,
        last=state.step == loop.total_steps or state.stopped,
        seconds=state.step_seconds,
    )


def _log_step(plan: StepPlan, state: RunState, tracker: Tracker, epoch: int) -> dict[str, float]:
    """The training curve's row: the mean loss over ranks since the last log, lr, bits, seconds."""
    window = torch.stack(
        [state.window_loss, state.window_loss.new_tensor(float(state.window_steps)), state.any_bad()]
    )
    if plan.ctx.world_size > 1:
        dist.all_reduce(window)  # instrumentation: not counted in CommStats
    state.settle()  # after the all-reduce: a rank that raises here does not leave the others waiting
    mean_loss = float(window[0] / window[1])
    if not math.isfinite(mean_loss):
        raise FloatingPointError(
            f"training loss became {mean_loss} on another rank by step {state.step}: lower lr"
        )
    if float(window[2]) > 0:
        raise FloatingPointError(
            f"a gradient or the training loss became NaN or inf on another rank by step {state.step}"
        )
    state.window_loss.zero_()
    state.window_steps = 0
    stats = plan.strategy.stats.summary()
    logged = {
        "train_loss": mean_loss,
        "lr": float(plan.scheduler.get_last_lr()[0]),
        "bits_per_step": stats["bits_per_step"],
        "wall_seconds": state.elapsed,
        "communicate_seconds": stats["communicate_seconds"],
        **plan.strategy.log_values(),
    }
    state.train_rows.append({"step": state.step, "epoch": epoch, **logged})
    tracker.log_metrics(logged, state.step)
    return logged


def _evaluate_step(loop: Loop, state: RunState, tracker: Tracker, epoch: int) -> dict[str, float]:
    """Evaluate the model as the strategy defines it (DEF's virtual iterate, gossip's average);
    after the last step rank 0 also saves it (what the evaluate stage measures on the whole split)."""
    plan = loop.plan
    with plan.strategy.evaluating(plan.model) as model:
        result = evaluate(
            model,
            loop.test_set,
            plan.ctx,
            batch_size=loop.eval_batch_size,
            channels_last=plan.channels_last,
            autocast=plan.autocast,
        )
        if state.step == loop.total_steps and plan.ctx.is_main:
            save_model(loop.artifacts_dir, model)
    # wall_seconds: training time so far (steps only, not evaluation): time-to-accuracy
    state.eval_rows.append({"step": state.step, "epoch": epoch, "wall_seconds": state.elapsed, **result})
    tracker.log_metrics(result, state.step)
    state.stopped = stop_reached(loop.stop_at, result)  # the same result on every rank
    return result
