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

from .compressors.segments import Segments


class ErrorFeedback:
    """Residual memory keyed by tensor name; checkpointable with ``state_dict``.

    ``residuals`` maps each name to its flat residual. A bucket's residuals are slices of one flat
    buffer (built when a bucket layout is first seen, or after something replaced one of them):
    ``compensate`` of a bucket is one addition and ``update`` one subtraction into that buffer,
    whatever the number of tensors, and no residual is copied between steps.
    """

    def __init__(self) -> None:
        self.residuals: dict[str, Tensor] = {}
        # layout (names) -> (the flat buffer, the views of it that ``residuals`` holds)
        self._flat: dict[tuple[str, ...], tuple[Tensor, list[Tensor]]] = {}
        # layout (a bucket's names, or one tensor's) -> a second buffer of its size, where
        # ``compensate`` writes (and which becomes the residual when ``update_sparse`` is handed
        # it): no bucket-sized allocation per step. On a CPU a fresh 45 MB tensor (ResNet-18's
        # bucket) comes from the kernel each time, page faults and all: 46 ms for ``flat +
        # residual`` against 8 ms into a reused one (one core).
        self._spare: dict[tuple[str, ...], Tensor] = {}
        # layout -> where what the compressor kept is decoded (``sent_buffer``), reused each step
        self._sent: dict[tuple[str, ...], Tensor] = {}

    def sent_buffer(self, keys: Sequence[str], like: Tensor) -> Tensor:
        """A flat buffer shaped like ``like`` for what this step's compression of ``keys`` sends,
        decoded (``Compressor.decompress_into``; read by :meth:`update`), allocated once per
        layout (a fresh one per step costs its page faults on a CPU, as ``_spare`` says)."""
        key = tuple(keys)
        buffer = self._sent.get(key)
        if (
            buffer is None
            or buffer.numel() != like.numel()
            or buffer.dtype != like.dtype
            or buffer.device != like.device
        ):
            buffer = self._sent[key] = torch.empty(like.numel(), dtype=like.dtype, device=like.device)
        return buffer

    def residual(self, key: str, like: Tensor) -> Tensor:
        """The stored residual for ``key`` (flat), or zeros shaped like ``like`` if none yet."""
        return _stored(self.residuals, key, like, "error-feedback residual")

    def flat_buffer(self, keys: Sequence[str], flat: Tensor, sizes: Sequence[int]) -> Tensor:
        """The residuals of ``keys`` as one flat tensor whose slices they are (see the class)."""
        return _flat_buffer(self.residuals, self._flat, keys, flat, sizes, "error-feedback residual")

    def compensate(
        self, keys: Sequence[str], flat: Tensor, sizes: Sequence[int], segments: Segments | None = None
    ) -> Tensor:
        """``flat + residuals`` where ``flat`` is the concatenation of the tensors named ``keys``,
        in the layout's scratch buffer (valid until its next ``compensate``; handed to
        ``update_sparse`` it becomes the residual and the residual before it the next scratch, so
        nothing is allocated per step). ``segments``: the bucket's layout when its tensors are
        compressed each on its own in one pass (the fused path; plain error feedback does not
        need it)."""
        if len(keys) == 1:
            residual = self.residual(keys[0], flat)
            if residual.dtype != flat.dtype:  # e.g. a loaded fp32 residual, fp16 gradients
                return flat + residual
            return torch.add(flat, residual, out=self._scratch(keys, residual))
        buffer = self.flat_buffer(keys, flat, sizes)
        return torch.add(flat, buffer, out=self._scratch(keys, buffer))

    def _scratch(self, keys: Sequence[str], buffer: Tensor) -> Tensor:
        """The layout's spare buffer (allocated once): valid until the layout's next ``compensate``."""
        key = tuple(keys)
        spare = self._spare.get(key)
        if (
            spare is None
            or spare.shape != buffer.shape
            or spare.dtype != buffer.dtype
            or spare.device != buffer.device
            or spare.data_ptr() == buffer.data_ptr()
        ):
            spare = self._spare[key] = torch.empty_like(buffer)
        return spare

    def update(self, keys: Sequence[str], compensated: Tensor, sent: Tensor, sizes: Sequence[int]) -> None:
        """Store ``compensated - sent`` split back into the named tensors' residuals (into the
        bucket's buffer where it is still theirs)."""
        buffer = self._current(keys)
        if buffer is not None and buffer.shape == compensated.shape and buffer.dtype == compensated.dtype:
            torch.sub(compensated, sent.reshape(-1), out=buffer)
            return
        self._store(keys, compensated - sent.reshape(-1), sizes)

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
        self._store(keys, compensated, sizes)

    def clear(self, keys: Sequence[str]) -> None:
        """Everything of these tensors was sent: no residual. A residual that is a slice of a
        bucket's buffer is zeroed in place (one launch for all: the buffer stays whole), any other
        is dropped (a missing one reads as zeros)."""
        owned = {id(v) for _, views in self._flat.values() for v in views}
        in_buffer = [self.residuals[k] for k in keys if id(self.residuals.get(k)) in owned]
        if in_buffer:
            torch._foreach_zero_(in_buffer)
        for key in keys:
            if id(self.residuals.get(key)) not in owned:
                self.residuals.pop(key, None)

    def state_dict(self) -> dict[str, dict[str, Tensor]]:
        return {"residuals": {k: v.detach().clone() for k, v in self.residuals.items()}}

    def load_state_dict(self, state: dict[str, dict[str, Tensor]]) -> None:
        self.residuals = {k: v.clone() for k, v in state["residuals"].items()}
        self._flat, self._spare, self._sent = {}, {}, {}

    def _current(self, keys: Sequence[str]) -> Tensor | None:
        """The bucket buffer of ``keys`` if every one of their residuals is still its slice."""
        return _current(self.residuals, self._flat, keys)

    def _store(self, keys: Sequence[str], buffer: Tensor, sizes: Sequence[int]) -> None:
        key = tuple(keys)
        old = self._flat.get(key)
        previous = self.residuals.get(keys[0]) if len(keys) == 1 else None
        _store(self.residuals, self._flat, keys, buffer, sizes)
        if old is not None and old[0].data_ptr() != buffer.data_ptr():
            self._spare[key] = old[0]  # the residual it held is now in ``buffer``
        elif previous is not None and _trades_places(self._spare.get(key), buffer, previous):
            self._spare[key] = previous


