"""MATCHA end to end at smoke scale (8 gloo ranks, the paper's graph 0, the suite's MNIST
recipe), and the report's arithmetic."""

from __future__ import annotations

import csv
import json
import os
import sys

import pytest
import yaml

from harness.costmodel import LinkParams, collective_time
from harness.params import load_params
from papers.matcha import report, times
from pipelines.train import resolve_config
from tests.helpers.mlflow_store import fresh_store
from tests.helpers.processes import run_group
from tests.helpers.smoke_record import check_losses
from trainer.paths import REPO_ROOT


def test_one_launch_trains_vanilla_and_matcha_on_eight_ranks(tmp_path):
    env = {**os.environ, "MLFLOW_TRACKING_URI": fresh_store(tmp_path)}
    command = [sys.executable, "-m", "pipelines.launch", "matcha", "mnist_er_vanilla,mnist_er_matcha01"]
    result = run_group(
        [*command, "--scale", "smoke", "--seeds", "0", "--out", str(tmp_path / "runs")],
        cwd=REPO_ROOT,
        env=env,
        timeout=500,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    runs = tmp_path / "runs"
    vanilla = json.loads((runs / "mnist_er_vanilla" / "seed0" / "metrics.json").read_text())
    matcha = json.loads((runs / "mnist_er_matcha01" / "seed0" / "metrics.json").read_text())
    # vanilla: every matching of graph 0 every step, with alpha 2 / (lambda_2 + lambda_max)
    assert vanilla["gossip_rounds_per_step"] == 5.0
    assert vanilla["gossip_alpha"] == pytest.approx(0.2857, abs=1e-4)
    assert matcha["gossip_alpha"] == pytest.approx(0.5621, abs=2e-3)  # papers.md 2.3, C_b = 0.1
    assert matcha["gossip_rounds_per_step"] < 5.0
    # rank 0 of graph 0 has 3 neighbours: vanilla sends it the model 3 times a step (fp32): the
    # airbench net's 70,256 trainable entries (the frozen whitening filters and BN scales stay home)
    info = json.loads((runs / "mnist_er_vanilla" / "seed0" / "run.json").read_text())
    calls, nbytes = info["comm_ops_per_step"]["send"]
    assert calls == 3.0 and nbytes == 3 * 70_256 * 4
    with (runs / "mnist_er_matcha01" / "seed0" / "train_curve.csv").open() as f:
        rounds = [float(row["gossip_rounds"]) for row in csv.DictReader(f)]
    assert rounds == sorted(rounds) and rounds[-1] == pytest.approx(6 * matcha["gossip_rounds_per_step"])
    check_losses("matcha", runs)  # training arithmetic unchanged by refactors


def test_every_run_composes_and_the_dvc_stages_list_every_run():
    params = load_params("matcha")
    for scale in params["scales"]:
        for run in params["runs"]:
            resolve_config("matcha", run, scale)
    text = (REPO_ROOT / "pipelines" / "matcha" / "dvc.yaml").read_text()
    listed = {
        r
        for line in text.splitlines()
        if line.strip().startswith("runs:")
        for r in line.split(":", 1)[1].strip().split(",")
    }
    assert listed == {r for r in params["runs"] if not r.startswith("paper_")}
    for task, (_, centralized) in report.TASKS.items():
        assert {f"{task}_{m}" for m in report.METHODS} | {centralized} <= listed


def test_every_run_a_claim_reads_trains_three_seeds():
    stages = yaml.safe_load((REPO_ROOT / "pipelines" / "matcha" / "dvc.yaml").read_text())["stages"]
    groups = stages["train"]["foreach"]
    assert {g: spec["seeds"] for g, spec in groups.items()} == {"mnist_er": "0,1,2"}
    assert "--seeds ${item.seeds}" in stages["train"]["do"]["cmd"]
    read = {f"{task}_{m}" for task in report.TASKS for m in report.METHODS}
    assert read <= set(groups["mnist_er"]["runs"].split(","))


def test_report_smooths_models_time_and_finds_the_first_step_at_the_target():
    assert times.smooth([4.0, 2.0, 0.0, 2.0, 6.0], width=2) == [4.0, 3.0, 1.0, 1.0, 4.0]
    params = LinkParams(alpha=1e-3, efficiency=1.0, gamma=0.0)
    gossip = {"mode": "matcha", "steps": [5, 10], "rounds": [3.0, 4.0], "message_bytes": 125_000.0}
    t_round = 1e-3 + 125_000 * 8 / 1e7  # one message of 125 kB at 10 Mbit/s
    assert times.modelled_times(gossip, 0.2, params, 1e7) == pytest.approx(
        [1.0 + 3 * t_round, 2.0 + 4 * t_round]
    )
    central = {"mode": "centralized", "steps": [5], "calls": 4.0, "bytes": 125_000.0}
    t_reduce = collective_time("all_reduce", 8, 125_000.0, 1e7, params, calls=4)
    assert t_reduce > 8 * 1e-3 * 7  # four all-reduces: 4 x 2 (p - 1) message latencies
    assert times.modelled_times(central, 0.2, params, 1e7) == pytest.approx([5 * (0.2 + t_reduce)])
    assert times.first_reach([3.0, 2.0, 1.5, 1.0], [1.0, 2.0, 3.0, 4.0], [5, 10, 15, 20], 1.6) == (15, 3.0)
    assert times.first_reach([3.0, 2.0], [1.0, 2.0], [5, 10], 1.0) is None
