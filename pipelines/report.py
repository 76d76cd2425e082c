"""A pipeline's table and figure from its runs' outputs (the DVC ``report`` stage).

    python -m pipelines.report baseline

Reads ``results/<pipeline>/<run>/{metrics,run}.json`` and the curves of every run in params.yaml;
writes ``results/<pipeline>/report.md`` (a markdown table with each run's MLflow run id and git
sha), ``report.json`` (the same rows, for the cross-paper summary) and ``report.png`` (overlaid
curves). Nothing is typed by hand: every number comes from a run's files.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common.fileio import atomic_write, atomic_write_json, atomic_write_text
from common.plots import plot_curves
from pipelines.common import RESULTS_DIR, load_params, quiet_environment, run_dir

COLUMNS = [
    ("run", "run", "{}"),
    ("compressor", "compressor", "{}"),
    ("test_accuracy", "test accuracy (%)", "{:.2f}"),
    ("test_loss", "test loss", "{:.4f}"),
    ("bits_per_step", "bits sent / step / rank", "{:,.0f}"),
    ("compression_factor", "compression (x)", "{:.1f}"),
    ("wall_seconds", "train wall (s)", "{:.1f}"),
    ("communicate_seconds", "communicate (s)", "{:.1f}"),
    ("compress_seconds", "compress (s)", "{:.2f}"),
    ("mlflow_run_id", "MLflow run id", "`{}`"),
    ("git_sha", "git sha", "{}"),
]


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
    from common.tracking import Tracker, git_sha

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


def collect(pipeline: str) -> list[dict[str, Any]]:
    rows = []
    for run in load_params(pipeline)["runs"]:
        folder = run_dir(pipeline, run)
        missing = [name for name in ("metrics.json", "run.json") if not (folder / name).exists()]
        if missing:
            raise SystemExit(
                f"run {run!r} has no {', '.join(missing)} in {folder}: run its train stage first"
            )
        metrics = json.loads((folder / "metrics.json").read_text())
        info = json.loads((folder / "run.json").read_text())
        config = info["config"]
        compressor = config["compressor"] + "".join(
            f" {k}={v}" for k, v in config["compressor_options"].items()
        )
        if config["error_feedback"]:
            compressor += " +EF"
        rows.append(
            {
                "run": run,
                "compressor": compressor,
                **metrics,
                "test_accuracy": 100 * metrics["test_accuracy"],
                "mlflow_run_id": info["mlflow_run_id"],
                "git_sha": info["git_sha"],
            }
        )
    return rows


def markdown_table(rows: list[dict[str, Any]]) -> str:
    head = "| " + " | ".join(title for _, title, _ in COLUMNS) + " |"
    rule = "|" + "|".join("---" for _ in COLUMNS) + "|"
    lines = [head, rule]
    for row in rows:
        cells = []
        for key, _, fmt in COLUMNS:
            value = row.get(key)
            cells.append("n/a" if value is None else fmt.format(value))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("pipeline")
    args = parser.parse_args(argv)
    quiet_environment()
    rows = collect(args.pipeline)
    params = load_params(args.pipeline)
    out = RESULTS_DIR / args.pipeline
    scale = params["scale"]
    world = int(rows[0]["world_size"]) if rows else 0
    header = (
        f"# {args.pipeline}: results at scale `{scale}`\n\n"
        f"Generated by `python -m pipelines.report {args.pipeline}` from `results/{args.pipeline}/*/` "
        f"({world} ranks, gloo). Bits are counted from the wire tensors each rank handed to a collective.\n\n"
    )
    atomic_write_text(out / "report.md", header + markdown_table(rows))
    atomic_write_json(out / "report.json", {"pipeline": args.pipeline, "scale": scale, "rows": rows})
    curves = {
        row["run"]: (
            read_csv(run_dir(args.pipeline, row["run"]) / "train_curve.csv"),
            read_csv(run_dir(args.pipeline, row["run"]) / "eval_curve.csv"),
        )
        for row in rows
    }
    plot_curves(curves, out / "report.png", title=f"{args.pipeline} ({scale} scale, {world} ranks)")
    print(markdown_table(rows))


if __name__ == "__main__":
    main()
