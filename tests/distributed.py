"""Run a function on N real gloo ranks (CPU processes) and collect what each rank returns."""

from __future__ import annotations

import os
import socket
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, fn: Callable[..., Any], world_size: int, port: int, out_dir: str, args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        result = fn(rank, world_size, *args)
        torch.save({"ok": result}, Path(out_dir) / f"rank{rank}.pt")
    except BaseException:
        torch.save({"error": traceback.format_exc()}, Path(out_dir) / f"rank{rank}.pt")
        raise
    finally:
        dist.destroy_process_group()


def run_ranks(
    fn: Callable[..., Any], world_size: int, *args: Any, tmp_path: Path, timeout: float = 120
) -> list[Any]:
    """Spawn ``world_size`` gloo ranks running ``fn(rank, world_size, *args)``; return their results.

    ``fn`` must be importable (module level). Every process is joined or killed before returning,
    also on failure or timeout, so no rank outlives the test.
    """
    out_dir = tmp_path / f"ranks-{free_port()}"
    out_dir.mkdir(parents=True)
    ctx = mp.start_processes(
        _worker,
        args=(fn, world_size, free_port(), str(out_dir), args),
        nprocs=world_size,
        join=False,
        start_method="spawn",
    )
    try:
        import time

        deadline = time.monotonic() + timeout
        while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{world_size} gloo ranks running {fn.__name__} did not finish in {timeout} s"
                )
    finally:
        for process in ctx.processes:
            if process.is_alive():
                process.kill()
                process.join()
    results = []
    for rank in range(world_size):
        record = torch.load(out_dir / f"rank{rank}.pt", weights_only=False)
        if "error" in record:
            raise AssertionError(f"rank {rank} failed:\n{record['error']}")
        results.append(record["ok"])
    return results
