"""Unstructured magnitude pruning, iterative pruning with weight rewinding, and mask files.

Sparse AxoNN (Singh & Bhatele, IPDPS 2023) trains a network pruned by magnitude with a *static* mask:
the masks made here are what :mod:`papers.sparse_axonn.compact` turns into a compact layout
(optimizer state and all-reduce over the unpruned entries only). The pruning itself follows the
lottery-ticket recipe the paper starts from: Frankle & Carbin, ICLR 2019 (iterative magnitude
pruning, IMP) with weight rewinding to an early iterate (Frankle et al., ICML 2020, "Linear mode
connectivity and the lottery ticket hypothesis").

A mask is a bool tensor of its parameter's shape, ``True`` = kept (unpruned). Masks are keyed by
parameter name as ``model.named_parameters()`` gives it (tied parameters go by their first name,
e.g. GPT-2's ``transformer.wte.weight``, not ``lm_head.weight``).

Which parameters are prunable (:func:`prunable_parameters`): by default the ``weight`` of every
``nn.Linear``, ``nn.Conv1d/2d/3d``, ``nn.Embedding`` and ``transformers.pytorch_utils.Conv1D`` (GPT-2's
attention and MLP projections); never biases or normalisation layers.

Counting rule (:func:`magnitude_masks`): pruning a fraction ``s`` of ``n`` candidate entries prunes
``round(s * n)`` of them (nearest integer, ties to even; rounding to nearest rather than down keeps
``0.29 * 100 = 28.999...`` from pruning 28). Ties in magnitude are broken by position: a stable sort
of the magnitudes in ``named_parameters`` order, flat (row-major) index within a tensor, prunes the
earlier entry first, so the same weights give the same mask on every rank and every run.
"""

from __future__ import annotations

import logging
import math
import numbers
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from trainer.fileio import atomic_write

__all__ = [
    "MASK_FILE_FORMAT",
    "SavedMasks",
    "apply_masks",
    "check_masks",
    "check_sparsity",
    "load_masks",
    "lottery_ticket",
    "magnitude_masks",
    "masks_sparsity",
    "prunable_parameters",
    "save_masks",
]

log = logging.getLogger(__name__)

Scope = Literal["global", "layerwise"]
SCOPES: tuple[str, ...] = ("global", "layerwise")
MASK_FILE_FORMAT = "thinwire.pruning_masks/1"

# Module types whose ``weight`` is pruned by default. transformers' Conv1D is added at call time when
# transformers is already imported (a model holding one has imported it): importing transformers
# here would cost seconds for every user of common.
DEFAULT_PRUNABLE_TYPES: tuple[type[nn.Module], ...] = (
    nn.Linear,
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.Embedding,
)


def _default_types() -> tuple[type[nn.Module], ...]:
    hf = sys.modules.get("transformers.pytorch_utils")
    conv1d = getattr(hf, "Conv1D", None)
    return (*DEFAULT_PRUNABLE_TYPES, conv1d) if conv1d is not None else DEFAULT_PRUNABLE_TYPES


def prunable_parameters(
    model: nn.Module, types: tuple[type[nn.Module], ...] | None = None
) -> list[tuple[str, nn.Parameter]]:
    """``(name, weight)`` of every prunable weight, in ``model.named_parameters()`` order.

    ``types`` (default: Linear, Conv1d/2d/3d, Embedding, transformers' Conv1D) are the module types
    whose ``weight`` parameter is pruned. A weight shared by several modules (tied embeddings)
    appears once, under its first name.
    """
    types = _default_types() if types is None else types
    prunable = {
        id(module.weight)
        for module in model.modules()
        if isinstance(module, types) and isinstance(getattr(module, "weight", None), nn.Parameter)
    }
    return [(name, p) for name, p in model.named_parameters() if id(p) in prunable]


