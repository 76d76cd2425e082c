"""Fused DGC momentum correction + error feedback with momentum factor masking (Lin et al. 2018).

``ef_update(u, v, g, m, sent_indices)``: in place, ``u = m * u + g; v += u``, then ``u`` and ``v``
zeroed at ``sent_indices`` (flat int32/int64 positions); ``sent_indices=None`` skips the masking.
DGC's step order is accumulate -> select from v -> mask what was sent, so a training step calls
``ef_update(u, v, g, m)`` before the selection and ``ef_mask(u, v, indices, num_sent=count)`` after
it; ``ef_update`` with indices does both when they are known up front. ``num_sent`` (an int or a
0-dim device tensor such as ``threshold_select``'s count) limits the masking to the first entries
of a padded fixed-capacity index buffer, without a host synchronisation.

``u`` and ``v`` are fp32 and contiguous (they are updated in place); ``g`` is fp32, fp16 or bf16.
``v_out`` takes a copy of the new ``v`` (error feedback's compensated gradient, which the residual
update then owns): on a CPU in the same pass, where a copy after it would read ``v`` once more.
With an fp32 ``g`` on a CPU, ``"auto"`` runs the update as one compiled loop (``kernels._native``),
the reference's values bit for bit.
"""

from __future__ import annotations

import torch

from kernels import _native
from kernels._dispatch import (
    Backend,
    NativeBackend,
    check_floating,
    check_index_dtype,
    check_numel,
    check_same_device,
    use_native,
    use_triton,
)
from kernels.ef_update import reference

__all__ = ["ef_mask", "ef_update"]


def _check_state(u: torch.Tensor, v: torch.Tensor) -> None:
    for name, t in (("u", u), ("v", v)):
        if t.dtype != torch.float32:
            raise ValueError(f"{name} must be float32, got {t.dtype}")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous (it is updated in place)")
    if u.shape != v.shape:
        raise ValueError(f"u and v must have one shape, got {tuple(u.shape)} and {tuple(v.shape)}")
    check_numel(u.numel(), "u")


def _check_sent(
    u: torch.Tensor, sent_indices: torch.Tensor, num_sent: torch.Tensor | int | None
) -> torch.Tensor | int | None:
    check_index_dtype(sent_indices, "sent_indices")
    check_same_device(u=u, sent_indices=sent_indices)
    if isinstance(num_sent, torch.Tensor):
        if num_sent.numel() != 1 or num_sent.is_floating_point():
            raise ValueError(
                f"num_sent must be an integer scalar tensor, got {num_sent.dtype} {tuple(num_sent.shape)}"
            )
        check_same_device(u=u, num_sent=num_sent)
        return num_sent.reshape(()).to(torch.int64)
    if num_sent is not None and (isinstance(num_sent, bool) or not isinstance(num_sent, int) or num_sent < 0):
        raise ValueError(f"num_sent must be a non-negative int or a 0-dim tensor, got {num_sent!r}")
    return num_sent


def ef_update(
    u: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    momentum: float,
    sent_indices: torch.Tensor | None = None,
    *,
    num_sent: torch.Tensor | int | None = None,
    backend: NativeBackend = "auto",
    v_out: torch.Tensor | None = None,
) -> None:
    """In place: ``u = momentum * u + g; v += u``; then zero ``u``, ``v`` at ``sent_indices``.
    ``v_out`` (fp32, contiguous, u's size, memory of its own; no ``sent_indices``): the new ``v``
    written there too, in the same pass on a CPU (a copy after the update elsewhere)."""
    _check_state(u, v)
    check_floating(g, "g")
    if g.shape != u.shape:
        raise ValueError(f"g must have u's shape {tuple(u.shape)}, got {tuple(g.shape)}")
    check_same_device(u=u, v=v, g=g)
    count = None if sent_indices is None else _check_sent(u, sent_indices, num_sent)
    u_N, v_N, g_N = u.view(-1), v.view(-1), g.reshape(-1).contiguous()
    v_out_N = None if v_out is None else _check_out(v_out, u, v, sent_indices)
    if g_N.dtype == torch.float32 and use_native(backend, u.device):  # one pass on a CPU, same bits
        _native.ef_update(u_N, v_N, g_N, momentum, v_out_N)
        if sent_indices is not None:
            reference.ef_mask(u_N, v_N, sent_indices, count)
        return
    if use_triton(backend, u.device):
        from kernels.ef_update import triton as triton_impl

        triton_impl.ef_update(u_N, v_N, g_N, momentum)
        if sent_indices is not None:
            _triton_mask(u_N, v_N, sent_indices, count)
    else:
        reference.ef_update(u_N, v_N, g_N, momentum, sent_indices, count)
    if v_out_N is not None:
        v_out_N.copy_(v_N)


def _check_out(
    v_out: torch.Tensor, u: torch.Tensor, v: torch.Tensor, sent_indices: torch.Tensor | None
) -> torch.Tensor:
    if sent_indices is not None:
        raise ValueError(
            "v_out is the new v before any masking: pass no sent_indices with it (ef_mask after)"
        )
    if v_out.dtype != torch.float32 or not v_out.is_contiguous() or v_out.numel() != u.numel():
        raise ValueError(
            f"v_out must be a contiguous float32 tensor of u's {u.numel()} entries, "
            f"got {v_out.dtype} with {v_out.numel()}"
        )
    check_same_device(u=u, v_out=v_out)
    memory = v_out.untyped_storage().data_ptr()
    if v_out.numel() and memory in (u.untyped_storage().data_ptr(), v.untyped_storage().data_ptr()):
        raise ValueError("v_out must not share memory with u or v")
    return v_out.view(-1)


def ef_mask(
    u: torch.Tensor,
    v: torch.Tensor,
    sent_indices: torch.Tensor,
    *,
    num_sent: torch.Tensor | int | None = None,
    backend: Backend = "auto",
) -> None:
    """In place: zero ``u`` and ``v`` at the first ``num_sent`` (default: all) ``sent_indices``."""
    _check_state(u, v)
    count = _check_sent(u, sent_indices, num_sent)
    if use_triton(backend, u.device):
        _triton_mask(u.view(-1), v.view(-1), sent_indices, count)
        return
    reference.ef_mask(u.view(-1), v.view(-1), sent_indices, count)


def _triton_mask(
    u_N: torch.Tensor, v_N: torch.Tensor, sent_indices: torch.Tensor, count: torch.Tensor | int | None
) -> None:
    from kernels.ef_update import triton as triton_impl

    sent_K = sent_indices.contiguous()
    if isinstance(count, int):
        sent_K, count = sent_K[:count], None
    triton_impl.ef_mask(u_N, v_N, sent_K, count)
