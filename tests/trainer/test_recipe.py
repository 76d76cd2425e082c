"""The recipe settings the loop applies to every method alike: the linear (one-cycle) schedule,
label smoothing, evaluations per run, local gradient clipping, bf16 autocast and channels_last."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch
from torch import nn

from common.comm.sync import GradientSync
from common.compressors import build_compressor
from common.config import RunConfig
from tests.distributed import run_ranks
from trainer import autocast
from trainer.checks import checked_config
from trainer.components import cross_entropy_loss, lr_schedule


def test_linear_schedule_warms_up_then_falls_to_the_end_factor():
    config = RunConfig(lr_schedule="linear", lr_warmup_steps=10, lr_end_factor=0.07)
    factor = lr_schedule(config, total_steps=110, steps_per_epoch=11)
    assert factor(0) == pytest.approx(0.1) and factor(9) == pytest.approx(1.0)
    assert factor(10) == pytest.approx(1.0)
    assert factor(60) == pytest.approx(1 - 0.93 * 0.5)
    assert factor(110) == pytest.approx(0.07)
    values = [factor(s) for s in range(10, 111)]
    assert all(a >= b for a, b in itertools.pairwise(values))  # monotone after the warm-up


def test_step_schedule_decays_at_the_milestone_epochs():
    config = checked_config({"lr_schedule": "step", "lr_milestones": [2, 3], "lr_decay": 0.5, "epochs": 4})
    assert config.lr_milestones == (2, 3)  # YAML's list, stored hashable
    factor = lr_schedule(config, total_steps=40, steps_per_epoch=10)
    assert [factor(s) for s in (0, 19, 20, 29, 30, 39)] == [1.0, 1.0, 0.5, 0.5, 0.25, 0.25]
    halves = lr_schedule(checked_config({"lr_schedule": "step"}), total_steps=40, steps_per_epoch=10)
    assert [halves(s) for s in (19, 20, 29, 30)] == [1.0, 0.1, 0.1, pytest.approx(0.01)]


def test_label_smoothing_changes_the_training_loss_only_as_torch_defines_it():
    logits, y = torch.randn(8, 10), torch.randint(0, 10, (8,))
    smoothed = cross_entropy_loss("image", 0.2)(logits, y)
    assert smoothed == pytest.approx(float(nn.functional.cross_entropy(logits, y, label_smoothing=0.2)))
    assert cross_entropy_loss("image")(logits, y) == pytest.approx(
        float(nn.functional.cross_entropy(logits, y))
    )
    text_logits, text_y = torch.randn(2, 5, 7), torch.randint(0, 7, (2, 5))
    flat = nn.functional.cross_entropy(text_logits.flatten(0, 1), text_y.flatten(), label_smoothing=0.1)
    assert cross_entropy_loss("text", 0.1)(text_logits, text_y) == pytest.approx(float(flat))


def test_bf16_autocast_keeps_weights_and_gradients_fp32(monkeypatch):
    import trainer.precision

    monkeypatch.setattr(trainer.precision, "cpu_has_bf16", lambda: True)  # as on a CPU with bf16 units
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 10))
    config = RunConfig(precision="bf16")
    with autocast(config, torch.device("cpu")):
        out = model(torch.randn(2, 3, 8, 8))
    assert out.dtype == torch.bfloat16
    nn.functional.cross_entropy(out.float(), torch.tensor([1, 2])).backward()
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in model.parameters())
    with autocast(RunConfig(), torch.device("cpu")):
        assert model(torch.randn(2, 3, 8, 8)).dtype == torch.float32


def test_a_bf16_recipe_computes_in_fp32_on_a_cpu_without_bf16_units(monkeypatch):
    """oneDNN emulates bf16 there (10x slower than fp32 for the suite's net, measured) and has no bf16
    LSTM: the run computes in fp32 and says so (``compute_precision``)."""
    import trainer.precision
    from trainer import compute_precision

    cpu, config = torch.device("cpu"), RunConfig(precision="bf16")
    monkeypatch.setattr(trainer.precision, "cpu_has_bf16", lambda: False)
    assert compute_precision(config, cpu) == "fp32"
    with autocast(config, cpu):
        assert nn.Linear(4, 2)(torch.randn(3, 4)).dtype == torch.float32
    monkeypatch.setattr(trainer.precision, "cpu_has_bf16", lambda: True)
    assert compute_precision(config, cpu) == "bf16"
    assert compute_precision(RunConfig(), cpu) == "fp32"  # an fp32 recipe everywhere
    assert compute_precision(config, torch.device("cuda")) == "bf16"  # GPUs: bf16 units assumed


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("identity", {}),
        ("fp16", {}),
        ("topk", {"density": 0.1}),
        ("randomk", {"density": 0.1}),
        ("random_block", {"density": 0.1}),
        ("qsgd", {"bits": 4}),
        ("terngrad", {}),
        ("dgc", {"density": 0.1}),
    ],
)
def test_channels_last_gradients_sync_like_contiguous_ones(name, options):
    """A channels_last conv's gradient is strided NHWC; every compressor must see it in logical
    order, as the contiguous gradient (same values, same payload, same result)."""
    torch.manual_seed(0)
    grad = torch.randn(8, 4, 3, 3)
    results = []
    for layout in (torch.contiguous_format, torch.channels_last):
        tensor = grad.clone().contiguous(memory_format=layout)
        sync = GradientSync(build_compressor(name, **options), error_feedback=True, seed=3)
        sync.sync([("conv.weight", tensor)])
        results.append(tensor.contiguous())
    assert torch.equal(results[0], results[1])


def test_num_evaluations_spreads_the_evaluations_and_is_not_in_the_fingerprint():
    base = RunConfig()
    assert dataclasses.replace(base, num_evaluations=10, num_logs=40).fingerprint() == base.fingerprint()
    assert -(-435 // 10) == 44  # the loop's spacing: evaluations at 44, 88, ..., 396 and the last step 435
    with pytest.raises(ValueError, match="num_evaluations must be a positive integer or null, got 0"):
        checked_config({"num_evaluations": 0})


def _clipped_sync(rank: int, world: int) -> float:
    torch.manual_seed(rank)
    model = nn.Linear(16, 16)
    model(torch.randn(4, 16) * (10 * (rank + 1))).pow(2).sum().backward()
    torch.nn.utils.clip_grad_norm_(list(model.parameters()), 0.25)  # what the loop does per rank
    GradientSync(build_compressor("identity")).sync_gradients(model)
    return math.sqrt(sum(float(p.grad.pow(2).sum()) for p in model.parameters()))


def test_local_clipping_bounds_the_averaged_gradient(tmp_path):
    """Each rank clips its own gradient to grad_clip_norm before anything is sent: the mean of W
    clipped gradients has norm <= grad_clip_norm (the triangle inequality), the same on every rank."""
    norms = run_ranks(_clipped_sync, 2, tmp_path=tmp_path)
    assert all(n <= 0.25 + 1e-6 for n in norms) and norms[0] == pytest.approx(norms[1])
