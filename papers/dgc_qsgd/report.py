"""DGC's and QSGD's results table, claim checks and curves (the pipeline's ``report`` stage).

    python -m papers.dgc_qsgd.report

Reads ``results/dgc_qsgd/runs/<task>/<run>/seed<k>/`` and writes ``results/dgc_qsgd/report.md`` and
``report.json`` (test accuracy or perplexity, mean and std over seeds; bits per step per rank and
the compression factor measured from the wire; the density DGC actually sent; MLflow run ids; the
claims checked against fp32) and ``curves.png`` (training loss and the test metric, mean over seeds).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from pipelines.common import RESULTS_DIR, load_params, quiet_environment
from pipelines.report import finish_report, read_csv, save_panels

PIPELINE = "dgc_qsgd"
OUT = RESULTS_DIR / PIPELINE
RUNS = OUT / "runs"
VARIANTS = {
    "fp32": "fp32 all-reduce",
    "gd": "top-k 0.1% + error feedback (Gradient Dropping)",
    "mc": "+ momentum correction",
    "mask": "+ momentum factor masking",
    "dgc": "+ warm-up = DGC",
    "dgc_clip": "+ local gradient clipping = DGC (RNN)",
    "qsgd2": "QSGD 2 bits",
    "qsgd4": "QSGD 4 bits",
    "qsgd8": "QSGD 8 bits",
}
TASKS = {"cifar": "small VGG (width 0.25) / CIFAR-10", "ptb": "2-layer LSTM (64) / Penn Treebank"}
# The bars: within 1 accuracy point, or perplexity within 3 %, of fp32.
CLAIM_POINTS = 1.0
CLAIM_PERPLEXITY = 0.03


def _metric(task: str) -> tuple[str, str]:
    """(metrics.json key, label) of the task's headline metric."""
    return ("test_perplexity", "perplexity") if task == "ptb" else ("test_accuracy", "accuracy (%)")


def _mean(metrics: list[dict[str, float]], key: str) -> float | None:
    return statistics.fmean(m[key] for m in metrics) if key in metrics[0] else None


def _label(row: dict[str, Any]) -> str:
    encoding = {"elias": " (Elias)", "fixed": " (fixed width)"}.get(row["encoding"] or "", "")
    return VARIANTS[row["variant"]] + encoding


def collect() -> list[dict[str, Any]]:
    rows = []
    for run in load_params(PIPELINE)["runs"]:
        if run.startswith("paper_"):
            continue
        seeds = sorted(RUNS.glob(f"*/{run}/seed*/metrics.json"))  # runs/<task>/<run>/seed<k>
        if not seeds:
            raise SystemExit(
                f"no results for {run} in {RUNS / run}: run `dvc repro pipelines/{PIPELINE}/dvc.yaml`"
            )
        metrics = [json.loads(p.read_text()) for p in seeds]
        infos = [json.loads((p.parent / "run.json").read_text()) for p in seeds]
        task, variant = run.split("_", 1)
        key, _ = _metric(task)
        values = [m[key] * (100 if key == "test_accuracy" else 1) for m in metrics]
        rows.append(
            {
                "run": run,
                "task": task,
                "variant": variant,
                "seeds": len(seeds),
                "metric": key,
                "mean": statistics.fmean(values),
                "std": statistics.stdev(values) if len(values) > 1 else 0.0,
                "values": values,
                "bits_per_step": statistics.fmean(m["bits_per_step"] for m in metrics),
                "dense_bits_per_step": metrics[0]["dense_bits_per_step"],
                "compression_factor": statistics.fmean(m["compression_factor"] for m in metrics),
                "density_sent": _mean(metrics, "density_sent"),
                "density_after_warmup": _mean(metrics, "density_sent_after_warmup"),
                "compression_after_warmup": _mean(metrics, "compression_after_warmup"),
                "encoding": infos[0]["config"]["compressor_options"].get("encoding"),
                "wall_seconds": statistics.fmean(m["wall_seconds"] for m in metrics),
                "compress_seconds": statistics.fmean(m["compress_seconds"] for m in metrics),
                "mlflow_run_ids": [i["mlflow_run_id"] for i in infos],
                "git_sha": infos[0]["git_sha"],
                "_curves": [read_csv(p.parent / "eval_curve.csv") for p in seeds],
                "_train": [read_csv(p.parent / "train_curve.csv") for p in seeds],
            }
        )
    for row in rows:
        base = next(r for r in rows if r["task"] == row["task"] and r["variant"] == "fp32")
        row["delta"] = row["mean"] - base["mean"]
        row["relative"] = row["mean"] / base["mean"] - 1
    return rows


def verdict(row: dict[str, Any]) -> str:
    """Within the issue's bar of fp32 (or better)?"""
    if row["metric"] == "test_perplexity":
        return "reproduced" if row["relative"] <= CLAIM_PERPLEXITY else "NOT reproduced"
    return "reproduced" if row["delta"] >= -CLAIM_POINTS else "NOT reproduced"


