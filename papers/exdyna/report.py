"""ExDyna against its baselines: density against target, selection cost, build-up, accuracy.

    python -m papers.exdyna.report

Reads ``results/exdyna/runs/<task>/<run>/seed<k>/`` and writes ``results/exdyna/report.md`` and
``report.json`` (per run: the density actually sent per step against the target, mean, std, min,
max and over the second half of the run; selection seconds per step and their ratio to top-k's at
the same task, density and world size; the union of selected indices against k (build-up); the
load imbalance; bits per step; the final test metric; MLflow run ids) and ``curves.png`` (density
over steps; selection time against the number of workers).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from pipelines.common import RESULTS_DIR, load_params, quiet_environment
from pipelines.report import finish_report, save_panels, seed_results

PIPELINE = "exdyna"
OUT = RESULTS_DIR / PIPELINE
RUNS = OUT / "runs"
SELECTORS = {
    "dense": "dense all-reduce",
    "exdyna": "ExDyna",
    "exdyna_code": "ExDyna, the code's initial threshold",
    "topk": "top-k (all-gather)",
    "dgc": "DGC sampled threshold",
    "threshold": "hard threshold",
    "cltk": "CLT-k",
}
TASKS = {"cifar": "small VGG (0.25) / CIFAR-10", "ptb": "2-layer LSTM (64) / Penn Treebank"}
BAND = 0.10  # "stays at target": the run's mean density within 10 % of it


def _parse(run: str) -> tuple[str, str, str, int | None]:
    """(task, selector, density label, forced world size or None) from a run name."""
    parts = run.split("_")
    task, selector = parts[0], parts[1] + ("_code" if "code" in parts else "")
    density = "0.01" if "d01" in parts else "0.001"
    world = next((int(p[1:]) for p in parts[2:] if p.startswith("w")), None)
    return task, selector, density, world


def collect() -> list[dict[str, Any]]:
    rows = []
    for run in load_params(PIPELINE)["runs"]:
        if run.startswith("paper_"):
            continue
        seed = seed_results(RUNS, run, PIPELINE)[0]
        m, config = seed["metrics"], seed["info"]["config"]
        task, selector, density, _ = _parse(run)
        metric = "test_perplexity" if task == "ptb" else "test_accuracy"
        steps = seed["train"]
        second_half = [r["density"] for r in steps if "density" in r and r["step"] > steps[-1]["step"] / 2]
        rows.append(
            {
                "run": run,
                "task": task,
                "selector": selector,
                "density": density if selector != "dense" else "1",
                "world": int(config["world_size"]),
                "metric": metric,
                "value": m[metric] * (100 if metric == "test_accuracy" else 1),
                "target": m.get("density_target"),
                "density_mean": m.get("density_mean"),
                "density_std": m.get("density_std"),
                "density_min": m.get("density_min"),
                "density_max": m.get("density_max"),
                "density_second_half": statistics.fmean(second_half) if second_half else None,
                "select_ms": 1e3 * m["select_seconds_mean"] if "select_seconds_mean" in m else None,
                "union_mean": m.get("union_mean"),
                "buildup": m.get("buildup_mean"),
                "imbalance": m.get("imbalance_mean"),
                "bits_per_step": m["bits_per_step"],
                "compression_factor": m["compression_factor"],
                "wall_seconds": m["wall_seconds"],
                "mlflow_run_id": seed["info"]["mlflow_run_id"],
                "git_sha": seed["info"]["git_sha"],
                "_train": steps,
            }
        )
    for row in rows:  # selection cost against top-k's on the same task, density and world size
        ref = next(
            (
                r
                for r in rows
                if r["selector"] == "topk"
                and (r["task"], r["density"], r["world"]) == (row["task"], row["density"], row["world"])
            ),
            None,
        )
        row["select_vs_topk"] = (
            row["select_ms"] / ref["select_ms"]
            if ref and row["select_ms"] is not None and ref["select_ms"]
            else None
        )
    return rows


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _ratio(row: dict[str, Any], key: str) -> str:
    value, target = row[key], row["target"]
    return "-" if value is None or not target else f"{value / target:.2f}"


def claims(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    ex = [r for r in rows if r["selector"] == "exdyna"]
    for r in ex:
        ratio = r["density_mean"] / r["target"]
        late = r["density_second_half"] / r["target"] if r["density_second_half"] else math.nan
        ok = abs(late - 1) <= BAND
        out.append(
            f"- Density stays at target ({r['task']}, {r['density']}, W = {r['world']}): mean {ratio:.2f}x "
            f"the target over the run, {late:.2f}x over its second half, step range "
            f"{r['density_min'] / r['target']:.2f}-{r['density_max'] / r['target']:.2f}x: "
            f"**{'reproduced' if ok else 'not reproduced'}** (second half within {100 * BAND:.0f} %)."
        )
    for r in (r for r in rows if r["selector"] == "exdyna_code"):
        inside = [
            p["step"] for p in r["_train"] if "density" in p and abs(p["density"] / r["target"] - 1) <= BAND
        ]
        reached = (
            f"first inside +-{100 * BAND:.0f} % at step {inside[0]:.0f}"
            if inside
            else "never inside the band"
        )
        out.append(
            f"- With the code's lambda_0 = 1 / (2 sqrt(k)) ({r['task']}, {r['density']}): density {r['density_mean'] / r['target']:.2f}x "
            f"the target on average over the run, {r['density_second_half'] / r['target']:.2f}x over its second half; "
            f"{reached} of {r['_train'][-1]['step']:.0f} (the scaling moves lambda by at most 0.5 % a step)."
        )
    scaling = sorted(
        (r for r in ex if r["task"] == "cifar" and r["density"] == "0.001"), key=lambda r: r["world"]
    )
    if len(scaling) > 1:
        times = ", ".join(f"W = {r['world']}: {r['select_ms']:.3f} ms" for r in scaling)
        topk = {
            r["world"]: r["select_ms"]
            for r in rows
            if r["selector"] == "topk" and r["task"] == "cifar" and r["density"] == "0.001"
        }
        grows = scaling[-1]["select_ms"] <= 1.5 * scaling[0]["select_ms"]
        out.append(
            f"- Selection cost stays near constant as W grows (CIFAR, 0.001): ExDyna {times}; top-k "
            + ", ".join(f"W = {w}: {t:.3f} ms" for w, t in sorted(topk.items()))
            + f": **{'reproduced' if grows else 'not reproduced'}** (W = {scaling[-1]['world']} within 1.5x of "
            f"W = {scaling[0]['world']})."
        )
    for r in ex:
        others = [
            o
            for o in rows
            if o["selector"] not in ("exdyna", "exdyna_code", "dense")
            and (o["task"], o["density"], o["world"]) == (r["task"], r["density"], r["world"])
        ]
        if not others:
            continue
        faster = all(r["select_ms"] < o["select_ms"] for o in others)
        listing = ", ".join(f"{SELECTORS[o['selector']]} {o['select_ms']:.3f}" for o in others)
        out.append(
            f"- ExDyna selects faster than the baselines ({r['task']}, {r['density']}, W = {r['world']}): "
            f"{r['select_ms']:.3f} ms/step against {listing}: **{'reproduced' if faster else 'not reproduced'}**."
        )
    return out


def markdown(rows: list[dict[str, Any]], scale: str) -> str:
    out = [
        f"# ExDyna: results at scale `{scale}`\n",
        "Generated by `python -m papers.exdyna.report` from `results/exdyna/runs/` (gloo ranks, seed 1, 80 "
        "steps). Density: entries of the aggregated union / all d entries, per step; its mean, std and "
        "range over the run, and the mean over the second half, as multiples of the target. Select: "
        "seconds per step of the selection alone (rank 0), and against top-k's on the same task, density "
        "and W. Union / k: the aggregated entries against the target k (top-k's build-up reaches W). "
        "Imbalance: W max_i k_i / sum_i k_i - 1 (the padding an all-gather of indices pays). Bits: "
        "what rank 0 handed to collectives per step, counted from the wire tensors.\n",
    ]
    for (task, world), title in (
        *(((t, 4), f"{name}, W = 4") for t, name in TASKS.items()),
        (("cifar", 2), f"{TASKS['cifar']}, W = 2"),
        (("cifar", 8), f"{TASKS['cifar']}, W = 8"),
    ):
        task_rows = [r for r in rows if r["task"] == task and r["world"] == world]
        if not task_rows:
            continue
        label = "perplexity" if task == "ptb" else "accuracy (%)"
        out += [
            f"\n## {title}\n",
            f"| selector | density | {label} | density / target: mean ± std (range) | second half "
            "| select (ms) | vs top-k | union / k | imbalance | bits / step | MLflow run id |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for r in task_rows:
            spread = (
                "-"
                if r["target"] is None
                else f"{r['density_mean'] / r['target']:.2f} ± {r['density_std'] / r['target']:.2f} "
                f"({r['density_min'] / r['target']:.2f}-{r['density_max'] / r['target']:.2f})"
            )
            out.append(
                f"| {SELECTORS[r['selector']]} | {r['density']} | {r['value']:.2f} | {spread} "
                f"| {_ratio(r, 'density_second_half')} | {_fmt(r['select_ms'], '.3f')} "
                f"| {_fmt(r['select_vs_topk'], '.2f')} | {_fmt(r['buildup'], '.2f')} | {_fmt(r['imbalance'], '.2f')} "
                f"| {r['bits_per_step']:,.0f} | `{r['mlflow_run_id']}` |"
            )
    out += ["\n## The claims\n", *claims(rows)]
    return "\n".join(out) + "\n"


def plot_curves(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(t, d) for t in TASKS for d in ("0.001", "0.01")]
    fig, axes = plt.subplots(1, len(panels) + 1, figsize=(5 * (len(panels) + 1), 4.2), squeeze=False)
    for ax, (task, density) in zip(axes[0], panels, strict=False):
        for r in rows:
            if (r["task"], r["density"], r["world"]) != (task, density, 4) or r["target"] is None:
                continue
            steps = [p["step"] for p in r["_train"] if "density" in p]
            ax.plot(
                steps,
                [p["density"] / r["target"] for p in r["_train"] if "density" in p],
                label=SELECTORS[r["selector"]],
            )
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_yscale("log")
        ax.set(
            title=f"{TASKS[task]}, density {density}, W = 4", xlabel="step", ylabel="density sent / target"
        )
    ax = axes[0][-1]
    for selector, label in SELECTORS.items():
        points = sorted(
            (r["world"], r["select_ms"])
            for r in rows
            if r["selector"] == selector
            and r["task"] == "cifar"
            and r["density"] == "0.001"
            and r["select_ms"]
        )
        if len(points) > 1:
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
    ax.set(title="selection time against W (CIFAR, 0.001)", xlabel="workers W", ylabel="ms per step (rank 0)")
    ax.set_xscale("log", base=2)
    save_panels(fig, axes, path)


def main() -> None:
    quiet_environment()
    rows = collect()
    finish_report(PIPELINE, rows, markdown(rows, load_params(PIPELINE)["scale"]), plot_curves, "value")


if __name__ == "__main__":
    main()
