"""Sparse AxoNN's compact state: optimizer state and all-reduce over the unpruned entries only.

Singh & Bhatele, "Exploiting Sparsity in Pruned Neural Networks to Optimize Large Model Training",
IPDPS 2023 (papers.md 1.3(a),(b)). With a static pruning mask, identical on every data-parallel
rank:

- (a) the optimizer keeps fp32 master weights and Adam's m and v as 1-D vectors of the K unpruned
  entries only (AxoNN's ``PruningAwareAdam``: ``masked_select`` of the flat buffers), and writes the
  master weights back into the dense model at the unpruned positions; pruned weights stay zero.
- (b) the gradient entries of the unpruned weights are gathered into one compact buffer of K
  entries, all-reduced densely (no indices cross the wire: every rank knows the mask), and fed
  straight to the compact optimizer. Bits on the wire per step: ``K * bits(dtype)`` instead of
  ``N * bits(dtype)``.

:class:`MaskLayout` fixes the order of the compact vector: parameters in
``model.named_parameters()`` order (trainable ones only), each parameter's kept entries in ascending
flat (row-major) position (``kernels.masked_compact.mask_to_indices``). A parameter without a mask
(biases, LayerNorm) is fully dense: all its entries are in the compact vector. Because the order
depends only on the masks, ranks holding the same masks agree entry by entry; :meth:`MaskLayout.
verify_across_ranks` checks that they do (pitfall 1.6: never recompute masks per rank).

Memory per parameter (fp32 model, density rho = K / N): dense AdamW keeps params + grads + m + v =
16 B; the compact path keeps dense params + dense grads (8 B) + compact master, m, v (12 rho B) and
the compact gradient buffer (4 rho B): ``8 + 16 rho`` B (:func:`model_state_bytes`). With fp16
params and grads, as in the paper, the dense part is 4 B.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import math
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import torch
from torch import Tensor, nn

from common.comm.collectives import (
    ProcessGroup,
    all_gather_variable,
    all_reduce_sum_,
    get_rank,
    get_world_size,
    is_distributed,
)
from common.comm.stats import CommStats
from kernels.masked_compact import mask_to_indices, masked_compact, masked_scatter

from .pruning import check_masks

__all__ = [
    "STATE_CATEGORIES",
    "CompactAdamW",
    "CompactTraining",
    "MaskLayout",
    "compact_all_reduce_",
    "model_state_bytes",
    "stage_masks",
]

log = logging.getLogger(__name__)


class MaskLayout:
    """The compact vector's order: which entries of which parameter sit at which offset.

    Built once from a model and its masks (bool, ``True`` = kept; see :mod:`~papers.sparse_axonn.pruning`).
    ``names``: trainable parameters in ``named_parameters()`` order; ``counts[i]`` entries of
    parameter i (its mask's ``True`` count, or its numel if it has no mask) start at ``offsets[i]``.
    ``num_kept`` = K (compact length), ``numel`` = N (dense trainable entries), ``density`` = K / N.
    Frozen parameters (``requires_grad=False``) are left out; a mask on one is an error.
    """

    def __init__(self, model: nn.Module, masks: Mapping[str, Tensor]) -> None:
        check_masks(model, masks)
        params = list(self._trainable(model))
        if not params:
            raise ValueError(f"{type(model).__name__} has no trainable parameters to lay out")
        trainable = {n for n, _ in params}
        frozen = sorted(set(masks) - trainable)
        if frozen:
            raise ValueError(f"masks name frozen parameters (requires_grad=False): {frozen}")
        self.names: tuple[str, ...] = tuple(n for n, _ in params)
        self.shapes: tuple[torch.Size, ...] = tuple(p.shape for _, p in params)
        for name, p in params:
            if not p.is_contiguous():
                raise ValueError(f"parameter {name!r} is not contiguous: the layout writes it in place, flat")
        devices = {p.device for _, p in params}
        if len(devices) != 1:
            raise ValueError(
                f"a layout needs all trainable parameters on one device, got {sorted(map(str, devices))}"
            )
        self.device: torch.device = devices.pop()
        # None = dense parameter (no mask): copied whole, no index tensor kept.
        self.indices: tuple[Tensor | None, ...] = tuple(
            mask_to_indices(masks[n].to(self.device)) if n in masks else None for n, _ in params
        )
        self.counts: tuple[int, ...] = tuple(
            p.numel() if idx is None else idx.numel()
            for (_, p), idx in zip(params, self.indices, strict=True)
        )
        self.offsets: tuple[int, ...] = tuple(itertools.accumulate(self.counts[:-1], initial=0))
        self.num_kept = sum(self.counts)
        self.numel = sum(p.numel() for _, p in params)
        self.fingerprint = self._fingerprint()

    @staticmethod
    def _trainable(model: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
        return ((n, p) for n, p in model.named_parameters() if p.requires_grad)

    @property
    def density(self) -> float:
        return self.num_kept / self.numel if self.numel else 1.0

    def _fingerprint(self) -> str:
        """sha256 of names, shapes, counts and two index checksums per masked parameter.

        The checksums are ``sum(idx)`` and ``sum(idx * (position + 1))`` in int64 (wrapping, so
        deterministic on any device): one pass over the indices, not a hash of every byte. Equal
        masks give equal fingerprints; different masks give different ones unless the differences
        cancel in both sums (a checksum, not a proof).
        """
        h = hashlib.sha256()
        for name, shape, count, idx in zip(self.names, self.shapes, self.counts, self.indices, strict=True):
            h.update(f"{name}|{tuple(shape)}|{count}|".encode())
            if idx is None:
                h.update(b"dense;")
                continue
            idx64 = idx.to(torch.int64)
            weights = torch.arange(1, idx64.numel() + 1, dtype=torch.int64, device=idx64.device)
            h.update(f"{int(idx64.sum())}|{int((idx64 * weights).sum())};".encode())
        return h.hexdigest()

    def check_model(self, model: nn.Module) -> list[nn.Parameter]:
        """The model's trainable parameters, after checking they are the ones the layout was built for."""
        params = list(self._trainable(model))
        found = tuple((n, tuple(p.shape)) for n, p in params)
        expected = tuple((n, tuple(s)) for n, s in zip(self.names, self.shapes, strict=True))
        if found != expected:
            diff = sorted(set(found) ^ set(expected))[:4]
            raise ValueError(
                f"the model's trainable parameters differ from the layout's (name, shape): e.g. {diff}"
            )
        return [p for _, p in params]

    def _pack(self, tensors: list[Tensor | None], dtype: torch.dtype) -> Tensor:
        out = torch.empty(self.num_kept, dtype=dtype, device=self.device)
        for t, idx, off, k in zip(tensors, self.indices, self.offsets, self.counts, strict=True):
            part = out[off : off + k]
            if t is None:
                part.zero_()
            elif idx is None:
                part.copy_(t.reshape(-1))
            else:
                part.copy_(masked_compact(t, idx, dtype))
        return out

    def pack_grads(self, model: nn.Module, dtype: torch.dtype = torch.float32) -> Tensor:
        """The kept entries of every gradient, ``[K]`` in ``dtype`` (a missing grad counts as zeros)."""
        return self._pack([p.grad for p in self.check_model(model)], dtype)

    def pack_params(self, model: nn.Module, dtype: torch.dtype = torch.float32) -> Tensor:
        """The kept entries of every trainable parameter, ``[K]`` in ``dtype``."""
        return self._pack([p.detach() for p in self.check_model(model)], dtype)

    @torch.no_grad()
    def unpack_(self, compact: Tensor, model: nn.Module, into: Literal["params", "grads"] = "params") -> None:
        """Write ``compact`` (cast to each parameter's dtype) into the params or grads, in place.

        ``into="params"``: kept entries are overwritten; pruned ones are left as they are (zero, if
        the masks were applied). ``into="grads"``: pruned gradient entries are set to zero (nothing
        was reduced for them; a stale local value must not survive); missing grads are created.
        """
        if into not in ("params", "grads"):
            raise ValueError(f"into must be 'params' or 'grads', got {into!r}")
        if compact.dim() != 1 or compact.numel() != self.num_kept:
            raise ValueError(
                f"compact must be 1-D with {self.num_kept} entries, got shape {tuple(compact.shape)}"
            )
        for p, idx, off, k in zip(
            self.check_model(model), self.indices, self.offsets, self.counts, strict=True
        ):
            part = compact[off : off + k]
            if into == "grads":
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                target = p.grad
            else:
                target = p.data
            if idx is None:
                target.copy_(part.view(target.shape))
            else:
                if into == "grads":
                    target.zero_()
                masked_scatter(part, idx, target)

    def verify_across_ranks(self, *, stats: CommStats | None = None, group: ProcessGroup = None) -> None:
        """All-gather the fingerprint (32 bytes per rank); ValueError on every rank if any differs."""
        digest = torch.frombuffer(bytearray(bytes.fromhex(self.fingerprint)), dtype=torch.uint8)
        device = self.device if is_distributed() else "cpu"
        gathered = all_gather_variable([digest.to(device)], sizes_known=True, stats=stats, group=group)
        prints = [bytes(parts[0].cpu().tolist()).hex() for parts in gathered]
        differ = [r for r, fp in enumerate(prints) if fp != self.fingerprint]
        if differ:
            raise ValueError(
                f"rank {get_rank(group)}: mask layouts differ across ranks (ranks {differ} disagree with "
                f"this rank's {self.fingerprint[:12]}); masks must be computed once and shared, not per rank"
            )


def compact_all_reduce_(
    compact: Tensor, stats: CommStats | None = None, group: ProcessGroup = None
) -> Tensor:
    """Mean over ranks of a compact buffer, in place: one dense all-reduce of its K entries.

    No indices are sent: every rank holds the same :class:`MaskLayout` (paper 1.3(b)). Bits counted
    in ``stats`` (by ``all_reduce_sum_``): ``K * bits(compact.dtype)`` per call, nothing at world size
    1. The caller records ``stats.dense_bits`` (the dense reference, ``layout.numel * 32``) and steps.
    """
    if compact.dim() != 1 or not compact.is_contiguous():
        raise ValueError(f"compact must be a contiguous 1-D tensor, got shape {tuple(compact.shape)}")
    world = get_world_size(group)
    all_reduce_sum_(compact, stats=stats, group=group)
    if world > 1:
        compact.div_(world)
    return compact


def _check_range(name: str, value: object, low: float, high: float, high_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    ok = low <= value < high if high_open else low <= value <= high
    if not ok:
        interval = f"[{low}, {high})" if high_open else f"[{low}, {high}]"
        raise ValueError(f"{name} must be in {interval}, got {value}")
    return float(value)


class CompactAdamW:
    """AdamW (Loshchilov & Hutter 2019) on the compact vector of unpruned entries (paper 1.3(a)).

    State: fp32 master weights, ``exp_avg`` and ``exp_avg_sq``, each ``[K]`` (never dense). One
    :meth:`step` with the already reduced compact gradient g (any float dtype, used in fp32) does,
    with t the step count, exactly the op sequence of ``torch.optim.AdamW`` 's single-tensor path
    (``foreach=False``, the CPU default; on CUDA torch defaults to ``foreach=True``, whose fused
    list ops may differ in the last bit; amsgrad and maximize are not supported)::

        w *= 1 - lr * weight_decay                      # decoupled weight decay
        m.lerp_(g, 1 - beta1);  v = v * beta2 + (1 - beta2) g^2
        w -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)

    then writes w into the model's parameters at the kept positions (cast to their dtype). So in fp32
    it equals ``torch.optim.AdamW(foreach=False)`` on the masked dense model with masked gradients
    bit for bit, and pruned weights stay exactly zero (they are never written). The model's pruned
    entries must be zero when the optimizer is built (``apply_masks`` first); this is checked.
    """

    def __init__(
        self,
        model: nn.Module,
        layout: MaskLayout,
        *,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
    ) -> None:
        self.model = model
        self.layout = layout
        self._set_hparams(lr, betas, eps, weight_decay)
        params = layout.check_model(model)
        self.master = layout.pack_params(model, torch.float32)
        for name, p, off, k in zip(layout.names, params, layout.offsets, layout.counts, strict=True):
            outside = int(torch.count_nonzero(p.detach())) - int(
                torch.count_nonzero(self.master[off : off + k])
            )
            if outside:
                raise ValueError(
                    f"parameter {name!r} has {outside} nonzero entries at pruned positions: call "
                    "papers.sparse_axonn.pruning.apply_masks(model, masks) before building the "
                    "optimizer"
                )
        self.exp_avg = torch.zeros_like(self.master)
        self.exp_avg_sq = torch.zeros_like(self.master)
        self.num_steps = 0

    def _set_hparams(self, lr: float, betas: tuple[float, float], eps: float, weight_decay: float) -> None:
        self.lr = _check_range("lr", lr, 0.0, math.inf)
        if not isinstance(betas, tuple | list) or len(betas) != 2:
            raise ValueError(f"betas must be a pair (beta1, beta2), got {betas!r}")
        self.betas = (
            _check_range("beta1", betas[0], 0.0, 1.0, high_open=True),
            _check_range("beta2", betas[1], 0.0, 1.0, high_open=True),
        )
        self.eps = _check_range("eps", eps, 0.0, math.inf)
        self.weight_decay = _check_range("weight_decay", weight_decay, 0.0, math.inf)

    @torch.no_grad()
    def step(self, compact_grad: Tensor) -> None:
        """One AdamW step from the reduced compact gradient ``[K]``; updates the model in place."""
        if compact_grad.shape != self.master.shape or not compact_grad.is_floating_point():
            raise ValueError(
                f"compact_grad must be a float tensor of shape ({self.layout.num_kept},), got "
                f"{compact_grad.dtype} of shape {tuple(compact_grad.shape)}"
            )
        grad = compact_grad.to(torch.float32)
        lr, (beta1, beta2) = self.lr, self.betas
        self.num_steps += 1
        # Scalars as torch's _single_tensor_adam computes them (Python floats), so results match bit for bit.
        if self.weight_decay != 0:
            self.master.mul_(1 - lr * self.weight_decay)
        self.exp_avg.lerp_(grad, 1 - beta1)
        self.exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        step = float(self.num_steps)
        bias_correction1 = 1 - beta1**step
        bias_correction2 = 1 - beta2**step
        step_size = lr / bias_correction1
        denom = (self.exp_avg_sq.sqrt() / bias_correction2**0.5).add_(self.eps)
        self.master.addcdiv_(self.exp_avg, denom, value=-step_size)
        self.layout.unpack_(self.master, self.model, into="params")

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.layout.check_model(self.model):
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.zero_()

    def state_tensors(self) -> dict[str, Tensor]:
        """The optimizer's own tensors (what :func:`model_state_bytes` counts)."""
        return {"master": self.master, "exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq}

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.num_steps,
            "lr": self.lr,
            "betas": self.betas,
            "eps": self.eps,
            "weight_decay": self.weight_decay,
            "layout_fingerprint": self.layout.fingerprint,
            **{k: v.detach().clone() for k, v in self.state_tensors().items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore state and hyperparameters, then write the master weights into the model."""
        if state.get("layout_fingerprint") != self.layout.fingerprint:
            raise ValueError(
                "optimizer state was saved with another mask layout (fingerprint "
                f"{str(state.get('layout_fingerprint'))[:12]}, this one {self.layout.fingerprint[:12]})"
            )
        for key, mine in self.state_tensors().items():
            if tuple(state[key].shape) != tuple(mine.shape):
                raise ValueError(
                    f"state {key!r} has shape {tuple(state[key].shape)}, expected {tuple(mine.shape)}"
                )
        self._set_hparams(state["lr"], tuple(state["betas"]), state["eps"], state["weight_decay"])
        for key, mine in self.state_tensors().items():
            mine.copy_(state[key])
        self.num_steps = int(state["step"])
        self.layout.unpack_(self.master, self.model, into="params")


STATE_CATEGORIES = ("params", "grads", "master", "exp_avg", "exp_avg_sq", "compact_grad")


def _nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


def model_state_bytes(
    model: nn.Module,
    masks: Mapping[str, Tensor] | None = None,
    optimizer_kind: Literal["dense", "compact"] = "dense",
    *,
    optimizer: torch.optim.Optimizer | CompactAdamW | None = None,
) -> dict[str, int]:
    """Bytes of model state per category (``STATE_CATEGORIES``) and ``total``, from the tensors.

    Trainable parameters only. ``params``: the parameters; ``grads``: each ``p.grad`` (or a tensor
    like ``p``, which autograd will allocate). ``"dense"``: torch AdamW's ``exp_avg``/``exp_avg_sq``
    (like ``p`` each; counted from ``optimizer.state`` when given), no master copy (the fp32
    parameters are the master weights): fp32 total 16 N. ``"compact"``: the same dense params and
    grads plus :class:`CompactAdamW` 's fp32 ``[K]`` master, exp_avg, exp_avg_sq (from ``optimizer``
    when given, else the ``[K]`` fp32 vectors it allocates) and the fp32 ``[K]`` compact gradient
    buffer of ``pack_grads``: fp32 total ``8 N + 16 K`` = (8 + 16 rho) B per parameter.
    ``layout_indices`` (the layout's int32 indices, 4 B per kept entry of a masked parameter) is
    reported apart and is not in ``total``: the paper's arithmetic (papers.md 1.3(a)) leaves masks out.
    """
    if optimizer_kind not in ("dense", "compact"):
        raise ValueError(f"optimizer_kind must be 'dense' or 'compact', got {optimizer_kind!r}")
    params = [p for _, p in MaskLayout._trainable(model)]
    out = dict.fromkeys(STATE_CATEGORIES, 0)
    out["params"] = sum(_nbytes(p) for p in params)
    out["grads"] = sum(_nbytes(p if p.grad is None else p.grad) for p in params)
    out["layout_indices"] = 0
    if optimizer_kind == "dense":
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise ValueError(
                f"optimizer_kind='dense' counts a torch.optim.Optimizer, got {type(optimizer).__name__}"
            )
        for p in params:
            state = optimizer.state.get(p, {}) if optimizer is not None else {}
            for key in ("exp_avg", "exp_avg_sq"):
                out[key] += _nbytes(state[key]) if key in state else _nbytes(p)
    else:
        layout = optimizer.layout if isinstance(optimizer, CompactAdamW) else MaskLayout(model, masks or {})
        if optimizer is not None and not isinstance(optimizer, CompactAdamW):
            raise ValueError(
                f"optimizer_kind='compact' counts a CompactAdamW, got {type(optimizer).__name__}"
            )
        layout.check_model(model)
        compact = torch.empty(layout.num_kept, dtype=torch.float32, device="meta")  # what each [K] vector is
        tensors = (
            optimizer.state_tensors()
            if optimizer is not None
            else dict.fromkeys(("master", "exp_avg", "exp_avg_sq"), compact)
        )
        for key, t in tensors.items():
            out[key] = _nbytes(t)
        out["compact_grad"] = _nbytes(compact)
        out["layout_indices"] = sum(_nbytes(i) for i in layout.indices if i is not None)
    out["total"] = sum(out[k] for k in STATE_CATEGORIES)
    return out


# ------------------------------------------------------------------ one pipeline stage's compact state
#
# Sparse AxoNN's compact state wired into the pipeline trainer (pipeline_stages.PipelineTrainer):
# :class:`CompactTraining` is both the trainer's optimizer (``zero_grad``, ``step``) and its
# ``reduce_grads`` hook (:data:`~papers.sparse_axonn.pipeline_stages.GradReducer`). Per step, on each rank:
#
# 1. the schedule runs forward and backward densely (dense compute, masked dense weights);
# 2. the kept gradient entries of this stage are packed into one fp32 buffer of K entries (the
#    :class:`MaskLayout` order, identical on every replica because the masks are the prune stage's
#    file, checked with a fingerprint all-gather);
# 3. that buffer is all-reduced *summed* over the stage's replicas (the trainer already scaled the
#    loss by ``1 / (M R)``): ``K x 32`` bits, no indices;
# 4. :class:`CompactAdamW` steps on it and writes the master weights into the dense parameters at the
#    kept positions.
#
# ``grads="dense"`` is the paper's (AxoNN's ``PruningAwareAdam``): autograd's dense gradients stay
# allocated and are packed after the last micro-batch. ``grads="packed"`` (ours, not in the paper)
# packs each gradient into the compact buffer as soon as autograd has accumulated it
# (``register_post_accumulate_grad_hook``) and frees it, so no dense gradient outlives its own
# accumulation: the buffer receives ``g1``, then ``+= g2``... exactly the sums autograd would have
# formed, and the step is bit-identical to the dense-gradient variant. With no masks every entry is
# kept: the dense AxoNN step (AdamW on every entry, one flat all-reduce).


def stage_masks(module: nn.Module, masks: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The masks of ``module``'s own parameters (a stage holds some of the model's)."""
    names = {n for n, _ in module.named_parameters()}
    return {n: m for n, m in masks.items() if n in names}


class CompactTraining:
    """Compact optimizer state, compact all-reduce and (optionally) packed gradients for one stage."""

    def __init__(
        self,
        module: nn.Module,
        masks: Mapping[str, Tensor],
        *,
        lr: float,
        weight_decay: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        grads: str = "dense",
    ) -> None:
        if grads not in ("dense", "packed"):
            raise ValueError(f"grads must be 'dense' or 'packed', got {grads!r}")
        self.module = module
        self.grads = grads
        self.layout = MaskLayout(module, stage_masks(module, masks))
        self.optimizer = CompactAdamW(
            module, self.layout, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay
        )
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
        if get_world_size(group) > 1:  # the dense reference: a flat all-reduce of every entry
            stats.dense_bits += self.layout.numel * 32
            all_reduce_sum_(self.compact_grad, stats=stats, group=group)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)
