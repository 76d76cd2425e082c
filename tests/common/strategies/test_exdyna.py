"""ExDyna's partitions, threshold scaling and exclusive selection (common.strategies.selectors and
common.strategies.sparse)."""

from __future__ import annotations

import io
import itertools
import math
import random

import pytest
import torch
from torch import nn

from common.compressors import num_kept
from common.config import RunConfig
from common.methods import check_run
from common.strategies import Partitions, SparseDataParallel, check_sparse_options
from common.strategies.selectors import BLOCK_MULTIPLE, scale_threshold
from tests.distributed import run_ranks


def _covers_once(parts: Partitions) -> None:
    spans = [parts.span(p) for p in range(parts.world)]
    assert spans[0][0] == 0 and spans[-1][1] == parts.numel
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert end == start  # contiguous, disjoint: every entry in exactly one partition
    assert all(parts.blocks_of(p) >= parts.min_blocks for p in range(parts.world))
    assert parts.bounds[-1] == parts.num_blocks
    assert parts.block_size % BLOCK_MULTIPLE == 0 and parts.block_size > 0


@pytest.mark.parametrize(
    ("numel", "world"), [(45_562, 4), (1_356_560, 8), (11_173_962, 2), (4_096, 8), (33_000, 3)]
)
def test_partitions_cover_the_gradient_exactly_once(numel: int, world: int) -> None:
    parts = Partitions(numel, world)
    _covers_once(parts)
    assert parts.num_blocks == min(1024, numel // 32)
    sizes = [parts.blocks_of(p) for p in range(world)]
    assert max(sizes) - min(sizes) <= 1  # the first num_blocks mod W get one extra block


def test_rebalancing_moves_blocks_toward_the_underloaded_and_stays_within_bounds() -> None:
    parts = Partitions(65_536, 4)  # 1,024 blocks of 64
    before = list(parts.bounds)
    assert parts.rebalance([200, 50, 100, 100]) == 1  # partition 0 overloaded, 1 underloaded
    assert parts.bounds[1] == before[1] - 1  # 0 gave its last block to 1
    assert parts.rebalance([100, 100, 50, 200]) == 1
    assert parts.bounds[3] == before[3] + 1  # 3 gave its first block to 2
    assert parts.rebalance([100, 102, 98, 100]) == 0  # within the 5 % tolerance: nothing moves
    rng = random.Random(0)
    for _ in range(5_000):  # adversarial counts: sizes never leave [min_blocks, ...], coverage holds
        parts.rebalance([rng.choice([0, 1, 500]) for _ in range(4)])
        _covers_once(parts)
    assert parts.min_blocks == 1024 // 16


def test_threshold_scaling_converges_to_the_target_density_on_a_stationary_gradient() -> None:
    d, density = 100_000, 0.001
    k = int(density * d)
    threshold = 1 / (2 * math.sqrt(k))  # the code's lambda_0 = 0.05: 5 sigma of N(0, 0.01^2)
    g = torch.Generator().manual_seed(0)
    ratios = []
    for _ in range(2_000):
        selected = int((torch.randn(d, generator=g).abs() * 0.01 >= threshold).sum())
        ratios.append(selected / k)
        threshold = scale_threshold(threshold, selected, k)
    tail = ratios[-500:]
    assert 0.85 <= sum(tail) / len(tail) <= 1.1  # the mean density sits at the target ...
    assert min(tail) >= 0.6 and max(tail) <= 1.5  # ... and stays near it (the code's band is +-10 %)
    assert ratios[0] < 0.01  # it started far off: almost nothing passes 5 sigma


# -- on real gloo ranks ---------------------------------------------------------------------------


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 4))


def _data(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * rank + step)
    return torch.randn(16, 64, generator=g), torch.randint(0, 4, (16,), generator=g)


def _train(rank: int, world: int, options: dict, steps: int, resume_at: int | None = None) -> dict:
    model = _model()
    strategy = SparseDataParallel(options=options, seed=5)
    strategy.setup(model)
    optimizer = torch.optim.SGD(strategy.param_groups(model), lr=0.1, momentum=0.9)
    record = []
    for step in range(steps):
        if step == resume_at:
            buffer = io.BytesIO()
            torch.save(
                {"model": model.state_dict(), "opt": optimizer.state_dict(), "s": strategy.state_dict()},
                buffer,
            )
            buffer.seek(0)
            saved = torch.load(buffer, weights_only=False)
            model = _model()
            strategy = SparseDataParallel(options=options, seed=5)
            strategy.setup(model)
            optimizer = torch.optim.SGD(strategy.param_groups(model), lr=0.1, momentum=0.9)
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["opt"])
            strategy.load_state_dict(saved["s"])
        x, y = _data(rank, step)
        optimizer.zero_grad()
        strategy.forward_backward(model, x, y, nn.functional.cross_entropy)
        residual_before = None if strategy.residual is None else strategy.residual.clone()
        grads = torch.cat([p.grad.reshape(-1).clone() for p in model.parameters()])
        accumulated = grads + (residual_before if residual_before is not None else 0)
        strategy.after_backward(model)
        record.append(
            {
                "selected": strategy.last_selected.clone(),
                "accumulated": accumulated,
                "out": torch.cat([p.grad.reshape(-1).clone() for p in model.parameters()]),
            }
        )
        optimizer.step()
    return {
        "record": record,
        "params": torch.cat([p.detach().reshape(-1) for p in model.parameters()]),
        "metrics": strategy.metrics(),
        "bits": strategy.stats.bits_sent,
    }


