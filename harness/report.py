"""What every report stage shares: a run's curves and seeds read back, the report's own MLflow run,
a paper's report files written, a figure's panels finished and saved."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.folders import RESULTS_DIR
from harness.params import load_params
from trainer.fileio import atomic_write, atomic_write_json, atomic_write_text


def read_csv(path: Path) -> list[dict[str, float]]:
    """A run's curve (train_curve.csv / eval_curve.csv) as rows of floats; empty cells dropped."""
    with path.open() as f:
        return [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]


def seed_results(runs: Path, run: str, pipeline: str) -> list[dict[str, Any]]:
    """Every seed of ``run`` under ``runs/<task>/<run>/seed<k>/`` (one launch per task): per seed
    its ``metrics`` and ``info`` (run.json) and its ``eval`` and ``train`` curves."""
    folders = sorted(p.parent for p in runs.glob(f"*/{run}/seed*/metrics.json"))
    if not folders:
        raise SystemExit(f"no results for {run} in {runs}: run `dvc repro pipelines/{pipeline}/dvc.yaml`")
    return [
        {
            "metrics": json.loads((folder / "metrics.json").read_text()),
            "info": json.loads((folder / "run.json").read_text()),
            "eval": read_csv(folder / "eval_curve.csv"),
            "train": read_csv(folder / "train_curve.csv"),
        }
        for folder in folders
    ]


def log_report(pipeline: str, files: list[Path], metrics: dict[str, float] | None = None) -> str | None:
    """The report stage as its own MLflow run (named ``report``) in the pipeline's experiment: its
    tables and figures as artifacts, headline numbers as metrics. Returns the run id (None when
    tracking is unavailable: a report never fails for MLflow's sake)."""
    from trainer.tracking import Tracker, git_sha

    tracker = Tracker(pipeline, "report")
    run_id = tracker.start(
        {"files": ", ".join(p.name for p in files)}, {"stage": "report", "git_sha": git_sha()}
    )
    tracker.log_metrics({k: v for k, v in (metrics or {}).items() if math.isfinite(v)}, 0)
    for path in files:
        if path.exists():
            tracker.log_artifact(path)
    tracker.finish("FINISHED")
    return run_id


def finish_report(
    pipeline: str,
    rows: list[dict[str, Any]],
    text: str,
    plot: Callable[[list[dict[str, Any]], Path], None],
    value_key: str,
) -> None:
    """A paper's report stage, after its own tables: ``report.md`` (``text``), ``report.json`` (the
    rows without their private ``_`` keys), ``curves.png`` (``plot``); prints the text and fails if
    a run's headline metric (``row[value_key]``) is not finite."""
    out = RESULTS_DIR / pipeline
    atomic_write_text(out / "report.md", text)
    public = [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]
    scale = load_params(pipeline)["scale"]
    atomic_write_json(out / "report.json", {"pipeline": pipeline, "scale": scale, "rows": public})
    plot(rows, out / "curves.png")
    log_report(pipeline, [out / "report.md", out / "report.json", out / "curves.png"])
    print(text)
    bad = [r["run"] for r in rows if not math.isfinite(r[value_key])]
    if bad:
        raise SystemExit(f"a run ended with a non-finite metric: {', '.join(bad)}")


def save_panels(fig: Any, axes: Any, path: Path) -> None:
    """Grid and legend on every panel, then the figure written atomically as PNG and closed."""
    import matplotlib.pyplot as plt

    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    atomic_write(path, lambda p: fig.savefig(p, format="png", dpi=110))
    plt.close(fig)
