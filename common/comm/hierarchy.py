"""Hierarchical synchronisation: dense inside a host, the compressor between hosts.

On a cluster the links inside a host (NVLink, PCIe, shared memory) are 10-100x faster than the
network between hosts, so the compressor is only worth its cost on the second. With
``GradientSync(..., hierarchy=HostHierarchy.build(G))`` a bucket's mean is taken in three steps::

    1. dense sum onto the host's leader (its local rank 0)       reduce,    intra-host links
    2. the leaders' mean through the compressor                  GradientSync over the leaders
    3. the leader's result to the host's other ranks             broadcast, intra-host links

Only the leaders compress, keep error-feedback residuals and put compressed bits on the network;
the host's other ranks send their gradient once, densely, to the leader and receive the mean.
Ranks are grouped as torchrun numbers them on ``--nnodes H --nproc_per_node G``: host h holds
global ranks h G .. h G + G - 1 (``LOCAL_WORLD_SIZE`` = G). With the identity compressor the result is
the flat all-reduce's mean up to the order of the fp32 additions (exactly equal on integer values:
``tests/common/comm/test_hierarchy.py``).

Bits per link class: the GradientSync's ``stats`` count what the leaders send between hosts;
``HostHierarchy.stats`` what every rank sends inside its host (``host_reduce`` on the non-leaders,
``host_broadcast`` on the leader).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import cast

import torch.distributed as dist
from torch import Tensor

from .collectives import ProcessGroup, get_world_size
from .stats import CommStats


@dataclass
class HostHierarchy:
    """This rank's place in H hosts x G ranks, and the process groups of both link classes."""

    hosts: int
    ranks_per_host: int
    host: int
    local_rank: int
    intra: ProcessGroup  # this host's G ranks
    inter: ProcessGroup  # the H leaders (local rank 0 of every host); None on the other ranks
    stats: CommStats = field(default_factory=CommStats)

    @property
    def leader(self) -> int:
        """The global rank of this host's leader."""
        return self.host * self.ranks_per_host

    @property
    def is_leader(self) -> bool:
        return self.local_rank == 0

    @classmethod
    def build(cls, ranks_per_host: int | None = None) -> HostHierarchy:
        """Create the groups (a collective call: every rank, in the same order). ``ranks_per_host``
        defaults to torchrun's ``LOCAL_WORLD_SIZE``."""
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("a host hierarchy needs torch.distributed initialised (torchrun)")
        if ranks_per_host is None:
            if "LOCAL_WORLD_SIZE" not in os.environ:
                raise ValueError(
                    "ranks_per_host not given and LOCAL_WORLD_SIZE not set: launch with torchrun "
                    "(--nproc_per_node G) or pass the ranks per host"
                )
            ranks_per_host = int(os.environ["LOCAL_WORLD_SIZE"])
        world, rank = dist.get_world_size(), dist.get_rank()
        if isinstance(ranks_per_host, bool) or not isinstance(ranks_per_host, int) or ranks_per_host < 1:
            raise ValueError(f"ranks_per_host must be an int >= 1, got {ranks_per_host!r}")
        if world % ranks_per_host:
            raise ValueError(
                f"world size {world} is not a whole number of hosts of {ranks_per_host} ranks: a host "
                "hierarchy needs every host to run the same number of ranks"
            )
        hosts = world // ranks_per_host
        intra: ProcessGroup = None
        for h in range(hosts):  # every rank creates every group, in the same order
            group = dist.new_group(list(range(h * ranks_per_host, (h + 1) * ranks_per_host)))
            if h == rank // ranks_per_host:
                intra = cast(ProcessGroup, group)
        leaders = dist.new_group([h * ranks_per_host for h in range(hosts)])
        inter = cast(ProcessGroup, leaders) if rank % ranks_per_host == 0 else None
        return cls(hosts, ranks_per_host, rank // ranks_per_host, rank % ranks_per_host, intra, inter)

    def reduce_to_leader(self, flat: Tensor) -> None:
        """Dense sum of the host's ``flat`` onto the leader, in place there."""
        if get_world_size(self.intra) == 1:
            return
        dist.reduce(flat, dst=self.leader, op=dist.ReduceOp.SUM, group=self.intra)
        if not self.is_leader:
            self.stats.add_call("host_reduce", flat.numel() * flat.element_size() * 8)

    def broadcast_from_leader(self, flat: Tensor) -> None:
        """The leader's ``flat`` to every rank of the host, in place."""
        if get_world_size(self.intra) == 1:
            return
        dist.broadcast(flat, src=self.leader, group=self.intra)
        if self.is_leader:
            self.stats.add_call("host_broadcast", flat.numel() * flat.element_size() * 8)