def _trades_places(spare: Tensor | None, stored: Tensor, previous: Tensor) -> bool:
    """Whether one tensor's scratch became its residual (``stored``) and the residual before
    (``previous``) owns memory of the same size: the next scratch then (the two trade places,
    nothing is allocated per step; a view into another buffer is never reused)."""
    return bool(
        spare is not None
        and spare.data_ptr() == stored.data_ptr()
        and previous.storage_offset() == 0
        and previous.untyped_storage().nbytes() == spare.untyped_storage().nbytes()
        and previous.untyped_storage().data_ptr() != spare.untyped_storage().data_ptr()
    )


def _stored(store: dict[str, Tensor], key: str, like: Tensor, what: str) -> Tensor:
    """``store[key]`` (flat), or zeros shaped like ``like``; a size mismatch is an error."""
    stored = store.get(key)
    if stored is None:
        return torch.zeros(like.numel(), dtype=like.dtype, device=like.device)
    if stored.numel() != like.numel():
        raise ValueError(
            f"{what} {key!r} has {stored.numel()} entries but the tensor has {like.numel()}: "
            "the model changed shape since it was stored"
        )
    return stored


def _current(
    store: dict[str, Tensor], flats: dict[tuple[str, ...], tuple[Tensor, list[Tensor]]], keys: Sequence[str]
) -> Tensor | None:
    cached = flats.get(tuple(keys))
    if cached is None:
        return None
    buffer, views = cached
    # identity checks on the host (a few ns a name): detects a residual replaced or cleared since
    if all(store.get(k) is v for k, v in zip(keys, views, strict=True)):
        return buffer
    del flats[tuple(keys)]
    return None


def _store(
    store: dict[str, Tensor],
    flats: dict[tuple[str, ...], tuple[Tensor, list[Tensor]]],
    keys: Sequence[str],
    buffer: Tensor,
    sizes: Sequence[int],
) -> None:
    views = list(buffer.split(list(sizes))) if len(keys) > 1 else [buffer.reshape(-1)]
    for key, view in zip(keys, views, strict=True):
        store[key] = view
    if len(keys) > 1:
        flats[tuple(keys)] = (buffer, views)


