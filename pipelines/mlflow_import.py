"""Load every committed run into the local MLflow store, so a fresh clone browses all results.

    python -m pipelines.mlflow_import        # then: python -m pipelines.mlflow_ui (make mlflow-ui)

A clone has the runs' files (``results/``) but not the ``mlflow.db`` they were logged to. This
walks ``results/<pipeline>/``:

- every training run (a folder with ``run.json`` and ``metrics.json``): its config as params, each
  CSV curve beside it (``train_curve.csv``, ``eval_curve.csv``, ``steps.csv``) as metric histories
  by step, the values of ``metrics.json`` that no curve ends in as tags ``summary.<name>`` (a
  curve's last point is its final value: the charts are the curves), its tags and its small files
  (json, csv, png, md) as artifacts. Tags: those ``run.json`` recorded; for a run that
  predates recording them, ``stage`` (its run name), ``pipeline``, ``method``, ``world_size`` (its
  config) and ``scale`` and ``dvc_stage`` (the ``dvc.lock`` stage whose outputs hold it);
- every evaluation (``evaluations/<group>/<run>/seed<k>.json``), nested under its training run;
- sparse AxoNN's prune stage (``prune.json``) and its evaluations (``evaluations/<model>.json``),
  nested under it;
- each pipeline's report (``report.md|json``, figures) as a run named ``report``.

One experiment per pipeline, in MLflow's model-training view. Each imported run carries
``thinwire.original_run_id`` (the id in the store it was trained with, also in ``run.json`` and the
READMEs) and ``thinwire.source`` (its folder), and keeps its own start and end time: ``run.json``'s
``started_at`` / ``ended_at`` where recorded, else the end is the time of the git commit that brought
its outputs (a release commits them as each stage ends; a file not committed as it is: its
modification time) and the start that less its training seconds; ``thinwire.times`` says which.
Curve points are timed by their ``wall_seconds`` from the start. Idempotent: a run whose original id is already in the
store (the machine that trained it), or that was imported before, is skipped. ``--listing FILE``
also writes what is imported, per pipeline (the DVC stage's output); ``--dry-run`` imports nothing;
``--verify results/summary.md`` then fails if a run id quoted there is not in the store.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.entry import quiet_environment
from harness.folders import RESULTS_DIR
from pipelines.provenance import FileTimes, Stage, derived_tags, dvc_stages, recorded_times, stage_of
from trainer.fileio import atomic_write_text
from trainer.tracking import SUMMARY_PREFIX, ensure_experiment, tracking_uri

ORIGINAL_TAG = "thinwire.original_run_id"
SOURCE_TAG = "thinwire.source"
ARTIFACT_SUFFIXES = (".json", ".csv", ".png", ".md")
REPORT_FILES = ("report.md", "report.json", "report.png", "curves.png", "summary.md")


@dataclass
class Record:
    """One run to import: where it comes from and what it holds."""

    experiment: str
    name: str
    source: Path
    original_id: str | None
    params: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    # key, value, step, seconds after the start (None: at the end)
    metrics: list[tuple[str, float, int, float | None]] = field(default_factory=list)
    artifacts: list[Path] = field(default_factory=list)
    parent_original_id: str | None = None
    times: tuple[float, float, str] | None = None  # start, end (unix seconds), where they come from


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = value


def _numbers(values: dict[str, Any]) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in values.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }


def _number(text: str | None) -> float | None:
    try:
        value = float(text) if text not in ("", None) else math.nan
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _curves(folder: Path) -> list[tuple[str, float, int, float | None]]:
    """Every numeric column of every CSV in ``folder`` by its ``step`` column, each point at its
    row's ``wall_seconds`` (training seconds so far) where the row has them."""
    metrics = []
    for path in sorted(folder.glob("*.csv")):
        with path.open() as f:
            for row in csv.DictReader(f):
                if not row.get("step"):
                    continue
                step = int(float(row["step"]))
                seconds = _number(row.get("wall_seconds"))
                for key, text in row.items():
                    value = _number(text)
                    if key not in ("step", "epoch") and value is not None:
                        metrics.append((key, value, step, seconds))
    return metrics


