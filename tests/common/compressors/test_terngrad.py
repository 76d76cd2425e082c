"""TernGrad compressor: unbiasedness, wire size, clipping, shared scalers, determinism, options."""

from __future__ import annotations

import math

import pytest
import torch

from common.compressors import CompressorRNG
from common.compressors.terngrad import TernGrad


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_unbiased_without_clipping():
    x = _randn(64)
    draws = 4000
    comp = TernGrad(clip=None)
    assert comp.unbiased and not TernGrad().unbiased
    # one compress of 4000 repeats = 4000 independent draws (the scaler max|x| is the same)
    out = comp.decompress(comp.compress(x.repeat(draws), CompressorRNG(seed=0, rank=0)))
    mean = out.view(draws, 64).mean(0)
    s = x.abs().max()
    # s * t is s * sign(x) w.p. |x|/s, else 0: variance s|x| - x^2
    std_err = ((s * x.abs() - x**2).clamp(min=0) / draws).sqrt()
    assert torch.all((mean - x).abs() <= 5 * std_err + 1e-6)


@pytest.mark.parametrize("numel", [1, 3, 4, 5, 1000])
def test_values_are_ternary_and_bits_on_wire(numel):
    x = _randn(numel, seed=numel)
    comp = TernGrad()
    payload = comp.compress(x, CompressorRNG(seed=1, rank=0))
    assert payload.num_bits == 8 * math.ceil(numel / 4) + 32
    assert payload.wire["codes"].dtype == torch.uint8 and payload.wire["codes"].dim() == 1
    assert payload.wire["scaler"].dtype == torch.float32 and payload.wire["scaler"].shape == (1,)
    s = float(payload.wire["scaler"])
    assert s == pytest.approx(float(comp.scaler(x)))
    out = comp.decompress(payload)
    assert out.shape == x.shape and out.dtype == x.dtype
    assert set(out.unique().tolist()) <= {-s, 0.0, s}
    codes = comp.codes(payload)
    assert codes.dtype == torch.int8 and codes.shape == (numel,)
    assert torch.equal(codes.float() * s, out)
    # a nonzero code keeps the sign of x
    assert torch.all(codes.float() * x >= 0)


def test_shape_and_dtype_round_trip():
    x = _randn(6, 7).to(torch.float16)
    comp = TernGrad()
    payload = comp.compress(x, CompressorRNG(seed=1, rank=0))
    out = comp.decompress(payload)
    assert out.shape == (6, 7) and out.dtype == torch.float16
    assert payload.local == {"numel": 42}


@pytest.mark.parametrize("clip_at", ["shared", "own"])
def test_clipping_at_c_sigma(clip_at):
    x = _randn(1000, seed=3)
    sigma0 = float(x.std(unbiased=False))
    x[17] = 100 * sigma0
    # population std by hand, with the outlier in
    mean = sum(x.tolist()) / 1000
    sigma = math.sqrt(sum((v - mean) ** 2 for v in x.tolist()) / 1000)
    comp = TernGrad(clip=2.5, clip_at=clip_at)
    assert float(comp.scaler(x)) == pytest.approx(2.5 * sigma, rel=1e-5)
    # "own" clamps before ternarizing; "shared" (the code's) lets the scaler saturate the outlier
    clipped = float(comp.clip_tensor(x).abs().max())
    assert clipped == pytest.approx(2.5 * sigma if clip_at == "own" else 100 * sigma0, rel=1e-5)
    out = comp.decompress(comp.compress(x, CompressorRNG(seed=0, rank=0)))
    assert float(out.abs().max()) <= 2.5 * sigma * (1 + 1e-5)
    assert float(out[17]) == pytest.approx(2.5 * sigma, rel=1e-5)  # |g| = s: kept with probability 1
    # no clipping: the scaler is the max
    assert float(TernGrad(clip=None).scaler(x)) == float(x.abs().max())
    # a single element (std 0) is not clipped
    assert float(TernGrad(clip_at=clip_at).scaler(torch.tensor([-3.0]))) == 3.0


def test_shared_rule_clips_every_worker_at_the_shared_bound_and_own_at_its_own():
    # worker 0 has a small sigma and one outlier; worker 1's sigma is 10x larger
    small, large = _randn(1000, seed=5) * 0.1, _randn(1000, seed=6)
    small[0] = 0.5  # 5 of its own sigma, under the other worker's 2.5 sigma
    for clip_at in ("shared", "own"):
        comp = TernGrad(clip=2.5, clip_at=clip_at)
        shared = torch.stack([comp.scaler(small), comp.scaler(large)]).max()
        draws = torch.stack(
            [
                comp.decompress(comp.compress(small, CompressorRNG(seed=s, rank=0), scaler=shared))
                for s in range(400)
            ]
        )
        mean_outlier = float(draws[:, 0].mean())
        if clip_at == "shared":  # 0.5 < the shared 2.5 sigma_1: unclipped, unbiased
            assert mean_outlier == pytest.approx(0.5, rel=0.15)
        else:  # clamped at worker 0's own 2.5 sigma_0 ~ 0.25
            assert mean_outlier == pytest.approx(float(2.5 * small.std(unbiased=False)), rel=0.15)


