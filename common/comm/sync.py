"""GradientSync: compensate -> compress -> transport -> decompress -> update residual.

The one object every data-parallel method goes through, either called explicitly after
``backward()`` (``sync.sync(model.named_parameters())``) or installed as a DDP comm hook
(:mod:`common.comm.ddp_hook`): both call :meth:`GradientSync.reduce_flat`. How a bucket crosses
the wire is its route (:mod:`common.comm.routes`), picked once from the compressor's ``needs``
and the host hierarchy (:func:`pick_route`); this class holds what the routes share: the
settings, the generators keyed by unit, the residuals, the statistics and the checkpoint.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import cast

import torch
from torch import Tensor, nn
from torch.futures import Future

from ..compressors.base import Compressor, CompressorRNG, check_fp32_layers
from ..feedback import ErrorFeedback
from ..finite import assert_finite, caller_checks, flat_finite, tensors_finite
from .collectives import ProcessGroup, get_rank
from .hierarchy import HostHierarchy
from .routes.base import Route, RouteHost
from .routes.fused import FusedRoute
from .routes.hierarchy import HierarchyRoute
from .routes.low_rank import LowRankRoute
from .routes.plain import PlainRoute
from .routes.scaled_codes import ScaledCodesRoute
from .stats import CommStats

log = logging.getLogger(__name__)

TRANSPORTS = ("auto", "allreduce", "allgather")


def pick_route(host: RouteHost, hierarchy: HostHierarchy | None) -> Route:
    """The route of every bucket of ``host``: by the compressor's ``needs`` (TernGrad's scaled
    codes, PowerSGD's low rank, else the plain payload route), inside the host hierarchy if any.
    The plain and scaled-codes routes compress a bucket whole (:mod:`common.comm.routes.fused`)
    where its layout allows, bucket by bucket."""
    needs = host.compressor.needs
    route: Route
    if needs.scaled_codes:
        route = ScaledCodesRoute(host, FusedRoute(host))
    elif needs.low_rank:
        route = LowRankRoute(host)
    else:
        route = PlainRoute(host, FusedRoute(host))
    return route if hierarchy is None else HierarchyRoute(route, host, hierarchy)


def _check_settings(
    compressor: Compressor,
    transport: str,
    bucket_numel: int | None,
    fused: bool | None,
    group: ProcessGroup,
    hierarchy: HostHierarchy | None,
) -> None:
    """GradientSync's arguments that cannot work, each refused with what would."""
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
    if hierarchy is not None and group is not None:
        raise ValueError("pass a process group or a host hierarchy (whose leaders form the group), not both")


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
            its own semantics (:mod:`common.comm.routes.fused`), where the compressor supports it:
            ``None`` (default) on CUDA tensors, ``True`` on any device, ``False`` never.
        hierarchy: a :class:`~common.comm.hierarchy.HostHierarchy`: dense inside each host, the
            compressor between the hosts' leaders (whose group it is; pass no ``group`` then).
        nonfinite_check: stop on a NaN or inf gradient, naming it (:meth:`check_finite`; one
            sum per bucket); ``False`` lets them through, as torch's own hooks do.

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
        nonfinite_check: bool = True,
    ) -> None:
        _check_settings(compressor, transport, bucket_numel, fused, group, hierarchy)
        self.compressor = compressor
        if isinstance(error_feedback, ErrorFeedback):
            self.error_feedback: ErrorFeedback | None = error_feedback
        else:
            self.error_feedback = ErrorFeedback() if error_feedback else None
        self.use_allreduce = transport == "allreduce" or (transport == "auto" and compressor.linear)
        self.bucket_numel = bucket_numel
        self.compress_per_tensor = compress_per_tensor
        self.seed = seed
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
        # warm-started Q per unit (needs.low_rank: common.comm.routes.low_rank).
        self.shapes: dict[str, torch.Size] = {}
        self.low_rank_q: dict[str, Tensor] = {}
        self._fp32_checked = False
        #: The fused route (common.comm.routes.fused): None fuses buckets on CUDA, True anywhere,
        #: False never.
        self.fused = fused
        self.nonfinite_check = nonfinite_check
        #: How every bucket crosses the wire (common.comm.routes), picked once.
        self.route: Route = pick_route(self, hierarchy)

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

    def check_fp32_layers(self, names: Sequence[str]) -> None:
        """Unknown names in the compressor's fp32 list fail at the first step, naming the known ones."""
        wanted = self.compressor.fp32_layers
        if not wanted or self._fp32_checked:
            return
        check_fp32_layers(wanted, names, "here")
        self._fp32_checked = True

    # -- the explicit path ------------------------------------------------------------------------

    def sync(self, named_tensors: Iterable[tuple[str, Tensor]], *, count_step: bool = True) -> None:
        """Average the given tensors (typically gradients) over ranks, in place; one step.

        ``count_step=False`` when several syncs share one :class:`CommStats` within a step (the
        step is counted once, by one of them)."""
        named = [(name, t) for name, t in named_tensors]
        self.check_fp32_layers([name for name, _ in named])
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

    # -- one bucket, through the route ------------------------------------------------------------

    def reduce_flat(self, names: Sequence[str], flat: Tensor, sizes: Sequence[int]) -> Tensor:
        """Mean over ranks of ``flat``, the concatenation of the tensors ``names`` (of ``sizes``).

        The input may be overwritten (an all-reduce works in place) and may be the result.
        A NaN or inf in it is an error naming the tensor (:meth:`check_finite`).
        """
        self.check_finite(names, flat, sizes)
        return self.route.reduce(list(names), flat, list(sizes))

    def reduce_flat_async(self, names: Sequence[str], flat: Tensor, sizes: Sequence[int]) -> Future[Tensor]:
        """:meth:`reduce_flat` whose collective runs in the background.

        Returns a future of the mean, so that DDP can overlap the all-reduce (linear compressors)
        or the payloads' all-gather (the others) with the rest of the backward pass; decompression
        runs when the collective completes. PowerSGD's two all-reduces and TernGrad's rounds on
        the fused route are chained futures (:mod:`common.comm.routes`). Its other routes of
        several rounds (TernGrad's shared scaler per tensor, a host hierarchy) and world size 1
        complete at once. ``communicate`` seconds are then the time from launch to completion,
        overlap included.
        """
        self.check_finite(names, flat, sizes)
        return self.route.reduce_async(list(names), flat, list(sizes))

    def reduce_tensors_async(self, names: Sequence[str], tensors: Sequence[Tensor]) -> Future[list[Tensor]]:
        """:meth:`reduce_flat_async` of a bucket made of ``tensors`` (1-D, contiguous: e.g. some of
        a DDP bucket's views, not adjacent), each mean written into its own tensor; a future of
        the tensors. Where the route compresses the bucket tensor by tensor (the plain route off
        the fused one) each is compensated, compressed and decoded where it lies; otherwise they
        are gathered into one flat bucket (a ``cat``) and the mean copied back, in one op each.
        The same means either way, bit for bit."""
        names, tensors = list(names), list(tensors)
        sizes = [t.numel() for t in tensors]
        route = self.route
        if isinstance(route, PlainRoute) and route.tensor_by_tensor(names, tensors[0], sizes):
            if self.nonfinite_check and not caller_checks():
                assert_finite(tensors_finite(tensors), names, tensors, self._where())
            return route.reduce_tensors_async(names, tensors)

        def copied_back(mean: Future[Tensor]) -> list[Tensor]:
            torch._foreach_copy_(tensors, list(mean.value().split(sizes)))
            return tensors

        return self.reduce_flat_async(names, torch.cat(tensors), sizes).then(copied_back)

    def check_finite(self, names: Sequence[str], flat: Tensor, sizes: Sequence[int]) -> None:
        """Stop on a NaN or inf gradient before it is compressed or sent (a sparsifier could keep
        it in a residual, unseen): :class:`~common.finite.NonFiniteGradient` naming the tensor
        on a CPU; on a GPU an asynchronous device assertion naming the bucket (no host read)."""
        if self.nonfinite_check and not caller_checks():
            assert_finite(
                flat_finite(flat),
                list(names),
                lambda: flat.split(list(sizes)),
                self._where(),
            )

    def _where(self) -> str:
        return f"in a reduction ({self.stats.steps} sync steps counted)"

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
