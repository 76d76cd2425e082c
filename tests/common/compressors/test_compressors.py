"""The invariants every registered compressor must satisfy, plus per-method properties."""

from __future__ import annotations

import math

import pytest
import torch

from common.comm import GradientSync
from common.compressors import COMPRESSORS, CompressorRNG, TopK, build_compressor
from common.compressors import topk as topk_module
from tests.distributed import run_ranks

SIZES = [1, 7, 1023, 4097]

# One configuration per registered name (several for compressors with variants).
CONFIGS = {
    "identity": [{}],
    "fp16": [{}],
    "bf16": [{}],
    "topk": [{"density": 0.01}, {"density": 0.5}],
    "randomk": [
        {"density": 0.1},
        {"density": 0.1, "scaled": False},
        {"density": 0.1, "shared_indices": False},
    ],
    "random_block": [{"density": 1 / 16}, {"density": 0.5, "scaled": True}],
    "terngrad": [{}, {"clip": None}],
    "dgc": [
        {"density": 0.01},
        {"density": 0.5},
        {"density": 0.01, "strided_sample": False, "truncation": "position"},
    ],
    "qsgd": [
        {},
        {"bits": 2, "norm": "max"},
        {"bits": 8, "encoding": "elias"},
        {"bits": 2, "bucket_size": 100, "encoding": "elias"},
    ],
    "signsgd": [{}, {"scaled": False, "vote": "majority"}],
    "powersgd": [{}, {"rank": 4, "warm_start": False}],
}
CASES = [(name, opts) for name, options in CONFIGS.items() for opts in options]


def test_every_registered_compressor_is_covered():
    assert set(CONFIGS) == set(COMPRESSORS)


def _ids(case):
    name, opts = case
    return name + "".join(f"-{k}={v}" for k, v in opts.items())