def test_exdyna_selections_are_exclusive_and_the_mean_is_exact_on_four_ranks(tmp_path) -> None:
    results = run_ranks(_train, 4, {"selector": "exdyna", "density": 0.01}, 6, tmp_path=tmp_path)
    for step in range(6):
        chosen = [r["record"][step]["selected"] for r in results]
        union = torch.cat(chosen)
        assert union.numel() == torch.unique(union).numel()  # no index chosen by two ranks
        mean_a = sum(r["record"][step]["accumulated"] for r in results) / 4
        expected = torch.zeros_like(mean_a)
        expected[union] = mean_a[union]
        for r in results:
            torch.testing.assert_close(r["record"][step]["out"], expected)
    # a worker's partition moves with the step: over 4 steps each rank scanned every partition
    assert results[0]["metrics"]["buildup_mean"] < 10


def test_topk_builds_up_and_cltk_does_not(tmp_path) -> None:
    topk = run_ranks(_train, 4, {"selector": "topk", "density": 0.01}, 4, tmp_path=tmp_path / "t")[0]
    cltk = run_ranks(_train, 4, {"selector": "cltk", "density": 0.01}, 4, tmp_path=tmp_path / "c")[0]
    k = math.ceil(0.01 * (64 * 32 + 32 + 32 * 4 + 4))  # 23: the compressors' rule (num_kept)
    assert k < topk["metrics"]["union_mean"] <= 4 * k  # the workers disagree: the union grows
    assert cltk["metrics"]["union_mean"] == k and cltk["metrics"]["buildup_mean"] == 1.0


