"""The leaderboard: every method of the task suite, time to fp32's converged metric, per link rate.

    python -m pipelines.leaderboard                     (train every group, then the report)
    python -m pipelines.leaderboard --group cifar_s0_a  (one root ``leaderboard_train`` stage)
    python -m pipelines.leaderboard --report-only       (the root ``leaderboard`` stage)

Methods and recipes are the task suite's (``pipelines/suite``): ``<task>_<method>`` runs, 2 ranks.
Every method trains its recipe stretched to ``stage.stretch`` (2) times the steps, seeds
``stage.seeds``, stopping at fp32's target (:mod:`pipelines.leaderboard.training`: the groups of
runs and where they land). The target on a task: fp32's final evaluation on the suite's recipe (the
curve's own evaluation set, mean over the suite's seeds) less ``stage.target`` (0.5 accuracy
points, or ln 1.02 nats of test loss: +2 % perplexity); a run's time to target is its training
seconds (evaluations excluded) at the first evaluation reaching it, and the steps it took. A method
is ranked by its mean time over the seeds when every seed reached the target, and is "not within
2x steps" otherwise.

- **Measured** on ``stage.measured_task`` (the small-vision task): every method at every rate of
  ``stage.bandwidths``, one network namespace per rank behind tc-shaped links. Same seeds and code
  at every rate, so the same trajectory; only the clock differs.
- **Modelled** on every task: ``steps to target x (per-step compute + comm(ops, W, rate))``, from
  the run's own measurements (the slowest rank's non-communication seconds per step, compression
  included; the bytes each collective carried per step) through the cost model calibrated over
  shaped links (``results/costmodel/fit.json``, the root ``calibrate`` stage).
- **Spot checks** (``stage.spot_checks``, ``<run>@<rate>``): runs of the modelled tasks measured over
  shaped links too, against their modelled time (error).

Writes ``results/leaderboard/report.{md,json}`` and ``leaderboard.png``, and, with the cost model,
an extrapolation of the measured task's methods to 64-512 workers (from the suite's runs).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from harness import costmodel, netem
from harness.claims import Runs, finite, load_runs, suite_tasks
from harness.entry import quiet_environment, setup_logging
from harness.folders import RESULTS_DIR
from harness.params import load_params
from harness.report import log_report, read_csv
from pipelines.leaderboard.report import markdown, plot
from pipelines.leaderboard.training import (
    PIPELINE,
    Settings,
    groups,
    launch_group,
    modelled_group,
    settings,
    stop_at,
)
from trainer.fileio import atomic_write_json, atomic_write_text

OUT = RESULTS_DIR / PIPELINE
SUITE = RESULTS_DIR / "suite"
FIT = RESULTS_DIR / "costmodel" / "fit.json"


def _curve_value(row: dict[str, float], metric: str) -> float:
    return 100 * row["test_accuracy"] if metric == "accuracy" else row["test_loss"]


def first_reach(evals: list[dict[str, float]], target: float, metric: str) -> dict[str, float] | None:
    """The first evaluation at or past ``target`` (accuracy: >=, loss: <=), or None."""
    for row in evals:
        value = _curve_value(row, metric)
        if (value >= target) if metric == "accuracy" else (value <= target):
            return row
    return None


def profile(name: str, metrics: dict[str, Any], info: dict[str, Any]) -> costmodel.MethodProfile:
    """Per-step compute (slowest rank, compression split out) and traffic of a run."""
    steps = metrics["steps"]
    compress = (metrics["compress_seconds"] + metrics["decompress_seconds"]) / steps
    return costmodel.MethodProfile(
        name=name,
        compute_seconds=max(metrics["sync_compute_seconds"] / steps - compress, 0.0),
        compress_seconds=compress,
        ops={op: (c, b) for op, (c, b) in info["comm_ops_per_step"].items()},
        p_measured=int(metrics["world_size"]),
    )


def modelled_step(prof: costmodel.MethodProfile, rate: str, params: costmodel.LinkParams) -> float:
    sample = costmodel.StepSample(
        p=prof.p_measured,
        rate_bps=costmodel.parse_rate(rate),
        ops=prof.ops,
        comm_seconds=0.0,
        compute_seconds=prof.compute_seconds + prof.compress_seconds,
    )
    return costmodel.step_time(sample, params)


def targets(suite: Runs, cfg: Settings) -> dict[str, float]:
    """task -> fp32's final curve value (mean over its seeds) less the slack."""
    out = {}
    for task in cfg.tasks:
        metric = suite_tasks()[task]["metric"]
        finals = [_curve_value(r["eval"][-1], metric) for r in suite[f"{task}_fp32"].values()]
        mean = sum(finals) / len(finals)
        out[task] = mean - cfg.accuracy_points if metric == "accuracy" else mean + cfg.loss_nats
    return out


