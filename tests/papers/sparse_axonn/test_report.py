"""Sparse AxoNN's report over seeds on fake train-stage outputs whose figures are known: each claim
judged by its interval (reproduced, not reproduced, inconclusive by straddling or by too few seeds),
the tables' means and intervals, the figure, the summary's count, and the train stage's seeds."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from harness.params import load_params
from harness.verdict import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, mean_interval
from papers.sparse_axonn import claims as sax_claims
from papers.sparse_axonn import report
from papers.sparse_axonn.runs import collect
from pipelines import summary
from trainer.paths import REPO_ROOT

SEEDS = (0, 1, 2)
NUM_PARAMS, NUM_PRUNABLE = 1000, 900  # rho = 1 - 0.9 * 0.9 = 0.19: state bound (8 + 16 rho) / 16 = 0.69
# Per run: state bytes and all-reduce bits of the largest rank (the same every seed: counted), and
# per seed the all-reduce transfer and p2p seconds (their sum: communication) and the step seconds.
RUNS = {
    "dense_2x2": {"state": 1000, "bits": 32_000, "allreduce": (0.5,) * 3, "p2p": (0.5,) * 3,
                  "step": (1.0, 1.0, 1.0)},
    # state 0.6 of dense (inside 0.69), bits 0.25 (outside 0.19), communication 0.5 / 0.7 / 0.6
    # (Δ -0.4 ± 0.25: straddles -0.4), about twice as fast (inside >= 0.34)
    "sparse90_2x2": {"state": 600, "bits": 8_000, "allreduce": (0.1, 0.3, 0.2), "p2p": (0.4,) * 3,
                     "step": (0.5, 0.52, 0.48)},
    "sputnik90_2x2": {"state": 300, "bits": 8_000, "allreduce": (0.2,) * 3, "p2p": (0.4,) * 3,
                      "step": (1.5, 1.56, 1.44)},  # 3x sparse AxoNN's step: Δ +2 (inside >= 0.46)
    # no p2p at one stage: communication 0.1-0.12 of dense (inside -0.4); step about dense's (outside)
    "sparse90p_1x4": {"state": 700, "bits": 16_000, "allreduce": (0.1, 0.12, 0.11), "p2p": (0.0,) * 3,
                      "step": (1.0, 1.1, 0.95)},
}  # fmt: skip
SPECS = {
    "dense_2x2": {"grid": "2x2", "density": 1.0},
    "sparse90_2x2": {"grid": "2x2", "density": 0.19},
    "sputnik90_2x2": {"grid": "2x2", "density": 0.19},
    "sparse90p_1x4": {"grid": "1x4", "density": 0.19},
}


def write_seed(root: Path, run: str, seed: int) -> None:
    """One seed of ``run`` laid out as the train stage writes it (``runs/<run>/seed<k>/``)."""
    spec, fig = SPECS[run], RUNS[run]
    folder = root / "runs" / run / f"seed{seed}"
    folder.mkdir(parents=True)
    state = {"params": fig["state"] // 4, "grads": fig["state"] // 4, "master": fig["state"] // 8,
             "exp_avg": fig["state"] // 8, "exp_avg_sq": fig["state"] // 8, "compact_grad": fig["state"] // 8,
             "index_bytes": 10, "total": fig["state"]}  # fmt: skip
    ranks = [{"rank": r, "state_bytes": {**state, "total": state["total"] - 100 * r}} for r in range(4)]
    seconds = {
        "allreduce_transfer_seconds_median_max": fig["allreduce"][seed],
        "p2p_seconds_median_max": fig["p2p"][seed],
        "step_seconds_median_max": fig["step"][seed],
        **dict.fromkeys(("compute_seconds_median_max", "allreduce_seconds_median_max",
                         "allreduce_wait_seconds_median_max", "rest_seconds_median_max"), 0.01),
    }  # fmt: skip
    metrics = {
        "val_perplexity": 10.0 + seed,
        "density": spec["density"],
        "pruned_nonzero": 0,
        "state_bytes_max": fig["state"],
        "state_bytes_mean": fig["state"] - 150,
        "peak_rss_bytes_max": 1e9 + 1e6 * seed,
        "rss_start_bytes_max": 9e8,
        "run_peak_rss_bytes_max": 1e8 + 1e6 * seed,
        "allreduce_bits_per_step_max": fig["bits"],
        "allreduce_bits_per_step_total": 3 * fig["bits"],
        "p2p_bits_per_step_max": 0 if spec["grid"] == "1x4" else 4096,
        **seconds,
    }
    (folder / "metrics.json").write_text(json.dumps(metrics))
    (folder / "ranks.json").write_text(json.dumps(ranks))
    info = {"grid": spec["grid"], "mlflow_run_id": f"{run}-{seed}", "git_sha": "abc1234"}
    (folder / "run.json").write_text(json.dumps(info))


def fake_prune() -> dict:
    """What the report reads of prune.json: the counts, the pruning table, the configurations."""
    table = {
        "capacity_bytes": 1000,
        "rows": [{"variant": "dense", "sparsity": 0.0, "largest_stage_bytes": {"1": 2000, "2": 1000},
                  "fewest_stages": 2}],
    }  # fmt: skip
    return {
        "num_params": NUM_PARAMS,
        "num_prunable": NUM_PRUNABLE,
        "eval_windows": 16,
        "mlflow_run_id": "prune-id",
        "git_sha": "abc1234",
        "scale_config": {
            "prune": {"steps": 8, "rewind_step": 2, "sparsities": [0.9]},
            "train": {
                "steps": 4,
                "batch_size": 8,
                "num_microbatches": 2,
                "schedule": "gpipe",
                "timing_skip": 1,
            },
        },
        "dense": {"perplexity": 5.0},
        "masks": {"imp_global_90": {"sparsity": 0.9, "perplexity_pruned": 6.0, "perplexity_retrained": 5.2}},
        "configurations": {"num_stages": [1, 2], "capacity_stages": 2, "fp32": table, "mixed": table},
    }


@pytest.fixture
def rows(tmp_path):
    for run in RUNS:
        for seed in SEEDS:
            write_seed(tmp_path, run, seed)
    return collect(tmp_path / "runs", list(RUNS))


@pytest.fixture
def no_fit(monkeypatch, tmp_path):
    monkeypatch.setattr(report, "FIT", tmp_path / "no-fit.json")  # no cost-model fit: no model


def _by_label(claims: list[dict]) -> dict[str, dict]:
    return {c["label"]: c for c in claims}


def test_each_claim_is_judged_by_its_interval_over_seeds(rows):
    judged = _by_label(sax_claims.judged_claims(rows, fake_prune()))
    assert list(judged) == [
        "model state, 2x2",
        "all-reduce bits, 2x2",
        "communication time, 2x2",
        "speed-up, 2x2",
        "communication time, 1x4 vs 2x2",
        "speed-up, 1x4 vs 2x2",
        "speed-up over Sputnik-like, 2x2",
    ]
    rho = 1 - 0.9 * NUM_PRUNABLE / NUM_PARAMS
    memory = judged["model state, 2x2"]
    assert memory["verdict"] == REPRODUCED and memory["seeds"] == [3, 3]
    assert memory["difference"] == pytest.approx(0.6 - 1) and memory["low"] == pytest.approx(memory["high"])
    assert memory["bound"] == f"<= {(8 + 16 * rho) / 16 - 1:+g}x" and "= 0.690" in memory["claim"]
    bits = judged["all-reduce bits, 2x2"]
    assert bits["verdict"] == NOT_REPRODUCED and bits["difference"] == pytest.approx(0.25 - 1)
    assert bits["bound"] == f"<= {rho - 1:+g}x"
    comm = judged["communication time, 2x2"]  # ratios 0.6, 0.8, 0.7 of dense's 1.0
    diffs = [
        a + p - 1 for a, p in zip(RUNS["sparse90_2x2"]["allreduce"], RUNS["sparse90_2x2"]["p2p"], strict=True)
    ]
    mean, half = mean_interval(diffs)
    assert (comm["difference"], comm["low"], comm["high"]) == pytest.approx((mean, mean - half, mean + half))
    assert comm["low"] < -0.4 < comm["high"]
    assert comm["verdict"] == INCONCLUSIVE and comm["reason"] == "the interval straddles a bound of the claim"
    assert judged["speed-up, 2x2"]["verdict"] == REPRODUCED
    assert judged["speed-up, 2x2"]["method_mean"] == pytest.approx(
        sum(1.0 / s for s in RUNS["sparse90_2x2"]["step"]) / 3
    )
    assert judged["communication time, 1x4 vs 2x2"]["verdict"] == REPRODUCED
    assert judged["speed-up, 1x4 vs 2x2"]["verdict"] == NOT_REPRODUCED
    sputnik = judged["speed-up over Sputnik-like, 2x2"]
    assert sputnik["verdict"] == REPRODUCED and sputnik["difference"] == pytest.approx(2.0)
    assert sputnik["paper"] == sax_claims.PAPER["sputnik"] and sputnik["kind"] == "sputnik"


def test_a_claim_with_fewer_than_three_seeds_is_inconclusive_and_says_so(tmp_path):
    for run in RUNS:
        for seed in SEEDS if run != "sputnik90_2x2" else SEEDS[:2]:
            write_seed(tmp_path, run, seed)
    judged = _by_label(sax_claims.judged_claims(collect(tmp_path / "runs", list(RUNS)), fake_prune()))
    sputnik = judged["speed-up over Sputnik-like, 2x2"]  # paired on the seeds both ran: 0 and 1
    assert sputnik["verdict"] == INCONCLUSIVE and sputnik["seeds"] == [2, 2]
    assert sputnik["reason"] == "2 run(s) on one side, 3 needed for an interval"
    assert judged["speed-up, 2x2"]["verdict"] == REPRODUCED  # the other claims still have 3


def test_a_run_with_no_seed_names_the_stage_to_run(tmp_path):
    (tmp_path / "runs" / "dense_2x2").mkdir(parents=True)
    with pytest.raises(SystemExit, match=r"run 'dense_2x2' has no trained seed in .*dense_2x2 \(seed<k>/"):
        collect(tmp_path / "runs", ["dense_2x2"])
    with pytest.raises(SystemExit, match=r"no run\(s\) dense_9x9 in params.yaml; valid: dense_2x2, "):
        collect(tmp_path / "runs", ["dense_9x9"])


def test_rows_hold_each_figures_mean_and_interval_and_counted_figures_have_no_spread(rows):
    sparse = next(r for r in rows if r["run"] == "sparse90_2x2")
    assert sparse["seeds"] == [0, 1, 2] and sparse["grid"] == "2x2"
    mean, half = mean_interval(RUNS["sparse90_2x2"]["step"])
    assert sparse["step_seconds_median_max"] == pytest.approx(mean)
    assert sparse["step_seconds_median_max_half"] == pytest.approx(half) and half > 0
    assert (sparse["state_bytes_max"], sparse["state_bytes_max_half"]) == (600, 0.0)  # counted: no spread
    assert sparse["params_bytes"] == 150 and sparse["optimizer_bytes"] == 3 * 75  # the largest rank's
    assert sparse["comm_seconds"] == pytest.approx(0.6)
    assert sparse["mlflow_run_ids"] == ["sparse90_2x2-0", "sparse90_2x2-1", "sparse90_2x2-2"]
    assert report.pm(sparse, "step_seconds_median_max", ".3f") == f"{mean:.3f} ± {half:.3f}"
    assert report.pm(sparse, "state_bytes_max", ".2f") == "600.00"
    assert report.pm({"x": 2.0, "x_half": math.nan}, "x", ".1f") == "2.0"  # one seed: no interval


def test_the_report_tables_show_means_and_intervals_and_the_paper_as_context(rows, no_fit):
    text, model, claims = report.markdown(rows, fake_prune(), load_params("sparse_axonn"), "cpu")
    assert model is None
    mean, half = mean_interval(RUNS["sparse90_2x2"]["step"])
    traffic = next(line for line in text.splitlines() if line.startswith("| sparse AxoNN 90 % | 2x2 | 8,000"))
    assert f"| {mean:.3f} ± {half:.3f} |" in traffic and "`sparse90_2x2-2`" in traffic
    memory = next(line for line in text.splitlines() if line.startswith("| sparse AxoNN 90 % | 2x2 | 3 |"))
    assert "**0.00 MB**" in memory and "-40.0 %" in memory  # 600 B against 1000 B, no ±
    assert "## The claims, judged over seeds" in text and "rho = 0.1900 of our 1,000 parameters" in text
    context = text.split("### The paper's setting, beside them (context, not judged)", 1)[1]
    line = next(line for line in context.splitlines() if line.startswith("| model state, 2x2 |"))
    assert "reproduced" in line and sax_claims.PAPER["memory"] in line and "no cost-model fit" in line
    not_tested = text.split("### Not tested here", 1)[1]
    assert "32 % faster than DeepSpeed-3D" in not_tested and "the prune stage is one run" in not_tested
    assert "CPU scale" not in text.split("## The claims, judged over seeds", 1)[1]
    assert [c["label"] for c in claims] == [c["label"] for c in sax_claims.judged_claims(rows, fake_prune())]


def test_the_figure_draws_the_seconds_with_their_intervals(rows, tmp_path, monkeypatch):
    drawn = {}

    def keep(fig, axes, path):
        drawn["axes"] = axes
        path.write_bytes(b"\x89PNG")

    monkeypatch.setattr(report, "save_panels", keep)
    report.plot(rows, tmp_path / "curves.png")
    assert (tmp_path / "curves.png").read_bytes() == b"\x89PNG"
    seconds = drawn["axes"][0][2]
    step = next(c for c in seconds.containers if c.get_label() == "step")
    line, _, (bars,) = step.lines
    two_by_two = [r for r in rows if r["grid"] == "2x2" and r["method"] != "sputnik"]
    assert list(line.get_xdata()) == [100 * r["sparsity"] for r in two_by_two] == [0.0, 90.0]
    assert list(line.get_ydata()) == pytest.approx([1e3 * r["step_seconds_median_max"] for r in two_by_two])
    (_, low), (_, high) = bars.get_segments()[1][0], bars.get_segments()[1][1]
    _, half = mean_interval(RUNS["sparse90_2x2"]["step"])
    assert high - low == pytest.approx(2e3 * half)
    assert "mean over 3 seed(s)" in seconds.get_title()


def test_the_summary_counts_the_judged_claims_and_not_the_untested(rows, no_fit, tmp_path, monkeypatch):
    _, _, claims = report.markdown(rows, fake_prune(), load_params("sparse_axonn"), "cpu")
    root = tmp_path / "results"
    (root / "sparse_axonn").mkdir(parents=True)
    payload = {"rows": [], "claims": claims, "not_tested": sax_claims.NOT_TESTED}
    (root / "sparse_axonn" / "report.json").write_text(json.dumps(payload))
    monkeypatch.setattr(summary, "RESULTS_DIR", root)
    text = summary.claims_section()
    assert "4 reproduced, 2 not reproduced, 1 inconclusive (1 for an interval straddling a bound)" in text
    table, _, untested = text.partition(
        "Claims of the papers that no run here can decide (listed, not counted)"
    )
    assert "DeepSpeed" not in table and "- sparse_axonn: 32 % faster than DeepSpeed-3D" in untested
    row = next(line for line in text.splitlines() if "the largest rank's model state" in line)
    assert "0.600 against 1.000: Δ -0.400x" in row and sax_claims.PAPER["memory"] in row


def test_the_train_stage_runs_every_run_over_seeds_0_1_2():
    stages = yaml.safe_load((REPO_ROOT / "pipelines" / "sparse_axonn" / "dvc.yaml").read_text())["stages"]
    train = stages["train"]
    assert "--seeds 0,1,2 --out results/sparse_axonn/runs" in train["do"]["cmd"]
    assert set(train["foreach"]) == set(load_params("sparse_axonn")["runs"])
    for stage in ("prune", "evaluate"):  # one set of masks: prune and evaluate stay one run
        assert "--seed" not in stages[stage]["cmd"]
    assert {"papers/sparse_axonn/claims.py", "papers/sparse_axonn/runs.py"} <= set(stages["report"]["deps"])
