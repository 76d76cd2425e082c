"""The scaled-codes route: a compressor that declares ``needs.scaled_codes`` (TernGrad).

A bucket's units (each tensor, or the flat bucket) are compensated; with ``scaler_round="max"``
the ranks agree on each unit's scaler (the max over ranks, one small all-reduce); each unit is
encoded against its scaler; the codes cross per unit as packed 2-bit codes (all-gather) or as int8
code sums (all-reduce), which one :func:`~.base.code_route` picks and ``stats.routes`` counts;
units the compressor keeps in fp32 (``needs.dense_tensors``) are all-reduced densely. On the fused
route (:mod:`.fused`) a bucket is the three rounds as chained futures instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import torch
from torch import Tensor
from torch.futures import Future

from ...compressors.base import Payload, ScaledCodes
from ..collectives import all_reduce_max_, all_reduce_sum_, get_world_size
from .base import RouteHost, Step, code_route, compression_units, done
from .fused import FusedRoute
from .plain import all_gather_payloads

#: One unit of a bucket: its names, its slice of the bucket, its tensors' sizes.
Unit = tuple[list[str], Tensor, list[int]]


@dataclass
class _ScaledStep:
    """One bucket on the scaled-codes route between encoding and decoding (unit i: ``units[i]``)."""

    units: list[Unit]
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


class ScaledCodesRoute:
    """TernGrad's route (module docstring): fused where :meth:`FusedRoute.layout` serves the
    bucket, else unit by unit (blocking; its future is done at once)."""

    def __init__(self, host: RouteHost, fused: FusedRoute) -> None:
        self.host = host
        self.fused = fused

    def reduce(self, names: list[str], flat: Tensor, sizes: list[int]) -> Tensor:
        segments = self.fused.layout(names, flat, sizes)
        if segments is not None:
            return self.fused.reduce_scaled_async(list(names), flat, list(sizes), segments).wait()
        return self._reduce_units(names, flat, sizes)

    def reduce_async(self, names: list[str], flat: Tensor, sizes: list[int]) -> Future[Tensor]:
        segments = self.fused.layout(names, flat, sizes)
        if segments is not None:
            return self.fused.reduce_scaled_async(list(names), flat, list(sizes), segments)
        return done(self._reduce_units(names, flat, sizes))

    def _reduce_units(self, names: Sequence[str], flat: Tensor, sizes: Sequence[int]) -> Tensor:
        """Compensate, agree on the scalers, encode, send, decode (module docstring); returns the
        mean over ranks and updates the residuals."""
        host = self.host
        if host.param_names:  # the DDP hook sees one bucket at a time: check against the module
            host.check_fp32_layers(list(host.param_names.values()))
        step = self._encode(compression_units(host, names, flat, sizes), flat.device)
        with host.stats.phase("communicate", flat.device):
            if step.code_sum is not None:
                all_reduce_sum_(step.code_sum, stats=host.stats, group=host.group)
            if step.dense_sum is not None:
                all_reduce_sum_(step.dense_sum, stats=host.stats, group=host.group)
            gathered_units = [i for i in step.ternary if i not in step.summed]
            if gathered_units:
                steps = [Step([], [], flat, flat, step.payloads[i], None) for i in gathered_units]
                for i, g in zip(gathered_units, all_gather_payloads(host, steps), strict=True):
                    step.gathered[i] = g
        with host.stats.phase("decompress", flat.device):
            means = self._decode(step)
        if all(m.data_ptr() == u[1].data_ptr() for m, u in zip(means, step.units, strict=True)):
            return flat  # every unit's mean was written into its own slice of the input
        return means[0] if len(means) == 1 else torch.cat(means)

    def _encode(self, units: list[Unit], device: torch.device) -> _ScaledStep:
        """Compensate, agree on the scalers (``scaler_round``), encode, and lay out what is summed."""
        host = self.host
        compressor = cast(ScaledCodes, host.compressor)
        ef = host.error_feedback
        with host.stats.phase("compress", device):
            compensated = [ef.compensate(n, f, z) if ef is not None else f for n, f, z in units]
            dense = [
                all(host.compressor.keeps_fp32(n, z) for n, z in zip(u[0], u[2], strict=True)) for u in units
            ]
            ternary = [i for i, d in enumerate(dense) if not d]
            scalers = (
                torch.stack([compressor.scaler(compensated[i]) for i in ternary])
                if ternary
                else torch.zeros(0, device=device)
            )
        shared = host.compressor.needs.scaler_round == "max"
        own = scalers.clone() if shared else scalers  # this rank's, checked against the agreed max
        if ternary and shared:
            with host.stats.phase("communicate", device):
                all_reduce_max_(scalers, stats=host.stats, group=host.group)
        step = _ScaledStep(units, compensated, dense, ternary, scalers)
        with host.stats.phase("compress", device):
            for j, i in enumerate(ternary):
                step.payloads[i] = compressor.compress(
                    compensated[i],
                    host.unit_rng(units[i][0], device),
                    scaler=scalers[j] if shared else None,
                    own=own[j],
                )
                if ef is not None:
                    step.sent[i] = host.compressor.decompress(step.payloads[i])
            self._lay_out_sums(step)
        return step

    def _lay_out_sums(self, step: _ScaledStep) -> None:
        """Count each unit's route; the code sums (int8, or int16 beyond 127 ranks) and the dense
        units' entries, each in one buffer for its all-reduce."""
        host = self.host
        compressor = cast(ScaledCodes, host.compressor)
        world = get_world_size(host.group)
        route = code_route(host.compressor, world)
        for i in range(len(step.units)):
            if step.dense[i]:
                step.sent[i] = step.compensated[i]
                host.stats.routes["fp32-allreduce"] += 1
            else:
                host.stats.routes[
                    f"{compressor.name}-{'int8-allreduce' if route == 'allreduce' else 'allgather'}"
                ] += 1
        step.summed = [i for i in step.ternary if route == "allreduce"]
        code_dtype = torch.int8 if world <= 127 else torch.int16
        if step.summed:
            parts = [compressor.codes(step.payloads[i]).to(code_dtype) for i in step.summed]
            # one unit (a whole bucket): its fresh codes are summed in place, no copy
            step.code_sum = parts[0] if len(parts) == 1 else torch.cat(parts)
        if step.dense_ids:
            step.dense_sum = torch.cat([step.compensated[i].reshape(-1).float() for i in step.dense_ids])

    def _decode(self, step: _ScaledStep) -> list[Tensor]:
        """Each unit's mean over ranks (dense sum, gathered payloads or decoded code sum); the
        residuals updated."""
        host = self.host
        compressor = cast(ScaledCodes, host.compressor)
        ef, world = host.error_feedback, get_world_size(host.group)
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
                    host.compressor.aggregate(gathered)
                    if into is None
                    else host.compressor.aggregate_into(gathered, into)
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
                host.stats.dense_bits += unit_flat.numel() * 32
        return means
