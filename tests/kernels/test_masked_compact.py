"""masked_compact / masked_scatter: bit-exact Triton vs reference, round trip with cast, errors."""

from __future__ import annotations

import pytest
import torch

from kernels.masked_compact import mask_to_indices, masked_compact, masked_scatter
from tests.kernels.helpers import DTYPES, LARGE_SIZE, SIZES


def dense_and_mask(numel: int, dtype: torch.dtype, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    x = (torch.randn(numel, generator=gen) * 100).to(dtype)
    return x, torch.rand(numel, generator=gen) < 0.3


@pytest.mark.parametrize("numel", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("out_dtype", DTYPES)
def test_bit_exact_and_round_trip(
    numel: int, dtype: torch.dtype, out_dtype: torch.dtype, gen, interpreted
) -> None:
    x, mask = dense_and_mask(numel, dtype, gen)
    indices = mask_to_indices(mask)
    compact = masked_compact(x, indices, out_dtype, backend="reference")
    assert compact.dtype == out_dtype and compact.shape == (int(mask.sum()),)
    assert torch.equal(masked_compact(x, indices, out_dtype, backend="triton"), compact)
    assert torch.equal(masked_compact(x, mask, out_dtype, backend="triton"), compact)
    outs = []
    for backend in ("reference", "triton"):
        out = torch.full((numel,), -7.0, dtype=dtype)
        assert masked_scatter(compact, indices.long(), out, backend=backend) is out
        outs.append(out)
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(outs[0][mask], x[mask].to(out_dtype).to(dtype))
    assert outs[0][~mask].eq(-7.0).all()


def test_large(gen, interpreted) -> None:
    x, mask = dense_and_mask(LARGE_SIZE, torch.float32, gen)
    indices = mask_to_indices(mask)
    compact = masked_compact(x, indices, torch.float16, backend="triton")
    assert torch.equal(compact, masked_compact(x, indices, torch.float16, backend="reference"))
    out = torch.zeros(LARGE_SIZE)
    masked_scatter(compact, indices, out, backend="triton")
    assert torch.equal(out[mask], compact.float()) and not out[~mask].any()


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # numpy, in the interpreter
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_fp16_cast_rounds_and_overflows_like_torch(backend: str, interpreted) -> None:
    x = torch.tensor([1e5, -1e5, 1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, 3e-8])
    compact = masked_compact(x, torch.arange(5), torch.float16, backend=backend)
    assert torch.equal(compact, x.half())  # inf, -inf, ties to even, subnormal


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_multidimensional_and_empty_mask(backend: str, gen, interpreted) -> None:
    x = torch.randn(4, 6, generator=gen)
    mask = torch.zeros(4, 6, dtype=torch.bool)
    mask[1, 2] = mask[3, 5] = True
    assert masked_compact(x, mask, backend=backend).tolist() == [x[1, 2].item(), x[3, 5].item()]
    empty = masked_compact(x, torch.zeros_like(mask), backend=backend)
    assert empty.numel() == 0
    out = torch.zeros(4, 6)
    masked_scatter(torch.tensor([1.0, 2.0]), mask, out, backend=backend)
    assert out[1, 2] == 1.0 and out[3, 5] == 2.0 and out.sum() == 3.0


def test_errors(gen) -> None:
    x, mask = dense_and_mask(10, torch.float32, gen)
    with pytest.raises(ValueError, match="a bool mask must have 10 elements"):
        masked_compact(x, mask[:9])
    with pytest.raises(ValueError, match="mask indices must be int32 or int64"):
        masked_compact(x, mask.float())
    with pytest.raises(ValueError, match="out_dtype must be one of"):
        masked_compact(x, mask, torch.int8)
    with pytest.raises(ValueError, match="compact must be 1-D with one entry per mask position"):
        masked_scatter(torch.zeros(int(mask.sum()) + 1), mask, torch.zeros(10))
    with pytest.raises(ValueError, match="out must be contiguous"):
        masked_scatter(torch.zeros(1), torch.tensor([0]), torch.zeros(4, 4).t())
    with pytest.raises(ValueError, match="backend must be one of"):
        masked_compact(x, mask, backend="numpy")


@pytest.mark.gpu
@pytest.mark.parametrize("numel", [7, 4097, 2**24 + 3])
@pytest.mark.parametrize("dtype,out_dtype", [(torch.float32, torch.float16), (torch.float32, torch.bfloat16)])
def test_gpu_triton_matches_reference(
    numel: int, dtype: torch.dtype, out_dtype: torch.dtype, cuda: torch.device
) -> None:
    gen = torch.Generator(device=cuda).manual_seed(0)
    x = torch.randn(numel, generator=gen, device=cuda).to(dtype)
    indices = mask_to_indices(torch.rand(numel, generator=gen, device=cuda) < 0.3)
    compact = masked_compact(x, indices, out_dtype, backend="triton")
    assert torch.equal(compact, masked_compact(x, indices, out_dtype, backend="reference"))
    out_t, out_r = torch.zeros_like(x), torch.zeros_like(x)
    masked_scatter(compact, indices, out_t, backend="triton")
    masked_scatter(compact, indices, out_r, backend="reference")
    assert torch.equal(out_t, out_r)
