"""Keller Jordan's airbench CIFAR-10 network (airbench94.py), in fp32 for CPUs."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class _AirbenchBatchNorm(nn.BatchNorm2d):
    """airbench's BatchNorm: scale frozen at 1 (only the shift trains), eps 1e-12, and running
    statistics that follow the batch quickly (torch momentum 0.4: airbench's 0.6 in the other
    convention), so a short run evaluates with statistics of its last steps."""

    def __init__(self, channels: int, eps: float = 1e-12) -> None:
        super().__init__(channels, eps=eps, momentum=0.4)
        self.weight.requires_grad_(False)


class _AirbenchConv(nn.Conv2d):
    """3x3 'same' conv without bias, identity-initialised on its first ``in_channels`` outputs (an
    implicit residual, airbench's ``Conv``)."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__(in_channels, out_channels, kernel_size=3, padding="same", bias=False)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        with torch.no_grad():
            nn.init.dirac_(self.weight[: self.weight.shape[1]])


class _AirbenchGroup(nn.Module):
    """conv -> max-pool 2 -> BN -> GELU -> conv -> BN -> GELU."""

    def __init__(self, in_channels: int, out_channels: int, bn_eps: float = 1e-12) -> None:
        super().__init__()
        self.conv1 = _AirbenchConv(in_channels, out_channels)
        self.norm1 = _AirbenchBatchNorm(out_channels, bn_eps)
        self.conv2 = _AirbenchConv(out_channels, out_channels)
        self.norm2 = _AirbenchBatchNorm(out_channels, bn_eps)

    def forward(self, x: Tensor) -> Tensor:
        x = F.gelu(self.norm1(F.max_pool2d(self.conv1(x), 2)))
        return F.gelu(self.norm2(self.conv2(x)))


class AirbenchNet(nn.Module):
    """The CIFAR-10 network of Keller Jordan's airbench (airbench94.py), in fp32 for CPUs.

    2x2 patch-whitening conv (2 x 3 x 2 x 2 = 24 channels, frozen, set from the training images'
    patch covariance by :meth:`init_from_data`) -> GELU -> three groups of (conv, pool, BN, GELU,
    conv, BN, GELU) of ``width``, ``4 width``, ``4 width`` channels -> max-pool 3 -> linear without
    bias, scaled by 1/9. ``width`` 64 is airbench's (1,97M parameters); the suite uses a narrower
    one for 2 CPU cores. ``bn_eps`` is airbench's 1e-12 by default; on MNIST, whose background is
    one constant value, a channel's batch variance can come near 0 at small per-rank batches (64
    and below, measured: a first-step gradient of 3e11) and 1e-5 (torch's default) keeps it finite. Differences from airbench: fp32 (not fp16), no channels_last by default,
    and the whitening is optional (``whiten=False``: a plain trainable 2x2 conv stem).
    Trainable parameters: the conv weights, the BN shifts and the classifier.
    """

    def __init__(
        self,
        *,
        num_classes: int,
        in_channels: int,
        image_size: int,
        width: int = 64,
        whiten: bool = True,
        bn_eps: float = 1e-12,
    ) -> None:
        super().__init__()
        if isinstance(width, bool) or not isinstance(width, int) or width < 1:
            raise ValueError(f"airbench width must be a positive integer, got {width!r}")
        if isinstance(bn_eps, bool) or not isinstance(bn_eps, int | float) or not 0 < bn_eps < 1:
            raise ValueError(f"airbench bn_eps must be a number in (0, 1), got {bn_eps!r}")
        if image_size < 24:
            raise ValueError(
                f"airbench needs image_size >= 24 (three 2x poolings and a 3x3), got {image_size}"
            )
        stem = 2 * in_channels * 2 * 2
        self.whiten = nn.Conv2d(in_channels, stem, kernel_size=2, padding=0, bias=True)
        self.whitened = False
        if whiten:
            self.whiten.weight.requires_grad_(False)
        self.groups = nn.Sequential(
            _AirbenchGroup(stem, width, bn_eps),
            _AirbenchGroup(width, 4 * width, bn_eps),
            _AirbenchGroup(4 * width, 4 * width, bn_eps),
        )
        self.fc = nn.Linear(4 * width, num_classes, bias=False)
        self.use_whitening = whiten

    @torch.no_grad()
    def init_from_data(self, images: Tensor, eps: float = 5e-4) -> None:
        """Set the frozen whitening filters from normalized training images [N, C, H, W]: the
        eigenvectors of the 2x2-patch covariance scaled by 1/sqrt(eigenvalue + eps), and their
        negatives (airbench's ``init_whitening_conv``). Deterministic: every rank computes the same
        filters from the same images. A no-op when ``whiten=False``."""
        if not self.use_whitening:
            return
        c, (h, w) = images.shape[1], self.whiten.weight.shape[2:]
        patches = images.unfold(2, h, 1).unfold(3, w, 1).transpose(1, 3).reshape(-1, c, h, w).double()
        flat = patches.flatten(1)
        covariance = flat.T @ flat / flat.shape[0]
        eigenvalues, eigenvectors = torch.linalg.eigh(covariance)
        eigenvalues, eigenvectors = eigenvalues.flip(0), eigenvectors.T.flip(0)
        filters = (eigenvectors / torch.sqrt(eigenvalues + eps)[:, None]).reshape(c * h * w, c, h, w)
        self.whiten.weight.copy_(torch.cat((filters, -filters)).float())
        self.whitened = True

    def forward(self, x: Tensor) -> Tensor:
        x = self.groups(F.gelu(self.whiten(x)))
        x = F.max_pool2d(x, 3)
        return self.fc(torch.flatten(x, 1)) / 9.0
