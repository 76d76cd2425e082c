"""threshold_select (sets and exact counts, Triton vs reference) and estimate_threshold."""

from __future__ import annotations

import math

import pytest
import torch

from kernels.threshold_select import estimate_threshold, threshold_select
from tests.kernels.helpers import DTYPES, LARGE_SIZE, SIZES, global_rng_untouched

Selection = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def check_selection(x: torch.Tensor, threshold: float, capacity: int, got: Selection, ordered: bool) -> None:
    """Exact count; the filled slots hold distinct hits with their values; padding is (0, index 0)."""
    values, indices, count = got
    x_N = x.reshape(-1)
    expected_K = torch.nonzero(x_N.float().abs() >= threshold).view(-1)
    assert count.dtype == torch.int64 and count.dim() == 0 and int(count) == expected_K.numel()
    assert values.shape == (capacity,) and values.dtype == x.dtype
    assert indices.shape == (capacity,) and indices.dtype == torch.int32
    filled = min(int(count), capacity)
    kept = indices[:filled].long()
    if int(count) <= capacity:
        assert torch.equal(kept if ordered else kept.sort().values, expected_K)
    else:
        assert torch.isin(kept, expected_K).all() and kept.unique().numel() == filled
        if ordered:
            assert torch.equal(kept, expected_K[:capacity]), "the reference keeps the lowest indices"
    assert torch.equal(values[:filled], x_N[kept])
    assert not values[filled:].any() and not indices[filled:].any()


@pytest.mark.parametrize("numel", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("capacity_fraction", [0.0, 0.005, 1.0])
def test_triton_and_reference_select_the_same_set(
    numel: int, dtype: torch.dtype, capacity_fraction: float, gen, interpreted
) -> None:
    x = torch.randn(numel, generator=gen).to(dtype)
    threshold, capacity = 1.5, math.ceil(capacity_fraction * numel)
    for backend in ("reference", "triton"):
        got = threshold_select(x, threshold, capacity, backend=backend)
        check_selection(x, threshold, capacity, got, ordered=backend == "reference")


def test_large(gen, interpreted) -> None:
    x = torch.randn(LARGE_SIZE, generator=gen)
    threshold = estimate_threshold(x, 0.001, generator=gen)
    capacity = 2 * math.ceil(0.001 * LARGE_SIZE)
    got = threshold_select(x, threshold, capacity, backend="triton")
    check_selection(x, float(threshold), capacity, got, ordered=False)
    assert int(got[2]) == int(threshold_select(x, threshold, capacity, backend="reference")[2])


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_tensor_threshold_and_boundary(backend: str, interpreted) -> None:
    x = torch.tensor([[0.5, -2.0], [2.0, 1.9999999], [-0.0, 3.0]])
    values, indices, count = threshold_select(x, torch.tensor(2.0), 4, backend=backend)
    assert int(count) == 3  # |x| >= 2 is inclusive; read flat
    order = indices[:3].argsort()
    assert indices[:3][order].tolist() == [1, 2, 5] and values[:3][order].tolist() == [-2.0, 2.0, 3.0]


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_threshold_compared_in_fp32(backend: str, interpreted) -> None:
    x = torch.tensor([1.0], dtype=torch.float16)
    # 1.0001 rounds to 1.0 in fp16 but not in fp32: not selected.
    assert int(threshold_select(x, 1.0001, 1, backend=backend)[2]) == 0


def test_estimate_threshold_hits_the_density(gen) -> None:
    x = torch.randn(2**20, generator=gen)
    # The sample's top-k holds k = ceil(S * density) ~ 105 entries in both cases, so the achieved
    # density has a relative spread of about 1 / sqrt(k) = 10 %: allow 4 of those.
    for density, fraction in ((0.01, None), (0.001, 0.1)):
        threshold = estimate_threshold(x, density, sample_fraction=fraction, generator=gen)
        assert threshold.dtype == torch.float32 and threshold.dim() == 0
        achieved = float((x.abs() >= threshold).float().mean())
        assert 0.6 * density < achieved < 1.4 * density


def test_estimate_threshold_exact_on_the_whole_tensor(gen) -> None:
    x = torch.randn(1000, generator=gen)
    threshold = estimate_threshold(x, 0.05, sample_fraction=1.0, generator=gen)
    assert float(threshold) == float(x.abs().topk(50).values.min())
    small = estimate_threshold(x[:10], 0.5, sample_size=100, generator=gen)  # capped at the tensor
    assert float(small) == float(x[:10].abs().topk(5).values.min())


def test_estimate_threshold_sample_size_and_global_rng(gen) -> None:
    x = torch.randn(10_000, generator=gen)

    def run() -> None:
        a = estimate_threshold(x, 0.01, sample_size=500, generator=torch.Generator().manual_seed(1))
        b = estimate_threshold(x, 0.01, sample_size=500, generator=torch.Generator().manual_seed(1))
        assert float(a) == float(b)

    global_rng_untouched(run)


def test_errors(gen) -> None:
    x = torch.randn(10, generator=gen)
    with pytest.raises(ValueError, match="capacity must be a non-negative int"):
        threshold_select(x, 1.0, -1)
    with pytest.raises(ValueError, match="threshold must be a scalar"):
        threshold_select(x, torch.ones(2), 3)
    with pytest.raises(ValueError, match="x must be float32, float16 or bfloat16"):
        threshold_select(x.long(), 1.0, 3)
    with pytest.raises(ValueError, match="backend must be one of"):
        threshold_select(x, 1.0, 3, backend="cpu")
    with pytest.raises(ValueError, match=r"density must be in \(0, 1\]"):
        estimate_threshold(x, 0.0, generator=gen)
    with pytest.raises(ValueError, match="pass at most one of sample_size and sample_fraction"):
        estimate_threshold(x, 0.1, sample_size=5, sample_fraction=0.5, generator=gen)
    with pytest.raises(ValueError, match=r"sample_fraction must be in \(0, 1\]"):
        estimate_threshold(x, 0.1, sample_fraction=2.0, generator=gen)
    with pytest.raises(ValueError, match="empty tensor"):
        estimate_threshold(x[:0], 0.1, generator=gen)


@pytest.mark.gpu
@pytest.mark.parametrize("numel", [7, 4097, 2**24 + 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_gpu_triton_matches_reference(numel: int, dtype: torch.dtype, cuda: torch.device) -> None:
    gen = torch.Generator(device=cuda).manual_seed(0)
    x = torch.randn(numel, generator=gen, device=cuda).to(dtype)
    threshold = estimate_threshold(x, 0.01, generator=gen)
    capacity = 2 * math.ceil(0.01 * numel)
    values, indices, count = threshold_select(x, threshold, capacity, backend="triton")
    values_r, indices_r, count_r = threshold_select(x, threshold, capacity, backend="reference")
    assert int(count) == int(count_r)
    filled = min(int(count), capacity)
    order = indices[:filled].argsort()
    assert torch.equal(indices[:filled][order], indices_r[:filled])
    assert torch.equal(values[:filled][order], values_r[:filled])
