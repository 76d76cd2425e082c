"""The plain route: a compressor's payloads summed by an all-reduce or gathered from every rank.

A bucket is compressed whole on the fused route (:mod:`.fused`) where it serves, else unit by unit
(each tensor, or the flat bucket: :func:`~.base.compression_units`); every unit's wire tensors cross in one
collective per bucket (one all-reduce per wire dtype, or one variable-size all-gather), and each
unit is decompressed into its own slice of the bucket, the residual updated. The blocking route
times the collective as the ``communicate`` phase; the asynchronous one returns a future whose
callback decompresses, so that DDP overlaps the collective with the rest of the backward pass.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.futures import Future

from ...compressors.base import Payload
from ..collectives import all_gather_variable, all_gather_variable_async, all_reduce_sum_, get_world_size
from .base import RouteHost, Step, compression_units, done
from .fused import FusedRoute


@dataclass
class _Reduction:
    """One all-reduce over ``buffer``; calling it after completion copies a fused buffer back
    into the payload tensors it was made from."""

    buffer: Tensor
    tensors: list[Tensor]
    future: Future[list[Tensor]] | None

    def __call__(self) -> None:
        if len(self.tensors) > 1:
            for tensor, part in zip(
                self.tensors, self.buffer.split([t.numel() for t in self.tensors]), strict=True
            ):
                tensor.copy_(part)


class PlainRoute:
    """Compress, sum or gather the payloads, decompress: any compressor without rounds before its
    payload (``needs``), linear ones through an all-reduce (``host.use_allreduce``)."""

    def __init__(self, host: RouteHost, fused: FusedRoute) -> None:
        self.host = host
        self.fused = fused

    def reduce(self, names: list[str], flat: Tensor, sizes: list[int]) -> Tensor:
        steps = self.compress_units(names, flat, sizes)
        return self.finish_all(steps, self.send(steps), flat)

    def reduce_async(self, names: list[str], flat: Tensor, sizes: list[int]) -> Future[Tensor]:
        """The collective in the background, decompression in its callback (world size 1: done
        at once). ``communicate`` seconds are the time from launch to completion, overlap included."""
        if get_world_size(self.host.group) == 1:
            return done(self.reduce(names, flat, sizes))
        steps = self.compress_units(names, flat, sizes)
        return self.send_async(steps).then(lambda arrived: self.finish_all(steps, arrived.value(), flat))

    def tensor_by_tensor(self, names: list[str], like: Tensor, sizes: list[int]) -> bool:
        """Whether a bucket of these tensors is compressed each tensor on its own (not whole, not
        on the fused route): then :meth:`reduce_tensors_async` takes the tensors where they lie."""
        host = self.host
        per_tensor = len(names) == 1 or (host.compress_per_tensor and not host.compressor.elementwise)
        return per_tensor and self.fused.layout(names, like, sizes) is None

    def reduce_tensors_async(self, names: list[str], tensors: list[Tensor]) -> Future[list[Tensor]]:
        """Each of ``tensors`` (1-D and contiguous, e.g. views of a DDP bucket) compressed on its
        own, every payload in the bucket's one collective, each mean decoded into its own tensor:
        :meth:`reduce_async` of a bucket made of them (the same units, draws and collective), with
        no flat copy of the tensors and none of the means. Only where :meth:`tensor_by_tensor`."""
        steps = [self._compress([name], t, [t.numel()]) for name, t in zip(names, tensors, strict=True)]
        if get_world_size(self.host.group) == 1:
            return done(self.finish_into(steps, self.send(steps)))
        return self.send_async(steps).then(lambda arrived: self.finish_into(steps, arrived.value()))

    def send(self, steps: list[Step]) -> list[list[Payload] | None]:
        """The steps' payloads across the ranks, blocking (one collective per bucket): every
        rank's payloads per step (all-gather), or None per step (all-reduce: summed in place)."""
        host = self.host
        with host.stats.phase("communicate", steps[0].flat.device):
            if not host.use_allreduce:
                return list(all_gather_payloads(host, steps))
            for work in all_reduce_payloads(host, steps, async_op=False):
                work()
        return [None] * len(steps)

    def send_async(self, steps: list[Step]) -> Future[list[list[Payload] | None]]:
        """:meth:`send` in the background: a future of what it returns."""
        host = self.host
        start = time.perf_counter()
        if not host.use_allreduce:
            keys = [list(step.payload.wire) for step in steps]

            def arrived(gathering: Future[list[list[Tensor]]]) -> list[list[Payload] | None]:
                host.stats.add_seconds("communicate", time.perf_counter() - start)
                return list(split_gathered(steps, keys, gathering.value()))

            return gather_wire(host, steps, all_gather_variable_async).then(arrived)
        works = all_reduce_payloads(host, steps, async_op=True)

        def summed(_: Future[list[Future[list[Tensor]]]]) -> list[list[Payload] | None]:
            for work in works:
                work()  # copies a fused buffer back into the payloads
            host.stats.add_seconds("communicate", time.perf_counter() - start)
            return [None] * len(steps)

        return torch.futures.collect_all([w.future for w in works if w.future is not None]).then(summed)

    def compress_units(self, names: list[str], flat: Tensor, sizes: list[int]) -> list[Step]:
        """Compress a bucket: whole on the fused route where it serves, else unit by unit."""
        segments = self.fused.layout(names, flat, sizes)
        if segments is not None:
            return [self.fused.compress(list(names), flat, list(sizes), segments)]
        return [self._compress(*unit) for unit in compression_units(self.host, names, flat, sizes)]

    def _compress(self, names: list[str], flat: Tensor, sizes: list[int]) -> Step:
        host = self.host
        ef = host.error_feedback
        with host.stats.phase("compress", flat.device):
            compensated = ef.compensate(names, flat, sizes) if ef is not None else flat
            payload = host.compressor.compress(compensated, host.unit_rng(names, flat.device))
            # What this rank contributes, decoded locally; the residual is what it leaves out. A
            # sparsifier's is its (indices, values): the residual update then needs no dense
            # decompression (a bucket-sized fresh tensor: 30-35 ms at 11.2M entries, one core).
            sparse = self._sparse_sent(payload, flat, compensated) if ef is not None else None
            sent = (
                host.compressor.decompress_into(payload, ef.sent_buffer(names, compensated))
                if ef is not None and sparse is None
                else None
            )
            if sent is not None and host.use_allreduce:
                # The all-reduce sums in place: wire tensors that alias what the residual update
                # still reads (identity's wire *is* the compensated gradient) are copied first.
                keep = {compensated.untyped_storage().data_ptr(), sent.untyped_storage().data_ptr()}
                payload = payload.with_wire(
                    {
                        k: v.clone() if v.untyped_storage().data_ptr() in keep else v
                        for k, v in payload.wire.items()
                    }
                )
            divided = self._divide_on_wire(payload)
        return Step(names, sizes, flat, compensated, payload, sent, sparse, divided=divided)

    def _divide_on_wire(self, payload: Payload) -> bool:
        """Divide the wire values by the world size before the all-reduce, in place, where the
        compressor ``divides_on_wire`` (a cast: what PyTorch's fp16 hook does). The residual was
        taken from the undivided payload; a wire tensor that is the input gradient itself (an fp16
        gradient cast to fp16) is overwritten by the mean anyway."""
        host = self.host
        world = get_world_size(host.group)
        if not (host.use_allreduce and host.compressor.divides_on_wire and world > 1):
            return False
        for tensor in payload.wire.values():
            tensor.div_(world)
        return True

    def _sparse_sent(
        self, payload: Payload, flat: Tensor, compensated: Tensor
    ) -> tuple[Tensor, Tensor] | None:
        """The payload's sparse ``sent`` where the residual update can take it (the all-gather route,
        a flat compensated tensor of its own, in the values' dtype); None: decompress densely."""
        sparse = self.host.compressor.sparse_sent(payload)
        if sparse is None or self.host.use_allreduce:
            return None
        indices, values = sparse
        if (
            compensated.dim() != 1
            or not compensated.is_contiguous()
            or compensated.dtype != values.dtype
            or compensated.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()
            or indices.dtype not in (torch.int32, torch.int64)
        ):
            return None
        return sparse

    def finish_into(self, steps: list[Step], gathered: Sequence[list[Payload] | None]) -> list[Tensor]:
        """Decompress each step into its own ``flat`` (copied there where a decoder could not
        write it itself); returns those tensors."""
        for step, g in zip(steps, gathered, strict=True):
            mean = self._finish(step, g)
            if mean.data_ptr() != step.flat.data_ptr():
                step.flat.copy_(mean)
        return [step.flat for step in steps]

    def finish_all(self, steps: list[Step], gathered: Sequence[list[Payload] | None], flat: Tensor) -> Tensor:
        means = [self._finish(step, g) for step, g in zip(steps, gathered, strict=True)]
        if len(means) == 1:
            return means[0]
        if all(m.data_ptr() == step.flat.data_ptr() for m, step in zip(means, steps, strict=True)):
            return flat  # every unit's mean was written into its own slice of the input
        return torch.cat(means)

    def _finish(self, step: Step, gathered: list[Payload] | None) -> Tensor:
        """Decompress (the sum, or every rank's payload), divide by the world size, update the
        residual."""
        if step.fused:
            return self.fused.finish(step, gathered)
        host = self.host
        world = get_world_size(host.group)
        with host.stats.phase("decompress", step.flat.device):
            # The summed payload (or every rank's) decompressed straight into the input
            # (reduce_flat may overwrite it), which the residual update does not read
            # (``compensated`` and ``sent`` are their own tensors): no fresh dense tensor per call.
            if gathered is None:
                total = host.compressor.decompress_into(step.payload, step.flat)
            else:
                total = host.compressor.aggregate_into(gathered, step.flat)
            # In place: ``total`` is the input, the summed wire buffer or a fresh decompression,
            # never a tensor the residual update still reads (those were copied before the
            # all-reduce). Saves a bucket-sized allocation and pass (~25% of a 2 MiB bucket's sync
            # time, measured).
            total = total.reshape(-1).to(step.flat.dtype)
            mean = total if step.divided else self._divided(total, gathered, world)
            ef = host.error_feedback
            if ef is not None and step.sparse is not None:
                indices, values = step.sparse
                ef.update_sparse(step.names, step.compensated, indices, values, step.sizes)
            elif ef is not None:
                assert step.sent is not None
                ef.update(step.names, step.compensated, step.sent, step.sizes)
        if world > 1:
            host.stats.dense_bits += step.flat.numel() * 32
        return mean

    def _divided(self, total: Tensor, gathered: list[Payload] | None, world: int) -> Tensor:
        """``total / world``, in place. A sparsifier's gathered sum is +0 but at its payloads'
        positions (``Compressor.sparse_sent``), and +0 / world is +0: only those positions are
        divided, the same values without a pass over the tensor (world x k entries, not N)."""
        sparse = [self.host.compressor.sparse_sent(p) for p in gathered] if gathered is not None else []
        if not sparse or any(s is None for s in sparse):
            return total.div_(world)
        positions = torch.cat([s[0] for s in sparse if s is not None]).long()
        return total.index_put_((positions,), total.index_select(0, positions).div_(world))


