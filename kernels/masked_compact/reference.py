"""Pure-torch reference for ``masked_compact`` / ``masked_scatter`` (sparse AxoNN, Singh & Bhatele
2023: the all-reduce carries only the unpruned gradient entries, in a compact buffer).

``masked_compact``: ``compact[k] = cast(x_flat[indices[k]])``, gathered then cast once (e.g. fp32
gradient -> fp16 wire buffer, round to nearest even). ``masked_scatter``: ``out_flat[indices[k]] =
cast(compact[k])``; entries outside the mask are left as they are. ``indices`` are the flat positions
of the static mask in ascending order (``mask_to_indices``), identical on every rank, so compact
buffers line up element by element and can be all-reduced. Indices must be unique for the scatter.

Shape legend: N elements, K mask entries.
"""

from __future__ import annotations

import torch


def mask_to_indices(mask: torch.Tensor) -> torch.Tensor:
    """Ascending flat positions of a bool mask: int32 ``[K]`` (one host sync: compute it once)."""
    return torch.nonzero(mask.reshape(-1)).view(-1).to(torch.int32)


def masked_compact(x_N: torch.Tensor, indices_K: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    return x_N[indices_K.to(torch.int64)].to(out_dtype)


def masked_scatter(compact_K: torch.Tensor, indices_K: torch.Tensor, out_N: torch.Tensor) -> None:
    out_N.index_copy_(0, indices_K.to(torch.int64), compact_K.to(out_N.dtype))
