"""Sparse AxoNN's inter-layer (pipeline) x data parallelism as a sync strategy of the thinwire loop.

AxoNN's 2-D hybrid (Singh & Bhatele, IPDPS'22/'23; :mod:`common.pipeline`): the world is ``S``
pipeline stages x ``R`` data-parallel replicas, ``rank = replica * S + stage``. The loop builds the
whole model (a ``gpt2_small`` with ``tied: false``) on every rank; :meth:`PipelineDataParallel.shard`
keeps this rank's stage (:class:`common.pipeline.GPT2Stage`) and the loop trains only that: its
checkpoints hold the stage's parameters, the compact optimizer state and the counters.

Per step, on each rank: the ranks of a replica read the same batch (``batch_size`` is per replica:
the loop splits the data over the ``R`` replicas, not over the ranks), the schedule
(``torch.distributed.pipelining``, GPipe or 1F1B) runs ``microbatches`` micro-batches forward and
backward, sending activations and their gradients point to point inside the replica; then the
stage's gradients are summed over its replicas (AxoNN's loss scaling, ``1 / (M R)`` per micro-batch,
makes the sum the mean over the global batch) and AdamW steps:

- with ``masks`` (the prune stage's file): sparse AxoNN. Only the unpruned entries are all-reduced,
  in one compact vector, and AdamW keeps fp32 master weights and moments of those entries only
  (:class:`common.compact.CompactTraining`); pruned weights stay exactly zero;
- without: dense AxoNN, the same step with every entry kept (one flat all-reduce, AdamW on every
  entry; :class:`common.compact.CompactAdamW` equals ``torch.optim.AdamW(foreach=False)``).

Bits on the wire (``stats``): the activations and activation gradients this rank sends, and the
stage's all-reduce; ``dense_bits`` is the same step without pruning (the activations are dense
either way), so the compression factor is the traffic saved by pruning. The loss of the replica is
broadcast from its last stage to its other stages for the training curve (one scalar a step,
instrumentation, not counted). Evaluation gathers replica 0's stages into a whole model on every
rank (not counted either), which is also what the run saves as ``model.pt``.
"""

from __future__ import annotations

import contextlib
import io
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..comm.collectives import get_world_size, is_distributed
from ..compact import CompactTraining, stage_masks
from ..options import Options
from ..pipeline import SCHEDULES, GPT2Stage, PipelineTrainer, ProcessGrid, grid_shape
from ..pruning import apply_masks, load_masks
from .base import LossFn, MethodNeeds, SyncStrategy

if TYPE_CHECKING:
    from ..config import RunConfig

_EXCHANGE = (
    "sends activations point to point along each replica's stages and all-reduces each stage's "
    "gradients over its replicas (the unpruned entries only, with masks)"
)


@dataclass(frozen=True)
class PipelineOptions(Options):
    """``strategy_options`` of ``strategy: pipeline``."""

    kind: ClassVar[str] = "pipeline"
    stages: int = 2  # S: world_size = S x R replicas
    microbatches: int = 2  # M per replica and step: batch_size (per replica) must divide by it
    schedule: str = "gpipe"  # or 1f1b (needs microbatches >= stages)
    masks: str | None = None  # the prune stage's mask file: sparse AxoNN; none: dense AxoNN
    grads: str = "dense"  # "packed": each gradient packed into the compact vector as it is accumulated
    betas: tuple[float, ...] = (0.9, 0.999)
    eps: float = 1e-8

    def __post_init__(self) -> None:
        for name in ("stages", "microbatches"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"pipeline {name} must be an integer >= 1, got {value!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(
                f"pipeline schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}"
            )
        if self.schedule == "1f1b" and self.microbatches < self.stages:
            raise ValueError(
                f"pipeline schedule 1f1b needs microbatches >= stages, got {self.microbatches} < {self.stages}"
            )
        if self.masks is not None and (not isinstance(self.masks, str) or not self.masks):
            raise ValueError(
                f"pipeline masks must name the prune stage's mask file (a path), got {self.masks!r}"
            )
        if self.grads not in ("dense", "packed"):
            raise ValueError(f"pipeline grads must be dense or packed, got {self.grads!r}")
        if not isinstance(self.betas, list | tuple) or len(self.betas) != 2:
            raise ValueError(f"pipeline betas must be a pair [beta1, beta2], got {self.betas!r}")


def check_pipeline_options(options: Any, world_size: int) -> PipelineOptions:
    """``options`` over the defaults, validated against ``world_size`` (S must divide it)."""
    checked = PipelineOptions.from_mapping(options)
    if world_size % checked.stages:
        raise ValueError(
            f"pipeline stages={checked.stages} do not divide world_size={world_size}: the grid is "
            "stages x replicas ranks"
        )
    return checked


