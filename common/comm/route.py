"""What GradientSync's routes share, below all of them: a bucket between compression and
decompression (:class:`Step`), the view of the sync a route reads (:class:`RouteHost`), and the
route choices made from settings alone (:func:`fused_enabled`, :func:`code_route`).

The routes (the plain one in ``sync.py``, ``fused.py``, ``low_rank.py``) import this module and
never ``sync.py``: the arrows run one way (sync -> routes -> route), no import circle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import torch
from torch import Tensor

from ..compressors.base import Compressor, CompressorRNG, Payload, ScaledCodes
from ..feedback import ErrorFeedback
from .collectives import ProcessGroup
from .stats import CommStats


@dataclass
class Step:
    """One bucket between compression and decompression."""

    names: list[str]
    sizes: list[int]
    flat: Tensor
    compensated: Tensor
    payload: Payload
    sent: Tensor | None
    #: A sparsifier's ``(indices, values)`` in place of a dense ``sent`` (``ErrorFeedback.update_sparse``).
    sparse: tuple[Tensor, Tensor] | None = None
    #: The fused route's (``common.comm.fused``): the whole bucket, its residual already updated.
    fused: bool = False


class RouteHost(Protocol):
    """The parts of a :class:`~common.comm.sync.GradientSync` its routes read and update."""

    compressor: Compressor
    error_feedback: ErrorFeedback | None
    stats: CommStats
    group: ProcessGroup
    seed: int
    fused: bool | None
    compress_per_tensor: bool
    shapes: dict[str, torch.Size]
    low_rank_q: dict[str, Tensor]
    low_rank_layouts: dict[Any, Any]  # the low-rank route's, by bucket (its own types)
    _draws: dict[str, int]

    def _units(
        self, names: Sequence[str], flat: Tensor, sizes: Sequence[int]
    ) -> list[tuple[list[str], Tensor, list[int]]]: ...

    def unit_rng(self, names: Sequence[str], device: torch.device) -> CompressorRNG: ...


def fused_enabled(setting: bool | None, device: torch.device) -> bool:
    """``GradientSync(fused=...)``: None (default) fuses on CUDA, where launches and host reads
    cost the step; on a CPU the per-tensor route's compiled kernels are the faster."""
    return device.type == "cuda" if setting is None else setting


def code_route(compressor: Compressor, world: int) -> str:
    """TernGrad's codes, per tensor: all-gather 2-bit codes (2 (W-1) bits per element through each
    rank) or all-reduce int8 code sums (ring: 8 x 2 (W-1) / W), the latter only with agreed
    scalers; "auto" takes the fewer bits: all-reduce from W = 9 on."""
    choice = cast(ScaledCodes, compressor).code_transport
    if compressor.needs.scaler_round != "max":
        return "allgather"
    if choice != "auto":
        return str(choice)
    return "allreduce" if 8 * 2 * (world - 1) / world < 2 * (world - 1) else "allgather"


__all__ = ["RouteHost", "Step", "code_route", "fused_enabled"]
