"""Sparse AxoNN against dense AxoNN and the Sputnik-like baseline: memory, communication, time.

    python -m papers.sparse_axonn.report

Reads ``results/sparse_axonn/prune.json`` and every seed of ``results/sparse_axonn/runs/<run>/seed<k>/``
(:mod:`papers.sparse_axonn.runs`) and writes ``results/sparse_axonn/report.md``, ``report.json`` and
``curves.png``: the pruning table; per run (each figure the mean over seeds ± the half-width of its
95 % interval) the model-state bytes per rank by category, peak process memory, all-reduce and
point-to-point bits and seconds per step, step time, validation perplexity; the Sputnik comparison;
which grids fit a per-rank capacity and the measured configuration effect; the claims, restated for
these runs and judged over their seeds (:mod:`papers.sparse_axonn.claims`), with the paper's
512-V100 figures and a cost-model extrapolation to that setting (labelled as a model) beside them as
context, and the paper's claims not tested here. Every number comes from those files (and
``results/costmodel/fit.json``).
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

from harness import costmodel
from harness.claims import finite
from harness.entry import quiet_environment
from harness.folders import RESULTS_DIR
from harness.params import load_params
from harness.report import finish_report, save_panels
from trainer.fileio import atomic_write_json

from .claims import NOT_TESTED, claims_section, judged_claims, with_model
from .extrapolate import PaperSetting, model_setting
from .params import convergence
from .runs import collect
from .runs import find as _find

PIPELINE = "sparse_axonn"
OUT = RESULTS_DIR / PIPELINE
RUNS = OUT / "runs"
FIT = RESULTS_DIR / "costmodel" / "fit.json"
METHODS = {"dense": "dense AxoNN", "sparse": "sparse AxoNN", "sputnik": "Sputnik-like (CSR)"}
MB = 1e6


def pm(row: dict[str, Any], key: str, spec: str, scale: float = 1.0) -> str:
    """``row[key] / scale`` with ``± half`` (its 95 % interval over seeds) when the seeds differ;
    the value alone from one seed, or when every seed gave the same (bytes and bits are counted)."""
    mean, half = row[key], row.get(f"{key}_half")
    text = format(mean / scale, spec)
    if half is None or not math.isfinite(half) or half == 0:
        return text
    return f"{text} ± {format(half / scale, spec)}"


def _pct(new: float, old: float) -> str:
    return f"{100 * (new / old - 1):+.1f} %" if old else "-"


def _label(r: dict[str, Any]) -> str:
    text = METHODS[r["method"]]
    if r["sparsity"]:
        text += f" {100 * r['sparsity']:.0f} %"
    if r["grads"] == "packed":
        text += ", packed grads"
    return text


def _evaluations(root: Path) -> dict[str, dict[str, Any]]:
    """The evaluate stage's rows by model name (empty before that stage has run)."""
    return {p.stem: json.loads(p.read_text()) for p in sorted((root / "evaluations").glob("*.json"))}


