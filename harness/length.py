"""Is a "not reproduced" the method or the recipe? A claim judged again at longer training.

A method that loses against fp32 on a short recipe may lose because it needs more steps (DGC's
paper trains ResNet-110 for 160 epochs with its warm-up over the first 4; the suite's CIFAR-10
recipe has 10). The same pair of runs, the method and fp32, trained at 2x and 4x the epochs (the
recipe stretched: ``stretch`` in params.yaml) and judged by the same rule at each length gives the
gap against training length. The verdict text comes from those judgments, never typed:

- "holds at longer training: from N epochs" when the claim is reproduced at some length (N: the
  shortest such length);
- "does not close" when it is not, and the longest length judged over enough seeds lies wholly
  outside the claim;
- "undecided" otherwise (the longest length judged straddles a bound, or no length has the seeds),
  each with the gap and verdict at every length.

The runs: the suite's ``<task>_<method>`` and ``<task>_fp32`` (1x), the suite's ``<task>_fp32x<k>``
and the paper's own ``<task>_<method>_x<k>`` (k x the epochs).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from harness.claims import Runs, metric_value, no_loss_claim, suite_tasks
from harness.verdict import NOT_REPRODUCED, REPRODUCED, Claim, difference, judge, min_seeds_for

LONGER = re.compile(r"_x(?P<factor>\d+)$")


def factors(own: Runs, task: str, method: str) -> list[int]:
    """The stretch factors of the paper's own ``<task>_<method>_x<k>`` runs, in order."""
    found = (
        LONGER.search(run.removeprefix(f"{task}_{method}"))
        for run in own
        if run.startswith(f"{task}_{method}_x")
    )
    return sorted(int(m["factor"]) for m in found if m)


def _side(seeds: dict[int, dict[str, Any]], metric: str) -> dict[int, float]:
    return {seed: metric_value(r["evaluation"], metric) for seed, r in seeds.items()}


def length_rows(
    suite: Runs, own: Runs, task: str, method: str, metric: str, claim: Claim
) -> list[dict[str, Any]]:
    """One row per training length (1x from the suite, then each ``_x<k>`` of the paper's runs): the
    epochs and steps, both sides' means and seeds, the difference with its interval and verdict."""
    lengths = {1: (suite[f"{task}_{method}"], suite[f"{task}_fp32"])}
    for k in factors(own, task, method):
        reference = f"{task}_fp32x{k}"
        if reference not in suite:
            raise SystemExit(
                f"error: {task}_{method}_x{k} has no fp32 beside it: the suite's {reference} must be trained "
                "(dvc repro pipelines/suite/dvc.yaml)"
            )
        lengths[k] = (own[f"{task}_{method}_x{k}"], suite[reference])
    rows = []
    for k, (ours, fp32) in lengths.items():
        first = ours[min(ours)]
        method_values, fp32_values = _side(ours, metric), _side(fp32, metric)
        diff = difference(method_values, fp32_values)
        verdict = judge(diff, claim, min_seeds=min_seeds_for(claim))
        rows.append(
            {
                "factor": k,
                "epochs": first["info"]["config"]["epochs"],
                "steps": int(first["metrics"]["steps"]),
                "method_mean": sum(method_values.values()) / len(method_values),
                "fp32_mean": sum(fp32_values.values()) / len(fp32_values),
                "seeds": [len(method_values), len(fp32_values)],
                "difference": diff.estimate,
                "low": diff.low,
                "high": diff.high,
                "verdict": verdict.verdict,
                "reason": verdict.reason,
                "enough_seeds": min(len(method_values), len(fp32_values)) >= min_seeds_for(claim),
                "mlflow_run_ids": [ours[s]["info"]["mlflow_run_id"] for s in sorted(ours)],
            }
        )
    return rows


def _fmt(value: float, metric: str) -> str:
    return f"{value:+.2f}" if metric == "accuracy" else f"{value:+.4f}"


def _gap(row: dict[str, Any], metric: str) -> str:
    interval = (
        f"[{_fmt(row['low'], metric)}, {_fmt(row['high'], metric)}]"
        if math.isfinite(row["low"])
        else f"no interval ({row['seeds'][0]} vs {row['seeds'][1]} runs)"
    )
    return f"Δ {_fmt(row['difference'], metric)} {interval}"


def verdict_text(rows: list[dict[str, Any]], metric: str) -> str:
    """ "holds at longer training: from N epochs", "does not close" or "undecided", with the gaps."""
    held = [r for r in rows if r["verdict"] == REPRODUCED]
    if held:
        first = min(held, key=lambda r: r["epochs"])
        return (
            f"holds at longer training: from {first['epochs']} epochs ({first['factor']}x the recipe, "
            f"{_gap(first, metric)})"
        )
    at = "; ".join(f"{r['epochs']} epochs: {_gap(r, metric)}, {r['verdict']}" for r in rows)
    judged = [r for r in rows if r["enough_seeds"]]
    longest = max(judged, key=lambda r: r["epochs"]) if judged else None
    if longest is not None and longest["verdict"] == NOT_REPRODUCED:
        return f"does not close within {longest['epochs']} epochs ({at})"
    return f"undecided: not reproduced at any length, and not ruled out at the longest judged ({at})"


