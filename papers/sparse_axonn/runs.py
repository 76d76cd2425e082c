"""The train stage's runs over seeds: one row per run of params.yaml with each figure's mean over
seeds and the half-width of its 95 % Student-t interval (:func:`harness.verdict.mean_interval`).

The train stage trains every run over seeds 0, 1, 2 (``pipelines/sparse_axonn/dvc.yaml``) into
``results/sparse_axonn/runs/<run>/seed<k>/`` (``metrics.json``, ``ranks.json``, ``run.json``,
``steps.csv``). Every seed starts from the prune stage's one rewind state with its one mask (the
prune stage is one run), so the seeds differ in the batches drawn (``sampling: draws`` from the
run's seed) and in timing noise only: the model-state bytes and the bits sent are counted from
tensors and come out the same in every seed (a figure's half-width is then 0).

A row keeps, as before, the figures under their ``metrics.json`` names (now means), each with
``<figure>_half``, and ``per_seed`` (seed -> figures) for the claims, which pair the runs by seed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.params import load_params
from harness.verdict import mean_interval

PIPELINE = "sparse_axonn"
SECONDS = (
    "step_seconds_median_max",
    "compute_seconds_median_max",
    "p2p_seconds_median_max",
    "allreduce_seconds_median_max",
    "allreduce_wait_seconds_median_max",
    "allreduce_transfer_seconds_median_max",
    "rest_seconds_median_max",
)
FIGURES = (
    "density",
    "state_bytes_max",
    "state_bytes_mean",
    "params_bytes",
    "grads_bytes",
    "optimizer_bytes",
    "compact_grad_bytes",
    "index_bytes",
    "peak_rss_bytes_max",
    "rss_start_bytes_max",
    "run_peak_rss_bytes_max",
    "allreduce_bits_per_step_max",
    "allreduce_bits_per_step_total",
    "p2p_bits_per_step_max",
    *SECONDS,
    "comm_seconds",
    "val_perplexity",
)
FILES = ("metrics.json", "ranks.json", "run.json")


def seed_figures(folder: Path) -> tuple[dict[str, float], dict[str, Any]]:
    """One seed's figures from ``folder`` (``<run>/seed<k>/``) and its ``run.json``. Model state by
    category is the largest rank's (the rank the per-rank memory is judged on); ``comm_seconds`` is
    the all-reduce transfer plus the point-to-point phase (with the bubble, which its timing cannot
    separate), the largest rank's medians."""
    metrics = json.loads((folder / "metrics.json").read_text())
    ranks = json.loads((folder / "ranks.json").read_text())
    info = json.loads((folder / "run.json").read_text())
    worst = max(ranks, key=lambda r: r["state_bytes"]["total"])["state_bytes"]
    figures = {key: float(metrics[key]) for key in FIGURES if key in metrics}
    figures.update(
        params_bytes=worst["params"],
        grads_bytes=worst["grads"],
        optimizer_bytes=worst["master"] + worst["exp_avg"] + worst["exp_avg_sq"],
        compact_grad_bytes=worst["compact_grad"],
        index_bytes=worst["index_bytes"],
        comm_seconds=metrics["allreduce_transfer_seconds_median_max"] + metrics["p2p_seconds_median_max"],
        pruned_nonzero=metrics["pruned_nonzero"],
    )
    return figures, info


def seed_folders(folder: Path) -> dict[int, Path]:
    """seed -> ``folder/seed<k>`` for every seed folder that holds a trained run."""
    found = {}
    for sub in sorted(folder.glob("seed*")):
        seed = sub.name.removeprefix("seed")
        if seed.isdigit() and all((sub / f).exists() for f in FILES):
            found[int(seed)] = sub
    return found


def run_row(name: str, spec: dict[str, Any], folder: Path) -> dict[str, Any]:
    """``name`` over its seeds under ``folder``: each figure's mean and ``<figure>_half`` (NaN from
    one seed, 0 where every seed gave the same value), ``per_seed``, MLflow ids, git sha, grid."""
    seeds = seed_folders(folder)
    if not seeds:
        raise SystemExit(
            f"run {name!r} has no trained seed in {folder} (seed<k>/ with {', '.join(FILES)}): run its "
            "train stage first (dvc repro pipelines/sparse_axonn/dvc.yaml)"
        )
    per_seed, infos = {}, {}
    for seed, sub in seeds.items():
        per_seed[seed], infos[seed] = seed_figures(sub)
    grids = {i["grid"] for i in infos.values()}
    if len(grids) != 1:
        raise SystemExit(f"run {name!r}: its seeds ran on different grids {sorted(grids)}")
    first = infos[min(infos)]
    row: dict[str, Any] = {
        "run": name,
        "method": spec["method"],
        "sparsity": float(spec.get("sparsity", 0.0)),
        "grads": spec.get("grads", "dense"),
        "grid": grids.pop(),
        "seeds": sorted(seeds),
        "pruned_nonzero": max(f["pruned_nonzero"] for f in per_seed.values()),
        "mlflow_run_ids": [infos[s]["mlflow_run_id"] or "" for s in sorted(infos)],
        "git_sha": first["git_sha"],
        "per_seed": per_seed,
    }
    for key in FIGURES:
        found = [f[key] for f in per_seed.values() if key in f]
        if len(set(found)) == 1 < len(found):  # counted, not timed: the same in every seed
            row[key], row[f"{key}_half"] = found[0], 0.0
        else:
            row[key], row[f"{key}_half"] = mean_interval(found) if found else (None, None)
    return row


def collect(runs: Path, names: list[str] | None = None) -> list[dict[str, Any]]:
    """One row per run of params.yaml (or of ``names``) from ``runs/<run>/seed<k>/``."""
    specs = load_params(PIPELINE)["runs"]
    unknown = [n for n in names or [] if n not in specs]
    if unknown:
        raise SystemExit(f"no run(s) {', '.join(unknown)} in params.yaml; valid: {', '.join(specs)}")
    return [run_row(name, specs[name], runs / name) for name in names or list(specs)]


def find(
    rows: list[dict[str, Any]], method: str, sparsity: float, grid: str, grads: str = "dense"
) -> dict[str, Any] | None:
    """The row of ``method`` at ``sparsity`` on ``grid`` with ``grads`` (None: not run)."""
    return next(
        (
            r
            for r in rows
            if (r["method"], r["sparsity"], r["grid"], r["grads"]) == (method, sparsity, grid, grads)
        ),
        None,
    )
