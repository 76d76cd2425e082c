"""Error feedback (residual memory), separate from the compressor.

Seide et al. 2014, Karimireddy et al. 2019: what a compressor drops is remembered and added to the
next step's gradient, so that nothing is lost, only delayed::

    compensated = gradient + residual
    sent        = decompress(compress(compensated))
    residual    = compensated - sent                     # conservation: compensated == sent + residual

Residuals are kept per named tensor (a parameter name), not per communication bucket: a bucket's
composition may change (PyTorch DDP rebuilds its buckets after the first step), a parameter's name
does not.

:class:`MomentumCorrection` is DGC's memory (Lin et al. 2018): the residual accumulates a local
momentum, so that sparsified SGD with momentum keeps the dense method's update.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from kernels import ef_update


class ErrorFeedback:
    """Residual memory keyed by tensor name; checkpointable with ``state_dict``."""

    def __init__(self) -> None:
        self.residuals: dict[str, Tensor] = {}

    def residual(self, key: str, like: Tensor) -> Tensor:
        """The stored residual for ``key`` (flat), or zeros shaped like ``like`` if none yet."""
        stored = self.residuals.get(key)
        if stored is None:
            return torch.zeros(like.numel(), dtype=like.dtype, device=like.device)
        if stored.numel() != like.numel():
            raise ValueError(
                f"error-feedback residual {key!r} has {stored.numel()} entries but the tensor has "
                f"{like.numel()}: the model changed shape since the residual was stored"
            )
        return stored

    def compensate(self, keys: Sequence[str], flat: Tensor, sizes: Sequence[int]) -> Tensor:
        """``flat + residuals`` where ``flat`` is the concatenation of the tensors named ``keys``."""
        parts = flat.split(list(sizes))
        summed = [p + self.residual(k, p) for k, p in zip(keys, parts, strict=True)]
        return summed[0] if len(summed) == 1 else torch.cat(summed)  # each sum is a fresh tensor

    def update(self, keys: Sequence[str], compensated: Tensor, sent: Tensor, sizes: Sequence[int]) -> None:
        """Store ``compensated - sent`` split back into the named tensors' residuals."""
        new = (compensated - sent.reshape(-1)).split(list(sizes))
        for key, part in zip(keys, new, strict=True):
            self.residuals[key] = part

    def update_sparse(
        self, keys: Sequence[str], compensated: Tensor, indices: Tensor, values: Tensor, sizes: Sequence[int]
    ) -> None:
        """:meth:`update` for a ``sent`` that is zero but ``values`` at the flat ``indices`` (no
        repeats; a sparsifier's payload, ``Compressor.sparse_sent``): the same residuals bit for bit,
        without a dense ``sent``. ``compensated`` (flat, contiguous, the values' dtype) becomes the
        residuals' storage: the caller hands it over and does not read it afterwards.

        Bit for bit: off the indices ``c - 0`` is ``c``; at them the dense decompression holds
        ``0 + v`` (a scatter-add into zeros: ``-0`` becomes ``+0``), so ``c - (0 + v)`` is stored.
        """
        position = indices.long()
        compensated.index_put_((position,), compensated.index_select(0, position) - (values + 0.0))
        for key, part in zip(keys, compensated.split(list(sizes)), strict=True):
            self.residuals[key] = part

    def clear(self, keys: Sequence[str]) -> None:
        """Everything of these tensors was sent: no residual (a missing one reads as zeros)."""
        for key in keys:
            self.residuals.pop(key, None)

    def state_dict(self) -> dict[str, dict[str, Tensor]]:
        return {"residuals": {k: v.detach().clone() for k, v in self.residuals.items()}}

    def load_state_dict(self, state: dict[str, dict[str, Tensor]]) -> None:
        self.residuals = {k: v.clone() for k, v in state["residuals"].items()}


