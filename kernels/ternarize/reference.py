"""Pure-torch reference for ``ternarize`` and ``ternary_decode_accumulate`` (TernGrad).

Op: ``code_i = sign(g_i) * b_i`` with ``b_i = 1`` iff ``u_i * s < |g_i|`` for uniform ``u_i`` in
[0, 1), i.e. ``P(b_i = 1) = min(|g_i| / s, 1)``: unbiased, ``E[s * code] = g`` when ``|g| <= s``, and
entries with ``|g| >= s`` become ``±s`` (TernGrad's implicit clipping). The comparison is written as a
product, not ``u < |g| / s``, because Triton's fp32 division on CUDA is approximate: with the same
``u`` both backends give the same codes bit for bit. ``s`` is per tensor or per bucket.

Layout: 2-bit codes ``0 -> 0, +1 -> 1, -1 -> 2`` (3 is never written and decodes to 0), packed four
per byte little-endian (``kernels.pack_bits``): element i in bits ``2 * (i % 4)`` of byte ``i // 4``.

Shape legend: N elements, M = ceil(N / 4) bytes, B buckets, W workers.
"""

from __future__ import annotations

import functools

import torch

from kernels._buckets import mul_by_bucket, sum_in_worker_order
from kernels.pack_bits import reference as pack_ref


def ternary_codes(
    g_N: torch.Tensor, scaler_B: torch.Tensor, bucket_size: int, noise_N: torch.Tensor
) -> torch.Tensor:
    """Unpacked uint8 2-bit codes of the stochastic ternarization."""
    g_N = g_N.to(torch.float32)
    keep_N = mul_by_bucket(noise_N, scaler_B, bucket_size) < g_N.abs()
    # 1 << 0 = 1 for g > 0, 1 << 1 = 2 for g < 0, 0 where not kept (bool viewed as 0 / 1 bytes).
    # The sign bit rather than g < 0 (a quarter faster on CPU): they differ on -0.0 and NaN only,
    # which are never kept.
    return keep_N.view(torch.uint8) << torch.signbit(g_N).view(torch.uint8)


def ternarize(
    g_N: torch.Tensor, scaler_B: torch.Tensor, bucket_size: int, noise_N: torch.Tensor
) -> torch.Tensor:
    """Packed ternary codes ``[M]`` of flat ``g_N`` with fp32 scalers ``[B]`` and fp32 noise ``[N]``."""
    return pack_ref.pack_codes(ternary_codes(g_N, scaler_B, bucket_size, noise_N), 2)


@functools.cache
def byte_to_ternary(device: torch.device) -> torch.Tensor:
    """``[256, 4]`` fp32 table: the four ternary values {-1, 0, 1} coded in each byte (3 -> 0)."""
    all_bytes = torch.arange(256, dtype=torch.uint8, device=device)
    codes_256_4 = pack_ref.unpack_bits(all_bytes, 2, 1024).view(256, 4)
    return (codes_256_4 & 1).to(torch.float32) - (codes_256_4 >> 1).to(torch.float32)


#: Up to this many workers sharing one scaler s, ``s * (t_0 + ... + t_{W-1})`` (an integer sum,
#: one rounding) equals the worker-order fp32 sum: its partial sums ``s * k`` with ``|k| <= 2`` are
#: exact (``2 s`` is), so only the last addition rounds, to ``round(s * K)``. From 4 on a partial
#: ``round(3 s) + s`` may round differently from ``4 s``.
EXACT_CODE_SUM_WORKERS = 3


def _one_scaler(scalers_W_B: torch.Tensor) -> torch.Tensor | None:
    """The 0-dim scaler every payload shares (per tensor, on a CPU, at most
    ``EXACT_CODE_SUM_WORKERS`` of them), if it is positive and small enough that ``4 s`` is finite;
    else None. On a CPU the comparison's host read is free."""
    num_workers, num_scalers = scalers_W_B.shape
    if not 2 <= num_workers <= EXACT_CODE_SUM_WORKERS or num_scalers != 1 or scalers_W_B.device.type != "cpu":
        return None
    s = scalers_W_B[0, 0]
    finite_max = torch.finfo(torch.float32).max / 4
    return s if bool((scalers_W_B == s).all() & (s > 0) & (s <= finite_max)) else None


