"""The host-hierarchy route: another route run between the hosts' leaders (:mod:`common.comm.hierarchy`).

A bucket's mean is a dense sum onto the host's leader, the leaders' mean through the inner route
(divided by the ranks per host: the mean over every rank), and the leader's result broadcast to
its host. Its future is done at once (three rounds, the inner route waited for).
"""

from __future__ import annotations

from torch import Tensor
from torch.futures import Future

from ..hierarchy import HostHierarchy
from .base import Route, RouteHost, done


class HierarchyRoute:
    """``inner`` (any route of ``host``, over the leaders' group) wrapped in the intra-host reduce
    and broadcast, timed in ``host.stats``."""

    def __init__(self, inner: Route, host: RouteHost, hierarchy: HostHierarchy) -> None:
        self.inner = inner
        self.host = host
        self.hierarchy = hierarchy

    def reduce(self, names: list[str], flat: Tensor, sizes: list[int]) -> Tensor:
        """Dense sum onto the host's leader, the leaders' mean through the compressor (divided by
        the ranks per host: the mean over every rank), the leader's result to its host."""
        hierarchy = self.hierarchy
        with self.host.stats.phase("communicate", flat.device):
            hierarchy.reduce_to_leader(flat)
        if hierarchy.is_leader:
            mean = self.inner.reduce(names, flat, sizes)
            if mean.data_ptr() != flat.data_ptr():
                flat.copy_(mean)
            flat.div_(hierarchy.ranks_per_host)
        with self.host.stats.phase("communicate", flat.device):
            hierarchy.broadcast_from_leader(flat)
        return flat

    def reduce_async(self, names: list[str], flat: Tensor, sizes: list[int]) -> Future[Tensor]:
        return done(self.reduce(names, flat, sizes))
