"""TernGrad end to end at smoke scale: 2 gloo ranks through the launcher, deterministic per seed."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from common.paths import REPO_ROOT
from tests.helpers.processes import run_group


def _launch(tmp_path: Path, name: str, *extra: str) -> dict:
    out = tmp_path / name
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    command = [sys.executable, "-m", "pipelines.launch", "terngrad", "mnist_terngrad", "--scale", "smoke"]
    result = run_group([*command, "--out", str(out), *extra], cwd=REPO_ROOT, env=env, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    run = json.loads((out / "run.json").read_text())
    return {"metrics": json.loads((out / "metrics.json").read_text()), "run": run}


def test_two_rank_smoke_run_is_deterministic_and_counts_two_bits_per_entry(tmp_path):
    first = _launch(tmp_path, "a")
    again = _launch(tmp_path, "b")
    other = _launch(tmp_path, "c", "--seed", "1")
    keys = ("test_accuracy", "test_loss", "train_loss", "bits_per_step")
    assert {k: first["metrics"][k] for k in keys} == {k: again["metrics"][k] for k in keys}
    assert other["run"]["config"]["seed"] == 1
    assert other["metrics"]["train_loss"] != first["metrics"]["train_loss"]
    # 2 ranks: all-gather of 2-bit codes (+ an fp32 scaler per layer), never the int8 sums
    # per step, LeNet-5's 5 layers x (weight, bias); 12 steps at smoke scale
    assert first["run"]["routes"] == {"terngrad-allgather": 10 * 12}
    assert 14 < first["metrics"]["compression_factor"] < 16.1  # 32 / 2, less the scalers
