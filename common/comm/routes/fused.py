"""The fused route: a bucket compressed in a fixed number of launches, no host read.

Where the compressor :meth:`~common.compressors.base.Compressor.fuses` and the route is on (by
default on CUDA tensors; ``GradientSync(fused=True)`` anywhere, ``False`` never), a bucket is one
unit whose tensors are the segments of :mod:`common.compressors.segments`: compensated in one
pass (error feedback keeps one flat residual per bucket), compressed with each tensor's own
semantics in one call, sent in one collective, decoded in one call. Per-tensor quantities (a
scaler, a norm, a threshold, a block's offset, a count) stay tensors on the device; what the host
needs (the payload sizes an all-gather exchanges) follows from the layout, never from the data.
The plain route (:mod:`.plain`) sends such a bucket as one step (:meth:`FusedRoute.compress`,
:meth:`FusedRoute.finish`); the scaled-codes route (:mod:`.scaled_codes`) hands it to
:meth:`FusedRoute.reduce_scaled_async`.

TernGrad's route (``needs.scaled_codes``) returns a chain of futures, as PyTorch's PowerSGD hook
does: the max all-reduce of the scalers, then the codes' collective, then the decoding. The codes'
round is launched from the caller's thread once the scalers' round is complete, as the low-rank
route's second round (:meth:`FusedRoute.reduce_scaled_async`): at once on NCCL, whose futures
complete when enqueued, so a DDP hook returns at once; on gloo after waiting for the scalers.
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.distributed as dist
from torch import Tensor
from torch.futures import Future

from ...compressors.base import Payload
from ...compressors.segments import SegmentDraws, Segments
from ..collectives import all_gather_variable_async, get_rank, get_world_size
from .base import RouteHost, Step, code_route, done, fused_enabled


class FusedRoute:
    """The fused route of one :class:`~common.comm.sync.GradientSync` (its layouts, by bucket)."""

    def __init__(self, sync: RouteHost) -> None:
        self.sync = sync
        self._layouts: dict[tuple[Any, ...], Segments] = {}

    def layout(self, names: Any, flat: Tensor, sizes: Any) -> Segments | None:
        """The segments of this bucket if the fused route serves it, else None (per tensor)."""
        sync, compressor = self.sync, self.sync.compressor
        if not fused_enabled(sync.fused, flat.device) or compressor.elementwise or not compressor.fuses():
            return None
        if compressor.needs.dense_tensors and any(
            compressor.keeps_fp32(n, z) for n, z in zip(names, sizes, strict=True)
        ):
            return None  # TernGrad's fp32 exceptions: the per-tensor route sends them densely
        if sync.compress_per_tensor:
            seg_names, seg_sizes = tuple(names), tuple(sizes)
        else:  # the bucket as one tensor: one segment, keyed as the per-tensor route keys the unit
            seg_names, seg_sizes = ("+".join(names),), (flat.numel(),)
        key = (seg_names, seg_sizes, flat.device)
        segments = self._layouts.get(key)
        if segments is None:
            segments = self._layouts[key] = Segments(seg_names, seg_sizes, flat.device)
        return segments

    def draws(self, segments: Segments) -> SegmentDraws:
        """This compression's randomness: per tensor, keyed by how many times it was compressed
        (``sync._draws``, the per-tensor route's counts: a checkpoint holds them)."""
        counts = self.sync._draws
        now = [counts.get(name, 0) for name in segments.names]
        for name, count in zip(segments.names, now, strict=True):  # host dict updates, no launch
            counts[name] = count + 1
        return SegmentDraws(segments, self.sync.seed, get_rank(self.sync.group), now)

    def compress(self, names: list[str], flat: Tensor, sizes: list[int], segments: Segments) -> Any:
        """Compensate, compress the whole bucket, and update the residual (what this rank sends
        is known now: the residual does not wait for the collective)."""
        sync = self.sync
        ef, compressor = sync.error_feedback, sync.compressor
        with sync.stats.phase("compress", flat.device):
            compensated = ef.compensate(names, flat, sizes, segments) if ef is not None else flat
            payload = compressor.compress_segments(compensated, segments, self.draws(segments))
            if ef is not None:
                sent = compressor.decode_segments_into([payload], torch.empty_like(compensated))
                ef.update(names, compensated, sent, sizes)
        return Step(names, sizes, flat, compensated, payload, None, fused=True)

    def finish(self, step: Any, gathered: list[Payload] | None) -> Tensor:
        """Decode the sum (or every rank's payload) into the bucket and divide by the world size."""
        sync = self.sync
        world = get_world_size(sync.group)
        with sync.stats.phase("decompress", step.flat.device):
            payloads = [step.payload] if gathered is None else gathered
            mean = sync.compressor.decode_segments_into(payloads, step.flat).view(-1).div_(world)
        if world > 1:
            sync.stats.dense_bits += step.flat.numel() * 32
        return mean

    # -- scaled codes (TernGrad): three rounds, chained -----------------------------------------

    def reduce_scaled_async(
        self, names: list[str], flat: Tensor, sizes: list[int], segments: Segments
    ) -> Future[Tensor]:
        """The mean of the bucket through TernGrad's route (module docstring), as a future."""
        sync = self.sync
        compressor: Any = sync.compressor
        ef, stats, world, device = sync.error_feedback, sync.stats, get_world_size(sync.group), flat.device
        with stats.phase("compress", device):
            compensated = ef.compensate(names, flat, sizes, segments) if ef is not None else flat
            own_S = compressor.scalers_segments(compensated, segments)
        draws = self.draws(segments)
        shared = compressor.needs.scaler_round == "max"
        agreed = _all_reduce_async(own_S.clone(), dist.ReduceOp.MAX, sync) if shared else done(own_S)
        route = code_route(compressor, world)
        kind = "int8-allreduce" if route == "allreduce" else "allgather"
        stats.routes[f"{compressor.name}-{kind}"] += len(segments)
        # the codes' round, launched by ``encode`` (a future holds tensors only)
        codes: list[Future[Any]] = []

        def encode(scaler_round: Future[Tensor]) -> Tensor:
            scalers_S = scaler_round.value()
            with stats.phase("compress", device):
                payload = compressor.compress_segments(
                    compensated, segments, draws, scaler=scalers_S if shared else None, own=own_S
                )
                if ef is not None:
                    sent = compressor.decode_segments_into([payload], torch.empty_like(compensated))
                    ef.update(names, compensated, sent, sizes)
            codes.append(_send_codes(compressor, payload, route, world, sync))
            return scalers_S

        def decode(code_round: Future[Any]) -> Tensor:
            received = code_round.value()
            with stats.phase("decompress", device):
                if route == "allreduce":
                    total = compressor.decode_sum_segments(received, scalers_S, segments, flat)
                else:
                    total = compressor.decode_segments_into(received, flat)
                mean = total.view(-1).div_(world)
            if world > 1:
                stats.dense_bits += flat.numel() * 32
            return mean

        # The codes' round is launched from this thread, as LowRankRoute.reduce_async launches its
        # second round: every rank then launches its collectives in the same order. NCCL completes
        # the scalers' future once enqueued (``encode`` runs here at once, the host waits for
        # nothing); gloo completes it on a worker thread, where a launch would race with the next
        # bucket's from here (and a wait inside it would hold the thread that other buckets'
        # collectives need: several buckets in flight deadlocked): there it is waited for first.
        if not agreed.done():
            agreed.wait()
        scalers_S = agreed.then(encode).wait()  # runs here and now; raises its error
        return cast(Future[Tensor], codes[0].then(decode))


def _send_codes(compressor: Any, payload: Any, route: str, world: int, sync: RouteHost) -> Future[Any]:
    """The codes' round: their int8 (int16 past 127 ranks) sum, or every rank's payload gathered."""
    if route == "allreduce":
        code_sum = compressor.codes(payload).to(torch.int8 if world <= 127 else torch.int16)
        return _all_reduce_async(code_sum, dist.ReduceOp.SUM, sync)
    keys, wire = list(payload.wire), list(payload.wire.values())
    gathering = all_gather_variable_async(wire, sizes_known=True, stats=sync.stats, group=sync.group)
    return gathering.then(
        lambda g: [payload.with_wire(dict(zip(keys, rank, strict=True))) for rank in g.value()]
    )


def _all_reduce_async(tensor: Tensor, op: Any, sync: RouteHost) -> Future[Tensor]:
    """An all-reduce in the background (counted in the stats), as a future of the tensor; at
    world size 1 nothing is sent and the future is done."""
    if get_world_size(sync.group) == 1:
        return done(tensor)
    work = dist.all_reduce(tensor, op=op, group=sync.group, async_op=True)
    assert work is not None
    sync.stats.add_call("all_reduce", tensor.numel() * tensor.element_size() * 8)
    return work.get_future().then(lambda _: tensor)
