"""Sparse AxoNN's model-state accounting and timing around the pipeline trainer.

The compact state itself (:class:`common.compact.CompactTraining`: compact AdamW, compact
all-reduce, packed gradients) lives in ``common`` since the thinwire loop trains pipeline stages
too (``strategy: pipeline``); it is re-exported here for the prune and train stages.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from common.comm import CommStats, get_world_size
from common.compact import STATE_CATEGORIES, CompactAdamW, CompactTraining, model_state_bytes, stage_masks
from common.pipeline import ProcessGroup

from .config import OptimConfig

__all__ = ["CompactTraining", "TimedReduce", "dense_optimizer", "stage_masks", "state_bytes"]


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