class MomentumCorrection(ErrorFeedback):
    """DGC's momentum correction with momentum factor masking and local gradient clipping.

    Lin et al., ICLR 2018, sec. 3 (the code's ``DGCSGDMemory``). Per named tensor, a momentum
    ``u`` and an accumulated velocity ``v`` (kept in :attr:`residuals`: it is the residual, what
    has not been sent yet)::

        g = clip(g)                          # optional: clip_norm / sqrt(world_size), see below
        u = m * u + g;  v = v + u            # nesterov=True: u = m * (u + g);  v = v + u + g
        compensated = v                      # what the compressor sparsifies
        v = compensated - sent               # update(): exact conservation, as ErrorFeedback
        u[sent != 0] = 0                     # masking=True: momentum factor masking

    ``v`` is zero where an entry was sent, by construction (a sent entry is v's own value); the
    code's ``index_fill_(0, indices, 0)`` on v is therefore the conservation rule itself. Masking
    finds the sent entries as ``sent != 0`` (``update`` receives the dense decompression, not
    indices): an entry sent with the value exactly 0 keeps its momentum, which the code would
    zero; that momentum is then the exact negative of the previous accumulator entry, a measure-zero
    case with real-valued gradients.

    ``compensate`` advances ``u`` and ``v`` in place (``kernels.ef_update``: one fused pass on CUDA,
    for fp32 without Nesterov); call it once per step and ``update`` after it, as GradientSync does.

    Local gradient clipping (``clip_norm``, off by default as in the code): before accumulating,
    the gradient is scaled so that its L2 norm is at most ``clip_norm * world_size ** -0.5``
    (``torch.nn.utils.clip_grad_norm_``'s rule: factor ``min(1, thr / (norm + 1e-6))``). The paper
    means the worker's whole gradient; here the norm is taken over what one ``compensate`` call
    sees: one tensor when GradientSync compresses per tensor (its default, and with
    ``compress_per_tensor=True``), one bucket when it compresses buckets whole.

    The trainer's side (the code's ``DGCSGD``): momentum must be *off* in the optimizer for the
    tensors that pass through here (it is applied before communication), weight decay is applied
    locally and not communicated, and the code compresses only tensors with ``dim() > 1`` (biases
    and norms are all-reduced densely and get the optimizer's ordinary momentum after averaging).
    """

    def __init__(
        self,
        momentum: float = 0.9,
        *,
        nesterov: bool = False,
        masking: bool = True,
        clip_norm: float | None = None,
        world_size: int = 1,
    ) -> None:
        super().__init__()
        if isinstance(momentum, bool) or not isinstance(momentum, int | float) or not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be a number in [0, 1), got {momentum!r}")
        if clip_norm is not None and (
            isinstance(clip_norm, bool)
            or not isinstance(clip_norm, int | float)
            or not math.isfinite(clip_norm)
            or not clip_norm > 0
        ):
            raise ValueError(
                f"clip_norm must be None (no clipping) or a finite number > 0, got {clip_norm!r}"
            )
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
        self.momentum = float(momentum)
        self.nesterov = bool(nesterov)
        self.masking = bool(masking)
        self.clip_norm = None if clip_norm is None else float(clip_norm)
        self.world_size = world_size
        self.momentums: dict[str, Tensor] = {}

    def clip(self, flat: Tensor) -> Tensor:
        """``flat`` scaled to L2 norm at most ``clip_norm / sqrt(world_size)`` (no host sync)."""
        if self.clip_norm is None:
            return flat
        max_norm = self.clip_norm / math.sqrt(self.world_size)
        norm = torch.linalg.vector_norm(flat.float())
        return flat * torch.clamp(max_norm / (norm + 1e-6), max=1.0).to(flat.dtype)

    def momentum_buffer(self, key: str, like: Tensor) -> Tensor:
        """The stored momentum ``u`` for ``key`` (flat), or zeros shaped like ``like`` if none yet."""
        stored = self.momentums.get(key)
        if stored is None:
            return torch.zeros(like.numel(), dtype=like.dtype, device=like.device)
        if stored.numel() != like.numel():
            raise ValueError(
                f"momentum {key!r} has {stored.numel()} entries but the tensor has {like.numel()}: "
                "the model changed shape since it was stored"
            )
        return stored

    def compensate(self, keys: Sequence[str], flat: Tensor, sizes: Sequence[int]) -> Tensor:
        """Advance ``u`` and ``v`` with the (clipped) gradients; return the new ``v``, flat."""
        parts = self.clip(flat).split(list(sizes))
        out = []
        for key, g in zip(keys, parts, strict=True):
            u = self.momentum_buffer(key, g).contiguous()
            v = self.residual(key, g).contiguous()
            if self.nesterov:
                u = self.momentum * (u + g)
                v = v + u + g
            elif u.dtype == torch.float32 and g.dtype == torch.float32:
                ef_update(u, v, g, self.momentum)  # in place: u = m u + g; v += u
            else:
                u.mul_(self.momentum).add_(g)
                v.add_(u)
            self.momentums[key], self.residuals[key] = u, v
            out.append(v)
        return torch.cat(out)  # a copy: the caller may hold it while the state moves on

    def update(self, keys: Sequence[str], compensated: Tensor, sent: Tensor, sizes: Sequence[int]) -> None:
        """``v = compensated - sent``; with masking, ``u = 0`` where ``sent != 0``."""
        super().update(keys, compensated, sent, sizes)
        if not self.masking:
            return
        for key, sent_part in zip(keys, sent.reshape(-1).split(list(sizes)), strict=True):
            self.momentums[key].masked_fill_(sent_part != 0, 0.0)

    def update_sparse(
        self, keys: Sequence[str], compensated: Tensor, indices: Tensor, values: Tensor, sizes: Sequence[int]
    ) -> None:
        """:meth:`update` for a sparse ``sent`` (see ``ErrorFeedback.update_sparse``); with masking,
        ``u = 0`` at the indices whose sent value ``0 + v`` is not 0 (as ``sent != 0``: NaN too)."""
        super().update_sparse(keys, compensated, indices, values, sizes)
        if not self.masking:
            return
        sent_nonzero = indices.long()[(values + 0.0) != 0]
        start = 0
        for key, size in zip(keys, sizes, strict=True):
            inside = sent_nonzero[(sent_nonzero >= start) & (sent_nonzero < start + size)] - start
            self.momentums[key].view(-1).index_fill_(0, inside, 0.0)
            start += size

    def state_dict(self) -> dict[str, dict[str, Tensor]]:
        state = super().state_dict()
        state["momentums"] = {k: u.detach().clone() for k, u in self.momentums.items()}
        return state

    def load_state_dict(self, state: dict[str, dict[str, Tensor]]) -> None:
        if "momentums" not in state:
            raise ValueError(
                "this state has no 'momentums': it was saved by plain ErrorFeedback, not MomentumCorrection"
            )
        super().load_state_dict(state)
        self.momentums = {k: u.clone() for k, u in state["momentums"].items()}
