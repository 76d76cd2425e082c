"""Sparse AxoNN's inter-layer (pipeline) x data parallelism as a sync strategy of the thinwire loop.

AxoNN's 2-D hybrid (Singh & Bhatele, IPDPS'22/'23; :mod:`papers.sparse_axonn.pipeline_stages`):
the world is ``S`` pipeline stages x ``R`` data-parallel replicas, ``rank = replica * S + stage``.
The loop builds the whole model (a ``gpt2_small`` with ``tied: false``) on every rank;
:meth:`PipelineDataParallel.shard` keeps this rank's stage
(:class:`~papers.sparse_axonn.pipeline_stages.GPT2Stage`) and the loop trains only that: its
checkpoints hold the stage's parameters, the compact optimizer state and the counters.

Per step, on each rank: the ranks of a replica read the same batch (``batch_size`` is per replica:
the loop splits the data over the ``R`` replicas, not over the ranks), the schedule
(``torch.distributed.pipelining``, GPipe or 1F1B) runs ``microbatches`` micro-batches forward and
backward, sending activations and their gradients point to point inside the replica; then the
stage's gradients are summed over its replicas (AxoNN's loss scaling, ``1 / (M R)`` per micro-batch,
makes the sum the mean over the global batch) and AdamW steps:

- with ``masks`` (the prune stage's file): sparse AxoNN. Only the unpruned entries are all-reduced,
  in one compact vector, and AdamW keeps fp32 master weights and moments of those entries only
  (:class:`~papers.sparse_axonn.compact.CompactTraining`); pruned weights stay exactly zero.
  ``compute: csr`` also runs the pruned layers as CSR matmuls (the Sputnik-like baseline,
  :mod:`papers.sparse_axonn.sparse_compute`);
- without: dense AxoNN, one flat all-reduce of the stage's gradients and the run's AdamW on every
  entry (its optimizer state is torch's: m and v, no fp32 master copy).

``init`` starts from a saved whole model (the prune stage's rewind point); with ``sampling: draws``
and ``first_step`` the run then sees the global batches its dense run saw from that step on: the
paper stage's lottery-ticket retraining (``papers/sparse_axonn/train.py``).

Bits on the wire (``stats``): the activations and activation gradients this rank sends, and the
stage's all-reduce; ``dense_bits`` is the same step without pruning (the activations are dense
either way), so the compression factor is the traffic saved by pruning. The step's loss is the
paper's: the last stages' shares all-reduced over the world, the mean over the global batch on
every rank (one scalar a step, counted apart in ``loss_stats``). ``last_step`` holds what one step
sent and took, per phase (the paper stage's per-step rows). Evaluation gathers replica 0's stages
into a whole model on every rank (not counted), which is also what the run saves as ``model.pt``.
"""

from __future__ import annotations

import contextlib
import io
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.distributed as dist
from torch import Tensor, nn

from common.comm.collectives import all_reduce_sum_, get_world_size, is_distributed
from common.comm.stats import CommStats
from common.options import Options
from common.strategies.base import LossFn, MethodNeeds, SyncStrategy

from ..compact import CompactTraining, stage_masks
from ..pipeline_stages import (
    SCHEDULES,
    GPT2Stage,
    PipelineTrainer,
    ProcessGrid,
    flat_all_reduce_grads,
    grid_shape,
)
from ..pruning import apply_masks, load_masks
from ..sparse_compute import to_sparse_compute

if TYPE_CHECKING:
    from common.config import RunConfig

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
    compute: str = "dense"  # "csr": the masked linear layers as CSR matmuls (needs masks)
    init: str | None = None  # a whole-model state to start from (the prune stage's rewind point)
    wait_barrier: bool = False  # time the wait for the stage's replicas apart from the all-reduce
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
        if self.compute not in ("dense", "csr"):
            raise ValueError(f"pipeline compute must be dense or csr, got {self.compute!r}")
        if self.masks is None and (self.compute != "dense" or self.grads != "dense"):
            raise ValueError(
                f"pipeline compute {self.compute!r} / grads {self.grads!r} need masks (a pruned model); "
                "dense AxoNN takes compute: dense, grads: dense"
            )
        if self.init is not None and (not isinstance(self.init, str) or not self.init):
            raise ValueError(f"pipeline init must name a saved model state (a path), got {self.init!r}")
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
    from trainer.models import GPT2LanguageModel

    return model.gpt2 if isinstance(model, GPT2LanguageModel) else model


