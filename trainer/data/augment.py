"""Training-time augmentation of image batches, reproducible without any saved state.

``crop_flip`` is the standard CIFAR recipe of the papers' code (ResNet, DGC, TernGrad's CIFAR
runs): pad 4 pixels with zeros (after normalization: the mean), take a random crop of the original
size, flip horizontally with probability 1/2. The draws come from a generator seeded by
``(seed, rank, step)``, so a resumed run augments exactly as an uninterrupted one, every rank
differently, and the global RNG is never touched.

``flip_translate`` is airbench's (Keller Jordan's CIFAR-10 speed runs): flip horizontally with
probability 1/2, then translate by up to 2 pixels each way with reflect padding (no black borders;
a milder shift suits short runs). airbench alternates flips deterministically per epoch; ours are
random draws from the same reproducible generator.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from common.config import AUGMENTATIONS

_PAD = 4
_TRANSLATE = 2


def augment_generator(seed: int, rank: int, step: int) -> torch.Generator:
    generator = torch.Generator()
    generator.manual_seed((seed * 1_000_003 + rank * 7_919 + step * 104_729) % 2**63)
    return generator


def augment_batch(x: Tensor, kind: str, generator: torch.Generator) -> Tensor:
    """Augment images ``x`` [B, C, H, W] (a new tensor; ``x`` is not modified)."""
    if kind == "none":
        return x
    if kind not in AUGMENTATIONS:
        raise ValueError(f"unknown augmentation {kind!r}; valid: {', '.join(AUGMENTATIONS)}")
    if x.dim() != 4:
        raise ValueError(f"augment {kind!r} needs image batches [B, C, H, W], got shape {tuple(x.shape)}")
    b, _, h, w = x.shape
    pad, mode = (_PAD, "constant") if kind == "crop_flip" else (_TRANSLATE, "reflect")
    # Draws on the CPU generator (the same numbers on any device), indices on x's device.
    offsets = torch.randint(0, 2 * pad + 1, (2, b), generator=generator).to(x.device)
    flips = (torch.rand(b, generator=generator) < 0.5).to(x.device)
    padded = F.pad(x, (pad, pad, pad, pad), mode=mode)
    rows = (offsets[0, :, None] + torch.arange(h, device=x.device))[:, None, :, None]  # [B, 1, H, 1]
    cols = offsets[1, :, None] + torch.arange(w, device=x.device)  # [B, W]
    cols = torch.where(flips[:, None], cols.flip(1), cols)[:, None, None, :]  # [B, 1, 1, W]
    batch = torch.arange(b, device=x.device)[:, None, None, None]
    channels = torch.arange(x.shape[1], device=x.device)[None, :, None, None]
    return padded[batch, channels, rows, cols]
