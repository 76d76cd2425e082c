"""ef_update / ef_mask: bit-exact Triton vs reference, DGC semantics, padded index buffers, errors."""

from __future__ import annotations

import pytest
import torch

from kernels.ef_update import ef_mask, ef_update
from tests.kernels.helpers import DTYPES, LARGE_SIZE, SIZES

MOMENTUM = 0.9


def state(numel: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(numel, generator=gen), torch.randn(numel, generator=gen)


def run_both(
    u: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    sent: torch.Tensor,
    num_sent: torch.Tensor | int | None,
) -> tuple[torch.Tensor, ...]:
    """Run both backends on copies of (u, v); return (u_ref, v_ref, u_triton, v_triton)."""
    out = []
    for backend in ("reference", "triton"):
        u_b, v_b = u.clone(), v.clone()
        ef_update(u_b, v_b, g, MOMENTUM, sent, num_sent=num_sent, backend=backend)
        out += [u_b, v_b]
    return tuple(out)


@pytest.mark.parametrize("numel", SIZES)
@pytest.mark.parametrize("g_dtype", DTYPES)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_bit_exact(numel: int, g_dtype: torch.dtype, index_dtype: torch.dtype, gen, interpreted) -> None:
    u, v = state(numel, gen)
    g = torch.randn(numel, generator=gen).to(g_dtype)
    sent = torch.randint(numel, (max(1, numel // 50),), generator=gen).to(index_dtype)
    for num_sent in (None, 0, 1, sent.numel() // 2, torch.tensor(sent.numel() // 3), torch.tensor(10**6)):
        u_r, v_r, u_t, v_t = run_both(u, v, g, sent, num_sent)
        assert torch.equal(u_t, u_r) and torch.equal(v_t, v_r), f"num_sent={num_sent}"


def test_large(gen, interpreted) -> None:
    u, v = state(LARGE_SIZE, gen)
    g = torch.randn(LARGE_SIZE, generator=gen)
    sent = torch.randint(LARGE_SIZE, (LARGE_SIZE // 1000,), generator=gen, dtype=torch.int32)
    u_r, v_r, u_t, v_t = run_both(u, v, g, sent, torch.tensor(sent.numel() - 5))
    assert torch.equal(u_t, u_r) and torch.equal(v_t, v_r)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_semantics(backend: str, gen, interpreted) -> None:
    u, v = state(64, gen)
    g = torch.randn(64, generator=gen)
    sent = torch.tensor([3, 10, 10, 63, 0, 0], dtype=torch.int64)  # a duplicate, then padding
    u_new, v_new = u.clone(), v.clone()
    ef_update(u_new, v_new, g, MOMENTUM, sent, num_sent=torch.tensor(4), backend=backend)
    expected_u = u * MOMENTUM + g
    expected_v = v + expected_u
    expected_u[[3, 10, 63]] = 0
    expected_v[[3, 10, 63]] = 0
    assert torch.equal(u_new, expected_u) and torch.equal(v_new, expected_v)
    assert u_new[0] != 0, "padding past num_sent is not masked"


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_no_indices_skips_masking_and_ef_mask_masks(backend: str, gen, interpreted) -> None:
    u, v = state(100, gen)
    g = torch.randn(100, generator=gen)
    u_new, v_new = u.clone(), v.clone()
    ef_update(u_new, v_new, g, MOMENTUM, backend=backend)
    assert torch.equal(u_new, u * MOMENTUM + g) and torch.equal(v_new, v + u_new)
    indices = torch.tensor([5, 99, 7], dtype=torch.int32)
    ef_mask(u_new, v_new, indices, num_sent=2, backend=backend)
    assert u_new[[5, 99]].eq(0).all() and v_new[[5, 99]].eq(0).all()
    assert u_new[7] != 0 and v_new[7] != 0


def test_multidimensional_state(gen, interpreted) -> None:
    u, v = state(60, gen)
    g = torch.randn(60, generator=gen)
    u_3d, v_3d = u.clone().view(3, 4, 5), v.clone().view(3, 4, 5)
    ef_update(u_3d, v_3d, g.view(3, 4, 5), MOMENTUM, torch.tensor([59]), backend="triton")
    assert u_3d[2, 3, 4] == 0 and v_3d[2, 3, 4] == 0  # flat index 59
    assert torch.equal(u_3d.view(-1)[:59], (u * MOMENTUM + g)[:59])


def test_errors(gen) -> None:
    u, v = state(10, gen)
    g = torch.randn(10, generator=gen)
    with pytest.raises(ValueError, match="u must be float32"):
        ef_update(u.half(), v, g, MOMENTUM)
    with pytest.raises(ValueError, match="v must be contiguous"):
        ef_update(u.view(2, 5), v.view(5, 2).t(), g.view(2, 5), MOMENTUM)
    with pytest.raises(ValueError, match="u and v must have one shape"):
        ef_update(u, v[:9], g, MOMENTUM)
    with pytest.raises(ValueError, match=r"g must have u's shape \(10,\)"):
        ef_update(u, v, g[:9], MOMENTUM)
    with pytest.raises(ValueError, match="sent_indices must be int32 or int64"):
        ef_update(u, v, g, MOMENTUM, torch.tensor([1.0]))
    with pytest.raises(ValueError, match="num_sent must be a non-negative int"):
        ef_update(u, v, g, MOMENTUM, torch.tensor([1]), num_sent=-1)
    with pytest.raises(ValueError, match="num_sent must be an integer scalar tensor"):
        ef_mask(u, v, torch.tensor([1]), num_sent=torch.tensor([1.0]))
    with pytest.raises(ValueError, match="backend must be one of"):
        ef_update(u, v, g, MOMENTUM, backend="fast")


@pytest.mark.gpu
@pytest.mark.parametrize("numel", [7, 4097, 2**24 + 3])
@pytest.mark.parametrize("g_dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_gpu_triton_matches_reference(numel: int, g_dtype: torch.dtype, cuda: torch.device) -> None:
    gen = torch.Generator(device=cuda).manual_seed(0)
    u = torch.randn(numel, generator=gen, device=cuda)
    v = torch.randn(numel, generator=gen, device=cuda)
    g = torch.randn(numel, generator=gen, device=cuda).to(g_dtype)
    sent = torch.randint(numel, (max(1, numel // 1000),), generator=gen, device=cuda, dtype=torch.int32)
    count = torch.tensor(sent.numel() // 2, device=cuda)
    u_r, v_r, u_t, v_t = run_both(u, v, g, sent, count)
    assert torch.equal(u_t, u_r) and torch.equal(v_t, v_r)
