"""Process-group set-up from torchrun's environment, backend choice and seeding.

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; without them (a plain
``python`` run) the context is a single process and every collective is a no-op.
Backend: NCCL when CUDA is available, gloo otherwise (``THINWIRE_BACKEND`` overrides).

A launched worker (one with torchrun's ``LOCAL_RANK``) dies with the process that started it
(:func:`die_with_parent`): torchrun puts workers in sessions of their own, so without it a SIGKILLed
launcher leaves them training and writing on. Every collective gives up after ``timeout_s``
(a dead or hung peer costs that long, not gloo's 30 minutes; :func:`is_collective_timeout`).
"""

from __future__ import annotations

import datetime
import logging
import os
import random
import signal
import sys
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

BACKENDS = ("gloo", "nccl")
# Set by pipelines.launch (and harness.netem.run_workers) to the pid the workers' parent has.
LAUNCHER_PID_ENV = "THINWIRE_LAUNCHER_PID"
_PR_SET_PDEATHSIG = 1


# torchrun (2.5+) shares its rendezvous TCPStore with the workers' init_process_group; after a
# restart the workers then read the previous attempt's gloo addresses and fail to connect
# ("Gloo connectFullMesh failed ... Connection refused"; pytorch/pytorch issue 135712). Every
# launcher that lets torchrun restart ranks sets this (pipelines.launch, harness.netem.run_hosts).
RESTART_SAFE_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def kill_with_parent() -> int:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux ``PR_SET_PDEATHSIG``;
    kept across ``exec``). Returns 0, or the errno of a failed ``prctl``."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    return 0 if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0 else ctypes.get_errno()


def die_with_parent() -> None:
    """Have the kernel SIGKILL this launched worker when its parent (the launcher) dies (Linux).

    If the launcher is already gone (killed while this process imported), exit at once.
    """
    if "LOCAL_RANK" not in os.environ or not sys.platform.startswith("linux"):
        return
    errno = kill_with_parent()
    if errno:
        log.warning("prctl(PR_SET_PDEATHSIG) failed (errno %d): this worker may outlive its launcher", errno)
        return
    expected = os.environ.get(LAUNCHER_PID_ENV)
    parent = os.getppid()
    if parent == 1 or (expected is not None and expected.isdigit() and int(expected) != parent):
        log.error("the launcher (pid %s) is gone: this worker exits instead of training on alone", expected)
        os._exit(1)


def is_collective_timeout(error: BaseException) -> bool:
    """True for the error a collective raises when a peer did not answer within the timeout."""
    return isinstance(error, RuntimeError) and "Timed out waiting" in str(error)


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


def init_from_env(backend: str | None = None, *, timeout_s: float | None = None) -> DistContext:
    """Join the process group described by torchrun's environment variables (if any).

    ``timeout_s``: how long any collective may wait for a peer (None: torch's default, 30 min).
    """
    die_with_parent()
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
        timeout = None if timeout_s is None else datetime.timedelta(seconds=timeout_s)
        dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout)
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
