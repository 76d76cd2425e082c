"""Deep Gradient Compression's step as a sync strategy (Lin et al., ICLR 2018)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor, nn
from torch.futures import Future
from torch.nn.parallel import DistributedDataParallel

from ..comm.collectives import get_world_size
from ..comm.stats import CommStats
from ..comm.sync import GradientSync
from ..compressors import build_compressor
from ..compressors.base import Compressor, CompressorRNG, Payload
from ..compressors.dgc_warmup import warmup_density
from ..compressors.segments import SegmentDraws, Segments
from ..feedback import MomentumCorrection
from ..options import Options
from .base import MethodNeeds, SyncStrategy, broadcast_module_state, compressed_update_arguments

if TYPE_CHECKING:
    from ..config import RunConfig


class _CountingSparsifier(Compressor):
    """Delegates to a sparsifier and counts, from the wire, how many entries it sent out of how many.

    Biased, not linear and of variable size whatever the inner one says (a fixed-size top-k then
    pays a count exchange it could skip; DGC's sizes vary anyway). On the fused route the count of
    entries sent is a device tensor, added up on the device and read only when ``sent`` is."""

    name = "sparsifier"
    linear = False
    unbiased = False
    fixed_size = False

    def __init__(self, inner: Compressor) -> None:
        self.inner = inner
        self._sent = 0
        self._sent_on_device: Tensor | None = None
        self.seen = 0

    @property
    def sent(self) -> int:
        """Entries sent so far (reads the fused route's device count: call it to report, not per step)."""
        if self._sent_on_device is not None:
            self._sent += int(self._sent_on_device)
            self._sent_on_device = None
        return self._sent

    @sent.setter
    def sent(self, value: int) -> None:
        self._sent, self._sent_on_device = int(value), None

    def compress(self, x: Tensor, rng: CompressorRNG) -> Payload:
        payload = self.inner.compress(x, rng)
        self._sent += payload.wire["values"].numel()
        self.seen += x.numel()
        return payload

    def decompress(self, payload: Payload) -> Tensor:
        return self.inner.decompress(payload)

    def decompress_into(self, payload: Payload, out: Tensor) -> Tensor:
        return self.inner.decompress_into(payload, out)

    def sparse_sent(self, payload: Payload) -> tuple[Tensor, Tensor] | None:
        return self.inner.sparse_sent(payload)

    def aggregate(self, payloads: Sequence[Payload]) -> Tensor:
        return self.inner.aggregate(payloads)

    def aggregate_into(self, payloads: Sequence[Payload], out: Tensor) -> Tensor:
        return self.inner.aggregate_into(payloads, out)

    def fuses(self) -> bool:
        return self.inner.fuses()

    def compress_segments(self, flat: Tensor, segments: Segments, draws: SegmentDraws) -> Payload:
        payload = self.inner.compress_segments(flat, segments, draws)
        sent = payload.local.get("num_sent")
        if sent is None:  # top-k: every slot is an entry sent
            self._sent += payload.wire["values"].numel()
        else:
            self._sent_on_device = sent if self._sent_on_device is None else self._sent_on_device + sent
        self.seen += flat.numel()
        return payload

    def decode_segments_into(self, payloads: Sequence[Payload], out: Tensor) -> Tensor:
        return self.inner.decode_segments_into(payloads, out)


@dataclass(frozen=True)
class DGCOptions(Options):
    """``strategy_options`` of ``strategy: dgc``."""

    kind: ClassVar[str] = "dgc"
    momentum_correction: bool = True  # u = m u + g; v += u; send top-k of v (momentum off in the optimizer)
    masking: bool = True  # momentum factor masking: zero u (and v) where sent
    nesterov: bool = False  # the code's Nesterov variant of the correction
    clip_norm: float | None = None  # local gradient clipping at clip_norm / sqrt(N) per tensor (None: off)
    warmup: tuple[float, ...] | None = None  # densities of the first epochs, e.g. [0.25, 0.0625, 0.015625]
    warmup_epochs: float | None = (
        None  # spread the warmup entries over this many epochs (null: one epoch each)
    )
    min_dim: int = 2  # only tensors with at least this many dimensions are sparsified (the code: > 1)

    def __post_init__(self) -> None:
        if self.warmup is not None:
            if not isinstance(self.warmup, list | tuple) or not self.warmup:
                raise ValueError(f"dgc warmup must be a list of densities or null, got {self.warmup!r}")
            warmup_density(0, 1.0, self.warmup)  # validates each entry
        span = self.warmup_epochs
        if span is not None and (isinstance(span, bool) or not isinstance(span, int | float) or span <= 0):
            raise ValueError(f"dgc warmup_epochs must be a number > 0 or null, got {span!r}")
        if isinstance(self.min_dim, bool) or not isinstance(self.min_dim, int) or self.min_dim < 1:
            raise ValueError(f"dgc min_dim must be an int >= 1, got {self.min_dim!r}")
        clip = self.clip_norm
        if clip is not None and (isinstance(clip, bool) or not isinstance(clip, int | float) or clip <= 0):
            raise ValueError(f"dgc clip_norm must be a number > 0 or null, got {clip!r}")


def check_dgc_options(options: Mapping[str, Any] | DGCOptions | None) -> DGCOptions:
    """``options`` over the defaults, validated (the values the strategy will use)."""
    return DGCOptions.from_mapping(options)


WHOLE_BUCKET = 2**62  # a sync's bucket_numel under DDP's hook: every call is one of DDP's buckets


class DGCDataParallel(SyncStrategy):
    """Deep Gradient Compression's step (Lin et al., ICLR 2018; the code's ``DGCSGD`` + memory).

    Tensors with ``dim() >= min_dim`` go through the sparsifier (all-gather of values and indices)
    with :class:`~common.feedback.MomentumCorrection` as their memory; the rest (biases,
    normalisation) are all-reduced densely and get the optimizer's usual momentum after averaging.
    With momentum correction the sparsified tensors' optimizer group has momentum and weight decay
    0: the momentum is inside the accumulated ``v`` that is sent, and weight decay, never
    communicated, is applied locally with its own momentum buffer after the exchange
    (``p -= lr (m_wd + grad)``, ``m_wd = m m_wd + wd p``: the code's ``DGCSGD``). Without it, the
    memory is plain error feedback (u = g) and the optimizer applies momentum and weight decay to
    the averaged sparse gradient: Gradient Dropping, DGC's baseline. ``warmup`` sets the density
    of the first epochs (the paper's 75 % ... 99.6 % sparsity) before the compressor's own;
    ``warmup_epochs`` spreads them over that many (possibly fractional) epochs instead of one each.
    """

    name = "dgc"
    needs = MethodNeeds(
        update="own", memory="own", own_memory="momentum correction / error feedback on the update"
    )
    ignores = (("transport", "auto", "DGC all-gathers its sparse payloads"),)
    forces = (("compress_per_tensor", True, "DGC selects the top entries of each layer, also in a bucket"),)

    @classmethod
    def check_options(cls, options: dict[str, Any], world_size: int) -> Options:
        return check_dgc_options(options)

    @classmethod
    def from_config(cls, config: RunConfig, options: Options | None = None) -> DGCDataParallel:
        return cls(**compressed_update_arguments(config, DGCOptions, options))

    def __init__(
        self,
        compressor: Compressor | None = None,
        *,
        options: Mapping[str, Any] | DGCOptions | None = None,
        seed: int = 0,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        bucket_numel: int | None = None,
        fused: bool | None = None,
    ) -> None:
        compressor = self.check_compressor(compressor)
        if compressor is None or compressor.linear or compressor.density is None:
            raise ValueError(
                f"strategy dgc needs a sparsifier (values + indices, all-gathered), e.g. compressor dgc "
                f"or topk; got {getattr(compressor, 'name', None)!r}"
            )
        self.options = check_dgc_options(options)
        self.compressor = _CountingSparsifier(compressor)
        self.final_density = compressor.density
        self.momentum = momentum
        self.weight_decay = weight_decay
        corrected = self.options.momentum_correction
        self.memory = MomentumCorrection(
            momentum if corrected else 0.0,  # 0: u = g, v += g, plain error feedback
            nesterov=self.options.nesterov and corrected,
            masking=self.options.masking and corrected,
            clip_norm=self.options.clip_norm,
            world_size=get_world_size(),
        )
        self.stats = CommStats()
        self.sparse = GradientSync(
            self.compressor,
            error_feedback=self.memory,
            transport="allgather",
            bucket_numel=bucket_numel,
            compress_per_tensor=self.forced("compress_per_tensor"),
            seed=seed,
            stats=self.stats,
            fused=fused,
        )
        self.dense = GradientSync(
            build_compressor("identity"), bucket_numel=bucket_numel, seed=seed, stats=self.stats
        )
        # per DDP bucket (names): the positions of its sparsified and of its dense entries
        self._routes: dict[tuple[str, ...], tuple[_Route, _Route]] = {}
        self.wd_momentum: dict[str, Tensor] = {}
        self._after_warmup: list[int] | None = None

    def _split(
        self, model: nn.Module
    ) -> tuple[list[tuple[str, nn.Parameter]], list[tuple[str, nn.Parameter]]]:
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        sparse = [(n, p) for n, p in named if p.dim() >= self.options.min_dim]
        dense = [(n, p) for n, p in named if p.dim() < self.options.min_dim]
        return sparse, dense

    def setup(self, model: nn.Module) -> None:
        broadcast_module_state(model, "parameters")
        broadcast_module_state(model, "buffers")

    def param_groups(self, model: nn.Module) -> list[dict[str, Any]]:
        sparse, dense = self._split(model)
        if not self.options.momentum_correction:
            return [{"params": [p for _, p in sparse + dense]}]
        return [
            {"params": [p for _, p in sparse], "momentum": 0.0, "weight_decay": 0.0},
            {"params": [p for _, p in dense]},
        ]

    def set_epoch(self, epoch: float) -> None:
        warmup = self.options.warmup
        in_warmup = False
        if warmup is not None:
            span = self.options.warmup_epochs or len(warmup)
            entry = int(epoch / span * len(warmup))  # past the warm-up: the final density
            in_warmup = entry < len(warmup)
            self.compressor.inner.set_density(warmup_density(entry, self.final_density, warmup))
        if not in_warmup and self._after_warmup is None:  # counters at the first step at full sparsity
            stats = self.stats
            self._after_warmup = [
                stats.bits_sent,
                stats.dense_bits,
                stats.steps,
                self.compressor.sent,
                self.compressor.seen,
            ]

    def after_backward(self, model: nn.Module) -> None:
        sparse, dense = self._split(model)
        self.sparse.sync([(n, p.grad) for n, p in sparse if p.grad is not None], count_step=False)
        self.dense.sync([(n, p.grad) for n, p in dense if p.grad is not None])
        self.apply_weight_decay(model)

    def apply_weight_decay(self, model: nn.Module) -> None:
        """With momentum correction: the sparsified tensors' weight decay, never communicated, with
        its own momentum, added to their averaged gradients (the code's ``DGCSGD``)."""
        sparse, _ = self._split(model)
        if not (self.options.momentum_correction and self.weight_decay):
            return
        with torch.no_grad():
            named = [(n, p, p.grad) for n, p in sparse if p.grad is not None]
            fresh = [(n, p) for n, p, _ in named if n not in self.wd_momentum]
            kept = [(n, p) for n, p, _ in named if n in self.wd_momentum]
            if fresh:  # the first step: m_wd = wd p
                started = torch._foreach_mul([p.detach() for _, p in fresh], self.weight_decay)
                self.wd_momentum.update((name, buf) for (name, _), buf in zip(fresh, started, strict=True))
            if kept:  # m_wd = m m_wd + wd p, for every tensor in one launch (torch._foreach_*)
                bufs = [self.wd_momentum[n] for n, _ in kept]
                torch._foreach_mul_(bufs, self.momentum)
                torch._foreach_add_(bufs, [p.detach() for _, p in kept], alpha=self.weight_decay)
            torch._foreach_add_([g for _, _, g in named], [self.wd_momentum[n] for n, _, _ in named])

    def before_eval(self, model: nn.Module) -> None:
        broadcast_module_state(model, "buffers")

    # -- in a user's own DDP loop: a comm hook and an optimizer ------------------------------------

    def install(self, model: DistributedDataParallel, lr: float, **kwargs: Any) -> torch.optim.Optimizer:
        """DGC in a user's own DDP loop: registers DGC's exchange as ``model``'s comm hook (per
        tensor of each bucket: sparsified with momentum correction, or all-reduced densely) and
        returns SGD over DGC's parameter groups (momentum and weight decay 0 on the sparsified
        tensors under momentum correction) whose ``step`` first adds DGC's local weight decay. The
        same arithmetic and random draws as the thinwire loop's ``after_backward``::

            dgc = DGCDataParallel(build_compressor("dgc", density=0.001), momentum=0.9, weight_decay=5e-4)
            optimizer = dgc.install(model, lr=0.1)      # model = DistributedDataParallel(net)
            ...  dgc.set_epoch(step / steps_per_epoch); loss.backward(); optimizer.step()

        (Without DDP, :meth:`optimizer` does the same through explicit syncs.)
        """
        from ..comm.ddp_hook import install_method_hook

        module = model.module
        # DDP's buckets decide what travels together (as with install_ddp_hook): each bucket's
        # sparsified tensors in one all-gather and its dense ones in one all-reduce, not one
        # collective per tensor (MobileNetV2's 158 tensors: 3.30x a no-hook step per tensor, 1.26x
        # per bucket; ResNet-18 2.32x and 1.73x; benchmarks/comm/bench_ddp_hooks.py, 2 ranks).
        for sync in (self.sparse, self.dense):
            if sync.bucket_numel is None:
                sync.bucket_numel = WHOLE_BUCKET
        module = model.module
        self.param_names = {id(p): n for n, p in module.named_parameters()}
        self._sparse_names = {n for n, _ in self._split(module)[0]}
        install_method_hook(model, self)
        strategy = self

        class DGCSGD(torch.optim.SGD):
            def step(self, closure: Any = None) -> Any:
                strategy.apply_weight_decay(module)
                return super().step(closure)

        return DGCSGD(
            self.param_groups(module), lr=lr, momentum=self.momentum, weight_decay=self.weight_decay, **kwargs
        )

    def reduce_bucket_async(self, names: Sequence[str], flat: Tensor, sizes: Sequence[int]) -> Future[Tensor]:
        """The mean of one DDP bucket, as a future (the hook's work): its sparsified tensors
        through the sparse sync (their all-gather in the background, so that it overlaps the rest
        of the backward pass), the rest densely, each mean written back into ``flat``. Compression
        and momentum correction run now; decompression when the collectives complete. A route's
        tensors are the bucket's own views (``GradientSync.reduce_tensors_async``: on a CPU's
        per-tensor route each is compressed and decoded where it lies, no copy of the route)."""
        key = tuple(names)
        if key not in self._routes:
            self._routes[key] = self._bucket_routes(names, sizes)
        tensors = flat.split(list(sizes))
        pending: list[tuple[Future[Any], _Route]] = []
        for route, sync in zip(self._routes[key], (self.sparse, self.dense), strict=True):
            if route.whole:
                pending.append((sync.reduce_flat_async(route.names, flat, route.sizes), route))
            elif route.members:
                views = [tensors[i] for i in route.members]
                pending.append((sync.reduce_tensors_async(route.names, views), route))

        def written_back(_: Future[list[Future[Any]]]) -> Tensor:
            for future, route in pending:
                mean = future.value()  # raises what the route raised
                if route.whole and mean.data_ptr() != flat.data_ptr():
                    flat.copy_(mean)
            return flat

        return torch.futures.collect_all([future for future, _ in pending]).then(written_back)

    def _bucket_routes(self, names: Sequence[str], sizes: Sequence[int]) -> tuple[_Route, _Route]:
        """The sparsified and the dense tensors of a DDP bucket (positions in it, names, sizes)."""
        routes = []
        for sparse in (True, False):
            chosen = [i for i, name in enumerate(names) if (name in self._sparse_names) == sparse]
            whole = len(chosen) == len(names)
            routes.append(_Route(chosen, [names[i] for i in chosen], [sizes[i] for i in chosen], whole))
        return routes[0], routes[1]

    def metrics(self) -> dict[str, float]:
        """The density this rank actually sent (entries sent / entries of the sparsified tensors)
        over the whole run and after the warm-up, and the compression factor after the warm-up
        (dense fp32 bits / bits sent, every tensor, once the final density is reached)."""
        seen = self.compressor.seen
        out = {"density_sent": self.compressor.sent / seen if seen else math.nan}
        if self._after_warmup is not None:
            bits, dense, steps, sent, seen_before = self._after_warmup
            if self.stats.steps > steps and self.stats.bits_sent > bits:
                out["density_sent_after_warmup"] = (self.compressor.sent - sent) / (seen - seen_before)
                out["compression_after_warmup"] = (self.stats.dense_bits - dense) / (
                    self.stats.bits_sent - bits
                )
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "sparse": self.sparse.state_dict(),
            "dense": self.dense.state_dict(),
            "wd_momentum": {k: v.clone() for k, v in self.wd_momentum.items()},
            "counts": [self.compressor.sent, self.compressor.seen],
            "after_warmup": self._after_warmup,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sparse.load_state_dict(state["sparse"])
        self.dense.load_state_dict(state["dense"])
        self.wd_momentum = {k: v.clone() for k, v in state["wd_momentum"].items()}
        self.compressor.sent, self.compressor.seen = state["counts"]
        self._after_warmup = state.get("after_warmup")


@dataclass
class _Route:
    """The tensors of a DDP bucket that take one of DGC's two routes: their positions among the
    bucket's tensors, names and sizes, and whether they are the whole bucket."""

    members: list[int]
    names: list[str]
    sizes: list[int]
    whole: bool
