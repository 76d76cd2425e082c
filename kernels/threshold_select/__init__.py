"""Threshold selection into fixed-capacity buffers, and a sampled threshold estimator.

``threshold_select`` is the selection step of DGC (hard threshold), ExDyna (online-scaled threshold
over a worker's partition) and any threshold sparsifier: one pass over x, no host synchronisation,
so the buffers can go straight into a fixed-capacity all-gather. ``capacity=0`` gives the count only
(ExDyna's threshold scaling). Slots past ``min(count, capacity)`` hold value 0 at index 0. On
overflow (``count > capacity``) the reference keeps the lowest indices and the Triton kernel an
unspecified subset (see ``triton.py``); compare ``count`` with ``capacity`` to detect it. On fp32 CPU
tensors ``"auto"`` runs the compiled C loop (``kernels._native``), the reference's result bit for bit.

``estimate_threshold`` is DGC's sampled top-k threshold (pure torch on any device: it touches only
the sample, and ``torch.topk`` of a small sample is already the right tool, so it has no kernel).
"""

from __future__ import annotations

import torch

from kernels import _native
from kernels._dispatch import (
    NativeBackend,
    check_floating,
    check_numel,
    check_same_device,
    use_native,
    use_triton,
)
from kernels.threshold_select import reference
from kernels.threshold_select.reference import estimate_threshold

__all__ = ["estimate_threshold", "threshold_select"]


def threshold_select(
    x: torch.Tensor,
    threshold: torch.Tensor | float,
    capacity: int,
    *,
    backend: NativeBackend = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Entries of x (read flat) with ``|x| >= threshold``: ``(values [capacity], indices int32
    [capacity], count int64 0-dim)``.

    ``threshold`` (a float or a 0-dim tensor on x's device) is compared in fp32. ``count`` is exact
    even when it exceeds ``capacity``; only ``min(count, capacity)`` slots are filled.
    """
    check_floating(x, "x")
    check_numel(x.numel(), "x")
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
        raise ValueError(f"capacity must be a non-negative int, got {capacity!r}")
    if isinstance(threshold, torch.Tensor):
        check_same_device(x=x, threshold=threshold)
    threshold_t = torch.as_tensor(threshold, dtype=torch.float32, device=x.device)
    if threshold_t.numel() != 1:
        raise ValueError(f"threshold must be a scalar, got shape {tuple(threshold_t.shape)}")
    threshold_t = threshold_t.reshape(())
    x_N = x.reshape(-1).contiguous()
    if x_N.dtype == torch.float32 and use_native(backend, x.device):  # fp16 / bf16: the reference
        return _native.threshold_select(x_N, float(threshold_t), capacity)
    if use_triton(backend, x.device):
        from kernels.threshold_select import triton as triton_impl

        return triton_impl.threshold_select(x_N, threshold_t, capacity)
    return reference.threshold_select(x_N, threshold_t, capacity)
