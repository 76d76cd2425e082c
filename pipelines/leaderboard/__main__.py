"""The leaderboard: every method of the task suite, time to fp32's converged metric, per link rate.

    python -m pipelines.leaderboard                 (the root dvc.yaml's ``leaderboard`` stage)
    python -m pipelines.leaderboard --report-only   (rebuild the report from the runs on disk)

Methods and recipes are the task suite's (``pipelines/suite``): ``<task>_<method>`` runs, 2 ranks.
The target on a task: fp32's final evaluation (the curve's own evaluation set, mean over the suite's
seeds) less ``stage.target`` (0.5 accuracy points, or ln 1.02 nats of test loss: +2 % perplexity);
a run's time to target is its training seconds (evaluations excluded) at the first evaluation
reaching it.

- **Measured** on ``stage.measured_task`` (the small-vision task): each method's suite run (seed 0,
  the suite's recipe) trained again at every rate of ``stage.bandwidths``, one network namespace per
  rank behind tc-shaped links (``pipelines.launch --net-bandwidth``), into
  ``results/leaderboard/measured/<rate>/``. Same seed and code as the suite's run, so the same
  trajectory; only the clock differs. Each ends at its first evaluation past the target (the
  launcher's ``--stop-at``: the lr schedule still spans the whole run), so its measured step time
  is the mean over the steps to target, and a method that never reaches it runs whole.
- **Modelled** on every task: ``steps to target x (per-step compute + comm(ops, W, rate))``, from
  the suite run's own measurements (the slowest rank's non-communication seconds per step,
  compression included; the bytes each collective carried per step) through the cost model
  calibrated over shaped links (``results/costmodel/fit.json``, the root ``calibrate`` stage).
- **Spot checks** (``stage.spot_checks``, ``<run>@<rate>``): runs of the modelled tasks measured over
  shaped links too, into ``results/leaderboard/spot/<rate>/``, against their modelled time (error).

Writes ``results/leaderboard/report.{md,json}`` and ``leaderboard.png``, and, with the cost model,
an extrapolation of the measured task's methods to 64-512 workers.
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

from common.fileio import atomic_write_json, atomic_write_text
from common.plots import method_color
from harness import costmodel, netem
from harness.claims import Runs, finite, load_runs, suite_tasks
from harness.entry import quiet_environment, setup_logging
from harness.folders import RESULTS_DIR, artifacts_for
from harness.params import load_params
from harness.report import log_report, read_csv, save_panels

PIPELINE = "leaderboard"
OUT = RESULTS_DIR / PIPELINE
SUITE = RESULTS_DIR / "suite"
FIT = RESULTS_DIR / "costmodel" / "fit.json"
log = logging.getLogger(PIPELINE)


@dataclasses.dataclass(frozen=True)
class Settings:
    tasks: list[str]
    methods: list[str]
    measured_task: str
    bandwidths: list[str]
    spot_checks: list[tuple[str, str]]  # (run, rate)
    accuracy_points: float
    loss_nats: float
    extrapolation: dict[str, Any]


def settings(suite_runs: list[str], overrides: dict[str, Any] | None = None) -> Settings:
    """The stage's settings (``overrides`` on top: the command line's), checked against the suite's
    runs, so a typo fails before anything runs."""
    stage = dict(load_params(PIPELINE).get("stage") or {})
    stage.update({k: v for k, v in (overrides or {}).items() if v is not None})
    tasks = list(stage.get("tasks") or suite_tasks())
    unknown = sorted(set(tasks) - set(suite_tasks()))
    if unknown:
        raise ValueError(
            f"stage.tasks: unknown task(s) {', '.join(unknown)}; the suite's: {', '.join(suite_tasks())}"
        )
    methods = list(stage.get("methods") or [])
    for task in tasks:
        missing = [m for m in methods if f"{task}_{m}" not in suite_runs]
        if missing:
            raise ValueError(f"stage.methods {', '.join(missing)} have no {task}_<method> run in the suite")
    if "fp32" not in methods:
        raise ValueError("stage.methods must include fp32 (the target is fp32's converged metric)")
    measured = str(stage.get("measured_task", tasks[0]))
    if measured not in tasks:
        raise ValueError(f"stage.measured_task {measured!r} is not among stage.tasks ({', '.join(tasks)})")
    rates = [str(r) for r in stage.get("bandwidths") or []]
    for rate in rates:
        costmodel.parse_rate(rate)
    spots = []
    for item in stage.get("spot_checks") or []:
        run, _, rate = str(item).partition("@")
        if run not in suite_runs or not rate:
            raise ValueError(
                f"stage.spot_checks {item!r}: expected <suite run>@<rate>, e.g. cifar_fp32@100mbit"
            )
        costmodel.parse_rate(rate)
        spots.append((run, rate))
    target = dict(stage.get("target") or {})
    return Settings(
        tasks=tasks,
        methods=methods,
        measured_task=measured,
        bandwidths=rates,
        spot_checks=spots,
        accuracy_points=float(target.get("accuracy_points", 0.5)),
        loss_nats=float(target.get("loss_nats", math.log(1.02))),
        extrapolation=dict(stage.get("extrapolation") or {}),
    )


# -- running -----------------------------------------------------------------------------------------


def stop_at(task: str, target: float) -> str:
    """The launcher's ``--stop-at`` for a task's target: a measured run ends where it reaches it."""
    if suite_tasks()[task]["metric"] == "accuracy":
        return f"test_accuracy={target / 100!r}"
    return f"test_loss={target!r}"


def launch_shaped(runs: list[str], rate: str, out: Path, scale: str | None, stop: str) -> None:
    """The suite's ``runs`` (seed 0) in one launch over links shaped to ``rate``, into ``out``, each
    ending at its first evaluation past the target (``stop``, the launcher's ``--stop-at``): time to
    target needs no step beyond it, and a run that never reaches it runs whole."""
    # Always a fresh measurement: a complete checkpoint from an earlier code version is never resumed,
    # but a partial one would be; the folder is this stage's own output.
    for run in runs:
        shutil.rmtree(artifacts_for(out / run / "seed0") / "ckpt", ignore_errors=True)
    command = [sys.executable, "-m", "pipelines.launch", "suite", ",".join(runs), "--seeds", "0"]
    command += ["--net-bandwidth", rate, "--out", str(out), "--stop-at", stop]  # into <out>/<run>/seed0
    command += ["--scale", scale] if scale else []
    log.info("%s at %s", ",".join(runs), rate)
    process = subprocess.Popen(command)
    try:
        code = process.wait()
    except BaseException:  # Ctrl-C / SIGTERM: the launcher tears its namespaces down; wait for it
        process.terminate()
        process.wait()
        raise
    if code != 0:
        raise SystemExit(
            f"leaderboard runs {', '.join(runs)} at {rate} failed (exit {code}); earlier runs are kept"
        )


# -- reporting ---------------------------------------------------------------------------------------


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


def _measured_row(folder: Path, target: float, metric: str) -> dict[str, Any]:
    if not (folder / "metrics.json").exists():
        raise SystemExit(
            f"error: no measured run in {folder}: run the leaderboard (python -m pipelines.leaderboard)"
        )
    metrics = json.loads((folder / "metrics.json").read_text())
    info = json.loads((folder / "run.json").read_text())
    reached = first_reach(read_csv(folder / "eval_curve.csv"), target, metric)
    return {
        "measured_seconds": reached["wall_seconds"] if reached else math.nan,
        "measured_step_ms": 1e3 * metrics["wall_seconds"] / metrics["steps"],
        "measured_run_id": info["mlflow_run_id"],
        "network": info.get("network", "host"),
    }


def collect(
    cfg: Settings, suite: Runs, params: costmodel.LinkParams | None, out: Path = OUT
) -> dict[str, Any]:
    goal = targets(suite, cfg)
    rows: list[dict[str, Any]] = []
    for task in cfg.tasks:
        metric = suite_tasks()[task]["metric"]
        for method in cfg.methods:
            seed = suite[f"{task}_{method}"][0]
            reached = first_reach(seed["eval"], goal[task], metric)
            prof = profile(f"{task}_{method}", seed["metrics"], seed["info"])
            for rate in cfg.bandwidths:
                row: dict[str, Any] = {
                    "task": task,
                    "method": method,
                    "rate": rate,
                    "target": goal[task],
                    "steps_to_target": reached["step"] if reached else None,
                    "bits_per_step": seed["metrics"]["bits_per_step"],
                    "compression_factor": seed["metrics"]["compression_factor"],
                    "compute_ms": 1e3 * (prof.compute_seconds + prof.compress_seconds),
                    "suite_run_id": seed["info"]["mlflow_run_id"],
                }
                if params is not None:
                    step = modelled_step(prof, rate, params)
                    row["modelled_step_ms"] = 1e3 * step
                    row["modelled_seconds"] = reached["step"] * step if reached else math.nan
                if task == cfg.measured_task:
                    row |= _measured_row(
                        out / "measured" / rate / f"{task}_{method}" / "seed0", goal[task], metric
                    )
                rows.append(row)
    for row in rows:  # speed-up over fp32 at the same task and rate, measured where measured
        base = next(
            r for r in rows if (r["task"], r["rate"], r["method"]) == (row["task"], row["rate"], "fp32")
        )
        key = "measured_seconds" if "measured_seconds" in row else "modelled_seconds"
        if key in row:
            row["speedup"] = base[key] / row[key]
    spots = []
    for run, rate in cfg.spot_checks:
        task = run.split("_", 1)[0]
        metric = suite_tasks()[task]["metric"]
        measured = _measured_row(out / "spot" / rate / run / "seed0", goal[task], metric)
        modelled = next((r for r in rows if f"{r['task']}_{r['method']}" == run and r["rate"] == rate), None)
        if modelled is None or "modelled_seconds" not in modelled:
            continue
        spots.append(
            {
                "run": run,
                "rate": rate,
                **measured,
                "modelled_seconds": modelled["modelled_seconds"],
                "modelled_step_ms": modelled["modelled_step_ms"],
                "error_step": modelled["modelled_step_ms"] / measured["measured_step_ms"] - 1,
                "error_time": modelled["modelled_seconds"] / measured["measured_seconds"] - 1,
            }
        )
    for row in (r for r in rows if "measured_step_ms" in r and "modelled_step_ms" in r):
        row["error_step"] = row["modelled_step_ms"] / row["measured_step_ms"] - 1
    extrapolation: list[dict[str, Any]] = []
    used = params
    if params is not None:
        assumed = cfg.extrapolation.get("alpha_us")  # an assumed cluster latency (params.yaml)
        extrapolated = params if assumed is None else dataclasses.replace(params, alpha=float(assumed) * 1e-6)
        used = extrapolated
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
            extrapolated,
            workers=[int(w) for w in cfg.extrapolation.get("workers", (64, 128, 256, 512))],
            rates=[
                costmodel.parse_rate(r)
                for r in cfg.extrapolation.get("bandwidths", ("10gbit", "25gbit", "100gbit"))
            ],
        )
    return {
        "targets": goal,
        "rows": rows,
        "spot_checks": spots,
        "fitted_params": dataclasses.asdict(params) if params is not None else None,
        "extrapolation_params": dataclasses.asdict(used) if used is not None else None,
        "extrapolation": extrapolation,
    }


def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    return format(value, spec)


def markdown(result: dict[str, Any], cfg: Settings, scale: str, shas: list[str]) -> str:
    tasks = suite_tasks()
    out = [
        f"# Leaderboard (scale `{scale}`)\n",
        "Every method of the task suite on its recipes, 2 gloo ranks. Generated by `python -m pipelines.leaderboard` "
        f"from the suite's runs (git {', '.join(shas)}) and the leaderboard's own shaped runs; every number comes "
        "from the runs' files.\n",
        f"Target: fp32's final evaluation less {cfg.accuracy_points} points (accuracy) or plus {cfg.loss_nats:.4f} "
        "nats of test loss (+2 % perplexity), on the curves' own evaluation set, mean over the suite's seeds. "
        "Time to target: training seconds (evaluations excluded) at the first evaluation reaching it; — = not "
        "reached. **measured**: trained over tc-shaped links (one namespace per rank). **modelled**: steps to "
        "target x (the run's measured compute per step + the calibrated cost model's communication time for its "
        "counted bytes at that rate).\n",
    ]
    for task in cfg.tasks:
        spec = tasks[task]
        out.append(
            f"\n## {spec['title']} (target {_fmt(result['targets'][task], '.4f' if spec['metric'] == 'loss' else '.2f')})\n"
        )
        measured = task == cfg.measured_task
        head = "| method | rate | steps to target | "
        head += "time to target, measured (s) | " if measured else ""
        head += "time to target, modelled (s) | speed-up vs fp32 | step ms: "
        head += "measured / modelled (error) |" if measured else "modelled |"
        out.append(head + " compute ms / step | bits / step / rank | compression (x) |")
        out.append("|---|---|---:|" + ("---:|" if measured else "") + "---:|---:|---:|---:|---:|---:|")
        rows = [r for r in result["rows"] if r["task"] == task]
        for rate in cfg.bandwidths:
            ranked = sorted(
                (r for r in rows if r["rate"] == rate),
                key=lambda r: (not math.isfinite(r.get("speedup", math.nan)), -r.get("speedup", 0.0)),
            )
            for r in ranked:
                cells = [
                    r["method"],
                    costmodel.format_rate(costmodel.parse_rate(rate)),
                    _fmt(r["steps_to_target"], ".0f"),
                ]
                if measured:
                    cells.append(_fmt(r.get("measured_seconds"), ".1f"))
                cells += [_fmt(r.get("modelled_seconds"), ".1f"), f"{_fmt(r.get('speedup'), '.2f')}x"]
                if measured:
                    cells.append(
                        f"{_fmt(r.get('measured_step_ms'), '.1f')} / {_fmt(r.get('modelled_step_ms'), '.1f')} "
                        f"({_fmt(100 * r['error_step'] if 'error_step' in r else None, '+.0f')} %)"
                    )
                else:
                    cells.append(_fmt(r.get("modelled_step_ms"), ".1f"))
                cells += [
                    f"{r['compute_ms']:.1f}",
                    f"{r['bits_per_step']:,.0f}",
                    _fmt(r["compression_factor"], ".1f"),
                ]
                out.append("| " + " | ".join(cells) + " |")
    if result["spot_checks"]:
        out += [
            "\n## Spot checks: the model against runs measured over shaped links\n",
            "| run | rate | measured step (ms) | modelled step (ms) | error | measured time to target (s) "
            "| modelled (s) | error | MLflow run id |",
            "|---|---|---:|---:|---:|---:|---:|---:|---|",
        ]
        for s in result["spot_checks"]:
            out.append(
                f"| {s['run']} | {costmodel.format_rate(costmodel.parse_rate(s['rate']))} | {s['measured_step_ms']:.1f} "
                f"| {s['modelled_step_ms']:.1f} | {100 * s['error_step']:+.0f} % | {_fmt(s['measured_seconds'], '.1f')} "
                f"| {_fmt(s['modelled_seconds'], '.1f')} | {_fmt(100 * s['error_time'], '+.0f')} % | `{s['measured_run_id']}` |"
            )
    if result["extrapolation"]:
        fit, used = result["fitted_params"], result["extrapolation_params"]
        alpha_note = (
            f"alpha = {1e6 * used['alpha']:.1f} µs is ASSUMED (`stage.extrapolation.alpha_us`), not measured: "
            f"the calibrated {1e6 * fit['alpha']:.0f} µs is mostly ranks taking turns on this machine's 2 cores"
            if used["alpha"] != fit["alpha"]
            else f"alpha = {1e6 * fit['alpha']:.1f} µs (calibrated)"
        )
        out += [
            f"\n## Extrapolation of the {tasks[cfg.measured_task]['title']} methods (cost model)\n",
            f"Parameters: {alpha_note}; efficiency = {fit['efficiency']:.3f} and gamma = {1e9 * fit['gamma']:.3f} "
            "ns/byte calibrated (`results/costmodel/fit.md`). Per-step compute, compression time and traffic as "
            "measured in each suite run (seed 0); per-rank bytes held constant as workers grow, so all-gather "
            "methods pay (p-1) times their contribution. A model of communication scaling, not a measurement.\n",
            costmodel.extrapolation_markdown(result["extrapolation"]),
        ]
    return "\n".join(out) + "\n"


def plot(result: dict[str, Any], cfg: Settings, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        len(cfg.tasks),
        1,
        figsize=(max(8.0, 0.35 * len(cfg.methods) * len(cfg.bandwidths) + 3), 3.4 * len(cfg.tasks)),
        squeeze=False,
    )
    width = 0.8 / len(cfg.methods)
    for ax, task in zip(axes[:, 0], cfg.tasks, strict=True):
        missed = []
        for i, method in enumerate(cfg.methods):
            xs, heights = [], []
            for j, rate in enumerate(cfg.bandwidths):
                row = next(
                    r for r in result["rows"] if (r["task"], r["method"], r["rate"]) == (task, method, rate)
                )
                value = row.get("measured_seconds", row.get("modelled_seconds", math.nan))
                x = j + (i - len(cfg.methods) / 2) * width + width / 2
                if math.isfinite(value):
                    xs.append(x)
                    heights.append(value)
                else:
                    missed.append((x, method))
            ax.bar(xs, heights, width, color=method_color(method))
            # the legend's entry, also for a method with no bar (its colour, not the default one)
            ax.plot([], [], marker="s", ls="", color=method_color(method), label=method)
        for x, method in missed:  # a cross on the axis: this method never reached the target
            ax.plot([x], [0], marker="x", color=method_color(method), clip_on=False, ms=6, mew=1.5)
        ax.set_xticks(
            range(len(cfg.bandwidths)),
            [costmodel.format_rate(costmodel.parse_rate(r)) for r in cfg.bandwidths],
        )
        kind = "measured" if task == cfg.measured_task else "modelled"
        ax.set(ylabel=f"time to target (s, {kind})", title=f"{suite_tasks()[task]['title']}"
               " (x: target not reached)")  # fmt: skip
    save_panels(fig, axes, path)


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
            },
        )
        if not args.report_only and (cfg.bandwidths or cfg.spot_checks):
            netem.check_support()
    except (ValueError, netem.NetemError) as error:
        raise SystemExit(f"error: {error}") from None
    if not args.report_only:
        goal = targets(suite, cfg)
        with netem.terminate_as_exception():
            measured = [f"{cfg.measured_task}_{m}" for m in cfg.methods]
            for rate in cfg.bandwidths:
                stop = stop_at(cfg.measured_task, goal[cfg.measured_task])
                launch_shaped(measured, rate, out / "measured" / rate, args.scale, stop)
            launches: dict[tuple[str, str], list[str]] = {}  # one per rate and task (its target)
            for run, rate in cfg.spot_checks:
                launches.setdefault((rate, run.split("_", 1)[0]), []).append(run)
            for (rate, task), runs in sorted(launches.items()):
                launch_shaped(runs, rate, out / "spot" / rate, args.scale, stop_at(task, goal[task]))
    params = costmodel.LinkParams(**json.loads(FIT.read_text())["params"]) if FIT.exists() else None
    result = collect(cfg, suite, params, out)
    shas = sorted({r["info"]["git_sha"] for seeds in suite.values() for r in seeds.values()})
    scale = load_params("suite")["scale"]
    text = markdown(result, cfg, scale, shas)
    atomic_write_text(out / "report.md", text)
    atomic_write_json(out / "report.json", finite(result | {"scale": scale}))
    plot(result, cfg, out / "leaderboard.png")
    log_report(PIPELINE, [out / "report.md", out / "report.json", out / "leaderboard.png"])
    print(text)


if __name__ == "__main__":
    main()