def _language_model(model: nn.Module) -> nn.Module:
    """The ``transformers.GPT2LMHeadModel`` inside ``model`` (a ``gpt2_small``), or ``model`` itself."""
    from ..models import GPT2LanguageModel

    return model.gpt2 if isinstance(model, GPT2LanguageModel) else model


class PipelineDataParallel(SyncStrategy):
    """Pipeline x data parallelism with AxoNN's (or sparse AxoNN's) step (module docstring).

    ``masks``: parameter name (the GPT-2's own, ``transformer.h.0.attn.c_attn.weight``) -> bool
    tensor, ``None`` for dense AxoNN. ``weight_decay``, ``betas``, ``eps``: AdamW's.
    """

    name = "pipeline"
    needs = MethodNeeds(
        compressor=False,
        own_exchange=_EXCHANGE,
        update="own",
        update_rule="AdamW (on the unpruned entries, with masks)",
        run_optimizer="adamw",
        memory="none",
    )
    ignores = (
        ("transport", "auto", "it all-reduces each stage's gradients in one flat (or compact) buffer"),
        ("bucket_numel", None, "it all-reduces each stage's gradients in one flat (or compact) buffer"),
        ("compress_per_tensor", False, "nothing is compressed: pruning decides what is sent"),
        ("grad_clip_norm", None, "a stage holds part of the model: clipping its own norm is not the model's"),
        ("channels_last", False, "the pipeline trains a language model"),
    )

    def __init__(
        self,
        options: PipelineOptions,
        masks: dict[str, Tensor] | None = None,
        *,
        weight_decay: float = 0.01,
    ) -> None:
        super().__init__()
        self.options = options
        self.masks = masks
        self.weight_decay = weight_decay
        self.grid: ProcessGrid | None = None
        self.trainer: PipelineTrainer | None = None
        self.training: CompactTraining | None = None
        self._rebuild: Callable[[], nn.Module] | None = None
        self._groups: list[dict[str, Any]] = []
        self._num_params = 0

    @classmethod
    def check_options(cls, options: dict[str, Any], world_size: int) -> Options:
        return check_pipeline_options(options, world_size)

    @classmethod
    def check_run(cls, config: RunConfig) -> None:
        options = check_pipeline_options(config.strategy_options, config.world_size)
        if config.model != "gpt2_small" or config.model_options.get("tied", True) is not False:
            raise ValueError(
                "strategy pipeline splits a GPT-2 into stages: set model: gpt2_small with model_options "
                f"tied: false (got model {config.model!r}, model_options {config.model_options!r})"
            )
        n_layer = config.model_options.get("n_layer", 2)
        grid_shape(config.world_size, options.stages, n_layer)
        if config.batch_size % options.microbatches:
            raise ValueError(
                f"strategy pipeline: batch_size {config.batch_size} (per replica) must divide by "
                f"microbatches={options.microbatches}"
            )

    @classmethod
    def from_config(cls, config: RunConfig) -> PipelineDataParallel:
        options = check_pipeline_options(config.strategy_options, config.world_size)
        masks = None
        if options.masks is not None:
            path = Path(options.masks)
            if not path.is_file():
                raise FileNotFoundError(f"pipeline masks {path} does not exist: run the prune stage first")
            masks = load_masks(path).masks
        return cls(options, masks, weight_decay=config.weight_decay)

    # -- the loop's hooks ----------------------------------------------------------------------

    def shard(self, model: nn.Module, rebuild: Callable[[], nn.Module]) -> nn.Module:
        """This rank's stage of ``model``; ``rebuild()`` makes a fresh whole model for evaluation."""
        inner = _language_model(model)
        blocks: Any = inner.transformer.h  # type: ignore[union-attr]
        self.grid = ProcessGrid.create(self.options.stages, num_blocks=len(blocks))
        self._rebuild = rebuild
        return GPT2Stage(inner, self.grid.stage, self.grid.num_stages)

    def batch_position(self, rank: int, world_size: int) -> tuple[int, int]:
        """The stages of a replica train on the same batch: the data is split over the replicas."""
        grid = self._grid()
        return grid.replica, grid.num_replicas

    def setup(self, model: nn.Module) -> None:
        grid = self._grid()
        if is_distributed() and grid.num_replicas > 1:  # replica 0's stage, on every replica (set-up)
            source = grid.rank_of(grid.stage, 0)
            with torch.no_grad():
                for t in [*model.parameters(), *model.buffers()]:
                    dist.broadcast(t.data, src=source, group=grid.data_parallel_group)
        masks = stage_masks(model, self.masks or {})
        apply_masks(model, masks)
        betas = (float(self.options.betas[0]), float(self.options.betas[1]))
        self.training = CompactTraining(
            model,
            masks,
            lr=0.0,
            weight_decay=self.weight_decay,
            betas=betas,
            eps=self.options.eps,
            grads=self.options.grads,
        )
        # set-up: 32 bytes a rank, not training traffic
        self.training.layout.verify_across_ranks(group=grid.data_parallel_group)
        self._num_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
        device = next(model.parameters()).device
        self.trainer = PipelineTrainer(
            model,
            grid,
            self.training,
            num_microbatches=self.options.microbatches,
            schedule=self.options.schedule,
            reduce_grads=self.training,
            device=device,
            p2p_stats=self.stats,
        )

    def param_groups(self, model: nn.Module) -> list[dict[str, Any]]:
        """One group for the optimizer's scheduled lr (no decay: the compact AdamW applies it)."""
        self._groups = [{"params": [p for p in model.parameters() if p.requires_grad], "weight_decay": 0.0}]
        return self._groups

    def forward_backward(self, model: nn.Module, x: Tensor, y: Tensor, loss_fn: LossFn) -> Tensor:
        trainer, training, grid = self._trainer(), self._training(), self._grid()
        trainer.loss_fn = loss_fn
        training.compact_grad.zero_()  # packed gradients accumulate into it
        sent, compute = self.stats.bits_sent, trainer.compute_seconds
        start = time.perf_counter()
        loss = trainer.forward_backward(x, y)
        if grid.num_stages > 1:  # transfers and waiting for the neighbours: the pipeline phase less compute
            pipeline = time.perf_counter() - start
            self.stats.seconds["communicate"] += pipeline - (trainer.compute_seconds - compute)
        self.stats.dense_bits += self.stats.bits_sent - sent  # activations: dense either way
        out = torch.zeros((), device=trainer.device) if loss is None else loss.detach().float()
        if grid.num_stages > 1:  # the replica's loss on its every stage (instrumentation)
            dist.broadcast(
                out, src=grid.rank_of(grid.num_stages - 1, grid.replica), group=grid.pipeline_group
            )
        return out

    def after_backward(self, model: nn.Module) -> None:
        trainer, training, grid = self._trainer(), self._training(), self._grid()
        with self.stats.phase("communicate", trainer.device):
            training(model, grid.data_parallel_group, stats=self.stats)
        self.stats.steps += 1
        training.set_lr(self.scheduled_lr())
        training.step()
        for p in model.parameters():
            p.grad = None  # the outer optimizer only schedules the lr

    @contextlib.contextmanager
    def evaluating(self, model: nn.Module) -> Iterator[nn.Module]:
        """The whole model, from replica 0's stages, on every rank (gathered, not counted)."""
        grid = self._grid()
        assert self._rebuild is not None
        buffer = io.BytesIO()
        torch.save(
            {k: v.detach().cpu() for k, v in model.state_dict().items()} if grid.replica == 0 else {}, buffer
        )
        blobs: list[Any] = [buffer.getvalue()]
        if is_distributed():
            blobs = [None] * get_world_size()
            dist.all_gather_object(blobs, buffer.getvalue())
        with torch.random.fork_rng(devices=[]):  # building it must not move the training's RNG
            whole = self._rebuild()
        state: dict[str, Tensor] = {}
        for blob in blobs:
            state.update(torch.load(io.BytesIO(blob), weights_only=True))
        inner = _language_model(whole)
        missing, unexpected = inner.load_state_dict(state, strict=False)
        params = {n for n, _ in inner.named_parameters()}
        uncovered = [k for k in missing if k in params]
        if uncovered or unexpected:
            raise RuntimeError(
                f"the stages do not make up the model: missing {uncovered[:4]}, unexpected {unexpected[:4]}"
            )
        yield whole

    def metrics(self) -> dict[str, float]:
        training, grid = self._training(), self._grid()
        return {
            "num_stages": float(grid.num_stages),
            "num_replicas": float(grid.num_replicas),
            "stage_params": float(self._num_params),  # this rank's (rank 0: the first stage)
            "stage_density": training.layout.density,
        }

    def state_dict(self) -> dict[str, Any]:
        return {"compact": self._training().state_dict(), "stats": self.stats.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._training().load_state_dict(state["compact"])
        self.stats.load_state_dict(state["stats"])

    def _grid(self) -> ProcessGrid:
        if self.grid is None:
            raise RuntimeError("shard() first: the loop calls it with the built model")
        return self.grid

    def _trainer(self) -> PipelineTrainer:
        if self.trainer is None:
            raise RuntimeError("setup() first")
        return self.trainer

    def _training(self) -> CompactTraining:
        if self.training is None:
            raise RuntimeError("setup() first")
        return self.training
