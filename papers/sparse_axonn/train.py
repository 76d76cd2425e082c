"""The train stage: dense AxoNN, sparse AxoNN and the Sputnik-like baseline on a pipeline x data grid.

    python -m pipelines.launch sparse_axonn sparse90_2x2 --out /tmp/t       # one run of params.yaml
    python -m pipelines.launch sparse_axonn dense_2x2,sparse90_2x2 --scale smoke --inputs /tmp/p --out /tmp/t

Launched like every other run: ``params.yaml`` names this module (``runs_module:``), so the shared launcher
asks it for each run's config (:func:`stage_config`, which first checks the prune stage's masks and
rewind state in ``--inputs``, default ``results/sparse_axonn``, against the model: a mask that does
not fit fails there, before any rank starts) and its ranks train each run through
:func:`train_run`: the thinwire loop (:func:`trainer.train`) with ``strategy: pipeline``
(:class:`~papers.sparse_axonn.strategies.pipeline.PipelineDataParallel`), each rank one stage,
checkpointed, restartable and tracked like every other run, plus this stage's measurements.

Every run starts from the prune stage's rewind state (step ``prune.rewind_step``), with the mask
applied for the sparse methods, and trains ``train.steps`` steps on the same global batches (steps
``rewind_step ...`` of the prune stage's data order: ``sampling: draws``, ``first_step``) at the
same learning rates. Per rank it measures the model-state bytes by category from the tensors, the
peak resident memory of the process (VmHWM, reset at the start of each run, read before the final
evaluation, which builds the whole model on every rank; it includes torch, transformers, the loop's
modules and, on rank 0, MLflow, all imported before the first run, and the data, loaded once before
it: their resident memory at the run's start is reported too), the all-reduce
and point-to-point bits and seconds per step, the step time; at the end rank 0 loads the whole
model the loop saved, checks that every pruned weight is still exactly zero and evaluates the
validation perplexity. Writes ``<out>/<run>/``: the loop's files (``metrics.json``, ``run.json``,
curves, plot; ``model.pt`` and ``ckpt/`` not committed) with this stage's numbers added to
``metrics.json`` and ``run.json``, and ``ranks.json`` (per rank) and ``steps.csv`` (rank 0, per step).
"""

from __future__ import annotations

import contextlib
import csv
import ctypes
import gc
import io
import json
import logging
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from common.config import RunConfig
from trainer import StepInfo, train, trained_model_file
from trainer.checks import checked_config
from trainer.distributed import DistContext, barrier
from trainer.fileio import atomic_write_json, atomic_write_text
from trainer.paths import REPO_ROOT
from trainer.tracking import Tracker

from .config import RunSpec, ScaleConfig
from .model import build_gpt2, evaluate, load_split
from .params import load_config
from .pipeline_stages import GPT2Stage
from .pruning import load_masks
from .pruning import pruned_nonzero as count_pruned_nonzero
from .sparse_compute import SparseLinear, to_sparse_compute
from .sparse_state import state_bytes
from .strategies import PipelineDataParallel

log = logging.getLogger("sparse_axonn.train")

SECONDS = (  # per-step times whose medians are reported
    "step_seconds",
    "compute_seconds",
    "p2p_seconds",
    "allreduce_seconds",
    "allreduce_wait_seconds",
    "allreduce_transfer_seconds",
    "rest_seconds",
)
WORKER_ENV = "THINWIRE_SPARSE_AXONN_WORKER"  # the launcher's arguments, JSON, for the torchrun workers


