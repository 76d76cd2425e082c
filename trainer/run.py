"""A run assembled from its ``RunConfig``: :func:`train` builds every component once (model,
optimizer, strategy, data, schedule, precision, tracker), resumes from the last checkpoint, runs the
loop (:mod:`trainer.loop`, which reads only what was built here) and writes the outputs."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from common.comm.collectives import get_world_size
from common.config import RunConfig
from common.finite import NonFiniteMetric
from common.methods import effective_config
from common.strategies import SyncStrategy

from .checkpoint import Checkpointer
from .components import (
    augmenter,
    cross_entropy_loss,
    default_strategy,
    draw_sampler,
    epoch_sampler,
    load_data,
    lr_schedule,
    model_for,
    optimizer_for,
    prepare_model,
)
from .data import Dataset
from .distributed import DistContext, barrier, init_from_env, is_collective_timeout, seed_everything
from .fileio import check_writable
from .loop import Callback, run_steps
from .loss_scale import LossScaler
from .outputs import final_metrics, non_finite_final, run_info, write_outputs
from .paths import REPO_ROOT
from .plan import BatchSource, Loop, StepPlan
from .precision import autocast_factory, compute_precision
from .state import RunState, restore
from .tracking import Tracker, loaded_git_sha

log = logging.getLogger(__name__)


def train(
    config: RunConfig,
    out_dir: str | Path,
    *,
    experiment: str | None = None,
    run_name: str = "run",
    tags: dict[str, str] | None = None,
    strategy: SyncStrategy | None = None,
    callbacks: Sequence[Callback] = (),
    ctx: DistContext | None = None,
    data: tuple[Dataset, Dataset] | None = None,
    artifacts_dir: str | Path | None = None,
) -> dict[str, float]:
    """Train ``config`` on the ranks of the current process group; return the final metrics.

    ``experiment`` names the MLflow experiment (None: no tracking). ``strategy`` defaults to the
    one ``config.strategy`` names (:func:`default_strategy`). ``data``: the training and test splits
    already loaded as ``config`` would load them (a stage that trains several runs on the same data
    loads it once; sparse AxoNN's stage measures each run's memory without it). ``artifacts_dir``:
    where ``model.pt`` and ``ckpt/`` go (default ``out_dir``).

    A NaN or inf in the last evaluation raises :class:`~common.finite.NonFiniteMetric` on every
    rank once rank 0 has written the outputs (MLflow: FAILED); a launcher does not retry it."""
    config = effective_config(config)  # the settings its strategy forces, as they are run and logged
    ctx = ctx or init_from_env(timeout_s=config.collective_timeout_s)
    if ctx.world_size != get_world_size():
        raise RuntimeError(
            f"process group has {get_world_size()} ranks but the context says {ctx.world_size}"
        )
    out_dir = Path(out_dir)
    artifacts = Path(artifacts_dir) if artifacts_dir is not None else out_dir
    if ctx.rank == 0:  # a read-only output folder fails now, naming it, not at the run's end
        check_writable(out_dir, "output folder")
    precision = compute_precision(config, ctx.device)
    loop = build_loop(config, ctx, strategy, data, precision, artifacts_dir=artifacts)
    state = RunState(ctx.device)
    checkpointer = _resumed(config, ctx, loop, state)
    all_tags = _run_tags(config, ctx, precision, run_name, tags)
    tracker = _start_tracking(config, ctx, state, experiment, run_name, all_tags)
    try:
        run_steps(loop, state, checkpointer, tracker, callbacks)
    except BaseException as error:
        tracker.finish("KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED")
        if is_collective_timeout(error):
            _log_timeout(ctx, config.collective_timeout_s, state.step + 1, error)
        raise
    metrics = final_metrics(loop, state)
    problem = non_finite_final(state)  # the same on every rank (the evaluation is summed over them)
    if ctx.is_main:
        sha = all_tags["git_sha"]
        info = run_info(config, precision, loop, state, tracker, git_sha=sha, out_dir=out_dir, tags=all_tags)
        title = f"{experiment or ''} {run_name}"
        status = "FINISHED" if problem is None else "FAILED"
        write_outputs(out_dir, state, metrics, info, tracker, title=title, run_name=run_name, status=status)
    checkpointer.mark_complete()  # after the outputs: a rerun of a complete run trains afresh
    if problem is not None:
        # after rank 0's outputs: a rank that failed first would have the launcher stop rank 0 mid-write
        barrier()
        raise NonFiniteMetric(problem)
    return metrics


def _resumed(config: RunConfig, ctx: DistContext, loop: Loop, state: RunState) -> Checkpointer:
    """The run's checkpointer, ``state`` restored from its last checkpoint verified on every rank."""
    checkpointer = Checkpointer(
        loop.artifacts_dir / "ckpt",
        config.fingerprint(),
        rank=ctx.rank,
        world_size=ctx.world_size,
        keep=config.keep_checkpoints,
    )
    resume_step = checkpointer.resume_step()
    if resume_step is not None:
        restore(loop.plan, state, checkpointer.load(resume_step))
    return checkpointer