def _seed_run(folder: Path) -> dict[str, Any]:
    if not (folder / "metrics.json").exists():
        group = folder.parent.parent.name
        raise SystemExit(
            f"error: no leaderboard run in {folder}: train its group (python -m pipelines.leaderboard "
            f"--group {group}, the root stage leaderboard_train@{group})"
        )
    return {
        "metrics": json.loads((folder / "metrics.json").read_text()),
        "info": json.loads((folder / "run.json").read_text()),
        "eval": read_csv(folder / "eval_curve.csv"),
    }


def seed_runs(cfg: Settings, task: str, run: str, rate: str, out: Path) -> dict[int, dict[str, Any]]:
    """seed -> the stretched run of ``run`` behind the ranking at ``rate`` (measured task: the group
    shaped to that rate; a modelled task: its unshaped group of that seed)."""
    runs = out / "runs"
    if task == cfg.measured_task:
        return {s: _seed_run(runs / f"{task}_{rate}" / run / f"seed{s}") for s in cfg.seeds}
    return {s: _seed_run(runs / modelled_group(cfg, run, s) / run / f"seed{s}") for s in cfg.seeds}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def method_row(
    cfg: Settings, task: str, method: str, rate: str, goal: float, seeds: dict[int, dict[str, Any]],
    params: costmodel.LinkParams | None, step_limit: int,
) -> dict[str, Any]:  # fmt: skip
    """One method at one rate: the steps each seed took to fp32's target (None: not within the
    stretched run), and the time to target, mean over the seeds, when every seed reached it."""
    metric = suite_tasks()[task]["metric"]
    reached = {s: first_reach(r["eval"], goal, metric) for s, r in seeds.items()}
    steps = {s: (e["step"] if e else None) for s, e in reached.items()}
    within = all(v is not None for v in steps.values())
    first = seeds[min(seeds)]
    prof = profile(f"{task}_{method}", first["metrics"], first["info"])
    row: dict[str, Any] = {
        "task": task,
        "method": method,
        "rate": rate,
        "target": goal,
        "step_limit": step_limit,
        "seeds": sorted(seeds),
        "steps_to_target": [steps[s] for s in sorted(seeds)],
        "reached_seeds": sum(v is not None for v in steps.values()),
        "within": within,
        "mean_steps_to_target": _mean([float(v) for v in steps.values() if v is not None])
        if within
        else None,
        "bits_per_step": first["metrics"]["bits_per_step"],
        "compression_factor": first["metrics"]["compression_factor"],
        "compute_ms": 1e3 * (prof.compute_seconds + prof.compress_seconds),
        "run_ids": [seeds[s]["info"]["mlflow_run_id"] for s in sorted(seeds)],
        "git_shas": sorted({r["info"]["git_sha"] for r in seeds.values()}),
    }
    if params is not None:
        step = modelled_step(prof, rate, params)
        row["modelled_step_ms"] = 1e3 * step
        row["modelled_seconds_per_seed"] = [
            None if (v := steps[s]) is None else v * step for s in sorted(seeds)
        ]
        taken = [float(v) for v in steps.values() if v is not None]  # every seed's when within
        row["modelled_seconds"] = _mean([v * step for v in taken]) if within else math.nan
    if task == cfg.measured_task:
        walls = [e["wall_seconds"] for e in reached.values() if e is not None]
        row["measured_seconds"] = _mean(walls) if within else math.nan
        row["measured_step_ms"] = _mean(
            [1e3 * r["metrics"]["wall_seconds"] / r["metrics"]["steps"] for r in seeds.values()]
        )
        row["network"] = first["info"].get("network", "host")
        if "modelled_step_ms" in row:
            row["error_step"] = row["modelled_step_ms"] / row["measured_step_ms"] - 1
    return row


