"""Half-precision casts: fp16 and bf16.

Linear (sums of half-precision payloads are half-precision payloads; the all-reduce sums in the
half dtype, as PyTorch's ``fp16_compress_hook`` does), deterministic round-to-nearest and therefore
biased (by at most half an ulp per entry), no RNG. Bits on wire: 16 * numel.

Through an all-reduce each rank sends its half-precision gradient divided by the world size
(``divides_on_wire``), and the sum that arrives is the mean, cast back into the gradient: the
arithmetic of PyTorch's ``fp16_compress_hook``, bit for bit (a test compares the two hooks), with
one pass over the fp32 gradient after the collective instead of two (a cast, then a division).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from .base import Compressor, CompressorRNG, Payload, check_out


class _Cast(Compressor):
    wire_dtype: ClassVar[torch.dtype]
    linear = True
    unbiased = False
    fixed_size = True
    elementwise = True
    divides_on_wire = True

    def compress(self, x: Tensor, rng: CompressorRNG) -> Payload:
        return Payload(wire={"values": x.reshape(-1).to(self.wire_dtype)}, shape=x.shape, dtype=x.dtype)

    def decompress(self, payload: Payload) -> Tensor:
        return payload.wire["values"].to(payload.dtype).reshape(payload.shape)

    def decompress_into(self, payload: Payload, out: Tensor) -> Tensor:
        """Cast the wire values straight into ``out`` (one pass, no fp32 temporary)."""
        check_out(payload, out)
        out.view(-1).copy_(payload.wire["values"])
        return out


class FP16(_Cast):
    """IEEE half precision (5-bit exponent: overflows above 65504; fine for averaged gradients)."""

    name = "fp16"
    wire_dtype = torch.float16


class BF16(_Cast):
    """bfloat16 (fp32's exponent range, 8-bit mantissa)."""

    name = "bf16"
    wire_dtype = torch.bfloat16
