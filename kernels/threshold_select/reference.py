"""Pure-torch reference for ``threshold_select`` and the sampled ``estimate_threshold``.

``threshold_select``: the entries with ``|x| >= threshold`` (compared in fp32), written into
fixed-capacity buffers with no host synchronisation (``torch.nonzero_static``): values in x's dtype,
int32 flat indices in ascending order, and the exact count as an int64 0-dim tensor. When more than
``capacity`` entries qualify, the reference keeps the ``capacity`` lowest indices. Slots past the
count hold value 0 at index 0, so a scatter-add of the whole buffer is harmless.

``estimate_threshold`` (DGC, Lin et al. 2018, and its code's ``_sparsify``): draw S positions
uniformly (with replacement) from an explicit generator, take the top ``ceil(S * density)``
of the sampled ``|x|`` and return the smallest of them. Uniform positions rather than DGC's random
start + stride: a stride can alias with the period of a weight layout. When the sample would be at
least the whole tensor, the whole tensor is used and the threshold is exact.

Shape legend: N elements, K capacity, S samples.
"""

from __future__ import annotations

import math

import torch


def threshold_select(
    x_N: torch.Tensor, threshold: torch.Tensor, capacity: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(values [K], indices int32 [K], count int64 [])`` of flat ``x_N``, fp32 0-dim ``threshold``."""
    selected_N = x_N.to(torch.float32).abs() >= threshold
    count = torch.count_nonzero(selected_N)  # a bool .sum() is 20x slower on CPU
    indices_K = torch.nonzero_static(selected_N, size=capacity, fill_value=0).view(-1)
    if x_N.numel() == 0:  # no entry to read at the fill index 0
        return x_N.new_zeros(capacity), indices_K.to(torch.int32), count
    filled_K = torch.arange(capacity, device=x_N.device) < count
    values_K = torch.where(filled_K, x_N[indices_K], torch.zeros((), dtype=x_N.dtype, device=x_N.device))
    return values_K, indices_K.to(torch.int32), count


def num_threshold_samples(
    numel: int, density: float, sample_size: int | None, sample_fraction: float | None
) -> int:
    """Sample count for ``estimate_threshold``: ``sample_size``, or ``sample_fraction`` of the tensor
    (default 1 %, DGC's sample ratio) but at least ``2 / density``; never more than the tensor."""
    if sample_size is not None and sample_fraction is not None:
        raise ValueError("pass at most one of sample_size and sample_fraction")
    if sample_size is not None:
        if isinstance(sample_size, bool) or not isinstance(sample_size, int) or sample_size < 1:
            raise ValueError(f"sample_size must be a positive int, got {sample_size!r}")
        return min(sample_size, numel)
    fraction = 0.01 if sample_fraction is None else sample_fraction
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"sample_fraction must be in (0, 1], got {fraction!r}")
    # DGC's floor of 2 / density samples, so that the sample's top-k holds at least two entries.
    return min(max(math.ceil(fraction * numel), math.ceil(2.0 / density)), numel)


def estimate_threshold(
    x: torch.Tensor,
    density: float,
    *,
    sample_size: int | None = None,
    sample_fraction: float | None = None,
    generator: torch.Generator,
) -> torch.Tensor:
    """fp32 0-dim threshold such that about ``density * numel`` entries have ``|x| >= threshold``.

    No host synchronisation; ``generator`` must live on x's device (unused when the sample covers
    the whole tensor).
    """
    if not 0.0 < density <= 1.0:
        raise ValueError(f"density must be in (0, 1], got {density!r}")
    numel = x.numel()
    if numel == 0:
        raise ValueError("cannot estimate a threshold for an empty tensor")
    num_samples = num_threshold_samples(numel, density, sample_size, sample_fraction)
    x_N = x.reshape(-1)
    if num_samples >= numel:
        sample_S = x_N
    else:
        positions_S = torch.randint(numel, (num_samples,), generator=generator, device=x.device)
        sample_S = x_N[positions_S]
    k = min(num_samples, math.ceil(num_samples * density))
    return torch.topk(sample_S.to(torch.float32).abs(), k, sorted=False).values.min()
