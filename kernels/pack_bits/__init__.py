"""Bit packing of 1-, 2-, 4- and 8-bit unsigned codes into bytes, and back.

Layout (shared by every packed payload in the project): ``P = 8 // bits`` codes per byte,
little-endian within a byte, code ``i`` in bits ``(i % P) * bits ..`` of byte ``i // P``; the last
byte is zero-padded. ``pack_bits`` keeps only the low ``bits`` bits of each code.
"""

from __future__ import annotations

import torch

from kernels._dispatch import Backend, check_numel, use_triton
from kernels.pack_bits import reference
from kernels.pack_bits.reference import ALLOWED_BITS, codes_per_byte, num_packed_bytes

__all__ = ["ALLOWED_BITS", "num_packed_bytes", "pack_bits", "unpack_bits"]


def pack_bits(codes: torch.Tensor, bits: int, *, backend: Backend = "auto") -> torch.Tensor:
    """Pack uint8 ``codes`` (any shape, read flat; values < 2**bits) into a 1-D uint8 tensor.

    Returns ``ceil(codes.numel() * bits / 8)`` bytes. Raises ``ValueError`` for a bit width other
    than 1, 2, 4, 8 or a non-uint8 input.
    """
    codes_per_byte(bits)
    if codes.dtype != torch.uint8:
        raise ValueError(f"codes must be uint8, got {codes.dtype}")
    check_numel(codes.numel(), "codes")
    codes_N = codes.reshape(-1).contiguous()
    if use_triton(backend, codes.device):
        from kernels.pack_bits import triton as triton_impl

        return triton_impl.pack_bits(codes_N, bits)
    return reference.pack_bits(codes_N, bits)


def unpack_bits(packed: torch.Tensor, bits: int, numel: int, *, backend: Backend = "auto") -> torch.Tensor:
    """Unpack the first ``numel`` codes of a 1-D uint8 byte tensor made by ``pack_bits``.

    ``packed`` must hold exactly ``ceil(numel * bits / 8)`` bytes.
    """
    codes_per_byte(bits)
    if packed.dtype != torch.uint8 or packed.dim() != 1:
        raise ValueError(
            f"packed must be a 1-D uint8 tensor, got {packed.dtype} of shape {tuple(packed.shape)}"
        )
    if numel < 0 or packed.numel() != num_packed_bytes(numel, bits):
        raise ValueError(
            f"{numel} codes of {bits} bits need {num_packed_bytes(max(numel, 0), bits)} bytes, "
            f"packed has {packed.numel()}"
        )
    check_numel(numel, "codes")
    packed_M = packed.contiguous()
    if use_triton(backend, packed.device):
        from kernels.pack_bits import triton as triton_impl

        return triton_impl.unpack_bits(packed_M, bits, numel)
    return reference.unpack_bits(packed_M, bits, numel)
