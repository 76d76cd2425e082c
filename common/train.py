"""The one training loop. A sync strategy decides what crosses the wire.

Run from an entry point under torchrun, e.g. (what ``pipelines/train.py`` does)::

    torchrun --standalone --nproc_per_node 4 -m pipelines.train baseline fp32

Each step: batch -> ``strategy.forward_backward`` -> ``strategy.after_backward`` (data parallel:
average gradients) -> optimizer step -> ``strategy.after_step`` (decentralized: gossip).
Checkpoints every ``checkpoint_every`` steps hold the model, optimizer, scheduler, strategy
(residuals, generator states, counters), torch's RNG state and the curves so far, so a killed run
restarted by torchrun continues bit-exactly. Rank 0 writes, atomically, into ``out_dir``:

- ``metrics.json``: flat final numbers (accuracy, loss, bits per step, compression factor, seconds);
- ``train_curve.csv`` / ``eval_curve.csv``: per-step curves (``dvc plots``);
- ``plot.png``: both curves;
- ``run.json``: MLflow run id, git sha, config fingerprint and the config;
- ``model.pt``: the final model's state as evaluated (the evaluate stage reads it; not committed).

``model.pt`` and the checkpoints (``ckpt/``) go to ``artifacts_dir`` when one is given (the
pipelines keep them out of the committed results folder, so that a fresh clone, which lacks them,
holds every training stage's outputs complete; ``run.json`` records where, relative to ``out_dir``).

Recipe settings the loop applies to every method alike: label smoothing of the training loss,
local gradient clipping before anything is sent, bf16 autocast and channels_last for compute.
"""

from __future__ import annotations

import csv
import io
import logging
import math
import os
import platform
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from .checkpoint import Checkpointer
from .comm.collectives import get_world_size
from .config import RunConfig, stop_reached
from .data import Dataset, drawn_batch, epoch_batches, load_dataset
from .data.augment import augment_batch, augment_generator
from .data.loader import epoch_loader
from .distributed import DistContext, barrier, init_from_env, is_collective_timeout, seed_everything
from .fileio import atomic_write, atomic_write_json, atomic_write_text
from .loss_scale import LossScaler
from .methods import build_strategy
from .models import build_model
from .paths import REPO_ROOT
from .plots import plot_curves
from .step_time import StepTimes
from .strategies import SyncStrategy
from .tracking import Tracker, loaded_git_sha

log = logging.getLogger(__name__)

MODEL_FILE = "model.pt"  # rank 0's final model, as evaluated (see train())


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


# -- pieces ------------------------------------------------------------------------------------------


def default_strategy(config: RunConfig) -> SyncStrategy:
    """The strategy ``config.strategy`` names, built from the checked run (common.methods)."""
    return build_strategy(config)


def _loss_fn(kind: str, label_smoothing: float = 0.0) -> Callable[[Tensor, Tensor], Tensor]:
    if kind == "text":
        return lambda logits, y: nn.functional.cross_entropy(
            logits.flatten(0, 1).float(), y.flatten(), label_smoothing=label_smoothing
        )
    return lambda logits, y: nn.functional.cross_entropy(logits.float(), y, label_smoothing=label_smoothing)


# Data-dependent initialisation (airbench's whitening filters) reads this many training examples,
# the first of the split's fixed order: the same on every rank and for every seed.
INIT_FROM_DATA_EXAMPLES = 5000


def prepare_model(config: RunConfig, model: nn.Module, train_set: Dataset, device: torch.device) -> nn.Module:
    """A built model made ready to train: data-dependent initialisation for models that have one
    (``init_from_data(images)``, e.g. airbench's whitening), then the device and memory format."""
    init = getattr(model, "init_from_data", None)
    if callable(init):
        count = min(INIT_FROM_DATA_EXAMPLES, len(train_set))
        x, _ = train_set.get_batch(torch.arange(count))
        init(x)
    model = model.to(device)
    if config.channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bf16 in hardware (AMX or AVX512-BF16 on x86; other architectures
    are assumed to). On an x86 CPU without them oneDNN emulates bf16: the suite's airbench step was
    10x slower in bf16 than in fp32 on an AVX2-only AMD EPYC (3.6 s against 0.33 s for 256 CIFAR
    images, one thread, 2026-12-02), and its LSTM has no bf16 kernel at all."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        return True
    return bool(torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported())


