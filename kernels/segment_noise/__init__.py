"""Counter-hash noise for the fused route: one number per entry of a bucket, keyed by its tensor.

``segment_noise(ids, starts, k1, k2, kind)``: for entry i in segment ``ids[i]`` at index
``i - starts[ids[i]]`` within it, the hash of that index under the segment's two 32-bit keys, as an
fp32 uniform in [0, 1) (``"uniform"``) or a positive float with 30 random bits (``"priority"``);
``reference.py`` defines it. The Triton kernel (CUDA), the compiled C loop (CPU,
``kernels._native``) and the reference give the same numbers bit for bit.
"""

from __future__ import annotations

import torch

from kernels import _native
from kernels._dispatch import NativeBackend, check_same_device, use_native, use_triton
from kernels.segment_noise import reference
from kernels.segment_noise.reference import KINDS

__all__ = ["KINDS", "segment_noise", "tensor_noise"]


def segment_noise(
    ids_N: torch.Tensor,
    starts_S: torch.Tensor,
    k1_S: torch.Tensor,
    k2_S: torch.Tensor,
    kind: str = "uniform",
    *,
    backend: NativeBackend = "auto",
) -> torch.Tensor:
    """fp32 ``[N]`` counter-hash numbers (module docstring). ``ids_N``: int32 or int64 segment of
    each entry (non-decreasing: segments laid end to end); ``starts_S``, ``k1_S``, ``k2_S``: int64
    (keys in [0, 2^32))."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {list(KINDS)}, got {kind!r}")
    if ids_N.dtype not in (torch.int32, torch.int64) or ids_N.dim() != 1:
        raise ValueError(
            f"ids must be a 1-D int32 or int64 tensor, got {ids_N.dtype} of shape {tuple(ids_N.shape)}"
        )
    device = check_same_device(ids=ids_N, starts=starts_S, k1=k1_S, k2=k2_S)
    if use_native(backend, device):
        return _native.segment_noise(starts_S, k1_S, k2_S, ids_N.numel(), kind == "priority")
    if use_triton(backend, device):
        from kernels.segment_noise import triton as triton_impl

        return triton_impl.segment_noise(
            ids_N.contiguous(), starts_S.contiguous(), k1_S.contiguous(), k2_S.contiguous(), kind
        )
    return reference.segment_noise(ids_N, starts_S, k1_S, k2_S, kind)


def tensor_noise(
    numel: int, keys: tuple[int, int], kind: str = "uniform", device: torch.device | str = "cpu"
) -> torch.Tensor:
    """:func:`segment_noise` of one tensor of ``numel`` entries under host ``keys`` (a CPU runs
    the compiled loop with no table of segment ids)."""
    device = torch.device(device)
    starts = torch.zeros(1, dtype=torch.int64, device=device)
    k1, k2 = (torch.tensor([k], dtype=torch.int64, device=device) for k in keys)
    if kind in KINDS and use_native("auto", device):
        return _native.segment_noise(starts, k1, k2, numel, kind == "priority")
    return segment_noise(torch.zeros(numel, dtype=torch.int32, device=device), starts, k1, k2, kind)
