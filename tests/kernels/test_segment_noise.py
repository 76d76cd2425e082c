"""segment_noise: the fused route's counter hash, the same numbers on every backend."""

from __future__ import annotations

import pytest
import torch

from kernels import _native
from kernels._native import counter_uniform
from kernels.segment_noise import segment_noise
from tests.kernels.helpers import SMALL_SIZES

BACKENDS = [
    "reference",
    "triton",
    pytest.param("native", marks=pytest.mark.skipif(not _native.available(), reason="no C compiler")),
]


def _layout(sizes: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    sizes_t = torch.tensor(sizes)
    starts = torch.cumsum(sizes_t, 0) - sizes_t
    return torch.repeat_interleave(torch.arange(len(sizes)), sizes_t), starts


@pytest.mark.parametrize("kind", ["uniform", "priority"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_backend_gives_the_references_numbers(backend, kind):
    sizes = [*SMALL_SIZES, 5000, 1]
    ids, starts = _layout(sizes)
    g = torch.Generator().manual_seed(0)
    k1, k2 = (torch.randint(0, 2**32, (len(sizes),), generator=g) for _ in range(2))
    expected = segment_noise(ids, starts, k1, k2, kind, backend="reference")
    got = segment_noise(ids.to(torch.int32), starts, k1, k2, kind, backend=backend)
    assert torch.equal(got.view(torch.int32), expected.view(torch.int32))


def test_a_segment_draws_the_native_counter_hash_of_its_own_indices():
    """Segment s's numbers are kernels._native's counter_uniform(n_s, keys_s): they depend on the
    keys and the index within the tensor, not on where the tensor sits in the bucket."""
    sizes = [7, 1023, 300]
    ids, starts = _layout(sizes)
    k1, k2 = torch.tensor([1, 2**31 + 5, 77]), torch.tensor([9, 3, 2**32 - 1])
    u = segment_noise(ids, starts, k1, k2, backend="reference")
    for s, (start, n) in enumerate(zip(starts.tolist(), sizes, strict=True)):
        assert torch.equal(u[start : start + n], counter_uniform(n, (int(k1[s]), int(k2[s]))))


def test_the_numbers_are_uniform_and_the_priorities_order_like_their_bits():
    ids, starts = _layout([200_000])
    u = segment_noise(ids, starts, torch.tensor([5]), torch.tensor([6]))
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0 and abs(float(u.mean()) - 0.5) < 0.005
    p = segment_noise(ids, starts, torch.tensor([5]), torch.tensor([6]), "priority")
    assert torch.isfinite(p).all() and (p > 0).all()
    assert torch.equal(torch.argsort(p, stable=True), torch.argsort(p.view(torch.int32), stable=True))


def test_bad_input_is_named():
    ids, starts = _layout([3])
    with pytest.raises(ValueError, match="kind must be one of"):
        segment_noise(ids, starts, starts, starts, "gaussian")
    with pytest.raises(ValueError, match="ids must be a 1-D int32 or int64"):
        segment_noise(ids.float(), starts, starts, starts)
