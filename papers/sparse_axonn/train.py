"""The train stage: dense AxoNN, sparse AxoNN and the Sputnik-like baseline on a pipeline x data grid.

    python -m papers.sparse_axonn.train sparse90_2x2                 # one run of params.yaml
    python -m papers.sparse_axonn.train dense_2x2,sparse90_2x2 --scale smoke --prune-dir /tmp/p --out /tmp/t

Checks the runs, the prune stage's masks and rewind state against the model first (a mask that does
not fit the model fails here, before any rank starts), then becomes ``torchrun --standalone`` on
``train.world_size`` gloo ranks (NCCL on GPUs), which train the runs one after the other. Why not
``pipelines.launch``/``common.train``: that harness trains a data-parallel model through a sync
strategy with one optimizer over the whole model; here each rank holds one pipeline stage, the
step is :class:`common.pipeline.PipelineTrainer`'s schedule, and the optimizer is per stage.

Every run starts from the prune stage's rewind state (step ``prune.rewind_step``), with the mask
applied for the sparse methods, and trains ``train.steps`` steps on the same global batches (steps
``rewind_step ...`` of the prune stage's data order) at the same learning rates. Per rank it
measures the model-state bytes by category from the tensors, the peak resident memory of the
process (VmHWM, reset at the start of each run; it includes torch and transformers, imported
before the first run, whose resident memory at the start is reported too), the all-reduce and
point-to-point bits and seconds per step, the step time; at the end rank 0 gathers the stages of
replica 0, checks that every pruned weight is still exactly zero and evaluates the validation
perplexity. Writes ``<out>/<run>/``: ``metrics.json`` (flat), ``ranks.json`` (per rank),
``steps.csv`` (rank 0, per step) and ``run.json`` (MLflow run id, git sha, settings).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import ctypes
import gc
import io
import json
import logging
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from common.distributed import DistContext, barrier, init_from_env, seed_everything, shutdown
from common.fileio import atomic_write_json, atomic_write_text
from common.paths import REPO_ROOT
from common.pipeline import GPT2Stage, PipelineTrainer, ProcessGrid, flat_all_reduce_grads
from common.pruning import apply_masks, load_masks
from common.pruning import pruned_nonzero as count_pruned_nonzero
from common.sparse_compute import SparseLinear, to_sparse_compute
from common.tracking import Tracker, git_sha

from .config import RunSpec, ScaleConfig
from .model import batch, build_gpt2, evaluate, load_split
from .params import OUT, flatten, load_config
from .sparse_state import CompactTraining, TimedReduce, dense_optimizer, state_bytes

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


def check_inputs(names: list[str], runs: dict[str, RunSpec], config: ScaleConfig, prune_dir: Path) -> None:
    """Everything a run needs, checked once in the launcher: data, rewind state, masks."""
    vocab = len(load_split(config, "train", limit=1).vocab)
    load_split(config, "val", limit=1)
    model = build_gpt2(config.model, vocab)
    load_rewind(prune_dir / "rewind.pt", model)
    for name in names:
        try:
            load_run_masks(prune_dir, config, runs[name], model)
        except ValueError as error:
            raise ValueError(f"run {name!r}: {error}") from None


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


def train_run(
    name: str,
    spec: RunSpec,
    config: ScaleConfig,
    ctx: DistContext,
    prune_dir: Path,
    out: Path,
    data: dict[str, Any],
) -> dict[str, Any] | None:
    """Train one run on this rank's stage; rank 0 returns (and writes) the run's metrics."""
    train, optim = config.train, config.optim
    peak_reset = reset_peak_rss()
    rss_start = _status_bytes("VmRSS")
    seed_everything(config.seed)
    vocab = len(data["train"].vocab)
    model = build_gpt2(config.model, vocab)
    load_rewind(prune_dir / "rewind.pt", model)
    masks = load_run_masks(prune_dir, config, spec, model)
    apply_masks(model, masks)
    if spec.method == "sputnik":
        to_sparse_compute(model, masks)  # embeddings stay dense layers with their masks
    grid = ProcessGrid.create(spec.stages, num_blocks=config.model.n_layer)
    stage = GPT2Stage(model, grid.stage, grid.num_stages).to(ctx.device)
    del model  # the other stages' layers
    training: CompactTraining | None = None
    dense: torch.optim.AdamW | None = None
    if spec.method == "dense":
        dense = dense_optimizer(stage, optim)
        optimizer: Any = dense
        reducer: Any = flat_all_reduce_grads
    else:
        training = CompactTraining(
            stage, masks, lr=optim.lr_at(0), weight_decay=optim.weight_decay, grads=spec.grads
        )
        training.layout.verify_across_ranks(group=grid.data_parallel_group)  # same masks, same order
        optimizer = reducer = training
    timed_reduce = TimedReduce(reducer)
    trainer = PipelineTrainer(
        stage,
        grid,
        optimizer,
        num_microbatches=train.num_microbatches,
        schedule=train.schedule,
        reduce_grads=timed_reduce,
        device=ctx.device,
    )
    tags = {
        "git_sha": git_sha(),
        "stage": "train",
        "world_size": str(ctx.world_size),
        "backend": ctx.backend,
        "device": ctx.device.type,
        "grid": f"{grid.num_stages}x{grid.num_replicas}",
    }
    barrier()
    rows = []
    start = time.perf_counter()
    for i in range(train.steps):
        step = config.prune.rewind_step + i  # the prune stage's data order and schedule from the rewind on
        x, y = batch(data["train"], config.seed, step, train.batch_size)
        lr = optim.lr_at(step)
        if training is not None:
            training.set_lr(lr)
        if dense is not None:
            for group in dense.param_groups:
                group["lr"] = lr
        s = trainer.train_step(x.to(ctx.device), y.to(ctx.device))
        rest = s.step_seconds - s.compute_seconds - s.p2p_seconds - s.allreduce_seconds
        rows.append(
            {
                "step": i + 1,
                **s.__dict__,
                "allreduce_wait_seconds": timed_reduce.wait_seconds,
                "allreduce_transfer_seconds": timed_reduce.transfer_seconds,
                "rest_seconds": rest,  # optimizer step, zero_grad, loss all-reduce
            }
        )
        if ctx.is_main and ((i + 1) % max(1, train.steps // 5) == 0 or i + 1 == train.steps):
            log.info(
                "%s: step %d/%d loss %.4f (%.1f s)",
                name,
                i + 1,
                train.steps,
                s.loss,
                time.perf_counter() - start,
            )
    wall = time.perf_counter() - start
    timed = rows[train.timing_skip :]
    state = (
        state_bytes(stage, training.optimizer, packed=training.grads == "packed")
        if training is not None
        else state_bytes(stage, optimizer)
    )
    num_params = dense_numel(stage)
    mine = {
        "rank": ctx.rank,
        "stage": grid.stage,
        "replica": grid.replica,
        "blocks": list(stage.block_range),
        "num_params": num_params,
        "num_kept": training.layout.num_kept if training is not None else num_params,
        "state_bytes": state,
        "peak_rss_bytes": _status_bytes("VmHWM"),
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
    buffer = io.BytesIO()
    torch.save(
        {k: v.detach().cpu() for k, v in stage.state_dict().items()} if grid.replica == 0 else {}, buffer
    )
    states = _gather(buffer.getvalue())
    if training is not None:
        training.remove_hooks()
    result = None
    if ctx.is_main:
        result = _finish(name, spec, config, prune_dir, out, data, ranks, states, rows, wall, tags)
    barrier()
    return result


def _finish(
    name: str,
    spec: RunSpec,
    config: ScaleConfig,
    prune_dir: Path,
    out: Path,
    data: dict[str, Any],
    ranks: list[dict[str, Any]],
    states: list[bytes],
    rows: list[dict[str, Any]],
    wall: float,
    tags: dict[str, str],
) -> dict[str, Any]:
    """Rank 0: rebuild the trained model from replica 0's stages, check the zeros, evaluate, write.

    MLflow is started only now, after the memory was measured: importing it costs rank 0 ~100 MB.
    """
    model = build_gpt2(config.model, len(data["train"].vocab))
    masks = load_run_masks(prune_dir, config, spec, model)
    if spec.method == "sputnik":
        to_sparse_compute(model, masks)
    full: dict[str, Tensor] = {}
    for blob in states:
        full.update(torch.load(io.BytesIO(blob), weights_only=True))
    missing, unexpected = model.load_state_dict(full, strict=False)
    params = dict(model.named_parameters())
    uncovered = [k for k in missing if k in params]
    assert not uncovered and not unexpected, (
        f"stages do not cover the model: {uncovered[:4]} {unexpected[:4]}"
    )
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
    tracker = Tracker("sparse_axonn", name)
    run_id = tracker.start(flatten({"run": spec.__dict__, **config.to_dict()}), tags)
    for row in rows:
        tracker.log_metrics(
            {"train_loss": row["loss"], "step_seconds": row["step_seconds"]}, step=row["step"]
        )
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_json(folder / "metrics.json", metrics)
    atomic_write_json(folder / "ranks.json", ranks)
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(folder / "steps.csv", text.getvalue())
    atomic_write_json(
        folder / "run.json",
        {
            "mlflow_run_id": run_id,
            "git_sha": tags["git_sha"],
            "run": name,
            "spec": spec.__dict__,
            "grid": tags["grid"],
            # relative to the repository (no machine's absolute path in a tracked result)
            "masks": repo_relative(mask_path(prune_dir, config, spec)) if spec.method != "dense" else None,
            "config": config.to_dict(),
            "tags": tags,
        },
    )
    tracker.log_metrics({f"final_{k}": float(v) for k, v in metrics.items()}, step=len(rows))
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


# ------------------------------------------------------------------------------------ entry points


def worker(args: dict[str, Any]) -> None:
    ctx = init_from_env()
    from pipelines.common import setup_logging

    setup_logging(ctx.rank)
    config, runs = load_config(args["scale"])
    data = {
        "train": load_split(config, "train"),
        "val": load_split(config, "val", limit=config.train.eval_windows),
    }
    # Import what a run imports before any run starts, so that a run's memory is its own: the first
    # GPT-2 built imports transformers' model code (~250 MB of resident memory, measured).
    build_gpt2(config.model, len(data["train"].vocab))
    import torch.distributed.pipelining  # noqa: F401
    import transformers.masking_utils  # noqa: F401

    try:
        for name in args["runs"]:
            train_run(name, runs[name], config, ctx, Path(args["prune_dir"]), Path(args["out"]), data)
    finally:
        shutdown()


def main(argv: list[str] | None = None) -> None:
    from pipelines.common import quiet_environment, setup_logging

    quiet_environment()
    worker_args = os.environ.get(WORKER_ENV)
    if worker_args:  # a torchrun worker started by the launcher below
        worker(json.loads(worker_args))
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", help="a run of params.yaml, or several (a,b) trained one after the other")
    parser.add_argument("--scale", default=None, help="override params.yaml's scale")
    parser.add_argument(
        "--prune-dir", default=None, help="the prune stage's outputs (default results/sparse_axonn)"
    )
    parser.add_argument("--out", default=None, help="results folder (default results/sparse_axonn/runs)")
    args = parser.parse_args(argv)
    setup_logging()
    prune_dir = Path(args.prune_dir).resolve() if args.prune_dir else OUT
    out = Path(args.out).resolve() if args.out else prune_dir / "runs"
    try:
        config, runs = load_config(args.scale)
        names = parse_runs(args.runs, runs)
        check_inputs(names, runs, config, prune_dir)
    except ValueError as error:  # DataError is a ValueError
        raise SystemExit(f"error: {error}") from None
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or shutil.which("torchrun")
    if torchrun is None:
        raise SystemExit("torchrun not found next to this python or on PATH: run `make setup` first")
    os.environ[WORKER_ENV] = json.dumps(
        {"runs": names, "scale": args.scale, "prune_dir": str(prune_dir), "out": str(out)}
    )
    command = [
        torchrun,
        "--standalone",
        f"--nproc_per_node={config.train.world_size}",
        "--max-restarts=0",
        "-m",
        "papers.sparse_axonn.train",
    ]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(command[0], command)


if __name__ == "__main__":
    main()