def _delta(row: dict[str, Any]) -> str:
    if row["metric"] == "test_perplexity":
        return f"{100 * row['relative']:+.1f} %"
    return f"{row['delta']:+.2f} pts"


def markdown(rows: list[dict[str, Any]], scale: str) -> str:
    world = json.loads(next(RUNS.glob(f"*/{rows[0]['run']}/seed*/run.json")).read_text())["config"][
        "world_size"
    ]
    out = [
        f"# DGC and QSGD: results at scale `{scale}`\n",
        f"Generated by `python -m papers.dgc_qsgd.report` from `results/dgc_qsgd/runs/` ({world} gloo ranks, "
        f"seeds {', '.join(str(i) for i in range(rows[0]['seeds']))}). Metric: final test accuracy "
        "(CIFAR-10) or perplexity (PTB), mean ± std over seeds. Bits: what each rank handed to collectives "
        "per step, counted from the wire tensors (values, int32 indices, the size exchange of variable "
        "payloads, dense biases); compression = dense fp32 bits / those. Density sent: entries sent / "
        "entries of the sparsified (matrix) tensors over the whole run (warm-up included) / after the "
        "warm-up; compression after warm-up likewise from the steps at the final density (the paper's "
        "figures are for that steady state).\n",
    ]
    for task, title in TASKS.items():
        task_rows = [r for r in rows if r["task"] == task]
        if not task_rows:
            continue
        label = _metric(task)[1]
        out += [
            f"\n## {title}\n",
            f"| variant | {label} | Δ vs fp32 | bits / step / rank | compression (x) | density sent "
            "| after warm-up: density / compression | compress (s) | train wall (s) | MLflow run ids |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for r in task_rows:
            density = f"{100 * r['density_sent']:.3f} %" if r["density_sent"] is not None else "-"
            after = (
                f"{100 * r['density_after_warmup']:.3f} % / {r['compression_after_warmup']:.0f}x"
                if r["density_after_warmup"] is not None
                else "-"
            )
            out.append(
                f"| {_label(r)} | {r['mean']:.2f} ± {r['std']:.2f} | {_delta(r)} "
                f"| {r['bits_per_step']:,.0f} | {r['compression_factor']:.1f} | {density} | {after} "
                f"| {r['compress_seconds']:.1f} | {r['wall_seconds']:.1f} "
                f"| {', '.join(f'`{i}`' for i in r['mlflow_run_ids'])} |"
            )
    out.append("\n## The claims (ours: within 1 accuracy point, or 3 % perplexity, of fp32)\n")
    for task, title in TASKS.items():
        for variant, claim in (
            ("dgc_clip" if task == "ptb" else "dgc", "DGC at 99.9 % sparsity loses nothing"),
            ("qsgd4", "QSGD 4 bits matches fp32"),
            ("qsgd8", "QSGD 8 bits matches fp32"),
            ("qsgd2", "QSGD 2 bits loses a little"),
        ):
            found = [r for r in rows if r["task"] == task and r["variant"] == variant]
            if not found:
                continue
            r = found[0]
            base = r["mean"] - r["delta"]
            text = f"- {title}: {claim}: {_label(r)} {r['mean']:.2f} against fp32 {base:.2f} ({_delta(r)})"
            if variant == "qsgd2":
                out.append(
                    f"{text}: within the bar: {verdict(r) == 'reproduced'} (the paper expects a small loss)."
                )
            else:
                out.append(f"{text}: **{verdict(r)}**.")
    return "\n".join(out) + "\n"


def plot_curves(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = [t for t in TASKS if any(r["task"] == t for r in rows)]
    fig, axes = plt.subplots(2, len(tasks), figsize=(6.5 * len(tasks), 8), squeeze=False)
    for col, task in enumerate(tasks):
        key, label = _metric(task)
        scale = 100 if key == "test_accuracy" else 1
        for r in (r for r in rows if r["task"] == task):
            style = "--" if r["variant"].startswith("qsgd") else "-"
            tsteps = [row["step"] for row in r["_train"][0]]
            loss = [statistics.fmean(c[i]["train_loss"] for c in r["_train"]) for i in range(len(tsteps))]
            axes[0][col].plot(tsteps, loss, style, label=_label(r))
            steps = [row["step"] for row in r["_curves"][0]]
            value = [statistics.fmean(c[i][key] for c in r["_curves"]) * scale for i in range(len(steps))]
            axes[1][col].plot(steps, value, style, marker="o", label=_label(r))
        axes[0][col].set(title=TASKS[task], xlabel="step", ylabel="training loss, mean over seeds")
        axes[1][col].set(xlabel="step", ylabel=f"test {label}, mean over seeds")
        if key == "test_perplexity":
            axes[1][col].set_yscale("log")
    save_panels(fig, axes, path)


def main() -> None:
    quiet_environment()
    rows = collect()
    finish_report(PIPELINE, rows, markdown(rows, load_params(PIPELINE)["scale"]), plot_curves, "mean")


if __name__ == "__main__":
    main()
