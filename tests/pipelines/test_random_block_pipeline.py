"""DEF with random blocks end to end at smoke scale: several runs in one launch of 2 gloo ranks."""

from __future__ import annotations

import json
import os
import sys

from common.paths import REPO_ROOT
from pipelines.common import load_params
from pipelines.train import resolve_config
from tests.helpers.processes import run_group


def test_one_launch_trains_def_defa_and_topk_and_counts_what_they_send(tmp_path):
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    command = [
        sys.executable,
        "-m",
        "pipelines.launch",
        "random_block",
        "d16_block_def,d16_block_defa,d16_topk_ef",
    ]
    result = run_group(
        [*command, "--scale", "smoke", "--seeds", "0", "--out", str(tmp_path / "runs")],
        cwd=REPO_ROOT,
        env=env,
        timeout=400,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    metrics = {
        run: json.loads((tmp_path / "runs" / run / "seed0" / "metrics.json").read_text())
        for run in ("d16_block_def", "d16_block_defa", "d16_topk_ef")
    }
    # one block of ceil(n / 16) fp32 values per tensor and nothing else: 16x, a little less for
    # the rounding up of small tensors (biases, BatchNorm)
    assert 14 < metrics["d16_block_def"]["compression_factor"] <= 16
    # DEF-A also averages the errors and the momentum through blocks: three blocks per tensor
    ratio = metrics["d16_block_def"]["compression_factor"] / metrics["d16_block_defa"]["compression_factor"]
    assert abs(ratio - 3) < 1e-6
    # top-k sends int32 indices with its values, through an all-gather (sizes known: no exchange)
    assert 7 < metrics["d16_topk_ef"]["compression_factor"] <= 8
    evals = (tmp_path / "runs" / "d16_block_def" / "seed0" / "eval_curve.csv").read_text().splitlines()
    assert len(evals) == 1 + 2  # header + evaluations at steps 3 and 6


def test_every_run_composes_and_the_dvc_stages_list_every_run():
    params = load_params("random_block")
    for scale in params["scales"]:
        for run in params["runs"]:
            resolve_config("random_block", run, scale)
    text = (REPO_ROOT / "pipelines" / "random_block" / "dvc.yaml").read_text()
    listed = {
        r
        for line in text.splitlines()
        if line.strip().startswith(("d16:", "d64:"))
        for r in line.split(":", 1)[1].strip().split(",")
    }
    assert listed == {r for r in params["runs"] if not r.startswith("paper_")}
