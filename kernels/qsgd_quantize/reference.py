"""Pure-torch reference for bucketed QSGD quantization (Alistarh et al. 2017, practical variant).

Op, per bucket b of D consecutive elements with norm ``n_b`` (l2 or max, fp32) and ``s`` levels:
``level_i = min(floor(|v_i| * (s / n_b) + u_i), s)`` for uniform ``u_i`` in [0, 1), sign separate;
decoded value ``sign_i * level_i * (n_b / s)``. Unbiased (``E[floor(x + u)] = x``); the clamp only
acts when rounding pushes ``x + u`` up to ``s + 1``. ``s / n_b`` is one torch division per bucket,
so the kernel multiplies instead of dividing (Triton's fp32 division on CUDA is approximate) and both
backends round the same way; an all-zero bucket has scale 0 and all levels 0.

Layout: ``bits`` in {2, 4, 8}, ``s = 2**(bits-1) - 1`` levels; code = ``sign << (bits - 1) | level``
with sign 1 for a negative value of nonzero level (a zero level never carries a sign), packed
``8 // bits`` codes per byte little-endian (``kernels.pack_bits``). The norms travel beside the codes
as fp32 ``[B]``.

Shape legend: N elements, M packed bytes, D bucket size, B buckets, W workers.
"""

from __future__ import annotations

import functools

import torch

from kernels._buckets import bucket_norms, mul_by_bucket, sum_in_worker_order
from kernels.pack_bits import reference as pack_ref

ALLOWED_BITS: tuple[int, ...] = (2, 4, 8)


def num_levels(bits: int) -> int:
    """``s = 2**(bits - 1) - 1``: one bit for the sign, the rest for the level."""
    if bits not in ALLOWED_BITS:
        raise ValueError(f"bits must be one of {list(ALLOWED_BITS)}, got {bits!r}")
    return 2 ** (bits - 1) - 1


def level_scales(norms_B: torch.Tensor, bits: int) -> torch.Tensor:
    """``s / n_b`` per bucket, 0 where the norm is 0 (or so small that the scale overflows)."""
    return (num_levels(bits) / norms_B).nan_to_num_(posinf=0.0)


def level_units(norms_B: torch.Tensor, bits: int) -> torch.Tensor:
    """``n_b / s``: the value of one level in each bucket."""
    return norms_B / num_levels(bits)


def qsgd_codes(
    v_N: torch.Tensor, scales_B: torch.Tensor, bucket_size: int, noise_N: torch.Tensor, bits: int
) -> torch.Tensor:
    """Unpacked uint8 sign + level codes."""
    s = num_levels(bits)
    v_N = v_N.to(torch.float32)
    abs_N = v_N.abs()
    x_N = mul_by_bucket(abs_N, scales_B, bucket_size, out=abs_N)
    # min(floor(x + u), s) = floor(min(x + u, s)) for integer s, and for x + u in [0, s] the
    # conversion's truncation is the floor. Via int8 (s <= 127): the float -> uint8 conversion has
    # no vectorised path on CPU and measured 10x slower.
    levels_N = x_N.add_(noise_N).clamp_(max=s).to(torch.int8).view(torch.uint8)
    # min(sign, level) is 1 exactly for a negative value of nonzero level: a zero level never
    # carries a sign. The sign bit, not v < 0 (a quarter faster on CPU): they differ on -0.0, whose
    # level is 0, and on NaN, which has no meaningful code either way.
    negative_N = torch.minimum(torch.signbit(v_N).view(torch.uint8), levels_N)
    return torch.add(levels_N, negative_N, alpha=1 << (bits - 1))


def qsgd_quantize(
    v_N: torch.Tensor, bits: int, bucket_size: int, norm: str, noise_N: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(packed [M], norms fp32 [B])`` of the flat tensor ``v_N`` with fp32 noise ``[N]``."""
    norms_B = bucket_norms(v_N, bucket_size, norm)
    codes_N = qsgd_codes(v_N, level_scales(norms_B, bits), bucket_size, noise_N, bits)
    return pack_ref.pack_codes(codes_N, bits), norms_B


@functools.cache
def byte_to_signed_levels(bits: int, device: torch.device) -> torch.Tensor:
    """``[256, P]`` fp32 table: the P signed levels ``±level`` coded in each byte."""
    s, per_byte = num_levels(bits), 8 // bits
    codes = pack_ref.unpack_bits(torch.arange(256, dtype=torch.uint8, device=device), bits, 256 * per_byte)
    levels = (codes & s).to(torch.float32)
    return torch.where(codes > s, -levels, levels).view(256, per_byte)


def qsgd_dequantize_accumulate(
    packed_W_M: torch.Tensor, norms_W_B: torch.Tensor, numel: int, bits: int, bucket_size: int
) -> torch.Tensor:
    """fp32 ``sum_w decode(payload_w)``, accumulated in worker order 0..W-1 (as the kernel does).

    All payloads are decoded at once through a 256-entry byte table of signed levels, then
    multiplied by their bucket's unit ``n_b / s``: ``(-l) * u == -(l * u)`` in IEEE arithmetic, so
    this rounds exactly like the kernel's ``±(level * unit)``. Products and sums are separate ops
    (no FMA).
    """
    table_256_P = byte_to_signed_levels(bits, packed_W_M.device)
    values_W_N = pack_ref.lookup_bytes(table_256_P, packed_W_M)[:, :numel]
    mul_by_bucket(values_W_N, level_units(norms_W_B, bits), bucket_size, out=values_W_N)
    return sum_in_worker_order(values_W_N)
