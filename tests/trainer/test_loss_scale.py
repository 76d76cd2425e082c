"""fp16's dynamic loss scale: GradScaler's rule, decided by every rank together."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tests.distributed import run_ranks
from tests.trainer.test_train import _train_ranks
from trainer.loss_scale import LossScaler


def test_the_scale_backs_off_on_overflow_and_grows_after_clean_steps():
    scaler = LossScaler(init_scale=1024.0, growth_interval=3)
    for finite in (True, True, False, True, True, True, True):
        scaler.update(finite)
    # 1024 -> halved at the overflow (512) -> doubled after 3 clean steps (1024), 1 clean since
    assert (scaler.scale, scaler.clean_steps, scaler.skipped) == (1024.0, 1, 1)
    restored = LossScaler()
    restored.load_state_dict(scaler.state_dict())
    assert restored.state_dict() == scaler.state_dict()
    with pytest.raises(ValueError, match="0 < backoff_factor < 1"):
        LossScaler(backoff_factor=1.5)


def test_scaled_loss_and_unscaled_gradients():
    scaler = LossScaler(init_scale=256.0)
    w = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    loss = scaler.scaled(lambda out, y: ((out - y) ** 2).sum())(w * 3, torch.zeros(2))
    loss.backward()
    assert loss.item() == 256.0 * 45.0
    assert scaler.unscale_([w]) and torch.equal(w.grad, torch.tensor([18.0, -36.0]))


def _overflow_on_one_rank(rank: int, world: int) -> bool:
    scaler = LossScaler()
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.tensor([1.0, math.inf if rank == 1 else 2.0, 3.0])
    return scaler.unscale_([p])


def test_every_rank_skips_when_one_rank_overflows(tmp_path):
    assert run_ranks(_overflow_on_one_rank, 2, tmp_path=tmp_path) == [False, False]


def test_an_fp16_run_trains_and_reports_its_scale(tmp_path):
    """The suite's test run (2 ranks, random-k + EF) in fp16 autocast with the loss scale: it
    trains, ends finite, and records the scale and the skipped steps."""
    out = tmp_path / "fp16"
    (result, _) = run_ranks(_train_ranks, 2, str(out), None, {"precision": "fp16"}, tmp_path=tmp_path)
    metrics = result["metrics"]
    assert math.isfinite(metrics["train_loss"]) and metrics["test_accuracy"] > 0.25
    assert metrics["loss_scale"] > 0 and metrics["fp16_skipped_steps"] >= 0
    assert json.loads((out / "run.json").read_text())["compute_precision"] == "fp16"