def check_sparsity(sparsity: object, name: str = "sparsity") -> float:
    """``sparsity`` as a float, or a ValueError naming the value and the allowed range [0, 1)."""
    if isinstance(sparsity, bool) or not isinstance(sparsity, numbers.Real):
        raise ValueError(
            f"{name} must be a real number in [0, 1), got {sparsity!r} ({type(sparsity).__name__})"
        )
    value = float(sparsity)
    if not 0.0 <= value < 1.0:  # NaN fails this too
        raise ValueError(
            f"{name} must be in [0, 1) (the fraction of weights pruned; 1 would prune everything), got {value}"
        )
    return value


def check_masks(model: nn.Module, masks: Mapping[str, Tensor]) -> None:
    """Raise ValueError unless every mask names a parameter of ``model`` and is bool of its shape."""
    params = dict(model.named_parameters())
    for name, mask in masks.items():
        if name not in params:
            listed = ", ".join(list(params)[:8]) + (", ..." if len(params) > 8 else "")
            raise ValueError(
                f"mask {name!r} names no parameter of {type(model).__name__} (tied parameters go by "
                f"their first name); its {len(params)} parameters are: {listed}"
            )
        if not isinstance(mask, Tensor):
            raise ValueError(f"mask {name!r} must be a torch.Tensor, got {type(mask).__name__}")
        if tuple(mask.shape) != tuple(params[name].shape):
            raise ValueError(
                f"mask {name!r} has shape {tuple(mask.shape)} but the parameter has shape "
                f"{tuple(params[name].shape)}"
            )
        if mask.dtype != torch.bool:
            raise ValueError(
                f"mask {name!r} has dtype {mask.dtype}; masks must be torch.bool (True = kept), "
                f"shape {tuple(params[name].shape)}"
            )


@torch.no_grad()
def apply_masks(model: nn.Module, masks: Mapping[str, Tensor]) -> None:
    """Zero the pruned entries (mask ``False``) of the named parameters, in place."""
    check_masks(model, masks)
    params = dict(model.named_parameters())
    for name, mask in masks.items():
        params[name].masked_fill_(~mask.to(params[name].device), 0)


def masks_sparsity(masks: Mapping[str, Tensor]) -> float:
    """Fraction of the masked entries that are pruned (0.0 for no masks)."""
    total = sum(m.numel() for m in masks.values())
    kept = sum(int(m.sum()) for m in masks.values())
    return 1.0 - kept / total if total else 0.0


def _named_tensors(
    model_or_named_params: nn.Module | Mapping[str, Tensor] | Iterable[tuple[str, Tensor]],
) -> list[tuple[str, Tensor]]:
    if isinstance(model_or_named_params, nn.Module):
        return [(n, p.detach()) for n, p in prunable_parameters(model_or_named_params)]
    items = (
        model_or_named_params.items() if isinstance(model_or_named_params, Mapping) else model_or_named_params
    )
    return [(n, t.detach()) for n, t in items]


def _prune_smallest(scores: Tensor, keep: Tensor, sparsity: float) -> Tensor:
    """``keep`` (flat bool) with ``round(sparsity * keep.sum())`` more entries pruned: the smallest
    ``scores`` among the kept ones, ties to the lower position (stable sort)."""
    candidates = torch.nonzero(keep).view(-1)
    num_prune = round(sparsity * candidates.numel())
    out = keep.clone()
    if num_prune:
        order = torch.argsort(scores[candidates], stable=True)
        out[candidates[order[:num_prune]]] = False
    return out


