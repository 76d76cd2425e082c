"""Top-k sparsification: keep the k entries of largest magnitude.

Legend: ``values_K`` the kept values, ``indices_K`` their flat positions, K = ceil(density * numel).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .base import Compressor, CompressorRNG, Payload, check_density, check_out, index_dtype, num_kept


class TopK(Compressor):
    """Top-k by magnitude (Aji & Heafield 2017; the selection DGC, Lin et al. 2018, builds on).

    Biased (use with error feedback), not linear (each rank picks different indices: all-gather),
    no RNG. Bits on wire: K * (8 * element_size + 32) with int32 indices, K = ceil(density * numel).
    """

    name = "topk"
    linear = False
    unbiased = False
    fixed_size = True
    density: float

    def __init__(self, density: float) -> None:
        self.density = check_density(density)

    def compress(self, x: Tensor, rng: CompressorRNG) -> Payload:
        flat = x.reshape(-1)
        k = num_kept(flat.numel(), self.density)
        _, indices_K = torch.topk(flat.abs(), k, sorted=False)
        values_K = flat[indices_K]
        return Payload(
            wire={"values": values_K, "indices": indices_K.to(index_dtype(flat.numel()))},
            shape=x.shape,
            dtype=x.dtype,
        )

    def decompress(self, payload: Payload) -> Tensor:
        return self.aggregate([payload])

    def decompress_into(self, payload: Payload, out: Tensor) -> Tensor:
        """Zero ``out`` and scatter the values in (a reused buffer: no allocation)."""
        check_out(payload, out)
        values = payload.wire["values"]
        out.view(-1).zero_().index_copy_(0, payload.wire["indices"].long(), values.to(out.dtype))
        return out

    def aggregate(self, payloads: Sequence[Payload]) -> Tensor:
        first = payloads[0]
        values = first.wire["values"]
        out = torch.zeros(first.numel, dtype=first.dtype, device=values.device)
        for payload in payloads:
            out.index_add_(0, payload.wire["indices"].long(), payload.wire["values"].to(first.dtype))
        return out.reshape(first.shape)
