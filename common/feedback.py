"""Error feedback (residual memory), separate from the compressor.

Seide et al. 2014, Karimireddy et al. 2019: what a compressor drops is remembered and added to the
next step's gradient, so that nothing is lost, only delayed::

    compensated = gradient + residual
    sent        = decompress(compress(compensated))
    residual    = compensated - sent                     # conservation: compensated == sent + residual

Residuals are kept per named tensor (a parameter name), not per communication bucket: a bucket's
composition may change (PyTorch DDP rebuilds its buckets after the first step), a parameter's name
does not.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


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
        return torch.cat([p + self.residual(k, p) for k, p in zip(keys, parts, strict=True)])

    def update(self, keys: Sequence[str], compensated: Tensor, sent: Tensor, sizes: Sequence[int]) -> None:
        """Store ``compensated - sent`` split back into the named tensors' residuals."""
        new = (compensated - sent.reshape(-1)).split(list(sizes))
        for key, part in zip(keys, new, strict=True):
            self.residuals[key] = part

    def state_dict(self) -> dict[str, dict[str, Tensor]]:
        return {"residuals": {k: v.detach().clone() for k, v in self.residuals.items()}}

    def load_state_dict(self, state: dict[str, dict[str, Tensor]]) -> None:
        self.residuals = {k: v.clone() for k, v in state["residuals"].items()}