def studies(suite: Runs, own: Runs, method: str, what: str) -> list[dict[str, Any]]:
    """The training-length study of ``method``'s no-loss claim (``what``) on every suite task the
    paper trained longer runs of: its rows, the verdict text and what it is about."""
    out = []
    for task, spec in suite_tasks().items():
        if factors(own, task, method):
            claim = no_loss_claim(spec["metric"], float(spec["tolerance"]))
            out.append(study(suite, own, task, method, spec, what, claim))
    return out


def study(
    suite: Runs, own: Runs, task: str, method: str, spec: dict[str, Any], what: str, claim: Claim
) -> dict[str, Any]:
    """The training-length study of ``method``'s ``claim`` on ``task``."""
    rows = length_rows(suite, own, task, method, spec["metric"], claim)
    return {
        "task": task,
        "method": method,
        "title": spec["title"],
        "claim": what,
        "bound": claim.describe(" pts" if spec["metric"] == "accuracy" else " nats"),
        "limit": claim.lower if math.isfinite(claim.lower) else claim.upper,  # the bound the figure draws
        "metric": spec["metric"],
        "rows": rows,
        "verdict": verdict_text(rows, spec["metric"]),
    }


def markdown(studies: list[dict[str, Any]]) -> list[str]:
    """The "## Training length" section: per study, the gap at each length and the verdict."""
    out = [
        "\n## Training length\n",
        "The same runs at 2x and 4x the epochs (the recipe stretched: warm-up, schedule and length), fp32 "
        "beside them, each length judged by the same rule (`harness/length.py`); figure `length.png`.\n",
    ]
    for s in studies:
        m = s["metric"]
        out += [
            f"**{s['title']}: {s['claim']}** ({s['bound']}): {s['verdict']}.\n",
            "| epochs | steps | seeds | ours (mean) | fp32 (mean) | Δ | 95 % interval | verdict | why | MLflow run ids |",
            "|---:|---:|---|---:|---:|---:|---|---|---|---|",
        ]
        for r in s["rows"]:
            interval = f"[{_fmt(r['low'], m)}, {_fmt(r['high'], m)}]" if math.isfinite(r["low"]) else "-"
            value = "{:.2f}" if m == "accuracy" else "{:.4f}"
            out.append(
                f"| {r['epochs']} | {r['steps']} | {r['seeds'][0]} vs {r['seeds'][1]} | "
                f"{value.format(r['method_mean'])} | {value.format(r['fp32_mean'])} | {_fmt(r['difference'], m)} "
                f"| {interval} | {r['verdict']} | {r['reason']} | {', '.join(f'`{i}`' for i in r['mlflow_run_ids'] if i)} |"
            )
        out.append("")
    return out


def plot(studies: list[dict[str, Any]], path: Path) -> None:
    """Per study: the gap to fp32 against the epochs trained, its 95 % interval, the claim's bound."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from harness.report import save_panels
    from trainer.plots import method_color

    fig, axes = plt.subplots(1, len(studies), figsize=(5.5 * len(studies), 4), squeeze=False)
    for ax, s in zip(axes[0], studies, strict=True):
        rows = s["rows"]
        epochs = [r["epochs"] for r in rows]
        gaps = [r["difference"] for r in rows]
        errors = [
            [r["difference"] - r["low"] if math.isfinite(r["low"]) else 0.0 for r in rows],
            [r["high"] - r["difference"] if math.isfinite(r["high"]) else 0.0 for r in rows],
        ]
        ax.errorbar(epochs, gaps, yerr=errors, marker="o", capsize=4, color=method_color(s["method"]))
        for r in rows:
            ax.annotate(f"{r['seeds'][0]} seed(s)", (r["epochs"], r["difference"]), fontsize=7,
                        textcoords="offset points", xytext=(5, 5))  # fmt: skip
        ax.axhline(0.0, color="grey", lw=0.8)
        ax.axhline(s["limit"], color="black", ls="--", lw=1, label=f"claim {s['bound']}")
        unit = "points" if s["metric"] == "accuracy" else "nats"
        ax.set(xscale="log", xticks=epochs, xlabel="epochs trained", ylabel=f"{s['method']} - fp32 ({unit})",
               title=f"{s['title']}: {s['method']}")  # fmt: skip
        ax.set_xticklabels([str(e) for e in epochs])
        ax.legend(fontsize=8)
    save_panels(fig, axes, path)


def add_to_report(lengths: list[dict[str, Any]], text: str, figures: dict[str, Any]) -> str:
    """A paper report's ``text`` with the training-length section, ``length.png`` added to
    ``figures``; both unchanged when no longer run exists."""
    if lengths:
        figures["length.png"] = lambda path: plot(lengths, path)
        text += "\n".join(markdown(lengths))
    return text
