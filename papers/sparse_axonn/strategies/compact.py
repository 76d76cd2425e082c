"""Sparse AxoNN's data parallelism on a pruned model as a sync strategy (Singh & Bhatele, IPDPS 2023).

With a static mask, identical on every rank (loaded from the prune stage's file, never recomputed
per rank), each step packs the gradient entries of the unpruned weights into one compact vector of
K entries, all-reduces it densely (no index crosses the wire), and applies AdamW to compact fp32
master weights and moments (:class:`~papers.sparse_axonn.compact.CompactAdamW`), which it writes
back into the model at the kept positions: pruned weights stay exactly zero, and the optimizer
state is 12 K bytes instead of 12 N. Bits on the wire per step: ``32 K`` instead of ``32 N``.

The optimizer a run (or a user's :meth:`SyncStrategy.optimizer`) builds is plain AdamW over the
strategy's one parameter group: it only carries the scheduled learning rate, which the compact
AdamW reads each step, and sees no gradient (``p.grad`` is cleared after the compact step).
Its inter-layer x data parallelism is
:class:`~papers.sparse_axonn.strategies.pipeline.PipelineDataParallel` (``strategy: pipeline``);
this is its data-parallel part on a whole model, in any loop. The library knows both by name only
(``common.methods.STRATEGIES``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from torch import Tensor, nn

from common.comm.collectives import get_world_size
from common.comm.stats import CommStats
from common.options import Options
from common.strategies.base import MethodNeeds, SyncStrategy, broadcast_module_state

from ..compact import CompactAdamW, MaskLayout, compact_all_reduce_
from ..pruning import apply_masks, load_masks

if TYPE_CHECKING:
    from common.config import RunConfig

_COMPACT = "it all-reduces the unpruned gradient entries only, densely, in one compact vector"


@dataclass(frozen=True)
class CompactOptions(Options):
    """``strategy_options`` of ``strategy: compact`` (the file itself is read when the strategy is
    built). A run names ``masks`` (:meth:`CompactDataParallel.check_options`); a user's own loop may
    hand the mask tensors to the constructor instead."""

    kind: ClassVar[str] = "compact"
    masks: str | None = None  # the prune stage's mask file (pruning.save_masks): a run's is required
    betas: tuple[float, ...] = (0.9, 0.999)
    eps: float = 1e-8

    def __post_init__(self) -> None:
        if self.masks is not None and (not isinstance(self.masks, str) or not self.masks):
            raise ValueError(
                f"compact masks must name the prune stage's mask file (a path), got {self.masks!r}"
            )
        if not isinstance(self.betas, list | tuple) or len(self.betas) != 2:
            raise ValueError(f"compact betas must be a pair [beta1, beta2], got {self.betas!r}")


def check_compact_options(options: Mapping[str, Any] | Options | None) -> CompactOptions:
    """A run's ``options`` over the defaults, validated: they must name the mask file."""
    checked = CompactOptions.from_mapping(options)
    if checked.masks is None:
        raise ValueError("compact masks must name the prune stage's mask file (a path), got None")
    return checked


