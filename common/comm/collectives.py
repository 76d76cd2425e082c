"""Typed collectives that count what they send and do nothing at world size 1.

Every function takes an optional :class:`CommStats` (bits and calls are added to it) and an
optional process group. Tensors may live on any device the backend supports (gloo: CPU, NCCL: CUDA).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist
from torch import Tensor
from torch.futures import Future

from .stats import CommStats

ProcessGroup = dist.ProcessGroup | None

# torch 2.14 renamed all_gather_into_tensor (now deprecated) to all_gather_single.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def get_world_size(group: ProcessGroup = None) -> int:
    return dist.get_world_size(group) if is_distributed() else 1


def get_rank(group: ProcessGroup = None) -> int:
    return dist.get_rank(group) if is_distributed() else 0


def _bits(t: Tensor) -> int:
    return t.numel() * t.element_size() * 8


def all_reduce_sum_(tensor: Tensor, *, stats: CommStats | None = None, group: ProcessGroup = None) -> Tensor:
    """Sum ``tensor`` over ranks, in place. No-op (and nothing counted) at world size 1."""
    if get_world_size(group) == 1:
        return tensor
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    if stats is not None:
        stats.add_call("all_reduce", _bits(tensor))
    return tensor


def all_reduce_sum_async(
    tensor: Tensor, *, stats: CommStats | None = None, group: ProcessGroup = None
) -> Future[list[Tensor]]:
    """:func:`all_reduce_sum_` launched in the background: a future of ``[tensor]``, summed in
    place. At world size 1 a completed future (nothing sent, nothing counted)."""
    if get_world_size(group) == 1:
        done: Future[list[Tensor]] = Future()
        done.set_result([tensor])
        return done
    work = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group, async_op=True)
    assert work is not None
    if stats is not None:
        stats.add_call("all_reduce", _bits(tensor))
    return work.get_future()


def all_reduce_max_(tensor: Tensor, *, stats: CommStats | None = None, group: ProcessGroup = None) -> Tensor:
    """Elementwise max over ranks, in place (counted as an all-reduce). No-op at world size 1."""
    if get_world_size(group) == 1:
        return tensor
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
    if stats is not None:
        stats.add_call("all_reduce", _bits(tensor))
    return tensor


def broadcast_(
    tensor: Tensor, src: int = 0, *, stats: CommStats | None = None, group: ProcessGroup = None
) -> Tensor:
    """Broadcast ``tensor`` from rank ``src`` in place (bits counted on the sender only)."""
    if get_world_size(group) == 1:
        return tensor
    dist.broadcast(tensor, src=src, group=group)
    if stats is not None and get_rank(group) == src:
        stats.add_call("broadcast", _bits(tensor))
    return tensor


def all_gather_variable(
    tensors: Sequence[Tensor],
    *,
    sizes_known: bool = False,
    stats: CommStats | None = None,
    group: ProcessGroup = None,
) -> list[list[Tensor]]:
    """All-gather several 1-D tensors per rank whose sizes may differ between ranks.

    Returns ``out[r][i]``: rank r's i-th tensor. Dtypes must agree across ranks position by position.
    The tensors travel as one byte buffer, so a payload of values and indices is one collective.
    Unless ``sizes_known`` (every rank's sizes equal this rank's, e.g. top-k at a fixed density),
    the element counts are all-gathered first (int64 each, counted) and the buffers padded to the
    longest one; the padding crosses the wire and is counted too.
    """
    if get_world_size(group) == 1:
        return [[t.reshape(-1) for t in tensors]]
    gather = _VariableGather(tensors, sizes_known, stats, group)
    _all_gather_single(gather.recv, gather.send, group=group)
    return gather.unpack()


def all_gather_variable_async(
    tensors: Sequence[Tensor],
    *,
    sizes_known: bool = False,
    stats: CommStats | None = None,
    group: ProcessGroup = None,
) -> Future[list[list[Tensor]]]:
    """:func:`all_gather_variable` whose payload all-gather runs in the background: a future of
    ``out[r][i]`` (a DDP hook returns it chained with the decompression, so that the gather
    overlaps the rest of the backward pass). The element counts, when not ``sizes_known``, are
    gathered first and waited for (a few int64s: they size the receive buffer)."""
    if get_world_size(group) == 1:
        done: Future[list[list[Tensor]]] = Future()
        done.set_result([[t.reshape(-1) for t in tensors]])
        return done
    gather = _VariableGather(tensors, sizes_known, stats, group)
    work = _all_gather_single(gather.recv, gather.send, group=group, async_op=True)
    assert work is not None
    return work.get_future().then(lambda _: gather.unpack())


class _VariableGather:
    """One variable-size all-gather's buffers: every rank's element counts (gathered unless known),
    this rank's bytes padded to the longest rank's, the receive buffer, and how to cut it up."""

    def __init__(
        self, tensors: Sequence[Tensor], sizes_known: bool, stats: CommStats | None, group: ProcessGroup
    ) -> None:
        world = get_world_size(group)
        tensors = [t.reshape(-1) for t in tensors]
        device = tensors[0].device
        nbytes = [t.numel() * t.element_size() for t in tensors]
        self.nbytes_W: list[list[int]]
        if sizes_known:  # every rank's sizes are this rank's: known on the host, nothing to read back
            self.nbytes_W = [nbytes] * world
        else:
            counts = torch.tensor([t.numel() for t in tensors], dtype=torch.int64, device=device)
            counts_W = torch.empty(world * len(tensors), dtype=torch.int64, device=device)
            _all_gather_single(counts_W, counts, group=group)
            counts_W = counts_W.view(world, len(tensors))
            if stats is not None:
                stats.add_call("all_gather_counts", _bits(counts))
            itemsizes = torch.tensor([t.element_size() for t in tensors], dtype=torch.int64, device=device)
            # one host sync: needed to size the receive buffer
            self.nbytes_W = (counts_W * itemsizes).cpu().tolist()
        self.max_bytes = max_bytes = max(sum(row) for row in self.nbytes_W)
        views = [t.contiguous().view(torch.uint8) for t in tensors]
        if len(views) == 1 and views[0].numel() == max_bytes:
            self.send = views[0]  # nothing to concatenate or pad: send the bytes as they are
        else:
            self.send = torch.empty(max_bytes, dtype=torch.uint8, device=device)
            mine = torch.cat(views) if views else self.send[:0]
            self.send[: mine.numel()] = mine
            self.send[mine.numel() :].zero_()  # the padding crosses the wire: make it deterministic
        self.recv = torch.empty(world * max_bytes, dtype=torch.uint8, device=device)
        if stats is not None:
            stats.add_call("all_gather", _bits(self.send))
        self.world = world
        self.dtypes = [t.dtype for t in tensors]

    def unpack(self) -> list[list[Tensor]]:
        rows = self.recv.view(self.world, self.max_bytes)
        out: list[list[Tensor]] = []
        for r in range(self.world):
            sizes = self.nbytes_W[r]
            parts = rows[r].split([*sizes, self.max_bytes - sum(sizes)])
            # A byte slice can be viewed as a wider dtype only at an aligned offset; copy otherwise.
            out.append(
                [
                    (p if p.storage_offset() % dtype.itemsize == 0 else p.clone()).view(dtype)
                    for p, dtype in zip(parts, self.dtypes, strict=False)
                ]
            )
        return out


def exchange(
    sends: Mapping[int, Tensor],
    recvs: Mapping[int, Tensor],
    *,
    stats: CommStats | None = None,
    group: ProcessGroup = None,
) -> None:
    """Point-to-point: send ``sends[peer]`` to each peer and receive into ``recvs[peer]``.

    Receives are posted before sends: if every rank waited on its ``isend`` before any rank posted
    a ``recv``, gloo would hang silently (measured here, see research/environment.md).
    Peers are global ranks.
    """
    if get_world_size(group) == 1:
        if sends or recvs:
            raise ValueError("point-to-point exchange at world size 1 has no peers to talk to")
        return
    requests = [dist.irecv(buf, src=peer, group=group) for peer, buf in sorted(recvs.items())]
    for peer, tensor in sorted(sends.items()):
        requests.append(dist.isend(tensor.contiguous(), dst=peer, group=group))
        if stats is not None:
            stats.add_call("send", _bits(tensor))
    for request in requests:
        assert request is not None  # None only for ranks outside ``group``
        request.wait()