def compute_precision(config: RunConfig, device: torch.device) -> str:
    """What a run computes its forward and backward in: ``"bf16"`` where it asks for it
    (``precision: bf16``) and the device has bf16 arithmetic (a GPU, or :func:`cpu_has_bf16`),
    ``"fp16"`` where it asks for fp16 (with a loss scale; emulated, and slow, on a CPU), ``"fp32"``
    otherwise. A CPU without bf16 units runs a bf16 recipe in fp32 (faster there, and closer to
    exact); ``run.json`` and the run's tags record which (``compute_precision``)."""
    if config.precision == "fp16":
        return "fp16"
    if config.precision != "bf16" or (device.type == "cpu" and not cpu_has_bf16()):
        return "fp32"
    return "bf16"


def autocast(config: RunConfig, device: torch.device) -> Any:
    """The compute-precision context of a forward (and its backward): :func:`compute_precision`."""
    precision = compute_precision(config, device)
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16
    return torch.autocast(device.type, dtype=dtype, enabled=precision != "fp32")


def _build_model(config: RunConfig, dataset: Dataset) -> nn.Module:
    info = dataset.info
    if info.kind == "text":
        return build_model(config.model, vocab_size=info.vocab_size, **config.model_options)
    assert info.input_shape is not None and info.num_classes is not None
    channels, size, _ = info.input_shape
    return build_model(
        config.model,
        num_classes=info.num_classes,
        in_channels=channels,
        image_size=size,
        **config.model_options,
    )


def _optimizer(config: RunConfig, groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
    if config.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=config.lr, weight_decay=config.weight_decay)
    return torch.optim.SGD(groups, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)


def _schedule(config: RunConfig, total_steps: int, steps_per_epoch: int) -> Callable[[int], float]:
    """The lr factor of each step: linear warm-up, then constant, cosine, or step decay (by
    ``lr_decay`` at the ``lr_milestones`` epochs, or at 50% and 75% of training)."""
    warmup = config.lr_warmup_steps
    milestones = [m * steps_per_epoch for m in config.lr_milestones]

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total_steps - warmup)
        if config.lr_schedule == "cosine":
            return 0.5 * (1 + math.cos(math.pi * progress))
        if config.lr_schedule == "linear":
            return 1.0 - (1.0 - config.lr_end_factor) * progress
        if config.lr_schedule == "step":
            passed = (
                sum(step >= m for m in milestones) if milestones else (progress >= 0.5) + (progress >= 0.75)
            )
            return float(config.lr_decay**passed)
        return 1.0

    return factor


@torch.no_grad()
def evaluate(
    model: nn.Module,
    dataset: Dataset,
    ctx: DistContext,
    batch_size: int,
    *,
    config: RunConfig | None = None,
) -> dict[str, float]:
    """Loss and accuracy on ``dataset``, each rank a disjoint shard, summed over ranks.

    Evaluation traffic (three numbers) is instrumentation, not training traffic: not counted.
    """
    model.eval()
    loss_fn = _loss_fn(dataset.info.kind)
    indices = torch.arange(ctx.rank, len(dataset), ctx.world_size)
    # loss sum and correct predictions accumulate on the device (read once, after the last batch)
    loss_sum = torch.zeros((), dtype=torch.float64, device=ctx.device)
    correct = torch.zeros((), dtype=torch.float64, device=ctx.device)
    count = 0
    for batch in indices.split(batch_size):
        x, y = dataset.get_batch(batch)
        x, y = x.to(ctx.device), y.to(ctx.device)
        if config is not None and config.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        if config is not None:
            with autocast(config, ctx.device):
                logits = model(x).float()
        else:
            logits = model(x)
        n = y.numel()
        loss_sum += loss_fn(logits, y).double() * n
        correct += (logits.argmax(-1) == y).sum()
        count += n
    totals = torch.stack([loss_sum, correct, loss_sum.new_tensor(float(count))])
    if get_world_size() > 1:
        dist.all_reduce(totals)
    totals = totals.cpu()
    model.train()
    loss = float(totals[0] / totals[2])
    out = {"test_loss": loss, "test_accuracy": float(totals[1] / totals[2])}
    if dataset.info.kind == "text":
        out["test_perplexity"] = math.exp(min(loss, 50.0))
    return out