def repo_relative(path: Path) -> str:
    """``path`` relative to the repository root when it lies inside it, else as given."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(REPO_ROOT)) if resolved.is_relative_to(REPO_ROOT) else str(path)


def mask_path(prune_dir: Path, config: ScaleConfig, spec: RunSpec) -> Path:
    return prune_dir / "masks" / f"{config.train.masks}_{spec.percent}.pt"


def parse_runs(text: str, runs: dict[str, RunSpec]) -> list[str]:
    names = [n.strip() for n in text.split(",")]
    if not all(names) or len(set(names)) != len(names):
        raise ValueError(f"runs {text!r}: expected distinct comma-separated run names")
    unknown = [n for n in names if n not in runs]
    if unknown:
        raise ValueError(f"unknown run(s) {', '.join(unknown)}; params.yaml defines: {', '.join(runs)}")
    return names


def load_rewind(path: Path, model: nn.Module) -> None:
    if not path.exists():
        raise ValueError(
            f"no rewind state at {path}: run the prune stage (python -m papers.sparse_axonn.prune)"
        )
    state = torch.load(path, map_location="cpu", weights_only=True)
    try:
        model.load_state_dict(state)
    except RuntimeError as error:
        first = str(error).splitlines()[:3]
        raise ValueError(f"{path} does not fit the model of this scale: {' '.join(first)}") from None


def load_run_masks(
    prune_dir: Path, config: ScaleConfig, spec: RunSpec, model: nn.Module
) -> dict[str, Tensor]:
    """The run's masks, checked against ``model`` (names, shapes, bool) and against the run's sparsity."""
    if spec.method == "dense":
        return {}
    path = mask_path(prune_dir, config, spec)
    if not path.exists():
        raise ValueError(f"no mask file {path}: run the prune stage (python -m papers.sparse_axonn.prune)")
    saved = load_masks(path, model)
    if abs(saved.sparsity - spec.sparsity) > 0.01:
        raise ValueError(f"{path} has sparsity {saved.sparsity:.4f}, the run asks for {spec.sparsity}")
    return saved.masks


def check_inputs(names: list[str], runs: dict[str, RunSpec], config: ScaleConfig, prune_dir: Path) -> int:
    """Everything a run needs, checked before any rank trains: data, rewind state, masks, the run's
    config. Returns the number of training windows."""
    train_split = load_split(config, "train")
    vocab = len(train_split.vocab)
    load_split(config, "val", limit=1)
    model = build_gpt2(config.model, vocab)
    load_rewind(prune_dir / "rewind.pt", model)
    for name in names:
        try:
            load_run_masks(prune_dir, config, runs[name], model)
            run_config(runs[name], config, config.train.world_size, prune_dir, len(train_split))
        except ValueError as error:
            raise ValueError(f"run {name!r}: {error}") from None
    return len(train_split)


# ----------------------------------------------------------------------------------- memory probes


def _status_bytes(field: str) -> int:
    """A ``/proc/self/status`` field in bytes (0 where /proc is absent)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def reset_peak_rss() -> bool:
    """Release freed heap to the OS, then reset VmHWM to the current RSS (Linux >= 4.0)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


# ------------------------------------------------------------------------------------------ a run


def dense_numel(module: nn.Module) -> int:
    """Entries of the module's dense parameters: a CSR layer counts its whole weight matrix."""
    total = sum(p.numel() for p in module.parameters())
    for m in module.modules():
        if isinstance(m, SparseLinear):
            total += m.weight_shape[0] * m.weight_shape[1] - m.values.numel()
    return total


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _gather(obj: Any) -> list[Any]:
    if not dist.is_initialized():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def load_data(config: ScaleConfig) -> dict[str, Any]:
    """The splits every run reads, loaded once: training, the validation windows this stage
    evaluates, and the test windows of the loop's own curve point."""
    return {
        "train": load_split(config, "train"),
        "val": load_split(config, "val", limit=config.train.eval_windows),
        "test": load_split(config, "test", limit=config.train.eval_windows),
    }