def test_checkpoint_resume_continues_exactly(tmp_path) -> None:
    options = {"selector": "exdyna", "density": 0.01}
    straight = run_ranks(_train, 2, options, 6, tmp_path=tmp_path / "a")
    resumed = run_ranks(_train, 2, options, 6, 3, tmp_path=tmp_path / "b")
    for a, b in zip(straight, resumed, strict=True):
        assert torch.equal(a["params"], b["params"])
        timing = "select_seconds_mean"  # wall time: the only thing that may differ
        assert {k: v for k, v in a["metrics"].items() if k != timing} == {
            k: v for k, v in b["metrics"].items() if k != timing
        }


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"density": 0}, r"density must be a number in \(0, 1\]"),
        ({"density": 1.5}, r"density must be a number in \(0, 1\]"),
        ({"selector": "gtopk"}, "sparse selector must be one of exdyna, topk, dgc, threshold, cltk"),
        ({"tolerance": 0.9}, "sparse tolerance must be a number >= 1"),
        ({"blocks": 0}, "sparse blocks must be an int >= 1"),
        ({"ratio": 0.1}, "unknown sparse option.*ratio"),
        ({"threshold_init": "auto"}, 'sparse threshold_init must be a number > 0, "estimate" or null'),
    ],
)
def test_bad_options_rejected(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_sparse_options(options)


def test_more_workers_than_blocks_rejected() -> None:
    with pytest.raises(ValueError, match="8 workers but the 200-entry gradient has only 6 blocks"):
        Partitions(200, 8)


def test_config_wants_identity_and_no_outer_error_feedback() -> None:
    base = dict(dataset="cifar10", model="vgg_small", strategy="sparse", strategy_options={"density": 0.001})
    check_run(RunConfig(**base))
    with pytest.raises(ValueError, match="set compressor: identity and error_feedback: false"):
        check_run(RunConfig(**base, compressor="topk", compressor_options={"density": 0.001}))
    with pytest.raises(ValueError, match="set compressor: identity and error_feedback: false"):
        check_run(RunConfig(**base, error_feedback=True))


def _official_rebalance(blk_part, blk_pos, temp_ks, k_prev, sz_blk, sz_grad, min_blk):
    """ExDynaReducer.reduce's partition step (kljp/exdyna, gradient_reducers.py), written out."""
    n = len(blk_part)
    k_acc = int(k_prev / n)
    den_acc = k_prev / sz_grad
    for i in range(n - 1):
        det = float(temp_ks[i]) / k_acc
        det2 = float(temp_ks[i + 1]) / k_acc
        if det > 1.05 and det2 < 0.95238:
            if blk_part[i] - 1 < min_blk:
                continue
            blk_part[i] -= 1
            blk_part[i + 1] += 1
            blk_pos[i + 1] -= 1
            k_move = int(1 * sz_blk * den_acc)
            temp_ks[i] -= k_move
            temp_ks[i + 1] += k_move
        if det < 0.95238 and det2 > 1.05:
            if blk_part[i + 1] - 1 < min_blk:
                continue
            blk_part[i] += 1
            blk_part[i + 1] -= 1
            blk_pos[i + 1] += 1
            k_move = int(1 * sz_blk * den_acc)
            temp_ks[i] += k_move
            temp_ks[i + 1] -= k_move


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_rebalancing_equals_the_official_code_step_for_step(world: int) -> None:
    numel = 282_072  # the suite's CIFAR net: blocks of 256 (275 x 1,024 rounded down to 32s)
    parts = Partitions(numel, world)
    blk_part = [parts.blocks_of(p) for p in range(world)]
    blk_pos = parts.bounds[:-1]
    rng = random.Random(world)
    moves = 0
    for step in range(3_000):
        # counts near the mean, with outliers, and some tiny totals (mean truncated to 1 or 2)
        scale = rng.choice([3, 40, 400])
        counts = [max(0, int(rng.gauss(scale, scale * rng.choice([0.02, 0.2, 1.0])))) for _ in range(world)]
        if sum(counts) // world == 0:
            continue  # the code divides by zero there; ours moves nothing (tested below)
        _official_rebalance(
            blk_part, blk_pos, list(counts), sum(counts), parts.block_size, numel, parts.min_blocks
        )
        moves += parts.rebalance(counts)
        assert parts.bounds[:-1] == blk_pos and [parts.blocks_of(p) for p in range(world)] == blk_part, step
    assert moves > 500  # boundaries really moved, both ways, down to min_blocks
    assert Partitions(numel, world).rebalance([1] + [0] * (world - 1)) == 0


def test_threshold_band_edges_are_the_codes_literals() -> None:
    # 0.90905 lies above the code's 0.909 (in band: x 1.00125) but below 1 / 1.1 = 0.90909...
    assert scale_threshold(1.0, 90_905, 100_000) == pytest.approx(1.00125)
    assert scale_threshold(1.0, 90_900, 100_000) == pytest.approx(0.995)  # 0.909 itself: down, as the code
    assert scale_threshold(1.0, 11_001, 10_000) == pytest.approx(1.005)


def test_an_estimated_threshold_far_off_its_target_is_estimated_again() -> None:
    """threshold_init "estimate": a first step whose gradient is 10^4 x the later ones sets a
    threshold the online rule would need ~1,700 steps to bring down; the next step re-estimates it."""
    torch.manual_seed(0)
    model = nn.Linear(1000, 10, bias=False)  # 10,000 entries; k = 100
    strategy = SparseDataParallel(
        options={"selector": "exdyna", "density": 0.01, "threshold_init": "estimate"}
    )
    strategy.setup(model)
    selected = []
    for step in range(4):
        grad = torch.randn(10, 1000) * 1e-3
        if step == 0:
            grad.view(-1)[torch.randperm(10_000)[:100]] = 1e4  # a transient: a few huge entries
        else:
            grad = torch.randn(10, 1000)
        model.weight.grad = grad
        strategy.after_backward(model)
        selected.append(strategy.trace["union"][-1])
    k = strategy.k
    assert k == 100
    assert not k / 16 <= selected[1] <= 16 * k  # step 0's estimate is far off at step 1 ...
    assert strategy.resets == 1  # ... so step 3 estimated it again (and step 4 stayed in the band)
    assert k / 2 <= selected[2] <= 2 * k
    assert strategy.metrics()["threshold_resets"] == 1.0


@pytest.mark.parametrize(
    ("numel", "density", "k"), [(2244, 0.01, 23), (10_000, 0.01, 100), (7, 0.001, 1), (3, 1.0, 3)]
)
def test_the_target_count_rounds_density_as_the_compressors_do(numel: int, density: float, k: int) -> None:
    """k = max(1, ceil(density d)) (common.compressors.base.num_kept), not the paper's floor: one entry
    more where density d is not whole (22.44 -> 23), the same where it is (100.00000000000001 -> 100)."""
    strategy = SparseDataParallel(options={"selector": "topk", "density": density})
    strategy.setup(nn.Linear(numel, 1, bias=False))
    assert strategy.k == k == num_kept(numel, density)
    assert strategy.threshold == 1 / (2 * math.sqrt(k))  # the code's lambda_0, from the same k
