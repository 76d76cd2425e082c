"""Pure-torch reference for the DGC momentum-correction / error-feedback update (Lin et al. 2018,
eqs. for momentum correction and momentum factor masking).

Op, in place on fp32 ``u`` (momentum) and ``v`` (accumulated velocity), gradient ``g``:
``u = m * u + g`` (rounded after the product, then after the sum), ``v = v + u``; then ``u[i] = 0``
and ``v[i] = 0`` for every sent index i. Indices are flat positions; duplicates are harmless. When
``num_sent`` is given only the first ``num_sent`` indices count (the rest is the padding of a
fixed-capacity buffer, e.g. from ``threshold_select``).

Shape legend: N elements, K sent indices.
"""

from __future__ import annotations

import torch


def ef_update(
    u_N: torch.Tensor,
    v_N: torch.Tensor,
    g_N: torch.Tensor,
    momentum: float,
    sent_K: torch.Tensor | None,
    num_sent: torch.Tensor | int | None,
) -> None:
    u_N.mul_(momentum).add_(g_N)
    v_N.add_(u_N)
    if sent_K is not None:
        ef_mask(u_N, v_N, sent_K, num_sent)


def ef_mask(
    u_N: torch.Tensor, v_N: torch.Tensor, sent_K: torch.Tensor, num_sent: torch.Tensor | int | None
) -> None:
    """Zero ``u`` and ``v`` at the (first ``num_sent``) sent indices."""
    sent_K = sent_K.to(torch.int64)
    if isinstance(num_sent, int):
        sent_K = sent_K[:num_sent]
    if num_sent is None or isinstance(num_sent, int):
        u_N.index_fill_(0, sent_K, 0.0)
        v_N.index_fill_(0, sent_K, 0.0)
        return
    # A device-side count: no slicing (that would need its value on the host). Mark the valid slots
    # with a scatter that tolerates duplicate indices, then fill.
    valid_K = torch.arange(sent_K.numel(), device=sent_K.device) < num_sent
    hits_N = torch.zeros(u_N.numel(), dtype=torch.int32, device=u_N.device)
    hits_N.index_put_((sent_K,), valid_K.to(torch.int32), accumulate=True)
    drop_N = hits_N > 0
    u_N.masked_fill_(drop_N, 0.0)
    v_N.masked_fill_(drop_N, 0.0)
