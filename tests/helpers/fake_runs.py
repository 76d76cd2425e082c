"""Fake trained runs on disk, laid out as a train stage writes them, for report tests that must
control every number a verdict reads (``<root>/runs/<group>/<run>/seed<k>/``)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any


def _write_csv(path: Path, rows: list[dict[str, float]]) -> None:
    columns = sorted({k for r in rows for k in r}, key=lambda k: (k != "step", k))
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def write_run(
    root: Path,
    group: str,
    run: str,
    seed: int,
    *,
    metrics: dict[str, Any],
    info: dict[str, Any],
    train: list[dict[str, float]],
    evals: list[dict[str, float]] | None = None,
    evaluation: dict[str, float] | None = None,
) -> Path:
    """One seed of ``run``: metrics.json, run.json (``mlflow_run_id`` and ``git_sha`` filled in
    when absent), the train and eval curves, and its evaluation when given."""
    folder = root / "runs" / group / run / f"seed{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.json").write_text(json.dumps(metrics))
    info = {"mlflow_run_id": f"{run}-{seed}", "git_sha": "abc1234", **info}
    (folder / "run.json").write_text(json.dumps(info))
    _write_csv(folder / "train_curve.csv", train)
    _write_csv(folder / "eval_curve.csv", evals or [{"step": train[-1]["step"], "test_accuracy": 0.5}])
    if evaluation is not None:
        target = root / "evaluations" / group / run / f"seed{seed}.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(evaluation))
    return folder
