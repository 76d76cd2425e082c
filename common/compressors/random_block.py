"""Random-block sparsification: one contiguous block per tensor, at a shared random offset.

Xu & Huang, ICML 2022 ("URSB", uniform random sparse block, in the authors' ``all_reducer.py``).
Legend: ``n`` the tensor's entries, ``K = ceil(density * n)`` the block length, ``offset`` in
[0, n) the block's first entry; the block wraps around the end of the flattened tensor::

    block = flat[offset : offset + K]  ++  flat[0 : max(0, offset + K - n)]

The offset is drawn from the *shared* generator, so every rank picks the same block for the same
tensor at the same step (GradientSync compresses the same tensors in the same order on every rank)
and no index crosses the wire: the compressor is linear, the blocks of all ranks are summed by a
dense all-reduce (ring compatible), and the bits on the wire are ``K * 8 * element_size``. Selecting
costs one random draw and a slice, no pass over the tensor; decompression writes the block into zeros
(``decompress_into`` zeroes only the rest of a reused buffer and copies the block).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .base import Compressor, CompressorRNG, Payload, check_density, check_out, num_kept


def block_offset(numel: int, rng: CompressorRNG) -> int:
    """The block's first entry, uniform in [0, numel), from the shared generator."""
    return rng.shared_below(numel)


class RandomBlock(Compressor):
    """One contiguous block of ``density * numel`` entries per tensor (wrapping), at an offset from
    the shared generator: linear, fixed size, no indices on the wire.

    ``scaled=True`` multiplies the block by n / K, which makes it unbiased (the offset is uniform,
    so every entry is in the block with probability K / n); ``scaled=False`` (default, as in the
    paper's code) is the biased variant meant for error feedback.
    """

    name = "random_block"
    linear = True
    fixed_size = True
    density: float

    def __init__(self, density: float, *, scaled: bool = False) -> None:
        self.density = check_density(density)
        self.scaled = bool(scaled)
        self.unbiased = self.scaled

    def compress(self, x: Tensor, rng: CompressorRNG) -> Payload:
        flat = x if x.dim() == 1 else x.reshape(-1)
        n = flat.numel()
        k = num_kept(n, self.density)
        offset = block_offset(n, rng)
        end = offset + k
        # the block wraps around the end of the tensor (narrow: a view, the cheapest slice)
        values = flat.narrow(0, offset, k) if end <= n else torch.cat([flat[offset:], flat[: end - n]])
        if self.scaled:
            values = values * (n / k)
        return Payload(wire={"values": values}, shape=x.shape, dtype=x.dtype, local={"offset": offset})

    def decompress(self, payload: Payload) -> Tensor:
        values = payload.wire["values"]
        n = payload.numel
        k = values.numel()
        offset = int(payload.local["offset"])
        out = torch.zeros(n, dtype=payload.dtype, device=values.device)
        end = offset + k
        if end <= n:
            out.narrow(0, offset, k).copy_(values)
        else:
            out.narrow(0, offset, n - offset).copy_(values[: n - offset])
            out.narrow(0, 0, end - n).copy_(values[n - offset :])
        return out.reshape(payload.shape)

    def decompress_into(self, payload: Payload, out: Tensor) -> Tensor:
        """Zero ``out`` outside the block, copy the block in: one pass over ``out``, no allocation.

        The wire values may *be* ``out``'s block (GradientSync all-reduces a view of the gradient
        in place when there is no error feedback): then only the complement is zeroed, and the
        copy of a block onto itself leaves it as it is. Otherwise the whole buffer is zeroed at
        once, which is faster than two partial fills (measured at 10^5 entries).
        """
        check_out(payload, out)
        values = payload.wire["values"]
        flat = out if out.dim() == 1 else out.view(-1)
        n = flat.numel()
        k = values.numel()
        offset = int(payload.local["offset"])
        end = offset + k
        start, size = flat.data_ptr(), flat.element_size()
        first = values.data_ptr()
        if end <= n and first == start + offset * size:
            flat.narrow(0, 0, offset).zero_()  # the values are out's own block: zero the rest
            flat.narrow(0, end, n - end).zero_()
            return out
        if first < start + n * size and start < first + k * values.element_size():
            values = values.clone()  # elsewhere in out's memory: keep them from the fill
        flat.zero_()
        if end <= n:
            flat.narrow(0, offset, k).copy_(values)
        else:  # wrapped: [offset, n) then [0, end - n)
            flat.narrow(0, offset, n - offset).copy_(values.narrow(0, 0, n - offset))
            flat.narrow(0, 0, end - n).copy_(values.narrow(0, n - offset, end - n))
        return out
