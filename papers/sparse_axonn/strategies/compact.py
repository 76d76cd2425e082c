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
from common.strategies.base import MethodNeeds, SyncStrategy, _broadcast_module_state

from ..compact import CompactAdamW, MaskLayout, compact_all_reduce_
from ..pruning import apply_masks, load_masks

if TYPE_CHECKING:
    from common.config import RunConfig

_COMPACT = "it all-reduces the unpruned gradient entries only, densely, in one compact vector"


@dataclass(frozen=True)
class CompactOptions(Options):
    """``strategy_options`` of ``strategy: compact`` (the file itself is read when the run starts)."""

    kind: ClassVar[str] = "compact"
    masks: str | None = None  # the prune stage's mask file (pruning.save_masks): required
    betas: tuple[float, ...] = (0.9, 0.999)
    eps: float = 1e-8

    def __post_init__(self) -> None:
        if not isinstance(self.masks, str) or not self.masks:
            raise ValueError(
                f"compact masks must name the prune stage's mask file (a path), got {self.masks!r}"
            )
        if not isinstance(self.betas, list | tuple) or len(self.betas) != 2:
            raise ValueError(f"compact betas must be a pair [beta1, beta2], got {self.betas!r}")


def check_compact_options(options: Mapping[str, Any] | CompactOptions | None) -> CompactOptions:
    """``options`` over the defaults, validated."""
    return CompactOptions.from_mapping(options)


class CompactDataParallel(SyncStrategy):
    """Data parallelism over the unpruned entries only (module docstring).

    ``masks``: parameter name -> bool tensor (``True`` = kept), the same on every rank; parameters
    without a mask are dense. ``weight_decay``, ``betas``, ``eps``: the compact AdamW's. In a
    user's loop::

        strategy = CompactDataParallel(load_masks("masks.pt").masks, weight_decay=0.01)
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
        masks: Mapping[str, Tensor],
        *,
        weight_decay: float = 0.01,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        self.masks = dict(masks)
        self.weight_decay, self.betas, self.eps = weight_decay, (betas[0], betas[1]), eps
        self.stats = CommStats()
        self.layout: MaskLayout | None = None
        self.adam: CompactAdamW | None = None
        self._groups: list[dict[str, Any]] = []

    @classmethod
    def check_options(cls, options: dict[str, Any], world_size: int) -> Options:
        return check_compact_options(options)

    @classmethod
    def from_config(cls, config: RunConfig, options: Options | None = None) -> CompactDataParallel:
        options = check_compact_options(
            CompactOptions.from_mapping(config.strategy_options if options is None else options)
        )
        assert options.masks is not None  # checked
        path = Path(options.masks)
        if not path.is_file():
            raise FileNotFoundError(f"compact masks {path} does not exist: run the prune stage first")
        betas = (float(options.betas[0]), float(options.betas[1]))
        return cls(load_masks(path).masks, weight_decay=config.weight_decay, betas=betas, eps=options.eps)

    def setup(self, model: nn.Module) -> None:
        _broadcast_module_state(model, "parameters")
        _broadcast_module_state(model, "buffers")
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
