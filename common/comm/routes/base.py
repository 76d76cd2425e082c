"""What GradientSync's routes share, below all of them: the one protocol every route follows
(:class:`Route`), a bucket between compression and decompression (:class:`Step`), the view of the
sync a route reads (:class:`RouteHost`), and the choices made from settings alone
(:func:`compression_units`, :func:`fused_enabled`, :func:`code_route`).

A route takes the mean over ranks of one bucket (a flat tensor, the concatenation of the tensors
``names`` of ``sizes``), blocking (:meth:`Route.reduce`) or as a future (:meth:`Route.reduce_async`,
chained futures where it has several rounds). The routes (``plain.py``, ``scaled_codes.py``,
``low_rank.py``, ``hierarchy.py``; ``fused.py`` compresses a bucket whole for the first two)
import this module and never ``sync.py``: the arrows run one way (sync -> routes -> base), no
import circle. GradientSync picks its route once, from its compressor's ``needs`` and its host
hierarchy (:func:`common.comm.sync.pick_route`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import torch
from torch import Tensor
from torch.futures import Future

from ...compressors.base import Compressor, CompressorRNG, Payload, ScaledCodes
from ...feedback import ErrorFeedback
from ..collectives import ProcessGroup
from ..stats import CommStats


class Route(Protocol):
    """One way of taking a bucket's mean over ranks. The input ``flat`` may be overwritten (an
    all-reduce works in place) and may be the result."""

    def reduce(self, names: list[str], flat: Tensor, sizes: list[int]) -> Tensor:
        """The mean over ranks of ``flat``, the concatenation of the tensors ``names`` (of ``sizes``)."""
        ...

    def reduce_async(self, names: list[str], flat: Tensor, sizes: list[int]) -> Future[Tensor]:
        """:meth:`reduce` as a future, its collectives in the background where the route allows."""
        ...


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
    #: The fused route's (``common.comm.routes.fused``): the whole bucket, its residual already updated.
    fused: bool = False
    #: The wire values were divided by the world size before the all-reduce (``Compressor.divides_on_wire``):
    #: the sum that arrives is the mean.
    divided: bool = False


class RouteHost(Protocol):
    """The parts of a :class:`~common.comm.sync.GradientSync` its routes read and update."""

    compressor: Compressor
    error_feedback: ErrorFeedback | None
    stats: CommStats
    group: ProcessGroup
    seed: int
    fused: bool | None
    compress_per_tensor: bool
    use_allreduce: bool
    param_names: dict[int, str]
    shapes: dict[str, torch.Size]
    low_rank_q: dict[str, Tensor]
    _draws: dict[str, int]

    def unit_rng(self, names: Sequence[str], device: torch.device) -> CompressorRNG: ...

    def check_fp32_layers(self, names: Sequence[str]) -> None: ...


def compression_units(
    host: RouteHost, names: Sequence[str], flat: Tensor, sizes: Sequence[int]
) -> list[tuple[list[str], Tensor, list[int]]]:
    """What is compressed as one tensor: the whole bucket, or each of its tensors (not for an
    elementwise compressor, whose payload is the same either way: one call instead of many)."""
    if not host.compress_per_tensor or len(names) == 1 or host.compressor.elementwise:
        return [(list(names), flat, list(sizes))]
    return [([n], part, [size]) for n, part, size in zip(names, flat.split(list(sizes)), sizes, strict=True)]


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


def done(value: Any) -> Future[Any]:
    """A future completed with ``value`` (a route that finished at once)."""
    future: Future[Any] = Future()
    future.set_result(value)
    return future


__all__ = ["Route", "RouteHost", "Step", "code_route", "compression_units", "done", "fused_enabled"]