@pytest.mark.parametrize("case", CASES, ids=_ids)
@pytest.mark.parametrize("numel", SIZES)
@pytest.mark.parametrize("shape_kind", ["flat", "2d"])
def test_round_trip_shape_dtype_and_bits(case, numel, shape_kind):
    name, opts = case
    comp = build_compressor(name, **opts)
    shape = (numel,) if shape_kind == "flat" or numel == 1 else (numel, 1) if numel % 3 else (3, numel // 3)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(numel))
    payload = comp.compress(x, CompressorRNG(seed=1, rank=0))
    out = comp.decompress(payload)
    assert out.shape == x.shape and out.dtype == x.dtype
    wire_bytes = sum(t.numel() * t.element_size() for t in payload.wire.values())
    assert payload.num_bits == 8 * wire_bytes
    assert all(t.dim() == 1 for t in payload.wire.values())
    # nothing on the wire may be larger than the dense fp32 tensor plus int32 indices of every entry
    assert payload.num_bits <= 64 * numel


def _bf16_ranks(rank: int, world: int) -> dict:
    results = {}
    for name, opts in CASES:
        biased = not build_compressor(name, **opts).unbiased
        sync = GradientSync(build_compressor(name, **opts), error_feedback=biased)
        grads = [torch.randn(64, 33, generator=torch.Generator().manual_seed(rank)).to(torch.bfloat16),
                 torch.randn(4097, generator=torch.Generator().manual_seed(10 + rank)).to(torch.bfloat16)]  # fmt: skip
        exact = [g.float() for g in grads]
        for g in exact:
            torch.distributed.all_reduce(g)
        sync.sync([("w", grads[0]), ("b", grads[1])])
        results[_ids((name, opts))] = {
            "sent": sync.stats.bits_sent,
            "finite": all(bool(torch.isfinite(g.float()).all()) for g in grads),
            "error": max(
                float((g.float() - e / world).norm() / (e / world).norm())
                for g, e in zip(grads, exact, strict=True)
            ),
        }
    return results


def test_every_compressor_syncs_bf16_gradients(tmp_path):
    """A bf16 run's gradients (what bf16 parameters on a GPU give) through GradientSync on 2 ranks,
    every registered compressor: something is sent, the synced gradients are finite, and the
    lossless routes (identity, the fp16 / bf16 casts) give their mean to bf16 precision."""
    for results in run_ranks(_bf16_ranks, 2, tmp_path=tmp_path):
        assert len(results) == len(CASES)
        for case, r in results.items():
            assert r["sent"] > 0 and r["finite"], case
            if case.split("-")[0] in ("identity", "fp16", "bf16"):
                assert r["error"] < 1e-2, (case, r["error"])


@pytest.mark.parametrize("case", CASES, ids=_ids)
@pytest.mark.parametrize("numel", [7, 4097])
def test_decompress_into_a_dirty_buffer_equals_decompress(case, numel):
    name, opts = case
    comp = build_compressor(name, **opts)
    x = torch.randn(numel, generator=torch.Generator().manual_seed(numel))
    payload = comp.compress(x, CompressorRNG(seed=1, rank=0))
    expected = comp.decompress(payload).clone()
    out = torch.full((numel,), float("nan"))  # whatever it held must not leak through
    assert comp.decompress_into(payload, out) is out
    assert torch.equal(out, expected.reshape(-1))


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_aggregate_into_a_dirty_buffer_equals_aggregate(case):
    """Three ranks' payloads summed into a reused buffer (GradientSync's all-gather route):
    the same sum as ``aggregate``, in the payloads' dtype or cast to another ``out`` dtype."""
    name, opts = case
    comp = build_compressor(name, **opts)
    payloads = [
        comp.compress(torch.randn(4097, generator=torch.Generator().manual_seed(r)), CompressorRNG(1, r))
        for r in range(3)
    ]
    expected = comp.aggregate(payloads).reshape(-1).clone()
    for dtype in (torch.float32, torch.float64):
        out = torch.full((4097,), float("nan"), dtype=dtype)
        assert comp.aggregate_into(payloads, out) is out
        assert torch.equal(out, expected.to(dtype))


@pytest.mark.parametrize("name", ["qsgd", "terngrad"])
def test_decoders_into_out_take_the_default_route_where_they_cannot_write_it(name):
    """QSGD and TernGrad decode straight into an fp32 ``out``; an ``out`` holding the wire (here the
    codes kept in its own bytes), an fp16 payload or a non-contiguous ``out`` go the default way
    (decode, then copy): the same values as ``decompress`` on every route. (20,000 entries: the C
    decoders stage 8,192 codes at a time, so a straight write would overwrite codes not yet read.)"""
    comp = build_compressor(name)
    x = torch.randn(20, 1000, generator=torch.Generator().manual_seed(0))
    payload = comp.compress(x, CompressorRNG(seed=1, rank=0))
    expected = comp.decompress(payload).reshape(-1).clone()
    out = torch.full((20000,), float("nan"))
    codes = payload.wire["codes"]
    held = out.view(torch.uint8)[: codes.numel()]
    held.copy_(codes)
    aliased = payload.with_wire({**payload.wire, "codes": held})
    assert torch.equal(comp.decompress_into(aliased, out), expected)
    out = torch.full((20000, 2), float("nan"))[:, 0]
    assert torch.equal(comp.decompress_into(payload, out), expected)
    half = comp.compress(x.half(), CompressorRNG(seed=1, rank=0))
    out = torch.full((20, 1000), float("nan"))
    assert torch.equal(comp.decompress_into(half, out), comp.decompress(half).float())
    assert torch.equal(comp.aggregate_into([half, half], out), comp.aggregate([half, half]).float())


def test_decompress_into_a_buffer_of_the_wrong_size_is_rejected():
    comp = build_compressor("random_block", density=0.25)
    payload = comp.compress(torch.randn(3, 4), CompressorRNG(seed=1, rank=0))
    with pytest.raises(ValueError, match=r"out has 11 entries, the payload's tensor 12 \(shape \(3, 4\)\)"):
        comp.decompress_into(payload, torch.empty(11))


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_global_rng_untouched_and_same_seed_same_payload(case):
    name, opts = case
    comp = build_compressor(name, **opts)
    x = torch.randn(4097, generator=torch.Generator().manual_seed(0))
    before = torch.random.get_rng_state()
    p1 = comp.compress(x, CompressorRNG(seed=3, rank=1))
    p2 = comp.compress(x, CompressorRNG(seed=3, rank=1))
    assert torch.equal(torch.random.get_rng_state(), before)
    assert p1.wire.keys() == p2.wire.keys()
    for key in p1.wire:
        assert torch.equal(p1.wire[key], p2.wire[key])
    assert torch.equal(comp.decompress(p1), comp.decompress(p2))


def test_bits_on_wire_per_method():
    x = torch.randn(1000)
    rng = CompressorRNG(0, 0)
    assert build_compressor("identity").compress(x, rng).num_bits == 32 * 1000
    assert build_compressor("fp16").compress(x, rng).num_bits == 16 * 1000
    assert build_compressor("bf16").compress(x, rng).num_bits == 16 * 1000
    assert build_compressor("topk", density=0.01).compress(x, rng).num_bits == 10 * (32 + 32)
    assert build_compressor("randomk", density=0.01).compress(x, rng).num_bits == 10 * 32  # indices shared
    assert (
        build_compressor("randomk", density=0.01, shared_indices=False).compress(x, rng).num_bits == 10 * 64
    )


@pytest.mark.parametrize("numel", SIZES)
@pytest.mark.parametrize("density", [0.001, 0.01, 0.3, 1.0])
def test_topk_keeps_the_largest_magnitudes(numel, density):
    x = torch.randn(numel, generator=torch.Generator().manual_seed(numel))
    out = TopK(density).decompress(TopK(density).compress(x, CompressorRNG(0, 0)))
    k = max(1, math.ceil(density * numel - 1e-9))
    kept = out != 0
    assert int(kept.sum()) == k
    assert torch.equal(out[kept], x[kept])  # kept entries are exact
    if k < numel:
        assert x[kept].abs().min() >= x[~kept].abs().max()


def _sampled_cases():
    g = torch.Generator().manual_seed(7)
    gaussian = torch.randn(10**6, generator=g)
    rows = torch.randn(1000, 1000, generator=g) * torch.logspace(-3, 0, 1000)  # one scale per column
    ties = torch.randn(300_000, generator=g).to(torch.bfloat16).float()  # bf16 grads: many equal
    sparse = torch.zeros(200_000)
    sparse[torch.randperm(200_000, generator=g)[:500]] = torch.randn(500, generator=g)  # fewer than k
    fooled = torch.rand(10**6, generator=g)  # huge values exactly where the sample looks
    n, k = fooled.numel(), 20_000
    num_samples = math.ceil(topk_module.SAMPLED_TOP * n / (topk_module.CANDIDATE_FACTOR * k))
    fooled[torch.arange(num_samples).mul_(topk_module._STRIDE_PRIME).remainder_(n)] += 100.0
    return {
        "gaussian": (gaussian, [0.001, 0.01, 0.1]),
        "columns": (rows.reshape(-1), [0.001, 0.01]),
        "bf16_ties": (ties, [0.001, 0.01]),
        "mostly_zero": (sparse, [0.01]),
        "sample_fooled": (fooled, [k / n]),
    }


@pytest.mark.parametrize("case", ["gaussian", "columns", "bf16_ties", "mostly_zero", "sample_fooled"])
def test_the_sampled_topk_keeps_exactly_the_largest_magnitudes(case):
    """Past SAMPLED_MIN_NUMEL top-k selects among the entries above a sampled threshold: the kept
    magnitudes must be a full torch.topk's, whatever the tensor (ties, zeros, an adversarial sample)."""
    x, densities = _sampled_cases()[case]
    for density in densities:
        k = max(1, math.ceil(density * x.numel() - 1e-9))
        indices = topk_module.topk_indices(x.abs(), k)
        assert indices.numel() == k and indices.unique().numel() == k
        expected = torch.topk(x.abs(), k).values
        assert torch.equal(x.abs()[indices].sort(descending=True).values, expected), (case, density)
        if case == "gaussian":  # no ties: the very same positions
            assert torch.equal(indices.sort().values, torch.topk(x.abs(), k).indices.sort().values)


def test_randomk_scaled_is_unbiased_in_expectation():
    x = torch.randn(64, generator=torch.Generator().manual_seed(0))
    comp = build_compressor("randomk", density=0.25)
    rng = CompressorRNG(seed=0, rank=0)
    draws = 4000
    mean = sum(comp.decompress(comp.compress(x, rng)) for _ in range(draws)) / draws
    # per entry: value (n/k) x with prob k/n, else 0 -> variance x^2 (n/k - 1)
    sigma = x.abs() * math.sqrt(64 / 16 - 1) / math.sqrt(draws)
    assert torch.all((mean - x).abs() <= 4 * sigma + 1e-6)


def test_randomk_unscaled_keeps_exact_values_and_is_biased_flagged():
    x = torch.randn(100)
    comp = build_compressor("randomk", density=0.1, scaled=False)
    out = comp.decompress(comp.compress(x, CompressorRNG(0, 0)))
    kept = out != 0
    assert int(kept.sum()) == 10 and torch.equal(out[kept], x[kept])
    assert comp.unbiased is False and build_compressor("randomk", density=0.1).unbiased is True


def test_randomk_shared_indices_agree_across_ranks_local_ones_do_not():
    x = torch.randn(1000)
    shared = build_compressor("randomk", density=0.05)
    a = shared.compress(x, CompressorRNG(seed=5, rank=0)).local["indices"]
    b = shared.compress(x, CompressorRNG(seed=5, rank=3)).local["indices"]
    assert torch.equal(a, b) and shared.linear
    local = build_compressor("randomk", density=0.05, shared_indices=False)
    c = local.compress(x, CompressorRNG(seed=5, rank=0)).wire["indices"]
    d = local.compress(x, CompressorRNG(seed=5, rank=3)).wire["indices"]
    assert not torch.equal(c, d) and not local.linear


def test_linear_compressors_sum_payloads():
    """For a linear compressor, decompress(sum of wire tensors) == sum of decompressions."""
    xs = [torch.randn(513, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    # fp16 sums in fp16 (as the all-reduce does): equal up to fp16 rounding of the sum
    for name, opts, atol in [("identity", {}, 1e-6), ("fp16", {}, 8e-3), ("randomk", {"density": 0.1}, 1e-6)]:
        comp = build_compressor(name, **opts)
        payloads = [comp.compress(x, CompressorRNG(seed=9, rank=r)) for r, x in enumerate(xs)]
        summed = payloads[0].with_wire({k: sum(p.wire[k] for p in payloads) for k in payloads[0].wire})
        expected = sum(comp.decompress(p) for p in payloads)
        torch.testing.assert_close(comp.decompress(summed), expected, rtol=0, atol=atol)


@pytest.mark.parametrize("density", [0, -0.1, 1.5, float("nan"), "0.1", True])
def test_density_outside_unit_interval_is_rejected(density):
    with pytest.raises(ValueError, match=r"density must be a number in \(0, 1\]"):
        TopK(density)  # the constructor's own check, for a direct construction
    typed = isinstance(density, float | int) and not isinstance(density, bool)
    message = (
        r"density must be a number in \(0, 1\]"
        if typed
        else r"compressor 'topk' option density must be a number, got"
    )
    with pytest.raises(ValueError, match=message):
        build_compressor("topk", density=density)


def test_a_missing_required_option_is_named():
    with pytest.raises(ValueError, match="compressor 'topk' needs option\\(s\\) density"):
        build_compressor("topk")
