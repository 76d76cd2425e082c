"""Sparse AxoNN against dense AxoNN and the Sputnik-like baseline: memory, communication, time.

    python -m papers.sparse_axonn.report

Reads ``results/sparse_axonn/prune.json`` and ``results/sparse_axonn/runs/<run>/`` and writes
``results/sparse_axonn/report.md``, ``report.json`` and ``curves.png``: the pruning table; per run
the model-state bytes per rank by category, peak process memory, all-reduce and point-to-point
bits and seconds per step, step time, validation perplexity; the Sputnik comparison; which grids
fit a per-rank capacity and the measured configuration effect; the paper's claims beside our
measured figures; and a cost-model extrapolation to the paper's setting (labelled as a model).
Every number comes from those files (and ``results/costmodel/fit.json``).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from harness import costmodel
from harness.entry import quiet_environment
from harness.folders import RESULTS_DIR
from harness.params import load_params
from harness.report import finish_report, save_panels
from trainer.fileio import atomic_write_json

from .extrapolate import PaperSetting, model_setting
from .params import convergence

PIPELINE = "sparse_axonn"
OUT = RESULTS_DIR / PIPELINE
RUNS = OUT / "runs"
FIT = RESULTS_DIR / "costmodel" / "fit.json"
METHODS = {"dense": "dense AxoNN", "sparse": "sparse AxoNN", "sputnik": "Sputnik-like (CSR)"}
CLAIMS = {  # the abstract's numbers (research/papers.md 1.1)
    "memory": "-74 % memory (2.7B model, 90 % sparsity)",
    "comm": "-40 % total communication time",
    "speedup": "34 % faster than dense AxoNN (512 V100s)",
    "sputnik": "46 % faster than Sputnik",
}
MB = 1e6


def collect(runs: Path = RUNS, names: list[str] | None = None) -> list[dict[str, Any]]:
    """One row per run of params.yaml (or of ``names``) from ``runs/<run>/``."""
    specs = load_params(PIPELINE)["runs"]
    rows = []
    for name in names or list(specs):
        spec = specs[name]
        folder = runs / name
        missing = [f for f in ("metrics.json", "ranks.json", "run.json") if not (folder / f).exists()]
        if missing:
            raise SystemExit(
                f"run {name!r} has no {', '.join(missing)} in {folder}: run its train stage first"
            )
        metrics = json.loads((folder / "metrics.json").read_text())
        ranks = json.loads((folder / "ranks.json").read_text())
        info = json.loads((folder / "run.json").read_text())
        worst = max(ranks, key=lambda r: r["state_bytes"]["total"])["state_bytes"]
        rows.append(
            {
                "run": name,
                "method": spec["method"],
                "sparsity": float(spec.get("sparsity", 0.0)),
                "grads": spec.get("grads", "dense"),
                "grid": info["grid"],
                **metrics,
                "params_bytes": worst["params"],
                "grads_bytes": worst["grads"],
                "optimizer_bytes": worst["master"] + worst["exp_avg"] + worst["exp_avg_sq"],
                "compact_grad_bytes": worst["compact_grad"],
                "index_bytes": worst["index_bytes"],
                "mlflow_run_id": info["mlflow_run_id"],
                "git_sha": info["git_sha"],
                "_ranks": ranks,
            }
        )
    return rows


def _find(
    rows: list[dict[str, Any]], method: str, sparsity: float, grid: str, grads: str = "dense"
) -> dict[str, Any] | None:
    return next(
        (
            r
            for r in rows
            if (r["method"], r["sparsity"], r["grid"], r["grads"]) == (method, sparsity, grid, grads)
        ),
        None,
    )


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


def runs_section(rows: list[dict[str, Any]], train: dict[str, Any]) -> list[str]:
    dense = _find(rows, "dense", 0.0, "2x2")
    out = [
        "\n## Training runs (train stage, 4 gloo ranks)\n",
        f"{train['steps']} steps of {train['batch_size']} sequences ({train['num_microbatches']} micro-batches per "
        f"replica, {train['schedule']}) from the rewind state, the same batches for every run.\n",
        "\n### Memory per rank\n",
        "The largest rank's model state, counted from its tensors: fp32 parameters; the gradients that exist "
        "after a step; optimizer = fp32 master weights + m + v; the compact gradient buffer. Index bytes (the "
        "layout's int32 indices, or the CSR indices) apart, as in the paper's arithmetic. Peak RSS: the largest "
        "rank's VmHWM (reset at the run's start; torch and transformers are imported before it: "
        f"{min(r['rss_start_bytes_max'] for r in rows) / MB:.0f}-{max(r['rss_start_bytes_max'] for r in rows) / MB:.0f} MB "
        "resident at the start), and the run's own: peak minus the resident memory at the run's start.\n",
        "| run | grid | density | params | grads | optimizer | compact grad | state total | vs dense 2x2 | index "
        "| peak RSS | run's own peak RSS |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ref = dense or r
        out.append(
            f"| {_label(r)} | {r['grid']} | {r['density']:.3f} | {r['params_bytes'] / MB:.2f} MB "
            f"| {r['grads_bytes'] / MB:.2f} MB | {r['optimizer_bytes'] / MB:.2f} MB | {r['compact_grad_bytes'] / MB:.2f} MB "
            f"| **{r['state_bytes_max'] / MB:.2f} MB** | {_pct(r['state_bytes_max'], ref['state_bytes_max'])} "
            f"| {r['index_bytes'] / MB:.2f} MB | {r['peak_rss_bytes_max'] / MB:.0f} MB | {r['run_peak_rss_bytes_max'] / MB:.0f} MB |"
        )
    out += [
        "\n### Traffic and time per step\n",
        "Bits: what the largest-sending rank handed to the collective or to `isend`, per step. Seconds: medians "
        f"over the steps after the first {train['timing_skip']}, the largest rank's. All-reduce: the transfer "
        "(pack, collective, unpack) after a barrier, and the wait at that barrier for the other replica's "
        "backward. p2p: the pipeline phase outside this rank's compute, i.e. transfers *and* the bubble. "
        "Rest: optimizer step, zero_grad, the loss all-reduce. 4 ranks share 2 cores: seconds are noisy.\n",
        "| run | grid | all-reduce bits | vs dense 2x2 | all-reduce s | barrier wait s | p2p bits | p2p + bubble s "
        "| compute s | rest s | step s | perplexity | pruned nonzero | MLflow run id |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        ref = dense or r
        out.append(
            f"| {_label(r)} | {r['grid']} | {r['allreduce_bits_per_step_max']:,.0f} "
            f"| {_pct(r['allreduce_bits_per_step_max'], ref['allreduce_bits_per_step_max'])} "
            f"| {r['allreduce_transfer_seconds_median_max']:.4f} | {r['allreduce_wait_seconds_median_max']:.4f} "
            f"| {r['p2p_bits_per_step_max']:,.0f} | {r['p2p_seconds_median_max']:.4f} | {r['compute_seconds_median_max']:.3f} "
            f"| {r['rest_seconds_median_max']:.4f} | {r['step_seconds_median_max']:.3f} | {r['val_perplexity']:.3f} "
            f"| {r['pruned_nonzero']} | `{r['mlflow_run_id']}` |"
        )
    return out


def sputnik_section(rows: list[dict[str, Any]]) -> list[str]:
    out = [
        "\n## Sparse AxoNN against the Sputnik-like baseline (2x2)\n",
        "Same masks, same compact optimizer and all-reduce; the Sputnik-like model computes the pruned layers "
        "as CSR matmuls (torch.sparse on CPU, MKL) instead of dense matmuls with zeros.\n",
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
            f"| {100 * r['sparsity']:.0f} % | {a['step_seconds_median_max']:.3f} | {r['step_seconds_median_max']:.3f} "
            f"| {r['step_seconds_median_max'] / a['step_seconds_median_max']:.2f}x "
            f"| {a['compute_seconds_median_max']:.3f} / {r['compute_seconds_median_max']:.3f} "
            f"| {a['state_bytes_max'] / MB:.2f} / {r['state_bytes_max'] / MB:.2f} "
            f"| {a['val_perplexity']:.3f} / {r['val_perplexity']:.3f} |"
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
            "\nMeasured (the train runs): the sparse model at the fewest stages that fit against dense at two.\n",
            "| run | grid | state MB (largest rank) | within capacity | p2p bits/step | all-reduce bits/step "
            "| p2p + bubble s | all-reduce s | step s | perplexity |",
            "|---|---|---:|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in measured:
            out.append(
                f"| {_label(r)} | {r['grid']} | {r['state_bytes_max'] / MB:.2f} | "
                f"{'yes' if r['state_bytes_max'] <= capacity else 'no'} | {r['p2p_bits_per_step_max']:,.0f} "
                f"| {r['allreduce_bits_per_step_max']:,.0f} | {r['p2p_seconds_median_max']:.4f} "
                f"| {r['allreduce_transfer_seconds_median_max']:.4f} | {r['step_seconds_median_max']:.3f} | {r['val_perplexity']:.3f} |"
            )
    return out


def _comm(r: dict[str, Any]) -> float:
    """All-reduce transfer plus point to point (with the bubble, which p2p timing cannot separate)."""
    return float(r["allreduce_transfer_seconds_median_max"] + r["p2p_seconds_median_max"])


def claims(
    rows: list[dict[str, Any]], prune: dict[str, Any], model: dict[str, Any] | None
) -> list[dict[str, str]]:
    """The paper's claims beside our measured figures and the model's."""
    dense, s90 = _find(rows, "dense", 0.0, "2x2"), _find(rows, "sparse", 0.9, "2x2")
    p90, d14 = _find(rows, "sparse", 0.9, "1x4", "packed"), _find(rows, "dense", 0.0, "1x4")
    sp90 = _find(rows, "sputnik", 0.9, "2x2")
    mixed = {(r["variant"], r["sparsity"]): r for r in prune["configurations"]["mixed"]["rows"]}
    out = []
    if dense and s90:
        measured = f"fp32, 2x2, largest rank: {_pct(s90['state_bytes_max'], dense['state_bytes_max'])} (sparse AxoNN 90 %)"
        if p90 and d14:
            measured += f"; {_pct(p90['state_bytes_max'], d14['state_bytes_max'])} with packed gradients (1x4 against dense 1x4)"
        one = str(prune["configurations"]["num_stages"][0])
        arithmetic = _pct(
            mixed[("sparse", 0.9)]["largest_stage_bytes"][one],
            mixed[("dense", 0.0)]["largest_stage_bytes"][one],
        )
        measured += f"; mixed-precision arithmetic on our counted entries: {arithmetic}"
        out.append({"claim": CLAIMS["memory"], "ours": measured, "model": _model(model, "memory_reduction")})
        transfer = "allreduce_transfer_seconds_median_max"
        comm = (
            f"2x2: all-reduce bits {_pct(s90['allreduce_bits_per_step_max'], dense['allreduce_bits_per_step_max'])}, "
            f"all-reduce seconds {_pct(s90[transfer], dense[transfer])}, all-reduce + p2p (with the bubble) "
            f"seconds {_pct(_comm(s90), _comm(dense))}"
        )
        if p90:
            comm += f"; sparse 90 % at 1x4 against dense 2x2: {_pct(_comm(p90), _comm(dense))}"
        out.append({"claim": CLAIMS["comm"], "ours": comm, "model": _model(model, "comm_reduction")})
        speed = f"2x2: {dense['step_seconds_median_max'] / s90['step_seconds_median_max'] - 1:+.1%} (dense step / sparse step - 1)"
        if p90:
            speed += f"; sparse 90 % at 1x4 against dense 2x2: {dense['step_seconds_median_max'] / p90['step_seconds_median_max'] - 1:+.1%}"
        out.append({"claim": CLAIMS["speedup"], "ours": speed, "model": _model(model, "speedup", sign=True)})
    if s90 and sp90:
        out.append(
            {
                "claim": CLAIMS["sputnik"],
                "ours": f"2x2, 90 %: sparse AxoNN {sp90['step_seconds_median_max'] / s90['step_seconds_median_max'] - 1:+.1%} faster than the Sputnik-like CSR baseline",
                "model": "not modelled (needs sparse-kernel speeds)",
            }
        )
    return out


def measured_claims(
    rows: list[dict[str, Any]], prune: dict[str, Any], model: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """The claims as results/summary.md lists them: inconclusive, since one run per configuration at
    CPU scale cannot decide a claim about 512 V100s and a 2.7B model; ours and the model's figures
    beside the paper's."""
    labels = {
        CLAIMS["memory"]: "model state memory against dense AxoNN",
        CLAIMS["comm"]: "communication time against dense AxoNN",
        CLAIMS["speedup"]: "speed-up over dense AxoNN",
        CLAIMS["sputnik"]: "speed-up over a Sputnik-like sparse baseline",
    }
    return [
        {
            "claim": f"sparse AxoNN's {labels[c['claim']]}",
            "paper": c["claim"],
            "ours": f"{c['ours']}; model of the paper's setting: {c['model']}",
            "verdict": "inconclusive",
            "reason": "one run per configuration at CPU scale (4 gloo ranks, a small GPT-2) against a claim "
            "for 512 V100s and a 2.7B model",
        }
        for c in claims(rows, prune, model)
    ]