def trained_model_file(out_dir: str | Path) -> Path:
    """A finished run's ``model.pt``: in its folder, or in the artifacts folder its ``run.json``
    names; FileNotFoundError naming what is missing and how to make it."""
    import json

    out_dir = Path(out_dir)
    if not (out_dir / "run.json").exists():
        raise FileNotFoundError(f"{out_dir} has no run.json: train the run first (its train stage writes it)")
    artifacts = json.loads((out_dir / "run.json").read_text()).get("artifacts", ".")
    model_file = (out_dir / artifacts / MODEL_FILE).resolve() if artifacts != "." else out_dir / MODEL_FILE
    if not model_file.exists():
        raise FileNotFoundError(
            f"{out_dir} has no {MODEL_FILE} (looked for {model_file}): checkpoints and final models are "
            "not committed; train the run again here (dvc repro -f <its train stage>) to make it"
        )
    return model_file


def evaluate_trained(out_dir: str | Path, *, eval_limit: int | None = None) -> dict[str, float]:
    """Rebuild a finished run from its folder (``run.json``'s config, ``model.pt``) in this process
    and evaluate it on its data set's test split (the whole split unless ``eval_limit``): the
    evaluate stage's measurement, independent of the subset the training curve was evaluated on."""
    out_dir = Path(out_dir)
    model_file = trained_model_file(out_dir)
    import json

    config = RunConfig.from_dict(json.loads((out_dir / "run.json").read_text())["config"])
    test_set = load_dataset(config.dataset, "test", limit=eval_limit, seq_len=config.seq_len)
    torch.manual_seed(config.seed)
    model = _build_model(config, test_set)
    model.load_state_dict(torch.load(model_file, map_location="cpu", weights_only=True))
    if config.channels_last:
        model = model.to(memory_format=torch.channels_last)
    ctx = DistContext(rank=0, world_size=1, local_rank=0, backend="gloo", device=torch.device("cpu"))
    result = evaluate(model, test_set, ctx, batch_size=max(config.batch_size, 256), config=config)
    return {**result, "test_examples": float(len(test_set))}


def _csv(rows: Sequence[dict[str, Any]]) -> str:
    if not rows:
        return ""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


# -- the loop ----------------------------------------------------------------------------------------


