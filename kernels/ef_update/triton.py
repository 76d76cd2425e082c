"""Triton kernels for the fused DGC error-feedback update (op: ``reference.py``).

Two launches on the same stream: a dense kernel ``u = m * u + g; v = v + u`` (reads u, v, g once,
writes u, v once: 20 bytes per element for fp32 g, instead of 40 for the three separate torch
ops), then a masking kernel over the K sent indices that stores zeros into u and v. One launch
cannot do both: another program could write an entry after the mask zeroed it. Out-of-range
indices are skipped (the reference raises instead; checking would need a host sync).

Launched with ``enable_fp_fusion=False`` so that ``m * u + g`` rounds twice, like torch's
``mul_`` then ``add_``, not once in an FMA: the two backends then agree bit for bit.
Block size: 4096 elements with 8 warps for the dense kernel (16 per thread; see
``kernels/pack_bits/triton.py``); 1024 indices with 4 warps for the sparse mask, where K is small.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096
NUM_WARPS = 8
MASK_BLOCK = 1024
MASK_NUM_WARPS = 4


@triton.jit
def _dense_update_kernel(u_ptr, v_ptr, g_ptr, momentum, numel, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    u = tl.load(u_ptr + offs, mask=mask)
    v = tl.load(v_ptr + offs, mask=mask)
    g = tl.load(g_ptr + offs, mask=mask).to(tl.float32)
    u = u * momentum + g
    tl.store(u_ptr + offs, u, mask=mask)
    tl.store(v_ptr + offs, v + u, mask=mask)


@triton.jit
def _mask_kernel(
    u_ptr, v_ptr, sent_ptr, num_sent_ptr, numel, num_indices, HAS_COUNT: tl.constexpr, BLOCK: tl.constexpr
):
    slots = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    limit = num_indices
    if HAS_COUNT:
        limit = tl.minimum(tl.load(num_sent_ptr), num_indices)
    in_use = slots < limit
    idx = tl.load(sent_ptr + slots, mask=in_use, other=0)
    in_use = in_use & (idx >= 0) & (idx < numel)
    tl.store(u_ptr + idx, tl.zeros([BLOCK], dtype=tl.float32), mask=in_use)
    tl.store(v_ptr + idx, tl.zeros([BLOCK], dtype=tl.float32), mask=in_use)


def ef_update(u_N: torch.Tensor, v_N: torch.Tensor, g_N: torch.Tensor, momentum: float) -> None:
    """Dense part, in place on contiguous fp32 ``u_N``, ``v_N``."""
    numel = u_N.numel()
    if numel:
        grid = (triton.cdiv(numel, BLOCK),)
        _dense_update_kernel[grid](
            u_N, v_N, g_N, float(momentum), numel, BLOCK=BLOCK, num_warps=NUM_WARPS, enable_fp_fusion=False
        )


def ef_mask(
    u_N: torch.Tensor, v_N: torch.Tensor, sent_K: torch.Tensor, num_sent: torch.Tensor | None
) -> None:
    """Zero u and v at the first ``min(num_sent, K)`` indices of ``sent_K`` (all K if None)."""
    num_indices = sent_K.numel()
    if num_indices == 0 or u_N.numel() == 0:
        return
    grid = (triton.cdiv(num_indices, MASK_BLOCK),)
    _mask_kernel[grid](
        u_N,
        v_N,
        sent_K,
        sent_K if num_sent is None else num_sent,
        u_N.numel(),
        num_indices,
        HAS_COUNT=num_sent is not None,
        BLOCK=MASK_BLOCK,
        num_warps=MASK_NUM_WARPS,
    )
