"""Inter-layer (pipeline) parallelism combined with data parallelism, for GPT-2 language models.

This is the 2-D hybrid of AxoNN (Singh & Bhatele, IPDPS'22 and IPDPS'23; research/papers.md 1.2):
the world is ``S`` pipeline stages x ``R`` data-parallel replicas. Each stage owns a contiguous run of
transformer blocks; a batch is split over the replicas and each replica's share into ``M``
micro-batches that flow through the stages. What crosses the wire:

- point to point, inside a replica: per micro-batch, the boundary activations forward and their
  gradients backward, dense, ``mb x T x n_embd`` elements each (pruning the weights does not make
  them sparse; papers.md 1.3(c));
- all-reduce, inside a stage: the stage's gradients over its ``R`` replicas, one flat buffer after
  the last micro-batch (no overlap with backward), through a pluggable :data:`GradReducer` so that
  sparse AxoNN's compact all-reduce of the unpruned entries only can replace the dense one.

Rank layout (AxoNN's: the stage varies fastest)::

    rank = replica * num_stages + stage        stage = rank % S,  replica = rank // S

so a replica's stages are consecutive ranks (on one node when ``S`` divides the GPUs per node). The
pipeline neighbours of a rank are ``rank - 1`` and ``rank + 1`` (same replica); its data-parallel
group is ``{replica * S + stage for replica in range(R)}``.

The schedule is ``torch.distributed.pipelining`` (``ScheduleGPipe``: all forwards then all backwards;
``Schedule1F1B``), which runs on gloo/CPU and NCCL in the pinned torch (2.14). AxoNN's own schedule
is message-driven (whichever message arrives first is served); the gradients are the same.
Loss scaling is AxoNN's: every micro-batch's mean loss is divided by ``M * R`` and the gradients are
summed (``scale_grads=False``), so after the all-reduce every replica holds the gradient of the mean
loss over the global batch.

Weight tying: GPT-2 ties ``lm_head.weight`` to ``wte.weight``, which live on the first and the last
stage. Here the model must be untied (``GPT2Config(tie_word_embeddings=False)``) when ``S > 1``; the
untied model has ``vocab x n_embd`` more parameters (Megatron-style pipelines instead all-reduce the
tied gradient between the two stages every step).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import Tensor, nn

from common.comm import CommStats, all_reduce_sum_, get_world_size, is_distributed
from common.comm.stats import timed

log = logging.getLogger(__name__)

ProcessGroup = dist.ProcessGroup | None


# ----------------------------------------------------------------------------------- process grid


def grid_shape(world_size: int, num_stages: int, num_blocks: int | None = None) -> tuple[int, int]:
    """Check a pipeline x data-parallel grid and return ``(num_stages, num_replicas)``."""
    if num_stages < 1:
        raise ValueError(f"num_stages must be >= 1, got {num_stages}")
    if world_size % num_stages != 0:
        raise ValueError(
            f"world size {world_size} is not divisible by num_stages={num_stages}: "
            "the grid is num_stages x num_replicas ranks"
        )
    if num_blocks is not None and num_stages > num_blocks:
        raise ValueError(
            f"num_stages={num_stages} exceeds the model's {num_blocks} transformer blocks: "
            "every stage needs at least one block"
        )
    return num_stages, world_size // num_stages


@dataclass(frozen=True)
class ProcessGrid:
    """This rank's place in the ``num_stages x num_replicas`` grid, and its two process groups.

    ``pipeline_group``: the ranks of this replica (all stages), in stage order.
    ``data_parallel_group``: the ranks of this stage (all replicas). Both are real groups (possibly
    of one rank) whenever torch.distributed is initialised, and ``None`` in a single process.
    """

    num_stages: int
    num_replicas: int
    rank: int
    pipeline_group: ProcessGroup
    data_parallel_group: ProcessGroup

    @property
    def stage(self) -> int:
        return self.rank % self.num_stages

    @property
    def replica(self) -> int:
        return self.rank // self.num_stages

    def rank_of(self, stage: int, replica: int) -> int:
        return replica * self.num_stages + stage

    @property
    def prev_rank(self) -> int | None:
        """Global rank of the previous stage of this replica (``None`` on the first stage)."""
        return None if self.stage == 0 else self.rank - 1

    @property
    def next_rank(self) -> int | None:
        """Global rank of the next stage of this replica (``None`` on the last stage)."""
        return None if self.stage == self.num_stages - 1 else self.rank + 1

    @classmethod
    def create(cls, num_stages: int, *, num_blocks: int | None = None) -> ProcessGrid:
        """Build the grid over the initialised world (or a 1 x 1 grid in a single process).

        Collective: every rank must call it, with the same arguments, in the same order.
        """
        world = get_world_size()
        stages, replicas = grid_shape(world, num_stages, num_blocks)
        if not is_distributed():
            return cls(stages, replicas, 0, None, None)
        rank = dist.get_rank()
        pipeline_group = data_parallel_group = None
        # new_group is collective over the whole world: every rank creates every group, in one order.
        for replica in range(replicas):
            group = dist.new_group([replica * stages + s for s in range(stages)])
            if rank // stages == replica:
                assert isinstance(group, dist.ProcessGroup)
                pipeline_group = group
        for stage in range(stages):
            group = dist.new_group([r * stages + stage for r in range(replicas)])
            if rank % stages == stage:
                assert isinstance(group, dist.ProcessGroup)
                data_parallel_group = group
        return cls(stages, replicas, rank, pipeline_group, data_parallel_group)


# ------------------------------------------------------------------------------- model partition


def split_blocks(num_blocks: int, num_stages: int) -> list[range]:
    """Contiguous block ranges per stage, as even as possible (the first stages get the extra ones)."""
    grid_shape(num_stages, num_stages, num_blocks)
    base, extra = divmod(num_blocks, num_stages)
    bounds = [0]
    for stage in range(num_stages):
        bounds.append(bounds[-1] + base + (stage < extra))
    return [range(bounds[s], bounds[s + 1]) for s in range(num_stages)]


class GPT2Stage(nn.Module):
    """One pipeline stage of a ``transformers.GPT2LMHeadModel``.

    Stage 0 holds ``wte``, ``wpe`` (and the embedding dropout) and takes token ids ``[B, T]``; the
    last stage holds ``ln_f`` and ``lm_head`` and returns logits ``[B, T, V]``; the others map
    hidden states ``[B, T, n_embd]`` to hidden states. The submodules are the model's own (not
    copies) and keep their names, so ``stage.named_parameters()`` is a subset of the model's
    (``transformer.h.3.attn.c_attn.weight`` etc.). Each stage rebuilds the causal mask the way
    ``GPT2Model`` does, so the stages compose to exactly the model's forward.
    """

    def __init__(self, model: nn.Module, stage: int, num_stages: int) -> None:
        super().__init__()
        transformer: Any = model.transformer
        lm_head: Any = model.lm_head
        blocks = transformer.h
        # getattr: a sparse-compute lm_head (sparse_compute.SparseLinear) has no ``weight``
        tied = getattr(lm_head, "weight", None) is transformer.wte.weight
        if num_stages > 1 and tied:
            raise ValueError(
                "lm_head.weight is tied to transformer.wte.weight, which sit on different pipeline "
                "stages; build the model with GPT2Config(tie_word_embeddings=False)"
            )
        self.block_range = split_blocks(len(blocks), num_stages)[stage]
        self.is_first = stage == 0
        self.is_last = stage == num_stages - 1
        self.config = model.config
        self.transformer = nn.Module()
        if self.is_first:
            self.transformer.wte = transformer.wte
            self.transformer.wpe = transformer.wpe
            self.transformer.drop = transformer.drop
        self.transformer.h = nn.ModuleDict({str(i): blocks[i] for i in self.block_range})
        if self.is_last:
            self.transformer.ln_f = transformer.ln_f
            self.lm_head = lm_head

    def forward(self, x: Tensor) -> Tensor:
        # Imported here: importing transformers takes seconds, and only this model needs it.
        from transformers.masking_utils import create_causal_mask

        t: Any = self.transformer
        position_ids = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
        hidden = t.drop(t.wte(x) + t.wpe(position_ids)) if self.is_first else x
        mask = create_causal_mask(
            config=self.config,
            inputs_embeds=hidden,
            attention_mask=None,
            cache=None,
            position_ids=position_ids,
        )
        for block in t.h.values():
            hidden = block(hidden, attention_mask=mask, position_ids=position_ids)
        if self.is_last:
            return self.lm_head(t.ln_f(hidden))
        return hidden


# -------------------------------------------------------------------------- data-parallel reduce


class GradReducer(Protocol):
    """Sum a stage's gradients over its data-parallel group, in place, counting into ``stats``.

    The loss is already scaled by ``1 / num_replicas``, so a reducer sums (it does not average).
    Every replica must lay out its buffer the same way (same parameter order, same mask).
    """

    def __call__(self, module: nn.Module, group: ProcessGroup, *, stats: CommStats) -> None: ...


def flat_all_reduce_grads(module: nn.Module, group: ProcessGroup, *, stats: CommStats) -> None:
    """AxoNN's dense reducer: all gradients in one coalesced flat buffer, one all-reduce (sum).

    Bits on the wire: ``32 * sum(p.numel())`` per call in fp32. A missing gradient crosses as zeros
    so that every replica's buffer has the same layout.
    """
    params = [p for p in module.parameters() if p.requires_grad]
    if get_world_size(group) == 1 or not params:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    stats.dense_bits += flat.numel() * 32
    all_reduce_sum_(flat, stats=stats, group=group)
    for p, part in zip(params, flat.split([p.numel() for p in params]), strict=True):
        if p.grad is None:
            p.grad = part.view_as(p).clone()
        else:
            p.grad.copy_(part.view_as(p))


# --------------------------------------------------------------------------------------- trainer


def _cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


class StepOptimizer(Protocol):
    """What the trainer asks of an optimizer: a ``torch.optim.Optimizer``, or one that keeps its own
    gradient (sparse AxoNN's compact optimizer, whose ``step`` reads the reduced compact buffer)."""

    def zero_grad(self, set_to_none: bool = True) -> None: ...

    def step(self) -> object: ...


@dataclass(frozen=True)
class PipelineStepStats:
    """What one rank did in one :meth:`PipelineTrainer.train_step`.

    ``p2p_bits`` are the activations and activation gradients this rank handed to ``isend``,
    counted from the sent tensors (numel x element size x 8). ``p2p_seconds`` is the pipeline
    phase's wall time outside this stage's own forward, loss and backward compute: transfers *and*
    waiting for the neighbours (the pipeline bubble), which the schedule's waits cannot tell apart.
    ``allreduce_*`` is the data-parallel gradient reduction (the :data:`GradReducer`), ``loss_bits``
    the one-scalar all-reduce that puts the loss on every rank.
    """

    loss: float  # mean next-token cross-entropy over the global batch, the same on every rank
    p2p_bits: int
    p2p_seconds: float
    allreduce_bits: int
    allreduce_seconds: float
    loss_bits: int
    compute_seconds: float
    step_seconds: float


def _bits(t: Tensor) -> int:
    return t.numel() * t.element_size() * 8


def _counting_stage(
    module: nn.Module, grid: ProcessGrid, device: torch.device, p2p: CommStats, compute: list[float]
) -> Any:
    """A ``PipelineStage`` that counts the tensors it sends and times its own compute."""
    from torch.distributed.pipelining import PipelineStage

    class CountingStage(PipelineStage):
        def get_fwd_send_ops(self, fwd_chunk_id: int) -> list[dist.P2POp]:
            ops = super().get_fwd_send_ops(fwd_chunk_id)
            for op in ops:
                p2p.add_call("send_activation", _bits(op.tensor))
            return ops

        def get_bwd_send_ops(self, bwd_chunk_id: int) -> list[dist.P2POp]:
            ops = super().get_bwd_send_ops(bwd_chunk_id)
            for op in ops:
                p2p.add_call("send_activation_grad", _bits(op.tensor))
            return ops

        def forward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
            with timed(compute, device):
                return super().forward_one_chunk(*args, **kwargs)

        def backward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
            with timed(compute, device):
                return super().backward_one_chunk(*args, **kwargs)

    return CountingStage(module, grid.stage, grid.num_stages, device, group=grid.pipeline_group)


SCHEDULES = ("gpipe", "1f1b")


class PipelineTrainer:
    """Train one stage of a language model with pipeline x data parallelism (see the module doc).

    ``train_step(inputs, targets)`` takes the *global* batch ``[B, T]`` (token ids and next-token
    targets, the same on every rank): replica ``r`` trains on rows ``[r B/R, (r+1) B/R)``, in
    ``num_microbatches`` equal micro-batches. ``B`` must divide by ``R * M`` and every step must have
    the same shape (the schedule sizes its receive buffers on the first step). One step: zero the
    gradients, run the schedule, reduce the gradients over the replicas, ``optimizer.step()``, then
    all-reduce the loss so that every rank returns the mean loss over the global batch.
    With one stage no schedule runs: the micro-batches go forward and backward locally.
    """

    def __init__(
        self,
        module: nn.Module,
        grid: ProcessGrid,
        optimizer: StepOptimizer | None,
        *,
        num_microbatches: int,
        schedule: str = "gpipe",
        reduce_grads: GradReducer = flat_all_reduce_grads,
        device: torch.device | None = None,
        loss_fn: Callable[[Tensor, Tensor], Tensor] | None = None,
        p2p_stats: CommStats | None = None,
    ) -> None:
        if schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {schedule!r}; valid schedules: {', '.join(SCHEDULES)}")
        if num_microbatches < 1:
            raise ValueError(f"num_microbatches must be >= 1, got {num_microbatches}")
        if schedule == "1f1b" and num_microbatches < grid.num_stages:
            raise ValueError(
                f"the 1f1b schedule needs num_microbatches ({num_microbatches}) >= num_stages "
                f"({grid.num_stages})"
            )
        if grid.num_stages == 1 and schedule != "gpipe":
            log.warning("schedule %r does nothing with one stage: the micro-batches run locally", schedule)
        self.module = module
        self.grid = grid
        self.optimizer = optimizer
        self.num_microbatches = num_microbatches
        self.reduce_grads = reduce_grads
        self.device = device or next(module.parameters()).device
        # The micro-batch loss before AxoNN's 1 / (M R) scaling: mean next-token cross-entropy unless
        # given (the thinwire loop passes its own, e.g. with label smoothing).
        self.loss_fn = loss_fn or _cross_entropy
        self.p2p_stats = p2p_stats or CommStats()  # ops send_activation / send_activation_grad
        self.allreduce_stats = CommStats()  # the GradReducer's collectives
        self.loss_stats = CommStats()
        self._compute = [0.0]
        self._shape: tuple[int, ...] | None = None
        self._schedule: Any = None
        if grid.num_stages > 1:
            from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

            stage = _counting_stage(module, grid, self.device, self.p2p_stats, self._compute)
            cls = ScheduleGPipe if schedule == "gpipe" else Schedule1F1B
            self._schedule = cls(stage, num_microbatches, loss_fn=self._timed_loss, scale_grads=False)

    @property
    def compute_seconds(self) -> float:
        """This stage's own forward, loss and backward time so far (all steps)."""
        return self._compute[0]

    def _loss(self, logits: Tensor, targets: Tensor) -> Tensor:
        """Micro-batch mean cross-entropy over ``M * R`` (AxoNN's scaling): the sum is the mean."""
        return self.loss_fn(logits, targets) / (self.num_microbatches * self.grid.num_replicas)

    def _timed_loss(self, logits: Tensor, targets: Tensor) -> Tensor:
        with timed(self._compute, self.device):  # the schedule computes the loss outside its stage
            return self._loss(logits, targets)

    def _microbatches(
        self, inputs: Tensor, targets: Tensor, parts: int, what: str, divisor: str
    ) -> tuple[list[Tensor], list[Tensor]]:
        """``inputs``/``targets`` in ``parts`` equal chunks, on the device, the shape checked."""
        if inputs.shape != targets.shape or inputs.dim() != 2:
            raise ValueError(f"inputs and targets must both be [B, T]; got {inputs.shape}, {targets.shape}")
        if inputs.shape[0] % parts != 0:
            raise ValueError(f"{what} {inputs.shape[0]} must divide by {divisor} = {parts}")
        if self._shape is None:
            self._shape = tuple(inputs.shape)
        elif self._shape != tuple(inputs.shape):
            raise ValueError(f"batch shape changed from {self._shape} to {tuple(inputs.shape)}")
        return list(inputs.to(self.device).chunk(parts)), list(targets.to(self.device).chunk(parts))

    def forward_backward(self, inputs: Tensor, targets: Tensor) -> Tensor | None:
        """Forward and backward of *this replica's* batch ``[b, T]`` in ``num_microbatches`` micro-
        batches through the schedule, gradients accumulated (scaled by ``1 / (M R)``), nothing
        reduced. Returns, on the last stage, the replica's share of the global mean loss (the sum of
        its scaled micro-batch losses: summed over the replicas it is the mean), ``None`` elsewhere.
        The thinwire loop's strategy
        (:class:`~papers.sparse_axonn.strategies.pipeline.PipelineDataParallel`) calls this;
        :meth:`train_step` is the whole step on the global batch."""
        xs, ys = self._microbatches(inputs, targets, self.num_microbatches, "batch", "num_microbatches")
        return self._run_microbatches(xs, ys)

    def _run_microbatches(self, xs: list[Tensor], ys: list[Tensor]) -> Tensor | None:
        """Forward and backward every micro-batch; the replica's summed scaled loss on the last stage."""
        if self._schedule is None:  # one stage: no pipeline
            total = torch.zeros((), device=self.device)
            for x, y in zip(xs, ys, strict=True):
                with timed(self._compute, self.device):
                    loss = self._loss(self.module(x), y)
                    loss.backward()
                total += loss.detach()
            return total
        losses: list[Tensor] = []
        if self.grid.stage == 0:
            self._schedule.step(arg_mbs=[(x,) for x in xs], return_outputs=False)
        elif self.grid.stage == self.grid.num_stages - 1:
            self._schedule.step(target_mbs=ys, losses=losses, return_outputs=False)
        else:
            self._schedule.step(return_outputs=False)
        return torch.stack([loss.detach() for loss in losses]).sum() if losses else None

    def train_step(self, inputs: Tensor, targets: Tensor) -> PipelineStepStats:
        """One optimizer step on the global batch; returns the loss and this rank's traffic."""
        parts = self.grid.num_replicas * self.num_microbatches
        divisor = "num_replicas x num_microbatches"
        xs, ys = self._microbatches(inputs, targets, parts, "global batch", divisor)
        mine = slice(
            self.grid.replica * self.num_microbatches, (self.grid.replica + 1) * self.num_microbatches
        )
        xs, ys = xs[mine], ys[mine]
        before = (self.p2p_stats.bits_sent, self.allreduce_stats.bits_sent, self.loss_stats.bits_sent)
        compute_before = self._compute[0]
        step, pipeline, reduce = [0.0], [0.0], [0.0]
        if self.optimizer is None:
            raise ValueError("train_step needs the trainer's optimizer (this trainer was built without one)")
        with timed(step, self.device):
            self.optimizer.zero_grad(set_to_none=True)
            with timed(pipeline, self.device):
                replica_loss = self._run_microbatches(xs, ys)
            with timed(reduce, self.device):
                self.reduce_grads(self.module, self.grid.data_parallel_group, stats=self.allreduce_stats)
            self.optimizer.step()
            loss = torch.zeros((), device=self.device) if replica_loss is None else replica_loss
            if is_distributed():  # last-stage ranks hold their replica's share, the others 0
                all_reduce_sum_(loss, stats=self.loss_stats)
        compute = self._compute[0] - compute_before
        p2p_seconds = pipeline[0] - compute if self._schedule is not None else 0.0
        for stats, seconds in ((self.p2p_stats, p2p_seconds), (self.allreduce_stats, reduce[0])):
            stats.steps += 1
            stats.seconds["communicate"] += seconds
        return PipelineStepStats(
            loss=float(loss),
            p2p_bits=self.p2p_stats.bits_sent - before[0],
            p2p_seconds=p2p_seconds,
            allreduce_bits=self.allreduce_stats.bits_sent - before[1],
            allreduce_seconds=reduce[0],
            loss_bits=self.loss_stats.bits_sent - before[2],
            compute_seconds=compute,
            step_seconds=step[0],
        )

    def model_state_bytes(self) -> dict[str, int]:
        """Bytes of this stage's parameters and of their allocated gradients (no optimizer state)."""
        params = list(self.module.parameters())
        return {
            "param_bytes": sum(p.numel() * p.element_size() for p in params),
            "grad_bytes": sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None),
        }