@dataclass
class _Run:
    """One training run: what it is built from, and the state a checkpoint holds (the rest)."""

    config: RunConfig
    ctx: DistContext
    out_dir: Path
    train_set: Dataset
    test_set: Dataset
    model: nn.Module
    strategy: SyncStrategy
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    loss_fn: Callable[[Tensor, Tensor], Tensor]
    trainable: list[nn.Parameter]  # what local gradient clipping clips
    steps_per_epoch: int
    total_steps: int
    eval_every: int
    log_every: int
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
    step_seconds: float = 0.0  # the last step's time (StepInfo.seconds)
    loss_scaler: LossScaler | None = None  # precision fp16
    artifacts_dir: Path = Path()  # model.pt and ckpt/ (train() sets it: out_dir unless given)
    # On the device, read at log steps and checkpoints only (no host read inside a step): the loss
    # sum since the last log, the first step whose loss was not finite (0: none) and that loss.
    window_loss: Tensor = field(init=False)
    first_bad_step: Tensor = field(init=False)
    first_bad_loss: Tensor = field(init=False)
    step_times: StepTimes = field(init=False)  # feeds non_comm, resolved with the window

    def __post_init__(self) -> None:
        device = self.ctx.device
        self.window_loss = torch.zeros((), dtype=torch.float64, device=device)
        self.first_bad_step = torch.zeros((), dtype=torch.int64, device=device)
        self.first_bad_loss = torch.zeros((), dtype=torch.float64, device=device)
        self.step_times = StepTimes(device)

    def checkpoint_state(self, tracking_partial: bool) -> dict[str, Any]:
        _settle(self)
        return {
            "step": self.step,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "strategy": self.strategy.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "elapsed": self.elapsed,
            "window": [float(self.window_loss), self.window_steps],  # loss sum, steps since the last log
            "non_comm": self.non_comm,
            "train_rows": self.train_rows,
            "eval_rows": self.eval_rows,
            "mlflow_run_id": self.run_id,
            "tracking_partial": tracking_partial,
            "resumed_at": self.resumed_at,
            "loss_scale": self.loss_scaler.state_dict() if self.loss_scaler is not None else None,
        }

    def restore(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.strategy.load_state_dict(state["strategy"])
        if self.loss_scaler is not None:
            self.loss_scaler.load_state_dict(state["loss_scale"])
        torch.set_rng_state(state["torch_rng"])
        self.step, self.elapsed = state["step"], state["elapsed"]
        self.window_loss.fill_(state["window"][0])
        self.window_steps = int(state["window"][1])
        self.non_comm = state.get("non_comm", [])
        self.train_rows, self.eval_rows = state["train_rows"], state["eval_rows"]
        self.run_id = state["mlflow_run_id"]
        self.tracking_partial = bool(state.get("tracking_partial", False))
        self.resumed_at = [*state.get("resumed_at", []), self.step]


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
    """
    ctx = ctx or init_from_env(timeout_s=config.collective_timeout_s)
    if ctx.world_size != get_world_size():
        raise RuntimeError(
            f"process group has {get_world_size()} ranks but the context says {ctx.world_size}"
        )
    run = _build_run(config, ctx, Path(out_dir), strategy, data)
    run.artifacts_dir = Path(artifacts_dir) if artifacts_dir is not None else run.out_dir
    checkpointer = Checkpointer(
        run.artifacts_dir / "ckpt",
        config.fingerprint(),
        rank=ctx.rank,
        world_size=ctx.world_size,
        keep=config.keep_checkpoints,
    )
    resume_step = checkpointer.resume_step()  # verified on every rank
    if resume_step is not None:
        run.restore(checkpointer.load(resume_step))
    all_tags = _run_tags(run, run_name, tags)
    tracker = _start_tracking(run, experiment, run_name, all_tags)
    try:
        _run_steps(run, checkpointer, tracker, callbacks)
    except BaseException as error:
        tracker.finish("FAILED")
        if is_collective_timeout(error):
            log.error(
                "rank %d waited over collective_timeout_s = %g s for its peers at step %d, in %s: a rank "
                "died, hung or was stopped. This rank exits; torchrun restarts the ranks (up to "
                "max_restarts) and they resume from the last checkpoint",
                ctx.rank,
                config.collective_timeout_s,
                run.step + 1,
                _where(error),
            )
        raise
    metrics = _final_metrics(run)
    if ctx.is_main:
        _write_outputs(run, metrics, tracker, all_tags, f"{experiment or ''} {run_name}", run_name)
    return metrics


def _start_tracking(run: _Run, experiment: str | None, run_name: str, tags: dict[str, str]) -> Tracker:
    """Rank 0's MLflow run (resumed by the id a checkpoint kept), then a barrier: rank 0's tracking
    set-up must not show up as the others' communication time."""
    tracker = Tracker(
        experiment or "", run_name, enabled=run.ctx.is_main and experiment is not None, run_id=run.run_id
    )
    tracker.partial = run.tracking_partial
    if run.ctx.is_main:
        tracker.start(_flat_params(run.config), tags)
        run.run_id = tracker.run_id  # kept from the checkpoint when a resumed run cannot reach the server
    barrier()
    return tracker


def _build_run(
    config: RunConfig,
    ctx: DistContext,
    out_dir: Path,
    strategy: SyncStrategy | None,
    data: tuple[Dataset, Dataset] | None = None,
) -> _Run:
    """Data, model, strategy, optimizer and schedule of a fresh run (before any resume)."""
    if data is not None:
        train_set, test_set = data
    else:
        train_set = load_dataset(
            config.dataset, "train", limit=config.train_limit, seq_len=config.seq_len, seed=config.seed
        )
        test_set = load_dataset(config.dataset, "test", limit=config.eval_limit, seq_len=config.seq_len)
    if config.augment != "none" and train_set.info.kind != "image":
        raise ValueError(
            f"augment {config.augment!r} is for images; {config.dataset} is {train_set.info.kind}"
        )
    seed_everything(config.seed)  # same model initialisation on every rank

    def build() -> nn.Module:
        return prepare_model(config, _build_model(config, train_set), train_set, ctx.device)

    strategy = strategy or default_strategy(config)
    model = strategy.shard(build(), build)  # the whole model, or this rank's pipeline stage
    strategy.setup(model)
    optimizer = _optimizer(config, strategy.param_groups(model))
    strategy.attach_optimizer(optimizer)  # its lr, also after a resume replaces its groups
    steps_per_epoch = len(_epoch_batches(config, strategy, ctx, len(train_set), 0))
    if steps_per_epoch == 0:
        _, shares = strategy.batch_position(ctx.rank, ctx.world_size)
        raise ValueError(
            f"{len(train_set)} training examples are fewer than {shares} data-parallel shares x "
            f"batch_size {config.batch_size}: lower batch_size or raise train_limit"
        )
    total_steps = config.epochs * steps_per_epoch
    if config.max_steps is not None:
        total_steps = min(total_steps, config.max_steps)
    return _Run(
        config=config,
        ctx=ctx,
        out_dir=out_dir,
        train_set=train_set,
        test_set=test_set,
        model=model,
        strategy=strategy,
        optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(
            optimizer, _schedule(config, total_steps, steps_per_epoch)
        ),
        loss_fn=_loss_fn(train_set.info.kind, config.label_smoothing),
        trainable=[p for p in model.parameters() if p.requires_grad],
        steps_per_epoch=steps_per_epoch,
        total_steps=total_steps,
        eval_every=(
            config.eval_every if config.num_evaluations is None else -(-total_steps // config.num_evaluations)
        ),
        log_every=config.log_every if config.num_logs is None else -(-total_steps // config.num_logs),
        loss_scaler=LossScaler() if config.precision == "fp16" else None,
    )


def _epoch_batches(
    config: RunConfig, strategy: SyncStrategy, ctx: DistContext, num_examples: int, epoch: int
) -> list[Tensor]:
    """This rank's batches of ``epoch`` (the same split on every rank, seeded by the run): its
    share of the data is the strategy's (a pipeline's stages share their replica's batches)."""
    share, shares = strategy.batch_position(ctx.rank, ctx.world_size)
    return epoch_batches(
        num_examples, config.batch_size, rank=share, world_size=shares, seed=config.seed, epoch=epoch
    )


def _drawn_batch(run: _Run) -> Tensor:
    """This rank's batch of the step ``run.step`` draws (``sampling: draws``)."""
    share, shares = run.strategy.batch_position(run.ctx.rank, run.ctx.world_size)
    config = run.config
    return drawn_batch(
        len(run.train_set),
        config.batch_size,
        rank=share,
        world_size=shares,
        seed=config.seed,
        step=config.first_step + run.step,
    )


def _run_tags(run: _Run, run_name: str, tags: dict[str, str] | None) -> dict[str, str]:
    return {
        "git_sha": loaded_git_sha(),
        "stage": run_name,
        "world_size": str(run.ctx.world_size),
        "backend": run.ctx.backend,
        "device": str(run.ctx.device.type),
        "fingerprint": run.config.fingerprint(),
        "network": os.environ.get("THINWIRE_NETWORK", "host"),
        "compute_precision": compute_precision(run.config, run.ctx.device),
        **(tags or {}),
    }


def _run_steps(
    run: _Run, checkpointer: Checkpointer, tracker: Tracker, callbacks: Sequence[Callback]
) -> None:
    """Every step from ``run.step`` on: train, log, evaluate, call back, checkpoint."""
    config, ctx = run.config, run.ctx

    def checkpoint(complete: bool = False) -> None:
        checkpointer.save(run.step, run.checkpoint_state(tracker.partial), complete=complete)

    run.model.train()
    batches: list[Tensor] = []
    batches_epoch = -1
    loaded: Iterator[tuple[Tensor, Tensor]] | None = None
    while run.step < run.total_steps:
        start = time.perf_counter()  # a step's time includes drawing its epoch's batches
        epoch, index = divmod(run.step, run.steps_per_epoch)
        if epoch != batches_epoch:
            if config.sampling == "epochs":
                batches = _epoch_batches(config, run.strategy, ctx, len(run.train_set), epoch)
            batches_epoch = epoch
            if hasattr(run.train_set, "set_epoch"):  # augments as it decodes (ImageNet)
                run.train_set.set_epoch(epoch)
            if config.data_workers is not None:  # the epoch's batches from this step on, decoded ahead
                loaded = epoch_loader(
                    run.train_set,
                    batches[index:],
                    workers=config.data_workers,
                    pin_memory=ctx.device.type == "cuda",
                )
        batch = batches[index] if config.sampling == "epochs" else _drawn_batch(run)
        loss = _train_step(run, batch, start, next(loaded) if loaded is not None else None)
        logged: dict[str, float] = {}
        if run.step % run.log_every == 0 or run.step == run.total_steps:
            logged = _log_step(run, tracker, epoch)
        if run.step % run.eval_every == 0 or run.step == run.total_steps:
            logged.update(_evaluate_step(run, tracker, epoch))
        info = StepInfo(
            step=run.step,
            total_steps=run.total_steps,
            epoch=epoch,
            rank=ctx.rank,
            step_loss=loss,
            logged=logged,
            last=run.step == run.total_steps or run.stopped,
            seconds=run.step_seconds,
        )
        for callback in callbacks:
            callback(info)
        if run.stopped:
            log.info("step %d: %s reached stop_at %s; stopping", run.step, run.eval_rows[-1], config.stop_at)
            break
        if run.step % config.checkpoint_every == 0 and run.step < run.total_steps:
            checkpoint()
    checkpoint(complete=True)


def _train_step(
    run: _Run, batch: Tensor, start: float, loaded: tuple[Tensor, Tensor] | None = None
) -> Tensor:
    """One step on the batch of indices ``batch`` (timed from ``start``; ``loaded``: its examples,
    already decoded by a DataLoader); returns this rank's loss, on the device.

    No device value is read on the host here (the loss is checked and summed on the device, read at
    log steps), except fp16's skip decision (:meth:`LossScaler.unscale_`)."""
    config, ctx, strategy = run.config, run.ctx, run.strategy
    run.step_times.start(strategy.stats)
    strategy.set_epoch(run.step / run.steps_per_epoch)  # e.g. DGC's warm-up densities
    x, y = loaded if loaded is not None else run.train_set.get_batch(batch)
    x, y = x.to(ctx.device, non_blocking=True), y.to(ctx.device, non_blocking=True)
    if config.augment != "none":
        x = augment_batch(x, config.augment, augment_generator(config.seed, ctx.rank, run.step))
    if config.channels_last and x.dim() == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    run.optimizer.zero_grad(set_to_none=True)
    scaler = run.loss_scaler
    with autocast(config, ctx.device):
        loss = strategy.forward_backward(
            run.model, x, y, run.loss_fn if scaler is None else scaler.scaled(run.loss_fn)
        )
    finite = True
    if scaler is not None:  # fp16: true gradients before anything is clipped or sent; all ranks agree
        loss = loss / scaler.scale
        finite = scaler.unscale_(run.trainable, ctx.device)
        scaler.update(finite)
    if finite:
        if config.grad_clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(run.trainable, config.grad_clip_norm)
        strategy.after_backward(run.model)
        run.optimizer.step()
    run.scheduler.step()  # the schedule keeps its length; a skipped step is a step with no update
    if finite:
        strategy.after_step(run.model)
    run.step += 1
    loss = loss.detach()
    _add_to_window(run, loss)
    step_seconds = time.perf_counter() - start
    run.step_seconds = step_seconds
    run.elapsed += step_seconds
    run.step_times.stop(strategy.stats, step_seconds)
    return loss


def _add_to_window(run: _Run, loss: Tensor) -> None:
    """Add this step's loss to the window's sum and, where it is the first loss that is not
    finite, remember the step and the loss: all on the device, without waiting for it."""
    loss = loss.to(run.window_loss.device, torch.float64)
    run.window_loss += loss
    run.window_steps += 1
    first_bad = torch.isfinite(loss).logical_not_().logical_and_(run.first_bad_step == 0)
    run.first_bad_step = torch.where(first_bad, run.step, run.first_bad_step)
    run.first_bad_loss = torch.where(first_bad, loss, run.first_bad_loss)


def _settle(run: _Run) -> None:
    """Read what the steps left on the device: FloatingPointError naming the first step whose loss
    was not finite (before anything is logged or checkpointed as good), then the steps' times."""
    bad_step = int(run.first_bad_step)
    if bad_step:
        raise FloatingPointError(
            f"training loss became {float(run.first_bad_loss)} at step {bad_step}: lower lr"
        )
    run.non_comm.extend(run.step_times.take())


def _log_step(run: _Run, tracker: Tracker, epoch: int) -> dict[str, float]:
    """The training curve's row: the mean loss over ranks since the last log, lr, bits, seconds."""
    window = torch.stack([run.window_loss, run.window_loss.new_tensor(float(run.window_steps))])
    if run.ctx.world_size > 1:
        dist.all_reduce(window)  # instrumentation: not counted in CommStats
    _settle(run)  # after the all-reduce: a rank that raises here does not leave the others waiting
    mean_loss = float(window[0] / window[1])
    if not math.isfinite(mean_loss):
        raise FloatingPointError(
            f"training loss became {mean_loss} on another rank by step {run.step}: lower lr"
        )
    run.window_loss.zero_()
    run.window_steps = 0
    stats = run.strategy.stats.summary()
    logged = {
        "train_loss": mean_loss,
        "lr": float(run.scheduler.get_last_lr()[0]),
        "bits_per_step": stats["bits_per_step"],
        "wall_seconds": run.elapsed,
        "communicate_seconds": stats["communicate_seconds"],
        **run.strategy.log_values(),
    }
    run.train_rows.append({"step": run.step, "epoch": epoch, **logged})
    tracker.log_metrics(logged, run.step)
    return logged


def _evaluate_step(run: _Run, tracker: Tracker, epoch: int) -> dict[str, float]:
    """Evaluate the model as the strategy defines it (DEF's virtual iterate, gossip's average);
    after the last step rank 0 also saves it (what the evaluate stage measures on the whole split)."""
    config, ctx = run.config, run.ctx
    with run.strategy.evaluating(run.model) as model:
        result = evaluate(model, run.test_set, ctx, batch_size=max(config.batch_size, 256), config=config)
        if run.step == run.total_steps and ctx.is_main:
            run.artifacts_dir.mkdir(parents=True, exist_ok=True)
            atomic_write(run.artifacts_dir / MODEL_FILE, lambda p: torch.save(model.state_dict(), p))
    # wall_seconds: training time so far (steps only, not evaluation): time-to-accuracy
    run.eval_rows.append({"step": run.step, "epoch": epoch, "wall_seconds": run.elapsed, **result})
    tracker.log_metrics(result, run.step)
    run.stopped = stop_reached(config.stop_at, result)  # the same result on every rank
    return result


def _final_metrics(run: _Run) -> dict[str, float]:
    """metrics.json: the last evaluation, the last logged loss, traffic and time."""
    stats = run.strategy.stats.summary()
    # A synchronous step lasts as long as its slowest rank computes (the others wait inside the
    # collective): the sum over steps of the slowest rank's non-communication time is the compute a
    # cost model must add to the wire time. Ranks take turns being slow, so it exceeds every
    # rank's own total. Instrumentation: not counted as traffic.
    _settle(run)
    per_rank = torch.tensor(run.non_comm, dtype=torch.float64, device=run.ctx.device)
    if run.ctx.world_size > 1:
        gathered = [torch.empty_like(per_rank) for _ in range(run.ctx.world_size)]
        dist.all_gather(gathered, per_rank)
        per_rank = torch.stack(gathered).amax(0)
    metrics: dict[str, float] = {
        **{k: v for k, v in run.eval_rows[-1].items() if k not in ("step", "epoch")},
        "train_loss": run.train_rows[-1]["train_loss"],
        "steps": float(run.step),
        "epochs": float(run.config.epochs),
        "world_size": float(run.ctx.world_size),
        "bits_per_step": stats["bits_per_step"],
        "dense_bits_per_step": stats["dense_bits_per_step"],
        "compression_factor": stats["compression_factor"],
        "wall_seconds": run.elapsed,
        "communicate_seconds": stats["communicate_seconds"],
        "compress_seconds": stats["compress_seconds"],
        "decompress_seconds": stats["decompress_seconds"],
        "sync_compute_seconds": float(per_rank.sum()),
        **run.strategy.metrics(),
    }
    if run.config.stop_at:  # 1: ended at its target (the steps ran are fewer than total_steps)
        metrics["stopped_at_target"] = float(run.stopped)
    if run.loss_scaler is not None:  # fp16: steps skipped for an inf or NaN gradient, and the last scale
        metrics["fp16_skipped_steps"] = float(run.loss_scaler.skipped)
        metrics["loss_scale"] = run.loss_scaler.scale
    return metrics


def _write_outputs(
    run: _Run, metrics: dict[str, float], tracker: Tracker, tags: dict[str, str], title: str, run_name: str
) -> None:
    """Rank 0's files (curves, plot, metrics.json, run.json), also logged to the tracker."""
    out_dir = run.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / "train_curve.csv", _csv(run.train_rows))
    atomic_write_text(out_dir / "eval_curve.csv", _csv(run.eval_rows))
    plot_curves({run_name: (run.train_rows, run.eval_rows)}, out_dir / "plot.png", title=title)
    atomic_write_json(out_dir / "metrics.json", {k: _json_number(v) for k, v in metrics.items()})
    run_info = {
        "mlflow_run_id": run.run_id,
        "git_sha": tags["git_sha"],
        "fingerprint": run.config.fingerprint(),
        "config": run.config.to_dict(),
        "network": os.environ.get("THINWIRE_NETWORK", "host"),
        # what the forward and backward ran in: a bf16 recipe runs in fp32 on a CPU without bf16 units
        "compute_precision": compute_precision(run.config, run.ctx.device),
        # op -> [calls, bytes] per step on rank 0: the traffic a cost model prices
        "comm_ops_per_step": {k: list(v) for k, v in run.strategy.stats.ops_per_step().items()},
        # tensors per transport route, where a method picks one (TernGrad: all-gather or int8)
        "routes": dict(run.strategy.stats.routes),
        # "complete", "partial" (the MLflow run has gaps: the server went away) or "off"
        "tracking": tracker.state,
        # the steps a restarted run resumed from (empty: it ran through in one go)
        "resumed_at": run.resumed_at,
    }
    if run.artifacts_dir != out_dir:  # model.pt and ckpt/ elsewhere: where, from this folder
        run_info["artifacts"] = os.path.relpath(run.artifacts_dir, out_dir)
    atomic_write_json(out_dir / "run.json", run_info)
    tracker.log_metrics({f"final_{k}": v for k, v in metrics.items() if math.isfinite(v)}, run.step)
    for name in ("metrics.json", "plot.png", "train_curve.csv", "eval_curve.csv", "run.json"):
        tracker.log_artifact(out_dir / name)
    tracker.finish("FINISHED")
    if tracker.state != run_info["tracking"]:  # it broke while the outputs were logged
        atomic_write_json(out_dir / "run.json", {**run_info, "tracking": tracker.state})


def _where(error: BaseException) -> str:
    """The innermost frames of ``error``'s traceback in this repository (where a rank waited)."""
    import traceback

    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename.startswith(str(REPO_ROOT))]
    return " <- ".join(
        f"{Path(f.filename).relative_to(REPO_ROOT)}:{f.lineno} {f.name}" for f in frames[::-1][:4]
    )


def _json_number(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _flat_params(config: RunConfig) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in config.to_dict().items():
        if isinstance(value, dict):
            for sub, v in value.items():
                flat[f"{key}.{sub}"] = v
        else:
            flat[key] = value
    return flat