@torch.no_grad()
def magnitude_masks(
    model_or_named_params: nn.Module | Mapping[str, Tensor] | Iterable[tuple[str, Tensor]],
    sparsity: float,
    scope: Scope = "global",
    existing: Mapping[str, Tensor] | None = None,
) -> dict[str, Tensor]:
    """Masks that prune the ``sparsity`` fraction of smallest-magnitude weights still unpruned.

    ``model_or_named_params``: a model (its :func:`prunable_parameters`) or the named tensors to
    prune. ``scope="global"``: one threshold over all of them together; ``"layerwise"``: each tensor
    loses the same fraction. ``existing`` masks (name -> bool, missing names = all kept) make it one
    round of iterative pruning: already-pruned entries stay pruned and ``sparsity`` is the fraction of
    the *remaining* entries to prune now, so k rounds at p leave ``(1 - p)^k`` of the weights.
    Exactly ``round(sparsity * remaining)`` entries are pruned (per tensor when layerwise); ties are
    broken by position (module docstring). Returns one mask per tensor, in the given order.
    """
    sparsity = check_sparsity(sparsity)
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {SCOPES}, got {scope!r}")
    named = _named_tensors(model_or_named_params)
    existing = dict(existing or {})
    shapes = {n: t.shape for n, t in named}
    for name, mask in existing.items():
        if name not in shapes:
            raise ValueError(
                f"existing mask {name!r} names none of the tensors being pruned: {', '.join(shapes)}"
            )
        if tuple(mask.shape) != tuple(shapes[name]) or mask.dtype != torch.bool:
            raise ValueError(
                f"existing mask {name!r} must be torch.bool of shape {tuple(shapes[name])}, "
                f"got {mask.dtype} of shape {tuple(mask.shape)}"
            )
    keeps = [
        existing[n].reshape(-1).to(t.device)
        if n in existing
        else torch.ones(t.numel(), dtype=torch.bool, device=t.device)
        for n, t in named
    ]
    # Magnitudes compared in fp32 (exact for fp16/bf16 weights), fp64 when a weight is fp64.
    wide = torch.float64 if any(t.dtype == torch.float64 for _, t in named) else torch.float32
    scores = [t.reshape(-1).abs().to(wide) for _, t in named]
    for (name, _), s in zip(named, scores, strict=True):
        if not torch.isfinite(s).all():
            raise ValueError(f"tensor {name!r} has non-finite entries: magnitudes cannot be ranked")
    if scope == "layerwise":
        flat = [_prune_smallest(s, k, sparsity) for s, k in zip(scores, keeps, strict=True)]
    elif named:
        devices = {t.device for _, t in named}
        if len(devices) > 1:
            raise ValueError(
                f"global pruning needs all tensors on one device, got {sorted(map(str, devices))}"
            )
        joined = _prune_smallest(torch.cat(scores), torch.cat(keeps), sparsity)
        flat = list(joined.split([t.numel() for _, t in named]))
    else:
        flat = []
    return {n: f.reshape(t.shape) for (n, t), f in zip(named, flat, strict=True)}


def lottery_ticket(
    model: nn.Module,
    train_fn: Callable[[nn.Module, dict[str, Tensor]], object],
    final_sparsity: float,
    rounds: int,
    scope: Scope = "global",
    rewind_state: Mapping[str, Tensor] | None = None,
) -> dict[str, Tensor]:
    """Iterative magnitude pruning with weight rewinding (Frankle & Carbin 2019; Frankle et al. 2020).

    Each of ``rounds`` rounds: ``train_fn(model, masks)`` trains the masked model (the caller's loop;
    it should keep pruned entries at zero, e.g. with :class:`~papers.sparse_axonn.compact.CompactAdamW`), then
    ``p = 1 - (1 - final_sparsity)^(1/rounds)`` of the *remaining* prunable weights are pruned by
    magnitude, then every weight is rewound to ``rewind_state`` (a state dict; default: the weights
    on entry, i.e. the original lottery ticket's rewinding to initialisation; pass the state after
    k steps for late rewinding) and the masks applied. ``rounds=1`` is one-shot pruning. The first
    round trains with all-True masks. Returns the final masks; the model is left rewound and masked,
    ready for the final training run. Per-round rounding (``round(p * remaining)``) may leave the
    final sparsity a few entries from ``final_sparsity`` (at most ``rounds`` entries per tensor).
    """
    final_sparsity = check_sparsity(final_sparsity, "final_sparsity")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an int >= 1 (1 = one-shot pruning), got {rounds!r}")
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {SCOPES}, got {scope!r}")
    if rewind_state is None:
        rewind_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    per_round = 1.0 - (1.0 - final_sparsity) ** (1.0 / rounds)
    masks = {n: torch.ones_like(p, dtype=torch.bool) for n, p in prunable_parameters(model)}
    for r in range(rounds):
        train_fn(model, masks)
        masks = magnitude_masks(model, per_round, scope, existing=masks)
        model.load_state_dict(rewind_state)
        apply_masks(model, masks)
        log.info("lottery ticket round %d/%d: sparsity %.4f", r + 1, rounds, masks_sparsity(masks))
    return masks