def spot_check(
    cfg: Settings, run: str, rate: str, goal: float, rows: list[dict[str, Any]], out: Path
) -> dict[str, Any] | None:
    """A modelled run measured over shaped links (seed ``cfg.seeds[0]``) against its modelled time."""
    task, seed = run.split("_", 1)[0], cfg.seeds[0]
    measured = _seed_run(out / "runs" / f"spot_{rate}" / run / f"seed{seed}")
    modelled = next((r for r in rows if f"{r['task']}_{r['method']}" == run and r["rate"] == rate), None)
    if modelled is None or "modelled_step_ms" not in modelled:
        return None
    reached = first_reach(measured["eval"], goal, suite_tasks()[task]["metric"])
    measured_seconds = reached["wall_seconds"] if reached else math.nan
    modelled_seconds = modelled["modelled_seconds_per_seed"][0]
    measured_step = 1e3 * measured["metrics"]["wall_seconds"] / measured["metrics"]["steps"]
    return {
        "run": run,
        "rate": rate,
        "seed": seed,
        "measured_seconds": measured_seconds,
        "measured_step_ms": measured_step,
        "measured_run_id": measured["info"]["mlflow_run_id"],
        "network": measured["info"].get("network", "host"),
        "modelled_seconds": math.nan if modelled_seconds is None else modelled_seconds,
        "modelled_step_ms": modelled["modelled_step_ms"],
        "error_step": modelled["modelled_step_ms"] / measured_step - 1,
        "error_time": (math.nan if modelled_seconds is None else modelled_seconds) / measured_seconds - 1,
    }


