"""Triton kernels for ``masked_compact`` / ``masked_scatter`` (op: ``reference.py``).

Each program owns ``BLOCK`` compact slots: it loads their indices contiguously, gathers (compact) or
scatters (scatter) the dense entries and casts on the fly, so the fp32 <-> fp16 conversion costs no
extra pass. The dense side is accessed at ascending, mostly clustered positions (pruning masks keep
whole rows or scattered entries at density 0.1-0.5), so cache lines are shared between neighbouring
slots. Indices out of ``[0, N)`` are skipped (checking them would need a host sync).

Block size: 4096 slots with 8 warps (16 per thread); see ``kernels/pack_bits/triton.py``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096
NUM_WARPS = 8


@triton.jit
def _compact_kernel(x_ptr, indices_ptr, out_ptr, numel, num_indices, BLOCK: tl.constexpr):
    slots = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    in_use = slots < num_indices
    idx = tl.load(indices_ptr + slots, mask=in_use, other=0)
    valid = in_use & (idx >= 0) & (idx < numel)
    x = tl.load(x_ptr + idx, mask=valid, other=0.0)
    tl.store(out_ptr + slots, x.to(out_ptr.dtype.element_ty), mask=in_use)


@triton.jit
def _scatter_kernel(compact_ptr, indices_ptr, out_ptr, numel, num_indices, BLOCK: tl.constexpr):
    slots = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    in_use = slots < num_indices
    idx = tl.load(indices_ptr + slots, mask=in_use, other=0)
    valid = in_use & (idx >= 0) & (idx < numel)
    values = tl.load(compact_ptr + slots, mask=in_use, other=0.0)
    tl.store(out_ptr + idx, values.to(out_ptr.dtype.element_ty), mask=valid)


def masked_compact(x_N: torch.Tensor, indices_K: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    num_indices = indices_K.numel()
    out_K = torch.empty(num_indices, dtype=out_dtype, device=x_N.device)
    if num_indices:
        grid = (triton.cdiv(num_indices, BLOCK),)
        _compact_kernel[grid](
            x_N, indices_K, out_K, x_N.numel(), num_indices, BLOCK=BLOCK, num_warps=NUM_WARPS
        )
    return out_K


def masked_scatter(compact_K: torch.Tensor, indices_K: torch.Tensor, out_N: torch.Tensor) -> None:
    num_indices = indices_K.numel()
    if num_indices:
        grid = (triton.cdiv(num_indices, BLOCK),)
        _scatter_kernel[grid](
            compact_K, indices_K, out_N, out_N.numel(), num_indices, BLOCK=BLOCK, num_warps=NUM_WARPS
        )
