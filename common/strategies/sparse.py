"""Whole-model gradient sparsification: ExDyna (Yoon & Oh, CCGrid 2024) and the selectors it is
compared with, on one flattened gradient vector with error feedback.

All parameters' gradients are flattened into one vector of d entries (the authors'
``list_to_tensor``); ``a = g + r`` with the residual r; a *selector* picks indices of a; the mean
over ranks of a at the union of the selected indices is written back as the gradient (zero
elsewhere), and momentum and weight decay are applied after the reduce by the optimizer, as in the
paper's harness. Target density delta: k = max(1, ceil(delta d)) entries per step, the compressors'
rule (:func:`common.compressors.base.num_kept`). The paper writes k = floor(delta d), and so did this
module until 2026-12-05: k is one entry more where delta d is not a whole number, the same otherwise
(and with it lambda_0 = 1 / (2 sqrt(k)) and the scaling's target ratio).

Selectors (``selector`` option; what each declares, ExDyna's partitions and threshold scaling are in
:mod:`common.strategies.selectors`):

- ``exdyna``: the vector is cut into ``blocks`` (1,024) fine-grained blocks whose size is a multiple
  of 32 (the remainder goes to the last partition), grouped into W contiguous partitions. At step t
  worker r owns partition (t + r) mod W: no index is ever selected by two workers (no build-up),
  and each worker sweeps the whole vector every W steps. Selection is ``|a_j| >= lambda`` inside the
  owned partition (one scan of d / W entries through ``kernels.threshold_select``, no sort); if
  nothing passes, one index (t mod partition size) is taken. Aggregation as the paper does it: the
  counts are all-gathered, then the (padded) indices, then every rank all-reduces its own ``a`` at
  the union. Partition boundaries move one block at a time between adjacent partitions whose last
  counts differ from the mean by more than ``tolerance`` (1.05) in opposite directions, never below
  ``blocks / (4 W)`` blocks. As the code's ``ExDynaReducer``: the mean count is truncated,
  ``int(k_prev / W)``; the count a moved block carries is truncated, ``int(block size x k_prev /
  d)``; the lower edge is the code's literal 0.95238 (``round(1 / tolerance, 5)``). A last step
  with fewer entries than workers (mean 0, where the code divides by zero) moves nothing. Online
  threshold scaling: lambda_0 = 1 / (2 sqrt(k)); then with r = (entries selected last step) / k,
  lambda x 1.005 if r > 1.1, x 0.995 if r <= 0.909 (the code's literal, not 1 / 1.1), and x 1.00125
  inside the band (the code's behaviour: its in-band branch never takes the 0.9987 it spells out).
- ``topk``: local exact top-k of |a| per worker, values + int32 indices all-gathered, summed: the
  union grows up to W k when the workers disagree (gradient build-up).
- ``dgc``: DGC's sampled threshold (``common.compressors.dgc``) on the whole vector, all-gathered.
- ``threshold``: a fixed hard threshold lambda_0 = 1 / (2 sqrt(k)) (the code's ``ThreshReducer``),
  all-gathered; its density drifts with the gradients' scale.
- ``cltk``: CLT-k: a leader (rank t mod W) selects its top-k and broadcasts the indices; every rank
  all-reduces its ``a`` there (no build-up, the leader's view only).

The residual keeps everything not sent: for ``exdyna`` and ``cltk`` the union is zeroed in every
rank's residual (every rank's values there were summed); for the all-gather selectors only the
rank's own selection.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor, nn

from kernels.threshold_select import estimate_threshold, threshold_select

from ..comm.collectives import all_gather_variable, all_reduce_sum_, broadcast_, get_rank, get_world_size
from ..comm.stats import CommStats
from ..compressors.base import CompressorRNG, check_density, num_kept
from ..compressors.dgc import DGC
from ..options import Options
from .base import MethodNeeds, SyncStrategy, broadcast_module_state
from .selectors import SELECTORS, Partitions, scale_threshold

if TYPE_CHECKING:
    from ..config import RunConfig


_WHOLE_GRADIENT = "it selects from the whole flattened gradient and sends counts, indices and values"
# threshold_init "estimate" (our deviation) re-estimates lambda when a step selects fewer than k /
# RESET or more than RESET k entries: the code's 0.5 % a step would need ln(16) / ln(1.005) = 556
# steps to close that gap (on MNIST the first step's gradients, 10^4 x the later ones, set a
# threshold the 642-step run never came down from: 2 entries a step instead of 70).
RESET = 16


@dataclass(frozen=True)
class SparseOptions(Options):
    """``strategy_options`` of ``strategy: sparse``."""

    kind: ClassVar[str] = "sparse"
    selector: str = "exdyna"
    density: float = 0.001  # target: k = ceil(density d) entries of the whole gradient per step
    blocks: int = 1024  # exdyna: fine-grained blocks (sizes a multiple of 32)
    tolerance: float = 1.05  # exdyna: rebalance adjacent partitions beyond this ratio to the mean count
    # exdyna / threshold: lambda_0. null: 1 / (2 sqrt(k)), the code's; a number; or "estimate": the
    # top-k threshold of a 1 % sample of the first step's a, averaged over ranks (a deviation: the
    # code's value can be off by a factor that its 0.5 %-per-step scaling needs hundreds of steps for),
    # made again after any step that selects fewer than k / RESET or more than RESET k entries
    threshold_init: float | str | None = None

    def __post_init__(self) -> None:
        if self.selector not in SELECTORS:
            raise ValueError(f"sparse selector must be one of {', '.join(SELECTORS)}, got {self.selector!r}")
        check_density(self.density)
        blocks = self.blocks
        if isinstance(blocks, bool) or not isinstance(blocks, int) or blocks < 1:
            raise ValueError(f"sparse blocks must be an int >= 1, got {blocks!r}")
        tol = self.tolerance
        if isinstance(tol, bool) or not isinstance(tol, int | float) or tol < 1.0:
            raise ValueError(
                f"sparse tolerance must be a number >= 1 (a ratio to the mean count), got {tol!r}"
            )
        init = self.threshold_init
        if (
            init is not None
            and init != "estimate"
            and (isinstance(init, bool) or not isinstance(init, int | float) or init <= 0)
        ):
            raise ValueError(f'sparse threshold_init must be a number > 0, "estimate" or null, got {init!r}')


def check_sparse_options(options: Mapping[str, Any] | SparseOptions | None) -> SparseOptions:
    """``options`` over the defaults, validated (the values the strategy will use)."""
    return SparseOptions.from_mapping(options)


class SparseDataParallel(SyncStrategy):
    """Data parallelism through one selector over the whole flattened gradient (module docstring)."""

    name = "sparse"
    needs = MethodNeeds(
        compressor=False,
        own_exchange="selects from the whole gradient and keeps its own residual",
        memory="own",
    )
    ignores = (
        ("transport", "auto", _WHOLE_GRADIENT),
        ("bucket_numel", None, _WHOLE_GRADIENT),
        ("compress_per_tensor", False, _WHOLE_GRADIENT),
    )

    @classmethod
    def check_options(cls, options: dict[str, Any], world_size: int) -> Options:
        return check_sparse_options(options)

    @classmethod
    def from_config(cls, config: RunConfig, options: Options | None = None) -> SparseDataParallel:
        return cls(
            options=SparseOptions.from_mapping(config.strategy_options if options is None else options),
            seed=config.seed,
        )

    def __init__(
        self,
        compressor: None = None,
        *,
        options: Mapping[str, Any] | SparseOptions | None = None,
        seed: int = 0,
    ) -> None:
        """``compressor``: none (the selector is in the options); ``seed``: the dgc selector's
        sampling and the threshold estimate's sample (shared generators)."""
        self.check_compressor(compressor)
        self.options = check_sparse_options(options)
        self.selector = self.options.selector
        self.selector_needs = SELECTORS[self.selector]
        self.density = float(self.options.density)
        self.seed = seed
        self.stats = CommStats()
        self.world = get_world_size()
        self.rank = get_rank()
        self.numel = 0
        self.k = 0
        self.partitions: Partitions | None = None
        self.threshold = 0.0
        self.resets = 0  # threshold re-estimates (threshold_init "estimate", see RESET)
        self.residual: Tensor | None = None
        self.steps = 0
        self.trace: dict[str, list[float]] = {
            key: [] for key in ("density", "select_seconds", "union", "imbalance", "threshold")
        }
        self._window = 0
        self._rng: CompressorRNG | None = None
        self._dgc: DGC | None = None  # the dgc selector's sampler, made at its first use
        # The flat indices (int64) this rank selects each step (for cltk: the leader's, others empty).
        self._select = {
            "exdyna": self._select_exdyna,
            "topk": self._select_topk,
            "dgc": self._select_dgc,
            "threshold": self._select_threshold,
            "cltk": self._select_cltk,
        }[self.selector]
        self.last_selected: Tensor | None = None

    def setup(self, model: nn.Module) -> None:
        broadcast_module_state(model, "parameters")
        broadcast_module_state(model, "buffers")
        self.numel = sum(p.numel() for p in model.parameters() if p.requires_grad)
        self.k = num_kept(self.numel, self.density)
        if self.selector_needs.partitions:
            self.partitions = Partitions(
                self.numel, self.world, blocks=self.options.blocks, tolerance=self.options.tolerance
            )
        init = self.options.threshold_init
        if not self.threshold and init != "estimate":
            self.threshold = float(init or 1.0 / (2.0 * math.sqrt(self.k)))

    def before_eval(self, model: nn.Module) -> None:
        broadcast_module_state(model, "buffers")

    # -- the step -------------------------------------------------------------------------------

    def after_backward(self, model: nn.Module) -> None:
        params = [p for p in model.parameters() if p.requires_grad]
        if any(p.grad is None for p in params):
            raise RuntimeError("strategy sparse needs a gradient for every trainable parameter")
        grads = [p.grad for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])  # type: ignore[union-attr]
        if self.residual is None:
            self.residual = torch.zeros_like(flat)
        accumulated = flat.add_(self.residual)
        if not self.threshold:  # threshold_init "estimate", first step
            self._estimate_threshold(accumulated)
        start = time.perf_counter()
        with self.stats.phase("compress", flat.device):
            own = self._select(accumulated)
        self.last_selected = own  # this rank's flat indices this step (inspection, tests)
        select_seconds = time.perf_counter() - start
        with self.stats.phase("communicate", flat.device):
            mean, union, counts = self._aggregate(accumulated, own)
        with self.stats.phase("decompress", flat.device):
            out = torch.zeros_like(accumulated)
            out.index_put_((union,), mean, accumulate=True)
            residual = accumulated
            gathered = self.selector_needs.exchange == "gather"
            residual[own if gathered else union] = 0.0
            self.residual = residual
            for g, part in zip(grads, out.split([g.numel() for g in grads]), strict=True):  # type: ignore[union-attr]
                g.copy_(part.view_as(g))  # type: ignore[union-attr]
        union_size = int(torch.unique(union).numel()) if gathered else union.numel()
        self._record(select_seconds, union_size, counts)
        if self.world > 1:
            self.stats.dense_bits += self.numel * 32
        self.stats.steps += 1
        self.steps += 1

    def _estimate_threshold(self, a: Tensor) -> None:
        """lambda_0 = the mean over ranks of the top-k threshold of a 1 % sample of |a| (one fp32
        all-reduce, counted)."""
        generator = self._rng_for(a.device).shared
        estimate = estimate_threshold(a, self.density, sample_fraction=0.01, generator=generator).reshape(1)
        all_reduce_sum_(estimate, stats=self.stats)
        self.threshold = float(estimate) / self.world

    def _rng_for(self, device: torch.device) -> CompressorRNG:
        if self._rng is None:
            self._rng = CompressorRNG(self.seed, self.rank, device)
        return self._rng

    def _select_exdyna(self, a: Tensor) -> Tensor:
        """Indices at or above the threshold in the partition this rank owns this step."""
        assert self.partitions is not None
        start, end = self.partitions.span((self.steps + self.rank) % self.world)
        part = a[start:end]
        capacity = min(part.numel(), 4 * self.k // self.world + 64)
        _, indices, count = threshold_select(part, self.threshold, capacity)
        n = int(count)
        if n > capacity:  # the estimate was short: one more pass with room for all
            _, indices, count = threshold_select(part, self.threshold, n)
        if n == 0:  # the code's fallback: one index, moving with the step
            return torch.tensor([start + self.steps % part.numel()], device=a.device)
        return indices[:n].long() + start

    def _select_threshold(self, a: Tensor) -> Tensor:
        return torch.nonzero(a.abs() >= self.threshold).reshape(-1)

    def _select_topk(self, a: Tensor) -> Tensor:
        return torch.topk(a.abs(), self.k, sorted=False).indices

    def _select_dgc(self, a: Tensor) -> Tensor:
        if self._dgc is None:
            self._dgc = DGC(self.density)
        return self._dgc.compress(a, self._rng_for(a.device)).wire["indices"].long()

    def _select_cltk(self, a: Tensor) -> Tensor:
        if self.rank == self.steps % self.world:  # the leader of this step
            return torch.topk(a.abs(), self.k, sorted=False).indices
        return torch.empty(0, dtype=torch.int64, device=a.device)

    def _aggregate(self, a: Tensor, own: Tensor) -> tuple[Tensor, Tensor, list[int]]:
        """(mean values, their flat indices, per-rank selected counts)."""
        world, exchange = self.world, self.selector_needs.exchange
        if exchange == "leader":
            indices = (
                own.to(torch.int32)
                if own.numel()
                else torch.empty(self.k, dtype=torch.int32, device=a.device)
            )
            broadcast_(indices, src=self.steps % world, stats=self.stats)
            union = indices.long()
            values = a[union].clone()
            all_reduce_sum_(values, stats=self.stats)
            return values.div_(world), union, [self.k]
        if exchange == "union":
            gathered = all_gather_variable([own.to(torch.int32)], stats=self.stats)
            union = torch.cat([g[0] for g in gathered]).long()  # disjoint partitions: no duplicate
            values = a[union].clone()
            all_reduce_sum_(values, stats=self.stats)
            return values.div_(world), union, [g[0].numel() for g in gathered]
        gathered = all_gather_variable(
            [a[own], own.to(torch.int32)], sizes_known=self.selector_needs.fixed_count, stats=self.stats
        )
        values = torch.cat([g[0] for g in gathered]).div_(world)
        union = torch.cat([g[1] for g in gathered]).long()  # duplicates summed by the index_put_
        return values, union, [g[1].numel() for g in gathered]

    def _record(self, select_seconds: float, union_size: int, counts: list[int]) -> None:
        selected = sum(counts)
        if self.selector_needs.partitions:
            assert self.partitions is not None
            by_partition = [0] * self.world
            for r, count in enumerate(counts):
                by_partition[(self.steps + r) % self.world] = count
            self.partitions.rebalance(by_partition)
        if self.selector_needs.online_threshold:
            self.threshold = scale_threshold(self.threshold, selected, self.k)
        imbalance = self.world * max(counts) / selected - 1 if selected and len(counts) > 1 else 0.0
        for key, value in (
            ("density", union_size / self.numel),
            ("select_seconds", select_seconds),
            ("union", float(union_size)),
            ("imbalance", imbalance),
            ("threshold", self.threshold),
        ):
            self.trace[key].append(float(value))
        far = not self.k / RESET <= selected <= RESET * self.k
        if self.selector_needs.online_threshold and self.options.threshold_init == "estimate" and far:
            self.threshold = 0.0  # re-estimated from the next step's accumulated gradient
            self.resets += 1

    # -- what the run records -------------------------------------------------------------------

    def log_values(self) -> dict[str, float]:
        """Means over the steps since the last call (the training curve's extra columns)."""
        window = slice(self._window, None)
        self._window = len(self.trace["density"])
        out = {}
        for key in ("density", "select_seconds", "union", "imbalance", "threshold"):
            values = self.trace[key][window]
            out[key] = statistics.fmean(values) if values else math.nan
        return out

    def metrics(self) -> dict[str, float]:
        density = self.trace["density"]
        if not density:
            return {}
        return {
            "density_target": self.density,
            "density_mean": statistics.fmean(density),
            "density_std": statistics.pstdev(density),
            "density_min": min(density),
            "density_max": max(density),
            "select_seconds_mean": statistics.fmean(self.trace["select_seconds"]),
            "union_mean": statistics.fmean(self.trace["union"]),
            "buildup_mean": statistics.fmean(self.trace["union"]) / self.k,
            "imbalance_mean": statistics.fmean(self.trace["imbalance"]),
            "threshold_final": self.threshold,
            "threshold_resets": float(self.resets),
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "stats": self.stats.state_dict(),
            "residual": None if self.residual is None else self.residual.clone(),
            "bounds": None if self.partitions is None else list(self.partitions.bounds),
            "threshold": self.threshold,
            "steps": self.steps,
            "trace": {k: list(v) for k, v in self.trace.items()},
            "window": self._window,
            "rng": None if self._rng is None else self._rng.state_dict(),
            "resets": self.resets,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stats.load_state_dict(state["stats"])
        self.residual = None if state["residual"] is None else state["residual"].clone()
        if self.partitions is not None and state["bounds"] is not None:
            self.partitions.bounds = list(state["bounds"])
        self.threshold = float(state["threshold"])
        self.steps = int(state["steps"])
        self.trace = {k: list(v) for k, v in state["trace"].items()}
        self._window = int(state["window"])
        self.resets = int(state.get("resets", 0))
        if state["rng"] is not None:
            device = self.residual.device if self.residual is not None else torch.device("cpu")
            self._rng_for(device).load_state_dict(state["rng"])
