"""What a run leaves behind (rank 0, atomically): ``metrics.json``, the curves, their plot,
``run.json`` and the final model file; and where a finished run's model file is."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from common.config import RunConfig

from .fileio import atomic_write, atomic_write_json, atomic_write_text
from .plan import Loop
from .plots import plot_curves
from .state import RunState
from .tracking import Tracker

MODEL_FILE = "model.pt"  # rank 0's final model, as evaluated (the loop's last evaluation)


def save_model(artifacts_dir: Path, model: nn.Module) -> None:
    """``model.pt``: the model's state as the last evaluation measured it."""
    artifacts_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(artifacts_dir / MODEL_FILE, lambda p: torch.save(model.state_dict(), p))


def trained_model_file(out_dir: str | Path) -> Path:
    """A finished run's ``model.pt``: in its folder, or in the artifacts folder its ``run.json``
    names; FileNotFoundError naming what is missing and how to make it."""
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


def final_metrics(loop: Loop, state: RunState) -> dict[str, float]:
    """metrics.json: the last evaluation, the last logged loss, traffic and time. ``epochs`` is
    what was trained (steps done / steps per epoch: 1.5 where ``max_steps`` or ``stop_at`` ended
    the run half-way through its second epoch), not the config's ``epochs``."""
    plan = loop.plan
    stats = plan.strategy.stats.summary()
    # A synchronous step lasts as long as its slowest rank computes (the others wait inside the
    # collective): the sum over steps of the slowest rank's non-communication time is the compute a
    # cost model must add to the wire time. Ranks take turns being slow, so it exceeds every
    # rank's own total. Instrumentation: not counted as traffic.
    state.settle()
    per_rank = torch.tensor(state.non_comm, dtype=torch.float64, device=plan.ctx.device)
    if plan.ctx.world_size > 1:
        gathered = [torch.empty_like(per_rank) for _ in range(plan.ctx.world_size)]
        dist.all_gather(gathered, per_rank)
        per_rank = torch.stack(gathered).amax(0)
    metrics: dict[str, float] = {
        **{k: v for k, v in state.eval_rows[-1].items() if k not in ("step", "epoch")},
        "train_loss": state.train_rows[-1]["train_loss"],
        "steps": float(state.step),
        "epochs": state.step / plan.steps_per_epoch,
        "world_size": float(plan.ctx.world_size),
        "bits_per_step": stats["bits_per_step"],
        "dense_bits_per_step": stats["dense_bits_per_step"],
        "compression_factor": stats["compression_factor"],
        "wall_seconds": state.elapsed,
        "communicate_seconds": stats["communicate_seconds"],
        "compress_seconds": stats["compress_seconds"],
        "decompress_seconds": stats["decompress_seconds"],
        "sync_compute_seconds": float(per_rank.sum()),
        **plan.strategy.metrics(),
    }
    if loop.stop_at:  # 1: ended at its target (the steps ran are fewer than total_steps)
        metrics["stopped_at_target"] = float(state.stopped)
    if plan.loss_scaler is not None:  # fp16: steps skipped for an inf or NaN gradient, and the last scale
        metrics["fp16_skipped_steps"] = float(plan.loss_scaler.skipped)
        metrics["loss_scale"] = plan.loss_scaler.scale
    return metrics


def non_finite_final(state: RunState) -> str | None:
    """What is wrong when a metric of the run's last evaluation is NaN or inf (the first such
    metric and its step), else None. ``metrics.json`` records such a value as null."""
    row = state.eval_rows[-1] if state.eval_rows else {}
    for name, value in row.items():
        if name not in ("step", "epoch") and isinstance(value, float) and not math.isfinite(value):
            return (
                f"final {name} is {value} at step {row['step']} (the run's last evaluation; metrics.json "
                "records it as null): the model diverged; lower lr or clip gradients (grad_clip_norm)"
            )
    return None


def run_info(
    config: RunConfig,
    precision: str,
    loop: Loop,
    state: RunState,
    tracker: Tracker,
    *,
    git_sha: str,
    out_dir: Path,
    tags: dict[str, str] | None = None,
) -> dict[str, Any]:
    """``run.json``: how to find the run again (MLflow id, git sha, config) and what it ran on."""
    stats = loop.plan.strategy.stats
    info: dict[str, Any] = {
        "mlflow_run_id": state.run_id,
        "git_sha": git_sha,
        "fingerprint": config.fingerprint(),
        "config": config.to_dict(),
        "network": os.environ.get("THINWIRE_NETWORK", "host"),
        # what the forward and backward ran in: a bf16 recipe runs in fp32 on a CPU without bf16 units
        "compute_precision": precision,
        # op -> [calls, bytes] per step on rank 0: the traffic a cost model prices
        "comm_ops_per_step": {k: list(v) for k, v in stats.ops_per_step().items()},
        # tensors per transport route, where a method picks one (TernGrad: all-gather or int8)
        "routes": dict(stats.routes),
        # "complete", "partial" (the MLflow run has gaps: the server went away) or "off"
        "tracking": tracker.state,
        # the steps a restarted run resumed from (empty: it ran through in one go)
        "resumed_at": state.resumed_at,
        "tags": tags or {},  # what the MLflow run was tagged with (an import of run.json restores them)
        "started_at": _utc(state.started_at),
        "ended_at": _utc(time.time()),
    }
    if loop.artifacts_dir != out_dir:  # model.pt and ckpt/ elsewhere: where, from this folder
        info["artifacts"] = os.path.relpath(loop.artifacts_dir, out_dir)
    return info


def write_outputs(
    out_dir: Path,
    state: RunState,
    metrics: dict[str, float],
    info: dict[str, Any],
    tracker: Tracker,
    *,
    title: str,
    run_name: str,
    status: str = "FINISHED",
) -> None:
    """Rank 0's files (curves, plot, metrics.json, run.json: ``info``), also logged to the tracker,
    whose run then ends ``status``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / "train_curve.csv", _csv(state.train_rows))
    atomic_write_text(out_dir / "eval_curve.csv", _csv(state.eval_rows))
    plot_curves({run_name: (state.train_rows, state.eval_rows)}, out_dir / "plot.png", title=title)
    atomic_write_json(out_dir / "metrics.json", {k: _json_number(v) for k, v in metrics.items()})
    atomic_write_json(out_dir / "run.json", info)
    tracker.log_summary(metrics)  # final values that no curve ends in: tags summary.<key>
    for name in ("metrics.json", "plot.png", "train_curve.csv", "eval_curve.csv", "run.json"):
        tracker.log_artifact(out_dir / name)
    tracker.finish(status)
    if tracker.state != info["tracking"]:  # it broke while the outputs were logged
        atomic_write_json(out_dir / "run.json", {**info, "tracking": tracker.state})


def _csv(rows: Sequence[dict[str, Any]]) -> str:
    if not rows:
        return ""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def _json_number(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _utc(seconds: float) -> str:
    """Unix ``seconds`` as ISO 8601 in UTC, to the second."""
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds")