@dataclass(frozen=True)
class SavedMasks:
    """A mask file's contents: the masks and what they were made with."""

    masks: dict[str, Tensor]
    sparsity: float  # the masks' actual fraction pruned (masks_sparsity)
    scope: str
    shapes: dict[str, tuple[int, ...]]  # shapes of the model's masked parameters when saved


def save_masks(
    path: str | os.PathLike[str], masks: Mapping[str, Tensor], model: nn.Module, scope: str
) -> None:
    """Write ``masks`` (checked against ``model``) with their sparsity, scope and parameter shapes.

    The file is a ``torch.save`` of plain tensors, strings, floats and lists (loadable with
    ``weights_only=True``), written atomically.
    """
    check_masks(model, masks)
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {SCOPES}, got {scope!r}")
    params = dict(model.named_parameters())
    record = {
        "format": MASK_FILE_FORMAT,
        "masks": {n: m.detach().cpu().clone() for n, m in masks.items()},
        "sparsity": masks_sparsity(masks),
        "scope": scope,
        "shapes": {n: list(params[n].shape) for n in masks},
    }
    atomic_write(path, lambda tmp: torch.save(record, tmp))


def load_masks(path: str | os.PathLike[str], model: nn.Module | None = None) -> SavedMasks:
    """Read a file written by :func:`save_masks`; with ``model``, check the masks fit it.

    Raises ValueError if the file is not a mask file, its metadata disagree with its masks, or
    (with ``model``) a mask does not fit the model's parameter of that name.
    """
    record: Any = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(record, dict) or record.get("format") != MASK_FILE_FORMAT:
        found = record.get("format") if isinstance(record, dict) else type(record).__name__
        raise ValueError(f"{path} is not a mask file of format {MASK_FILE_FORMAT!r} (found {found!r})")
    masks: dict[str, Tensor] = record["masks"]
    shapes = {n: tuple(s) for n, s in record["shapes"].items()}
    if set(shapes) != set(masks):
        raise ValueError(f"{path}: shapes are recorded for {sorted(shapes)} but masks for {sorted(masks)}")
    for name, mask in masks.items():
        if mask.dtype != torch.bool or tuple(mask.shape) != shapes[name]:
            raise ValueError(
                f"{path}: mask {name!r} is {mask.dtype} of shape {tuple(mask.shape)}, the file "
                f"records shape {shapes[name]} and masks must be torch.bool"
            )
    sparsity = float(record["sparsity"])
    if not math.isclose(sparsity, masks_sparsity(masks), rel_tol=0, abs_tol=1e-12):
        raise ValueError(
            f"{path}: recorded sparsity {sparsity} but the masks' is {masks_sparsity(masks)} (corrupt file?)"
        )
    if model is not None:
        check_masks(model, masks)
    return SavedMasks(masks=masks, sparsity=sparsity, scope=str(record["scope"]), shapes=shapes)


def pruned_nonzero(model: nn.Module, masks: Mapping[str, Tensor]) -> dict[str, int]:
    """Per masked parameter of ``model``, how many of its pruned entries (mask False) are nonzero;
    masks naming no parameter of ``model`` (another pipeline stage's) are skipped. All zeros for a
    model that is the pruned one."""
    params = dict(model.named_parameters())
    return {n: int((params[n].detach()[~m] != 0).sum()) for n, m in masks.items() if n in params}