def _stage(results: Path, stages: dict[Path, Stage], folder: Path) -> Stage | None:
    """The DVC stage whose outputs hold ``folder`` (the repository is ``results``' parent)."""
    root = results.resolve().parent
    return (
        stage_of(stages, folder.resolve().relative_to(root))
        if folder.resolve().is_relative_to(root)
        else None
    )


def training_runs(
    results: Path, times: FileTimes | None = None, stages: dict[Path, Stage] | None = None
) -> Iterator[Record]:
    times = times or FileTimes(results)
    stages = dvc_stages(results.resolve().parent) if stages is None else stages
    for info_file in sorted(results.glob("*/**/run.json")):
        folder = info_file.parent
        if not (folder / "metrics.json").exists():
            continue
        relative = folder.relative_to(results)
        experiment = relative.parts[0]
        name = "/".join(p for p in relative.parts[1:] if p != "runs") or experiment
        info = json.loads(info_file.read_text())
        params: dict[str, Any] = {}
        _flatten("", info.get("config", {}), params)
        flat: dict[str, Any] = {}
        _flatten("", json.loads((folder / "metrics.json").read_text()), flat)
        final = _numbers(flat)
        stage = _stage(results, stages, folder)
        tags = {
            **derived_tags(relative, info, final, stage),
            **{k: str(v) for k, v in (info.get("tags") or {}).items()},
        }
        for key in ("git_sha", "fingerprint", "network", "grid", "compute_precision"):
            if key in info:
                tags[key] = str(info[key])
        curves = _curves(folder)
        curve_keys = {key for key, *_ in curves}
        tags |= {f"{SUMMARY_PREFIX}{k}": repr(v) for k, v in final.items() if k not in curve_keys}
        recorded = recorded_times(info)
        if recorded is not None:
            when = (*recorded, "run.json")
        else:  # the end from its outputs, the start that less its training time
            end, source = times.of(folder / "metrics.json")
            when = (end - final.get("wall_seconds", 0.0), end, f"{source}; start = end - wall_seconds")
        yield Record(
            experiment=experiment,
            name=name,
            source=relative,
            original_id=info.get("mlflow_run_id"),
            params={k: json.dumps(v) if isinstance(v, list) else str(v) for k, v in params.items()},
            tags=tags,
            metrics=curves,
            artifacts=sorted(p for p in folder.iterdir() if p.suffix in ARTIFACT_SUFFIXES),
            times=when,
        )


def _at(times: FileTimes, path: Path, seconds: float = 0.0) -> tuple[float, float, str]:
    """A run that wrote ``path`` at its end, after ``seconds``: (start, end, where from)."""
    end, source = times.of(path)
    return end - seconds, end, source if not seconds else f"{source}; start = end - wall_seconds"


def evaluation_runs(
    results: Path, times: FileTimes | None = None, stages: dict[Path, Stage] | None = None
) -> Iterator[Record]:
    times = times or FileTimes(results)
    stages = dvc_stages(results.resolve().parent) if stages is None else stages
    for path in sorted(results.glob("*/evaluations/*/*/seed*.json")):
        relative = path.relative_to(results)
        row = json.loads(path.read_text())
        # the scale of the training run it measures: evaluations/<group>/<run>/seed<k> <- runs/...
        trained = _stage(
            results, stages, results / relative.parts[0] / "runs" / Path(*relative.parts[2:]).with_suffix("")
        )
        tags = {"stage": "evaluate", "pipeline": relative.parts[0], "method": str(row["run"])}
        if trained is not None and trained.scale:
            tags["scale"] = trained.scale
        yield Record(
            experiment=relative.parts[0],
            name=f"{row['run']}-{path.stem}-evaluate",
            source=relative,
            original_id=row.get("mlflow_run_id"),
            params={"run": str(row["run"]), "seed": str(row["seed"]), "split": "test"},
            tags={**tags, "git_sha": str(row.get("git_sha"))},
            metrics=[(k, v, 0, None) for k, v in _numbers(row).items() if k.startswith("test_")],
            artifacts=[path],
            parent_original_id=row.get("training_run_id"),
            times=_at(times, path),
        )


