"""PowerSGD: rank-r gradient compression by one power iteration (Vogels, Karimireddy & Jaggi,
NeurIPS 2019, Algorithm 1; the authors' ``epfml/powersgd`` and PyTorch's ``powerSGD_hook``).

A gradient tensor is viewed as a matrix ``M`` of ``n = shape[0]`` rows and ``m = numel / n``
columns (a conv weight ``[out, in, k, k]`` as ``out x (in k k)``). With ``Q`` an ``m x r`` matrix
(the previous step's, warm start; random at the first step), across ``W`` workers::

    P = M_w Q;        P = sum_w P  (all-reduce);     P = orthogonalize(P)    # Gram-Schmidt
    Q = M_w^T P;      Q = sum_w Q / W (all-reduce)
    mean estimate = P Q^T;   residual_w = M_w - P Q^T    (error feedback, ``error_feedback=True``)

Two all-reduces of ``(n + m) r`` fp32 entries instead of ``n m``. A tensor is compressed only when
``(n + m) r * min_compression_rate < n m`` (PyTorch's rule); the others (biases, norms, small
layers) are averaged uncompressed in the first all-reduce, beside the P's. The distributed
algorithm, with its warm-started Q per parameter, is GradientSync's route for this compressor
(``needs.low_rank``: :mod:`common.comm.routes.low_rank`); this class holds the arithmetic and is, on its own,
the single-worker compressor (one power iteration from a Q drawn from the shared generator).

Biased, not linear (``P`` must be orthogonalized between the two rounds, so payloads cannot be
summed in one all-reduce). Randomness: the initial Q comes from the shared generator (the same on
every rank, as the hook's ``random_seed``); nothing is local. Bits on the wire per compressed
tensor: ``32 (n + m) r``; per uncompressed tensor ``32 numel``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .base import Compressor, CompressorRNG, Needs, Payload


def matrix_shape(shape: torch.Size | tuple[int, ...]) -> tuple[int, int]:
    """The matrix a tensor of ``shape`` is compressed as: ``shape[0]`` rows, the rest as columns
    (a 1-D tensor is one column; a scalar one entry)."""
    numel = math.prod(shape)
    rows = shape[0] if len(shape) else 1
    return rows, numel // max(rows, 1)


def square_shape(numel: int) -> tuple[int, int]:
    """A flat unit (a whole bucket) as a square matrix of side ceil(sqrt(numel)), zero-padded
    (PyTorch's ``batched_powerSGD_hook``)."""
    side = math.isqrt(max(numel - 1, 0)) + 1
    return side, side


def orthogonalize_(matrix: Tensor, epsilon: float = 0.0) -> Tensor:
    """Orthonormal columns of ``matrix`` [n, r], or of every matrix of a batch [b, n, r], in place:
    Gram-Schmidt for r <= 2, QR beyond (PyTorch's ``_orthogonalize``: the same Gram-Schmidt over the
    batch, so rank 1 and 2 agree with its hook to the last bit). The launches depend on r, not on b.
    A matrix's Gram-Schmidt does not depend on the batch it is in; its QR may, in the last bits
    (LAPACK on CPU: its place in the batch, :mod:`common.comm.routes.low_rank`). ``epsilon`` is added to
    each column's norm (a zero column stays zero instead of NaN)."""
    batch = matrix if matrix.dim() == 3 else matrix.unsqueeze(0)
    rank = batch.shape[2]
    if rank > 2:
        q, _ = torch.linalg.qr(batch)
        batch.copy_(q)
        return matrix
    for i in range(rank):
        col = batch[:, :, i : i + 1]
        col /= torch.linalg.vector_norm(col, dim=1, keepdim=True) + epsilon
        if i + 1 < rank:
            rest = batch[:, :, i + 1 :]
            rest -= torch.sum(col * rest, dim=1, keepdim=True) * col
    return matrix


class PowerSGD(Compressor):
    """Rank-``rank`` PowerSGD (module docstring). ``min_compression_rate``: compress a tensor only
    when it saves more than this factor; ``warm_start``: reuse each tensor's Q from the previous
    step (False: a fresh random Q every step); ``epsilon``: added to column norms when
    orthogonalizing (PyTorch's ``orthogonalization_epsilon``, default 0)."""

    name = "powersgd"
    linear = False
    unbiased = False
    fixed_size = True
    needs = Needs(low_rank=True)

    def __init__(
        self, rank: int = 1, min_compression_rate: float = 2.0, warm_start: bool = True, epsilon: float = 0.0
    ) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"powersgd rank must be an integer >= 1, got {rank!r}")
        if (
            isinstance(min_compression_rate, bool)
            or not isinstance(min_compression_rate, int | float)
            or not min_compression_rate >= 1
        ):
            raise ValueError(
                f"powersgd min_compression_rate must be a number >= 1, got {min_compression_rate!r}"
            )
        if not isinstance(warm_start, bool):
            raise ValueError(f"powersgd warm_start must be true or false, got {warm_start!r}")
        if isinstance(epsilon, bool) or not isinstance(epsilon, int | float) or not epsilon >= 0:
            raise ValueError(f"powersgd epsilon must be a number >= 0, got {epsilon!r}")
        self.rank = rank
        self.min_compression_rate = float(min_compression_rate)
        self.warm_start = warm_start
        self.epsilon = float(epsilon)

    def rank_for(self, rows: int, cols: int) -> int:
        """The approximation rank of an ``rows x cols`` matrix, or 0 when it is sent uncompressed."""
        rank = min(rows, cols, self.rank)
        return rank if (rows + cols) * rank * self.min_compression_rate < rows * cols else 0

    def random_q(self, cols: int, rank: int, rng: CompressorRNG) -> Tensor:
        """The draw :meth:`initial_q` orthogonalizes: ``cols x rank`` normals from the shared
        generator, on its device (GradientSync's route orthogonalizes a batch of them at once)."""
        return torch.randn(cols, rank, generator=rng.shared, device=rng.shared.device, dtype=torch.float32)

    def initial_q(self, cols: int, rank: int, rng: CompressorRNG, device: torch.device) -> Tensor:
        """A random ``cols x rank`` Q from the shared generator, orthogonalized (same on every rank)."""
        return orthogonalize_(self.random_q(cols, rank, rng).to(device), self.epsilon)

    def compress(self, x: Tensor, rng: CompressorRNG) -> Payload:
        rows, cols = matrix_shape(x.shape)
        rank = self.rank_for(rows, cols)
        if rank == 0:
            return Payload(wire={"values": x.reshape(-1).float()}, shape=x.shape, dtype=x.dtype)
        m = x.reshape(rows, cols).float()
        p = orthogonalize_(m @ self.initial_q(cols, rank, rng, x.device), self.epsilon)
        q = m.T @ p
        return Payload(
            wire={"p": p.reshape(-1), "q": q.reshape(-1)},
            shape=x.shape,
            dtype=x.dtype,
            local={"rows": rows, "cols": cols, "rank": rank},
        )

    def decompress(self, payload: Payload) -> Tensor:
        if "values" in payload.wire:
            return payload.wire["values"].to(payload.dtype).reshape(payload.shape)
        rows, cols, rank = (payload.local[k] for k in ("rows", "cols", "rank"))
        p = payload.wire["p"].reshape(rows, rank)
        q = payload.wire["q"].reshape(cols, rank)
        return (p @ q.T).to(payload.dtype).reshape(payload.shape)