class PipelineDataParallel(SyncStrategy):
    """Pipeline x data parallelism with AxoNN's (or sparse AxoNN's) step (module docstring).

    ``masks``: parameter name (the GPT-2's own, ``transformer.h.0.attn.c_attn.weight``) -> bool
    tensor, or None: loaded from ``options.masks`` (the prune stage's file), or dense AxoNN without
    it. ``weight_decay`` (the run's; default torch's AdamW's), ``options.betas``, ``options.eps``:
    AdamW's. No draws: ``seed`` is kept, not used.
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
        compressor: None = None,
        *,
        options: Mapping[str, Any] | PipelineOptions | None = None,
        seed: int = 0,
        masks: Mapping[str, Tensor] | None = None,
        weight_decay: float = 0.01,
    ) -> None:
        super().__init__()
        self.check_compressor(compressor)
        self.options = PipelineOptions.from_mapping(options)
        if masks is not None and self.options.masks is not None:
            raise ValueError(
                "pipeline takes its masks once: the tensors (masks=...) or the prune stage's file "
                "(options masks), got both"
            )
        if masks is None and self.options.masks is not None:
            path = Path(self.options.masks)
            if not path.is_file():
                raise FileNotFoundError(f"pipeline masks {path} does not exist: run the prune stage first")
            masks = load_masks(path).masks
        if self.options.init is not None and not Path(self.options.init).is_file():
            raise FileNotFoundError(
                f"pipeline init {self.options.init} does not exist: run the prune stage first"
            )
        self.masks = None if masks is None else dict(masks)
        self.seed = seed
        self.weight_decay = weight_decay
        self.grid: ProcessGrid | None = None
        self.trainer: PipelineTrainer | None = None
        self.training: CompactTraining | None = None  # with masks; None: dense AxoNN
        self.loss_stats = CommStats()  # the loss all-reduce (instrumentation, not training traffic)
        self.last_step: dict[str, float] = {}
        self._rebuild: Callable[[], nn.Module] | None = None
        self._reduce: Any = None  # the GradReducer: the flat dense all-reduce, or the compact one
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
    def from_config(cls, config: RunConfig, options: Options | None = None) -> PipelineDataParallel:
        options = check_pipeline_options(
            config.strategy_options if options is None else options, config.world_size
        )
        return cls(options=options, seed=config.seed, weight_decay=config.weight_decay)

    # -- the loop's hooks ----------------------------------------------------------------------

    def shard(self, model: nn.Module, rebuild: Callable[[], nn.Module]) -> nn.Module:
        """This rank's stage of ``model``; ``rebuild()`` makes a fresh whole model for evaluation."""
        inner = _language_model(model)
        if self.options.init is not None:
            state = torch.load(self.options.init, map_location="cpu", weights_only=True)
            try:
                inner.load_state_dict(state)
            except RuntimeError as error:
                first = " ".join(str(error).splitlines()[:3])
                raise ValueError(
                    f"pipeline init {self.options.init} does not fit the model: {first}"
                ) from None
        self._prepare(inner)
        blocks: Any = inner.transformer.h  # type: ignore[union-attr]
        self.grid = ProcessGrid.create(self.options.stages, num_blocks=len(blocks))
        self._rebuild = rebuild
        return GPT2Stage(inner, self.grid.stage, self.grid.num_stages)

    def _prepare(self, inner: nn.Module) -> None:
        """The pruned model: masks applied, and the masked layers as CSR matmuls with ``compute: csr``."""
        if self.masks:
            apply_masks(inner, self.masks)
            if self.options.compute == "csr":
                to_sparse_compute(inner, self.masks)

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
        reduce: Any = flat_all_reduce_grads
        if self.masks is not None:
            self.training = CompactTraining(
                model,
                stage_masks(model, self.masks),
                lr=0.0,
                weight_decay=self.weight_decay,
                betas=self._betas(),
                eps=self.options.eps,
                grads=self.options.grads,
            )
            # set-up: 32 bytes a rank, not training traffic
            self.training.layout.verify_across_ranks(group=grid.data_parallel_group)
            reduce = self.training
        self._reduce = reduce
        self._num_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
        device = next(model.parameters()).device
        self.trainer = PipelineTrainer(
            model,
            grid,
            None,  # the loop steps: forward_backward, then after_backward
            num_microbatches=self.options.microbatches,
            schedule=self.options.schedule,
            reduce_grads=reduce,
            device=device,
            p2p_stats=self.stats,
        )

    def _betas(self) -> tuple[float, float]:
        return float(self.options.betas[0]), float(self.options.betas[1])

    def param_groups(self, model: nn.Module) -> list[dict[str, Any]]:
        """Dense AxoNN: the run's AdamW steps (with the options' betas and eps). Sparse: one group
        for the scheduled lr only (no decay, no gradient: the compact AdamW steps)."""
        params = [p for p in model.parameters() if p.requires_grad]
        if self.masks is None:
            self._groups = [{"params": params, "betas": self._betas(), "eps": self.options.eps}]
        else:
            self._groups = [{"params": params, "weight_decay": 0.0}]
        return self._groups

    def forward_backward(self, model: nn.Module, x: Tensor, y: Tensor, loss_fn: LossFn) -> Tensor:
        trainer, grid = self._trainer(), self._grid()
        trainer.loss_fn = loss_fn
        if self.training is not None:
            self.training.compact_grad.zero_()  # packed gradients accumulate into it
        sent, compute = self.stats.bits_sent, trainer.compute_seconds
        start = time.perf_counter()
        share = trainer.forward_backward(x, y)
        pipeline = time.perf_counter() - start
        p2p_bits = self.stats.bits_sent - sent
        self.stats.dense_bits += p2p_bits  # activations: dense either way
        compute = trainer.compute_seconds - compute
        p2p_seconds = pipeline - compute if grid.num_stages > 1 else 0.0  # transfers and the bubble
        self.stats.seconds["communicate"] += p2p_seconds
        # The paper's loss: the last stages' shares summed over the world (the others add 0).
        loss = torch.zeros((), device=trainer.device) if share is None else share.detach().float()
        loss_bits = self.loss_stats.bits_sent
        if is_distributed():
            all_reduce_sum_(loss, stats=self.loss_stats)
        self.last_step = {
            "p2p_bits": float(p2p_bits),
            "p2p_seconds": p2p_seconds,
            "compute_seconds": compute,
            "loss_bits": float(self.loss_stats.bits_sent - loss_bits),
        }
        return loss

    def after_backward(self, model: nn.Module) -> None:
        grid = self._grid()
        group = grid.data_parallel_group
        sent = self.stats.bits_sent
        start = time.perf_counter()
        if self.options.wait_barrier and get_world_size(group) > 1:
            dist.barrier(group=group)  # waiting for the slowest replica's backward, timed apart
        arrived = time.perf_counter()
        self._reduce(model, group, stats=self.stats)
        done = time.perf_counter()
        self.stats.seconds["communicate"] += done - start
        self.stats.steps += 1
        self.last_step.update(
            allreduce_bits=float(self.stats.bits_sent - sent),
            allreduce_seconds=done - start,
            allreduce_wait_seconds=arrived - start,
            allreduce_transfer_seconds=done - arrived,
            grad_bytes=float(
                sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
            ),
        )
        if self.training is not None:  # sparse: the compact AdamW steps; the run's sees no gradient
            self.training.set_lr(self.scheduled_lr())
            self.training.step()
            for p in model.parameters():
                p.grad = None

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
        self._prepare(inner)  # CSR layers where the stages have them; every value is loaded below
        missing, unexpected = inner.load_state_dict(state, strict=False)
        params = {n for n, _ in inner.named_parameters()}
        uncovered = [k for k in missing if k in params]
        if uncovered or unexpected:
            raise RuntimeError(
                f"the stages do not make up the model: missing {uncovered[:4]}, unexpected {unexpected[:4]}"
            )
        yield whole

    def metrics(self) -> dict[str, float]:
        grid = self._grid()
        return {
            "num_stages": float(grid.num_stages),
            "num_replicas": float(grid.num_replicas),
            "stage_params": float(self._num_params),  # this rank's (rank 0: the first stage)
            "stage_density": self.training.layout.density if self.training is not None else 1.0,
        }

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"stats": self.stats.state_dict(), "loss_stats": self.loss_stats.state_dict()}
        if self.training is not None:
            state["compact"] = self.training.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.training is not None:
            self.training.load_state_dict(state["compact"])
        self.stats.load_state_dict(state["stats"])
        self.loss_stats.load_state_dict(state["loss_stats"])

    def _grid(self) -> ProcessGrid:
        if self.grid is None:
            raise RuntimeError("shard() first: the loop calls it with the built model")
        return self.grid

    def _trainer(self) -> PipelineTrainer:
        if self.trainer is None:
            raise RuntimeError("setup() first")
        return self.trainer
