"""ExDyna against its baselines: density against target, selection cost, build-up, accuracy.

    python -m papers.exdyna.report

ExDyna's runs are the task suite's (``results/suite``: ``<task>_exdyna`` on every task, the suite's
recipe); the selectors it is compared with, ExDyna with the code's initial threshold and the
selection-cost runs at W = 2, 4, 8 are this pipeline's (``results/exdyna/runs``). Per run: the
density actually sent per step against the target (mean, std, range, and over the second half),
selection seconds per step against top-k's at the same task and W, the union of selected indices
against k (build-up), the load imbalance, bits per step and the final metric on the whole test split.

Every claim goes through :mod:`harness.verdict`, judged by the 95 % interval over seeds (paired
by seed): accuracy against fp32 and against top-k, and the per-step claims of
:mod:`papers.exdyna.per_step` (density at target on each task, selection faster than top-k at each
task and W, selection cost flat in W). Every figure in the tables is the mean over seeds, the
claims' figures with the half-width of their 95 % interval.
Writes ``report.md``, ``report.json`` and ``curves.png``.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from harness.claims import (
    PaperReport,
    Runs,
    baseline_check,
    claims_table,
    judge_claim,
    load_runs,
    no_loss_claim,
    paper_report_main,
    suite_convergence,
    suite_tasks,
    values,
)
from harness.report import save_panels
from harness.verdict import LongerTraining
from papers.exdyna.per_step import BAND, PAPER, collect, step_claims
from trainer.plots import method_color

PIPELINE = "exdyna"
SELECTORS = {
    "exdyna": "ExDyna",
    "exdyna_code": "ExDyna, the code's initial threshold",
    "topk": "top-k (all-gather)",
    "dgc": "DGC sampled threshold",
    "threshold": "hard threshold",
    "cltk": "CLT-k",
}


def _label(row: dict[str, Any]) -> str:
    """A table row's name; the suite's own run says so, the cost runs say their length."""
    suffix = {"suite": " (suite)", "cost": f" (cost run, {row['steps']} steps)"}.get(row["source"], "")
    return SELECTORS[row["selector"]] + suffix


def accuracy_claims(suite: Runs, own: Runs, converged: dict[str, LongerTraining]) -> list[dict[str, Any]]:
    claims = []
    for task, spec in suite_tasks().items():
        if f"{task}_exdyna" not in suite:
            continue
        metric, tol = spec["metric"], float(spec["tolerance"])
        ex = values(suite, f"{task}_exdyna", metric)
        claims.append(
            {
                **judge_claim(
                    f"{spec['title']}: ExDyna at density 0.001 loses nothing against fp32",
                    ex,
                    values(suite, f"{task}_fp32", metric),
                    no_loss_claim(metric, tol),
                    metric=metric,
                    convergence=baseline_check(converged, task),
                ),
                "paper": PAPER["fp32"],
            }
        )
        if f"{task}_topk" in own:
            claims.append(
                {
                    **judge_claim(
                        f"{spec['title']}: ExDyna matches whole-model top-k",
                        ex,
                        values(own, f"{task}_topk", metric),
                        no_loss_claim(metric, tol),
                        metric=metric,
                    ),
                    "paper": PAPER["topk"],
                }
            )
    return claims


def _fmt(value: float | None, spec: str, half: float | None = None) -> str:
    """A mean, ``± half`` beside it where there is an interval (two seeds or more)."""
    if value is None:
        return "-"
    text = format(value, spec)
    return text if half is None or math.isnan(half) else f"{text} ± {format(half, spec)}"


def _spread(r: dict[str, Any]) -> str:
    t = r["target"]
    if not t or r["density_mean"] is None:
        return "-"
    return (
        f"{r['density_mean'] / t:.2f} ± {r['density_std'] / t:.2f} "
        f"({r['density_min'] / t:.2f}-{r['density_max'] / t:.2f})"
    )


def task_table(rows: list[dict[str, Any]], metric: str) -> list[str]:
    label = "accuracy (%)" if metric == "accuracy" else "test loss"
    value_spec = ".2f" if metric == "accuracy" else ".4f"
    out = [
        f"| selector | W | steps | seeds | {label} | density / target: mean ± std (range) | second half "
        "| select (ms) | vs top-k | union / k | imbalance | bits / step | MLflow run ids |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        t = r["target"]
        late = (
            _fmt(r["density_second_half"] / t, ".2f", r["density_second_half_half"] / t)
            if t and r["density_second_half"]
            else "-"
        )
        out.append(
            f"| {_label(r)} | {r['world']} | {r['steps']} | {len(r['seeds'])} "
            f"| {_fmt(r['value'], value_spec, r['value_half'])} | {_spread(r)} | {late} "
            f"| {_fmt(r['select_ms'], '.3f', r['select_ms_half'])} | {_fmt(r['select_vs_topk'], '.2f')} "
            f"| {_fmt(r['buildup'], '.2f')} | {_fmt(r['imbalance'], '.2f')} | {r['bits_per_step']:,.0f} "
            f"| {', '.join(f'`{i}`' for i in r['mlflow_run_ids'] if i)} |"
        )
    return out


def markdown(
    rows: list[dict[str, Any]],
    per_step: list[dict[str, Any]],
    acc_claims: list[dict[str, Any]],
    scale: str,
) -> str:
    tasks = suite_tasks()
    shas = sorted({r["git_sha"] for r in rows})
    seeds = sorted({len(r["seeds"]) for r in rows})
    out = [
        f"# ExDyna: results at scale `{scale}`\n",
        "Generated by `python -m papers.exdyna.report` from the suite's ExDyna runs (`results/suite/`) and this "
        f"pipeline's (`results/exdyna/runs/`), {'/'.join(map(str, seeds))} seed(s) per run, the suite's recipe; "
        f"runs at git {', '.join(shas)}. Every figure is the mean over seeds (± the half-width of its 95 % "
        "Student-t interval where shown). Density: entries of the aggregated union / all d entries, per step; its "
        "mean, std and range over the run, and the mean over the second half, as multiples of the target. "
        "Select: seconds per step of the selection alone (rank 0), and against top-k's at the same task and W. "
        "Union / k: the aggregated entries against the target k (top-k's build-up reaches W). Imbalance: W "
        "max_i k_i / sum_i k_i - 1 (the padding an all-gather of indices pays). Metric: the whole test split "
        "(accuracy %, or test loss in nats).\n",
        "## Density and cost (per-step measurements, judged over seeds)\n",
        "Verdicts by `harness/verdict.py`, paired by seed with the 95 % Student-t interval: the density's "
        f"second-half mean over the target (Δ = ratio - 1, within ±{BAND:g}), ExDyna's selection time minus "
        "top-k's (ms, below 0), and the largest W's selection time over the smallest's (Δ = ratio - 1); "
        "inconclusive when the interval straddles a bound or with fewer than 3 seeds.\n",
        claims_table(per_step),
        "## Accuracy\n",
        claims_table(acc_claims),
    ]
    for task, spec in tasks.items():
        task_rows = [r for r in rows if r["task"] == task]
        if task_rows:
            out += [f"\n## {spec['title']}\n", *task_table(task_rows, spec["metric"])]
    return "\n".join(out) + "\n"


def _mean_band(ax: Any, trains: list[list[dict[str, float]]], target: float, style: dict[str, Any]) -> None:
    """Density / target per step: the mean over seeds and the seeds' range as a band."""
    curves = [{p["step"]: p["density"] / target for p in train if "density" in p} for train in trains]
    steps = sorted(set.intersection(*(set(c) for c in curves)))
    per_step = [[c[s] for c in curves] for s in steps]
    ax.plot(steps, [statistics.fmean(v) for v in per_step], **style)
    if len(curves) > 1:
        ax.fill_between(
            steps, [min(v) for v in per_step], [max(v) for v in per_step], color=style["color"], alpha=0.15
        )


