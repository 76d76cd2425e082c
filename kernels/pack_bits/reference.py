"""Pure-torch reference for ``pack_bits`` / ``unpack_bits``.

Layout: codes of ``bits`` bits (1, 2, 4 or 8), ``P = 8 // bits`` codes per byte, little-endian within
a byte: code ``i`` sits in bits ``(i % P) * bits .. (i % P) * bits + bits - 1`` of byte ``i // P``.
The last byte is zero-padded. Codes are masked to their low ``bits`` bits first, so an out-of-range
code never spills into its neighbours (the Triton kernel does the same).

Shape legend: N codes, P codes per byte, M = ceil(N / P) packed bytes, W rows (workers).
"""

from __future__ import annotations

import sys

import torch

ALLOWED_BITS: tuple[int, ...] = (1, 2, 4, 8)


def codes_per_byte(bits: int, allowed: tuple[int, ...] = ALLOWED_BITS) -> int:
    """``8 // bits``, after checking that ``bits`` is one of ``allowed``."""
    if bits not in allowed:
        raise ValueError(f"bits must be one of {list(allowed)}, got {bits!r}")
    return 8 // bits


def num_packed_bytes(numel: int, bits: int) -> int:
    per_byte = codes_per_byte(bits)
    return -(-numel // per_byte)


def pack_bits(codes_N: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack flat uint8 codes into ``ceil(N / P)`` bytes; codes are masked to their low ``bits`` bits."""
    codes_per_byte(bits)
    codes_N = codes_N.reshape(-1)
    if bits == 8:
        return codes_N.clone()
    return pack_codes(codes_N & ((1 << bits) - 1), bits)


# The P codes of one byte, read as one little-endian P-byte integer.
_WORD_DTYPES = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def pack_codes(codes_N: torch.Tensor, bits: int) -> torch.Tensor:
    """``pack_bits`` for codes already known to be < 2**bits (no masking pass).

    The P codes of an output byte are P adjacent bytes, i.e. one little-endian P-byte word with
    code j at bit 8 * j. Folding the word onto itself, ``w |= w >> (8 - bits) * 2**i`` for
    i = 0 .. log2(P) - 1, moves code j to bit ``bits * j``: all P codes end in the low byte, and
    no other bit reaches it. That is 2 * log2(P) integer ops on N / P words instead of P shifts
    and ORs on strided bytes: measured 1.3-5x faster on CPU than the straightforward loop.
    """
    per_byte = codes_per_byte(bits)
    if per_byte == 1:
        return codes_N.reshape(-1).clone()
    if sys.byteorder != "little":
        raise NotImplementedError("pack_codes reads codes as little-endian words")
    numel = codes_N.numel()
    num_pad = -numel % per_byte
    if num_pad or codes_N.storage_offset() % per_byte or not codes_N.is_contiguous():
        codes_N = torch.cat([codes_N.reshape(-1), codes_N.new_zeros(num_pad)])
    words_M = codes_N.view(_WORD_DTYPES[per_byte])
    shift = 8 - bits
    for _ in range(per_byte.bit_length() - 1):  # log2(P) folds
        words_M = words_M | (words_M >> shift)
        shift *= 2
    return words_M.to(torch.uint8)  # keeps the low byte (integer conversion wraps modulo 256)


def unpack_bits(packed_M: torch.Tensor, bits: int, numel: int) -> torch.Tensor:
    """Inverse of ``pack_bits``: ``[..., M]`` bytes to ``[..., numel]`` uint8 codes.

    Leading dimensions (e.g. one row per worker) are kept.
    """
    per_byte = codes_per_byte(bits)
    shifts_P = torch.arange(0, 8, bits, dtype=torch.uint8, device=packed_M.device)
    codes_M_P = packed_M.unsqueeze(-1) >> shifts_P
    if bits < 8:
        codes_M_P = codes_M_P & ((1 << bits) - 1)
    codes = codes_M_P.flatten(-2)
    assert codes.shape[-1] == packed_M.shape[-1] * per_byte
    return codes[..., :numel].contiguous()


# One dtype as wide as a table row, by its width in bytes (bit patterns are only copied, never
# computed on).
_ROW_DTYPES = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.float64, 16: torch.complex128}


def lookup_bytes(table_256_P: torch.Tensor, packed_M: torch.Tensor) -> torch.Tensor:
    """``table[packed]`` for a contiguous ``[256, P]`` table: ``[..., M]`` bytes -> ``[..., M * P]``.

    Decodes packed payloads with one gather per byte. Each row is gathered as a single element as
    wide as the row (``P`` fp32 values: 4, 8 or 16 bytes; ``P`` int8 values: 1, 2 or 4 bytes) by a
    1-D ``index_select``, which measured 4-10x faster on CPU than gathering ``[256, P]`` rows.
    """
    return gather_rows(table_256_P, packed_M.to(torch.int32))


def gather_rows(table_T_P: torch.Tensor, index_M: torch.Tensor) -> torch.Tensor:
    """``table[index]`` for a contiguous ``[T, P]`` table and int32 indices: ``[..., M]`` ->
    ``[..., M * P]``, each row gathered as one element as wide as the row (see :func:`lookup_bytes`)."""
    per_row = table_T_P.shape[1]
    rows_T = table_T_P.view(_ROW_DTYPES[per_row * table_T_P.element_size()]).view(-1)
    values = rows_T.index_select(0, index_M.reshape(-1))
    return values.view(table_T_P.dtype).view(*index_M.shape[:-1], index_M.shape[-1] * per_row)
