"""Shared sizes and checks for the kernel tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

# Odd sizes around block and byte boundaries, and one large size (2**20 + 3, 257 programs of 4096).
# The Triton interpreter costs 4-20 ms per program on 2 busy CPU cores, so in the default run each
# op has one dedicated large-size test; the full grid at the large size is marked slow.
SMALL_SIZES = (1, 7, 1023, 4097)
LARGE_SIZE = 2**20 + 3
SIZES = (*SMALL_SIZES, pytest.param(LARGE_SIZE, id="2^20+3", marks=pytest.mark.slow))
DTYPES = (torch.float32, torch.float16)


def assert_unbiased(samples_M_D: torch.Tensor, expected_D: torch.Tensor, sigma_D: torch.Tensor) -> None:
    """The mean of M independent draws is within 4 sigma / sqrt(M) of the expectation, per element."""
    num_draws = samples_M_D.shape[0]
    error_D = (samples_M_D.double().mean(0) - expected_D.double()).abs()
    bound_D = 4 * sigma_D.double() / num_draws**0.5 + 1e-6 * expected_D.double().abs().clamp(min=1)
    worst = int((error_D - bound_D).argmax())
    assert bool((error_D <= bound_D).all()), (
        f"element {worst}: mean {float(samples_M_D[:, worst].double().mean())} vs expected "
        f"{float(expected_D[worst])}, allowed {float(bound_D[worst])} ({num_draws} draws)"
    )


def global_rng_untouched(fn: Callable[[], object]) -> None:
    """Run ``fn()`` and assert that torch's global CPU RNG state did not move."""
    before = torch.random.get_rng_state()
    fn()
    assert torch.equal(before, torch.random.get_rng_state()), "the global RNG was used"
