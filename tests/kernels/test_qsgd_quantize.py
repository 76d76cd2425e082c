"""qsgd_quantize / qsgd_dequantize(_accumulate): bit-exact Triton vs reference, unbiasedness, codes."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from kernels.qsgd_quantize import (
    num_levels,
    qsgd_dequantize,
    qsgd_dequantize_accumulate,
    qsgd_quantize,
)
from tests.kernels.helpers import DTYPES, LARGE_SIZE, SIZES, assert_unbiased, global_rng_untouched


def vector(numel: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(numel, generator=gen).to(dtype)


@pytest.mark.parametrize("numel", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_bit_exact_default_config(numel: int, dtype: torch.dtype, gen, interpreted) -> None:
    v = vector(numel, dtype, gen)
    noise = torch.rand(numel, generator=gen)
    packed, norms = qsgd_quantize(v, noise=noise, backend="reference")
    assert packed.shape == (math.ceil(numel / 2),) and norms.shape == (math.ceil(numel / 512),)
    assert norms.dtype == torch.float32
    packed_t, norms_t = qsgd_quantize(v, noise=noise, backend="triton")
    assert torch.equal(packed_t, packed) and torch.equal(norms_t, norms)


@pytest.mark.parametrize("numel", [7, 4097])
@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("norm", ["l2", "max"])
@pytest.mark.parametrize("bucket_size", [1, 5, 512])
def test_bit_exact_all_configs(numel: int, bits: int, norm: str, bucket_size: int, gen, interpreted) -> None:
    v = vector(numel, torch.float32, gen)
    noise = torch.rand(numel, generator=gen)
    kwargs = {"bits": bits, "norm": norm, "bucket_size": bucket_size, "noise": noise}
    packed, norms = qsgd_quantize(v, **kwargs, backend="reference")
    packed_t, norms_t = qsgd_quantize(v, **kwargs, backend="triton")
    assert torch.equal(packed_t, packed) and torch.equal(norms_t, norms)
    payloads = torch.stack([packed, packed_t.flip(0)])
    all_norms = torch.stack([norms, 3 * norms])
    kw = {"bits": bits, "bucket_size": bucket_size}
    expected = qsgd_dequantize_accumulate(payloads, all_norms, numel, **kw, backend="reference")
    assert torch.equal(
        qsgd_dequantize_accumulate(payloads, all_norms, numel, **kw, backend="triton"), expected
    )


def test_large(gen, interpreted) -> None:
    v = vector(LARGE_SIZE, torch.float32, gen)
    noise = torch.rand(LARGE_SIZE, generator=gen)
    packed, norms = qsgd_quantize(v, noise=noise, backend="triton")
    packed_r, norms_r = qsgd_quantize(v, noise=noise, backend="reference")
    assert torch.equal(packed, packed_r) and torch.equal(norms, norms_r)
    decoded = qsgd_dequantize(packed, norms, LARGE_SIZE, backend="triton")
    assert torch.equal(decoded, qsgd_dequantize(packed, norms, LARGE_SIZE, backend="reference"))


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_codes_and_layout(backend: str, interpreted) -> None:
    v = torch.tensor([1.0, -0.5, 0.25, 0.0, -0.01])
    noise = torch.zeros(5)
    packed, norms = qsgd_quantize(v, bits=4, norm="max", bucket_size=8, noise=noise, backend=backend)
    # s = 7, scale 7 / 1: levels floor(7|v|) = 7, 3, 1, 0, 0; -0.01 rounds to level 0 and loses its sign
    assert norms.tolist() == [1.0]
    assert packed.tolist() == [7 | (8 | 3) << 4, 1 | 0 << 4, 0]
    decoded = qsgd_dequantize(packed, norms, 5, bits=4, bucket_size=8, backend=backend)
    unit = torch.tensor(1.0) / 7  # one level, rounded to fp32 once
    assert torch.equal(decoded, torch.tensor([7.0, -3.0, 1.0, 0.0, 0.0]) * unit)


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_level_clamped_to_s(backend: str, bits: int, interpreted) -> None:
    v = torch.tensor([-3.0, 3.0, 1.0])
    noise = torch.full((3,), 1.0 - 2.0**-24)  # the largest float32 below 1: s + u rounds up to s + 1
    packed, norms = qsgd_quantize(v, bits=bits, norm="max", noise=noise, backend=backend)
    decoded = qsgd_dequantize(packed, norms, 3, bits=bits, backend=backend)
    assert decoded[:2].tolist() == [-3.0, 3.0]
    assert decoded.abs().max() <= 3.0


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_zero_bucket_decodes_to_zero(backend: str, gen, interpreted) -> None:
    v = torch.cat([torch.zeros(8), torch.ones(8)])
    packed, norms = qsgd_quantize(v, bucket_size=8, noise=torch.rand(16, generator=gen), backend=backend)
    assert norms[0] == 0
    assert torch.equal(qsgd_dequantize(packed, norms, 16, bucket_size=8, backend=backend)[:8], torch.zeros(8))


def unbiased_check(
    decode: Callable[[], torch.Tensor], v_D: torch.Tensor, num_draws: int, bits: int, norm: str
) -> None:
    """v_D tiled num_draws times with bucket size D, so every bucket has v_D's norm."""
    s = num_levels(bits)
    norm_value = float(v_D.norm()) if norm == "l2" else float(v_D.abs().max())
    unit = norm_value / s
    frac_D = (v_D.abs() / unit) - torch.floor(v_D.abs() / unit)
    sigma_D = unit * (frac_D * (1 - frac_D)).sqrt()
    assert_unbiased(decode().view(num_draws, -1), v_D, sigma_D)


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("bits,norm", [(2, "l2"), (4, "max"), (8, "l2")])
def test_unbiased_with_noise(backend: str, bits: int, norm: str, gen, interpreted) -> None:
    num_draws = 2000
    v_D = torch.randn(32, generator=gen)
    v_M_D = v_D.repeat(num_draws, 1)
    noise = torch.rand(v_M_D.shape, generator=gen)

    def decode() -> torch.Tensor:
        packed, norms = qsgd_quantize(
            v_M_D, bits=bits, norm=norm, bucket_size=32, noise=noise, backend=backend
        )
        return qsgd_dequantize(packed, norms, v_M_D.numel(), bits=bits, bucket_size=32, backend=backend)

    unbiased_check(decode, v_D, num_draws, bits, norm)


