"""Identity: the uncompressed fp32 (or native dtype) baseline."""

from __future__ import annotations

from torch import Tensor

from .base import Compressor, CompressorRNG, Payload


class Identity(Compressor):
    """No compression. Linear, unbiased, no RNG. Bits on wire: 8 * element_size * numel."""

    name = "identity"
    linear = True
    unbiased = True
    fixed_size = True
    elementwise = True

    def compress(self, x: Tensor, rng: CompressorRNG) -> Payload:
        return Payload(wire={"values": x.reshape(-1)}, shape=x.shape, dtype=x.dtype)

    def decompress(self, payload: Payload) -> Tensor:
        return payload.wire["values"].to(payload.dtype).reshape(payload.shape)