@functools.cache
def byte_to_ternary_int8(device: torch.device) -> torch.Tensor:
    """:func:`byte_to_ternary` as int8."""
    return byte_to_ternary(device).to(torch.int8)


def ternary_decode_accumulate(
    packed_W_M: torch.Tensor, scalers_W_B: torch.Tensor, numel: int, bucket_size: int
) -> torch.Tensor:
    """``sum_w s_w * code_w`` as fp32 ``[N]``, accumulated worker by worker in order 0..W-1.

    The order is fixed (and matches the kernel), so both backends round identically. All payloads
    are decoded at once through a 256-entry byte table (one gather per byte, no unpacking pass).
    With one shared scaler (TernGrad's ``max_scalers``) and at most ``EXACT_CODE_SUM_WORKERS``
    payloads, the codes are summed as int8 and scaled once: the same values bit for bit (see the
    constant), at a quarter of the bytes gathered (ResNet-18's tensors at 2 workers on a CPU: 65 -> 34 ms).
    """
    shared = _one_scaler(scalers_W_B)
    if shared is not None:
        codes_W_N = pack_ref.lookup_bytes(byte_to_ternary_int8(packed_W_M.device), packed_W_M)[:, :numel]
        code_sum_N = codes_W_N[0] + codes_W_N[1]
        for w in range(2, codes_W_N.shape[0]):
            code_sum_N += codes_W_N[w]
        return code_sum_N.to(torch.float32).mul_(shared)
    table_256_4 = byte_to_ternary(packed_W_M.device)
    num_workers, num_scalers = scalers_W_B.shape
    if num_scalers == 1:
        # Per tensor: worker w's bytes index its own copy of the table scaled by s_w, whose entries
        # are the products s_w * value the elementwise multiply would make: the gather is that
        # multiply, without its pass over W x N values.
        tables_WT_4 = (scalers_W_B.reshape(-1, 1, 1) * table_256_4).reshape(num_workers * 256, 4)
        index_W_M = packed_W_M.to(torch.int32)
        if num_workers > 1:
            index_W_M += torch.arange(0, 256 * num_workers, 256, dtype=torch.int32, device=index_W_M.device)[
                :, None
            ]
        values_W_N = pack_ref.gather_rows(tables_WT_4, index_W_M)[:, :numel]
        if num_workers == 1 and scalers_W_B.device.type == "cpu" and bool(scalers_W_B[0, 0] > 0):
            return values_W_N[0]  # s > 0: no -0.0 for the kernel's 0.0 + v to turn into +0.0
        return sum_in_worker_order(values_W_N)
    values_W_N = pack_ref.lookup_bytes(table_256_4, packed_W_M)[:, :numel]
    # values are in {-1, 0, 1}: s * value is exact, so the product adds no rounding.
    mul_by_bucket(values_W_N, scalers_W_B, bucket_size, out=values_W_N)
    return sum_in_worker_order(values_W_N)


def ternary_values(packed_M: torch.Tensor, numel: int) -> torch.Tensor:
    """int8 values ``[numel]`` {-1, 0, +1} of packed codes (the unused code 3 as 0, as the decoder)."""
    codes_N = pack_ref.unpack_bits(packed_M, 2, numel)
    return (codes_N & 1).to(torch.int8) - (codes_N >> 1).to(torch.int8)


def scale_values(values_N: torch.Tensor, scaler: torch.Tensor) -> torch.Tensor:
    """fp32 ``values * scaler`` (integer values, a 0-dim fp32 scaler): a code sum decoded."""
    return values_N.to(torch.float32) * scaler
