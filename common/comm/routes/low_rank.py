"""GradientSync's low-rank route: a compressor that declares ``needs.low_rank`` (PowerSGD).

One bucket, its units (each tensor, or the flat bucket with ``compress_per_tensor=False``) viewed
as matrices (:func:`~common.compressors.powersgd.matrix_shape`; a flat bucket as a zero-padded
square, :func:`~common.compressors.powersgd.square_shape`)::

    compensate (error feedback, once for the bucket)
    round 1, one all-reduce: the uncompressed units' entries and every P = M Q  (Q: warm start)
    orthogonalize every summed P;  Q = M^T P
    round 2, one all-reduce: every Q;  Q /= W  (kept as the next step's warm start)
    mean = P Q^T (uncompressed units: sum / W);  residual = compensated - mean

The rounds are chained futures (:meth:`LowRankRoute.reduce_async`), as in PyTorch's hook: round 1 is
launched in the background; its completion orthogonalizes, computes the Q's and launches round 2;
round 2's completion decompresses into the bucket and updates the residuals. A DDP hook returns
that future, so both rounds overlap the rest of the backward pass. Every collective is launched
from the caller's thread, in the same order on every rank (:meth:`LowRankRoute.reduce_async` says
what that costs on gloo).

Launches per bucket depend on its number of distinct matrix shapes, not on its number of tensors.
A bucket's :class:`BucketLayout` (routing from shapes only, built once per bucket) groups its
compressed units by shape; each group is one batch for ``torch.bmm`` (M Q, M^T P, P Q^T) and for
the orthogonalization, as PyTorch's hook with ``batch_tensors_with_same_shape``. The buffers the
rounds send are allocated once per layout (round 1: the uncompressed entries, then every P; round
2: every Q), each group's P's and Q's views of them: no round concatenates anything. A unit's
warm-start Q is its view of the Q buffer, kept in ``GradientSync.low_rank_q`` under the unit's key,
and copied in when the unit was last reduced in another layout (DDP rebuilt its buckets, a
checkpoint was loaded).

Arithmetic: every product is a ``bmm``, a unit alone being a batch of one, as in PyTorch's hook
batched or not; the orthogonalization is the hook's, over the batch. The results are those of its
hook with ``batch_tensors_with_same_shape=True`` to the last bit (tests/common/comm/test_powersgd.py,
ranks 1 to 3). A matrix's result depends on the batch it is in in two cases found on CPU (torch
2.14, one thread), in the last bits; PyTorch's per-tensor hook differs from its batched one in the
same ways. At rank 1, M Q of a matrix alone is a matrix-vector product, in a batch a batched gemm
(from ``rows x cols >= 400``). Beyond rank 2, LAPACK's QR depends on where a matrix lies in its
column-major copy of the batch (its alignment: in a batch of [30 x 3] matrices the odd ones
differ). Where those apply, a tensor that shares its shape with others in a bucket is not
bit-equal to the per-tensor loop, and when DDP's rebuilt buckets group it differently from its
first ones, a run resumed at a step of the first buckets is not bit-equal to an uninterrupted one.
Rank 2's products and Gram-Schmidt do not depend on the batch (batches of 2 to 128 against one).
On a GPU, cuBLAS promises no batch invariance at any rank. ``mm`` (this route before batching)
differs from ``bmm`` in the last bits for some small shapes (5 x 32 and 12 x 12 at rank 2: P Q^T).

PyTorch's hook sends the uncompressed tensors and the P's in two collectives; here they share one
(the same bits, one call fewer). Two more differences from its hook, both deliberate: the residual
of an uncompressed tensor is zero here (everything of it was sent) where the hook keeps ``local -
mean`` (whose sum over ranks is zero, so the mean it feeds back is the same); and there is no
``start_powerSGD_iter`` of plain all-reduces first (its hook needs them to let DDP rebuild its
buckets before keying state by bucket; state here is keyed by parameter name). The initial Q is
drawn from GradientSync's shared generator keyed by the unit, not from the global RNG.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from itertools import pairwise
from typing import cast

import torch
from torch import Tensor
from torch.futures import Future

from ...compressors.powersgd import PowerSGD, matrix_shape, orthogonalize_, square_shape
from ..collectives import all_reduce_sum_async, get_world_size
from .base import RouteHost, compression_units, fused_enabled

#: A bucket layout's key: its tensors' names and sizes, and its device.
LayoutKey = tuple[tuple[str, ...], tuple[int, ...], torch.device]


@dataclass
class _Group:
    """The compressed units of one matrix shape (``rows x cols`` at ``rank``), one batch."""

    rows: int
    cols: int
    rank: int
    units: list[int]  # indices of the layout's units, in bucket order
    offset: int | None  # where the units lie back to back in the bucket (their batch is a view)
    padded: bool  # one unit smaller than its matrix (a flat bucket as a square): a zero-padded copy
    p: Tensor  # [k, rows, rank]: a view of the layout's round-1 buffer
    q: Tensor  # [k, cols, rank]: a view of its round-2 buffer
    q_units: list[Tensor] = field(default_factory=list)  # q[j]: unit j's warm start

    @property
    def numel(self) -> int:
        return self.rows * self.cols


@dataclass
class BucketLayout:
    """A bucket's units routed from their shapes only, and the buffers its rounds reuse each step."""

    keys: list[str]  # each unit's key: its names joined by "+"
    unit_names: list[list[str]]
    numels: list[int]
    dense: list[int]  # the units sent uncompressed, in bucket order
    dense_names: list[str]
    groups: list[_Group]
    first: Tensor  # round 1's buffer: the uncompressed entries (fp32), then every P
    second: Tensor  # round 2's buffer: every Q
    routes: Counter[str]
    dense_numels: list[int] = field(init=False)
    head: Tensor = field(init=False)  # round 1's uncompressed entries

    def __post_init__(self) -> None:
        self.dense_numels = [self.numels[u] for u in self.dense]
        self.head = self.first[: sum(self.dense_numels)]


