"""A Sputnik-like sparse-compute baseline: pruned Linear / Conv1D layers as CSR matmuls.

Singh & Bhatele (IPDPS 2023) compare sparse AxoNN, which keeps the computation dense (masked dense
weights, cuBLAS GEMMs), with a baseline that runs the pruned layers as sparse-times-dense products
(Sputnik: Gale et al., SC'20, CSR SpMM/SDDMM; papers.md 1.3(d)). At 80-90 % *unstructured*
sparsity such kernels lose to dense GEMMs on GPUs. This module is that baseline in plain torch:
:func:`to_sparse_compute` replaces each masked ``nn.Linear`` and ``transformers`` ``Conv1D`` by a
:class:`SparseLinear` whose weight is a ``torch.sparse_csr`` tensor built each forward from a
trainable ``values`` vector (the K kept weights) and fixed ``crow_indices`` / ``col_indices``.

Autograd (measured with torch 2.14 on CPU): ``torch.sparse_csr_tensor(crow, col, values)`` is
differentiable in ``values`` and ``torch.sparse.mm(csr, dense)`` / ``torch.mm(dense, csr)``
propagate gradients to both operands; the weight gradient arrives as a dense ``[K]`` vector. Only
kept weights exist as parameters, so training cannot revive a pruned one. Caveats found: the CPU
kernels (MKL) support only fp32/fp64 (fp16/bf16 raise "not implemented"); and the backward of the
CSR constructor goes through ``to_dense()`` + ``sparse_mask``, a dense ``out x in`` temporary, so
the backward is not memory-sparse (the forward and the SDDMM of the Linear layout are).

``values`` holds the kept weights in the dense weight's flat row-major order, the same order as
``kernels.masked_compact.mask_to_indices`` and hence :class:`papers.sparse_axonn.compact.MaskLayout`.
"""

from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Mapping
from typing import Literal

import torch
from torch import Tensor, nn

from .pruning import check_masks

__all__ = ["SparseLinear", "to_sparse_compute"]

log = logging.getLogger(__name__)

_CPU_DTYPES = (torch.float32, torch.float64)


class SparseLinear(nn.Module):
    """A pruned linear map computed as a CSR matmul; only the kept weights are parameters.

    ``orientation="linear"``: ``weight`` is ``[out, in]``, ``y = x W^T + b`` (``nn.Linear``), computed
    as ``(W_csr @ x^T)^T``. ``orientation="conv1d"``: ``weight`` is ``[in, out]``, ``y = x W + b``
    (transformers' ``Conv1D``), computed as ``x @ W_csr``. Inputs ``[..., in]``, outputs ``[..., out]``.
    """

    crow_indices: Tensor  # [rows + 1] int64 buffer
    col_indices: Tensor  # [K] int64 buffer

    def __init__(
        self,
        weight: Tensor,
        mask: Tensor,
        bias: Tensor | None = None,
        orientation: Literal["linear", "conv1d"] = "linear",
    ) -> None:
        super().__init__()
        if orientation not in ("linear", "conv1d"):
            raise ValueError(f"orientation must be 'linear' or 'conv1d', got {orientation!r}")
        if weight.dim() != 2 or mask.shape != weight.shape or mask.dtype != torch.bool:
            raise ValueError(
                f"weight must be 2-D and mask bool of its shape, got weight {tuple(weight.shape)} and "
                f"mask {mask.dtype} {tuple(mask.shape)}"
            )
        if weight.device.type == "cpu" and weight.dtype not in _CPU_DTYPES:
            raise ValueError(
                f"CSR matmul on CPU supports {_CPU_DTYPES} only, got weight dtype {weight.dtype}"
            )
        self.orientation = orientation
        self.weight_shape = tuple(weight.shape)
        mask = mask.to(weight.device)
        # Built from the mask, not from the weight's nonzeros: a kept weight that happens to be 0
        # keeps its slot (to_sparse_csr would drop it and change the structure).
        rows, cols = torch.nonzero(mask, as_tuple=True)
        crow = torch.zeros(weight.shape[0] + 1, dtype=torch.int64, device=weight.device)
        crow[1:] = torch.bincount(rows, minlength=weight.shape[0]).cumsum(0)
        self.register_buffer("crow_indices", crow)
        self.register_buffer("col_indices", cols.to(torch.int64))
        self.values = nn.Parameter(weight.detach()[mask].clone())
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone())

    @property
    def in_features(self) -> int:
        return self.weight_shape[1] if self.orientation == "linear" else self.weight_shape[0]

    @property
    def out_features(self) -> int:
        return self.weight_shape[0] if self.orientation == "linear" else self.weight_shape[1]

    def weight_csr(self) -> Tensor:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
            return torch.sparse_csr_tensor(
                self.crow_indices,
                self.col_indices,
                self.values,
                size=self.weight_shape,
                check_invariants=False,
            )

    def dense_weight(self) -> Tensor:
        """The dense weight (zeros at pruned positions), detached."""
        dense = torch.zeros(self.weight_shape, dtype=self.values.dtype, device=self.values.device)
        rows = torch.repeat_interleave(
            torch.arange(self.weight_shape[0], device=dense.device), self.crow_indices.diff()
        )
        dense[rows, self.col_indices] = self.values.detach()
        return dense

    def forward(self, x: Tensor) -> Tensor:
        x2 = x.reshape(-1, self.in_features)
        weight = self.weight_csr()
        y = torch.sparse.mm(weight, x2.t()).t() if self.orientation == "linear" else torch.mm(x2, weight)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (
            f"{self.orientation}, in={self.in_features}, out={self.out_features}, "
            f"kept={self.values.numel()}, bias={self.bias is not None}"
        )


def _orientation(module: nn.Module) -> Literal["linear", "conv1d"] | None:
    if isinstance(module, nn.Linear):
        return "linear"
    hf = sys.modules.get("transformers.pytorch_utils")
    conv1d = getattr(hf, "Conv1D", None)
    if conv1d is not None and isinstance(module, conv1d):
        return "conv1d"
    return None


def to_sparse_compute(model: nn.Module, masks: Mapping[str, Tensor]) -> list[str]:
    """Replace every masked ``nn.Linear`` / ``Conv1D`` of ``model`` by a :class:`SparseLinear`, in place.

    Returns the names of the replaced modules. Masks on other parameters (embeddings, convolutions)
    are left alone (those layers stay dense; apply the masks to them). The replaced layers get new
    parameters (``values``, ``bias``): build the optimizer after the conversion. A weight shared
    with another module (tied) is refused: replacing one user would silently untie it.
    """
    check_masks(model, masks)
    owners: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        owners.setdefault(id(p), []).append(name)
    modules = dict(model.named_modules())
    replaced = []
    for name, mask in masks.items():
        module_name, _, attr = name.rpartition(".")
        module = modules.get(module_name)
        orientation = _orientation(module) if module is not None and attr == "weight" else None
        if orientation is None or module is None:
            continue
        weight = module.weight
        if len(owners[id(weight)]) > 1:
            raise ValueError(f"{name!r} is tied to {owners[id(weight)][1:]}: cannot replace one of its users")
        parent_name, _, child = module_name.rpartition(".")
        bias = module.bias if isinstance(module.bias, Tensor) else None
        setattr(modules[parent_name], child, SparseLinear(weight, mask, bias, orientation))
        replaced.append(module_name)
    log.info("sparse compute: %d layers replaced by CSR matmuls", len(replaced))
    return replaced
