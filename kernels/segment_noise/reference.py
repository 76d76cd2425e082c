"""Pure-torch reference for ``segment_noise``: a counter hash per entry, keyed by its segment.

Op: for entry ``i`` of a bucket, in segment ``s`` (``ids[i]``) at index ``j = i - starts[s]``
within it, ``h = lowbias32(lowbias32(j ^ k1[s]) ^ k2[s])`` (``kernels._native``'s hash) and

- ``"uniform"``: ``u = (h >> 8) * 2^-24``, fp32 in [0, 1) (24 bits, as ``torch.rand``);
- ``"priority"``: the fp32 whose bits are ``(h >> 2) + 2^23``: positive, finite and normal, 30
  random bits that order as the values do (the largest k of a segment are a uniform k-subset).

The numbers depend on (keys, index within the segment) only, not on where the segment sits in the
bucket. In int64 arithmetic every product stays below 2^63 (multipliers below 2^31).

Shape legend: N entries, S segments.
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
MULTIPLIERS = (0x21F0AAAD, 0x735A2D97)
KINDS = ("uniform", "priority")


def hash32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 of int64 values in [0, 2^32)."""
    c1, c2 = MULTIPLIERS
    x = x ^ (x >> 16)
    x = (x * c1) & MASK32
    x = x ^ (x >> 15)
    x = (x * c2) & MASK32
    return x ^ (x >> 15)


def segment_noise(
    ids_N: torch.Tensor, starts_S: torch.Tensor, k1_S: torch.Tensor, k2_S: torch.Tensor, kind: str
) -> torch.Tensor:
    """fp32 ``[N]`` (module docstring) for int64 ``ids_N`` and int64 ``starts_S``, ``k1_S``, ``k2_S``."""
    ids = ids_N.long()
    local_N = torch.arange(ids.numel(), device=ids.device) - starts_S.index_select(0, ids)
    h = hash32(hash32(local_N ^ k1_S.index_select(0, ids)) ^ k2_S.index_select(0, ids))
    if kind == "uniform":
        return (h >> 8).to(torch.float32).mul_(2.0**-24)
    return ((h >> 2) + 0x00800000).to(torch.int32).view(torch.float32)
