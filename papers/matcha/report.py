"""MATCHA against vanilla, periodic and centralized SGD: loss against iterations and time, time to loss.

    python -m papers.matcha.report

Reads every seed of ``results/matcha/runs/<task>/<run>/seed<k>/`` (task ``mnist_er``: the suite's
MNIST recipe on 8 workers, graph 0, 100 Mbit/s tc-shaped links) and writes
``results/matcha/report.md`` and ``report.json`` (the claims, judged over seeds; per run the budget
asked and realised, alpha and rho, the final training loss, test accuracy, the time to the loss it
and vanilla both reach and the speed-up over vanilla, each as the mean over seeds with its 95 %
interval; MLflow run ids), ``curves.png`` (training loss against iterations and against time: the
mean over seeds and the seeds' range as a band) and ``spectrum_{er,geo}.png`` (rho and lambda_2 of
MATCHA's plan against the budget, both graphs). The clocks and the targets: :mod:`papers.matcha.times`.

The claims, per budget C_b in {0.5, 0.3, 0.1} and through :mod:`harness.verdict` (the difference of
times to the common target, paired by seed, with its 95 % Student-t interval): MATCHA takes less
time than vanilla (the paper's headline), and less time than periodic communication at the same
budget. Reproduced when the interval lies below zero, not reproduced when above it, inconclusive
when it straddles zero (or with fewer than 3 seeds).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from harness.claims import PaperReport, Runs, claims_table, judge_claim, load_runs, paper_report_main
from harness.costmodel import LinkParams, collective_time, format_rate, parse_rate
from harness.folders import RESULTS_DIR
from harness.params import load_params
from harness.report import save_panels
from harness.verdict import Claim, mean_interval
from papers.matcha.gossip import build_plan
from papers.matcha.spectrum import plot_spectrum
from papers.matcha.times import SMOOTH, TARGET_SLACK, WORLD, number, seed_curves, times_to

PIPELINE = "matcha"
FIT = RESULTS_DIR / "costmodel" / "fit.json"
RATE = "100mbit"  # the rate of the shaped task; the modelled times use it too
TASKS = {
    "mnist_er": (
        "MNIST, airbench net (width 12), ER graph 0 (8 nodes, 5 matchings)",
        "mnist_centralized",
    ),
}
METHODS = ("vanilla", "matcha05", "matcha03", "matcha01", "periodic05", "periodic03", "periodic01")
BUDGETS = ("05", "03", "01")  # C_b 0.5, 0.3, 0.1: MATCHA and periodic at each
SPECTRUM_BUDGETS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
FASTER = Claim(upper=0.0)  # "less time": Δ = ours - theirs (seconds) below zero

PAPER = {  # ../shared/research/papers.md 2.1 and 2.5, with its tags
    "faster": "up to 5x less wall-clock time than vanilla decentralized SGD to the same training loss "
    "(CIFAR-10/100, 8 and 16 nodes) [ABS]",
    "periodic": "MATCHA beats periodic communication at an equal budget [MEM]",
}


def link_params(fit: Path | None = None) -> LinkParams:
    path = fit or FIT
    if not path.exists():
        raise SystemExit(
            f"no cost-model fit at {path}: run the root `calibrate` stage (dvc repro -s calibrate) first"
        )
    return LinkParams(**json.loads(path.read_text())["params"])


def _stats(values: list[float]) -> dict[str, float]:
    mean, half = mean_interval(values)
    return {"mean": mean, "half": half}


def run_row(task: str, seeds: dict[int, dict[str, dict[str, Any]]], run: str, clock: str) -> dict[str, Any]:
    """``run`` over seeds: each figure's mean and 95 % half-width, its time to the loss it and
    vanilla both reach (vanilla's own time to it beside) and the speed-up over vanilla."""
    per_seed = {}
    for seed, curves in seeds.items():
        c, m = curves[run], curves[run]["metrics"]
        target, t_run, t_vanilla = times_to(c, curves[f"{task}_vanilla"], clock)
        per_seed[seed] = {
            "rounds_per_step": number(m.get("gossip_rounds_per_step")),
            "alpha": number(m.get("gossip_alpha")),
            "rho": number(m.get("gossip_rho")),
            "final_loss": c["loss"][-1],
            "test_accuracy": 100 * m["test_accuracy"],
            "target": target,
            "time_to_target": t_run,
            "vanilla_time_to_target": t_vanilla,
            "speedup": t_vanilla / t_run,
            "wall_seconds": c["wall"][-1],
            "modelled_seconds": c["modelled"][-1],
        }
    first = seeds[min(seeds)][run]
    row: dict[str, Any] = {
        "task": task,
        "run": run,
        "mode": first["mode"],
        "budget": first["budget"],
        "seeds": sorted(seeds),
        "steps": first["steps"][-1],
        "clock": clock,
        "network": sorted({s[run]["network"] for s in seeds.values()}),
        "mlflow_run_ids": [seeds[s][run]["mlflow_run_id"] for s in sorted(seeds)],
        "git_sha": first["git_sha"],
        "per_seed": per_seed,
        "_curves": [seeds[s][run] for s in sorted(seeds)],
    }
    for key in next(iter(per_seed.values())):
        row[key] = _stats([v[key] for v in per_seed.values()])
    return row


def task_rows(
    task: str, runs: Runs, params: LinkParams, rate: float
) -> tuple[list[dict[str, Any]], dict[str, Any], dict[int, dict[str, dict[str, Any]]]]:
    title, centralized = TASKS[task]
    names = [f"{task}_{m}" for m in METHODS] + [centralized]
    seeds, measured = seed_curves(names, runs, params, rate, RATE)
    clock = "wall" if measured else "modelled"
    rows = [run_row(task, seeds, name, clock) for name in names]
    vanilla = seeds[min(seeds)][f"{task}_vanilla"]
    info = {
        "task": task,
        "title": title,
        "measured": measured,
        "clock": clock,
        "t_comp": _stats([s[names[0]]["t_comp"] for s in seeds.values()]),
        "t_round": collective_time("send", WORLD, vanilla["message_bytes"], rate, params),
        "message_bytes": vanilla["message_bytes"],
    }
    return rows, info, seeds


def time_claims(
    task: str, info: dict[str, Any], seeds: dict[int, dict[str, dict[str, Any]]]
) -> list[dict[str, Any]]:
    """Per budget: MATCHA's time to the common target against vanilla's and against periodic's at
    the same budget, paired by seed (seconds, ``info['clock']``)."""
    clock = "time measured on 100 Mbit/s tc-shaped links" if info["measured"] else "modelled time"
    out = []
    for b in BUDGETS:
        for other, key, words in (
            ("vanilla", "faster", "less time than vanilla"),
            (f"periodic{b}", "periodic", f"less time than periodic communication at C_b 0.{b[1]}"),
        ):
            ours, theirs = {}, {}
            for seed, curves in seeds.items():
                _, ours[seed], theirs[seed] = times_to(
                    curves[f"{task}_matcha{b}"], curves[f"{task}_{other}"], info["clock"]
                )
            claim = judge_claim(
                f"MATCHA, {info['title']}: C_b 0.{b[1]} takes {words} to the loss both reach ({clock}, s)",
                ours,
                theirs,
                FASTER,
                metric="seconds",
            )
            speedups = [theirs[s] / ours[s] for s in ours]
            against = "vanilla" if other == "vanilla" else f"periodic at C_b 0.{b[1]}"
            out.append(
                {**claim, "paper": PAPER[key], "speedup": statistics.fmean(speedups), "against": against}
            )
    return out


def label(row: dict[str, Any]) -> str:
    if row["mode"] in ("vanilla", "centralized"):
        return row["mode"]
    return f"{row['mode']} C_b={row['budget']:g}"


def pm(stat: dict[str, float], spec: str) -> str:
    """``mean ± half`` (the 95 % interval over seeds), the mean alone from one seed."""
    mean, half = stat["mean"], stat["half"]
    return format(mean, spec) if math.isnan(half) else f"{mean:{spec}} ± {half:{spec}}"


def task_table(rows: list[dict[str, Any]], info: dict[str, Any]) -> list[str]:
    kind = "measured" if info["measured"] else "modelled"
    lines = [
        f"| run | C_b | seeds | rounds / step | alpha | rho | final loss | test acc (%) | target "
        f"| time to target (s, {kind}) | vanilla's time to it (s) | speed-up vs vanilla "
        "| measured wall (s) | modelled (s) | network | MLflow run ids |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {label(r)} | {r['budget']:g} | {len(r['seeds'])} | {pm(r['rounds_per_step'], '.2f')} "
            f"| {pm(r['alpha'], '.4f')} | {pm(r['rho'], '.4f')} | {pm(r['final_loss'], '.4f')} "
            f"| {pm(r['test_accuracy'], '.2f')} | {pm(r['target'], '.4f')} | {pm(r['time_to_target'], '.1f')} "
            f"| {pm(r['vanilla_time_to_target'], '.1f')} | {pm(r['speedup'], '.2f')} "
            f"| {pm(r['wall_seconds'], '.1f')} | {pm(r['modelled_seconds'], '.1f')} | {', '.join(r['network'])} "
            f"| {', '.join(f'`{i}`' for i in r['mlflow_run_ids'] if i)} |"
        )
    return lines


def markdown(
    tasks: list[tuple[list[dict[str, Any]], dict[str, Any]]],
    claims: list[dict[str, Any]],
    params: LinkParams,
    rate: float,
) -> str:
    seeds = sorted({len(r["seeds"]) for rows, _ in tasks for r in rows})
    lines = [
        "# MATCHA: results\n",
        "Generated by `python -m papers.matcha.report` from `results/matcha/runs/` "
        f"(`dvc repro pipelines/matcha/dvc.yaml`): 8 gloo workers on 2 CPU cores, {'/'.join(map(str, seeds))} "
        "seed(s) per run; every figure is the mean over seeds ± the half-width of its 95 % Student-t "
        "interval. Training loss = mean over ranks of each rank's loss on its own batches, smoothed over "
        f"{SMOOTH} logged points. Target (per seed, of a run and the run it is compared with): the higher "
        f"of their two final smoothed losses + {100 * TARGET_SLACK:.0f} %, a loss both reach; against "
        "vanilla it is vanilla's final loss + 2 % wherever the run ends at or below it. "
        f"Modelled time: T(k) = k t_comp + R(k) t_round, t_round from the calibrated cost model "
        f"(alpha {1e3 * params.alpha:.2f} ms, efficiency {params.efficiency:.3f}) at {format_rate(rate)}.\n",
    ]
    for rows, info in tasks:
        clock = "measured on tc-shaped links" if info["measured"] else "modelled"
        check = ""
        if info["measured"]:
            errors = [
                100 * (s["modelled_seconds"] / s["wall_seconds"] - 1)
                for r in rows
                for s in r["per_seed"].values()
            ]
            check = (
                f" The cost model against these measured runs (end of training, every seed): "
                f"{min(errors):+.0f} % to {max(errors):+.0f} %."
            )
        lines += [
            f"## {info['title']}\n",
            f"Time: **{clock}** ({RATE} per rank link). t_comp {1e3 * info['t_comp']['mean']:.0f} ms/step "
            f"(median of each seed's runs, mean over seeds), t_round {1e3 * info['t_round']:.0f} ms "
            f"({info['message_bytes'] / 1e3:.0f} kB per message).{check}\n",
            *task_table(rows, info),
            "",
        ]
    lines += [
        "## The claims, as measured\n",  # the heading papers/matcha/README.md copies
        "Verdicts by `harness/verdict.py`: Δ = MATCHA's time to the common target minus the other "
        "run's, paired by seed, with its 95 % Student-t interval over seeds; reproduced when the whole "
        "interval lies below 0 (less time), not reproduced when it lies above, inconclusive when it "
        "straddles 0 or with fewer than 3 seeds.\n",
        claims_table(claims),
    ]
    lines += [f"- {c['claim'].split(': ', 1)[1].split(' takes')[0]} against {c['against']}: mean speed-up "
              f"{c['speedup']:.2f}x over seeds, {c['verdict']}." for c in claims]  # fmt: skip
    return "\n".join(lines) + "\n"


def _band(ax: Any, curves: list[dict[str, Any]], x_key: str, style: dict[str, Any]) -> None:
    """The mean over seeds (a line) and the seeds' range (a band), logged points aligned by index."""
    n = min(len(c["loss"]) for c in curves)
    xs = [statistics.fmean(c[x_key][i] for c in curves) for i in range(n)]
    losses = [[c["loss"][i] for c in curves] for i in range(n)]
    ax.plot(xs, [statistics.fmean(v) for v in losses], **style)
    if len(curves) > 1:
        ax.fill_between(
            xs, [min(v) for v in losses], [max(v) for v in losses], color=style["color"], alpha=0.15
        )


def plot(rows: list[dict[str, Any]], path: Path, infos: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(infos), 2, figsize=(12, 3.6 * len(infos)), squeeze=False)
    colours = {1.0: "C0", 0.5: "C1", 0.3: "C2", 0.1: "C3"}
    for (ax_it, ax_t), info in zip(axes, infos, strict=True):
        for r in (r for r in rows if r["task"] == info["task"]):
            style = {
                "color": "k" if r["mode"] == "centralized" else colours.get(r["budget"], "C4"),
                "linestyle": "--" if r["mode"] == "periodic" else ":" if r["mode"] == "centralized" else "-",
                "label": label(r),
            }
            _band(ax_it, r["_curves"], "steps", style)
            _band(ax_t, r["_curves"], info["clock"], style)
        seeds = len(rows[0]["seeds"])
        spread = f"mean over {seeds} seeds, band: their range" if seeds > 1 else "1 seed"
        kind = f"measured, {RATE} tc-shaped links" if info["measured"] else f"modelled, {RATE} links"
        ax_it.set(xlabel="iteration", ylabel="training loss (smoothed)", title=f"{info['title']}\n{spread}")
        ax_t.set(
            xlabel=f"time (s, {kind})", ylabel="training loss (smoothed)", title=f"{info['title']}\n{spread}"
        )
    save_panels(fig, axes, path)


def spectra() -> dict[str, Any]:
    """The figures of MATCHA's plan against the budget, on both graphs (file name -> drawing)."""
    params = load_params(PIPELINE)
    graphs = {"er": params["runs"]["mnist_er_matcha05"]["strategy_options"], "geo": params[".geo"]}
    figures = {}
    for name, graph_options in graphs.items():
        options = {k: v for k, v in graph_options.items() if k not in ("mode", "budget")}  # the graph
        graph = "ER graph 0" if name == "er" else "random geometric graph"

        def draw(path: Path, options: dict[str, Any] = options, graph: str = graph) -> None:
            plans = [build_plan({**options, "mode": "matcha", "budget": b}, WORLD) for b in SPECTRUM_BUDGETS]
            plot_spectrum(plans, path, title=f"MATCHA on the {graph} ({WORLD} nodes)")

        figures[f"spectrum_{name}.png"] = draw
    return figures


def build(suite_root: Path, out: Path, scale: str) -> PaperReport:
    """The report from ``out``'s runs (``suite_root``: unused, MATCHA reads no suite run)."""
    params, rate = link_params(), parse_rate(RATE)
    runs = load_runs(out, require_evaluation=False)
    tasks, claims = [], []
    for task in TASKS:
        rows, info, seeds = task_rows(task, runs, params, rate)
        tasks.append((rows, info))
        claims += time_claims(task, info, seeds)
    rows = [r for task_rows_, _ in tasks for r in task_rows_]
    infos = [info for _, info in tasks]
    figures = {"curves.png": lambda path: plot(rows, path, infos), **spectra()}
    return PaperReport(markdown(tasks, claims, params, rate), claims, rows, figures, {"tasks": infos})


def main(argv: list[str] | None = None) -> None:
    paper_report_main(PIPELINE, __doc__, build, argv)


if __name__ == "__main__":
    main()
