"""Triton kernels for ``ternarize`` and ``ternary_decode_accumulate`` (layout: ``reference.py``).

``ternarize``: each program owns ``BLOCK`` consecutive elements as a ``[BLOCK // 4, 4]`` tile, one
row per output byte, so gradient and noise are read with contiguous loads and the four 2-bit codes
of a byte are packed in registers (shift, sum over the row, as in ``kernels/pack_bits/triton.py``):
one pass, 4 + 4 bytes read and 1/4 byte written per fp32 element (2 + 4 for fp16). The scaler is
gathered per element (``offs // bucket_size``): B floats that stay in cache. With ``FUSED_RNG``
the noise comes from ``tl.rand(seed, offset)`` (Philox) instead of memory, saving 4 of the bytes
read; those numbers differ from ``torch.rand``, so that path is not bit-exact with the reference
(it is tested statistically).

``ternary_decode_accumulate``: each program owns ``BLOCK`` output elements and loops over the W
workers, accumulating ``s_w * code_w`` in fp32 registers in worker order (as the reference does).

Launched with ``enable_fp_fusion=False`` (no FMA contraction), like every kernel here that rounds.
Block size: 4096 elements with 8 warps, 16 elements per thread; see ``kernels/pack_bits/triton.py``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096
NUM_WARPS = 8


@triton.jit
def _ternarize_kernel(
    g_ptr,
    noise_ptr,
    seed_ptr,
    scaler_ptr,
    out_ptr,
    numel,
    num_bytes,
    bucket_size,
    FUSED_RNG: tl.constexpr,
    BLOCK: tl.constexpr,
):
    rows_R = tl.program_id(0) * (BLOCK // 4) + tl.arange(0, BLOCK // 4)
    cols_4 = tl.arange(0, 4)
    offs_R_4 = rows_R[:, None] * 4 + cols_4[None, :]
    mask_R_4 = offs_R_4 < numel
    g_R_4 = tl.load(g_ptr + offs_R_4, mask=mask_R_4, other=0.0).to(tl.float32)
    if FUSED_RNG:
        u_R_4 = tl.rand(tl.load(seed_ptr), offs_R_4)
    else:
        u_R_4 = tl.load(noise_ptr + offs_R_4, mask=mask_R_4, other=0.0)
    s_R_4 = tl.load(scaler_ptr + offs_R_4 // bucket_size, mask=mask_R_4, other=0.0)
    keep_R_4 = u_R_4 * s_R_4 < tl.abs(g_R_4)
    codes_R_4 = tl.where(keep_R_4, tl.where(g_R_4 < 0, 2, 1), 0)
    packed_R = tl.sum(codes_R_4 << (cols_4[None, :] * 2), axis=1)  # disjoint fields: sum = OR
    tl.store(out_ptr + rows_R, packed_R.to(tl.uint8), mask=rows_R < num_bytes)


@triton.jit
def _decode_accumulate_kernel(
    packed_ptr,
    scalers_ptr,
    out_ptr,
    numel,
    num_workers,
    bytes_per_worker,
    buckets_per_worker,
    bucket_size,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    buckets = offs // bucket_size
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    # Advance the row pointers instead of computing w * bytes_per_worker: W * bytes can pass 2**31.
    for _ in range(num_workers):
        byte = tl.load(packed_ptr + offs // 4, mask=mask, other=0).to(tl.int32)
        codes = (byte >> ((offs % 4) * 2)) & 3
        s = tl.load(scalers_ptr + buckets, mask=mask, other=0.0)
        acc += tl.where(codes == 1, s, tl.where(codes == 2, -s, 0.0))
        packed_ptr += bytes_per_worker
        scalers_ptr += buckets_per_worker
    tl.store(out_ptr + offs, acc, mask=mask)


def ternarize(
    g_N: torch.Tensor,
    scaler_B: torch.Tensor,
    bucket_size: int,
    noise_N: torch.Tensor | None,
    seed: torch.Tensor | None,
) -> torch.Tensor:
    """Packed codes of flat contiguous ``g_N``; exactly one of ``noise_N`` / ``seed`` is given."""
    numel = g_N.numel()
    num_bytes = -(-numel // 4)
    out_M = torch.empty(num_bytes, dtype=torch.uint8, device=g_N.device)
    if numel == 0:
        return out_M
    fused_rng = noise_N is None
    random_src = seed if fused_rng else noise_N
    assert random_src is not None
    grid = (triton.cdiv(numel, BLOCK),)
    _ternarize_kernel[grid](
        g_N,
        random_src,
        random_src,
        scaler_B,
        out_M,
        numel,
        num_bytes,
        bucket_size,
        FUSED_RNG=fused_rng,
        BLOCK=BLOCK,
        num_warps=NUM_WARPS,
        enable_fp_fusion=False,
    )
    return out_M


def ternary_decode_accumulate(
    packed_W_M: torch.Tensor, scalers_W_B: torch.Tensor, numel: int, bucket_size: int
) -> torch.Tensor:
    """fp32 ``sum_w s_w * code_w`` of contiguous ``[W, M]`` bytes and ``[W, B]`` scalers."""
    out_N = torch.empty(numel, dtype=torch.float32, device=packed_W_M.device)
    if numel == 0:
        return out_N
    num_workers, bytes_per_worker = packed_W_M.shape
    grid = (triton.cdiv(numel, BLOCK),)
    _decode_accumulate_kernel[grid](
        packed_W_M,
        scalers_W_B,
        out_N,
        numel,
        num_workers,
        bytes_per_worker,
        scalers_W_B.shape[1],
        bucket_size,
        BLOCK=BLOCK,
        num_warps=NUM_WARPS,
        enable_fp_fusion=False,
    )
    return out_N
