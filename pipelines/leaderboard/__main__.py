"""The leaderboard: every method, same model and data, 4 workers over shaped links, side by side.

    python -m pipelines.leaderboard                 (the root dvc.yaml's ``leaderboard`` stage)
    python -m pipelines.leaderboard --report-only   (rebuild the tables from the runs on disk)

Methods are the runs of ``pipelines/leaderboard/params.yaml``: the shared library's in
``methods/common.yaml`` and one ``methods/<paper>.yaml`` per paper module, so a paper joins by
adding its file. Each method runs once per bandwidth of ``stage.bandwidths`` through
``pipelines.launch --net-bandwidth`` (one network namespace per rank, tc-shaped links) into
``results/leaderboard/<bandwidth>/<method>/``, logged to MLflow (experiment ``leaderboard``).

The report (``results/leaderboard/report.{md,json}``, ``leaderboard.png``) gives per bandwidth:
final accuracy, training time to reach the baseline's final accuracy less ``target_slack``, the
speed-up of that time over the baseline's, step time, bits per step and the compression factor
measured on the wire; the cost model's prediction of each run's step time (a check on runs the
fit never saw); and an extrapolation of every method to 64-512 workers at 10-100 Gbit/s with the
calibrated parameters (``results/costmodel/fit.json``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from common import costmodel, netem
from common.fileio import atomic_write, atomic_write_json, atomic_write_text
from pipelines.common import RESULTS_DIR, load_params, quiet_environment, run_config, setup_logging
from pipelines.report import read_csv

PIPELINE = "leaderboard"
OUT = RESULTS_DIR / PIPELINE
FIT = RESULTS_DIR / "costmodel" / "fit.json"
log = logging.getLogger(PIPELINE)


def stage_settings(scale: str | None) -> tuple[dict[str, Any], list[str]]:
    params = load_params(PIPELINE)
    stage = dict(params.get("stage") or {})
    methods = list(params["runs"])
    baseline = stage.get("baseline", "fp32")
    if baseline not in methods:
        raise ValueError(f"stage.baseline {baseline!r} is not a method; methods: {', '.join(methods)}")
    for method in methods:
        run_config(PIPELINE, method, scale)  # a bad method file fails before anything runs
    for rate in stage.get("bandwidths") or []:
        costmodel.parse_rate(rate)
    return stage, methods


def run_path(rate: str, method: str) -> Path:
    return OUT / rate / method


# -- running -----------------------------------------------------------------------------------------


def run_method(method: str, rate: str, scale: str | None) -> None:
    out = run_path(rate, method)
    # Always a fresh measurement: a complete checkpoint from an earlier code version would be resumed.
    shutil.rmtree(out / "ckpt", ignore_errors=True)
    command = [sys.executable, "-m", "pipelines.launch", PIPELINE, method, "--net-bandwidth", rate]
    command += ["--out", str(out), "--run-name", f"{method}@{rate}"]
    command += ["--scale", scale] if scale else []
    log.info("%s at %s", method, rate)
    process = subprocess.Popen(command)
    try:
        code = process.wait()
    except BaseException:  # Ctrl-C / SIGTERM: the launcher tears its namespaces down; wait for it
        process.terminate()
        process.wait()
        raise
    if code != 0:
        raise SystemExit(f"leaderboard run {method} at {rate} failed (exit {code}); earlier runs are kept")


# -- reporting ---------------------------------------------------------------------------------------


def time_to(eval_rows: list[dict[str, float]], target: float) -> float:
    """Training seconds at the first evaluation reaching ``target`` accuracy (nan if never)."""
    for row in eval_rows:
        if row["test_accuracy"] >= target:
            return row["wall_seconds"]
    return math.nan


def profile(method: str, metrics: dict[str, Any], run: dict[str, Any]) -> costmodel.MethodProfile:
    steps = metrics["steps"]
    compress = (metrics["compress_seconds"] + metrics["decompress_seconds"]) / steps
    return costmodel.MethodProfile(
        name=method,
        compute_seconds=max(metrics["sync_compute_seconds"] / steps - compress, 0.0),
        compress_seconds=compress,
        ops={op: (c, b) for op, (c, b) in run["comm_ops_per_step"].items()},
        p_measured=int(metrics["world_size"]),
    )


def collect(stage: dict[str, Any], methods: list[str]) -> dict[str, Any]:
    params = costmodel.LinkParams(**json.loads(FIT.read_text())["params"]) if FIT.exists() else None
    baseline = stage.get("baseline", "fp32")
    if baseline not in methods:
        raise SystemExit(
            f"the report needs the baseline {baseline!r} among the methods: {', '.join(methods)}"
        )
    slack = float(stage.get("target_slack", 0.005))
    tables: dict[str, list[dict[str, Any]]] = {}
    curves: dict[str, dict[str, list[dict[str, float]]]] = {}
    for rate in stage["bandwidths"]:
        rows, curves[rate] = [], {}
        for method in methods:
            folder = run_path(rate, method)
            if not (folder / "metrics.json").exists():
                raise SystemExit(f"{method} at {rate} has no results in {folder}: run the leaderboard first")
            metrics = json.loads((folder / "metrics.json").read_text())
            run = json.loads((folder / "run.json").read_text())
            evals = read_csv(folder / "eval_curve.csv")
            curves[rate][method] = evals
            steps = metrics["steps"]
            row = {
                "method": method,
                "network": run.get("network", "host"),
                "test_accuracy": metrics["test_accuracy"],
                "wall_seconds": metrics["wall_seconds"],
                "step_ms": 1e3 * metrics["wall_seconds"] / steps,
                "bits_per_step": metrics["bits_per_step"],
                "compression_factor": metrics["compression_factor"],
                "mlflow_run_id": run["mlflow_run_id"],
                "git_sha": run["git_sha"],
                "_evals": evals,
            }
            if params is not None:
                prof = profile(method, metrics, run)
                sample = costmodel.StepSample(
                    p=prof.p_measured,
                    rate_bps=costmodel.parse_rate(rate),
                    ops=prof.ops,
                    comm_seconds=0.0,
                    compute_seconds=prof.compute_seconds + prof.compress_seconds,
                )
                row["modelled_step_ms"] = 1e3 * costmodel.step_time(sample, params)
            rows.append(row)
        base = next(r for r in rows if r["method"] == baseline)
        target = base["test_accuracy"] - slack
        base_time = time_to(base["_evals"], target)
        for row in rows:
            row["target_accuracy"] = target
            row["time_to_target"] = time_to(row.pop("_evals"), target)
            row["speedup_to_target"] = base_time / row["time_to_target"]
        tables[rate] = rows
    extrapolation: list[dict[str, Any]] = []
    fitted = params
    if params is not None:
        ext = stage.get("extrapolation") or {}
        first = stage["bandwidths"][0]
        profiles = [
            profile(
                m,
                json.loads((run_path(first, m) / "metrics.json").read_text()),
                json.loads((run_path(first, m) / "run.json").read_text()),
            )
            for m in methods
        ]
        fitted = params
        if ext.get("alpha_us") is not None:  # an assumed cluster latency (see params.yaml)
            params = dataclasses.replace(params, alpha=float(ext["alpha_us"]) * 1e-6)
        extrapolation = costmodel.extrapolate(
            profiles,
            params,
            workers=[int(w) for w in ext.get("workers", (64, 128, 256, 512))],
            rates=[costmodel.parse_rate(r) for r in ext.get("bandwidths", ("10gbit", "25gbit", "100gbit"))],
        )
    return {
        "extrapolation_params": dataclasses.asdict(params) if params is not None else None,
        "fitted_params": dataclasses.asdict(fitted) if params is not None else None,
        "baseline": baseline,
        "target_slack": slack,
        "tables": tables,
        "curves": curves,
        "fit": json.loads(FIT.read_text()) if FIT.exists() else None,
        "extrapolation": extrapolation,
    }


def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    return format(value, spec)


def markdown(result: dict[str, Any], scale: str) -> str:
    out = [
        f"# Leaderboard (scale `{scale}`)\n",
        "Every method on the same model and data (`pipelines/leaderboard/params.yaml`), 4 gloo workers, each in "
        "its own network namespace behind a tc-shaped link of the given rate in both directions. "
        "Generated by `python -m pipelines.leaderboard`; every number comes from the runs' files.\n",
        f"Target: the {result['baseline']} run's final test accuracy less "
        f"{100 * result['target_slack']:.1f} points, at the same bandwidth. Time = training wall-clock "
        "(evaluation excluded) at the first evaluation reaching it; — = not reached.\n",
    ]
    for rate, rows in result["tables"].items():
        out.append(f"\n## {costmodel.format_rate(costmodel.parse_rate(rate))}\n")
        out.append(
            "| method | final accuracy (%) | time to target (s) | speed-up | train wall (s) | step (ms) "
            "| modelled step (ms) | bits / step / rank | compression (x) | MLflow run id |"
        )
        out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        for r in sorted(rows, key=lambda r: (math.isnan(r["time_to_target"]), r["time_to_target"])):
            out.append(
                f"| {r['method']} | {100 * r['test_accuracy']:.2f} | {_fmt(r['time_to_target'], '.1f')} "
                f"| {_fmt(r['speedup_to_target'], '.2f')}x | {r['wall_seconds']:.1f} | {r['step_ms']:.1f} "
                f"| {_fmt(r.get('modelled_step_ms'), '.1f')} | {r['bits_per_step']:,.0f} "
                f"| {_fmt(r['compression_factor'], '.1f')} | `{r['mlflow_run_id']}` |"
            )
        target = rows[0]["target_accuracy"]
        out.append(f"\nTarget accuracy: {100 * target:.2f}%.")
    if result["extrapolation"]:
        fit = result["fitted_params"]
        used = result["extrapolation_params"]
        out.append("\n## Extrapolation (cost model)\n")
        alpha_note = (
            f"alpha = {1e6 * used['alpha']:.1f} µs is ASSUMED (`stage.extrapolation.alpha_us`), not measured: "
            f"the calibrated {1e6 * fit['alpha']:.0f} µs is mostly ranks taking turns on this machine's 2 cores"
            if used["alpha"] != fit["alpha"]
            else f"alpha = {1e6 * fit['alpha']:.1f} µs (calibrated)"
        )
        out.append(
            f"Parameters: {alpha_note}; efficiency = {fit['efficiency']:.3f} and gamma = "
            f"{1e9 * fit['gamma']:.3f} ns/byte calibrated (`results/costmodel/fit.md`). Each method's "
            "per-step compute, compression time and traffic are the ones measured in its run at the first "
            "bandwidth above (this model and this CPU); per-rank bytes are held constant as workers grow "
            "(all-reduce buffers, top-k contributions), so all-gather methods pay (p-1) times their "
            "contribution. A model of communication scaling, not a measurement.\n"
        )
        out.append(costmodel.extrapolation_markdown(result["extrapolation"]))
    return "\n".join(out) + "\n"


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = list(result["tables"])
    fig, axes = plt.subplots(2, len(rates), figsize=(5.5 * len(rates), 8), squeeze=False)
    for col, rate in enumerate(rates):
        ax = axes[0][col]
        for method, evals in result["curves"][rate].items():
            ax.plot(
                [r["wall_seconds"] for r in evals],
                [100 * r["test_accuracy"] for r in evals],
                marker=".",
                label=method,
            )
        target = 100 * result["tables"][rate][0]["target_accuracy"]
        ax.axhline(target, color="k", ls="--", lw=0.8, label="target")
        ax.set(xlabel="training wall-clock (s)", ylabel="test accuracy (%)",
               ylim=(max(0.0, target - 15), 100))  # fmt: skip
        ax.set_title(f"{costmodel.format_rate(costmodel.parse_rate(rate))}, 4 workers")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        ax = axes[1][col]
        rows = result["tables"][rate]
        times = [r["time_to_target"] if math.isfinite(r["time_to_target"]) else 0.0 for r in rows]
        bars = ax.bar([r["method"] for r in rows], times, color="tab:blue")
        for bar, r in zip(bars, rows, strict=True):
            text = (
                "not reached" if not math.isfinite(r["time_to_target"]) else f"{r['speedup_to_target']:.1f}x"
            )
            ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center",
                        va="bottom", fontsize=7)  # fmt: skip
        ax.set(ylabel="time to target accuracy (s)")
        ax.tick_params(axis="x", rotation=30, labelsize=7)
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    atomic_write(path, lambda p: fig.savefig(p, format="png", dpi=110))
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scale", default=None, help="override params.yaml's `scale`")
    parser.add_argument("--report-only", action="store_true", help="rebuild the report from the runs on disk")
    parser.add_argument("--methods", nargs="+", default=None, help="only these methods (default: all)")
    parser.add_argument("--bandwidths", nargs="+", default=None, help="override stage.bandwidths")
    args = parser.parse_args(argv)
    quiet_environment()
    setup_logging()
    try:
        stage, methods = stage_settings(args.scale)
        if args.bandwidths:
            for rate in args.bandwidths:
                costmodel.parse_rate(rate)  # a bad rate fails here
            stage["bandwidths"] = list(args.bandwidths)
        selected = args.methods or methods
        unknown = sorted(set(selected) - set(methods))
        if unknown:
            raise ValueError(f"unknown method(s) {', '.join(unknown)}; methods: {', '.join(methods)}")
        if not args.report_only:
            netem.check_support()
    except (ValueError, netem.NetemError) as error:
        raise SystemExit(f"error: {error}") from None
    scale = args.scale or load_params(PIPELINE)["scale"]
    if not args.report_only:
        with netem.terminate_as_exception():
            for rate in stage["bandwidths"]:
                for method in selected:
                    run_method(method, rate, args.scale)
    result = collect(stage, selected)
    OUT.mkdir(parents=True, exist_ok=True)
    text = markdown(result, scale)
    atomic_write_text(OUT / "report.md", text)
    atomic_write_json(
        OUT / "report.json", {k: v for k, v in result.items() if k != "curves"} | {"scale": scale}
    )
    plot(result, OUT / "leaderboard.png")
    print(text)


if __name__ == "__main__":
    main()
