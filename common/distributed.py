"""Process-group set-up from torchrun's environment, backend choice and seeding.

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; without them (a plain
``python`` run) the context is a single process and every collective is a no-op.
Backend: NCCL when CUDA is available, gloo otherwise (``THINWIRE_BACKEND`` overrides).
"""

from __future__ import annotations

import logging
import os
import random
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

BACKENDS = ("gloo", "nccl")


@dataclass(frozen=True)
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_from_env(backend: str | None = None) -> DistContext:
    """Join the process group described by torchrun's environment variables (if any)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    backend = (
        backend or os.environ.get("THINWIRE_BACKEND") or ("nccl" if torch.cuda.is_available() else "gloo")
    )
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; valid backends: {', '.join(BACKENDS)}")
    if backend == "nccl" and not torch.cuda.is_available():
        raise ValueError("backend 'nccl' needs CUDA, and none is available here; use 'gloo'")
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend, rank=rank, world_size=world_size)
        log.info("rank %d/%d joined the %s process group", rank, world_size, backend)
    return DistContext(
        rank=rank, world_size=world_size, local_rank=local_rank, backend=backend, device=device
    )


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def seed_everything(seed: int) -> None:
    """Seed torch (CPU and CUDA), numpy and random: used once, before the model is built."""
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)
