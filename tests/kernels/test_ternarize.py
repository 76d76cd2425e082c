"""ternarize / ternary_decode_accumulate: bit-exact Triton vs reference, unbiasedness, layout, errors."""

from __future__ import annotations

import math

import pytest
import torch

from kernels.pack_bits import reference as pack_ref
from kernels.ternarize import reference as ternarize_ref
from kernels.ternarize import ternarize, ternary_decode_accumulate
from tests.kernels.helpers import DTYPES, LARGE_SIZE, SIZES, assert_unbiased, global_rng_untouched


def gradient(numel: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(numel, generator=gen).to(dtype)


@pytest.mark.parametrize("numel", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_per_tensor_bit_exact(numel: int, dtype: torch.dtype, gen, interpreted) -> None:
    g = gradient(numel, dtype, gen)
    noise = torch.rand(numel, generator=gen)
    scaler = g.float().abs().max()
    packed = ternarize(g, scaler, noise=noise, backend="reference")
    assert packed.dtype == torch.uint8 and packed.shape == (math.ceil(numel / 4),)
    assert torch.equal(ternarize(g, scaler, noise=noise, backend="triton"), packed)


@pytest.mark.parametrize("numel", [7, 1023, 4097])
@pytest.mark.parametrize("bucket_size", [1, 3, 512])
def test_per_bucket_bit_exact(numel: int, bucket_size: int, gen, interpreted) -> None:
    g = gradient(numel, torch.float32, gen)
    noise = torch.rand(numel, generator=gen)
    scalers = torch.rand(math.ceil(numel / bucket_size), generator=gen) * 2
    packed = ternarize(g, scalers, bucket_size=bucket_size, noise=noise, backend="reference")
    assert torch.equal(ternarize(g, scalers, bucket_size=bucket_size, noise=noise, backend="triton"), packed)


@pytest.mark.parametrize("numel", SIZES)
def test_decode_accumulate_bit_exact(numel: int, gen, interpreted) -> None:
    num_workers = 3
    packed = torch.randint(0, 256, (num_workers, math.ceil(numel / 4)), generator=gen, dtype=torch.uint8)
    scalers = torch.rand(num_workers, generator=gen)
    expected = ternary_decode_accumulate(packed, scalers, numel, backend="reference")
    assert expected.dtype == torch.float32 and expected.shape == (numel,)
    assert torch.equal(ternary_decode_accumulate(packed, scalers, numel, backend="triton"), expected)
    bucket_size = 5
    scalers_B = torch.rand(num_workers, math.ceil(numel / bucket_size), generator=gen)
    expected = ternary_decode_accumulate(
        packed, scalers_B, numel, bucket_size=bucket_size, backend="reference"
    )
    got = ternary_decode_accumulate(packed, scalers_B, numel, bucket_size=bucket_size, backend="triton")
    assert torch.equal(got, expected)


def _worker_order_sum(packed_W_M: torch.Tensor, scalers_W: torch.Tensor, numel: int) -> torch.Tensor:
    """((0 + s_0 t_0) + s_1 t_1) + ... in fp32, written out from the unpacked codes."""
    codes_W_N = pack_ref.unpack_bits(packed_W_M, 2, numel)
    values_W_N = (codes_W_N == 1).float() - (codes_W_N == 2).float()  # code 3 decodes to 0
    total = torch.zeros(numel)
    for w in range(packed_W_M.shape[0]):
        total = total + values_W_N[w] * scalers_W[w]
    return total


@pytest.mark.parametrize("num_workers", [2, 3, 4])
@pytest.mark.parametrize("scaler", [0.7, 1 / 3, 2.0**-140, 1e-30, torch.finfo(torch.float32).max / 4, 0.0])
def test_shared_scaler_sum_equals_worker_order(num_workers: int, scaler: float, gen, interpreted) -> None:
    """One scaler shared by every payload: the reference sums int8 codes and scales once (up to 3
    workers, where that rounds as the worker-order sum) and falls back beyond; the bytes cover
    every code (3 too), the scalers full mantissas, subnormals, the largest allowed and 0
    (which takes the general path). Equal bit for bit, sign of zero included, to the written-out sum
    and to the Triton kernel."""
    numel = 4099
    packed = torch.randint(0, 256, (num_workers, math.ceil(numel / 4)), generator=gen, dtype=torch.uint8)
    scalers = torch.full((num_workers,), scaler, dtype=torch.float32)
    fast = ternarize_ref._one_scaler(scalers.reshape(-1, 1)) is not None
    assert fast == (num_workers <= ternarize_ref.EXACT_CODE_SUM_WORKERS and scaler > 0)
    got = ternary_decode_accumulate(packed, scalers, numel, backend="reference")
    expected = _worker_order_sum(packed, scalers, numel)
    assert torch.equal(got.nan_to_num(), expected.nan_to_num())
    assert torch.equal(torch.signbit(got), torch.signbit(expected))
    assert torch.equal(
        ternary_decode_accumulate(packed, scalers, numel, backend="triton").nan_to_num(), got.nan_to_num()
    )


def test_large_round_trip(gen, interpreted) -> None:
    g = gradient(LARGE_SIZE, torch.float32, gen)
    noise = torch.rand(LARGE_SIZE, generator=gen)
    scaler = g.abs().max()
    packed = ternarize(g, scaler, noise=noise, backend="triton")
    assert torch.equal(packed, ternarize(g, scaler, noise=noise, backend="reference"))
    both = torch.stack([packed, packed])
    scalers = torch.stack([scaler, 2 * scaler])
    decoded = ternary_decode_accumulate(both, scalers, LARGE_SIZE, backend="triton")
    assert torch.equal(decoded, ternary_decode_accumulate(both, scalers, LARGE_SIZE, backend="reference"))


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_codes_and_layout(backend: str, interpreted) -> None:
    g = torch.tensor([0.5, -0.5, 0.0, 2.0, -0.5])
    noise = torch.tensor([0.4, 0.4, 0.0, 0.99, 0.6])
    # kept: 0.4 * 1 < 0.5 (+1), 0.4 < 0.5 (-1), never 0, |2| >= s always (+1, clipped), 0.6 > 0.5 (0)
    packed = ternarize(g, 1.0, noise=noise, backend=backend)
    assert packed.tolist() == [1 | 2 << 2 | 0 << 4 | 1 << 6, 0]
    decoded = ternary_decode_accumulate(packed, torch.tensor([3.0]), 5, backend=backend)
    assert decoded.tolist() == [3.0, -3.0, 0.0, 3.0, 0.0]


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_zero_scaler_decodes_to_zero(backend: str, gen, interpreted) -> None:
    noise = torch.rand(100, generator=gen)
    # s = max|g| = 0 only for an all-zero gradient: all codes 0.
    assert not ternarize(torch.zeros(100), 0.0, noise=noise, backend=backend).any()
    # Any |g| > s = 0 is clipped to ±s, which decodes to 0.
    packed = ternarize(gradient(100, torch.float32, gen), 0.0, noise=noise, backend=backend)
    assert not ternary_decode_accumulate(packed, torch.zeros(1), 100, backend=backend).any()


def expected_and_sigma(g: torch.Tensor, scaler: float) -> tuple[torch.Tensor, torch.Tensor]:
    """E[s * code] = g and Var = s|g| - g^2 for |g| <= s."""
    return g, (scaler * g.abs() - g * g).clamp(min=0).sqrt()


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_unbiased_with_noise(backend: str, gen, interpreted) -> None:
    num_draws, scaler = 2000, 1.5
    g_D = torch.linspace(-scaler, scaler, 33)
    g_M_D = g_D.repeat(num_draws, 1)
    noise = torch.rand(g_M_D.shape, generator=gen)
    packed = ternarize(g_M_D, scaler, noise=noise, backend=backend)
    decoded = ternary_decode_accumulate(packed, torch.tensor([scaler]), g_M_D.numel(), backend=backend)
    assert_unbiased(decoded.view(num_draws, -1), *expected_and_sigma(g_D, scaler))


def test_generator_path_is_bit_exact_and_leaves_global_rng(interpreted) -> None:
    g = torch.randn(4097, generator=torch.Generator().manual_seed(0))
    results = {}
    for backend in ("reference", "triton"):

        def run(backend: str = backend) -> None:
            gen = torch.Generator().manual_seed(7)
            results[backend] = ternarize(g, g.abs().max(), generator=gen, backend=backend)

        global_rng_untouched(run)
    assert torch.equal(results["reference"], results["triton"])


def test_fused_rng_unbiased_and_seeded(interpreted) -> None:
    num_draws, scaler = 512, 1.0
    g_D = torch.linspace(-scaler, scaler, 32)
    g_M_D = g_D.repeat(num_draws, 1)

    def draw(seed: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed)
        return ternarize(g_M_D, scaler, generator=gen, fused_rng=True, backend="triton")

    packed = draw(0)
    assert torch.equal(draw(0), packed), "same generator state, same Philox stream"
    assert not torch.equal(draw(1), packed)
    decoded = ternary_decode_accumulate(packed, torch.tensor([scaler]), g_M_D.numel(), backend="reference")
    assert_unbiased(decoded.view(num_draws, -1), *expected_and_sigma(g_D, scaler))


def test_fused_rng_on_reference_falls_back_to_torch_rand(gen) -> None:
    g = gradient(100, torch.float32, gen)
    a = ternarize(g, 3.0, generator=torch.Generator().manual_seed(3), fused_rng=True, backend="reference")
    b = ternarize(g, 3.0, generator=torch.Generator().manual_seed(3), backend="reference")
    assert torch.equal(a, b)


def test_errors(gen) -> None:
    g = gradient(10, torch.float32, gen)
    noise = torch.rand(10, generator=gen)
    with pytest.raises(ValueError, match="pass exactly one of noise"):
        ternarize(g, 1.0)
    with pytest.raises(ValueError, match="pass exactly one of noise"):
        ternarize(g, 1.0, noise=noise, generator=gen)
    with pytest.raises(ValueError, match=r"noise must have the input's shape \(10,\), got \(9,\)"):
        ternarize(g, 1.0, noise=noise[:9])
    with pytest.raises(ValueError, match=r"need 4 scaler\(s\) per row"):
        ternarize(g, torch.ones(3), bucket_size=3, noise=noise)
    with pytest.raises(ValueError, match=r"need 1 scaler\(s\) per row"):
        ternarize(g, torch.ones(2), noise=noise)
    with pytest.raises(ValueError, match="bucket_size must be a positive int"):
        ternarize(g, 1.0, bucket_size=0, noise=noise)
    with pytest.raises(ValueError, match="fused_rng=True draws its own numbers"):
        ternarize(g, 1.0, noise=noise, fused_rng=True)
    with pytest.raises(ValueError, match="g must be float32, float16 or bfloat16"):
        ternarize(g.int(), 1.0, noise=noise)
    with pytest.raises(ValueError, match="10 ternary codes need 3 bytes per worker, got 2"):
        ternary_decode_accumulate(torch.zeros(2, 2, dtype=torch.uint8), torch.ones(2), 10)
    with pytest.raises(ValueError, match="backend must be one of"):
        ternarize(g, 1.0, noise=noise, backend="gpu")


def test_fused_rng_needs_generator(interpreted) -> None:
    with pytest.raises(ValueError, match="fused_rng=True draws its seed from a generator"):
        ternarize(torch.ones(4), 1.0, fused_rng=True, backend="triton")


@pytest.mark.gpu
@pytest.mark.parametrize("numel", [7, 4097, 2**24 + 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_gpu_triton_matches_reference(numel: int, dtype: torch.dtype, cuda: torch.device) -> None:
    gen = torch.Generator(device=cuda).manual_seed(0)
    g = torch.randn(numel, generator=gen, device=cuda).to(dtype)
    noise = torch.rand(numel, generator=gen, device=cuda)
    scaler = g.float().abs().max()
    packed = ternarize(g, scaler, noise=noise, backend="triton")
    assert torch.equal(packed, ternarize(g, scaler, noise=noise, backend="reference"))
    both = torch.stack([packed, packed])
    scalers = torch.stack([scaler, scaler / 2])
    got = ternary_decode_accumulate(both, scalers, numel, backend="triton")
    assert torch.equal(got, ternary_decode_accumulate(both, scalers, numel, backend="reference"))
    fused = ternarize(g, scaler, generator=gen, fused_rng=True, backend="triton")
    assert fused.shape == packed.shape