class LowRankRoute:
    """The low-rank route of one GradientSync (``host``) and its buckets' layouts."""

    def __init__(self, host: RouteHost) -> None:
        self.host = host
        self.layouts: dict[LayoutKey, BucketLayout] = {}

    def reduce(self, names: list[str], flat: Tensor, sizes: list[int]) -> Tensor:
        """:meth:`reduce_async`, waited for."""
        return self.reduce_async(names, flat, sizes).wait()

    def reduce_async(self, names: list[str], flat: Tensor, sizes: list[int]) -> Future[Tensor]:
        """A future of the mean over ranks of ``flat`` (the tensors ``names`` of ``sizes``), written
        into ``flat``; it updates the residuals and the warm-start Qs (module docstring). Completed
        at once at world size 1. One reduction of a bucket at a time: its layout's buffers are reused.

        Round 2 is launched by round 1's callback, which must run on this thread, so that every rank
        launches its collectives in the same order. NCCL completes a collective's future as soon as
        it is enqueued (the callback's stream waits for the device, the host does not): the callback
        runs here at once. Gloo completes it on a worker thread, where the launch would race with the
        next bucket's launch from here and reach the ranks in different orders: there round 1 is
        waited for first (round 2 and the decompression still run in the background).
        """
        sync = self.host
        compressor = cast(PowerSGD, sync.compressor)
        stats, device = sync.stats, flat.device
        layout = _layout(sync, self.layouts, compressor, names, flat, sizes)
        ef = sync.error_feedback
        with stats.phase("compress", device):
            # An uncompressed unit is sent whole and keeps no residual: a bucket of them alone has
            # nothing to compensate unless one was loaded (a checkpoint of PyTorch's hook).
            compensate = ef is not None and (
                bool(layout.groups) or any(name in ef.residuals for name in layout.dense_names)
            )
            compensated = ef.compensate(names, flat, sizes) if compensate and ef is not None else flat
            parts = list(compensated.split(layout.numels)) if len(layout.numels) > 1 else [compensated]
            _start_qs(sync, compressor, layout, device)
            matrices = [_matrices(group, compensated, parts) for group in layout.groups]
            for group, matrix in zip(layout.groups, matrices, strict=True):
                torch.bmm(matrix, group.q, out=group.p)
            if layout.dense:
                torch.cat([parts[u] for u in layout.dense], out=layout.head)
        stats.routes.update(layout.routes)
        world = get_world_size(sync.group)
        flight = _Flight(sync, compressor, layout, names, sizes, flat, compensated, matrices, world)
        if world > 1:
            stats.dense_bits += flat.numel() * 32
        round_one = flight.launch(layout.first)
        if not layout.groups:
            return round_one.then(flight.finish_uncompressed)
        if not round_one.done():
            round_one.wait()  # gloo (docstring)
        round_one.then(flight.send_qs).value()  # runs here and now (round 1 is complete); raises its error
        assert flight.round_two is not None
        return flight.round_two.then(flight.decompress)