class CompactDataParallel(SyncStrategy):
    """Data parallelism over the unpruned entries only (module docstring).

    ``masks``: parameter name -> bool tensor (``True`` = kept), the same on every rank, or None to
    load them from ``options.masks`` (the prune stage's file); parameters without a mask are dense.
    ``weight_decay`` (the run's; default torch's AdamW's), ``options.betas`` and ``options.eps``: the
    compact AdamW's. No
    draws: ``seed`` is kept, not used. In a user's loop::

        strategy = CompactDataParallel(masks=load_masks("masks.pt").masks, weight_decay=0.01)
        optimizer = strategy.optimizer(model, torch.optim.AdamW, lr=1e-3)   # the lr it schedules
        ...  loss.backward(); optimizer.step()
    """

    name = "compact"
    needs = MethodNeeds(
        compressor=False,
        own_exchange=_COMPACT.removeprefix("it "),
        update="own",
        update_rule="AdamW on the unpruned entries",
        run_optimizer="adamw",
        memory="none",
    )
    ignores = (
        ("transport", "auto", _COMPACT),
        ("bucket_numel", None, _COMPACT),
        ("compress_per_tensor", False, _COMPACT),
    )

    def __init__(
        self,
        compressor: None = None,
        *,
        options: Mapping[str, Any] | CompactOptions | None = None,
        seed: int = 0,
        masks: Mapping[str, Tensor] | None = None,
        weight_decay: float = 0.01,
    ) -> None:
        if isinstance(compressor, Mapping):
            raise TypeError("CompactDataParallel takes its masks by keyword: CompactDataParallel(masks=...)")
        self.check_compressor(compressor)
        self.options = CompactOptions.from_mapping(options)
        if (masks is None) == (self.options.masks is None):
            raise ValueError(
                "compact needs its masks once: the tensors (masks=...) or the prune stage's file "
                f"(options masks), got {'neither' if masks is None else 'both'}"
            )
        if masks is None:
            assert self.options.masks is not None
            path = Path(self.options.masks)
            if not path.is_file():
                raise FileNotFoundError(f"compact masks {path} does not exist: run the prune stage first")
            masks = load_masks(path).masks
        self.masks = dict(masks)
        self.seed = seed
        self.weight_decay = weight_decay
        self.betas = (float(self.options.betas[0]), float(self.options.betas[1]))
        self.eps = self.options.eps
        self.stats = CommStats()
        self.layout: MaskLayout | None = None
        self.adam: CompactAdamW | None = None
        self._groups: list[dict[str, Any]] = []

    @classmethod
    def check_options(cls, options: dict[str, Any], world_size: int) -> Options:
        return check_compact_options(options)

    @classmethod
    def from_config(cls, config: RunConfig, options: Options | None = None) -> CompactDataParallel:
        options = check_compact_options(config.strategy_options if options is None else options)
        return cls(options=options, seed=config.seed, weight_decay=config.weight_decay)

    def setup(self, model: nn.Module) -> None:
        broadcast_module_state(model, "parameters")
        broadcast_module_state(model, "buffers")
        apply_masks(model, self.masks)
        self.layout = MaskLayout(model, self.masks)
        self.layout.verify_across_ranks()  # set-up: 32 bytes a rank, not counted as training traffic
        self.adam = CompactAdamW(
            model, self.layout, lr=0.0, betas=self.betas, eps=self.eps, weight_decay=self.weight_decay
        )

    def param_groups(self, model: nn.Module) -> list[dict[str, Any]]:
        """One group for the optimizer's scheduled lr (no decay: the compact AdamW applies it)."""
        self._groups = [{"params": [p for p in model.parameters() if p.requires_grad], "weight_decay": 0.0}]
        return self._groups

    def after_backward(self, model: nn.Module) -> None:
        if self.layout is None or self.adam is None:
            raise RuntimeError("setup() was not called: build the optimizer with strategy.optimizer()")
        compact = self.layout.pack_grads(model)
        compact_all_reduce_(compact, stats=self.stats)
        if get_world_size() > 1:
            self.stats.dense_bits += self.layout.numel * 32
        self.stats.steps += 1
        self.adam.lr = self.scheduled_lr()
        self.adam.step(compact)
        for p in self.layout.check_model(model):
            p.grad = None  # the outer optimizer only schedules the lr

    def metrics(self) -> dict[str, float]:
        return {"density": self.layout.density if self.layout is not None else float("nan")}

    def state_dict(self) -> dict[str, Any]:
        assert self.adam is not None, "setup() first"
        return {"adam": self.adam.state_dict(), "stats": self.stats.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        assert self.adam is not None, "setup() first"
        self.adam.load_state_dict(state["adam"])
        self.stats.load_state_dict(state["stats"])
