"""Sparse AxoNN's compact state wired into the pipeline trainer: one object per stage.

:class:`CompactTraining` is both the trainer's optimizer (``zero_grad``, ``step``) and its
``reduce_grads`` hook (:data:`common.pipeline.GradReducer`). Per step, on each rank:

1. the schedule runs forward and backward densely (dense compute, masked dense weights);
2. the kept gradient entries of this stage are packed into one fp32 buffer of K entries
   (:class:`common.compact.MaskLayout`: parameter order, ascending flat position; identical on every
   replica because the masks are the prune stage's file, checked with a fingerprint all-gather);
3. that buffer is all-reduced *summed* over the stage's replicas (the trainer already scaled the loss
   by ``1 / (M R)``): ``K x 32`` bits, no indices;
4. :class:`common.compact.CompactAdamW` steps on it (fp32 master weights, m and v of K entries) and
   writes the master weights into the dense parameters at the kept positions.

``grads="dense"`` is the paper's (AxoNN's ``PruningAwareAdam``): autograd's dense gradients stay
allocated and are packed after the last micro-batch. ``grads="packed"`` (ours, not in the paper)
packs each gradient into the compact buffer as soon as autograd has accumulated it
(``register_post_accumulate_grad_hook``) and frees it, so no dense gradient outlives its own
accumulation: the buffer receives ``g1``, then ``+= g2``... exactly the sums autograd would have
formed, and the step is bit-identical to the dense-gradient variant.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from common.comm import CommStats, all_reduce_sum_, get_world_size
from common.compact import STATE_CATEGORIES, CompactAdamW, MaskLayout, model_state_bytes
from common.pipeline import ProcessGroup
from kernels.masked_compact import masked_compact

from .config import OptimConfig


def stage_masks(module: nn.Module, masks: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The masks of ``module``'s own parameters (a stage holds some of the model's)."""
    names = {n for n, _ in module.named_parameters()}
    return {n: m for n, m in masks.items() if n in names}


class CompactTraining:
    """Compact optimizer state, compact all-reduce and (optionally) packed gradients for one stage."""

    def __init__(
        self, module: nn.Module, masks: Mapping[str, Tensor], optim: OptimConfig, *, grads: str = "dense"
    ) -> None:
        if grads not in ("dense", "packed"):
            raise ValueError(f"grads must be 'dense' or 'packed', got {grads!r}")
        self.module = module
        self.grads = grads
        self.layout = MaskLayout(module, stage_masks(module, masks))
        self.optimizer = CompactAdamW(module, self.layout, lr=optim.lr_at(0), weight_decay=optim.weight_decay)
        self.compact_grad = torch.zeros(self.layout.num_kept, dtype=torch.float32, device=self.layout.device)
        self._handles: list[Any] = []
        if grads == "packed":
            params = self.layout.check_model(module)
            for p, idx, off, k in zip(
                params, self.layout.indices, self.layout.offsets, self.layout.counts, strict=True
            ):
                self._handles.append(p.register_post_accumulate_grad_hook(self._packer(idx, off, k)))

    def _packer(self, idx: Tensor | None, offset: int, count: int) -> Any:
        part = self.compact_grad[offset : offset + count]

        def pack(p: Tensor) -> None:
            assert p.grad is not None
            part.add_(p.grad.reshape(-1) if idx is None else masked_compact(p.grad, idx, torch.float32))
            p.grad = None

        return pack

    def remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    # -- the trainer's optimizer
    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)
        self.compact_grad.zero_()

    def step(self) -> None:
        self.optimizer.step(self.compact_grad)

    def set_lr(self, lr: float) -> None:
        self.optimizer.lr = lr

    # -- the trainer's GradReducer
    def __call__(self, module: nn.Module, group: ProcessGroup, *, stats: CommStats) -> None:
        """Sum the compact gradient over the stage's replicas (the loss is already scaled)."""
        if self.grads == "dense":
            self.compact_grad.copy_(self.layout.pack_grads(module, torch.float32))
        stats.dense_bits += self.layout.numel * 32
        if get_world_size(group) > 1:
            all_reduce_sum_(self.compact_grad, stats=stats, group=group)

    def state_bytes(self) -> dict[str, int]:
        """This stage's model state by category, from the tensors (see :func:`state_bytes`)."""
        return state_bytes(self.module, self.optimizer, packed=self.grads == "packed")


def state_bytes(
    module: nn.Module, optimizer: CompactAdamW | torch.optim.Optimizer, *, packed: bool = False
) -> dict[str, int]:
    """Bytes per category (``common.compact.STATE_CATEGORIES``), ``total`` and the index bytes.

    From the live tensors: parameters, the gradients that exist now (dense: torch AdamW's, or the
    paper's dense gradients; ``packed``: none persists, so 0, and ``grad_transient`` is the
    largest single gradient autograd holds before its hook packs it), the optimizer's tensors and
    the compact gradient buffer. ``index_bytes``: the layout's int32 indices, or the CSR index
    buffers of a sparse-compute model; like the paper's arithmetic, not in ``total``.
    """
    params = [p for p in module.parameters() if p.requires_grad]
    if isinstance(optimizer, CompactAdamW):
        out = model_state_bytes(module, optimizer_kind="compact", optimizer=optimizer)
        index_bytes = out.pop("layout_indices")
    else:
        out = model_state_bytes(module, optimizer_kind="dense", optimizer=optimizer)
        out.pop("layout_indices")
        index_bytes = 0
    out["grads"] = sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)
    out["grad_transient"] = max(p.numel() * p.element_size() for p in params) if packed else 0
    index_bytes += sum(
        b.numel() * b.element_size() for n, b in module.named_buffers() if n.endswith("_indices")
    )
    out["index_bytes"] = index_bytes
    out["total"] = sum(out[k] for k in STATE_CATEGORIES)
    return out


class TimedReduce:
    """A GradReducer that first waits for the stage's replicas at a barrier, timed apart.

    The trainer times the whole reduction, which includes waiting for the slowest replica to finish
    its backward; here ``wait_seconds`` is that wait and ``transfer_seconds`` the wrapped reducer
    alone (packing, the collective, unpacking). The barrier's few bytes are not counted as traffic.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.wait_seconds = 0.0
        self.transfer_seconds = 0.0

    def __call__(self, module: nn.Module, group: ProcessGroup, *, stats: CommStats) -> None:
        device = next(module.parameters()).device
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda *_: None)
        sync(device)
        start = time.perf_counter()
        if get_world_size(group) > 1:
            dist.barrier(group=group)
        arrived = time.perf_counter()
        self.inner(module, group, stats=stats)
        sync(device)
        self.wait_seconds = arrived - start
        self.transfer_seconds = time.perf_counter() - arrived


def dense_optimizer(module: nn.Module, optim: OptimConfig) -> torch.optim.AdamW:
    """AxoNN's dense baseline: torch AdamW on every entry (its single-tensor path, as CompactAdamW)."""
    return torch.optim.AdamW(
        module.parameters(), lr=optim.lr_at(0), weight_decay=optim.weight_decay, foreach=False
    )