@dataclass
class _Flight:
    """One bucket between its rounds: what the callbacks of its futures need."""

    sync: RouteHost
    compressor: PowerSGD
    layout: BucketLayout
    names: list[str]
    sizes: list[int]
    flat: Tensor
    compensated: Tensor
    matrices: list[Tensor]
    world: int
    started: float = 0.0
    round_two: Future[list[Tensor]] | None = None

    def launch(self, buffer: Tensor) -> Future[list[Tensor]]:
        self.started = time.perf_counter()
        return all_reduce_sum_async(buffer, stats=self.sync.stats, group=self.sync.group)

    def _arrived(self) -> None:
        """Host time from the launch of a collective to its completion (overlap included)."""
        if self.world == 1:  # nothing was launched; the callbacks run here, on the caller's stream
            return
        self.sync.stats.add_seconds("communicate", time.perf_counter() - self.started)
        # A CUDA future runs its callbacks on streams of their own: what the caller's stream
        # allocated and they still read must not be handed out again before they are done.
        for tensor in (self.compensated, *self.matrices):
            if tensor.is_cuda:
                tensor.record_stream(torch.cuda.current_stream(tensor.device))

    def finish_uncompressed(self, _: Future[list[Tensor]]) -> Tensor:
        """Round 1 was the whole bucket: its mean."""
        self._arrived()
        with self.sync.stats.phase("decompress", self.flat.device):
            self._write_uncompressed()
            self._update_residuals()
        return self.flat

    def send_qs(self, _: Future[list[Tensor]]) -> None:
        """The uncompressed means; every P orthogonalized, Q = M^T P, and round 2 launched."""
        self._arrived()
        stats, device = self.sync.stats, self.flat.device
        with stats.phase("decompress", device):
            self._write_uncompressed()
        with stats.phase("compress", device):
            for group, matrix in zip(self.layout.groups, self.matrices, strict=True):
                orthogonalize_(group.p, self.compressor.epsilon)
                torch.bmm(matrix.transpose(1, 2), group.p, out=group.q)
        self.round_two = self.launch(self.layout.second)

    def decompress(self, _: Future[list[Tensor]]) -> Tensor:
        """Q /= W (the next warm start), P Q^T into the bucket, the residuals."""
        self._arrived()
        flat, layout = self.flat, self.layout
        with self.sync.stats.phase("decompress", flat.device):
            layout.second.div_(self.world)
            flat_parts: list[Tensor] | None = None
            for group in layout.groups:
                if group.offset is not None and not group.padded and flat.dtype == torch.float32:
                    into = flat[group.offset : group.offset + len(group.units) * group.numel]
                    torch.bmm(group.p, group.q.transpose(1, 2), out=into.view(-1, group.rows, group.cols))
                    continue
                means = torch.bmm(group.p, group.q.transpose(1, 2))
                if group.offset is not None and not group.padded:
                    flat[group.offset : group.offset + means.numel()].copy_(means.view(-1))
                    continue
                if flat_parts is None:
                    flat_parts = list(flat.split(layout.numels)) if len(layout.numels) > 1 else [flat]
                if group.padded:
                    part = flat_parts[group.units[0]]
                    part.copy_(means.view(-1)[: part.numel()])
                else:
                    targets = [flat_parts[u] for u in group.units]
                    torch._foreach_copy_(targets, list(means.view(len(targets), -1).unbind(0)))
            self._update_residuals()
        return flat

    def _write_uncompressed(self) -> None:
        """sum / W of the uncompressed units into their places in the bucket."""
        layout, flat = self.layout, self.flat
        if not layout.dense:
            return
        means = layout.head.div_(self.world).split(layout.dense_numels)
        if len(layout.numels) == 1:
            flat.copy_(means[0])
            return
        flat_parts = flat.split(layout.numels)
        torch._foreach_copy_([flat_parts[u] for u in layout.dense], list(means))

    def _update_residuals(self) -> None:
        """Residual = compensated - mean, once for the bucket; none for an uncompressed unit."""
        ef = self.sync.error_feedback
        if ef is None:
            return
        if self.layout.groups:
            assert self.compensated is not self.flat  # the means overwrote the bucket
            ef.update(self.names, self.compensated, self.flat, self.sizes)
        ef.clear(self.layout.dense_names)


def _start_qs(sync: RouteHost, compressor: PowerSGD, layout: BucketLayout, device: torch.device) -> None:
    """Every group's Q, orthogonalized as one batch: each unit's warm start (as the hook
    re-orthogonalizes its memory), or a draw from the shared generator keyed by the unit."""
    for group in layout.groups:
        for u, view in zip(group.units, group.q_units, strict=True):
            key = layout.keys[u]
            stored = sync.low_rank_q.get(key) if compressor.warm_start else None
            if stored is view:  # reduced in this layout last time: its view holds it already
                continue
            if stored is not None and stored.shape == view.shape:
                view.copy_(stored)
            else:
                view.copy_(
                    compressor.random_q(group.cols, group.rank, sync.unit_rng(layout.unit_names[u], device))
                )
            if compressor.warm_start:
                sync.low_rank_q[key] = view
        orthogonalize_(group.q, compressor.epsilon)


