"""Random-k sparsification: keep k entries chosen uniformly without replacement.

Legend: ``values_K`` the kept values, ``indices_K`` their flat positions, K = ceil(density * numel).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from kernels.segment_noise import tensor_noise

from .base import (
    Compressor,
    CompressorRNG,
    Payload,
    check_density,
    check_flag,
    check_out,
    index_dtype,
    num_kept,
)
from .decoders import scatter_sum_into
from .segments import SegmentDraws, Segments, num_kept_table
from .select import segmented_topk
from .topk import topk_of


class RandomK(Compressor):
    """Random-k (Stich et al. 2018; Wangni et al. 2018).

    ``scaled=True`` multiplies the kept values by numel / K, which makes the estimate unbiased;
    ``scaled=False`` is the biased variant meant for error feedback.

    ``shared_indices=True`` (default) draws the indices from the *shared* generator: every rank
    picks the same K positions, so the indices never cross the wire and the compressor is linear
    (a dense all-reduce of the K values). Bits on wire: K * 8 * element_size.
    ``shared_indices=False`` draws them from the *local* generator: indices are sent (int32) and the
    payloads must be all-gathered. Bits on wire: K * (8 * element_size + 32).
    """

    name = "randomk"
    fixed_size = True
    density: float

    def __init__(self, density: float, *, scaled: bool = True, shared_indices: bool = True) -> None:
        self.density = check_density(density)
        self.scaled = check_flag("scaled", scaled)
        self.shared_indices = check_flag("shared_indices", shared_indices)
        self.linear = self.shared_indices
        self.unbiased = self.scaled

    def compress(self, x: Tensor, rng: CompressorRNG) -> Payload:
        flat = x.reshape(-1)
        n = flat.numel()
        k = num_kept(n, self.density)
        generator = rng.shared if self.shared_indices else rng.local
        # the k largest of a hash priority per entry: a uniform k-subset, as randperm's first k
        # (its numbers until 2026-12-04), in two compiled passes on a CPU instead of a shuffle
        # of the whole tensor (ResNet-18's DDP step 1.91x a no-hook step with randperm)
        keys = torch.randint(0, 2**32, (2,), generator=generator, device=generator.device).tolist()
        priorities_N = tensor_noise(n, (keys[0], keys[1]), "priority", flat.device)
        indices_K = topk_of(priorities_N, k)
        values_K = flat[indices_K]
        if self.scaled:
            values_K = values_K * (n / k)
        if self.shared_indices:
            return Payload(
                wire={"values": values_K}, shape=x.shape, dtype=x.dtype, local={"indices": indices_K}
            )
        return Payload(
            wire={"values": values_K, "indices": indices_K.to(index_dtype(n))}, shape=x.shape, dtype=x.dtype
        )

    def decompress(self, payload: Payload) -> Tensor:
        indices = payload.local["indices"] if self.shared_indices else payload.wire["indices"]
        values = payload.wire["values"]
        out = torch.zeros(payload.numel, dtype=payload.dtype, device=values.device)
        out.index_add_(0, indices.long(), values.to(payload.dtype))
        return out.reshape(payload.shape)

    def decompress_into(self, payload: Payload, out: Tensor) -> Tensor:
        """Zero ``out`` and scatter the values in (a reused buffer: no allocation)."""
        check_out(payload, out)
        indices = payload.local["indices"] if self.shared_indices else payload.wire["indices"]
        out.view(-1).zero_().index_copy_(0, indices.long(), payload.wire["values"].to(out.dtype))
        return out

    # -- the fused path: every tensor's random k of a bucket at once -------------------------------

    def fuses(self) -> bool:
        return True

    def compress_segments(self, flat: Tensor, segments: Segments, draws: SegmentDraws) -> Payload:
        """Each tensor's K entries chosen uniformly without replacement: the K largest of a
        random number per entry (``draws``, shared or local stream), taken with ``segmented_topk``
        of a per-entry hash (:meth:`SegmentDraws.priorities`), as :meth:`compress` per tensor (its keys from
        the generators there).
        Wire: values (and int32 bucket positions unless ``shared_indices``)."""
        k = segments.cached(("kept", self.density), lambda: num_kept_table(segments, self.density))
        priority_N = draws.priorities("shared" if self.shared_indices else "local")
        indices_K, valid_K, inexact_S = segmented_topk(priority_N, segments, k)
        values_K = flat.index_select(0, indices_K.clamp(max=flat.numel() - 1))
        values_K = torch.where(valid_K, values_K, torch.zeros((), dtype=values_K.dtype, device=flat.device))
        if self.scaled:
            scale_S = segments.cached(
                ("randomk-scale", self.density),
                lambda: segments.host_table(
                    [n / kk for n, kk in zip(segments.sizes, k, strict=True)], torch.float32
                ),
            )
            seg_K = segments.cached(
                ("randomk-seg", self.density),
                lambda: torch.repeat_interleave(torch.arange(len(k)), torch.tensor(k)).to(segments.device),
            )
            values_K = values_K * scale_S.index_select(0, seg_K).to(values_K.dtype)
        local = {"segments": segments, "inexact": inexact_S}
        if self.shared_indices:
            return Payload(
                wire={"values": values_K},
                shape=flat.shape,
                dtype=flat.dtype,
                local={**local, "indices": indices_K},
            )
        wire = {"values": values_K, "indices": indices_K.to(torch.int32)}
        return Payload(wire=wire, shape=flat.shape, dtype=flat.dtype, local=local)

    def decode_segments_into(self, payloads: Sequence[Payload], out: Tensor) -> Tensor:
        if self.shared_indices:
            indices = payloads[0].local["indices"]
            payloads = [p.with_wire({"values": p.wire["values"], "indices": indices}) for p in payloads]
        return scatter_sum_into(payloads, out)
