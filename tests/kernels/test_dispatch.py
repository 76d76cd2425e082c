"""Backend dispatch shared by every op: auto / reference / triton, and the bad-backend error."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import kernels
from kernels import _dispatch
from kernels.pack_bits import triton as pack_triton

ALLOWED = r"backend must be one of \['reference', 'triton', 'auto'\], got 'bogus'"

# The argument is Any so that a bogus backend string type-checks.
CALLS: dict[str, Callable[[Any], object]] = {
    "pack_bits": lambda b: kernels.pack_bits(torch.zeros(4, dtype=torch.uint8), 2, backend=b),
    "unpack_bits": lambda b: kernels.unpack_bits(torch.zeros(1, dtype=torch.uint8), 2, 4, backend=b),
    "ternarize": lambda b: kernels.ternarize(torch.ones(4), 1.0, noise=torch.zeros(4), backend=b),
    "ternary_decode_accumulate": lambda b: kernels.ternary_decode_accumulate(
        torch.zeros(1, 1, dtype=torch.uint8), torch.ones(1), 4, backend=b
    ),
    "qsgd_quantize": lambda b: kernels.qsgd_quantize(torch.ones(4), noise=torch.zeros(4), backend=b),
    "qsgd_dequantize": lambda b: kernels.qsgd_dequantize(
        torch.zeros(2, dtype=torch.uint8), torch.ones(1), 4, backend=b
    ),
    "threshold_select": lambda b: kernels.threshold_select(torch.ones(4), 0.5, 4, backend=b),
    "ef_update": lambda b: kernels.ef_update(torch.ones(4), torch.ones(4), torch.ones(4), 0.9, backend=b),
    "ef_mask": lambda b: kernels.ef_mask(torch.ones(4), torch.ones(4), torch.tensor([1]), backend=b),
    "masked_compact": lambda b: kernels.masked_compact(torch.ones(4), torch.tensor([1]), backend=b),
    "masked_scatter": lambda b: kernels.masked_scatter(
        torch.ones(1), torch.tensor([1]), torch.zeros(4), backend=b
    ),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_bad_backend_lists_allowed_values(name: str) -> None:
    with pytest.raises(ValueError, match=ALLOWED):
        CALLS[name]("bogus")


@pytest.mark.parametrize("name", sorted(CALLS))
@pytest.mark.parametrize("backend", ["auto", "reference", "triton"])
def test_every_backend_runs(name: str, backend: str, interpreted) -> None:
    CALLS[name](backend)


def test_auto_uses_the_reference_on_cpu_even_with_the_interpreter(monkeypatch, interpreted) -> None:
    def fail(*args: object) -> None:
        raise AssertionError("the Triton path ran")

    monkeypatch.setattr(pack_triton, "pack_bits", fail)
    kernels.pack_bits(torch.zeros(8, dtype=torch.uint8), 2)  # auto
    with pytest.raises(AssertionError, match="the Triton path ran"):
        kernels.pack_bits(torch.zeros(8, dtype=torch.uint8), 2, backend="triton")


def test_explicit_triton_on_cpu_without_interpreter_raises(monkeypatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="backend='triton' needs CUDA tensors"):
        kernels.pack_bits(torch.zeros(8, dtype=torch.uint8), 2, backend="triton")


def test_use_triton_resolution(monkeypatch) -> None:
    monkeypatch.setattr(_dispatch, "triton_available", lambda: True)
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert _dispatch.use_triton("auto", cuda) and not _dispatch.use_triton("auto", cpu)
    assert not _dispatch.use_triton("reference", cuda)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert _dispatch.use_triton("triton", cpu) and not _dispatch.use_triton("auto", cpu)
    monkeypatch.setattr(_dispatch, "triton_available", lambda: False)
    assert not _dispatch.use_triton("auto", cuda)


def test_mixed_devices_are_refused() -> None:
    meta = torch.device("meta")
    with pytest.raises(ValueError, match="all tensors must be on one device"):
        kernels.ternarize(torch.ones(4), torch.ones((), device=meta), noise=torch.zeros(4))
    with pytest.raises(ValueError, match="all tensors must be on one device"):
        kernels.threshold_select(torch.ones(4), torch.ones((), device=meta), 2)
    with pytest.raises(ValueError, match="all tensors must be on one device"):
        kernels.masked_compact(torch.ones(4), torch.tensor([1], device=meta))
