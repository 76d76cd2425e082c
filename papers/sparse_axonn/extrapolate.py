"""A model of the paper's setting (2.7B GPT on 512 V100s): memory, grid, communication, step time.

Everything here is arithmetic on stated assumptions (:class:`PaperSetting`, from params.yaml's
``extrapolation``), the link parameters of our cost-model calibration (``results/costmodel/fit.json``:
link efficiency and gamma; alpha assumed for a cluster network) and the densities our prune stage
measured. It is a model, labelled as such wherever it is printed, not a measurement.

- Parameters: GPT-2 architecture, ``12 d^2 + 13 d`` per block (weights ``12 d^2``: prunable),
  embeddings ``(vocab + n_ctx) d`` (prunable), final LayerNorm ``2 d``; tied output matrix.
- Memory per GPU (mixed precision as AxoNN; :mod:`papers.sparse_axonn.memory`): dense ``20 B`` per
  parameter, sparse ``4 B`` per parameter plus ``16 B`` per kept entry, over ``G_inter`` stages.
- Grid: the fewest power-of-two ``G_inter`` whose per-GPU model state fits ``state_fraction`` of
  the GPU memory (the rest for activations and buffers), ``G_data = num_gpus / G_inter``.
- All-reduce: each GPU all-reduces its stage's fp16 gradients (dense: ``2 N / G_inter`` bytes;
  sparse: ``2 K / G_inter``) over ``G_data`` ranks (ring, ``harness.costmodel``).
- Point to point: a middle stage sends, per sequence of its replica's share of the batch, the
  fp16 activations forward and their gradients backward: ``2 x 2 seq d`` bytes, one message each.
- Compute: ``6 N`` FLOPs per token (dense compute for dense and sparse AxoNN alike) at
  ``flops_per_gpu x efficiency``, divided over the ``num_gpus``, times the GPipe bubble
  ``(M + G_inter - 1) / M`` with ``M`` micro-batches per replica. No overlap of communication.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from harness import costmodel

from .memory import MIXED_DENSE_BYTES, MIXED_SPARSE_DENSE_BYTES, MIXED_SPARSE_KEPT_BYTES


@dataclass(frozen=True)
class PaperSetting:
    """Assumptions for the paper's setting; every field is an assumption unless the paper states it."""

    n_layer: int = 32  # 2.7B GPT (the abstract's size; GPT-Neo 2.7B / GPT-3 2.7B shape assumed)
    d_model: int = 2560
    vocab: int = 50257
    n_ctx: int = 2048
    num_gpus: int = 512  # the abstract's 512 V100s (Summit)
    gpu_memory_gb: float = 16.0  # Summit's V100s have 16 GB
    state_fraction: float = 0.5  # of GPU memory for model state; the rest activations and buffers
    link_gbit: float = 200.0  # per-GPU network bandwidth for all-reduce and p2p (assumed)
    alpha_us: float = 10.0  # per-message latency of a cluster network (assumed; ours is gloo on 2 cores)
    flops_per_gpu: float = 125e12  # V100 fp16 tensor-core peak
    flops_efficiency: float = 0.3  # achieved fraction of peak (assumed)
    global_batch: int = 512  # sequences per step (assumed)
    microbatch: int = 1  # sequences per micro-batch (assumed)

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"extrapolation.{name} must be a number > 0, got {value!r}")

    @classmethod
    def from_dict(cls, values: Mapping[str, Any] | None) -> PaperSetting:
        values = dict(values or {})
        allowed = set(asdict(cls()))
        unknown = sorted(set(values) - allowed)
        if unknown:
            raise ValueError(
                f"extrapolation: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}"
            )
        return cls(**values)


def gpt2_counts(s: PaperSetting) -> tuple[int, int]:
    """(prunable, other) parameter counts of a tied GPT-2 of this shape."""
    d = s.d_model
    prunable = s.n_layer * 12 * d * d + (s.vocab + s.n_ctx) * d
    other = s.n_layer * 13 * d + 2 * d
    return prunable, other


def grid_for(state_bytes: float, s: PaperSetting) -> int:
    """The fewest power-of-two pipeline stages whose per-GPU share fits the state budget."""
    budget = s.gpu_memory_gb * 1e9 * s.state_fraction
    stages = 1
    while state_bytes / stages > budget and stages < s.num_gpus:
        stages *= 2
    return stages


def model_setting(s: PaperSetting, sparsity: float, link: costmodel.LinkParams) -> dict[str, Any]:
    """Dense and sparse AxoNN at ``sparsity`` (of the prunable weights) in setting ``s``: a model."""
    prunable, other = gpt2_counts(s)
    n = prunable + other
    k = round((1 - sparsity) * prunable) + other
    params = costmodel.LinkParams(alpha=s.alpha_us * 1e-6, efficiency=link.efficiency, gamma=link.gamma)
    rate = s.link_gbit * 1e9
    out: dict[str, Any] = {"num_params": n, "num_kept": k, "density": k / n, "sparsity": sparsity}
    compute_total = 6 * n * s.global_batch * s.n_ctx / (s.flops_per_gpu * s.flops_efficiency * s.num_gpus)
    for variant, state, entries in (
        ("dense", MIXED_DENSE_BYTES * n, n),
        ("sparse", MIXED_SPARSE_DENSE_BYTES * n + MIXED_SPARSE_KEPT_BYTES * k, k),
    ):
        g_inter = grid_for(state, s)
        g_data = s.num_gpus // g_inter
        sequences = s.global_batch / g_data  # per replica
        num_micro = max(1, math.ceil(sequences / s.microbatch))
        allreduce = costmodel.collective_time("all_reduce", g_data, 2 * entries / g_inter, rate, params)
        message = 2 * s.microbatch * s.n_ctx * s.d_model  # fp16 activations of one micro-batch
        sends = 0 if g_inter == 1 else 2 * num_micro  # forward and backward, a middle stage
        p2p = (
            costmodel.collective_time("send", 2, sends * message, rate, params, calls=sends) if sends else 0.0
        )
        bubble = (num_micro + g_inter - 1) / num_micro
        compute = compute_total * bubble
        out[variant] = {
            "state_bytes": state,
            "state_bytes_per_gpu": state / g_inter,
            "g_inter": g_inter,
            "g_data": g_data,
            "allreduce_bytes_per_gpu": 2 * entries / g_inter,
            "allreduce_seconds": allreduce,
            "p2p_bytes_per_gpu": sends * message,
            "p2p_seconds": p2p,
            "compute_seconds": compute,
            "bubble": bubble,
            "step_seconds": compute + allreduce + p2p,
        }
    dense, sparse = out["dense"], out["sparse"]
    out["memory_reduction"] = 1 - sparse["state_bytes"] / dense["state_bytes"]
    comm_dense = dense["allreduce_seconds"] + dense["p2p_seconds"]
    comm_sparse = sparse["allreduce_seconds"] + sparse["p2p_seconds"]
    out["comm_reduction"] = 1 - comm_sparse / comm_dense if comm_dense else 0.0
    out["speedup"] = dense["step_seconds"] / sparse["step_seconds"] - 1
    out["setting"] = asdict(s)
    out["link"] = asdict(params)
    return out
