"""GradientSync's low-rank route: a compressor that declares ``needs.low_rank`` (PowerSGD).

One bucket, its units (each tensor, or the flat bucket with ``compress_per_tensor=False``) viewed
as matrices (:func:`~common.compressors.powersgd.matrix_shape`; a flat bucket as a zero-padded
square, :func:`~common.compressors.powersgd.square_shape`)::

    compensate (error feedback)
    round 1, one all-reduce: the uncompressed units' entries and every P = M Q  (Q: warm start)
    orthogonalize every summed P;  Q = M^T P
    round 2, one all-reduce: every Q;  Q /= W  (kept as the next step's warm start)
    mean = P Q^T (uncompressed units: sum / W);  residual = compensated - mean

PyTorch's hook sends the uncompressed tensors and the P's in two collectives; here they share one
(the same bits, one call fewer). Two more differences from its hook, both deliberate: the residual
of an uncompressed tensor is zero here (everything of it was sent) where the hook keeps ``local -
mean`` (whose sum over ranks is zero, so the mean it feeds back is the same); and there is no
``start_powerSGD_iter`` of plain all-reduces first (its hook needs them to let DDP rebuild its
buckets before keying state by bucket; state here is keyed by parameter name). The initial Q is
drawn from GradientSync's shared generator keyed by the unit, not from the global RNG.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
from torch import Tensor

from ..compressors.powersgd import PowerSGD, matrix_shape, orthogonalize_, square_shape
from .collectives import all_reduce_sum_, get_world_size

if TYPE_CHECKING:
    from .sync import GradientSync


@dataclass
class _Unit:
    """One unit of a bucket between the rounds; ``rank`` 0: sent uncompressed."""

    names: list[str]
    flat: Tensor  # the unit's part of the input; the mean is written into it
    sizes: list[int]
    compensated: Tensor
    rank: int
    matrix: Tensor | None = None  # rows x cols, fp32 (a padded copy for a square unit)
    p: Tensor | None = None
    q: Tensor | None = None

    @property
    def key(self) -> str:
        return "+".join(self.names)


def reduce_low_rank(sync: GradientSync, names: list[str], flat: Tensor, sizes: list[int]) -> Tensor:
    """The mean over ranks of ``flat`` (the tensors ``names`` of ``sizes``), written into ``flat``;
    updates the residuals and the warm-start Qs (module docstring)."""
    compressor = cast(PowerSGD, sync.compressor)
    world, stats, device = get_world_size(sync.group), sync.stats, flat.device
    with stats.phase("compress", device):
        units = [_prepare(sync, compressor, *unit) for unit in sync._units(names, flat, sizes)]
        dense = [u for u in units if u.rank == 0]
        low = [u for u in units if u.rank > 0]
        for u in low:
            assert u.matrix is not None and u.q is not None
            u.p = u.matrix @ u.q
        first = torch.cat([u.compensated.float() for u in dense] + [u.p.reshape(-1) for u in low])  # type: ignore[union-attr]
    with stats.phase("communicate", device):
        all_reduce_sum_(first, stats=stats, group=sync.group)
    parts = iter(first.split([u.compensated.numel() for u in dense] + [u.p.numel() for u in low]))  # type: ignore[union-attr]
    dense_sums = [next(parts) for _ in dense]
    if low:
        with stats.phase("compress", device):
            for u in low:
                assert u.matrix is not None
                u.p = orthogonalize_(next(parts).view_as(u.p), compressor.epsilon)
                u.q = u.matrix.T @ u.p
            second = torch.cat([u.q.reshape(-1) for u in low])  # type: ignore[union-attr]
        with stats.phase("communicate", device):
            all_reduce_sum_(second, stats=stats, group=sync.group)
        for u, q in zip(low, second.split([u.q.numel() for u in low]), strict=True):  # type: ignore[union-attr]
            u.q = q.view_as(u.q).div_(world)
    with stats.phase("decompress", device):
        for u, total in zip(dense, dense_sums, strict=True):
            _finish(sync, u, total.div_(world), world)
        for u in low:
            assert u.p is not None and u.q is not None
            if compressor.warm_start:
                sync.low_rank_q[u.key] = u.q
            _finish(sync, u, (u.p @ u.q.T).reshape(-1)[: u.flat.numel()], world)
    return flat


def _prepare(
    sync: GradientSync, compressor: PowerSGD, names: list[str], flat: Tensor, sizes: list[int]
) -> _Unit:
    """Compensate a unit, decide its rank, and give it its matrix and (warm-start) Q.

    Per unit, not the bucket at once: a compensated ResNet-18 bucket (44 MB) is past glibc's
    largest mmap threshold (32 MiB), so each step it came fresh from the kernel, page faults
    and all: 38 ms against 23 ms a sync on one core (measured, 2026-12-02).
    """
    shape = sync.shapes.get(names[0]) if len(names) == 1 else None
    if shape is not None and len(shape) >= 2:
        rows, cols = matrix_shape(shape)
    elif shape is not None or flat.numel() == 1:  # a vector (bias, norm) or a scalar
        rows, cols = flat.numel(), 1
    else:  # a flat bucket, or a tensor whose shape GradientSync never saw
        rows, cols = square_shape(flat.numel())
    rank = compressor.rank_for(rows, cols)
    ef = sync.error_feedback
    # An uncompressed unit is sent whole and keeps no residual (_finish clears it): nothing to
    # compensate unless one was loaded (MobileNetV2's ~100 norms and biases: 2 ops each saved).
    kept = ef is not None and (rank > 0 or any(name in ef.residuals for name in names))
    compensated = ef.compensate(names, flat, sizes) if kept and ef is not None else flat
    unit = _Unit(names, flat, sizes, compensated, rank)
    sync.stats.routes[f"powersgd-{'rank' + str(rank) if rank else 'uncompressed'}"] += 1
    if rank == 0:
        return unit
    if rows * cols == flat.numel():
        unit.matrix = compensated.float().view(rows, cols)
    else:
        padded = torch.zeros(rows * cols, dtype=torch.float32, device=flat.device)
        padded[: flat.numel()] = compensated
        unit.matrix = padded.view(rows, cols)
    q = sync.low_rank_q.get(unit.key) if compressor.warm_start else None
    if q is not None and q.shape == (cols, rank):
        unit.q = orthogonalize_(q.clone(), compressor.epsilon)  # as the hook re-orthogonalizes its memory
    else:
        unit.q = compressor.initial_q(cols, rank, sync.unit_rng(names, flat.device), flat.device)
    return unit


def _finish(sync: GradientSync, unit: _Unit, mean: Tensor, world: int) -> None:
    """Residual = compensated - mean (none for an uncompressed unit: all of it was sent); the mean
    into the unit's part of the input."""
    if sync.error_feedback is not None:
        if unit.rank == 0:
            sync.error_feedback.clear(unit.names)
        else:
            sync.error_feedback.update(unit.names, unit.compensated, mean, unit.sizes)
    unit.flat.copy_(mean.reshape(unit.flat.shape))
    if world > 1:
        sync.stats.dense_bits += unit.flat.numel() * 32
