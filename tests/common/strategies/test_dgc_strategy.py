"""DGC's training step (common.strategies.DGCDataParallel) against a hand-written reference."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from common.compressors import build_compressor
from common.methods import checked_config
from common.strategies import DGCDataParallel, check_dgc_options
from tests.distributed import run_ranks

LR, MOMENTUM, WD, DENSITY, STEPS = 0.1, 0.9, 0.01, 0.25, 4


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 3))


def _data(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * rank + step)
    return torch.randn(5, 6, generator=g), torch.randint(0, 3, (5,), generator=g)


def _strategy_run(rank: int, world_size: int, options: dict) -> dict[str, torch.Tensor]:
    model = _model()
    # sample_ratio 1: every tensor sampled whole, so the selection is the exact top-k
    strategy = DGCDataParallel(
        build_compressor("dgc", density=DENSITY, sample_ratio=1.0),
        momentum=MOMENTUM,
        weight_decay=WD,
        options=options,
    )
    strategy.setup(model)
    optimizer = torch.optim.SGD(strategy.param_groups(model), lr=LR, momentum=MOMENTUM, weight_decay=WD)
    for step in range(STEPS):
        strategy.set_epoch(step)
        x, y = _data(rank, step)
        optimizer.zero_grad()
        strategy.forward_backward(model, x, y, nn.functional.cross_entropy)
        strategy.after_backward(model)
        optimizer.step()
    return {
        **{n: p.detach().clone() for n, p in model.named_parameters()},
        "_density_sent": torch.tensor(strategy.metrics()["density_sent"]),
        "_after_warmup": torch.tensor(strategy.metrics()["density_sent_after_warmup"]),
        "_compression_after": torch.tensor(strategy.metrics()["compression_after_warmup"]),
        "_steps": torch.tensor(strategy.stats.steps),
    }


def _reference(world_size: int, warmup: list[float] | None) -> dict[str, torch.Tensor]:
    """The paper's update written out: per rank u = m u + g, v += u, send top-k of v, zero u and v
    there; w -= lr (mean of the sent + m_wd) with m_wd = m m_wd + wd w for matrices; biases are
    averaged densely and get SGD's momentum and weight decay."""
    models = [_model() for _ in range(world_size)]
    names = [n for n, _ in models[0].named_parameters()]
    u = [{n: torch.zeros_like(p) for n, p in models[0].named_parameters()} for _ in range(world_size)]
    v = [{n: torch.zeros_like(p) for n, p in models[0].named_parameters()} for _ in range(world_size)]
    m_wd = {n: torch.zeros_like(p) for n, p in models[0].named_parameters()}
    m_dense = {n: torch.zeros_like(p) for n, p in models[0].named_parameters()}
    params = {n: p.detach().clone() for n, p in models[0].named_parameters()}
    for step in range(STEPS):
        density = warmup[step] if warmup is not None and step < len(warmup) else DENSITY
        grads = []
        for rank, model in enumerate(models):
            with torch.no_grad():
                for n, p in model.named_parameters():
                    p.copy_(params[n])
            model.zero_grad()
            x, y = _data(rank, step)
            nn.functional.cross_entropy(model(x), y).backward()
            grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        for n in names:
            if params[n].dim() >= 2:
                total = torch.zeros_like(params[n])
                for r in range(world_size):
                    u[r][n] = MOMENTUM * u[r][n] + grads[r][n]
                    v[r][n] = v[r][n] + u[r][n]
                    flat = v[r][n].reshape(-1)
                    k = math.ceil(density * flat.numel())
                    idx = torch.topk(flat.abs(), k).indices
                    sent = torch.zeros_like(flat)
                    sent[idx] = flat[idx]
                    total += sent.view_as(total)
                    v[r][n].view(-1)[idx] = 0
                    u[r][n].view(-1)[idx] = 0
                m_wd[n] = MOMENTUM * m_wd[n] + WD * params[n]
                params[n] = params[n] - LR * (total / world_size + m_wd[n])
            else:
                d = sum(grads[r][n] for r in range(world_size)) / world_size + WD * params[n]
                m_dense[n] = MOMENTUM * m_dense[n] + d if step else d
                params[n] = params[n] - LR * m_dense[n]
    return params


