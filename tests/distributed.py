"""Run a function on N real gloo ranks (CPU processes) and collect what each rank returns."""

from __future__ import annotations

import atexit
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
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    tmp_path: Path,
    timeout: float = 120,
    fresh: bool = False,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` gloo ranks; return what each returns.

    ``fn`` must be importable (module level). The ranks are a pool kept for the session (one per
    world size: spawning and importing torch costs 3 s for 2 ranks, 13 s for 8 on 2 cores), each
    task run as in a fresh process: the caller's environment, torch's initial seed, one thread.
    After a failure or a timeout the pool is killed (a rank may be stuck in a collective) and the
    next call spawns a new one. ``fresh=True`` spawns ranks for this call only. No rank outlives
    the session.
    """
    out_dir = tmp_path / f"ranks-{free_port()}"
    out_dir.mkdir(parents=True)
    if fresh:
        return _run_fresh(fn, world_size, args, out_dir, timeout)
    pool = _POOLS.get(world_size)
    if pool is None or not pool.alive():
        pool = _POOLS[world_size] = _Pool(world_size)
    try:
        pool.run(fn, args, out_dir, timeout)
    except BaseException:
        pool.close()
        _POOLS.pop(world_size, None)
        raise
    return _collect(out_dir, world_size)


def _collect(out_dir: Path, world_size: int) -> list[Any]:
    results = []
    for rank in range(world_size):
        record = torch.load(out_dir / f"rank{rank}.pt", weights_only=False)
        if "error" in record:
            raise AssertionError(f"rank {rank} failed:\n{record['error']}")
        results.append(record["ok"])
    return results


def _serve(rank: int, world_size: int, port: int, tasks: Any, done: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    initial_seed = torch.initial_seed()
    while True:
        task = tasks.get()
        if task is None:
            break
        fn, args, out_dir, environ = task
        os.environ.clear()
        os.environ.update(
            {**environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        )
        torch.manual_seed(initial_seed)  # as a fresh process starts
        torch.set_num_threads(1)
        try:
            result = fn(rank, world_size, *args)
            torch.save({"ok": result}, Path(out_dir) / f"rank{rank}.pt")
            done.put((rank, True))
        except BaseException:
            torch.save({"error": traceback.format_exc()}, Path(out_dir) / f"rank{rank}.pt")
            done.put((rank, False))
    dist.destroy_process_group()


class _Pool:
    def __init__(self, world_size: int) -> None:
        context = mp.get_context("spawn")
        self.world_size = world_size
        self.tasks = [context.Queue() for _ in range(world_size)]
        self.done = context.Queue()
        port = free_port()
        self.processes = [
            context.Process(target=_serve, args=(r, world_size, port, self.tasks[r], self.done), daemon=True)
            for r in range(world_size)
        ]
        for process in self.processes:
            process.start()

    def alive(self) -> bool:
        return all(p.is_alive() for p in self.processes)

    def run(self, fn: Callable[..., Any], args: tuple, out_dir: Path, timeout: float) -> None:
        import queue
        import time

        environ = dict(os.environ)
        for tasks in self.tasks:
            tasks.put((fn, args, str(out_dir), environ))
        deadline = time.monotonic() + timeout
        finished: dict[int, bool] = {}
        while len(finished) < self.world_size:
            if not self.alive():
                raise RuntimeError(f"a rank of the {self.world_size}-rank pool died running {fn.__name__}")
            try:
                rank, ok = self.done.get(timeout=min(1.0, max(0.01, deadline - time.monotonic())))
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"{self.world_size} gloo ranks running {fn.__name__} did not finish in {timeout} s"
                    ) from None
                continue
            finished[rank] = ok
            if not ok:  # the others may wait in a collective for the failed rank: give them a moment
                deadline = min(deadline, time.monotonic() + 10)
        if not all(finished.values()):
            self.close()  # a failed collective may leave the process group unusable

    def close(self) -> None:
        for process in self.processes:
            if process.is_alive():
                process.kill()
            process.join()


_POOLS: dict[int, _Pool] = {}


def _close_pools() -> None:
    for pool in _POOLS.values():
        pool.close()
    _POOLS.clear()


atexit.register(_close_pools)


def _run_fresh(
    fn: Callable[..., Any], world_size: int, args: tuple, out_dir: Path, timeout: float
) -> list[Any]:
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
    return _collect(out_dir, world_size)