def test_fused_rng_unbiased_and_seeded(gen, interpreted) -> None:
    num_draws, bits = 512, 2
    v_D = torch.randn(32, generator=gen)
    v_M_D = v_D.repeat(num_draws, 1)

    def quantize(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        rng = torch.Generator().manual_seed(seed)
        return qsgd_quantize(
            v_M_D, bits=bits, bucket_size=32, generator=rng, fused_rng=True, backend="triton"
        )

    packed, norms = quantize(0)
    assert torch.equal(quantize(0)[0], packed)
    assert not torch.equal(quantize(1)[0], packed)

    def decode() -> torch.Tensor:
        return qsgd_dequantize(packed, norms, v_M_D.numel(), bits=bits, bucket_size=32, backend="reference")

    unbiased_check(decode, v_D, num_draws, bits, "l2")


def test_generator_path_bit_exact_and_global_rng_untouched(gen, interpreted) -> None:
    v = vector(1023, torch.float32, gen)
    results = {}
    for backend in ("reference", "triton"):

        def run(backend: str = backend) -> None:
            results[backend] = qsgd_quantize(v, generator=torch.Generator().manual_seed(5), backend=backend)

        global_rng_untouched(run)
    assert torch.equal(results["reference"][0], results["triton"][0])


def test_errors(gen) -> None:
    v = vector(10, torch.float32, gen)
    noise = torch.rand(10, generator=gen)
    with pytest.raises(ValueError, match=r"bits must be one of \[2, 4, 8\]"):
        qsgd_quantize(v, bits=3, noise=noise)
    with pytest.raises(ValueError, match=r"bits must be one of \[2, 4, 8\]"):
        qsgd_dequantize(torch.zeros(10, dtype=torch.uint8), torch.ones(1), 10, bits=1)
    with pytest.raises(ValueError, match=r"norm must be one of \['l2', 'max'\]"):
        qsgd_quantize(v, norm="l1", noise=noise)
    with pytest.raises(ValueError, match="bucket_size must be a positive int"):
        qsgd_quantize(v, bucket_size=0, noise=noise)
    with pytest.raises(ValueError, match="pass exactly one of noise"):
        qsgd_quantize(v)
    with pytest.raises(ValueError, match="fused_rng=True draws its own numbers"):
        qsgd_quantize(v, noise=noise, fused_rng=True)
    packed, norms = qsgd_quantize(v, bucket_size=4, noise=noise)
    with pytest.raises(ValueError, match="need 3 norms per worker"):
        qsgd_dequantize(packed, norms[:2], 10, bucket_size=4)
    with pytest.raises(ValueError, match="10 codes of 4 bits need 5 bytes per worker, got 4"):
        qsgd_dequantize(packed[:4], norms, 10, bucket_size=4)
    with pytest.raises(ValueError, match="packed must be 1-D"):
        qsgd_dequantize(packed.view(1, -1), norms, 10, bucket_size=4)
    with pytest.raises(ValueError, match="backend must be one of"):
        qsgd_quantize(v, noise=noise, backend="Triton")


@pytest.mark.gpu
@pytest.mark.parametrize("numel", [7, 4097, 2**24 + 3])
@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("norm", ["l2", "max"])
def test_gpu_triton_matches_reference(numel: int, bits: int, norm: str, cuda: torch.device) -> None:
    gen = torch.Generator(device=cuda).manual_seed(0)
    v = torch.randn(numel, generator=gen, device=cuda)
    noise = torch.rand(numel, generator=gen, device=cuda)
    packed, norms = qsgd_quantize(v, bits=bits, norm=norm, noise=noise, backend="triton")
    packed_r, norms_r = qsgd_quantize(v, bits=bits, norm=norm, noise=noise, backend="reference")
    assert torch.equal(packed, packed_r) and torch.equal(norms, norms_r)
    payloads, all_norms = torch.stack([packed, packed]), torch.stack([norms, norms / 3])
    got = qsgd_dequantize_accumulate(payloads, all_norms, numel, bits=bits, backend="triton")
    assert torch.equal(
        got, qsgd_dequantize_accumulate(payloads, all_norms, numel, bits=bits, backend="reference")
    )
    fused, _ = qsgd_quantize(v, bits=bits, norm=norm, generator=gen, fused_rng=True, backend="triton")
    assert fused.shape == packed.shape
