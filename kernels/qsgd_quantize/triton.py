"""Triton kernels for bucketed QSGD quantization (layout and rounding: ``reference.py``).

``qsgd_quantize``: the per-bucket norms and scales ``s / n_b`` come from torch (one reduction over
v, shared with the reference so that the codes agree bit for bit); the kernel fuses the stochastic
rounding with the packing. Each program owns ``BLOCK`` elements as a ``[BLOCK // P, P]`` tile
(``P = 8 // bits`` codes per byte), reads v and the noise contiguously, gathers the bucket scale
(B floats, cached) and writes ``BLOCK / P`` bytes: 8 bytes read and ``bits / 8`` written per fp32
element. ``FUSED_RNG`` replaces the noise load by ``tl.rand(seed, offset)`` (not bit-exact with the
reference; tested statistically).

``qsgd_dequantize_accumulate``: each program owns ``BLOCK`` outputs and loops over the W payloads,
accumulating ``±level * (n_b / s)`` in fp32 in worker order.

Launched with ``enable_fp_fusion=False`` so that ``|v| * scale + u`` and ``acc + level * unit`` are
rounded op by op, as torch does, not contracted into an FMA.
Block size: 4096 elements with 8 warps, 16 elements per thread; see ``kernels/pack_bits/triton.py``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096
NUM_WARPS = 8


@triton.jit
def _quantize_kernel(
    v_ptr,
    noise_ptr,
    seed_ptr,
    scales_ptr,
    out_ptr,
    numel,
    num_bytes,
    bucket_size,
    BITS: tl.constexpr,
    FUSED_RNG: tl.constexpr,
    BLOCK: tl.constexpr,
):
    PER: tl.constexpr = 8 // BITS
    S: tl.constexpr = (1 << (BITS - 1)) - 1
    rows_R = tl.program_id(0) * (BLOCK // PER) + tl.arange(0, BLOCK // PER)
    cols_P = tl.arange(0, PER)
    offs_R_P = rows_R[:, None] * PER + cols_P[None, :]
    mask_R_P = offs_R_P < numel
    v_R_P = tl.load(v_ptr + offs_R_P, mask=mask_R_P, other=0.0).to(tl.float32)
    if FUSED_RNG:
        u_R_P = tl.rand(tl.load(seed_ptr), offs_R_P)
    else:
        u_R_P = tl.load(noise_ptr + offs_R_P, mask=mask_R_P, other=0.0)
    scale_R_P = tl.load(scales_ptr + offs_R_P // bucket_size, mask=mask_R_P, other=0.0)
    x_R_P = tl.abs(v_R_P) * scale_R_P
    levels_R_P = tl.minimum(tl.floor(x_R_P + u_R_P), S).to(tl.int32)
    negative_R_P = (v_R_P < 0) & (levels_R_P > 0)
    codes_R_P = levels_R_P | (negative_R_P.to(tl.int32) << (BITS - 1))
    packed_R = tl.sum(codes_R_P << (cols_P[None, :] * BITS), axis=1)  # disjoint fields: sum = OR
    tl.store(out_ptr + rows_R, packed_R.to(tl.uint8), mask=rows_R < num_bytes)


@triton.jit
def _dequantize_accumulate_kernel(
    packed_ptr,
    units_ptr,
    out_ptr,
    numel,
    num_workers,
    bytes_per_worker,
    buckets_per_worker,
    bucket_size,
    BITS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    PER: tl.constexpr = 8 // BITS
    S: tl.constexpr = (1 << (BITS - 1)) - 1
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    buckets = offs // bucket_size
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    # Advance the row pointers instead of computing w * bytes_per_worker: W * bytes can pass 2**31.
    for _ in range(num_workers):
        byte = tl.load(packed_ptr + offs // PER, mask=mask, other=0).to(tl.int32)
        codes = (byte >> ((offs % PER) * BITS)) & ((1 << BITS) - 1)
        unit = tl.load(units_ptr + buckets, mask=mask, other=0.0)
        values = (codes & S).to(tl.float32) * unit
        acc += tl.where(codes > S, -values, values)
        packed_ptr += bytes_per_worker
        units_ptr += buckets_per_worker
    tl.store(out_ptr + offs, acc, mask=mask)


def qsgd_quantize(
    v_N: torch.Tensor,
    scales_B: torch.Tensor,
    bits: int,
    bucket_size: int,
    noise_N: torch.Tensor | None,
    seed: torch.Tensor | None,
) -> torch.Tensor:
    """Packed codes of flat contiguous ``v_N``; exactly one of ``noise_N`` / ``seed`` is given."""
    numel = v_N.numel()
    num_bytes = -(-numel // (8 // bits))
    out_M = torch.empty(num_bytes, dtype=torch.uint8, device=v_N.device)
    if numel == 0:
        return out_M
    fused_rng = noise_N is None
    random_src = seed if fused_rng else noise_N
    assert random_src is not None
    grid = (triton.cdiv(numel, BLOCK),)
    _quantize_kernel[grid](
        v_N,
        random_src,
        random_src,
        scales_B,
        out_M,
        numel,
        num_bytes,
        bucket_size,
        BITS=bits,
        FUSED_RNG=fused_rng,
        BLOCK=BLOCK,
        num_warps=NUM_WARPS,
        enable_fp_fusion=False,
    )
    return out_M


def qsgd_dequantize_accumulate(
    packed_W_M: torch.Tensor, units_W_B: torch.Tensor, numel: int, bits: int, bucket_size: int
) -> torch.Tensor:
    """fp32 sum of W payloads: contiguous ``[W, M]`` bytes, ``[W, B]`` level units ``n_b / s``."""
    out_N = torch.empty(numel, dtype=torch.float32, device=packed_W_M.device)
    if numel == 0:
        return out_N
    num_workers, bytes_per_worker = packed_W_M.shape
    grid = (triton.cdiv(numel, BLOCK),)
    _dequantize_accumulate_kernel[grid](
        packed_W_M,
        units_W_B,
        out_N,
        numel,
        num_workers,
        bytes_per_worker,
        units_W_B.shape[1],
        bucket_size,
        BITS=bits,
        BLOCK=BLOCK,
        num_warps=NUM_WARPS,
        enable_fp_fusion=False,
    )
    return out_N
