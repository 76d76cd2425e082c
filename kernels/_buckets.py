"""Per-bucket and per-worker helpers shared by the ternarize and QSGD references and dispatchers.

A tensor of N elements read flat is cut into B = ceil(N / D) consecutive buckets of D elements (the
last one may be short). Per-tensor scaling is the special case B = 1, D = N.

Shape legend: N elements, D bucket size, B buckets, W workers.
"""

from __future__ import annotations

from typing import Literal

import torch

Norm = Literal["l2", "max"]
NORMS: tuple[str, ...] = ("l2", "max")


def num_buckets(numel: int, bucket_size: int) -> int:
    return max(1, -(-numel // bucket_size))


def check_bucket_size(bucket_size: int) -> None:
    if isinstance(bucket_size, bool) or not isinstance(bucket_size, int) or bucket_size < 1:
        raise ValueError(f"bucket_size must be a positive int, got {bucket_size!r}")


def mul_by_bucket(
    x: torch.Tensor, values: torch.Tensor, bucket_size: int, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``x[..., i] * values[..., i // bucket_size]`` for float ``x [..., N]`` and ``values [..., B]``.

    ``out=x`` works in place. The full buckets are multiplied as a ``[..., B, D]`` view broadcast
    against ``values[..., :, None]`` and the short last bucket on its own, so the per-element values
    are never materialised; each product is one IEEE multiplication, as in the kernels.
    """
    out = torch.empty_like(x, dtype=torch.result_type(x, values)) if out is None else out
    if values.shape[-1] == 1:
        return torch.mul(x, values, out=out)
    numel = x.shape[-1]
    num_full = numel // bucket_size
    head = num_full * bucket_size
    torch.mul(
        x[..., :head].unflatten(-1, (num_full, bucket_size)),
        values[..., :num_full, None],
        out=out[..., :head].unflatten(-1, (num_full, bucket_size)),
    )
    if head < numel:
        torch.mul(x[..., head:], values[..., num_full:], out=out[..., head:])
    return out


def bucket_norms(x_N: torch.Tensor, bucket_size: int, norm: str) -> torch.Tensor:
    """fp32 l2 or max norm of each bucket of the flat tensor ``x_N``: ``[B]``.

    Both backends of QSGD use this one function, so their norms (and hence their codes) agree bit
    for bit; the short last bucket is reduced on its own rather than zero-padded (no copy of x).
    """
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {list(NORMS)}, got {norm!r}")
    x_N = x_N.reshape(-1).to(torch.float32)
    numel = x_N.numel()
    num_full = numel // bucket_size
    parts = [x_N[: num_full * bucket_size].view(num_full, bucket_size)]
    if numel > num_full * bucket_size or numel == 0:
        parts.append(x_N[num_full * bucket_size :].view(1, -1))
    if norm == "l2":
        norms = [torch.linalg.vector_norm(p, dim=1) for p in parts]
    else:
        norms = [p.abs().amax(dim=1) if p.shape[1] else p.new_zeros(1) for p in parts]
    return torch.cat(norms) if len(norms) > 1 else norms[0]


def sum_in_worker_order(values_W_N: torch.Tensor) -> torch.Tensor:
    """fp32 ``((0 + v_0) + v_1) + ... + v_{W-1}``: the decode kernels' accumulation order.

    Written out instead of ``sum(0)``, whose order is the backend's choice (a GPU tree reduction
    rounds differently). ``v_0 + 0.0`` is the kernels' zero-initialised first step in one op (it
    turns -0.0 into +0.0, exactly as ``0.0 + v_0`` does). The callers hand over a tensor of their
    own (decoded for this sum), so the sum is made in place in its first row and that row is
    returned: no fresh N-entry tensor (on a CPU the fresh tensor's page faults cost as much as
    the addition).
    """
    if values_W_N.shape[0] == 0:
        return values_W_N.new_zeros(values_W_N.shape[1])
    out_N = values_W_N[0].add_(0.0)
    for w in range(1, values_W_N.shape[0]):  # a loop over workers, vectorised over elements
        out_N += values_W_N[w]
    return out_N