@pytest.mark.parametrize("warmup", [None, [0.5, 0.5]])
def test_two_ranks_follow_the_papers_update(tmp_path, warmup):
    results = run_ranks(_strategy_run, 2, {"warmup": warmup}, tmp_path=tmp_path)
    expected = _reference(2, warmup)
    for rank_result in results:
        for name, value in expected.items():
            torch.testing.assert_close(rank_result[name], value, rtol=1e-5, atol=1e-6)
        assert int(rank_result["_steps"]) == STEPS  # two syncs, each step counted once
    # matrices of 24 and 12 entries: ceil(0.25 n) sent; the warm-up's 0.5 for two steps
    per_step = [(12 + 6) if warmup is not None and s < 2 else (6 + 3) for s in range(STEPS)]
    assert float(results[0]["_density_sent"]) == pytest.approx(sum(per_step) / (36 * STEPS))
    assert float(results[0]["_after_warmup"]) == pytest.approx(9 / 36)  # the final 0.25 only
    assert float(results[0]["_compression_after"]) > 1


def test_warmup_spread_over_a_fraction_of_an_epoch():
    strategy = DGCDataParallel(
        build_compressor("dgc", density=0.001),
        momentum=0.9,
        weight_decay=0.0,
        options={"warmup": [0.25, 0.0625], "warmup_epochs": 0.5},
    )
    densities = []
    for progress in (0.0, 0.24, 0.25, 0.49, 0.5, 3.0):
        strategy.set_epoch(progress)
        densities.append(strategy.compressor.inner.density)
    assert densities == [0.25, 0.25, 0.0625, 0.0625, 0.001, 0.001]


def test_without_momentum_correction_the_optimizer_keeps_one_group():
    model = _model()
    plain = DGCDataParallel(
        build_compressor("dgc", density=0.5),
        momentum=0.9,
        weight_decay=0.0,
        options={"momentum_correction": False},
    )
    assert len(plain.param_groups(model)) == 1
    assert plain.memory.momentum == 0.0  # u = g: plain error feedback (Gradient Dropping)
    corrected = DGCDataParallel(build_compressor("dgc", density=0.5), momentum=0.9, weight_decay=0.0)
    groups = corrected.param_groups(model)
    assert [len(g["params"]) for g in groups] == [2, 2]
    assert groups[0]["momentum"] == 0.0 and groups[0]["weight_decay"] == 0.0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"warm_up": [0.25]}, "unknown dgc option.*warm_up; allowed: momentum_correction"),
        ({"warmup": [0.25, 2.0]}, "2.0"),
        ({"warmup": 0.25}, "dgc warmup must be a list of densities or null, got 0.25"),
        ({"min_dim": 0}, "dgc min_dim must be an int >= 1, got 0"),
        ({"warmup_epochs": 0}, "dgc warmup_epochs must be a number > 0 or null, got 0"),
        ({"clip_norm": -1}, "dgc clip_norm must be a number > 0 or null, got -1"),
        ({"masking": "yes"}, "dgc masking must be true or false, got 'yes'"),  # the declared type
        ({"nesterov": 1}, "dgc nesterov must be true or false, got 1"),
    ],
)
def test_bad_dgc_options_are_rejected(options, message):
    with pytest.raises(ValueError, match=message):
        check_dgc_options(options)


def test_config_rejects_dgc_with_other_optimizers_and_dense_compressors():
    with pytest.raises(ValueError, match="optimizer must be sgd, got 'adamw'"):
        checked_config({"strategy": "dgc", "compressor": "dgc", "optimizer": "adamw"})
    with pytest.raises(ValueError, match="unknown strategy 'ddp'; valid: data_parallel, dgc"):
        checked_config({"strategy": "ddp"})
    with pytest.raises(ValueError, match="takes no strategy_options"):
        checked_config({"strategy_options": {"warmup": [0.25]}})
    with pytest.raises(ValueError, match="needs a sparsifier"):
        DGCDataParallel(build_compressor("fp16"), momentum=0.9, weight_decay=0.0)


def test_the_warm_up_sets_the_density_of_any_sparsifier():
    topk = build_compressor("topk", density=0.01)
    dgc = DGCDataParallel(topk, momentum=0.9, weight_decay=0.0, options={"warmup": [0.25, 0.0625]})
    dgc.set_epoch(0.5)
    assert topk.density == 0.25
    dgc.set_epoch(1.5)
    assert topk.density == 0.0625
    dgc.set_epoch(2.0)
    assert topk.density == 0.01  # past the warm-up: the compressor's own
    with pytest.raises(ValueError, match="compressor 'fp16' sends every entry: it has no density to set"):
        build_compressor("fp16").set_density(0.5)
