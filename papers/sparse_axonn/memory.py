"""Model-state bytes per pipeline stage for every grid, and which grids fit a per-rank capacity.

The configuration effect of the paper (research/papers.md 1.3(c)): the memory the compact state
saves lets the same model fit in fewer pipeline stages, so a fixed number of ranks is spent on more
data-parallel replicas and fewer point-to-point boundaries. Here, for each number of stages S, each
stage of :func:`~papers.sparse_axonn.pipeline_stages.split_blocks` is built from the model and its
bytes are counted from its tensors (:func:`~papers.sparse_axonn.compact.model_state_bytes`), in two
accountings:

- ``fp32`` (what our runs hold): dense AdamW ``16 N``; sparse AxoNN with dense gradients
  ``8 N + 16 K``; with packed gradients ``4 N + 16 K`` (N, K: the stage's trainable and kept entries);
- ``mixed`` (AxoNN's mixed precision, arithmetic on the counted N and K, not measured): dense
  ``20 N`` (fp16 weights and gradients, fp32 gradients, master weights, m and v); sparse
  ``4 N + 16 K`` (fp16 weights and gradients dense; fp32 master, m, v and gradient compact).

The capacity of a rank is the dense model's largest stage at ``capacity_stages`` (2: dense needs
two stages); a variant fits S stages when its largest stage is within it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from .compact import MaskLayout, model_state_bytes, stage_masks
from .pipeline_stages import GPT2Stage

MIXED_DENSE_BYTES = 20  # per parameter: fp16 w + fp16 g + fp32 g + fp32 master + m + v (AxoNN)
MIXED_SPARSE_DENSE_BYTES = 4  # per parameter: fp16 w + fp16 g
MIXED_SPARSE_KEPT_BYTES = 16  # per kept entry: fp32 master + m + v + compact fp32 gradient


def stage_counts(model: nn.Module, num_stages: int, masks: Mapping[str, Tensor]) -> list[dict[str, Any]]:
    """Per stage: N, K and the fp32 bytes of the dense, sparse and packed variants."""
    rows = []
    for s in range(num_stages):
        stage = GPT2Stage(model, s, num_stages)
        mine = stage_masks(stage, masks)
        dense = model_state_bytes(stage, optimizer_kind="dense")
        sparse = model_state_bytes(stage, mine, optimizer_kind="compact")
        layout = MaskLayout(stage, mine)
        rows.append(
            {
                "stage": s,
                "blocks": list(stage.block_range),
                "num_params": layout.numel,
                "num_kept": layout.num_kept,
                "fp32": {
                    "dense": dense["total"],
                    "sparse": sparse["total"],
                    "packed": sparse["total"] - sparse["grads"],
                },
                "mixed": {
                    "dense": MIXED_DENSE_BYTES * layout.numel,
                    "sparse": MIXED_SPARSE_DENSE_BYTES * layout.numel
                    + MIXED_SPARSE_KEPT_BYTES * layout.num_kept,
                },
            }
        )
    return rows


def configurations(
    model: nn.Module,
    masks_by_sparsity: Mapping[float, Mapping[str, Tensor]],
    num_stages: list[int],
    capacity_stages: int = 2,
) -> dict[str, Any]:
    """Largest-stage bytes for every variant, sparsity and S; the capacity; the fewest S that fit."""
    if capacity_stages not in num_stages:
        raise ValueError(f"capacity_stages {capacity_stages} must be one of the grids {num_stages}")
    per_sparsity = {
        f"{s:g}": {str(n): stage_counts(model, n, masks) for n in num_stages}
        for s, masks in masks_by_sparsity.items()
    }
    out: dict[str, Any] = {
        "num_stages": num_stages,
        "capacity_stages": capacity_stages,
        "stages": per_sparsity,
    }
    for accounting, variants in (("fp32", ("dense", "sparse", "packed")), ("mixed", ("dense", "sparse"))):
        any_sparsity = next(iter(per_sparsity.values()))
        capacity = max(r[accounting]["dense"] for r in any_sparsity[str(capacity_stages)])
        table = []
        for sparsity, grids in [("0", any_sparsity), *per_sparsity.items()]:
            for variant in variants:
                if (sparsity == "0") != (variant == "dense"):
                    continue
                largest = {n: max(r[accounting][variant] for r in grids[str(n)]) for n in num_stages}
                fitting = [n for n in num_stages if largest[n] <= capacity]
                table.append(
                    {
                        "variant": variant,
                        "sparsity": float(sparsity),
                        "largest_stage_bytes": {str(n): b for n, b in largest.items()},
                        "fewest_stages": min(fitting) if fitting else None,
                    }
                )
        out[accounting] = {"capacity_bytes": capacity, "rows": table}
    return out
