"""ExDyna end to end at smoke scale: several selectors in one launch of 2 gloo ranks."""

from __future__ import annotations

import csv
import json
import os
import sys

from common.paths import REPO_ROOT
from pipelines.common import load_params
from pipelines.train import resolve_config
from tests.helpers.processes import run_group


def test_one_launch_trains_exdyna_and_topk_and_logs_the_density_per_step(tmp_path):
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    command = [sys.executable, "-m", "pipelines.launch", "exdyna", "cifar_exdyna_d01,cifar_topk_d01"]
    result = run_group(
        [*command, "--scale", "smoke", "--seeds", "1", "--out", str(tmp_path / "runs")],
        cwd=REPO_ROOT,
        env=env,
        timeout=400,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    runs = tmp_path / "runs"
    exdyna = json.loads((runs / "cifar_exdyna_d01" / "seed1" / "metrics.json").read_text())
    topk = json.loads((runs / "cifar_topk_d01" / "seed1" / "metrics.json").read_text())
    assert exdyna["density_target"] == topk["density_target"] == 0.01
    assert 1.0 < topk["buildup_mean"] <= 2.0  # two workers' top-k: up to 2k
    assert topk["density_min"] >= 0.01 - 1e-9
    with (runs / "cifar_exdyna_d01" / "seed1" / "train_curve.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 6 and {"density", "select_seconds", "union", "imbalance", "threshold"} <= set(rows[0])
    # lambda_0 estimated from the first step's sample: that step lands near the target
    assert 0.01 / 3 <= float(rows[0]["density"]) <= 0.01 * 3


def test_every_run_composes_and_the_dvc_stages_list_every_run():
    params = load_params("exdyna")
    for scale in params["scales"]:
        for run in params["runs"]:
            resolve_config("exdyna", run, scale)
    text = (REPO_ROOT / "pipelines" / "exdyna" / "dvc.yaml").read_text()
    listed = {
        r
        for line in text.splitlines()
        if line.strip().startswith(("cifar:", "ptb:", "cifar_w2:", "cifar_w8:"))
        for r in line.split(":", 1)[1].strip().split(",")
    }
    assert listed == {r for r in params["runs"] if not r.startswith("paper_")}
