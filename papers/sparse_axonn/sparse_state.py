"""Sparse AxoNN's model-state accounting and timing around the pipeline trainer.

The compact state itself (:class:`~papers.sparse_axonn.compact.CompactTraining`: compact AdamW,
compact all-reduce, packed gradients) is :mod:`papers.sparse_axonn.compact`.
"""

from __future__ import annotations

import torch
from torch import nn

from .compact import STATE_CATEGORIES, CompactAdamW, model_state_bytes
from .config import OptimConfig

__all__ = ["dense_optimizer", "state_bytes"]


def state_bytes(
    module: nn.Module,
    optimizer: CompactAdamW | torch.optim.Optimizer,
    *,
    packed: bool = False,
    grad_bytes: int | None = None,
) -> dict[str, int]:
    """Bytes per category (``compact.STATE_CATEGORIES``), ``total`` and the index bytes.

    From the live tensors: parameters, the gradients that exist now (dense: torch AdamW's, or the
    paper's dense gradients; ``packed``: none persists, so 0, and ``grad_transient`` is the
    largest single gradient autograd holds before its hook packs it), the optimizer's tensors and
    the compact gradient buffer (``grad_bytes``: the gradients a step held, where they are freed
    before they can be counted, as the thinwire loop's compact step does). ``index_bytes``: the layout's int32 indices, or the CSR index
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
    live = sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)
    out["grads"] = live if grad_bytes is None else grad_bytes
    out["grad_transient"] = max(p.numel() * p.element_size() for p in params) if packed else 0
    index_bytes += sum(
        b.numel() * b.element_size() for n, b in module.named_buffers() if n.endswith("_indices")
    )
    out["index_bytes"] = index_bytes
    out["total"] = sum(out[k] for k in STATE_CATEGORIES)
    return out


def dense_optimizer(module: nn.Module, optim: OptimConfig) -> torch.optim.AdamW:
    """AxoNN's dense baseline: torch AdamW on every entry (its single-tensor path, as CompactAdamW)."""
    return torch.optim.AdamW(
        module.parameters(), lr=optim.lr_at(0), weight_decay=optim.weight_decay, foreach=False
    )