def _matrices(group: _Group, compensated: Tensor, parts: list[Tensor]) -> Tensor:
    """The group's matrices [k, rows, cols] in fp32: a view of the bucket where its units lie back
    to back, else stacked (one copy); a padded unit's a zero-padded copy."""
    if group.padded:
        part = parts[group.units[0]]
        padded = torch.zeros(group.numel, dtype=torch.float32, device=part.device)
        padded[: part.numel()] = part
        return padded.view(1, group.rows, group.cols)
    if group.offset is not None:
        batch = compensated[group.offset : group.offset + len(group.units) * group.numel]
    else:
        batch = torch.stack([parts[u] for u in group.units])
    return batch.view(-1, group.rows, group.cols).float()


def _layout(
    sync: RouteHost,
    layouts: dict[LayoutKey, BucketLayout],
    compressor: PowerSGD,
    names: list[str],
    flat: Tensor,
    sizes: list[int],
) -> BucketLayout:
    """The bucket's layout, built at its first reduction. A tensor is in one bucket at a time:
    a new layout drops those that share a name with it (DDP rebuilt its buckets)."""
    key: LayoutKey = (tuple(names), tuple(sizes), flat.device)
    layout = layouts.get(key)
    if layout is not None:
        return layout
    for stale in [k for k in layouts if not set(k[0]).isdisjoint(names)]:
        del layouts[stale]
    layouts[key] = layout = _build_layout(sync, compressor, names, flat, sizes)
    return layout


def _build_layout(
    sync: RouteHost, compressor: PowerSGD, names: list[str], flat: Tensor, sizes: list[int]
) -> BucketLayout:
    units = [(unit, part.numel()) for unit, part, _ in compression_units(sync, names, flat, sizes)]
    # Same-shape units batched (one bmm per shape) on the fused route (CUDA by default), where a
    # launch costs more than the copy that stacks them; on a CPU one mm per unit, no copies
    # (ResNet-18 at rank 1: 174 ms batched against 48 ms per unit a reduction, one core).
    batched = fused_enabled(sync.fused, flat.device)
    dense: list[int] = []
    shapes: dict[object, list[int]] = {}  # (rows, cols, rank), or a padded unit alone -> units
    matrix: dict[int, tuple[int, int, int]] = {}
    routes: Counter[str] = Counter()
    for u, (unit_names, numel) in enumerate(units):
        rows, cols = _matrix_shape(sync, unit_names, numel)
        rank = compressor.rank_for(rows, cols)
        routes[f"powersgd-{'rank' + str(rank) if rank else 'uncompressed'}"] += 1
        if rank == 0:
            dense.append(u)
            continue
        matrix[u] = (rows, cols, rank)
        together = batched and rows * cols == numel
        shapes.setdefault((rows, cols, rank) if together else ("alone", u), []).append(u)
    offsets = [0]
    for _, numel in units:
        offsets.append(offsets[-1] + numel)
    num_dense = sum(units[u][1] for u in dense)
    num_p = sum(matrix[u][0] * matrix[u][2] for u in matrix)
    num_q = sum(matrix[u][1] * matrix[u][2] for u in matrix)
    first = torch.empty(num_dense + num_p, dtype=torch.float32, device=flat.device)
    second = torch.empty(num_q, dtype=torch.float32, device=flat.device)
    groups, p_at, q_at = [], num_dense, 0
    for members in shapes.values():
        rows, cols, rank = matrix[members[0]]
        k, numel = len(members), units[members[0]][1]
        back_to_back = all(offsets[b] == offsets[a] + numel for a, b in pairwise(members))
        group = _Group(
            rows,
            cols,
            rank,
            members,
            offsets[members[0]] if back_to_back else None,
            rows * cols != numel,
            first[p_at : p_at + k * rows * rank].view(k, rows, rank),
            second[q_at : q_at + k * cols * rank].view(k, cols, rank),
        )
        group.q_units = list(group.q.unbind(0))
        groups.append(group)
        p_at, q_at = p_at + k * rows * rank, q_at + k * cols * rank
    return BucketLayout(
        keys=["+".join(unit_names) for unit_names, _ in units],
        unit_names=[unit_names for unit_names, _ in units],
        numels=[numel for _, numel in units],
        dense=dense,
        dense_names=[name for u in dense for name in units[u][0]],
        groups=groups,
        first=first,
        second=second,
        routes=routes,
    )


def _matrix_shape(sync: RouteHost, names: list[str], numel: int) -> tuple[int, int]:
    """A unit's matrix: a tensor's (rows, rest), a vector's one column, else a square."""
    shape = sync.shapes.get(names[0]) if len(names) == 1 else None
    if shape is not None and len(shape) >= 2:
        return matrix_shape(shape)
    if shape is not None or numel == 1:  # a vector (bias, norm) or a scalar
        return numel, 1
    return square_shape(numel)  # a flat bucket, or a tensor whose shape GradientSync never saw
