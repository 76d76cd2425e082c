"""DGC and QSGD end to end at smoke scale: several runs in one launch of 2 gloo ranks."""

from __future__ import annotations

import json
import os
import sys

from common.paths import REPO_ROOT
from pipelines.common import load_params
from pipelines.train import resolve_config
from tests.helpers.processes import run_group


def test_one_launch_trains_dgc_and_qsgd_and_counts_what_they_send(tmp_path):
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    command = [
        sys.executable,
        "-m",
        "pipelines.launch",
        "dgc_qsgd",
        "ptb_dgc_clip,cifar_qsgd4",
        "--scale",
        "smoke",
    ]
    result = run_group(
        [*command, "--seeds", "0", "--out", str(tmp_path / "runs")], cwd=REPO_ROOT, env=env, timeout=400
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    dgc = json.loads((tmp_path / "runs" / "ptb_dgc_clip" / "seed0" / "metrics.json").read_text())
    qsgd = json.loads((tmp_path / "runs" / "cifar_qsgd4" / "seed0" / "metrics.json").read_text())
    # Warm-up over the first quarter epoch (25% of the matrices' entries), then 0.1%: the run's
    # average lies between; the LSTM's embedding and decoder dominate the bits.
    assert 0.001 <= dgc["density_sent"] <= 0.25
    # 8 smoke steps, half of them in the warm-up (a quarter epoch of 16 steps at 25% ... 0.4%)
    assert dgc["compression_factor"] > 1.5
    assert "test_perplexity" in dgc
    # 4-bit fixed-width codes and an fp32 norm per bucket of 512 (dense biases included): about 32/4
    assert 7 < qsgd["compression_factor"] < 8
    run = json.loads((tmp_path / "runs" / "cifar_qsgd4" / "seed0" / "run.json").read_text())
    assert run["config"]["compressor_options"]["encoding"] == "fixed" and run["config"]["seed"] == 0


def test_every_run_composes_and_the_dvc_stages_list_every_run():
    params = load_params("dgc_qsgd")
    for scale in params["scales"]:
        for run in params["runs"]:
            resolve_config("dgc_qsgd", run, scale)
    text = (REPO_ROOT / "pipelines" / "dgc_qsgd" / "dvc.yaml").read_text()
    listed = {
        r
        for line in text.splitlines()
        if line.strip().startswith(("cifar:", "ptb:"))
        for r in line.split(":", 1)[1].strip().split(",")
    }
    assert listed == {r for r in params["runs"] if not r.startswith("paper_")}
