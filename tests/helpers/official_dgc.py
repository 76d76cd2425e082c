"""DGC's official sparsifier and decompression, transcribed for comparison (tests and benchmarks).

``synxlin/deep-gradient-compression``, ``dgc/compression.py``: ``DGCCompressor.initialize`` (the
sample plan), ``_sparsify`` and ``decompress``, with Horovod and the per-name attribute table taken
out. Two changes, both the documented deviations of :mod:`common.compressors.dgc`: the strided
sample's random start is an argument (the code draws it from Python's ``random``), and the sample
is cut to ``num_samples`` entries (the code's slice ``importance[start::stride]`` may hold one
more). Everything else is the code's, line for line: |x| once, ``ge`` + ``nonzero`` per round, the
hierarchical top-k, ``indices[:num_selects]``; decompression into the reused gradient buffer
(``grad.zero_().index_put_(..., accumulate=True)``).
"""

# ruff: noqa: RUF046, SIM108  (the official code, line for line: its int(math.ceil(...)) and if-else kept)

from __future__ import annotations

import math

import torch


def sample_plan(numel: int, compress_ratio: float, sample_ratio: float = 0.01) -> tuple[int, int, int, int]:
    """``(num_selects, num_samples, top_k_samples, sample_stride)``, the code's ``initialize``."""
    if sample_ratio < 1.0:
        pct_numel = int(math.ceil(numel * sample_ratio))
        cpr_numel = int(math.ceil(2 / compress_ratio))
        if numel <= cpr_numel:
            sample_stride = 1
            num_samples = numel
        else:
            sample_stride = int(math.ceil(numel / max(pct_numel, cpr_numel) / 32)) * 32 + 1
            num_samples = numel // sample_stride
            while num_samples < max(pct_numel, cpr_numel):
                sample_stride = sample_stride - 8
                num_samples = numel // sample_stride
    else:
        sample_stride = 1
        num_samples = numel
    top_k_samples = int(math.ceil(num_samples * compress_ratio))
    num_selects = int(math.ceil(numel * compress_ratio))
    return num_selects, num_samples, top_k_samples, sample_stride


def sparsify(
    tensor: torch.Tensor,
    compress_ratio: float,
    sample_start: int,
    *,
    compress_upper_bound: float = 1.3,
    compress_lower_bound: float = 0.8,
    max_adaptation_iters: int = 10,
    resample: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values, indices)``: the code's ``_sparsify`` with a strided sample from ``sample_start``."""
    tensor = tensor.view(-1)
    numel = tensor.numel()
    num_selects, num_samples, top_k_samples, sample_stride = sample_plan(numel, compress_ratio)

    importance = tensor.abs()
    if numel == num_samples:
        samples = importance
    else:
        samples = importance[sample_start::sample_stride][:num_samples]

    threshold = torch.min(torch.topk(samples, top_k_samples, 0, largest=True, sorted=False)[0])
    mask = torch.ge(importance, threshold)
    indices = mask.nonzero().view(-1)
    num_indices = indices.numel()

    if numel > num_samples:
        for _ in range(max_adaptation_iters):
            if num_indices > num_selects:
                if num_indices > num_selects * compress_upper_bound:
                    if resample:
                        indices = indices[
                            torch.topk(importance[indices], num_selects, 0, largest=True, sorted=False)[1]
                        ]
                        break
                    else:
                        threshold = threshold * compress_upper_bound
                else:
                    break
            elif num_indices < compress_lower_bound * num_selects:
                threshold = threshold * compress_lower_bound
            else:
                break
            mask = torch.ge(importance, threshold)
            indices = mask.nonzero().view(-1)
            num_indices = indices.numel()

    indices = indices[:num_selects]
    values = tensor[indices]
    return values, indices


def decompress(values: torch.Tensor, indices: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """The code's ``decompress`` (sum, before its division by the world size) into ``grad``."""
    return grad.zero_().index_put_([indices.view(-1)], values.view(-1), accumulate=True)