def stage_runs(results: Path, times: FileTimes | None = None) -> Iterator[Record]:
    """Runs a stage logged without a run folder: sparse AxoNN's prune (``prune.json``: it trains the
    dense model and retrains every mask) and its evaluation of each model (``evaluations/<model>.json``,
    nested under the prune run)."""
    times = times or FileTimes(results)
    for path in sorted(results.glob("*/prune.json")):
        row = json.loads(path.read_text())
        params: dict[str, Any] = {}
        _flatten("", row.get("scale_config", {}), params)
        yield Record(
            experiment=path.parent.name,
            name="prune",
            source=path.relative_to(results),
            original_id=row.get("mlflow_run_id"),
            params={k: json.dumps(v) if isinstance(v, list) else str(v) for k, v in params.items()},
            tags={"stage": "prune", "git_sha": str(row.get("git_sha"))},
            metrics=[(k, v, 0, None) for k, v in _numbers(row).items()],
            artifacts=[p for p in (path, path.with_suffix(".md")) if p.exists()],
            times=_at(times, path, float(row.get("wall_seconds") or 0.0)),
        )
    for path in sorted(results.glob("*/evaluations/*.json")):
        row = json.loads(path.read_text())
        if "mlflow_run_id" not in row:
            continue
        yield Record(
            experiment=path.parent.parent.name,
            name=f"{path.stem}-evaluate",
            source=path.relative_to(results),
            original_id=row["mlflow_run_id"],
            params={k: str(v) for k, v in row.items() if k in ("model", "sparsity")},
            tags={"stage": "evaluate", "git_sha": str(row.get("git_sha"))},
            metrics=[(k, v, 0, None) for k, v in _numbers(row).items() if k.startswith(("test_", "val_"))],
            artifacts=[path],
            parent_original_id=row.get("prune_run_id"),
            times=_at(times, path),
        )


def report_runs(results: Path, times: FileTimes | None = None) -> Iterator[Record]:
    times = times or FileTimes(results)
    for folder in sorted(p for p in results.iterdir() if p.is_dir()):
        files = [folder / n for n in REPORT_FILES if (folder / n).exists()]
        files += sorted(p for p in folder.glob("*.png") if p not in files)
        if (folder / "report.md").exists():
            when = _at(times, folder / "report.md")
            yield Record(
                folder.name, "report", folder.relative_to(results), None, artifacts=files, times=when
            )
    if (results / "summary.md").exists():
        summary = results / "summary.md"
        yield Record(
            "summary", "summary", Path("summary.md"), None, artifacts=[summary], times=_at(times, summary)
        )


def collect(results: Path) -> list[Record]:
    times = FileTimes(results)  # one git log for every run
    stages = dvc_stages(results.resolve().parent)
    return [
        *training_runs(results, times, stages),
        *stage_runs(results, times),
        *evaluation_runs(results, times, stages),
        *report_runs(results, times),
    ]


def listing(records: list[Record]) -> str:
    """What an import loads, per experiment (deterministic: no ids of the target store)."""
    counts = Counter(
        (
            r.experiment,
            "evaluation"
            if r.parent_original_id or r.name.endswith("-evaluate")
            else "report"
            if r.name in ("report", "summary")
            else "training",
        )
        for r in records
    )
    lines = [
        "# Runs `python -m pipelines.mlflow_import` loads into the local MLflow store",
        "",
        "| experiment | training runs | evaluations | reports |",
        "|---|---:|---:|---:|",
    ]
    for experiment in sorted({e for e, _ in counts}):
        lines.append(
            f"| {experiment} | {counts[(experiment, 'training')]} | {counts[(experiment, 'evaluation')]} | "
            f"{counts[(experiment, 'report')]} |"
        )
    lines += ["", f"{len(records)} runs in all.", ""]
    return "\n".join(lines)


