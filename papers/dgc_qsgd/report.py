"""DGC's and QSGD's claims, DGC's ablation ladder and the curves (the pipeline's ``report`` stage).

    python -m papers.dgc_qsgd.report

The accuracy claims (DGC at 99.9 % sparsity loses nothing; QSGD at 4 and 8 bits loses nothing;
QSGD at 2 bits loses a little) are judged on the task suite's runs (``results/suite``: fp32, DGC
and QSGD with the same recipe, the whole test split from the evaluate stage); DGC's ablation
ladder on this pipeline's own runs (``results/dgc_qsgd/runs``, derived from the suite's DGC run):
Gradient Dropping (top-k + error feedback) loses accuracy, and momentum correction, masking and
warm-up together win it back. Every verdict from :mod:`harness.verdict` (95 % interval over seeds,
paired). Also: the density DGC actually sent and its compression after the warm-up (the paper's
270-600x is for that steady state), QSGD's bits against accuracy, and the Elias-coded payload
measured by ``benchmarks/comm/bench_qsgd_elias.py`` (``benchmarks/results/qsgd_elias.md``).
And the training-length study (:mod:`harness.length`): DGC on CIFAR-10 at 2x and 4x the epochs
beside fp32, the no-loss claim judged at each length, the verdict text ("holds at longer training:
from N epochs" / "does not close") and ``length.png`` generated from those runs.
Writes ``report.md``, ``report.json``, ``curves.png`` and (with the longer runs) ``length.png``.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from harness import length
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
    summarize,
    values,
)
from harness.report import save_panels
from harness.verdict import Claim, LongerTraining
from trainer.paths import REPO_ROOT
from trainer.plots import method_color, readable_log_axis

PIPELINE = "dgc_qsgd"
VARIANTS = {
    "fp32": "fp32 all-reduce (suite)",
    "gd": "top-k 0.1% + error feedback (Gradient Dropping)",
    "mc": "+ momentum correction",
    "mask": "+ momentum factor masking",
    "dgc": "+ warm-up = DGC (suite)",
    "qsgd2": "QSGD 2 bits, fixed width (suite)",
    "qsgd4": "QSGD 4 bits, fixed width (suite)",
    "qsgd8": "QSGD 8 bits, fixed width (suite)",
}
SUITE_VARIANTS = ("fp32", "dgc", "qsgd2", "qsgd4", "qsgd8")
LADDER = ("gd", "mc", "mask")
DENSITY_KEYS = ("density_sent", "density_sent_after_warmup", "compression_after_warmup")
ELIAS = REPO_ROOT / "benchmarks" / "results" / "qsgd_elias.md"


# The papers' own figures for each claim (../shared/research/papers.md 4a.3 and 4b.2; [MEM] there:
# from memory of the papers, "verify"), shown beside ours in results/summary.md.
PAPER = {
    "dgc": "ResNet-110 / CIFAR-10 93.87 % against 93.75 % fp32; AlexNet / ImageNet 58.20 against 58.17 % "
    "top-1; PTB LSTM perplexity 72.24 against 72.30 [MEM]",
    "qsgd4": "ResNet-110 / CIFAR-10 94.19 % against 93.86 %; AlexNet / ImageNet 60.05 against 59.5 % [MEM]",
    "qsgd8": "ResNet-50 / ImageNet 74.76 % against 74.68 %; ResNet-152 76.74 against 77.0 % [MEM]",
    "qsgd2": "2 bits can lose accuracy on some networks (no figure) [ABS]",
    "gd": "ResNet-110 / CIFAR-10 92.75 % against 93.75 % fp32 (-1.00 pts); PTB perplexity 103.18 against "
    "72.30 [MEM]",
    "ladder": "ResNet-110 / CIFAR-10: DGC 93.87 % against Gradient Dropping 92.75 % (+1.12 pts) [MEM]",
}


def collect(
    suite: Runs, own: Runs, converged: dict[str, LongerTraining]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(claims, rows) for every suite task that has a DGC run."""
    claims, rows = [], []
    for task, spec in suite_tasks().items():
        if f"{task}_dgc" not in suite:
            continue
        metric, tol, title = spec["metric"], float(spec["tolerance"]), spec["title"]
        ok = baseline_check(converged, task)
        fp32 = values(suite, f"{task}_fp32", metric)
        no_loss = no_loss_claim(metric, tol)
        for variant, what in (
            ("dgc", "DGC at 99.9 % sparsity loses nothing"),
            ("qsgd4", "QSGD 4 bits loses nothing"),
            ("qsgd8", "QSGD 8 bits loses nothing"),
            ("qsgd2", "QSGD 2 bits loses nothing (the paper expects a small loss)"),
        ):
            if f"{task}_{variant}" in suite:
                method = values(suite, f"{task}_{variant}", metric)
                claims.append(
                    {
                        **judge_claim(
                            f"{title}: {what}", method, fp32, no_loss, metric=metric, convergence=ok
                        ),
                        "paper": PAPER[variant],
                    }
                )
        for variant in SUITE_VARIANTS:
            if f"{task}_{variant}" in suite:
                rows.append(
                    {
                        "task": task,
                        "variant": variant,
                        **summarize(suite[f"{task}_{variant}"], metric, DENSITY_KEYS),
                        "_seeds": suite[f"{task}_{variant}"],
                    }
                )
        if f"{task}_gd" in own:
            gd, dgc = values(own, f"{task}_gd", metric), values(suite, f"{task}_dgc", metric)
            worse, better = (
                (Claim(upper=0.0), Claim(lower=0.0))
                if metric == "accuracy"
                else (
                    Claim(lower=0.0),
                    Claim(upper=0.0),
                )
            )
            claims.append(
                {
                    **judge_claim(
                        f"{title}: Gradient Dropping (top-k + error feedback alone) loses against fp32",
                        gd,
                        fp32,
                        worse,
                        metric=metric,
                        convergence=ok,
                    ),
                    "paper": PAPER["gd"],
                }
            )
            claims.append(
                {
                    **judge_claim(
                        f"{title}: momentum correction, masking and warm-up win it back (DGC beats Gradient Dropping)",
                        dgc,
                        gd,
                        better,
                        metric=metric,
                        convergence=ok,
                    ),
                    "paper": PAPER["ladder"],
                }
            )
        for variant in LADDER:
            if f"{task}_{variant}" in own:
                rows.append(
                    {
                        "task": task,
                        "variant": variant,
                        **summarize(own[f"{task}_{variant}"], metric, DENSITY_KEYS),
                        "_seeds": own[f"{task}_{variant}"],
                    }
                )
    if not claims:
        raise SystemExit("error: the suite has no DGC runs: dvc repro pipelines/suite/dvc.yaml")
    order = {v: i for i, v in enumerate(("fp32", *LADDER, "dgc", "qsgd2", "qsgd4", "qsgd8"))}
    rows.sort(key=lambda r: (list(suite_tasks()).index(r["task"]), order[r["variant"]]))
    return claims, rows


