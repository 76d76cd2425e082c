"""Triton kernels for ``pack_bits`` / ``unpack_bits`` (byte layout: see ``reference.py``).

Pack: each program owns ``BLOCK`` consecutive codes viewed as a ``[BLOCK // P, P]`` tile (one row
per output byte). The tile is one contiguous load; each field is shifted to ``col * BITS`` and the
row is summed (the fields are disjoint, so the sum is a bitwise OR). Unpack: each program owns
``BLOCK`` output codes and gathers their bytes (``P`` neighbouring codes hit the same byte, so the
gather is served from cache).

Block size: ``BLOCK = 4096`` codes with 8 warps is 16 codes per thread (one 16-byte load of uint8
codes) and 4 KiB read per program; at 2**20 codes that is 256 programs, two per SM on an H100, and
more work per program only raises register use. The kernels are bandwidth-bound, so the choice is
not critical; it is not autotuned (no GPU in CI), and it keeps the interpreter's per-program cost
(4-20 ms on 2 CPU cores) down in the tests.

The ternarize and QSGD kernels pack their codes with the same two lines (shift by ``col * BITS``,
sum over the row) and unpack with the same shift-and-mask. They are written out in each kernel, not
called as a shared ``@triton.jit`` helper: the interpreter re-patches ``triton.language`` on every
nested call, which made the tests about a third slower.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096
NUM_WARPS = 8


@triton.jit
def _pack_kernel(codes_ptr, out_ptr, numel, num_bytes, BITS: tl.constexpr, BLOCK: tl.constexpr):
    PER: tl.constexpr = 8 // BITS
    rows_R = tl.program_id(0) * (BLOCK // PER) + tl.arange(0, BLOCK // PER)
    cols_P = tl.arange(0, PER)
    offs_R_P = rows_R[:, None] * PER + cols_P[None, :]
    codes_R_P = tl.load(codes_ptr + offs_R_P, mask=offs_R_P < numel, other=0).to(tl.int32)
    fields_R_P = (codes_R_P & ((1 << BITS) - 1)) << (cols_P[None, :] * BITS)
    tl.store(out_ptr + rows_R, tl.sum(fields_R_P, axis=1).to(tl.uint8), mask=rows_R < num_bytes)


@triton.jit
def _unpack_kernel(packed_ptr, out_ptr, numel, BITS: tl.constexpr, BLOCK: tl.constexpr):
    PER: tl.constexpr = 8 // BITS
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    byte = tl.load(packed_ptr + offs // PER, mask=mask, other=0).to(tl.int32)
    codes = (byte >> ((offs % PER) * BITS)) & ((1 << BITS) - 1)
    tl.store(out_ptr + offs, codes.to(tl.uint8), mask=mask)


def pack_bits(codes_N: torch.Tensor, bits: int) -> torch.Tensor:
    """Flat contiguous uint8 codes -> packed bytes (arguments checked by the caller)."""
    numel = codes_N.numel()
    num_bytes = -(-numel // (8 // bits))
    out_M = torch.empty(num_bytes, dtype=torch.uint8, device=codes_N.device)
    if numel:
        grid = (triton.cdiv(numel, BLOCK),)
        _pack_kernel[grid](codes_N, out_M, numel, num_bytes, BITS=bits, BLOCK=BLOCK, num_warps=NUM_WARPS)
    return out_M


def unpack_bits(packed_M: torch.Tensor, bits: int, numel: int) -> torch.Tensor:
    """Packed bytes -> ``numel`` uint8 codes (arguments checked by the caller)."""
    out_N = torch.empty(numel, dtype=torch.uint8, device=packed_M.device)
    if numel:
        grid = (triton.cdiv(numel, BLOCK),)
        _unpack_kernel[grid](packed_M, out_N, numel, BITS=bits, BLOCK=BLOCK, num_warps=NUM_WARPS)
    return out_N
