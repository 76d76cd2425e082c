"""Every sync strategy a run can name (``strategy:``), by the name it declares.

A new strategy is one class with ``name``, ``needs``, ``ignores``, ``check_options`` and
``from_config`` (:class:`~common.strategies.base.SyncStrategy`) and one entry here: the run's
validation and the loop read only its declarations.
"""

from __future__ import annotations

from .gossip import GossipStrategy
from .strategies import (
    CompactDataParallel,
    DataParallel,
    DetachedEFDataParallel,
    DGCDataParallel,
    PipelineDataParallel,
    SparseDataParallel,
    SyncStrategy,
    TorchHookDataParallel,
)

STRATEGIES: dict[str, type[SyncStrategy]] = {
    cls.name: cls
    for cls in (
        DataParallel,
        DGCDataParallel,
        DetachedEFDataParallel,
        SparseDataParallel,
        GossipStrategy,
        CompactDataParallel,
        TorchHookDataParallel,
        PipelineDataParallel,
    )
}


def strategy_class(name: str) -> type[SyncStrategy]:
    """The strategy class ``name`` (a ValueError lists the valid names)."""
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; valid: {', '.join(STRATEGIES)}") from None
