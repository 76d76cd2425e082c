"""Collectives, accounting, GradientSync and the DDP comm-hook adapter."""

from .collectives import (
    all_gather_variable,
    all_reduce_sum_,
    broadcast_,
    exchange,
    get_rank,
    get_world_size,
    is_distributed,
)
from .ddp_hook import compressed_allreduce_hook, install_ddp_hook
from .stats import PHASES, CommStats
from .sync import TRANSPORTS, GradientSync

__all__ = [
    "PHASES",
    "TRANSPORTS",
    "CommStats",
    "GradientSync",
    "all_gather_variable",
    "all_reduce_sum_",
    "broadcast_",
    "compressed_allreduce_hook",
    "exchange",
    "get_rank",
    "get_world_size",
    "install_ddp_hook",
    "is_distributed",
]
