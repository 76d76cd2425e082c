"""Calibrate the cost model: short training runs over shaped links, then an alpha-beta-gamma fit.

    python -m pipelines.calibrate            (the root dvc.yaml's ``calibrate`` stage)

For every workers x bandwidth point of ``stage.calibration`` in ``pipelines/leaderboard/params.yaml``
a virtual network is built (:mod:`harness.netem`) and one process per rank trains each calibration
method for ``max_steps`` steps, one after the other in the same process group (no restart cost
between methods). Each run gives one sample: per-step traffic by op (what ``CommStats`` counted),
per step the slowest rank's non-communication time, and the step time. The communication time
of a step is its time minus that compute: what the network and the collectives' software
cost. :func:`harness.costmodel.fit` fits (alpha, efficiency, gamma) to those; the error table
compares modelled with measured step times at every calibrated point.

Writes ``results/costmodel/``: ``fit.json``, ``fit.md`` (parameters and error table), ``fit.png``
(measured against modelled), and ``runs/<bandwidth>/w<workers>/<method>/`` (each run's outputs).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
from pathlib import Path
from typing import Any

from harness import costmodel, netem
from harness.entry import quiet_environment, setup_logging
from harness.folders import RESULTS_DIR, artifacts_for
from harness.params import load_params
from pipelines.common import run_config
from trainer.fileio import atomic_write, atomic_write_json, atomic_write_text

PIPELINE = "leaderboard"
OUT = RESULTS_DIR / "costmodel"
log = logging.getLogger("calibrate")


def settings(scale: str | None = None) -> dict[str, Any]:
    params = load_params(PIPELINE)
    calibration = dict((params.get("stage") or {}).get("calibration") or {})
    missing = {"workers", "bandwidths", "methods", "max_steps"} - set(calibration)
    if missing:
        raise ValueError(
            f"pipelines/{PIPELINE}/params.yaml: stage.calibration lacks {', '.join(sorted(missing))}"
        )
    for method in calibration["methods"]:
        run_config(PIPELINE, method, scale)  # unknown methods fail before any network is built
    for rate in calibration["bandwidths"]:
        costmodel.parse_rate(rate)
    return calibration


def run_dir(rate: str, workers: int, method: str) -> Path:
    return OUT / "runs" / rate / f"w{workers}" / method


# -- worker: every rank of one workers x bandwidth point -------------------------------------------


def worker(rate: str, scale: str | None) -> None:
    import dataclasses

    from trainer import train
    from trainer.distributed import init_from_env, shutdown

    calibration = settings(scale)
    ctx = init_from_env()
    setup_logging(ctx.rank)
    try:
        for method in calibration["methods"]:
            config = dataclasses.replace(
                run_config(PIPELINE, method, scale),
                world_size=ctx.world_size,
                max_steps=int(calibration["max_steps"]),
                eval_every=10**9,  # one evaluation, at the end
                log_every=10**9,
                checkpoint_every=10**9,
            )
            train(
                config,
                run_dir(rate, ctx.world_size, method),
                artifacts_dir=artifacts_for(run_dir(rate, ctx.world_size, method)),
                experiment="costmodel",
                run_name=f"{method}@{rate}x{ctx.world_size}",
                tags={"pipeline": "calibrate", "method": method},
                ctx=ctx,
            )
    finally:
        shutdown()


# -- driver ------------------------------------------------------------------------------------------


def sample(rate: str, workers: int, method: str) -> costmodel.StepSample:
    folder = run_dir(rate, workers, method)
    metrics = json.loads((folder / "metrics.json").read_text())
    run = json.loads((folder / "run.json").read_text())
    steps = metrics["steps"]
    step = metrics["wall_seconds"] / steps
    compute = metrics["sync_compute_seconds"] / steps
    return costmodel.StepSample(
        p=workers,
        rate_bps=costmodel.parse_rate(rate),
        ops={op: (calls, nbytes) for op, (calls, nbytes) in run["comm_ops_per_step"].items()},
        comm_seconds=max(step - compute, 1e-9),
        compute_seconds=compute,
        label=method,
    )


def measure(calibration: dict[str, Any], scale: str | None) -> None:
    for rate in calibration["bandwidths"]:
        for workers in calibration["workers"]:
            for method in calibration["methods"]:
                shutil.rmtree(run_dir(rate, workers, method), ignore_errors=True)  # fresh, never resumed
            argv = [sys.executable, "-m", "pipelines.calibrate", "--worker", "--rate", rate]
            argv += ["--scale", scale] if scale else []
            log.info("calibrating: %d workers at %s", workers, rate)
            with netem.VirtualNetwork(int(workers), rate) as network:
                code = netem.run_workers(network, argv)
            if code != 0:
                raise SystemExit(f"calibration run at {workers} workers, {rate} failed (exit {code})")


def report(calibration: dict[str, Any]) -> costmodel.Fit:
    samples = [
        sample(rate, workers, method)
        for rate in calibration["bandwidths"]
        for workers in calibration["workers"]
        for method in calibration["methods"]
    ]
    fit = costmodel.fit(samples)
    OUT.mkdir(parents=True, exist_ok=True)
    atomic_write_json(OUT / "fit.json", fit.to_dict())
    verdict = "within" if fit.max_abs_step_error <= 0.25 else "NOT within"
    text = (
        "# Cost-model calibration\n\n"
        "Short training runs (`pipelines/leaderboard/params.yaml`, `stage.calibration`) over links shaped "
        "with tc; communication = step time minus, per step, the slowest rank's compute. Command: "
        "`python -m pipelines.calibrate`.\n\n"
        + fit.markdown()
        + f"\n\nLargest step-time error: {fit.max_abs_step_error:.1%} ({verdict} the 25% target); "
        f"largest communication-time error: {fit.max_abs_comm_error:.1%}.\n"
    )
    atomic_write_text(OUT / "fit.md", text)
    plot(fit, OUT / "fit.png")
    return fit


def plot(fit: costmodel.Fit, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    fig, ax = plt.subplots(figsize=(5.5, 5))
    for label in sorted({r.label for r in fit.rows}):
        rows = [r for r in fit.rows if r.label == label]
        ax.scatter([r.step_measured * 1e3 for r in rows], [r.step_modelled * 1e3 for r in rows], label=label)
        for r in rows:
            ax.annotate(f"{r.p}w {costmodel.format_rate(r.rate_bps)}", (r.step_measured * 1e3, r.step_modelled * 1e3),
                        fontsize=6, alpha=0.7)  # fmt: skip
    top = max(max(r.step_measured, r.step_modelled) for r in fit.rows) * 1e3 * 1.1
    ax.plot([0, top], [0, top], "k--", lw=0.8)
    ax.fill_between([0, top], [0, top * 0.75], [0, top * 1.25], color="grey", alpha=0.15, label="±25%")
    ax.set(xlabel="measured step time (ms)", ylabel="modelled step time (ms)", xscale="log", yscale="log")
    ticks = [t for t in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000) if t <= top]
    for axis in (ax.xaxis, ax.yaxis):  # plain numbers at 1-2-5 steps; the default minor labels overlap
        axis.set_major_locator(ticker.FixedLocator(ticks))
        axis.set_major_formatter(ticker.ScalarFormatter())
        axis.set_minor_formatter(ticker.NullFormatter())
    ax.set_title("cost model: modelled vs measured step time", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    atomic_write(path, lambda p: fig.savefig(p, format="png", dpi=120))
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scale", default=None, help="override the leaderboard params' `scale`")
    parser.add_argument("--report-only", action="store_true", help="refit from the runs already on disk")
    parser.add_argument(
        "--workers", type=int, nargs="+", default=None, help="override stage.calibration.workers"
    )
    parser.add_argument("--bandwidths", nargs="+", default=None, help="override stage.calibration.bandwidths")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rate", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    quiet_environment()
    if args.worker:
        worker(args.rate, args.scale)
        return
    setup_logging()
    try:
        calibration = settings(args.scale)
        if args.workers:
            calibration["workers"] = args.workers
        if args.bandwidths:
            for rate in args.bandwidths:
                costmodel.parse_rate(rate)  # a bad rate fails here
            calibration["bandwidths"] = list(args.bandwidths)
        if not args.report_only:
            netem.check_support()
    except (ValueError, netem.NetemError) as error:
        raise SystemExit(f"error: {error}") from None
    if not args.report_only:
        with netem.terminate_as_exception():
            measure(calibration, args.scale)
    fit = report(calibration)
    print((OUT / "fit.md").read_text())
    log.info("fit: %s; max step error %.1f%%", fit.params, 100 * fit.max_abs_step_error)


if __name__ == "__main__":
    main()
