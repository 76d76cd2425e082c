"""TernGrad end to end at smoke scale: 2 gloo ranks through the launcher, deterministic per seed."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from common.paths import REPO_ROOT
from tests.helpers.processes import run_group


def _launch(tmp_path: Path, name: str, *extra: str) -> Path:
    out = tmp_path / name
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    command = [sys.executable, "-m", "pipelines.launch", "terngrad", "mnist_terngrad", "--scale", "smoke"]
    result = run_group([*command, "--out", str(out), *extra], cwd=REPO_ROOT, env=env, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return out


def _read(out: Path) -> dict:
    run = json.loads((out / "run.json").read_text())
    return {"metrics": json.loads((out / "metrics.json").read_text()), "run": run}


def test_two_rank_smoke_run_is_deterministic_and_counts_two_bits_per_entry(tmp_path):
    first = _read(_launch(tmp_path, "a"))
    # Two seeds in one launch (the pipeline's way): seed 0 repeats the separate launch exactly.
    repeats = _launch(tmp_path, "b", "--seeds", "0,1")
    again, other = _read(repeats / "seed0"), _read(repeats / "seed1")
    keys = ("test_accuracy", "test_loss", "train_loss", "bits_per_step")
    assert {k: first["metrics"][k] for k in keys} == {k: again["metrics"][k] for k in keys}
    assert again["run"]["config"]["seed"] == 0 and other["run"]["config"]["seed"] == 1
    assert again["run"]["mlflow_run_id"] != other["run"]["mlflow_run_id"]
    assert other["metrics"]["train_loss"] != first["metrics"]["train_loss"]
    # 2 ranks: all-gather of 2-bit codes (+ an fp32 scaler per layer), never the int8 sums
    # per step, LeNet-5's 5 layers x (weight, bias); 12 steps at smoke scale
    assert first["run"]["routes"] == {"terngrad-allgather": 10 * 12}
    assert 14 < first["metrics"]["compression_factor"] < 16.1  # 32 / 2, less the scalers


def test_bad_seed_lists_fail_before_any_worker_starts(tmp_path):
    for bad in ("0,x", "1,1", "-2"):
        command = [sys.executable, "-m", "pipelines.launch", "terngrad", "mnist_fp32", "--seeds", bad]
        result = run_group([*command, "--out", str(tmp_path / "x")], cwd=REPO_ROOT, timeout=120)
        assert result.returncode != 0
        assert f"--seeds {bad!r}" in result.stderr
    assert not (tmp_path / "x").exists()


def test_every_run_composes_and_fp32_layers_name_real_parameters():
    """The paper-scale runs cannot run here (no ImageNet, no cluster): check what can be checked."""
    import torch

    from common.models import build_model
    from pipelines.common import load_params
    from pipelines.train import resolve_config

    params = load_params("terngrad")
    for scale in params["scales"]:
        for run in params["runs"]:
            config = resolve_config("terngrad", run, scale)
            names = config.compressor_options.get("fp32_layers", [])
            if names:
                with torch.device("meta"):
                    model = build_model(config.model, num_classes=1000, in_channels=3, image_size=224)
                parameters = dict(model.named_parameters())
                assert all(f"{n}.weight" in parameters for n in names), (run, names)
    alexnet = resolve_config("terngrad", "paper_alexnet_terngrad", "paper")
    assert (alexnet.world_size * alexnet.batch_size, alexnet.lr, alexnet.lr_milestones) == (
        1024,
        0.04,
        (20, 40, 60),
    )