def _flat_buffer(
    store: dict[str, Tensor],
    flats: dict[tuple[str, ...], tuple[Tensor, list[Tensor]]],
    keys: Sequence[str],
    flat: Tensor,
    sizes: Sequence[int],
    what: str,
) -> Tensor:
    """The stored tensors of ``keys`` as one flat buffer whose slices they are: the cached one, or
    (a new layout, e.g. DDP's rebuilt buckets, or a tensor replaced since) a concatenation of what
    is stored, zeros for what is not, whose slices are then what ``store`` holds."""
    buffer = _current(store, flats, keys)
    if buffer is not None and buffer.device == flat.device and buffer.dtype == flat.dtype:
        return buffer
    parts = [_stored(store, k, p, what) for k, p in zip(keys, flat.split(list(sizes)), strict=True)]
    buffer = torch.cat(parts).to(flat.dtype)
    _store(store, flats, keys, buffer, sizes)
    return buffer


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
        self._momentum_flat: dict[tuple[str, ...], tuple[Tensor, list[Tensor]]] = {}

    def clip(self, flat: Tensor, segments: Segments | None = None) -> Tensor:
        """``flat`` scaled to L2 norm at most ``clip_norm / sqrt(world_size)`` (no host sync); with
        ``segments``, each of its tensors on its own (one segmented reduction for all)."""
        if self.clip_norm is None:
            return flat
        max_norm = self.clip_norm / math.sqrt(self.world_size)
        flat32 = flat.float()
        if segments is None:
            norm = torch.linalg.vector_norm(flat32)
            return flat * torch.clamp(max_norm / (norm + 1e-6), max=1.0).to(flat.dtype)
        norms_S = segments.reduce(flat32 * flat32, "sum").sqrt_()
        factors_S = torch.clamp(max_norm / (norms_S + 1e-6), max=1.0).to(flat.dtype)
        return flat * segments.expand(factors_S)

    def momentum_buffer(self, key: str, like: Tensor) -> Tensor:
        """The stored momentum ``u`` for ``key`` (flat), or zeros shaped like ``like`` if none yet."""
        return _stored(self.momentums, key, like, "momentum")

    def compensate(
        self, keys: Sequence[str], flat: Tensor, sizes: Sequence[int], segments: Segments | None = None
    ) -> Tensor:
        """Advance ``u`` and ``v`` with the (clipped) gradients; return the new ``v``, flat (a copy
        in the layout's scratch buffer, as :meth:`ErrorFeedback.compensate`'s result). ``segments``: the tensors of a bucket
        compressed each on its own in one pass: the clipping is then per tensor, as when each is
        compensated on its own. The bucket's ``u`` and ``v`` are each one flat buffer (advanced in
        one pass, ``kernels.ef_update``), whatever the number of tensors."""
        g = self.clip(flat, segments)
        if len(keys) == 1:
            u = self.momentum_buffer(keys[0], g).contiguous()
            v = self.residual(keys[0], g).contiguous()
        else:
            u = _flat_buffer(self.momentums, self._momentum_flat, keys, g, sizes, "momentum")
            v = self.flat_buffer(keys, g, sizes)
        compensated = self._scratch(keys, v)
        if self.nesterov:
            u.copy_(self.momentum * (u + g))
            v.copy_(v + u + g)
            compensated.copy_(v)
        elif u.dtype == torch.float32 and g.dtype == torch.float32:
            # in place: u = m u + g; v += u; and the new v copied out, in one pass on a CPU
            ef_update(u, v, g, self.momentum, v_out=compensated)
        else:
            u.mul_(self.momentum).add_(g)
            v.add_(u)
            compensated.copy_(v)
        if len(keys) == 1:
            self.momentums[keys[0]], self.residuals[keys[0]] = u, v
        return compensated

    def _momentums_of(self, keys: Sequence[str], like: Tensor, sizes: Sequence[int]) -> Tensor:
        if len(keys) == 1:
            return self.momentums[keys[0]].view(-1)
        return _flat_buffer(self.momentums, self._momentum_flat, keys, like, sizes, "momentum")

    def update(self, keys: Sequence[str], compensated: Tensor, sent: Tensor, sizes: Sequence[int]) -> None:
        """``v = compensated - sent``; with masking, ``u = 0`` where ``sent != 0``."""
        super().update(keys, compensated, sent, sizes)
        if self.masking:
            self._momentums_of(keys, compensated, sizes).masked_fill_(sent.reshape(-1) != 0, 0.0)

    def update_sparse(
        self, keys: Sequence[str], compensated: Tensor, indices: Tensor, values: Tensor, sizes: Sequence[int]
    ) -> None:
        """:meth:`update` for a sparse ``sent`` (see ``ErrorFeedback.update_sparse``); with masking,
        ``u = 0`` at the indices whose sent value ``0 + v`` is not 0 (as ``sent != 0``: NaN too),
        written with the other entries' own values (no mask-dependent shape)."""
        u = self._momentums_of(keys, compensated, sizes) if self.masking else None
        super().update_sparse(keys, compensated, indices, values, sizes)
        if u is None:
            return
        position = indices.long()
        kept = u.index_select(0, position)
        u.index_put_((position,), torch.where((values + 0.0) != 0, torch.zeros_like(kept), kept))

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
        self._momentum_flat = {}
