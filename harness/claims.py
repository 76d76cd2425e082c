"""Runs and claims for the report stages: one way to read a pipeline's trained and evaluated runs,
one way to turn a paper's claim into a verdict (:mod:`harness.verdict`).

A pipeline's runs live under ``results/<pipeline>/runs/<group>/<run>/seed<k>/`` (the train stage)
with their whole-test-split measurement in ``results/<pipeline>/evaluations/<group>/<run>/seed<k>.json``
(the evaluate stage). Paper reports read the suite's runs for their accuracy claims and their own
runs for their own experiments, and judge both with :func:`judge_claim`.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.folders import RESULTS_DIR
from harness.params import load_params
from harness.report import read_csv
from harness.verdict import Claim, LongerTraining, difference, judge, min_seeds_for

Runs = dict[str, dict[int, dict[str, Any]]]  # run -> seed -> its files


def load_runs(root: Path, *, require_evaluation: bool = True) -> Runs:
    """run -> seed -> ``metrics``, ``info`` (run.json), ``eval`` / ``train`` curves, ``evaluation``
    and ``group``. A trained run without its evaluation fails with the command that makes it."""
    runs: Runs = defaultdict(dict)
    for metrics_file in sorted((root / "runs").glob("*/*/seed*/metrics.json")):
        folder = metrics_file.parent
        group, run, seed = (
            folder.parent.parent.name,
            folder.parent.name,
            int(folder.name.removeprefix("seed")),
        )
        evaluation_file = root / "evaluations" / group / run / f"{folder.name}.json"
        if not evaluation_file.exists() and require_evaluation:
            raise SystemExit(
                f"error: {folder} has no evaluation ({evaluation_file}): run `python -m pipelines.evaluate "
                f"{root.name} {group}` (or dvc repro)"
            )
        runs[run][seed] = {
            "group": group,
            "metrics": json.loads(metrics_file.read_text()),
            "info": json.loads((folder / "run.json").read_text()),
            "eval": read_csv(folder / "eval_curve.csv"),
            "train": read_csv(folder / "train_curve.csv"),
            "evaluation": json.loads(evaluation_file.read_text()) if evaluation_file.exists() else None,
        }
    if not runs:
        raise SystemExit(
            f"error: no trained runs under {root / 'runs'}: dvc repro pipelines/{root.name}/dvc.yaml"
        )
    return dict(runs)


# What a claim's metric is measured in: the unit written after a number and its decimals. The suite's
# tasks use accuracy (points) and loss (nats); the papers' own claims also judge times and ratios.
UNITS: dict[str, tuple[str, int]] = {
    "accuracy": (" pts", 2),
    "loss": (" nats", 4),
    "seconds": (" s", 2),
    "ms": (" ms", 3),
    "ratio": ("x", 3),
}


def unit(metric: str) -> tuple[str, int]:
    """``metric``'s unit and decimals (:data:`UNITS`)."""
    if metric not in UNITS:
        raise ValueError(f"unknown claim metric {metric!r}; valid: {', '.join(UNITS)}")
    return UNITS[metric]


def format_value(value: float, metric: str, *, signed: bool = False) -> str:
    """A value of ``metric`` with its decimals (signed: a difference), without the unit."""
    decimals = unit(metric)[1]
    return f"{value:+.{decimals}f}" if signed else f"{value:.{decimals}f}"


def metric_value(evaluation: dict[str, float], metric: str) -> float:
    """A task's metric from an evaluation: accuracy in points, or test loss in nats."""
    if metric == "accuracy":
        return 100 * evaluation["test_accuracy"]
    if metric == "loss":
        return evaluation["test_loss"]
    raise ValueError(f"unknown task metric {metric!r}; valid: accuracy, loss")


def values(runs: Runs, run: str, metric: str) -> dict[int, float]:
    """seed -> the run's metric on the whole test split."""
    if run not in runs:
        raise SystemExit(f"error: no results for run {run!r} (have: {', '.join(sorted(runs))})")
    return {seed: metric_value(r["evaluation"], metric) for seed, r in runs[run].items()}


