"""Gather the entries under a static mask into a compact buffer (with a dtype cast), and back.

Sparse AxoNN (Singh & Bhatele 2023) all-reduces only the unpruned entries of each gradient:
``compact = masked_compact(grad, indices, torch.float16)`` -> all-reduce ``compact`` ->
``masked_scatter(compact, indices, grad)``. Bits on the wire: ``K * bits(out_dtype)`` per tensor,
with K the mask's entry count. ``mask`` is either the ascending flat indices (int32/int64, from
``mask_to_indices``: compute them once, the mask is static) or a bool mask of x's shape, which costs a
host synchronisation per call to turn into indices.
"""

from __future__ import annotations

import logging

import torch

from kernels import _native
from kernels._dispatch import Backend, check_index_dtype, check_numel, check_same_device, use_triton
from kernels.masked_compact import reference
from kernels.masked_compact.reference import mask_to_indices

__all__ = ["mask_to_indices", "masked_compact", "masked_scatter"]

logger = logging.getLogger(__name__)

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _indices(mask: torch.Tensor, numel: int) -> torch.Tensor:
    if mask.dtype == torch.bool:
        logger.debug("bool mask of %d entries -> indices (a host sync; pass mask_to_indices(mask))", numel)
        if mask.numel() != numel:
            raise ValueError(
                f"a bool mask must have {numel} elements (the dense tensor's), got {mask.numel()}"
            )
        return mask_to_indices(mask)
    check_index_dtype(mask, "mask indices")
    return mask.contiguous()


def _check_dtype(dtype: torch.dtype, name: str) -> None:
    if dtype not in _DTYPES:
        raise ValueError(f"{name} must be one of {[str(d) for d in _DTYPES]}, got {dtype}")


def masked_compact(
    x: torch.Tensor,
    mask: torch.Tensor,
    out_dtype: torch.dtype | None = None,
    *,
    backend: Backend = "auto",
) -> torch.Tensor:
    """``x`` (read flat) at the mask's positions, cast to ``out_dtype`` (default x's): ``[K]``."""
    out_dtype = x.dtype if out_dtype is None else out_dtype
    _check_dtype(x.dtype, "x")
    _check_dtype(out_dtype, "out_dtype")
    check_numel(x.numel(), "x")
    check_same_device(x=x, mask=mask)
    indices_K = _indices(mask, x.numel())
    x_N = x.reshape(-1).contiguous()
    if use_triton(backend, x.device):
        from kernels.masked_compact import triton as triton_impl

        return triton_impl.masked_compact(x_N, indices_K, out_dtype)
    return reference.masked_compact(x_N, indices_K, out_dtype)


def masked_scatter(
    compact: torch.Tensor,
    mask: torch.Tensor,
    out: torch.Tensor,
    *,
    backend: Backend = "auto",
) -> torch.Tensor:
    """Write ``compact`` (cast to ``out.dtype``) into ``out`` at the mask's positions; returns ``out``.

    ``out`` must be contiguous (it is written in place); entries outside the mask are untouched.
    On CPU, fp32 with int32 indices, ``"auto"`` runs a compiled loop (``kernels._native``, the
    reference's values; an index outside ``out`` is an IndexError there too, with nothing written).
    """
    if backend == "auto" and _native.scatter_fast(compact, mask, out):  # the common case on CPU
        return out
    _check_dtype(compact.dtype, "compact")
    _check_dtype(out.dtype, "out")
    if not out.is_contiguous():
        raise ValueError("out must be contiguous (it is written in place)")
    check_numel(out.numel(), "out")
    check_same_device(compact=compact, mask=mask, out=out)
    indices_K = _indices(mask, out.numel())
    if compact.dim() != 1 or compact.numel() != indices_K.numel():
        raise ValueError(
            f"compact must be 1-D with one entry per mask position ({indices_K.numel()}), "
            f"got shape {tuple(compact.shape)}"
        )
    compact_K = compact.contiguous()
    if backend == "auto" and _native.scatter_fast(compact_K, indices_K, out):  # e.g. strided values
        return out
    if use_triton(backend, out.device):
        from kernels.masked_compact import triton as triton_impl

        triton_impl.masked_scatter(compact_K, indices_K, out.view(-1))
    else:
        reference.masked_scatter(compact_K, indices_K, out.view(-1))
    return out