def all_reduce_payloads(host: RouteHost, steps: list[Step], *, async_op: bool) -> list[_Reduction]:
    """Sum every payload's wire tensors over ranks: one all-reduce per dtype, the tensors of
    one dtype fused into one buffer when there are several."""
    by_dtype: dict[torch.dtype, list[Tensor]] = {}
    for step in steps:
        for tensor in step.payload.wire.values():
            by_dtype.setdefault(tensor.dtype, []).append(tensor)
    reductions = []
    for tensors in by_dtype.values():
        buffer = tensors[0] if len(tensors) == 1 else torch.cat(tensors)
        if not async_op:
            all_reduce_sum_(buffer, stats=host.stats, group=host.group)
            reductions.append(_Reduction(buffer, tensors, None))
            continue
        work = dist.all_reduce(buffer, op=dist.ReduceOp.SUM, group=host.group, async_op=True)
        assert work is not None
        host.stats.add_call("all_reduce", buffer.numel() * buffer.element_size() * 8)
        reductions.append(_Reduction(buffer, tensors, work.get_future()))
    return reductions


def all_gather_payloads(host: RouteHost, steps: list[Step]) -> list[list[Payload]]:
    """Every rank's payloads, all of a bucket's wire tensors in one (variable-size) all-gather."""
    keys = [list(step.payload.wire) for step in steps]
    return split_gathered(steps, keys, gather_wire(host, steps, all_gather_variable))


def gather_wire(host: RouteHost, steps: list[Step], gather: Any) -> Any:
    """``gather`` (blocking or not) of every step's wire tensors, in order, in one collective."""
    return gather(
        [t for step in steps for t in step.payload.wire.values()],
        # a fused payload's sizes follow from the bucket's layout, whatever the compressor
        sizes_known=host.compressor.fixed_size or all(step.fused for step in steps),
        stats=host.stats,
        group=host.group,
    )


def split_gathered(
    steps: list[Step], keys: list[list[str]], per_rank: list[list[Tensor]]
) -> list[list[Payload]]:
    """``per_rank[r]``: rank r's wire tensors of every step, in order -> each step's payloads."""
    gathered: list[list[Payload]] = [[] for _ in steps]
    for tensors in per_rank:
        offset = 0
        for i, step in enumerate(steps):
            wire = dict(zip(keys[i], tensors[offset : offset + len(keys[i])], strict=True))
            gathered[i].append(step.payload.with_wire(wire))
            offset += len(keys[i])
    return gathered
