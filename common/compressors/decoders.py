"""Decoding shared by two compressor families, written into a reused buffer where it can be.

:class:`DenseDecoder`: payloads that a kernel decodes to fp32 (QSGD, TernGrad).
:class:`SparseCompressor`: ``{"values", "indices"}`` payloads scattered into zeros (top-k, DGC), and
:func:`scatter_sum_into` for the segmented sparse payloads of the fused path (top-k, random-k, DGC).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence

import torch
from torch import Tensor

from kernels.masked_compact import masked_scatter

from .base import Compressor, Payload, check_out


class DenseDecoder(Compressor):
    """A compressor whose payloads decode to fp32 with a kernel that can write a given tensor
    (QSGD, TernGrad): subclasses give ``_decode(payload, out)`` and ``_decode_all(payloads, out)``
    (``out`` None: a fresh flat fp32 tensor). ``decompress_into`` / ``aggregate_into`` then decode
    straight into ``out`` (no fresh tensor, no copy) where :func:`decodes_straight_into` allows,
    else take the default route (the same values)."""

    @abstractmethod
    def _decode(self, payload: Payload, out: Tensor | None = None) -> Tensor: ...

    @abstractmethod
    def _decode_all(self, payloads: Sequence[Payload], out: Tensor | None = None) -> Tensor: ...

    def decompress(self, payload: Payload) -> Tensor:
        return shaped(self._decode(payload), payload)

    def decompress_into(self, payload: Payload, out: Tensor) -> Tensor:
        check_out(payload, out)
        if not decodes_straight_into(out, [payload]):
            return super().decompress_into(payload, out)
        self._decode(payload, out)
        return out

    def aggregate(self, payloads: Sequence[Payload]) -> Tensor:
        """The payloads decoded in one pass, accumulated in fp32 in rank order."""
        return shaped(self._decode_all(payloads), payloads[0])

    def aggregate_into(self, payloads: Sequence[Payload], out: Tensor) -> Tensor:
        check_out(payloads[0], out)
        if not decodes_straight_into(out, payloads):
            return super().aggregate_into(payloads, out)
        self._decode_all(payloads, out)
        return out


class SparseCompressor(Compressor):
    """A compressor whose payload is ``{"values", "indices"}`` (flat positions, no repeats within
    one payload): top-k, DGC. Decoding scatters into zeros; into a reused buffer with
    ``decompress_into`` / ``aggregate_into``, as DGC's official code decodes into its reused
    gradient (issue 20 measured DGC's decode into a fresh tensor at 15 ms against the code's 3.6 ms
    at 10^7 entries; into a reused buffer it is 1.11x the code's, ``benchmarks/results/compressors.md``)."""

    def decompress(self, payload: Payload) -> Tensor:
        return self.aggregate([payload])

    def sparse_sent(self, payload: Payload) -> tuple[Tensor, Tensor]:
        return payload.wire["indices"], payload.wire["values"]

    def decompress_into(self, payload: Payload, out: Tensor) -> Tensor:
        """Zero ``out`` and scatter the values in (a reused buffer: no allocation)."""
        check_out(payload, out)
        values, indices = payload.wire["values"], payload.wire["indices"]
        out_N = (out if out.dim() == 1 else out.view(-1)).zero_()  # a view costs 1.6 us here
        if out.is_cpu and values.dtype == out.dtype == torch.float32 and indices.dtype == torch.int32:
            masked_scatter(values, indices, out_N)  # a compiled loop: no int64 copy of the indices
        else:
            out_N.index_copy_(0, indices.long(), values.to(out.dtype))
        return out

    def aggregate(self, payloads: Sequence[Payload]) -> Tensor:
        """Scatter-add every rank's (values, indices): the sum of the decompressions."""
        first = payloads[0]
        out = torch.zeros(first.numel, dtype=first.dtype, device=first.wire["values"].device)
        return self._scatter_add(payloads, out).reshape(first.shape)

    def aggregate_into(self, payloads: Sequence[Payload], out: Tensor) -> Tensor:
        """Zero ``out`` and scatter-add every rank's values in. The sum runs in the payloads'
        dtype as :meth:`aggregate`'s does: another ``out`` dtype takes the default route."""
        check_out(payloads[0], out)
        if out.dtype != payloads[0].dtype or not out.is_contiguous():
            return super().aggregate_into(payloads, out)
        self._scatter_add(payloads, out.view(-1).zero_())
        return out

    @staticmethod
    def _scatter_add(payloads: Sequence[Payload], out_N: Tensor) -> Tensor:
        for payload in payloads:
            out_N.index_add_(0, payload.wire["indices"].long(), payload.wire["values"].to(out_N.dtype))
        return out_N


def scatter_sum_into(payloads: Sequence[Payload], out: Tensor) -> Tensor:
    """Zero ``out`` and add every payload's ``values`` at its bucket positions ``indices``, in
    payload (rank) order: a segmented sparse payload's decoding (``index_add``; a slot a sampled
    threshold could not fill holds position ``N`` and the value 0, added to the last entry)."""
    out_N = out.view(-1).zero_()
    last = out_N.numel() - 1
    for payload in payloads:  # a loop over ranks, not tensors
        indices = payload.wire["indices"].clamp(max=last).long()
        out_N.index_add_(0, indices, payload.wire["values"].to(out.dtype))
    return out


def decodes_straight_into(out: Tensor, payloads: Sequence[Payload]) -> bool:
    """Whether a decoder may write ``out`` itself (``decompress_into``, ``aggregate_into``): fp32
    payloads into a contiguous fp32 ``out`` whose memory holds none of their wire tensors (the
    default route reads the wire first, then copies). Otherwise it takes the default route, which
    gives the same values (a decode in the payloads' dtype, copied)."""
    if out.dtype != torch.float32 or not out.is_contiguous() or payloads[0].dtype != torch.float32:
        return False
    memory = out.untyped_storage().data_ptr()
    return all(t.untyped_storage().data_ptr() != memory for p in payloads for t in p.wire.values())


def shaped(decoded_N: Tensor, payload: Payload) -> Tensor:
    """A flat fp32 decode in the payload's shape and dtype (no op where they already are: a view
    or a cast costs 2-4 us of Python, a tenth of a decode at 10^5 entries)."""
    if len(payload.shape) != 1:
        decoded_N = decoded_N.view(payload.shape)
    return decoded_N if payload.dtype == torch.float32 else decoded_N.to(payload.dtype)