def run_config(
    spec: RunSpec, config: ScaleConfig, world_size: int, prune_dir: Path, train_windows: int
) -> RunConfig:
    """The thinwire run of one paper run: the rewound GPT-2 on a ``stages x replicas`` grid."""
    train, optim, model = config.train, config.optim, config.model
    rewind = config.prune.rewind_step
    if rewind + 1 < optim.warmup_steps:  # the stage's lr is optim.lr_at(rewind + i): constant from there
        raise ValueError(
            f"prune.rewind_step {rewind} lies inside the warm-up ({optim.warmup_steps} steps): the train "
            "stage continues at the full lr from the rewind; rewind at or after the warm-up"
        )
    replicas = world_size // spec.stages
    per_replica = train.batch_size // replicas
    steps_per_epoch = max(1, train_windows // replicas // per_replica)
    options: dict[str, Any] = {
        "stages": spec.stages,
        "microbatches": train.num_microbatches,
        "schedule": train.schedule,
        "init": str(prune_dir / "rewind.pt"),
        "wait_barrier": True,  # the all-reduce's time without the wait for the slowest replica
    }
    if spec.method != "dense":
        options.update(
            masks=str(mask_path(prune_dir, config, spec)),
            grads=spec.grads,
            compute="csr" if spec.method == "sputnik" else "dense",
        )
    return checked_config(
        {
            "dataset": config.dataset,
            "seq_len": config.seq_len,
            "model": "gpt2_small",
            "model_options": {
                "n_layer": model.n_layer,
                "n_embd": model.n_embd,
                "n_head": model.n_head,
                "n_positions": model.n_positions,
                "dropout": model.dropout,
                "tied": False,
            },
            "optimizer": "adamw",
            "lr": optim.lr,
            "weight_decay": optim.weight_decay,
            "batch_size": per_replica,
            "epochs": -(-train.steps // steps_per_epoch),
            "max_steps": train.steps,
            "sampling": "draws",
            "first_step": rewind,
            "strategy": "pipeline",
            "strategy_options": options,
            "eval_limit": train.eval_windows,  # the loop's own curve: the test split's first windows
            "num_evaluations": 1,
            "num_logs": train.steps,
            "checkpoint_every": train.steps,
            "world_size": world_size,
            "seed": config.seed,
        }
    )


class StepRecorder:
    """The per-step rows (``steps.csv``) and the peak memory before the final evaluation."""

    def __init__(self, strategy: PipelineDataParallel) -> None:
        self.strategy = strategy
        self.rows: list[dict[str, Any]] = []
        self.peak_rss = 0

    def __call__(self, info: StepInfo) -> None:
        s = self.strategy.last_step
        phases = s["compute_seconds"] + s["p2p_seconds"] + s["allreduce_seconds"]
        self.rows.append(
            {
                "step": info.step,
                "loss": info.loss,
                "p2p_bits": int(s["p2p_bits"]),
                "p2p_seconds": s["p2p_seconds"],
                "allreduce_bits": int(s["allreduce_bits"]),
                "allreduce_seconds": s["allreduce_seconds"],
                "loss_bits": int(s["loss_bits"]),
                "compute_seconds": s["compute_seconds"],
                "step_seconds": info.seconds,
                "allreduce_wait_seconds": s["allreduce_wait_seconds"],
                "allreduce_transfer_seconds": s["allreduce_transfer_seconds"],
                "rest_seconds": info.seconds - phases,  # data, optimizer step, zero_grad, loss all-reduce
            }
        )
        if not info.last or not self.peak_rss:  # the final evaluation builds the whole model: not a step
            self.peak_rss = _status_bytes("VmHWM")


def train_paper_run(
    name: str,
    spec: RunSpec,
    config: ScaleConfig,
    ctx: DistContext,
    prune_dir: Path,
    folder: Path,
    data: dict[str, Any],
    *,
    thinwire: RunConfig | None = None,
    experiment: str = "sparse_axonn",
    run_name: str | None = None,
    tags: dict[str, str] | None = None,
    callbacks: list[Any] | None = None,
    artifacts_dir: Path | str | None = None,
) -> dict[str, Any]:
    """Train one run on this rank's stage into ``folder``; rank 0 writes (and returns) the stage's
    metrics, the other ranks return the loop's. ``thinwire``: the run's config in the loop (default
    :func:`run_config` of ``spec`` on this world); ``artifacts_dir``: the loop's (model.pt, ckpt/)."""
    peak_reset = reset_peak_rss()
    rss_start = _status_bytes("VmRSS")
    run = thinwire or run_config(spec, config, ctx.world_size, prune_dir, len(data["train"]))
    strategy = PipelineDataParallel.from_config(run)
    recorder = StepRecorder(strategy)
    grid = f"{spec.stages}x{ctx.world_size // spec.stages}"
    start = time.perf_counter()
    metrics = train(
        run,
        folder,
        experiment=experiment,
        run_name=run_name or name,
        tags={**(tags or {}), "stage": "train", "grid": grid},
        strategy=strategy,
        callbacks=[recorder, *(callbacks or [])],
        ctx=ctx,
        data=(data["train"], data["test"]),  # loaded once, before the runs: not a run's memory
        artifacts_dir=artifacts_dir,
    )
    wall = time.perf_counter() - start
    assert strategy.grid is not None and strategy.trainer is not None
    stage, training = strategy.trainer.module, strategy.training
    assert isinstance(stage, GPT2Stage)
    rows = recorder.rows
    timed = rows[config.train.timing_skip :]
    grad_bytes = int(strategy.last_step["grad_bytes"])  # the dense gradients the last step held
    if training is not None:
        state = state_bytes(
            stage, training.optimizer, packed=training.grads == "packed", grad_bytes=grad_bytes
        )
    else:
        assert strategy.attached is not None
        state = state_bytes(stage, strategy.attached, grad_bytes=grad_bytes)
    num_params = dense_numel(stage)
    mine = {
        "rank": ctx.rank,
        "stage": strategy.grid.stage,
        "replica": strategy.grid.replica,
        "blocks": list(stage.block_range),
        "num_params": num_params,
        "num_kept": training.layout.num_kept if training is not None else num_params,
        "state_bytes": state,
        "peak_rss_bytes": recorder.peak_rss,
        "rss_start_bytes": rss_start,
        "peak_rss_reset": peak_reset,
        "p2p_bits_per_step": _median([r["p2p_bits"] for r in rows]),
        "allreduce_bits_per_step": _median([r["allreduce_bits"] for r in rows]),
        "loss_bits_per_step": _median([r["loss_bits"] for r in rows]),
        **{f"{k}_median": _median([r[k] for r in timed]) for k in SECONDS},
        "allreduce_bits_steps": sorted({r["allreduce_bits"] for r in rows}),
        "p2p_bits_steps": sorted({r["p2p_bits"] for r in rows}),
    }
    ranks = _gather(mine)
    if ctx.is_main:
        metrics = _finish(name, spec, config, prune_dir, folder, data, ranks, rows, wall, grid)
    barrier()
    return metrics


def _finish(
    name: str,
    spec: RunSpec,
    config: ScaleConfig,
    prune_dir: Path,
    folder: Path,
    data: dict[str, Any],
    ranks: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    wall: float,
    grid: str,
) -> dict[str, Any]:
    """Rank 0: the whole model the loop saved, the zeros checked, evaluated; the stage's files."""
    model = build_gpt2(config.model, len(data["train"].vocab))
    masks = load_run_masks(prune_dir, config, spec, model)
    if spec.method == "sputnik":
        to_sparse_compute(model, masks)
    saved = torch.load(trained_model_file(folder), map_location="cpu", weights_only=True)
    model.load_state_dict({k.removeprefix("gpt2."): v for k, v in saved.items()})
    # Pruned weights of the dense layers (all of them for sparse AxoNN; the embeddings for the
    # Sputnik-like model, whose CSR layers have no pruned entries at all).
    pruned_nonzero = sum(count_pruned_nonzero(model, masks).values())
    val = evaluate(model, data["val"])
    replica0 = [r for r in ranks if r["replica"] == 0]
    num_params = sum(r["num_params"] for r in replica0)
    num_kept = sum(r["num_kept"] for r in replica0)
    totals = [r["state_bytes"]["total"] for r in ranks]
    metrics = {
        "val_perplexity": val["perplexity"],
        "val_loss": val["loss"],
        "train_loss_final": rows[-1]["loss"],
        "num_params": num_params,
        "num_kept": num_kept,
        "density": num_kept / num_params,
        "pruned_nonzero": pruned_nonzero,
        "state_bytes_max": max(totals),
        "state_bytes_mean": statistics.fmean(totals),
        "peak_rss_bytes_max": max(r["peak_rss_bytes"] for r in ranks),
        "rss_start_bytes_max": max(r["rss_start_bytes"] for r in ranks),
        "allreduce_bits_per_step_max": max(r["allreduce_bits_per_step"] for r in ranks),
        "allreduce_bits_per_step_total": sum(r["allreduce_bits_per_step"] for r in ranks),
        "p2p_bits_per_step_max": max(r["p2p_bits_per_step"] for r in ranks),
        "p2p_bits_per_step_total": sum(r["p2p_bits_per_step"] for r in ranks),
        **{f"{k}_median_max": max(r[f"{k}_median"] for r in ranks) for k in SECONDS},
        "run_peak_rss_bytes_max": max(r["peak_rss_bytes"] - r["rss_start_bytes"] for r in ranks),
        "wall_seconds": wall,
    }
    loop_metrics = json.loads((folder / "metrics.json").read_text())
    atomic_write_json(folder / "metrics.json", {**loop_metrics, **metrics})
    atomic_write_json(folder / "ranks.json", ranks)
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(folder / "steps.csv", text.getvalue())
    info = json.loads((folder / "run.json").read_text())
    info.update(
        {
            "run": name,
            "spec": spec.__dict__,
            "grid": grid,
            # relative to the repository (no machine's absolute path in a tracked result)
            "masks": repo_relative(mask_path(prune_dir, config, spec)) if spec.method != "dense" else None,
            "scale_config": config.to_dict(),
        }
    )
    atomic_write_json(folder / "run.json", info)
    tracker = Tracker(
        "sparse_axonn", name, run_id=info["mlflow_run_id"], enabled=info["mlflow_run_id"] is not None
    )
    tracker.start({}, {"grid": grid})
    tracker.log_summary(metrics)
    for file in ("metrics.json", "ranks.json", "steps.csv", "run.json"):
        tracker.log_artifact(folder / file)
    tracker.finish()
    log.info(
        "%s: perplexity %.3f, state %.0f kB/rank (max), %s",
        name,
        val["perplexity"],
        max(totals) / 1e3,
        folder,
    )
    return metrics


# --------------------------------------------------------- the shared launcher's stage (pipelines/common.py)


def stage_config(run: str, scale: str | None, inputs: Path) -> RunConfig:
    """The thinwire run of ``run`` (``pipelines.launch sparse_axonn <run>``), after checking what it
    reads from the prune stage's outputs ``inputs`` (rewind state, masks against the model)."""
    config, runs = load_config(scale)
    (name,) = parse_runs(run, runs)
    train_windows = check_inputs([name], runs, config, inputs)
    return run_config(runs[name], config, config.train.world_size, inputs, train_windows)


_LOADED: dict[str | None, dict[str, Any]] = {}


def _loaded(scale: str | None, config: ScaleConfig) -> dict[str, Any]:
    """The scale's data, loaded once per process, and what every run imports, imported before the
    first: a run's memory is its own (the first GPT-2 built imports transformers' model code, ~250 MB
    of resident memory, measured; MLflow on rank 0 ~100 MB)."""
    if scale not in _LOADED:
        data = load_data(config)
        build_gpt2(config.model, len(data["train"].vocab))
        if not dist.is_initialized() or dist.get_rank() == 0:
            import mlflow.tracking  # noqa: F401
        import torch.distributed.pipelining  # noqa: F401
        import transformers.masking_utils  # noqa: F401

        _LOADED[scale] = data
    return _LOADED[scale]


def train_run(
    config: RunConfig,
    out_dir: str | Path,
    *,
    run: str,
    scale: str | None,
    inputs: Path,
    experiment: str,
    run_name: str,
    tags: dict[str, str],
    callbacks: list[Any],
    ctx: DistContext,
    artifacts_dir: str | None = None,
) -> dict[str, Any]:
    """One run on this rank (``pipelines.train`` calls this for the pipeline): the thinwire loop with
    this stage's measurements; returns rank 0's metrics (the others: the loop's own)."""
    scale_config, runs = load_config(scale)
    data = _loaded(scale, scale_config)
    return train_paper_run(
        run,
        runs[run],
        scale_config,
        ctx,
        inputs,
        Path(out_dir),
        data,
        thinwire=config,
        experiment=experiment,
        run_name=run_name,
        tags=tags,
        callbacks=callbacks,
        artifacts_dir=artifacts_dir,
    )
