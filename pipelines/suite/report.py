"""The suite's report: fp32's convergence per task, every method against it, one verdict rule.

    python -m pipelines.suite.report

Reads every trained run under ``results/suite/runs/<group>/<run>/seed<k>/`` (curves, bits, times,
MLflow ids) and its whole-test-split measurement under ``results/suite/evaluations/`` (the
evaluate stage), and writes ``results/suite/report.md``, ``report.json`` (what the paper pipelines
and the leaderboard read) and ``curves.png``. The verdicts come from :mod:`harness.verdict`: the
difference to fp32 with a 95 % interval over seeds (paired by seed), against the task's tolerance
in params.yaml ``stage``; too few seeds, or an fp32 that fails the pre-registered convergence check
(fp32 at twice the epochs moves by the tolerance or more: :func:`harness.verdict.longer_training`),
is inconclusive. The last-fifth gain of each fp32 curve (release 1's rule) is reported as a figure.
Nothing is typed by hand.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from pathlib import Path
from typing import Any

from harness.claims import Runs, finite, load_runs, metric_value, no_loss_claim
from harness.entry import quiet_environment
from harness.folders import RESULTS_DIR
from harness.params import load_params
from harness.report import log_report, save_panels
from harness.verdict import LongerTraining, difference, judge, longer_training, min_seeds_for, plateau
from trainer.fileio import atomic_write_json, atomic_write_text
from trainer.plots import method_color, readable_log_axis

PIPELINE = "suite"


def _curve_metric(row: dict[str, float], metric: str) -> float:
    return 100 * row["test_accuracy"] if metric == "accuracy" else row["test_loss"]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _fmt(value: float, metric: str) -> str:
    return f"{value:.2f}" if metric == "accuracy" else f"{value:.4f}"


def _interval(low: float, high: float, metric: str) -> str:
    if math.isnan(low):
        return "(1 seed: no interval)"
    return f"[{_fmt(low, metric)}, {_fmt(high, metric)}]"


def convergence_check(
    task: str, spec: dict[str, Any], runs: Runs, base_values: dict[int, float]
) -> tuple[str, LongerTraining]:
    """The longer run's name and fp32's pre-registered convergence check on ``task`` (params.yaml
    ``stage.tasks.<task>.convergence``: the longer run, its seeds, a tolerance no looser than the
    claims')."""
    given = spec.get("convergence")
    if not isinstance(given, dict) or set(given) != {"longer", "seeds", "tolerance"}:
        raise SystemExit(
            f"error: stage.tasks.{task}.convergence must be {{longer: <run>, seeds: <n>, tolerance: <t>}} "
            f"(the pre-registered check), got {given!r}"
        )
    tolerance = float(given["tolerance"])
    if tolerance > float(spec["tolerance"]):
        raise SystemExit(
            f"error: stage.tasks.{task}.convergence.tolerance {tolerance:g} is looser than the claims' "
            f"tolerance {float(spec['tolerance']):g}: the check uses the claims' tolerance, never a looser one"
        )
    longer = str(given["longer"])
    longer_values = {
        s: metric_value(r["evaluation"], spec["metric"]) for s, r in runs.get(longer, {}).items()
    }
    check = longer_training(
        base_values,
        longer_values,
        tolerance=tolerance,
        seeds_needed=int(given["seeds"]),
        higher_is_better=spec["metric"] == "accuracy",
    )
    return longer, check


def task_rows(
    task: str,
    spec: dict[str, Any],
    runs: Runs,
    baseline: str,
    order: list[str] | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """fp32's convergence on ``task`` and one row per method."""
    metric, tolerance = spec["metric"], float(spec["tolerance"])
    higher = metric == "accuracy"
    base_name = f"{task}_{baseline}"
    if base_name not in runs:
        raise SystemExit(f"error: no {base_name} runs: the baseline of task {task} must be trained")
    base = runs[base_name]
    base_values = {s: metric_value(r["evaluation"], metric) for s, r in base.items()}
    longer, check = convergence_check(task, spec, runs, base_values)
    last_fifth = [  # release 1's rule, now a reported figure (tolerance 0: judges nothing)
        plateau(
            [e["step"] for e in r["eval"]],
            [_curve_metric(e, metric) for e in r["eval"]],
            tolerance=0.0,
            higher_is_better=higher,
        ).improvement
        for r in base.values()
    ]
    base_mean = _mean(list(base_values.values()))
    bar_met = base_mean >= spec["bar"] if higher else base_mean <= spec["bar"]
    convergence = {
        "task": task,
        "title": spec["title"],
        "metric": metric,
        "seeds": sorted(base_values),
        "values": base_values,
        "mean": base_mean,
        "bar": spec["bar"],
        "bar_met": bool(bar_met),
        "longer_run": longer,
        "longer_seeds": sorted(runs.get(longer, {})),
        "check": dataclasses.asdict(check),
        "converged": check.converged,
        "reason": check.reason,
        "last_fifth_gains": last_fifth,
        "evaluations_per_run": min(len(r["eval"]) for r in base.values()),
        "train_seconds": _mean([r["metrics"]["wall_seconds"] for r in base.values()]),
        "steps": int(next(iter(base.values()))["metrics"]["steps"]),
    }
    claim = no_loss_claim(metric, tolerance)
    rows = []
    known = [r for r in (order or []) if r in runs]
    mine = [r for r in known + sorted(set(runs) - set(known)) if r.startswith(f"{task}_")]
    for run in sorted(mine, key=lambda r: r != base_name):  # the baseline first, then params order
        seeds = runs[run]
        method = run.removeprefix(f"{task}_")
        values = {s: metric_value(r["evaluation"], metric) for s, r in seeds.items()}
        mean = _mean(list(values.values()))
        row: dict[str, Any] = {
            "task": task,
            "method": method,
            "run": run,
            "seeds": sorted(values),
            "values": values,
            "mean": mean,
            "bits_per_step": _mean([r["metrics"]["bits_per_step"] for r in seeds.values()]),
            "compression_factor": _mean([r["metrics"]["compression_factor"] for r in seeds.values()]),
            "train_seconds": _mean([r["metrics"]["wall_seconds"] for r in seeds.values()]),
            "communicate_seconds": _mean([r["metrics"]["communicate_seconds"] for r in seeds.values()]),
            "mlflow_run_ids": [seeds[s]["info"]["mlflow_run_id"] for s in sorted(seeds)],
            "evaluate_run_ids": [seeds[s]["evaluation"].get("mlflow_run_id") for s in sorted(seeds)],
            "git_shas": sorted({seeds[s]["info"]["git_sha"] for s in seeds}),
            "_curves": seeds,
        }
        if metric == "loss":
            row["perplexity"] = _mean([math.exp(v) for v in values.values()])
        if run != base_name and not run.startswith(f"{base_name}x"):  # fp32 at k x the epochs: references
            diff = difference(values, base_values)
            verdict = judge(diff, claim, min_seeds=min_seeds_for(claim), baseline=check)
            row |= {
                "difference": diff.estimate,
                "low": diff.low,
                "high": diff.high,
                "paired": diff.paired,
                "claim": claim.describe(" pts" if higher else " nats"),
                "verdict": verdict.verdict,
                "reason": verdict.reason,
            }
        rows.append(row)
    return convergence, rows


def convergence_table(convergence: list[dict[str, Any]]) -> list[str]:
    """fp32's pre-registered convergence check per task, the last-fifth gains beside it."""
    lines = [
        "Pre-registered check (params.yaml `stage.tasks.<task>.convergence`): fp32 counts as converged when "
        "training it for twice the epochs (the same recipe stretched) changes its metric, mean over seeds, by "
        "less than the claims' tolerance on the task. The last fifth's gain of each fp32 curve (release 1's "
        "rule, which a one-cycle schedule cannot pass by construction) is a figure beside it, judging nothing.",
        "",
        "| task | steps | fp32 (mean of seeds) | bar | met | twice the epochs (mean of seeds) | change "
        "| tolerance | converged | gain over the last fifth, per seed | evaluations per run | train s per run |",
        "|---|---:|---:|---:|---|---:|---:|---:|---|---|---:|---:|",
    ]
    for c in convergence:
        metric, check = c["metric"], c["check"]
        unit = "%" if metric == "accuracy" else "nats"
        gains = ", ".join(_fmt(g, metric) for g in c["last_fifth_gains"])
        longer = (
            f"{_fmt(check['longer_mean'], metric)} {unit} ({check['num_longer']} seeds)"
            if check["num_longer"]
            else "not run"
        )
        change = _fmt(check["change"], metric) if check["num_longer"] else "-"
        converged = "yes" if c["converged"] else f"**no**: {c['reason']}"
        lines.append(
            f"| {c['title']} | {c['steps']} | {_fmt(c['mean'], metric)} {unit} "
            f"({len(c['seeds'])} seeds) | {'>=' if metric == 'accuracy' else '<='} {c['bar']} | "
            f"{'yes' if c['bar_met'] else '**no**'} | {longer} | {change} | {check['tolerance']:g} | "
            f"{converged} | {gains} | {c['evaluations_per_run']} | {c['train_seconds']:.0f} |"
        )
    return lines


def markdown(convergence: list[dict[str, Any]], rows: list[dict[str, Any]], scale: str) -> str:
    shas = sorted({sha for r in rows for sha in r["git_shas"]})
    lines = [
        f"# Task suite: results at scale `{scale}`",
        "",
        "Generated by `python -m pipelines.suite.report` from `results/suite/runs/` (2 gloo ranks) and "
        "`results/suite/evaluations/` (the evaluate stage: each final model on the whole test split). "
        f"Runs at git {', '.join(shas)}.",
        "",
        "Verdict rule (`harness/verdict.py`): the difference to fp32 with a 95 % Student-t interval over "
        "seeds, paired by seed; **reproduced** when the interval lies inside the claim, **not reproduced** "
        "when outside, **inconclusive** when it straddles a bound, with fewer than 3 seeds on a side "
        "(claims under 2 points), or when fp32 fails the pre-registered convergence check.",
        "",
        "## fp32 convergence",
        "",
        *convergence_table(convergence),
    ]
    for c in convergence:
        metric = c["metric"]
        unit = "test accuracy (%)" if metric == "accuracy" else "test loss (nats; perplexity = exp)"
        lines += [
            "",
            f"## {c['title']}",
            "",
            f"Metric: {unit} on the whole test split. Claim for every method: no loss beyond the "
            "tolerance against fp32.",
            "",
            "| method | seeds | mean | Δ vs fp32 | 95 % interval of Δ | claim | verdict | why | "
            "bits / step / rank | compression (x) | train s | MLflow run ids (train) |",
            "|---|---:|---:|---:|---|---|---|---|---:|---:|---:|---|",
        ]
        for r in (r for r in rows if r["task"] == c["task"]):
            if "difference" in r:
                delta = f"{r['difference']:+.2f}" if metric == "accuracy" else f"{r['difference']:+.4f}"
                interval, claim, verdict = _interval(r["low"], r["high"], metric), r["claim"], r["verdict"]
                verdict = f"**{verdict}**" if verdict != "inconclusive" else verdict
                why = r["reason"]
            else:
                role = (
                    "baseline"
                    if r["method"] == "fp32"
                    else "convergence check (twice the epochs)"
                    if r["run"] == c["longer_run"]
                    else f"reference ({r['method'].removeprefix('fp32x')}x the epochs)"
                )
                delta, interval, claim, verdict, why = "-", "-", role, "-", ""
            mean = _fmt(r["mean"], metric)
            if metric == "loss":
                mean += f" (ppl {r['perplexity']:.3f})"
            ids = ", ".join(f"`{i}`" for i in r["mlflow_run_ids"] if i)
            lines.append(
                f"| {r['method']} | {len(r['seeds'])} | {mean} | {delta} | {interval} | {claim} | {verdict} | {why} | "
                f"{r['bits_per_step']:,.0f} | {r['compression_factor']:.1f} | {r['train_seconds']:.0f} | {ids} |"
            )
    lines += ["", "![curves](curves.png)", ""]
    return "\n".join(lines)


def plot(convergence: list[dict[str, Any]], rows: list[dict[str, Any]], path: Path) -> None:
    """Per task: the test metric and the training loss against the step, mean over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(convergence), 2, figsize=(12, 3.6 * len(convergence)), squeeze=False)
    for (ax_eval, ax_train), c in zip(axes, convergence):
        metric = c["metric"]
        lowest = math.inf
        for r in (r for r in rows if r["task"] == c["task"]):
            seeds = list(r["_curves"].values())
            style = {"color": method_color(r["method"]), "label": f"{r['method']} ({len(seeds)})"}
            steps = [e["step"] for e in seeds[0]["eval"]]
            values = [_mean([_curve_metric(s["eval"][i], metric) for s in seeds]) for i in range(len(steps))]
            ax_eval.plot(steps, values, marker=".", **style)
            lowest = min(lowest, values[-1])
            tsteps = [t["step"] for t in seeds[0]["train"]]
            losses = [_mean([s["train"][i]["train_loss"] for s in seeds]) for i in range(len(tsteps))]
            ax_train.plot(tsteps, losses, **style)
        if metric == "accuracy":
            # the last points matter: start 25 points under the bar unless a curve ends lower (early points may fall below)
            ax_eval.set_ylim(bottom=max(0.0, min(c["bar"] - 25, lowest - 1)))
            ax_eval.set(ylabel="test accuracy (%), evaluation subset")
        else:
            ax_eval.set(ylabel="test loss (nats)", yscale="log")
            readable_log_axis(ax_eval)
        ax_eval.set(xlabel="step", title=c["title"])
        ax_train.set(xlabel="step", ylabel="training loss (mean over ranks and seeds)", yscale="log")
        readable_log_axis(ax_train)
    save_panels(fig, axes, path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--root",
        default=None,
        help="folder holding runs/ and evaluations/, written to (default: results/suite)",
    )
    args = parser.parse_args(argv)
    quiet_environment()
    params = load_params(PIPELINE)
    stage = params.get("stage") or {}
    tasks, baseline = stage["tasks"], stage.get("baseline", "fp32")
    root = Path(args.root) if args.root else RESULTS_DIR / PIPELINE
    runs = load_runs(root)
    convergence, rows = [], []
    for task, spec in tasks.items():
        if not any(r.startswith(f"{task}_") for r in runs):
            continue
        c, r = task_rows(task, spec, runs, baseline, order=list(params["runs"]))
        convergence.append(c)
        rows += r
    text = markdown(convergence, rows, params["scale"])
    atomic_write_text(root / "report.md", text)
    public = [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]
    atomic_write_json(
        root / "report.json",
        finite({"pipeline": PIPELINE, "scale": params["scale"], "convergence": convergence, "rows": public}),
    )
    plot(convergence, rows, root / "curves.png")
    log_report(
        PIPELINE,
        [root / "report.md", root / "report.json", root / "curves.png"],
        {f"{c['task']}_fp32_mean": c["mean"] for c in convergence},
    )
    print(text)


if __name__ == "__main__":
    main()
