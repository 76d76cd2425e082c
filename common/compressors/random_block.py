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

from collections.abc import Sequence

import torch
from torch import Tensor

from .base import Compressor, CompressorRNG, Payload, check_density, check_flag, check_out, num_kept
from .segments import SegmentDraws, Segments, num_kept_table


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
        self.scaled = check_flag("scaled", scaled)
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

    # -- the fused path: every tensor's block of a bucket at once ----------------------------------

    def fuses(self) -> bool:
        return True

    def compress_segments(self, flat: Tensor, segments: Segments, draws: SegmentDraws) -> Payload:
        """Each tensor's block at an offset from ``draws``' shared stream (the same on every rank),
        gathered in one launch from positions computed on the device; scaled by ``n / K`` per
        tensor when ``scaled``. The same values as :meth:`compress` per tensor at the same offsets."""
        plan = segments.cached(("block-plan", self.density), lambda: _block_plan(segments, self.density))
        offsets_S = draws.integers_below(segments.lengths, "shared")
        wrapped_K = (offsets_S.index_select(0, plan.seg_K) + plan.step_K).remainder_(plan.size_K)
        positions_K = wrapped_K.add_(plan.start_K)
        values = flat.index_select(0, positions_K)
        if self.scaled:
            values = values * plan.scale_K.to(values.dtype)
        return Payload(
            wire={"values": values}, shape=flat.shape, dtype=flat.dtype,
            local={"segments": segments, "positions": positions_K, "offsets": offsets_S},
        )  # fmt: skip

    def decode_segments_into(self, payloads: Sequence[Payload], out: Tensor) -> Tensor:
        """Zero ``out`` and add each payload's blocks at their positions (positions never repeat)."""
        out_N = out.view(-1).zero_()
        for payload in payloads:  # ranks (one, summed, on the all-reduce route)
            out_N.index_add_(0, payload.local["positions"], payload.wire["values"].to(out.dtype))
        return out


class _BlockPlan:
    """Per kept slot of a layout: its segment, its step into the block, its tensor's size, first
    entry and scale n / K (built once per layout and density)."""

    def __init__(
        self, seg_K: Tensor, step_K: Tensor, size_K: Tensor, start_K: Tensor, scale_K: Tensor
    ) -> None:
        self.seg_K, self.step_K, self.size_K, self.start_K, self.scale_K = (
            seg_K,
            step_K,
            size_K,
            start_K,
            scale_K,
        )


def _block_plan(segments: Segments, density: float) -> _BlockPlan:
    kept = num_kept_table(segments, density)
    device = segments.device
    seg = torch.repeat_interleave(torch.arange(len(kept)), torch.tensor(kept))
    step = torch.cat([torch.arange(k) for k in kept])
    sizes = torch.tensor(segments.sizes).index_select(0, seg)
    starts = torch.tensor(segments.starts).index_select(0, seg)
    scales = torch.tensor([n / k for n, k in zip(segments.sizes, kept, strict=True)], dtype=torch.float32)
    return _BlockPlan(
        seg.to(device),
        step.to(device),
        sizes.to(device),
        starts.to(device),
        scales.index_select(0, seg).to(device),
    )