def collect(
    cfg: Settings, suite: Runs, params: costmodel.LinkParams | None, out: Path = OUT
) -> dict[str, Any]:
    goal = targets(suite, cfg)
    rows: list[dict[str, Any]] = []
    for task in cfg.tasks:
        limit = cfg.stretch * int(suite[f"{task}_fp32"][min(suite[f"{task}_fp32"])]["metrics"]["steps"])
        for method in cfg.methods:
            for rate in cfg.bandwidths:
                seeds = seed_runs(cfg, task, f"{task}_{method}", rate, out)
                rows.append(method_row(cfg, task, method, rate, goal[task], seeds, params, limit))
    for row in rows:  # speed-up over fp32 at the same task and rate, measured where measured
        base = next(
            r for r in rows if (r["task"], r["rate"], r["method"]) == (row["task"], row["rate"], "fp32")
        )
        key = "measured_seconds" if "measured_seconds" in row else "modelled_seconds"
        if key in row:
            row["speedup"] = base[key] / row[key]
    spots = [
        s
        for run, rate in cfg.spot_checks
        if (s := spot_check(cfg, run, rate, goal[run.split("_", 1)[0]], rows, out))
    ]
    extrapolation: list[dict[str, Any]] = []
    used = params
    if params is not None:
        assumed = cfg.extrapolation.get("alpha_us")  # an assumed cluster latency (params.yaml)
        used = params if assumed is None else dataclasses.replace(params, alpha=float(assumed) * 1e-6)
        profiles = [
            profile(
                m,
                suite[f"{cfg.measured_task}_{m}"][0]["metrics"],
                suite[f"{cfg.measured_task}_{m}"][0]["info"],
            )
            for m in cfg.methods
        ]
        extrapolation = costmodel.extrapolate(
            profiles,
            used,
            workers=[int(w) for w in cfg.extrapolation.get("workers", (64, 128, 256, 512))],
            rates=[
                costmodel.parse_rate(r)
                for r in cfg.extrapolation.get("bandwidths", ("10gbit", "25gbit", "100gbit"))
            ],
        )
    return {
        "targets": goal,
        "stretch": cfg.stretch,
        "rows": rows,
        "spot_checks": spots,
        "fitted_params": dataclasses.asdict(params) if params is not None else None,
        "extrapolation_params": dataclasses.asdict(used) if used is not None else None,
        "extrapolation": extrapolation,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--scale", default=None, help="the suite scale of the shaped runs (default: the suite's)"
    )
    parser.add_argument("--report-only", action="store_true", help="rebuild the report from the runs on disk")
    parser.add_argument(
        "--suite", default=str(SUITE), help="the suite's results folder (runs/, evaluations/)"
    )
    parser.add_argument(
        "--out", default=str(OUT), help="this stage's results folder (default: results/leaderboard)"
    )
    parser.add_argument("--tasks", nargs="+", help="suite tasks to rank (default: params stage.tasks)")
    parser.add_argument("--methods", nargs="+", help="methods to rank, fp32 among them (default: params)")
    parser.add_argument(
        "--bandwidths", nargs="+", help="shaped link rates for the measured task, e.g. 100mbit 1gbit"
    )
    parser.add_argument(
        "--spot-checks", nargs="+", help="measured spot checks of the model, <suite run>@<rate>"
    )
    parser.add_argument("--seeds", nargs="+", type=int, help="seeds of every method (default: params)")
    parser.add_argument(
        "--group",
        default=None,
        help="train only this group of runs (a root leaderboard_train stage: <measured task>_<rate>, "
        "<task>_s<seed>[_<part>], spot_<rate>), no report",
    )
    args = parser.parse_args(argv)
    quiet_environment()
    setup_logging()
    out = Path(args.out)
    suite = load_runs(Path(args.suite))
    try:
        cfg = settings(
            list(suite),
            {
                "tasks": args.tasks,
                "methods": args.methods,
                "bandwidths": args.bandwidths,
                "spot_checks": args.spot_checks,
                "seeds": args.seeds,
            },
        )
        chosen = groups(cfg)
        if args.group is not None:
            if args.group not in chosen:
                raise ValueError(f"--group {args.group!r}: no such group; the groups: {', '.join(chosen)}")
            chosen = {args.group: chosen[args.group]}
        if not args.report_only and any(g.rate for g in chosen.values()):
            netem.check_support()
    except (ValueError, netem.NetemError) as error:
        raise SystemExit(f"error: {error}") from None
    if not args.report_only:
        goal = targets(suite, cfg)
        with netem.terminate_as_exception():
            for name, group in chosen.items():
                stop = stop_at(group.task, goal[group.task])
                launch_group(group, cfg.stretch, out / "runs" / name, args.scale, stop)
        if args.group is not None:  # one train stage's runs: the report is its own stage
            return
    params = costmodel.LinkParams(**json.loads(FIT.read_text())["params"]) if FIT.exists() else None
    result = collect(cfg, suite, params, out)
    shas = sorted({r["info"]["git_sha"] for seeds in suite.values() for r in seeds.values()})
    shas = sorted(set(shas) | {sha for row in result["rows"] for sha in row["git_shas"]})
    scale = load_params("suite")["scale"]
    text = markdown(result, cfg, scale, shas)
    atomic_write_text(out / "report.md", text)
    atomic_write_json(out / "report.json", finite(result | {"scale": scale}))
    plot(result, cfg, out / "leaderboard.png")
    log_report(PIPELINE, [out / "report.md", out / "report.json", out / "leaderboard.png"])
    print(text)


if __name__ == "__main__":
    main()