def summarize(seeds: dict[int, dict[str, Any]], metric: str, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """A run's row over its seeds: the metric's mean and std (whole test split), bits, compression
    and wall seconds (means), MLflow ids, git sha, and the means of ``extra`` metrics.json keys
    (None where a run has none)."""
    import statistics

    evaluated = [metric_value(seeds[s]["evaluation"], metric) for s in sorted(seeds)]
    metrics = [seeds[s]["metrics"] for s in sorted(seeds)]
    row: dict[str, Any] = {
        "seeds": sorted(seeds),
        "mean": statistics.fmean(evaluated),
        "std": statistics.stdev(evaluated) if len(evaluated) > 1 else 0.0,
        "bits_per_step": statistics.fmean(m["bits_per_step"] for m in metrics),
        "dense_bits_per_step": metrics[0]["dense_bits_per_step"],
        "compression_factor": statistics.fmean(m["compression_factor"] for m in metrics),
        "wall_seconds": statistics.fmean(m["wall_seconds"] for m in metrics),
        "compress_seconds": statistics.fmean(m["compress_seconds"] for m in metrics),
        "mlflow_run_ids": [seeds[s]["info"]["mlflow_run_id"] for s in sorted(seeds)],
        "git_sha": seeds[min(seeds)]["info"]["git_sha"],
    }
    for key in extra:
        found = [m[key] for m in metrics if m.get(key) is not None]
        row[key] = statistics.fmean(found) if found else None
    return row


def no_loss_claim(metric: str, tolerance: float) -> Claim:
    """ "No loss beyond ``tolerance`` against the baseline" for a metric (accuracy: higher is better)."""
    return Claim(lower=-tolerance) if metric == "accuracy" else Claim(upper=tolerance)


def suite_tasks() -> dict[str, dict[str, Any]]:
    """The suite's tasks (title, metric, bar, tolerance, convergence) from its params.yaml ``stage``."""
    return dict(load_params("suite")["stage"]["tasks"])


def suite_convergence(root: Path | None = None) -> dict[str, LongerTraining]:
    """task -> the suite's fp32 convergence check (twice the epochs; from the suite report)."""
    path = (root or RESULTS_DIR / "suite") / "report.json"
    if not path.exists():
        raise SystemExit(
            f"error: no {path}: run the suite's report stage (dvc repro pipelines/suite/dvc.yaml)"
        )
    checks = {}
    for c in json.loads(path.read_text())["convergence"]:
        check: dict[str, Any] = {k: math.nan if v is None else v for k, v in c["check"].items()}  # null = NaN
        checks[c["task"]] = LongerTraining(**check)
    return checks


def baseline_check(checks: dict[str, LongerTraining], task: str) -> LongerTraining:
    """The suite's convergence check of ``task`` (a report judging against fp32 needs it)."""
    if task not in checks:
        raise SystemExit(
            f"error: the suite's report.json has no convergence check for task {task!r} "
            f"(has: {', '.join(sorted(checks)) or 'none'}): rerun its report stage"
        )
    return checks[task]


def judge_claim(
    name: str,
    method: dict[int, float],
    baseline: dict[int, float],
    claim: Claim,
    *,
    metric: str,
    convergence: LongerTraining | None = None,
) -> dict[str, Any]:
    """One claim's row: ``method - baseline`` with its 95 % interval and the verdict
    (``convergence``: the baseline's convergence check, when the baseline is the suite's fp32)."""
    unit(metric)  # a known metric, before any arithmetic
    diff = difference(method, baseline)
    verdict = judge(diff, claim, min_seeds=min_seeds_for(claim), baseline=convergence)
    return {
        "claim": name,
        "metric": metric,
        "method_mean": sum(method.values()) / len(method),
        "baseline_mean": sum(baseline.values()) / len(baseline),
        "seeds": [len(method), len(baseline)],
        "difference": diff.estimate,
        "low": diff.low,
        "high": diff.high,
        "paired": diff.paired,
        "bound": claim.describe(unit(metric)[0]),
        "verdict": verdict.verdict,
        "reason": verdict.reason,
    }


def claims_table(rows: list[dict[str, Any]]) -> str:
    """The claims as a markdown table (each in its metric's unit: :data:`UNITS`)."""
    lines = [
        "| claim | ours (mean) | against (mean) | seeds | Δ | 95 % interval | claim on Δ | verdict | why |",
        "|---|---:|---:|---|---:|---|---|---|---|",
    ]
    for r in rows:
        m = r["metric"]
        interval = (
            "(1 seed: none)"
            if math.isnan(r["low"])
            else f"[{format_value(r['low'], m)}, {format_value(r['high'], m)}]"
        )
        verdict = r["verdict"] if r["verdict"] == "inconclusive" else f"**{r['verdict']}**"
        sign = format_value(r["difference"], m, signed=True)
        lines.append(
            f"| {r['claim']} | {format_value(r['method_mean'], m)} | {format_value(r['baseline_mean'], m)} | "
            f"{r['seeds'][0]} vs {r['seeds'][1]} | {sign} | {interval} | {r['bound']} | {verdict} | {r['reason']} |"
        )
    return "\n".join(lines) + "\n"


def finite(value: Any) -> Any:
    """NaN and infinities as JSON null (strict JSON has no NaN), recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


@dataclass
class PaperReport:
    """What a paper's report stage writes: its markdown, claims and rows (``report.json``, without
    the rows' private ``_`` keys), figures (file name -> a function drawing it to a path) and any
    further ``report.json`` keys."""

    text: str
    claims: list[dict[str, Any]]
    rows: list[dict[str, Any]]
    figures: dict[str, Callable[[Path], None]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


def paper_report_main(
    pipeline: str,
    doc: str | None,
    build: Callable[[Path, Path, str], PaperReport],
    argv: list[str] | None = None,
) -> None:
    """A paper's report stage: ``--suite`` (the suite's results) and ``--root`` (this pipeline's),
    ``build(suite_root, root, scale)``, then ``report.md``, ``report.json``, the figures, the
    report's MLflow run (``log_report``) and the text on stdout."""
    import argparse

    from harness.entry import quiet_environment
    from harness.report import log_report
    from trainer.fileio import atomic_write_json, atomic_write_text

    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", default=str(RESULTS_DIR / "suite"), help="the suite's results folder")
    parser.add_argument("--root", default=str(RESULTS_DIR / pipeline), help="this pipeline's results folder")
    args = parser.parse_args(argv)
    quiet_environment()
    out = Path(args.root)
    scale = load_params(pipeline)["scale"]
    report = build(Path(args.suite), out, scale)
    atomic_write_text(out / "report.md", report.text)
    public = [{k: v for k, v in r.items() if not k.startswith("_")} for r in report.rows]
    payload = {"pipeline": pipeline, "scale": scale, "claims": report.claims, "rows": public, **report.extra}
    atomic_write_json(out / "report.json", finite(payload))
    for name, draw in report.figures.items():
        draw(out / name)
    log_report(pipeline, [out / "report.md", out / "report.json", *(out / name for name in report.figures)])
    print(report.text)