def prune_section(prune: dict[str, Any], evaluations: dict[str, dict[str, Any]] | None = None) -> list[str]:
    evaluations = evaluations or {}
    p = prune["scale_config"]["prune"]
    out = [
        "## Pruning (prune stage, one process)\n",
        f"GPT-2 with untied embeddings, {prune['num_params']:,} parameters ({prune['num_prunable']:,} prunable: "
        f"every weight matrix and embedding), char-level Tiny Shakespeare. Dense AdamW for {p['steps']} steps; "
        f"the rewind state is step {p['rewind_step']}; every mask is retrained {p['steps'] - p['rewind_step']} "
        f"steps from it with the compact optimizer. Validation perplexity on {prune['eval_windows']} windows. "
        f"MLflow run `{prune['mlflow_run_id']}`, git {prune['git_sha']}.\n",
        f"Dense: perplexity **{prune['dense']['perplexity']:.3f}**.\n",
        convergence(prune["dense"]) + "\n",
        "| masks | sparsity | pruned, not retrained | retrained | retrained / dense | test split (evaluate) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    dense_test = evaluations.get("dense", {}).get("test_perplexity")
    if dense_test is not None:
        out.append(f"| dense | 0 % | | | | {dense_test:.3f} |")
    for name, r in prune["masks"].items():
        test = evaluations.get(name, {}).get("test_perplexity")
        out.append(
            f"| {name} | {100 * r['sparsity']:.1f} % | {r['perplexity_pruned']:.3f} | {r['perplexity_retrained']:.3f} "
            f"| {r['perplexity_retrained'] / prune['dense']['perplexity']:.3f} | "
            f"{'not evaluated' if test is None else f'{test:.3f}'} |"
        )
    if evaluations:
        windows = next(iter(evaluations.values()))["test_windows"]
        out.append(
            f"\nTest split: every one of its {windows} windows, by the evaluate stage "
            "(`evaluations/<model>.json`, each its own MLflow run nested under the prune run).\n"
        )
    return out


def _seeds(rows: list[dict[str, Any]]) -> str:
    counts = sorted({len(r["seeds"]) for r in rows})
    return "/".join(map(str, counts))


def memory_table(rows: list[dict[str, Any]]) -> list[str]:
    dense = _find(rows, "dense", 0.0, "2x2")
    out = [
        "| run | grid | seeds | density | params | grads | optimizer | compact grad | state total | vs dense 2x2 "
        "| index | peak RSS (MB) | run's own peak RSS (MB) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ref = dense or r
        out.append(
            f"| {_label(r)} | {r['grid']} | {len(r['seeds'])} | {pm(r, 'density', '.3f')} "
            f"| {pm(r, 'params_bytes', '.2f', MB)} MB | {pm(r, 'grads_bytes', '.2f', MB)} MB "
            f"| {pm(r, 'optimizer_bytes', '.2f', MB)} MB | {pm(r, 'compact_grad_bytes', '.2f', MB)} MB "
            f"| **{pm(r, 'state_bytes_max', '.2f', MB)} MB** | {_pct(r['state_bytes_max'], ref['state_bytes_max'])} "
            f"| {pm(r, 'index_bytes', '.2f', MB)} MB | {pm(r, 'peak_rss_bytes_max', '.0f', MB)} "
            f"| {pm(r, 'run_peak_rss_bytes_max', '.0f', MB)} |"
        )
    return out


def traffic_table(rows: list[dict[str, Any]]) -> list[str]:
    dense = _find(rows, "dense", 0.0, "2x2")
    out = [
        "| run | grid | all-reduce bits | vs dense 2x2 | all-reduce s | barrier wait s | p2p bits | p2p + bubble s "
        "| compute s | rest s | step s | perplexity | pruned nonzero | MLflow run ids |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        ref = dense or r
        out.append(
            f"| {_label(r)} | {r['grid']} | {pm(r, 'allreduce_bits_per_step_max', ',.0f')} "
            f"| {_pct(r['allreduce_bits_per_step_max'], ref['allreduce_bits_per_step_max'])} "
            f"| {pm(r, 'allreduce_transfer_seconds_median_max', '.4f')} "
            f"| {pm(r, 'allreduce_wait_seconds_median_max', '.4f')} | {pm(r, 'p2p_bits_per_step_max', ',.0f')} "
            f"| {pm(r, 'p2p_seconds_median_max', '.4f')} | {pm(r, 'compute_seconds_median_max', '.3f')} "
            f"| {pm(r, 'rest_seconds_median_max', '.4f')} | {pm(r, 'step_seconds_median_max', '.3f')} "
            f"| {pm(r, 'val_perplexity', '.3f')} | {r['pruned_nonzero']} "
            f"| {', '.join(f'`{i}`' for i in r['mlflow_run_ids'] if i)} |"
        )
    return out


def runs_section(rows: list[dict[str, Any]], train: dict[str, Any]) -> list[str]:
    return [
        "\n## Training runs (train stage, 4 gloo ranks)\n",
        f"{train['steps']} steps of {train['batch_size']} sequences ({train['num_microbatches']} micro-batches per "
        f"replica, {train['schedule']}) from the rewind state, {_seeds(rows)} seed(s) per run: seed k draws the "
        "same batches for every run, each seed its own. Every figure is the mean over seeds ± the half-width "
        "of its 95 % Student-t interval; a figure without ± was the same in every seed. The masks and the "
        "rewind state come from the one prune stage, so the model-state bytes and the bits sent are the same "
        "in every seed: memory has no seed spread.\n",
        "\n### Memory per rank\n",
        "The largest rank's model state, counted from its tensors: fp32 parameters; the gradients that exist "
        "after a step; optimizer = fp32 master weights + m + v; the compact gradient buffer. Index bytes (the "
        "layout's int32 indices, or the CSR indices) apart, as in the paper's arithmetic. Peak RSS: the largest "
        "rank's VmHWM (reset at the run's start; torch and transformers are imported before it: "
        f"{min(r['rss_start_bytes_max'] for r in rows) / MB:.0f}-{max(r['rss_start_bytes_max'] for r in rows) / MB:.0f} MB "
        "resident at the start, means over seeds), and the run's own: peak minus the resident memory at the "
        "run's start.\n",
        *memory_table(rows),
        "\n### Traffic and time per step\n",
        "Bits: what the largest-sending rank handed to the collective or to `isend`, per step. Seconds: medians "
        f"over the steps after the first {train['timing_skip']}, the largest rank's. All-reduce: the transfer "
        "(pack, collective, unpack) after a barrier, and the wait at that barrier for the other replica's "
        "backward. p2p: the pipeline phase outside this rank's compute, i.e. transfers *and* the bubble. "
        "Rest: optimizer step, zero_grad, the loss all-reduce. 4 ranks share 2 cores: seconds are noisy.\n",
        *traffic_table(rows),
    ]


def sputnik_section(rows: list[dict[str, Any]]) -> list[str]:
    out = [
        "\n## Sparse AxoNN against the Sputnik-like baseline (2x2)\n",
        "Same masks, same compact optimizer and all-reduce; the Sputnik-like model computes the pruned layers "
        "as CSR matmuls (torch.sparse on CPU, MKL) instead of dense matmuls with zeros. Sputnik / sparse AxoNN: "
        "the ratio of the means over seeds (the claim below judges the per-seed ratios).\n",
        "| sparsity | sparse AxoNN step s | Sputnik-like step s | Sputnik / sparse AxoNN | compute s (AxoNN / Sputnik) "
        "| state MB (AxoNN / Sputnik) | perplexity (AxoNN / Sputnik) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r["method"] != "sputnik":
            continue
        a = _find(rows, "sparse", r["sparsity"], r["grid"])
        if a is None:
            continue
        out.append(
            f"| {100 * r['sparsity']:.0f} % | {pm(a, 'step_seconds_median_max', '.3f')} "
            f"| {pm(r, 'step_seconds_median_max', '.3f')} "
            f"| {r['step_seconds_median_max'] / a['step_seconds_median_max']:.2f}x "
            f"| {pm(a, 'compute_seconds_median_max', '.3f')} / {pm(r, 'compute_seconds_median_max', '.3f')} "
            f"| {pm(a, 'state_bytes_max', '.2f', MB)} / {pm(r, 'state_bytes_max', '.2f', MB)} "
            f"| {pm(a, 'val_perplexity', '.3f')} / {pm(r, 'val_perplexity', '.3f')} |"
        )
    return out


def config_section(prune: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    c = prune["configurations"]
    grids = c["num_stages"]
    out = [
        "\n## Configuration effect: the fewest pipeline stages that fit\n",
        f"Per-rank capacity = the dense model's largest stage at {c['capacity_stages']} stages (dense needs "
        f"{c['capacity_stages']}). Largest stage's model state for S stages, counted from each stage's tensors "
        "(prune stage, the train masks). `fp32`: what our runs hold (dense 16 B/param; sparse AxoNN 8 B/param + "
        "16 B/kept; packed gradients 4 + 16). `mixed`: AxoNN's mixed precision, arithmetic on the counted "
        "entries (dense 20 B/param; sparse 4 B/param + 16 B/kept), not measured.\n",
    ]
    for accounting in ("fp32", "mixed"):
        table = c[accounting]
        out += [
            f"\n`{accounting}`: capacity {table['capacity_bytes'] / MB:.2f} MB per rank\n",
            "| variant | sparsity | "
            + " | ".join(f"S = {n} (MB)" for n in grids)
            + " | fewest stages that fit |",
            "|---|---:|" + "---:|" * len(grids) + "---:|",
        ]
        for r in table["rows"]:
            cells = " | ".join(f"{r['largest_stage_bytes'][str(n)] / MB:.2f}" for n in grids)
            fewest = r["fewest_stages"] if r["fewest_stages"] is not None else f"> {grids[-1]}"
            out.append(f"| {r['variant']} | {100 * r['sparsity']:.0f} % | {cells} | {fewest} |")
    measured = [
        x
        for x in (
            _find(rows, "dense", 0.0, "2x2"),
            _find(rows, "sparse", 0.9, "1x4", "packed"),
            _find(rows, "dense", 0.0, "1x4"),
        )
        if x is not None
    ]
    if measured:
        capacity = c["fp32"]["capacity_bytes"]
        out += [
            "\nMeasured (the train runs, means over seeds): the sparse model at the fewest stages that fit "
            "against dense at two.\n",
            "| run | grid | state MB (largest rank) | within capacity | p2p bits/step | all-reduce bits/step "
            "| p2p + bubble s | all-reduce s | step s | perplexity |",
            "|---|---|---:|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in measured:
            out.append(
                f"| {_label(r)} | {r['grid']} | {pm(r, 'state_bytes_max', '.2f', MB)} | "
                f"{'yes' if r['state_bytes_max'] <= capacity else 'no'} | {pm(r, 'p2p_bits_per_step_max', ',.0f')} "
                f"| {pm(r, 'allreduce_bits_per_step_max', ',.0f')} | {pm(r, 'p2p_seconds_median_max', '.4f')} "
                f"| {pm(r, 'allreduce_transfer_seconds_median_max', '.4f')} "
                f"| {pm(r, 'step_seconds_median_max', '.3f')} | {pm(r, 'val_perplexity', '.3f')} |"
            )
    return out


def extrapolation(params: dict[str, Any], prune: dict[str, Any]) -> tuple[dict[str, Any] | None, list[str]]:
    if not FIT.exists():
        return None, [
            "\n(No cost-model fit at results/costmodel/fit.json: run the root `calibrate` stage.)\n"
        ]
    fit = json.loads(FIT.read_text())["params"]
    fit_sha = hashlib.sha256(FIT.read_bytes()).hexdigest()[:12]
    link = costmodel.LinkParams(**fit)
    setting = PaperSetting.from_dict(params.get("extrapolation"))
    sparsity = max(prune["scale_config"]["prune"]["sparsities"])
    m = model_setting(setting, sparsity, link)
    m["fit_sha256"] = fit_sha
    d, s = m["dense"], m["sparse"]
    out = [
        "\n## A MODEL of the paper's setting (not a measurement)\n",
        f"Assumptions (params.yaml `extrapolation`): GPT-2 shape n_layer {setting.n_layer}, d {setting.d_model}, "
        f"vocab {setting.vocab}, context {setting.n_ctx} ({m['num_params'] / 1e9:.2f}B parameters); {setting.num_gpus} GPUs "
        f"of {setting.gpu_memory_gb:g} GB, {100 * setting.state_fraction:.0f} % of it for model state; "
        f"{setting.link_gbit:g} Gbit/s per GPU, alpha {setting.alpha_us:g} µs (assumed), link efficiency "
        f"{link.efficiency:.3f} and gamma {link.gamma:.2e} s/B from our calibration (results/costmodel/fit.json, "
        f"sha256 {fit_sha}); "
        f"{setting.flops_per_gpu / 1e12:g} TFLOP/s at {100 * setting.flops_efficiency:.0f} % efficiency; global batch "
        f"{setting.global_batch} sequences, micro-batch {setting.microbatch}; GPipe bubble; no overlap. "
        f"Sparsity {100 * sparsity:.0f} % of the prunable weights (density {m['density']:.3f} with biases and LayerNorms).\n",
        "| | model state | G_inter x G_data | state / GPU | all-reduce bytes / GPU | all-reduce s | p2p bytes / GPU | p2p s | compute s (with bubble) | step s |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, v in (("dense AxoNN", d), ("sparse AxoNN", s)):
        out.append(
            f"| {name} | {v['state_bytes'] / 1e9:.1f} GB | {v['g_inter']} x {v['g_data']} | {v['state_bytes_per_gpu'] / 1e9:.2f} GB "
            f"| {v['allreduce_bytes_per_gpu'] / 1e6:,.0f} MB | {v['allreduce_seconds']:.3f} | {v['p2p_bytes_per_gpu'] / 1e6:,.0f} MB "
            f"| {v['p2p_seconds']:.3f} | {v['compute_seconds']:.3f} | {v['step_seconds']:.3f} |"
        )
    out.append(
        f"\nModelled: memory -{m['memory_reduction']:.1%}, communication time -{m['comm_reduction']:.1%}, "
        f"speed-up {m['speedup']:+.1%} over dense AxoNN.\n"
    )
    return m, out


def markdown(
    rows: list[dict[str, Any]],
    prune: dict[str, Any],
    params: dict[str, Any],
    scale: str,
    evaluations: dict[str, dict[str, Any]] | None = None,
) -> tuple[str, dict[str, Any] | None, list[dict[str, Any]]]:
    """The report's text, the model of the paper's setting (None without a cost-model fit) and the
    claims judged over seeds, each with the model's figure beside it."""
    train = prune["scale_config"]["train"]
    model, model_text = extrapolation(params, prune)
    claims = with_model(judged_claims(rows, prune), model)
    lines = [
        f"# Sparse AxoNN: results at scale `{scale}`\n",
        "Generated by `python -m papers.sparse_axonn.report` from `results/sparse_axonn/prune.json`, "
        "`results/sparse_axonn/runs/<run>/seed<k>/` and `evaluations/`.\n",
        *prune_section(prune, evaluations),
        *runs_section(rows, train),
        *sputnik_section(rows),
        *config_section(prune, rows),
        *claims_section(claims, prune, model),
        *model_text,
    ]
    return "\n".join(lines) + "\n", model, claims


def _halves(rows: list[dict[str, Any]], key: str, scale: float) -> list[float]:
    """Each row's 95 % half-width of ``key`` times ``scale`` (0 where there is none: one seed)."""
    out = []
    for r in rows:
        half = r.get(f"{key}_half")
        out.append(scale * half if half is not None and math.isfinite(half) else 0.0)
    return out


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Model state by category, bytes sent and seconds per step against sparsity at 2x2 (means over
    seeds; the seconds with their 95 % intervals as error bars)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid_rows = sorted(
        (r for r in rows if r["grid"] == "2x2" and r["method"] != "sputnik"), key=lambda r: r["sparsity"]
    )
    xs = [100 * r["sparsity"] for r in grid_rows]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2), squeeze=False)
    ax = axes[0][0]
    bottom = [0.0] * len(grid_rows)
    for key, label in (
        ("params_bytes", "parameters"),
        ("grads_bytes", "gradients"),
        ("optimizer_bytes", "master + m + v"),
        ("compact_grad_bytes", "compact gradient"),
    ):
        values = [r[key] / MB for r in grid_rows]
        ax.bar(xs, values, bottom=bottom, width=6, label=label)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set(title="model state, largest rank (2x2)", xlabel="sparsity (%)", ylabel="MB")
    ax = axes[0][1]
    ax.plot(
        xs, [r["allreduce_bits_per_step_max"] / 8 / MB for r in grid_rows], marker="o", label="all-reduce"
    )
    ax.plot(xs, [r["p2p_bits_per_step_max"] / 8 / MB for r in grid_rows], marker="s", label="point to point")
    ax.set(title="bytes sent per step, largest rank (2x2)", xlabel="sparsity (%)", ylabel="MB")
    ax = axes[0][2]
    for key, marker, label in (
        ("allreduce_transfer_seconds_median_max", "o", "all-reduce"),
        ("p2p_seconds_median_max", "s", "p2p + bubble"),
        ("step_seconds_median_max", "^", "step"),
    ):
        means = [1e3 * r[key] for r in grid_rows]
        ax.errorbar(xs, means, yerr=_halves(grid_rows, key, 1e3), marker=marker, capsize=3, label=label)
    seeds = _seeds(grid_rows) if grid_rows else "0"
    ax.set(
        title=f"seconds per step (median, largest rank; 2x2)\nmean over {seeds} seed(s), bars: 95 % interval",
        xlabel="sparsity (%)",
        ylabel="ms",
    )
    ax.set_yscale("log")
    save_panels(fig, axes, path)


def main() -> None:
    quiet_environment()
    params = load_params(PIPELINE)
    prune_file = OUT / "prune.json"
    if not prune_file.exists():
        raise SystemExit(f"no {prune_file}: run the prune stage first")
    prune = json.loads(prune_file.read_text())
    rows = collect(RUNS)
    text, model, claims = markdown(rows, prune, params, params["scale"], _evaluations(OUT))
    finish_report(PIPELINE, rows, text, plot, "val_perplexity")
    report = json.loads((OUT / "report.json").read_text())  # finish_report wrote the rows
    if model is not None:  # the model beside them
        report["model"] = model
    report["claims"] = claims  # results/summary.md lists them, judged over seeds
    report["not_tested"] = NOT_TESTED  # listed, never counted as a verdict
    atomic_write_json(OUT / "report.json", finite(report))


if __name__ == "__main__":
    main()