def _model(model: dict[str, Any] | None, key: str, sign: bool = False) -> str:
    if model is None:
        return "no cost-model fit"
    value = model[key]
    return f"{value:+.1%} (model)" if sign else f"-{value:.1%} (model)"


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
) -> tuple[str, dict[str, Any] | None]:
    train = prune["scale_config"]["train"]
    model, model_text = extrapolation(params, prune)
    lines = [
        f"# Sparse AxoNN: results at scale `{scale}`\n",
        "Generated by `python -m papers.sparse_axonn.report` from `results/sparse_axonn/prune.json` and "
        "`results/sparse_axonn/runs/` and `evaluations/`.\n",
        *prune_section(prune, evaluations),
        *runs_section(rows, train),
        *sputnik_section(rows),
        *config_section(prune, rows),
        "\n## The paper's claims beside ours\n",
        "| claim (paper, 512 V100s) | ours, measured (CPU, 4 gloo ranks, small GPT-2) | model of the paper's setting |",
        "|---|---|---|",
    ]
    lines += [f"| {c['claim']} | {c['ours']} | {c['model']} |" for c in claims(rows, prune, model)]
    lines += model_text
    return "\n".join(lines) + "\n", model


def plot(rows: list[dict[str, Any]], path: Path) -> None:
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
    ax.plot(
        xs,
        [1e3 * r["allreduce_transfer_seconds_median_max"] for r in grid_rows],
        marker="o",
        label="all-reduce",
    )
    ax.plot(xs, [1e3 * r["p2p_seconds_median_max"] for r in grid_rows], marker="s", label="p2p + bubble")
    ax.plot(xs, [1e3 * r["step_seconds_median_max"] for r in grid_rows], marker="^", label="step")
    ax.set(title="seconds per step (median, largest rank; 2x2)", xlabel="sparsity (%)", ylabel="ms")
    ax.set_yscale("log")
    save_panels(fig, axes, path)


def main() -> None:
    quiet_environment()
    params = load_params(PIPELINE)
    prune_file = OUT / "prune.json"
    if not prune_file.exists():
        raise SystemExit(f"no {prune_file}: run the prune stage first")
    prune = json.loads(prune_file.read_text())
    rows = collect()
    text, model = markdown(rows, prune, params, params["scale"], _evaluations(OUT))
    for r in rows:
        r["mlflow_run_id"] = r["mlflow_run_id"] or ""
    finish_report(PIPELINE, rows, text, plot, "val_perplexity")
    report = json.loads((OUT / "report.json").read_text())  # finish_report wrote the rows
    if model is not None:  # the model beside them
        report["model"] = model
    report["measured_claims"] = measured_claims(rows, prune, model)
    atomic_write_json(OUT / "report.json", report)


if __name__ == "__main__":
    main()