def import_records(records: list[Record], uri: str) -> dict[str, int]:
    """Create the missing runs in the store at ``uri``; returns counts of imported and skipped."""
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiments = {
        name: ensure_experiment(client, name, uri) for name in sorted({r.experiment for r in records})
    }
    known_original: dict[str, str] = {}  # original id -> id in this store
    known_source: set[str] = set()
    for run in client.search_runs(list(experiments.values()), max_results=50_000):
        known_original[run.info.run_id] = run.info.run_id
        if ORIGINAL_TAG in run.data.tags:
            known_original[run.data.tags[ORIGINAL_TAG]] = run.info.run_id
        if SOURCE_TAG in run.data.tags:
            known_source.add(run.data.tags[SOURCE_TAG])
    counts = Counter[str]()
    for record in records:
        source = str(record.source)
        if (record.original_id and record.original_id in known_original) or source in known_source:
            counts["skipped"] += 1
            continue
        if record.original_id:
            try:  # the original run may be in this store under another experiment name
                client.get_run(record.original_id)
                counts["skipped"] += 1
                continue
            except MlflowException:
                pass
        tags = {**record.tags, SOURCE_TAG: source, "thinwire.imported": "true"}
        if record.original_id:
            tags[ORIGINAL_TAG] = record.original_id
        parent = known_original.get(record.parent_original_id or "")
        if parent:
            tags["mlflow.parentRunId"] = parent
            tags["training_run_id"] = parent
        start, end, source = record.times or (time.time(), time.time(), "import time")
        tags["thinwire.times"] = source
        run = client.create_run(
            experiments[record.experiment], start_time=int(start * 1000), run_name=record.name, tags=tags
        )
        run_id = run.info.run_id
        params = [Param(k, v[:6000]) for k, v in record.params.items()]
        metrics = [
            Metric(k, v, int((start + at if at is not None else end) * 1000), s)
            for k, v, s, at in record.metrics
        ]
        for start in range(0, max(len(params), 1), 100):
            client.log_batch(run_id, params=params[start : start + 100])
        for start in range(0, len(metrics), 900):
            client.log_batch(run_id, metrics=metrics[start : start + 900])
        client.log_batch(run_id, tags=[RunTag("thinwire.files", str(len(record.artifacts)))])
        for path in record.artifacts:
            client.log_artifact(run_id, str(path))
        client.set_terminated(run_id, "FINISHED", end_time=int(end * 1000))
        if record.original_id:
            known_original[record.original_id] = run_id
        known_source.add(source)
        counts["imported"] += 1
    return dict(counts)


def missing_ids(text: str, uri: str) -> list[str]:
    """The MLflow run ids quoted in ``text`` (32 hex digits in backticks, as the reports write
    them) that the store at ``uri`` has neither as a run nor as a run's original id."""

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    known: set[str] = set()
    for run in client.search_runs(experiments, max_results=50_000) if experiments else []:
        known.add(run.info.run_id)
        known.add(run.data.tags.get(ORIGINAL_TAG, ""))
    return sorted(set(re.findall(r"`([0-9a-f]{32})`", text)) - known)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--results", default=str(RESULTS_DIR), help="the results folder (default: results/)")
    parser.add_argument("--listing", default=None, metavar="FILE", help="also write what is imported to FILE")
    parser.add_argument("--dry-run", action="store_true", help="list only; import nothing")
    parser.add_argument(
        "--verify",
        default=None,
        metavar="FILE",
        help="after the import, fail if an MLflow run id quoted in FILE (e.g. results/summary.md) is not in the store",
    )
    args = parser.parse_args(argv)
    quiet_environment()
    results = Path(args.results)
    if not results.is_dir():
        raise SystemExit(f"error: no results folder {results}")
    records = collect(results)
    if args.listing:
        atomic_write_text(args.listing, listing(records))
    if args.dry_run:
        print(listing(records))
        return
    uri = tracking_uri()
    counts = import_records(records, uri)
    print(
        f"{counts.get('imported', 0)} runs imported, {counts.get('skipped', 0)} already in {uri}; "
        "browse with: python -m pipelines.mlflow_ui (make mlflow-ui)"
    )
    if args.verify:
        missing = missing_ids(Path(args.verify).read_text(), uri)
        if missing:
            raise SystemExit(
                f"error: {len(missing)} run ids quoted in {args.verify} are not in {uri}: {', '.join(missing)}"
            )
        print(f"every run id quoted in {args.verify} is in the store")


if __name__ == "__main__":
    main()