def plot_curves(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = [t for t in suite_tasks() if any(r["task"] == t and r["source"] != "cost" for r in rows)]
    fig, axes = plt.subplots(1, len(tasks) + 1, figsize=(5 * (len(tasks) + 1), 4.2), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=False):
        for r in rows:
            if r["task"] == task and r["source"] != "cost" and r["target"]:
                _mean_band(
                    ax, r["_train"], r["target"], {"label": _label(r), "color": method_color(r["selector"])}
                )
        ax.axhline(1.0, color="black", lw=0.8)
        ax.axhspan(1 - BAND, 1 + BAND, color="grey", alpha=0.15)
        ax.set_yscale("log")
        ax.set(title=f"{suite_tasks()[task]['title']}, W = 2\nmean over seeds, band: their range", xlabel="step",
               ylabel="density sent / target")  # fmt: skip
    ax = axes[0][-1]
    for selector in ("exdyna", "topk"):
        cost = sorted(
            (r for r in rows if r["selector"] == selector and r["source"] == "cost"), key=lambda r: r["world"]
        )
        if cost:
            halves = [0.0 if math.isnan(r["select_ms_half"]) else r["select_ms_half"] for r in cost]
            ax.errorbar([r["world"] for r in cost], [r["select_ms"] for r in cost], yerr=halves, marker="o",
                        capsize=4, label=SELECTORS[selector], color=method_color(selector))  # fmt: skip
    ax.set(
        title="selection time against W (1.09M-parameter LSTM)\nmean over seeds, bars: 95 % interval",
        xlabel="workers W",
        ylabel="ms per step (rank 0)",
    )
    ax.set_xscale("log", base=2)
    save_panels(fig, axes, path)


def build(suite_root: Path, out: Path, scale: str) -> PaperReport:
    suite, own = load_runs(suite_root), load_runs(out, require_evaluation=False)
    rows = collect(suite, own)
    per_step = step_claims(rows)
    evaluated = {r: s for r, s in own.items() if all(x["evaluation"] for x in s.values())}
    acc_claims = accuracy_claims(suite, evaluated, suite_convergence(suite_root))
    return PaperReport(
        markdown(rows, per_step, acc_claims, scale),
        per_step + acc_claims,
        rows,
        {"curves.png": lambda path: plot_curves(rows, path)},
    )


def main(argv: list[str] | None = None) -> None:
    paper_report_main(PIPELINE, __doc__, build, argv)


if __name__ == "__main__":
    main()
