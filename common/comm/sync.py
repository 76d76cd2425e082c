"""GradientSync: compensate -> compress -> transport -> decompress -> update residual.

The one object every data-parallel method goes through, either called explicitly after
``backward()`` (``sync.sync(model.named_parameters())``) or installed as a DDP comm hook
(:mod:`common.comm.ddp_hook`): both call :meth:`GradientSync.reduce_flat`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.futures import Future

from ..compressors.base import Compressor, CompressorRNG, Payload, ScaledCodes
from ..feedback import ErrorFeedback
from .collectives import (
    ProcessGroup,
    all_gather_variable,
    all_gather_variable_async,
    all_reduce_max_,
    all_reduce_sum_,
    get_rank,
    get_world_size,
)
from .fused import FusedRoute
from .hierarchy import HostHierarchy
from .low_rank import BucketLayout, LayoutKey, reduce_low_rank, reduce_low_rank_async
from .route import Step, code_route
from .stats import CommStats

log = logging.getLogger(__name__)

TRANSPORTS = ("auto", "allreduce", "allgather")


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


@dataclass
class _ScaledStep:
    """One bucket on the scaled-codes route between encoding and decoding (unit i: ``units[i]``)."""

    units: list[tuple[list[str], Tensor, list[int]]]
    compensated: list[Tensor]
    dense: list[bool]  # sent uncompressed (the compressor keeps it in fp32)
    ternary: list[int]  # the encoded units, in order; scalers[j] belongs to units[ternary[j]]
    scalers: Tensor
    payloads: dict[int, Payload] = field(default_factory=dict)
    sent: dict[int, Tensor] = field(default_factory=dict)  # what each unit contributes, decoded locally
    summed: list[int] = field(default_factory=list)  # encoded units whose codes are all-reduced
    code_sum: Tensor | None = None
    dense_sum: Tensor | None = None
    gathered: dict[int, list[Payload]] = field(default_factory=dict)

    @property
    def dense_ids(self) -> list[int]:
        return [i for i, d in enumerate(self.dense) if d]


class GradientSync:
    """Averages gradients over ranks through a compressor, with optional error feedback.

    Args:
        compressor: any :class:`~common.compressors.Compressor`.
        error_feedback: ``True`` for a fresh :class:`ErrorFeedback`, or one to reuse, or ``False``.
        transport: ``"allreduce"`` (sums payloads; only for linear compressors), ``"allgather"``
            (every rank receives every payload and sums the decompressions), or ``"auto"``
            (all-reduce when the compressor is linear).
        bucket_numel: ``None`` compresses and communicates each tensor on its own; a number
            groups consecutive tensors of one dtype/device into flat buckets of at least that
            many entries, communicated in one collective.
        compress_per_tensor: with buckets, still compress each tensor of a bucket on its own
            (per-layer methods such as DGC and TernGrad specify it) but send the bucket's
            payloads together: one collective per bucket instead of one per tensor, the same
            result. ``False`` compresses the flat bucket as one tensor.
        seed: seeds the shared and per-rank generators handed to the compressor.
        group: process group (default: the world).
        stats: where bits, calls and phase times are added (a new :class:`CommStats` by default).
        fused: compress a bucket in a fixed number of launches with no host read, each tensor with
            its own semantics (:mod:`common.comm.fused`), where the compressor supports it:
            ``None`` (default) on CUDA tensors, ``True`` on any device, ``False`` never.

    Results are averages (sum / world size) written back into the gradients in place.
    """

    def __init__(
        self,
        compressor: Compressor,
        *,
        error_feedback: bool | ErrorFeedback = False,
        transport: str = "auto",
        bucket_numel: int | None = None,
        compress_per_tensor: bool = False,
        seed: int = 0,
        group: ProcessGroup = None,
        stats: CommStats | None = None,
        hierarchy: HostHierarchy | None = None,
        fused: bool | None = None,
    ) -> None:
        if transport not in TRANSPORTS:
            raise ValueError(f"unknown transport {transport!r}; valid transports: {', '.join(TRANSPORTS)}")
        if transport == "allreduce" and not compressor.linear:
            raise ValueError(
                f"compressor {compressor!r} is not linear: its payloads cannot be summed by an "
                "all-reduce. Use transport='allgather' (or 'auto')."
            )
        if compressor.needs.low_rank and transport != "auto":
            raise ValueError(
                f"compressor {compressor.name!r} runs its own two all-reduce rounds (needs.low_rank): "
                f"leave transport at 'auto', got {transport!r}"
            )
        if bucket_numel is not None and bucket_numel < 1:
            raise ValueError(f"bucket_numel must be None (per tensor) or >= 1, got {bucket_numel}")
        if fused is not None and not isinstance(fused, bool):
            raise ValueError(f"fused must be None (on CUDA), true or false, got {fused!r}")
        self.compressor = compressor
        if isinstance(error_feedback, ErrorFeedback):
            self.error_feedback: ErrorFeedback | None = error_feedback
        else:
            self.error_feedback = ErrorFeedback() if error_feedback else None
        self.use_allreduce = transport == "allreduce" or (transport == "auto" and compressor.linear)
        self.bucket_numel = bucket_numel
        self.compress_per_tensor = compress_per_tensor
        self.seed = seed
        if hierarchy is not None and group is not None:
            raise ValueError(
                "pass a process group or a host hierarchy (whose leaders form the group), not both"
            )
        # Hierarchical: the compressor runs between the hosts' leaders (common.comm.hierarchy).
        self.hierarchy = hierarchy
        self.group = hierarchy.inter if hierarchy is not None else group
        self.stats = stats if stats is not None else CommStats()
        self._rng: CompressorRNG | None = None
        # Times each unit (a tensor, or a flat bucket: its names joined) was compressed: its
        # generators restart from (name, count) every time (CompressorRNG.reseed), so draws are
        # keyed by parameter, not by the order DDP's buckets arrive in, and a resume is bit-exact.
        self._draws: dict[str, int] = {}
        self.param_names: dict[int, str] = {}
        # Tensor shapes by name (the low-rank route views each tensor as a matrix) and its
        # warm-started Q per unit (needs.low_rank: common.comm.low_rank).
        self.shapes: dict[str, torch.Size] = {}
        self.low_rank_q: dict[str, Tensor] = {}
        self.low_rank_layouts: dict[LayoutKey, BucketLayout] = {}  # its buffers, per bucket
        self._fp32_checked = False
        #: The fused route (common.comm.fused): None fuses buckets on CUDA, True anywhere, False never.
        self.fused = fused
        self._fused = FusedRoute(self)

    @property
    def transport(self) -> str:
        return "allreduce" if self.use_allreduce else "allgather"

    def rng(self, device: torch.device) -> CompressorRNG:
        """The generators, created on the gradients' device at first use."""
        if self._rng is None:
            self._rng = CompressorRNG(self.seed, get_rank(self.group), device)
        return self._rng

    def unit_rng(self, names: Sequence[str], device: torch.device) -> CompressorRNG:
        """The generators for one compression of the unit ``names``, restarted from its key."""
        key = "+".join(names)
        count = self._draws.get(key, 0)
        self._draws[key] = count + 1
        rng = self.rng(device)
        rng.reseed(f"{key}#{count}")
        return rng

    def name_parameters(self, module: nn.Module) -> None:
        """Remember parameter names (for residual keys) when only tensors are seen (DDP hook)."""
        self.param_names = {id(p): name for name, p in module.named_parameters()}
        self.shapes = {name: p.shape for name, p in module.named_parameters()}

    # -- the explicit path ------------------------------------------------------------------------

    def sync(self, named_tensors: Iterable[tuple[str, Tensor]], *, count_step: bool = True) -> None:
        """Average the given tensors (typically gradients) over ranks, in place; one step.

        ``count_step=False`` when several syncs share one :class:`CommStats` within a step (the
        step is counted once, by one of them)."""
        named = [(name, t) for name, t in named_tensors]
        self._check_fp32_layers([name for name, _ in named])
        if self.compressor.needs.low_rank:
            self.shapes.update((name, t.shape) for name, t in named)
        for bucket in self.buckets(named):
            names = [name for name, _ in bucket]
            tensors = [t for _, t in bucket]
            sizes = [t.numel() for t in tensors]
            flat = (
                tensors[0].reshape(-1) if len(tensors) == 1 else torch.cat([t.reshape(-1) for t in tensors])
            )
            mean = self.reduce_flat(names, flat, sizes)
            # back into the tensors in one launch (identity on one tensor reduces in place)
            pairs = [
                (t, part.view_as(t))
                for t, part in zip(tensors, mean.split(sizes), strict=True)
                if part.data_ptr() != t.data_ptr()
            ]
            if pairs:
                torch._foreach_copy_([t for t, _ in pairs], [part for _, part in pairs])
        if count_step:
            self.stats.steps += 1

    def sync_gradients(self, module: nn.Module) -> None:
        """Average the gradients of ``module``'s parameters (those that have one)."""
        self.sync((name, p.grad) for name, p in module.named_parameters() if p.grad is not None)

    def buckets(self, named: list[tuple[str, Tensor]]) -> list[list[tuple[str, Tensor]]]:
        """How :meth:`sync` groups ``named`` for one :meth:`reduce_flat` each: consecutive tensors
        of one dtype and device up to ``bucket_numel`` entries, or each on its own (``None``)."""
        if self.bucket_numel is None:
            return [[item] for item in named]
        buckets: list[list[tuple[str, Tensor]]] = []
        current: list[tuple[str, Tensor]] = []
        numel = 0
        for name, t in named:
            if current and (t.dtype != current[0][1].dtype or t.device != current[0][1].device):
                buckets.append(current)
                current, numel = [], 0
            current.append((name, t))
            numel += t.numel()
            if numel >= self.bucket_numel:
                buckets.append(current)
                current, numel = [], 0
        if current:
            buckets.append(current)
        return buckets

    # -- the shared core --------------------------------------------------------------------------

    def reduce_flat(self, names: Sequence[str], flat: Tensor, sizes: Sequence[int]) -> Tensor:
        """Mean over ranks of ``flat``, the concatenation of the tensors ``names`` (of ``sizes``).

        The input may be overwritten (an all-reduce works in place) and may be the result.
        """
        if self.hierarchy is not None:
            return self._reduce_across_hosts(names, flat, sizes)
        return self._reduce_flat(names, flat, sizes)

    def _reduce_across_hosts(self, names: Sequence[str], flat: Tensor, sizes: Sequence[int]) -> Tensor:
        """Dense sum onto the host's leader, the leaders' mean through the compressor (divided by
        the ranks per host: the mean over every rank), the leader's result to its host."""
        hierarchy = cast(HostHierarchy, self.hierarchy)
        with self.stats.phase("communicate", flat.device):
            hierarchy.reduce_to_leader(flat)
        if hierarchy.is_leader:
            mean = self._reduce_flat(names, flat, sizes)
            if mean.data_ptr() != flat.data_ptr():
                flat.copy_(mean)
            flat.div_(hierarchy.ranks_per_host)
        with self.stats.phase("communicate", flat.device):
            hierarchy.broadcast_from_leader(flat)
        return flat

    def _reduce_flat(self, names: Sequence[str], flat: Tensor, sizes: Sequence[int]) -> Tensor:
        if self.compressor.needs.scaled_codes:
            segments = self._fused.layout(names, flat, sizes)
            if segments is not None:
                return self._fused.reduce_scaled_async(list(names), flat, list(sizes), segments).wait()
            return self._reduce_scaled_codes(names, flat, sizes)
        if self.compressor.needs.low_rank:
            return reduce_low_rank(self, list(names), flat, list(sizes))
        steps = self._compress_units(names, flat, sizes)
        with self.stats.phase("communicate", flat.device):
            if self.use_allreduce:
                for work in self._all_reduce_payloads(steps, async_op=False):
                    work()
                gathered: list[list[Payload] | None] = [None] * len(steps)
            else:
                gathered = list(self._all_gather_payloads(steps))
        return self._finish_all(steps, gathered, flat)

    def reduce_flat_async(self, names: Sequence[str], flat: Tensor, sizes: Sequence[int]) -> Future[Tensor]:
        """:meth:`reduce_flat` whose collective runs in the background.

        Returns a future of the mean, so that DDP can overlap the all-reduce (linear compressors)
        or the payloads' all-gather (the others) with the rest of the backward pass; decompression
        runs when the collective completes. PowerSGD's two all-reduces are chained futures
        (:func:`~common.comm.low_rank.reduce_low_rank_async`). Other routes of several rounds
        (TernGrad's shared scaler, a host hierarchy) and world size 1 complete at once.
        ``communicate`` seconds are then the time from launch to completion, overlap included.
        """
        world = get_world_size(self.group)
        needs = self.compressor.needs
        if needs.scaled_codes and self.hierarchy is None:
            segments = self._fused.layout(names, flat, sizes)
            if segments is not None:
                return self._fused.reduce_scaled_async(list(names), flat, list(sizes), segments)
        if needs.low_rank and self.hierarchy is None:
            return reduce_low_rank_async(self, list(names), flat, list(sizes))
        if world == 1 or needs.scaled_codes or needs.low_rank or self.hierarchy is not None:
            future: Future[Tensor] = Future()
            future.set_result(self.reduce_flat(names, flat, sizes))
            return future
        steps = self._compress_units(names, flat, sizes)
        start = time.perf_counter()
        if not self.use_allreduce:
            keys = [list(step.payload.wire) for step in steps]
            gathering = self._gather_wire(steps, all_gather_variable_async)

            def decode(done: Future[list[list[Tensor]]]) -> Tensor:
                self.stats.add_seconds("communicate", time.perf_counter() - start)
                return self._finish_all(steps, self._split_gathered(steps, keys, done.value()), flat)

            return gathering.then(decode)
        works = self._all_reduce_payloads(steps, async_op=True)
        futures = [work.future for work in works if work.future is not None]

        def finish(_: Future[list[Future[list[Tensor]]]]) -> Tensor:
            for work in works:
                work()  # copies a fused buffer back into the payloads
            self.stats.add_seconds("communicate", time.perf_counter() - start)
            return self._finish_all(steps, [None] * len(steps), flat)

        return torch.futures.collect_all(futures).then(finish)

    def _compress_units(self, names: Sequence[str], flat: Tensor, sizes: Sequence[int]) -> list[Step]:
        """Compress a bucket: whole on the fused route where it serves, else unit by unit."""
        segments = self._fused.layout(names, flat, sizes)
        if segments is not None:
            return [self._fused.compress(list(names), flat, list(sizes), segments)]
        return [self._compress(*unit) for unit in self._units(names, flat, sizes)]

    def _units(
        self, names: Sequence[str], flat: Tensor, sizes: Sequence[int]
    ) -> list[tuple[list[str], Tensor, list[int]]]:
        """What is compressed as one tensor: the whole bucket, or each of its tensors (not for an
        elementwise compressor, whose payload is the same either way: one call instead of many)."""
        if not self.compress_per_tensor or len(names) == 1 or self.compressor.elementwise:
            return [(list(names), flat, list(sizes))]
        return [
            ([n], part, [size]) for n, part, size in zip(names, flat.split(list(sizes)), sizes, strict=True)
        ]

    def _all_reduce_payloads(self, steps: list[Step], *, async_op: bool) -> list[_Reduction]:
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
                all_reduce_sum_(buffer, stats=self.stats, group=self.group)
                reductions.append(_Reduction(buffer, tensors, None))
                continue
            work = dist.all_reduce(buffer, op=dist.ReduceOp.SUM, group=self.group, async_op=True)
            assert work is not None
            self.stats.add_call("all_reduce", buffer.numel() * buffer.element_size() * 8)
            reductions.append(_Reduction(buffer, tensors, work.get_future()))
        return reductions

    def _all_gather_payloads(self, steps: list[Step]) -> list[list[Payload]]:
        """Every rank's payloads, all of a bucket's wire tensors in one (variable-size) all-gather."""
        keys = [list(step.payload.wire) for step in steps]
        return self._split_gathered(steps, keys, self._gather_wire(steps, all_gather_variable))

    def _gather_wire(self, steps: list[Step], gather: Any) -> Any:
        """``gather`` (blocking or not) of every step's wire tensors, in order, in one collective."""
        return gather(
            [t for step in steps for t in step.payload.wire.values()],
            # a fused payload's sizes follow from the bucket's layout, whatever the compressor
            sizes_known=self.compressor.fixed_size or all(step.fused for step in steps),
            stats=self.stats,
            group=self.group,
        )

    @staticmethod
    def _split_gathered(
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

    def _finish_all(
        self, steps: list[Step], gathered: Sequence[list[Payload] | None], flat: Tensor
    ) -> Tensor:
        means = [self._finish(step, g) for step, g in zip(steps, gathered, strict=True)]
        if len(means) == 1:
            return means[0]
        if all(m.data_ptr() == step.flat.data_ptr() for m, step in zip(means, steps, strict=True)):
            return flat  # every unit's mean was written into its own slice of the input
        return torch.cat(means)

    def _compress(self, names: list[str], flat: Tensor, sizes: list[int]) -> Step:
        ef = self.error_feedback
        with self.stats.phase("compress", flat.device):
            compensated = ef.compensate(names, flat, sizes) if ef is not None else flat
            payload = self.compressor.compress(compensated, self.unit_rng(names, flat.device))
            # What this rank contributes, decoded locally; the residual is what it leaves out. A
            # sparsifier's is its (indices, values): the residual update then needs no dense
            # decompression (a bucket-sized fresh tensor: 30-35 ms at 11.2M entries, one core).
            sparse = self._sparse_sent(payload, flat, compensated) if ef is not None else None
            sent = self.compressor.decompress(payload) if ef is not None and sparse is None else None
            if sent is not None and self.use_allreduce:
                # The all-reduce sums in place: wire tensors that alias what the residual update
                # still reads (identity's wire *is* the compensated gradient) are copied first.
                keep = {compensated.untyped_storage().data_ptr(), sent.untyped_storage().data_ptr()}
                payload = payload.with_wire(
                    {
                        k: v.clone() if v.untyped_storage().data_ptr() in keep else v
                        for k, v in payload.wire.items()
                    }
                )
        return Step(names, sizes, flat, compensated, payload, sent, sparse)

    def _sparse_sent(
        self, payload: Payload, flat: Tensor, compensated: Tensor
    ) -> tuple[Tensor, Tensor] | None:
        """The payload's sparse ``sent`` where the residual update can take it (the all-gather route,
        a flat compensated tensor of its own, in the values' dtype); None: decompress densely."""
        sparse = self.compressor.sparse_sent(payload)
        if sparse is None or self.use_allreduce:
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

    def _finish(self, step: Step, gathered: list[Payload] | None) -> Tensor:
        """Decompress (the sum, or every rank's payload), divide by the world size, update the
        residual."""
        if step.fused:
            return self._fused.finish(step, gathered)
        world = get_world_size(self.group)
        with self.stats.phase("decompress", step.flat.device):
            # The summed payload (or every rank's) decompressed straight into the input
            # (reduce_flat may overwrite it), which the residual update does not read
            # (``compensated`` and ``sent`` are their own tensors): no fresh dense tensor per call.
            if gathered is None:
                total = self.compressor.decompress_into(step.payload, step.flat)
            else:
                total = self.compressor.aggregate_into(gathered, step.flat)
            # In place: ``total`` is the input, the summed wire buffer or a fresh decompression,
            # never a tensor the residual update still reads (those were copied before the
            # all-reduce). Saves a bucket-sized allocation and pass (~25% of a 2 MiB bucket's sync
            # time, measured).
            mean = total.reshape(-1).to(step.flat.dtype).div_(world)
            if self.error_feedback is not None and step.sparse is not None:
                indices, values = step.sparse
                self.error_feedback.update_sparse(step.names, step.compensated, indices, values, step.sizes)
            elif self.error_feedback is not None:
                assert step.sent is not None
                self.error_feedback.update(step.names, step.compensated, step.sent, step.sizes)
        if world > 1:
            self.stats.dense_bits += step.flat.numel() * 32
        return mean

    # -- scaled codes (needs.scaled_codes: TernGrad) -------------------------------------------------

    def _code_route(self, world: int) -> str:
        return code_route(self.compressor, world)

    def _check_fp32_layers(self, names: Sequence[str]) -> None:
        """Unknown names in the compressor's fp32 list fail at the first step, naming the known ones."""
        wanted = self.compressor.fp32_layers
        if not wanted or self._fp32_checked:
            return
        unknown = [n for n in wanted if not any(x == n or x.startswith(n + ".") for x in names)]
        if unknown:
            raise ValueError(
                f"fp32_layers names no parameter or module here: {', '.join(unknown)}; "
                f"parameters: {', '.join(names)}"
            )
        self._fp32_checked = True

    def _reduce_scaled_codes(self, names: Sequence[str], flat: Tensor, sizes: Sequence[int]) -> Tensor:
        """The route ``needs.scaled_codes`` declares (TernGrad's step): compensate; with
        ``scaler_round="max"`` agree on the max scaler per tensor (one small all-reduce); encode;
        per tensor all-gather the packed codes or all-reduce int8 code sums (which one is counted
        in ``stats.routes``); tensors the compressor keeps in fp32 (``needs.dense_tensors``) are
        all-reduced densely. Returns the mean over ranks and updates the residuals."""
        if self.param_names:  # the DDP hook sees one bucket at a time: check against the module
            self._check_fp32_layers(list(self.param_names.values()))
        step = self._encode_scaled(self._units(names, flat, sizes), flat.device)
        with self.stats.phase("communicate", flat.device):
            if step.code_sum is not None:
                all_reduce_sum_(step.code_sum, stats=self.stats, group=self.group)
            if step.dense_sum is not None:
                all_reduce_sum_(step.dense_sum, stats=self.stats, group=self.group)
            gathered_units = [i for i in step.ternary if i not in step.summed]
            if gathered_units:
                steps = [Step([], [], flat, flat, step.payloads[i], None) for i in gathered_units]
                for i, g in zip(gathered_units, self._all_gather_payloads(steps), strict=True):
                    step.gathered[i] = g
        with self.stats.phase("decompress", flat.device):
            means = self._decode_scaled(step)
        if all(m.data_ptr() == u[1].data_ptr() for m, u in zip(means, step.units, strict=True)):
            return flat  # every unit's mean was written into its own slice of the input
        return means[0] if len(means) == 1 else torch.cat(means)

    def _encode_scaled(
        self, units: list[tuple[list[str], Tensor, list[int]]], device: torch.device
    ) -> _ScaledStep:
        """Compensate, agree on the scalers (``scaler_round``), encode, and lay out what is summed."""
        compressor = cast(ScaledCodes, self.compressor)
        ef, world = self.error_feedback, get_world_size(self.group)
        with self.stats.phase("compress", device):
            compensated = [ef.compensate(n, f, z) if ef is not None else f for n, f, z in units]
            dense = [
                all(self.compressor.keeps_fp32(n, z) for n, z in zip(u[0], u[2], strict=True)) for u in units
            ]
            ternary = [i for i, d in enumerate(dense) if not d]
            scalers = (
                torch.stack([compressor.scaler(compensated[i]) for i in ternary])
                if ternary
                else torch.zeros(0, device=device)
            )
        shared = self.compressor.needs.scaler_round == "max"
        own = scalers.clone() if shared else scalers  # this rank's, checked against the agreed max
        if ternary and shared:
            with self.stats.phase("communicate", device):
                all_reduce_max_(scalers, stats=self.stats, group=self.group)
        route = self._code_route(world)
        step = _ScaledStep(units, compensated, dense, ternary, scalers)
        with self.stats.phase("compress", device):
            for j, i in enumerate(ternary):
                step.payloads[i] = compressor.compress(
                    compensated[i],
                    self.unit_rng(units[i][0], device),
                    scaler=scalers[j] if shared else None,
                    own=own[j],
                )
                if ef is not None:
                    step.sent[i] = self.compressor.decompress(step.payloads[i])
            for i in range(len(units)):
                if dense[i]:
                    step.sent[i] = compensated[i]
                    self.stats.routes["fp32-allreduce"] += 1
                else:
                    self.stats.routes[
                        f"{compressor.name}-{'int8-allreduce' if route == 'allreduce' else 'allgather'}"
                    ] += 1
            step.summed = [i for i in ternary if route == "allreduce"]
            code_dtype = torch.int8 if world <= 127 else torch.int16
            if step.summed:
                parts = [compressor.codes(step.payloads[i]).to(code_dtype) for i in step.summed]
                # one unit (a whole bucket): its fresh codes are summed in place, no copy
                step.code_sum = parts[0] if len(parts) == 1 else torch.cat(parts)
            if step.dense_ids:
                step.dense_sum = torch.cat([compensated[i].reshape(-1).float() for i in step.dense_ids])
        return step

    def _decode_scaled(self, step: _ScaledStep) -> list[Tensor]:
        """Each unit's mean over ranks (dense sum, gathered payloads or decoded code sum); the
        residuals updated."""
        compressor = cast(ScaledCodes, self.compressor)
        ef, world = self.error_feedback, get_world_size(self.group)
        code_parts = iter(
            step.code_sum.split([step.units[i][1].numel() for i in step.summed])
            if step.code_sum is not None
            else []
        )
        dense_parts = iter(
            step.dense_sum.split([step.units[i][1].numel() for i in step.dense_ids])
            if step.dense_sum is not None
            else []
        )
        means: list[Tensor] = []
        for i, (unit_names, unit_flat, unit_sizes) in enumerate(step.units):
            # Decoded into the unit's own slice of the bucket where it is fp32: nothing reads it
            # after encoding (``compensated`` and ``sent`` are their own tensors, or unused).
            into = unit_flat if unit_flat.dtype == torch.float32 and unit_flat.is_contiguous() else None
            if step.dense[i]:
                total = next(dense_parts)
            elif i in step.gathered:
                gathered = step.gathered[i]
                total = (
                    self.compressor.aggregate(gathered)
                    if into is None
                    else self.compressor.aggregate_into(gathered, into)
                )
            else:
                j = step.ternary.index(i)
                total = compressor.decode_sum(
                    next(code_parts), step.scalers[j], unit_flat.shape, torch.float32, out=into
                )
            means.append(total.reshape(-1).to(unit_flat.dtype).div_(world))
            if ef is not None:
                ef.update(unit_names, step.compensated[i], step.sent[i].reshape(-1), unit_sizes)
            if world > 1:
                self.stats.dense_bits += unit_flat.numel() * 32
        return means

    # -- checkpointing ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, object]:
        return {
            "error_feedback": self.error_feedback.state_dict() if self.error_feedback is not None else None,
            "draws": dict(self._draws),  # the generators restart from (unit, count): nothing else to keep
            "stats": self.stats.state_dict(),
            "low_rank_q": {k: v.detach().clone() for k, v in self.low_rank_q.items()},
            "host_stats": self.hierarchy.stats.state_dict() if self.hierarchy is not None else None,
        }

    def load_state_dict(self, state: dict[str, object]) -> None:
        ef_state = state["error_feedback"]
        if (ef_state is None) != (self.error_feedback is None):
            raise ValueError("checkpoint and GradientSync disagree on whether error feedback is used")
        if self.error_feedback is not None:
            self.error_feedback.load_state_dict(ef_state)  # type: ignore[arg-type]
        if "draws" not in state:
            raise ValueError(
                "this GradientSync state is from an older thinwire (one generator stream per sync, "
                "not per tensor): it cannot be resumed bit-exactly; start the run afresh (delete its ckpt/)"
            )
        self._draws = dict(state["draws"])  # type: ignore[call-overload]
        stored_q = cast(dict[str, Tensor], state.get("low_rank_q", {}))
        self.low_rank_q = {k: v.clone() for k, v in stored_q.items()}
        self.stats.load_state_dict(state["stats"])  # type: ignore[arg-type]
        host_stats = state.get("host_stats")
        if self.hierarchy is not None and host_stats is not None:
            self.hierarchy.stats.load_state_dict(host_stats)  # type: ignore[arg-type]