def test_unknown_clip_rule_is_named():
    with pytest.raises(ValueError, match="unknown clip_at 'max'; valid: shared"):
        TernGrad(clip_at="max")


def test_shared_scaler_decode_sum_equals_sum_of_decodes():
    comp = TernGrad()
    xs = [_randn(513, seed=i) * (i + 1) for i in range(3)]
    shared = torch.stack([comp.scaler(x) for x in xs]).max()
    payloads = [comp.compress(x, CompressorRNG(seed=9, rank=r), scaler=shared) for r, x in enumerate(xs)]
    assert all(float(p.wire["scaler"]) == float(shared) for p in payloads)
    code_sum = sum(comp.codes(p).to(torch.int32) for p in payloads)
    decoded = comp.decode_sum(code_sum, shared, (513,), torch.float32)
    expected = sum(comp.decompress(p) for p in payloads)
    assert torch.allclose(decoded, expected, rtol=1e-6, atol=0)
    assert torch.allclose(comp.aggregate(payloads), expected, rtol=1e-6, atol=0)
    # int8 sum, 2-D shape, float scaler
    code_sum8 = sum(comp.codes(p) for p in payloads)
    assert code_sum8.dtype == torch.int8
    decoded2 = comp.decode_sum(code_sum8, float(shared), (27, 19), torch.float32)
    assert torch.allclose(decoded2, expected.reshape(27, 19), rtol=1e-6, atol=0)


def test_aggregate_with_different_scalers_is_sum_of_decompress():
    comp = TernGrad()
    payloads = [comp.compress(_randn(100, seed=i) * (i + 1), CompressorRNG(seed=2, rank=i)) for i in range(3)]
    expected = sum(comp.decompress(p) for p in payloads)
    assert torch.allclose(comp.aggregate(payloads), expected, rtol=1e-6, atol=1e-7)


def test_scaler_below_max_is_rejected():
    comp = TernGrad(clip=None)
    x = _randn(100)
    m = float(x.abs().max())
    with pytest.raises(ValueError, match="scaler must be >= this rank's own scaler"):
        comp.compress(x, CompressorRNG(0, 0), scaler=0.5 * m)
    with pytest.raises(ValueError, match="scaler must be >= this rank's own scaler"):
        comp.compress(x, CompressorRNG(0, 0), scaler=float("nan"))
    comp.compress(x, CompressorRNG(0, 0), scaler=m * (1 - 1e-7))  # float slack is allowed
    # The caller's own scaler (the transport has it from the max round) is the one checked.
    own = torch.tensor(2 * m)
    with pytest.raises(ValueError, match=f"own scaler {own.item():.9g} "):
        comp.compress(x, CompressorRNG(0, 0), scaler=m, own=own)


@pytest.mark.parametrize("clip_at", ["shared", "own"])
def test_given_own_scaler_gives_the_same_codes(clip_at: str):
    comp = TernGrad(clip_at=clip_at)
    x = _randn(1000, seed=4)
    for shared in (None, 1.5 * float(comp.scaler(x))):
        plain = comp.compress(x, CompressorRNG(5, 1), scaler=shared)
        given = comp.compress(x, CompressorRNG(5, 1), scaler=shared, own=comp.scaler(x))
        assert torch.equal(plain.wire["codes"], given.wire["codes"])
        assert torch.equal(plain.wire["scaler"], given.wire["scaler"])


def test_determinism_ranks_and_global_rng():
    comp = TernGrad()
    x = _randn(4097)
    before = torch.random.get_rng_state()
    p1 = comp.compress(x, CompressorRNG(seed=3, rank=1))
    p2 = comp.compress(x, CompressorRNG(seed=3, rank=1))
    p3 = comp.compress(x, CompressorRNG(seed=3, rank=2))
    assert torch.equal(torch.random.get_rng_state(), before)
    for key in p1.wire:
        assert torch.equal(p1.wire[key], p2.wire[key])
    assert not torch.equal(p1.wire["codes"], p3.wire["codes"])
    assert torch.equal(p1.wire["scaler"], p3.wire["scaler"])


@pytest.mark.parametrize("clip", [0, -1, float("nan"), float("inf"), True, "2.5"])
def test_bad_clip_is_rejected(clip):
    with pytest.raises(ValueError, match=r"clip must be a positive .* or None, got " + repr(clip)):
        TernGrad(clip=clip)


def test_clip_accepts_int_and_repr():
    assert TernGrad(clip=3).clip == 3.0
    assert repr(TernGrad(clip=None)).startswith("TernGrad(clip=None, shared_scaler=True")


@pytest.mark.parametrize("clip", [2.5, None])
def test_all_zero_tensor(clip):
    comp = TernGrad(clip=clip)
    x = torch.zeros(3, 5)
    payload = comp.compress(x, CompressorRNG(0, 0))
    assert float(payload.wire["scaler"]) == 0.0
    assert torch.all(payload.wire["codes"] == 0)
    assert torch.all(comp.codes(payload) == 0)
    assert torch.equal(comp.decompress(payload), torch.zeros(3, 5))
