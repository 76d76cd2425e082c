"""Why thinwire's all_gather_variable is slower than torch's all-gather, and what a leaner one gains.

Run from the repository root::

    PYTHONPATH=. .venv/bin/torchrun --standalone --nproc_per_node 2 benchmarks/comm/profile_all_gather.py
    PYTHONPATH=. .venv/bin/torchrun --standalone --nproc_per_node 4 benchmarks/comm/profile_all_gather.py --append

Companion of ``bench_collectives.py``, which shows ``all_gather/thinwire`` at about twice the time
of ``all_gather/torch``. ``common.comm.all_gather_variable`` (a) all-gathers the element counts
first unless ``sizes_known``, then (b) zero-fills a padded byte buffer, concatenates the inputs
and copies them into it: three passes over the payload before the collective. Timed here, taking
turns call by call, on one fp32 input of ``bytes / W`` per rank (``bytes`` = gathered size, as in
``bench_collectives.py``):

- ``torch``: ``all_gather_single`` into a preallocated output;
- ``thinwire`` / ``thinwire_known``: ``all_gather_variable([x])`` with ``sizes_known`` False / True;
- ``lean`` / ``lean_known``: :func:`lean_all_gather`, a local sketch of the suggested change (send
  the input's bytes as they are when no padding is needed; pad only the tail otherwise).

Rank 0 writes a table to ``benchmarks/results/comm_all_gather_profile.md`` (``--append`` adds to it).
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.distributed as dist
from _bench_util import (
    RESULTS_DIR,
    git_sha,
    init_gloo,
    load_average,
    log0,
    max_over_ranks,
    now_iso,
    quartiles,
)
from torch import Tensor

from common.comm import all_gather_variable

_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def lean_all_gather(tensors: Sequence[Tensor], *, sizes_known: bool = False) -> list[list[Tensor]]:
    """``all_gather_variable`` without the zero-fill/concatenate/copy when no padding is needed.

    Same wire format (each rank's tensors as one byte buffer padded to the longest rank's), same
    result; a single contiguous input whose byte count equals the maximum is sent as it is, and
    otherwise only the padding tail is zeroed.
    """
    world = dist.get_world_size()
    tensors = [t.reshape(-1) for t in tensors]
    counts = torch.tensor([t.numel() for t in tensors], dtype=torch.int64)
    if sizes_known:
        counts_W = counts.unsqueeze(0).expand(world, -1)
    else:
        counts_W = torch.empty(world * len(tensors), dtype=torch.int64)
        _all_gather_single(counts_W, counts)
        counts_W = counts_W.view(world, len(tensors))
    itemsizes = torch.tensor([t.element_size() for t in tensors], dtype=torch.int64)
    nbytes_W = counts_W * itemsizes
    max_bytes = int(nbytes_W.sum(1).max())
    if len(tensors) == 1:
        mine = tensors[0].contiguous().view(torch.uint8)
    else:
        mine = torch.cat([t.contiguous().view(torch.uint8) for t in tensors])
    if mine.numel() == max_bytes:
        send = mine
    else:
        send = torch.empty(max_bytes, dtype=torch.uint8)
        send[: mine.numel()] = mine
        send[mine.numel() :].zero_()
    recv = torch.empty(world * max_bytes, dtype=torch.uint8).view(world, max_bytes)
    _all_gather_single(recv.view(-1), send)
    out = []
    for r in range(world):
        parts = recv[r].split([*nbytes_W[r].tolist(), max_bytes - int(nbytes_W[r].sum())])
        out.append(
            [
                (p if p.storage_offset() % t.element_size() == 0 else p.clone()).view(t.dtype)
                for p, t in zip(parts, tensors, strict=False)
            ]
        )
    return out


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[1 << 10, 1 << 20, 16 << 20, 64 << 20], help="gathered bytes"
    )
    parser.add_argument("--repeats", type=int, default=40, help="timed calls up to 1 MiB (10 above)")
    parser.add_argument("--md", type=Path, default=RESULTS_DIR / "comm_all_gather_profile.md")
    parser.add_argument("--append", action="store_true")
    parser.add_argument("--no-write", action="store_true")
    return parser.parse_args()


def check(rank: int) -> None:
    x = torch.arange(5, dtype=torch.float32) + rank
    idx = torch.arange(3, dtype=torch.int32) * (rank + 1)
    ref = all_gather_variable([x, idx])
    for sizes_known in (False, True):
        got = lean_all_gather([x, idx], sizes_known=sizes_known)
        assert all(
            torch.equal(a, b) for ra, rb in zip(ref, got, strict=True) for a, b in zip(ra, rb, strict=True)
        )


def run(args: argparse.Namespace, rank: int, world: int) -> list[str]:
    check(rank)
    lines = [
        f"## W={world} ({now_iso()}, git {git_sha()}, load at start {load_average()})",
        "",
        "| gathered bytes | "
        + " | ".join(f"`{n}` ms" for n in ("torch", "thinwire", "thinwire_known", "lean", "lean_known"))
        + " |",
        "|---|---|---|---|---|---|",
    ]
    for nbytes in args.sizes:
        x = torch.ones(nbytes // 4 // world)
        out = torch.empty(nbytes // 4)
        calls: dict[str, Callable[[], object]] = {
            "torch": functools.partial(_all_gather_single, out, x),
            "thinwire": functools.partial(all_gather_variable, [x]),
            "thinwire_known": functools.partial(all_gather_variable, [x], sizes_known=True),
            "lean": functools.partial(lean_all_gather, [x]),
            "lean_known": functools.partial(lean_all_gather, [x], sizes_known=True),
        }
        repeats = args.repeats if nbytes <= 1 << 20 else max(3, args.repeats // 4)
        names = list(calls)
        samples: dict[str, list[float]] = {name: [] for name in names}
        for i in range(-2, repeats):  # two warm-up rounds
            shift = i % len(names)
            for name in names[shift:] + names[:shift]:
                dist.barrier()
                start = time.perf_counter()
                calls[name]()
                if i >= 0:
                    samples[name].append(time.perf_counter() - start)
        medians = [quartiles(max_over_ranks(samples[name]))[1] * 1e3 for name in names]
        lines.append(f"| {nbytes} | " + " | ".join(f"{m:.3f}" for m in medians) + " |")
        log0(lines[-1])
    lines += [
        "",
        f"Load at end: {load_average()}. Median of {args.repeats} calls up to 1 MiB, fewer above.",
        "",
    ]
    return lines


def main() -> None:
    args = parse_args()
    rank, world = init_gloo()
    try:
        lines = run(args, rank, world)
        if rank == 0 and not args.no_write:
            header = [
                "# all_gather_variable: where its extra time goes",
                "",
                "Written by `PYTHONPATH=. torchrun --standalone --nproc_per_node W "
                "benchmarks/comm/profile_all_gather.py` (its docstring describes the variants). Time of a call:",
                "slowest rank; median over calls; the variants take turns call by call.",
                "",
            ]
            if args.append:
                header = []
            with args.md.open("a" if args.append else "w") as f:
                f.write("\n".join([*header, *lines]) + "\n")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