def build_loop(
    config: RunConfig,
    ctx: DistContext,
    strategy: SyncStrategy | None,
    data: tuple[Dataset, Dataset] | None,
    precision: str,
    *,
    artifacts_dir: Path,
) -> Loop:
    """Data, model, strategy, optimizer, schedule and recipe of a fresh run (before any resume)."""
    train_set, test_set = data if data is not None else load_data(config)
    if config.augment != "none" and train_set.info.kind != "image":
        raise ValueError(
            f"augment {config.augment!r} is for images; {config.dataset} is {train_set.info.kind}"
        )
    model, strategy, optimizer = _model_strategy_optimizer(config, ctx, strategy, train_set)
    epoch_batches = epoch_sampler(config, strategy, ctx, len(train_set))
    steps_per_epoch = len(epoch_batches(0))
    if steps_per_epoch == 0:
        _, shares = strategy.batch_position(ctx.rank, ctx.world_size)
        raise ValueError(
            f"{len(train_set)} training examples are fewer than {shares} data-parallel shares x "
            f"batch_size {config.batch_size}: lower batch_size or raise train_limit"
        )
    total_steps = config.epochs * steps_per_epoch
    if config.max_steps is not None:
        total_steps = min(total_steps, config.max_steps)
    draws = config.sampling != "epochs"
    return Loop(
        plan=_step_plan(
            config, ctx, train_set, model, strategy, optimizer, precision, total_steps, steps_per_epoch
        ),
        batches=BatchSource(
            train_set=train_set,
            epoch_batches=None if draws else epoch_batches,
            drawn_batch=draw_sampler(config, strategy, ctx, len(train_set)) if draws else None,
            workers=config.data_workers,
            pin_memory=ctx.device.type == "cuda",
        ),
        test_set=test_set,
        eval_batch_size=max(config.batch_size, 256),
        total_steps=total_steps,
        log_every=config.log_every if config.num_logs is None else -(-total_steps // config.num_logs),
        eval_every=(
            config.eval_every if config.num_evaluations is None else -(-total_steps // config.num_evaluations)
        ),
        checkpoint_every=config.checkpoint_every,
        stop_at=dict(config.stop_at),
        artifacts_dir=artifacts_dir,
    )


def _model_strategy_optimizer(
    config: RunConfig, ctx: DistContext, strategy: SyncStrategy | None, train_set: Dataset
) -> tuple[nn.Module, SyncStrategy, torch.optim.Optimizer]:
    """The model (the same initialisation on every rank), the strategy set up on it, and the
    optimizer over the strategy's parameter groups."""
    seed_everything(config.seed)  # same model initialisation on every rank

    def build() -> nn.Module:
        return prepare_model(config, model_for(config, train_set), train_set, ctx.device)

    strategy = strategy or default_strategy(config)
    model = strategy.shard(build(), build)  # the whole model, or this rank's pipeline stage
    strategy.setup(model)
    optimizer = optimizer_for(config, strategy.param_groups(model))
    strategy.attach_optimizer(optimizer)  # its lr, also after a resume replaces its groups
    return model, strategy, optimizer


def _step_plan(
    config: RunConfig,
    ctx: DistContext,
    train_set: Dataset,
    model: nn.Module,
    strategy: SyncStrategy,
    optimizer: torch.optim.Optimizer,
    precision: str,
    total_steps: int,
    steps_per_epoch: int,
) -> StepPlan:
    """What each step applies: the components, the training loss, the lr schedule and the recipe."""
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return StepPlan(
        ctx=ctx,
        train_set=train_set,
        model=model,
        strategy=strategy,
        optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(
            optimizer, lr_schedule(config, total_steps, steps_per_epoch)
        ),
        trainable=[p for _, p in trainable],
        trainable_names=[n for n, _ in trainable],
        loss_fn=cross_entropy_loss(train_set.info.kind, config.label_smoothing),
        autocast=autocast_factory(precision, ctx.device),
        augment=augmenter(config, ctx.rank),
        grad_clip_norm=config.grad_clip_norm,
        channels_last=config.channels_last,
        loss_scaler=LossScaler() if config.precision == "fp16" else None,
        steps_per_epoch=steps_per_epoch,
    )


def _run_tags(
    config: RunConfig, ctx: DistContext, precision: str, run_name: str, tags: dict[str, str] | None
) -> dict[str, str]:
    return {
        "git_sha": loaded_git_sha(),
        "stage": run_name,
        "world_size": str(ctx.world_size),
        "backend": ctx.backend,
        "device": str(ctx.device.type),
        "fingerprint": config.fingerprint(),
        "network": os.environ.get("THINWIRE_NETWORK", "host"),
        "compute_precision": precision,
        **(tags or {}),
    }


def _start_tracking(
    config: RunConfig,
    ctx: DistContext,
    state: RunState,
    experiment: str | None,
    run_name: str,
    tags: dict[str, str],
) -> Tracker:
    """Rank 0's MLflow run (resumed by the id a checkpoint kept), then a barrier: rank 0's tracking
    set-up must not show up as the others' communication time."""
    tracker = Tracker(
        experiment or "", run_name, enabled=ctx.is_main and experiment is not None, run_id=state.run_id
    )
    tracker.partial = state.tracking_partial
    if ctx.is_main:
        # a resumed run's rows up to its checkpoint are in the store already (or it is partial)
        tracker.start(
            _flat_params(config), tags, resume_step=state.step if state.run_id is not None else None
        )
        state.run_id = tracker.run_id  # kept from the checkpoint when a resumed run cannot reach the server
    barrier()
    return tracker


def _flat_params(config: RunConfig) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in config.to_dict().items():
        if isinstance(value, dict):
            for sub, v in value.items():
                flat[f"{key}.{sub}"] = v
        else:
            flat[key] = value
    return flat


def _log_timeout(ctx: DistContext, timeout_s: float, step: int, error: BaseException) -> None:
    log.error(
        "rank %d waited over collective_timeout_s = %g s for its peers at step %d, in %s: a rank "
        "died, hung or was stopped. This rank exits; torchrun restarts the ranks (up to "
        "max_restarts) and they resume from the last checkpoint",
        ctx.rank,
        timeout_s,
        step,
        _where(error),
    )


def _where(error: BaseException) -> str:
    """The innermost frames of ``error``'s traceback in this repository (where a rank waited)."""
    import traceback

    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename.startswith(str(REPO_ROOT))]
    return " <- ".join(
        f"{Path(f.filename).relative_to(REPO_ROOT)}:{f.lineno} {f.name}" for f in frames[::-1][:4]
    )
