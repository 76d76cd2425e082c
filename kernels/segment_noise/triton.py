"""Triton kernel for ``segment_noise`` (the op: ``reference.py``).

Each program owns ``BLOCK`` consecutive entries: their segment ids are loaded (4 or 8 bytes), the
segment's first entry and two keys gathered (S values that stay in cache), and the hash computed in
uint32 registers: 8 to 12 bytes of traffic an entry against the reference's ten int64 passes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096
NUM_WARPS = 8


@triton.jit
def _hash32(x):
    x = x ^ (x >> 16)
    x = x * 0x21F0AAAD
    x = x ^ (x >> 15)
    x = x * 0x735A2D97
    return x ^ (x >> 15)


@triton.jit
def _segment_noise_kernel(
    ids_ptr, starts_ptr, k1_ptr, k2_ptr, out_ptr, numel, PRIORITY: tl.constexpr, BLOCK: tl.constexpr
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    seg = tl.load(ids_ptr + offs, mask=mask, other=0)
    local = (offs - tl.load(starts_ptr + seg, mask=mask, other=0)).to(tl.uint32)
    k1 = tl.load(k1_ptr + seg, mask=mask, other=0).to(tl.uint32)
    k2 = tl.load(k2_ptr + seg, mask=mask, other=0).to(tl.uint32)
    h = _hash32(_hash32(local ^ k1) ^ k2)
    if PRIORITY:
        out = ((h >> 2) + 0x00800000).to(tl.float32, bitcast=True)
    else:
        out = (h >> 8).to(tl.float32) * 5.960464477539063e-08  # 2^-24
    tl.store(out_ptr + offs, out, mask=mask)


def segment_noise(
    ids_N: torch.Tensor, starts_S: torch.Tensor, k1_S: torch.Tensor, k2_S: torch.Tensor, kind: str
) -> torch.Tensor:
    out = torch.empty(ids_N.numel(), dtype=torch.float32, device=ids_N.device)
    grid = (triton.cdiv(ids_N.numel(), BLOCK),)
    _segment_noise_kernel[grid](
        ids_N,
        starts_S,
        k1_S,
        k2_S,
        out,
        ids_N.numel(),
        PRIORITY=kind == "priority",
        BLOCK=BLOCK,
        num_warps=NUM_WARPS,
    )
    return out