def _fmt(value: float, metric: str) -> str:
    return f"{value:.2f}" if metric == "accuracy" else f"{value:.4f}"


def markdown(claims: list[dict[str, Any]], rows: list[dict[str, Any]], scale: str) -> str:
    tasks = suite_tasks()
    shas = sorted({r["git_sha"] for r in rows})
    out = [
        f"# DGC and QSGD: results at scale `{scale}`\n",
        "Generated by `python -m papers.dgc_qsgd.report` from the task suite's fp32, DGC and QSGD runs "
        "(`results/suite/`) and this pipeline's ablation ladder (`results/dgc_qsgd/runs/`), each on 2 gloo "
        f"ranks with the suite's recipe; runs at git {', '.join(shas)}. Metric: the whole test split (the "
        "evaluate stage): accuracy in points, the language task's test loss in nats (perplexity = exp). "
        "Bits: what each rank handed to collectives per step, counted from the wire tensors (values, int32 "
        "indices, the size exchange of variable payloads, dense biases); compression = dense fp32 bits / "
        "those. Density sent: entries sent / entries of the sparsified (matrix) tensors over the whole run "
        "(warm-up included) and after the warm-up.\n",
        "## Claims\n",
        "Verdicts by `harness/verdict.py`: the difference with a 95 % Student-t interval over seeds, paired "
        "by seed; inconclusive when the interval straddles a bound, with too few seeds, or when the suite's "
        "fp32 failed the pre-registered 2x-epochs convergence check (the suite's report).\n",
        claims_table(claims),
    ]
    for task, spec in tasks.items():
        task_rows = [r for r in rows if r["task"] == task]
        if not task_rows:
            continue
        metric = spec["metric"]
        out += [
            f"\n## {spec['title']}\n",
            "| variant | seeds | metric (mean ± std) | bits / step / rank | compression (x) | density sent "
            "| after warm-up: density / compression | compress (s) | train wall (s) | MLflow run ids |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for r in task_rows:
            density = f"{100 * r['density_sent']:.3f} %" if r["density_sent"] is not None else "-"
            after = (
                f"{100 * r['density_sent_after_warmup']:.3f} % / {r['compression_after_warmup']:.0f}x"
                if r["density_sent_after_warmup"] is not None
                else "-"
            )
            out.append(
                f"| {VARIANTS[r['variant']]} | {len(r['seeds'])} | {_fmt(r['mean'], metric)} ± {_fmt(r['std'], metric)} "
                f"| {r['bits_per_step']:,.0f} | {r['compression_factor']:.1f} | {density} | {after} "
                f"| {r['compress_seconds']:.1f} | {r['wall_seconds']:.1f} "
                f"| {', '.join(f'`{i}`' for i in r['mlflow_run_ids'] if i)} |"
            )
    out.append("\n## QSGD: Elias coding against fixed width\n")
    if ELIAS.exists():
        out.append(
            "Training runs send fixed-width codes (decoding four ranks' Elias streams on this CPU costs more "
            "than a run's whole budget). The Elias payload of the same codes on real gradients, from the "
            "committed benchmark `benchmarks/results/qsgd_elias.md` (its own command and git sha inside):\n"
        )
        table = [line for line in ELIAS.read_text().splitlines() if line.startswith("|")]
        out += table
    else:
        out.append("(No benchmarks/results/qsgd_elias.md: run `python benchmarks/comm/bench_qsgd_elias.py`.)")
    return "\n".join(out) + "\n"


def plot_curves(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = suite_tasks()
    present = [t for t in tasks if any(r["task"] == t for r in rows)]
    fig, axes = plt.subplots(2, len(present), figsize=(6.5 * len(present), 8), squeeze=False)
    for col, task in enumerate(present):
        metric = tasks[task]["metric"]
        key, scale = ("test_accuracy", 100) if metric == "accuracy" else ("test_loss", 1)
        for r in (r for r in rows if r["task"] == task):
            seeds = list(r["_seeds"].values())
            style = {
                "label": VARIANTS[r["variant"]],
                "color": method_color(r["variant"]),
                "linestyle": "--" if r["variant"].startswith("qsgd") else "-",
            }
            tsteps = [t["step"] for t in seeds[0]["train"]]
            loss = [statistics.fmean(s["train"][i]["train_loss"] for s in seeds) for i in range(len(tsteps))]
            axes[0][col].plot(tsteps, loss, **style)
            steps = [e["step"] for e in seeds[0]["eval"]]
            curve = [statistics.fmean(scale * s["eval"][i][key] for s in seeds) for i in range(len(steps))]
            axes[1][col].plot(steps, curve, marker=".", **style)
        axes[0][col].set(
            title=tasks[task]["title"], xlabel="step", ylabel="training loss, mean over seeds", yscale="log"
        )
        readable_log_axis(axes[0][col])
        label = "test accuracy (%), evaluation subset" if metric == "accuracy" else "test loss (nats)"
        axes[1][col].set(xlabel="step", ylabel=f"{label}, mean over seeds")
    save_panels(fig, axes, path)


def build(suite_root: Path, out: Path, scale: str) -> PaperReport:
    suite, own = load_runs(suite_root), load_runs(out)
    claims, rows = collect(suite, own, suite_convergence(suite_root))
    lengths = length.studies(suite, own, "dgc", "DGC at 99.9 % sparsity loses nothing")
    figures = {"curves.png": lambda path: plot_curves(rows, path)}
    text = length.add_to_report(lengths, markdown(claims, rows, scale), figures)
    return PaperReport(text, claims, rows, figures, {"length": lengths})


def main(argv: list[str] | None = None) -> None:
    paper_report_main(PIPELINE, __doc__, build, argv)


if __name__ == "__main__":
    main()
