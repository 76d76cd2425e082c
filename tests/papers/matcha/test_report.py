"""MATCHA's report over seeds on fake runs whose times are known: the time-to-loss claims judged
by their interval (reproduced, not reproduced, inconclusive by straddling), the tables' means and
intervals, the figures, and the refusal of runs with different seeds."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import pytest

from harness.verdict import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, mean_interval
from papers.matcha import report, times
from tests.helpers.fake_runs import write_run

SEEDS = (0, 1, 2)
STEPS = list(range(10, 101, 10))
LOSS = [2.0, 1.8, 1.6, 1.4, 1.2, 1.0, 1.0, 1.0, 1.0, 1.0]  # smoothed: 1.0 from step 90 on (the target 1.02)
HIGH = [2.0, 1.8, 1.6, 1.4, 1.2, 1.1, 1.1, 1.1, 1.1, 1.1]  # ends at 1.1
# seconds per step of each run, per seed: the time to a target reached at step 90 is 90 x that
SECONDS_PER_STEP = {
    "vanilla": (1.0, 1.0, 1.0),
    "matcha05": (0.5, 0.6, 0.55),  # faster than vanilla on every seed: reproduced
    "periodic05": (0.3, 0.3, 0.31),  # faster than MATCHA at 0.5: not reproduced
    "matcha03": (0.8, 1.2, 1.0),  # against vanilla -0.2, +0.2, 0 a step: straddles 0
    "periodic03": (0.9, 0.9, 0.9),
    "matcha01": (0.4, 0.4, 0.4),
    "periodic01": (0.5, 0.5, 0.5),
    "centralized": (0.7, 0.7, 0.7),
}


def _options(method: str) -> dict:
    if method == "centralized":
        return {}
    er = {"graph": "paper", "index": 0}
    if method == "vanilla":
        return {**er, "mode": "vanilla"}
    return {**er, "mode": method[:-2], "budget": int(method[-2:]) / 10}


def _write(
    root: Path, method: str, seed: int, loss: list[float] | None = None, network: str = "100mbit"
) -> None:
    run = "mnist_centralized" if method == "centralized" else f"mnist_er_{method}"
    spp = SECONDS_PER_STEP[method][seed]
    rounds = 0.0 if method == "centralized" else 5.0 * _options(method).get("budget", 1.0)
    write_run(
        root,
        "mnist_er",
        run,
        seed,
        metrics={
            "test_accuracy": 0.99,
            "gossip_rounds_per_step": rounds,
            "gossip_alpha": 0.3,
            "gossip_rho": 0.6,
        },
        info={
            "comm_ops_per_step": {"all_reduce": [4.0, 281_000.0]}
            if method == "centralized"
            else {"send": [3.0, 3 * 281_000.0]},
            "config": {"strategy_options": _options(method)},
            "network": network,
        },
        train=[
            {
                "step": s,
                "train_loss": value,
                "wall_seconds": s * spp,
                "communicate_seconds": 0.4 * s * spp,
                "gossip_rounds": s * rounds,
            }
            for s, value in zip(STEPS, loss or LOSS, strict=True)
        ],
    )


@pytest.fixture
def fit(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "fit.json"
    path.write_text(json.dumps({"params": {"alpha": 1e-3, "efficiency": 1.0, "gamma": 0.0}}))
    monkeypatch.setattr(report, "FIT", path)
    return path


@pytest.fixture
def runs(tmp_path) -> Path:
    root = tmp_path / "matcha"
    for method in SECONDS_PER_STEP:
        for seed in SEEDS:
            _write(root, method, seed, loss=HIGH if method == "periodic01" else None)
    return root


def test_each_claim_is_judged_by_its_interval_over_seeds(runs, fit, tmp_path):
    built = report.build(tmp_path / "suite", runs, "cpu")
    verdicts = {c["claim"].split(": ", 1)[1].split(" to the loss")[0]: c for c in built.claims}
    assert len(built.claims) == 6 and all(c["seeds"] == [3, 3] and c["paired"] for c in built.claims)
    faster = verdicts["C_b 0.5 takes less time than vanilla"]
    assert faster["verdict"] == REPRODUCED and faster["high"] < 0
    assert faster["method_mean"] == pytest.approx(90 * statistics.fmean((0.5, 0.6, 0.55)))
    assert faster["baseline_mean"] == pytest.approx(90.0)
    assert faster["speedup"] == pytest.approx(statistics.fmean((2.0, 1 / 0.6, 1 / 0.55)))
    assert faster["metric"] == "seconds" and faster["bound"] == "<= +0 s"
    slower = verdicts["C_b 0.5 takes less time than periodic communication at C_b 0.5"]
    assert slower["verdict"] == NOT_REPRODUCED and slower["low"] > 0
    straddles = verdicts["C_b 0.3 takes less time than vanilla"]
    assert straddles["verdict"] == INCONCLUSIVE and straddles["low"] < 0 < straddles["high"]
    assert straddles["reason"] == "the interval straddles a bound of the claim"
    assert all("(time measured on 100 Mbit/s tc-shaped links, s)" in c["claim"] for c in built.claims)
    # periodic at 0.1 ends at 1.1: against MATCHA the target is 1.1 x 1.02, which MATCHA reaches at
    # step 80 (smoothed 1.05) and periodic at step 90
    against = verdicts["C_b 0.1 takes less time than periodic communication at C_b 0.1"]
    assert against["method_mean"] == pytest.approx(80 * 0.4) and against["baseline_mean"] == pytest.approx(
        90 * 0.5
    )
    text = built.text
    assert "**reproduced**" in text and "**not reproduced**" in text and "straddles" in text
    assert "one seed" not in text and "3 seed(s) per run" in text


def test_rows_show_each_figure_as_its_mean_and_interval_over_seeds(runs, fit, tmp_path):
    rows = {r["run"]: r for r in report.build(tmp_path / "suite", runs, "cpu").rows}
    vanilla, matcha = rows["mnist_er_vanilla"], rows["mnist_er_matcha05"]
    assert vanilla["seeds"] == list(SEEDS) and vanilla["speedup"]["mean"] == pytest.approx(1.0)
    assert vanilla["target"]["mean"] == pytest.approx(1.02)
    mean, half = mean_interval([90 * s for s in SECONDS_PER_STEP["matcha05"]])
    assert matcha["time_to_target"] == pytest.approx({"mean": mean, "half": half})
    assert matcha["wall_seconds"]["mean"] == pytest.approx(100 * 0.55)
    assert rows["mnist_er_periodic01"]["target"]["mean"] == pytest.approx(1.1 * 1.02)
    assert rows["mnist_er_matcha03"]["mlflow_run_ids"] == [
        "mnist_er_matcha03-0",
        "mnist_er_matcha03-1",
        "mnist_er_matcha03-2",
    ]
    assert f"{mean:.1f} ± {half:.1f}" in report.build(tmp_path / "suite", runs, "cpu").text


def test_figures_draw_the_spread_over_seeds(runs, fit, tmp_path):
    built = report.build(tmp_path / "suite", runs, "cpu")
    assert set(built.figures) == {"curves.png", "spectrum_er.png", "spectrum_geo.png"}
    path = tmp_path / "curves.png"
    built.figures["curves.png"](path)
    assert path.stat().st_size > 10_000


def test_unshaped_runs_are_judged_on_the_modelled_clock(tmp_path, fit):
    root = tmp_path / "matcha"
    for method in SECONDS_PER_STEP:
        for seed in SEEDS:
            _write(root, method, seed, network="unshaped")
    built = report.build(tmp_path / "suite", root, "cpu")
    assert all("(modelled time, s)" in c["claim"] for c in built.claims)
    assert {r["clock"] for r in built.rows} == {"modelled"}


def test_runs_with_different_seeds_are_refused(runs, fit, tmp_path):
    shutil.rmtree(runs / "runs" / "mnist_er" / "mnist_er_vanilla" / "seed2")
    with pytest.raises(
        SystemExit, match=r"mnist_er_matcha05 has seeds \[0, 1, 2\], mnist_er_vanilla has \[0, 1\]"
    ):
        report.build(tmp_path / "suite", runs, "cpu")


def test_a_common_target_is_reached_by_both_runs():
    def curve(loss: list[float]) -> dict:
        return {
            "run": "r",
            "seed": 0,
            "steps": STEPS,
            "loss": times.smooth(loss),
            "wall": [float(s) for s in STEPS],
        }

    target, t_a, t_b = times.times_to(curve(LOSS), curve(HIGH), "wall")
    assert target == pytest.approx(1.1 * 1.02) and (t_a, t_b) == (80.0, 90.0)
    with pytest.raises(ValueError, match="never reaches the loss 0.9000"):
        times.reach(curve(LOSS), 0.9, "wall")
