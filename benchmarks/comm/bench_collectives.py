"""All-reduce and all-gather time against message size on gloo ranks: torch directly vs thinwire.

Run from the repository root (once per world size; ``benchmarks/comm/run_all.sh`` does 2 and 4)::

    PYTHONPATH=. .venv/bin/torchrun --standalone --nproc_per_node 2 benchmarks/comm/bench_collectives.py
    PYTHONPATH=. .venv/bin/torchrun --standalone --nproc_per_node 4 benchmarks/comm/bench_collectives.py

What is timed, per message size (fp32, 1 KiB to 64 MiB in powers of 4):

- ``all_reduce/torch``: ``dist.all_reduce(buf)``;
  ``all_reduce/thinwire``: ``common.comm.all_reduce_sum_(buf, stats=...)`` (the same call plus the
  world-size check and the bit count).
- ``all_gather/torch``: ``dist.all_gather_single(out, inp)`` (``all_gather_into_tensor`` before
  torch 2.14); ``all_gather/thinwire``: ``common.comm.all_gather_variable([inp], stats=...)`` with
  its defaults (``sizes_known=False``): it all-gathers the element counts first, copies the input
  into a padded byte buffer and splits the result into per-rank views, which is what a
  variable-size payload (values + indices) pays.

``bytes`` follows nccl-tests: for all-reduce the buffer size, for all-gather the size of the
gathered result (each rank contributes ``bytes / world_size``). Algorithm bandwidth is
``bytes / time``; bus bandwidth is what each rank's link carries under the ring algorithm:
``2 (W-1)/W * algbw`` for all-reduce and ``(W-1)/W * algbw`` for all-gather.

Each sample is the slowest rank's time of one call started right after a barrier; the reported
time is the median over repeats, after warm-up calls. torch and thinwire calls alternate within a
size so that drift in the machine's load falls on both. Rank 0 appends rows to
``benchmarks/results/comm_collectives.csv`` and redraws ``benchmarks/results/comm_collectives.png``
from the latest run of every world size in that CSV.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from _bench_util import (
    RESULTS_DIR,
    append_rows,
    git_sha,
    init_gloo,
    load_average,
    log0,
    max_over_ranks,
    now_iso,
    quartiles,
    read_rows,
)

from common.comm import CommStats, all_gather_variable, all_reduce_sum_

# torch 2.14 renamed all_gather_into_tensor (deprecated since) to all_gather_single.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

COLUMNS = (
    "date",
    "git_sha",
    "backend",
    "world_size",
    "op",
    "impl",
    "bytes",
    "median_s",
    "algbw_GBps",
    "busbw_GBps",
)
OPS = ("all_reduce", "all_gather")
IMPLS = ("torch", "thinwire")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--min-bytes", type=int, default=1 << 10, help="smallest message (default 1 KiB)")
    parser.add_argument("--max-bytes", type=int, default=64 << 20, help="largest message (default 64 MiB)")
    parser.add_argument("--factor", type=int, default=4, help="ratio between consecutive sizes")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls per size and implementation")
    parser.add_argument(
        "--repeat-scale",
        type=float,
        default=1.0,
        help="multiplies the timed repeats per size (50 up to 64 KiB ... 5 from 16 MiB)",
    )
    parser.add_argument("--csv", type=Path, default=RESULTS_DIR / "comm_collectives.csv")
    parser.add_argument("--plot", type=Path, default=RESULTS_DIR / "comm_collectives.png")
    parser.add_argument("--no-write", action="store_true", help="print only; write no CSV or PNG")
    args = parser.parse_args()
    if args.min_bytes < 16 or args.max_bytes < args.min_bytes or args.factor < 2:
        parser.error("need 16 <= --min-bytes <= --max-bytes and --factor >= 2")
    return args


def message_sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    sizes = []
    size = min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= factor
    return sizes


def num_repeats(nbytes: int, scale: float) -> int:
    """Fewer repeats for big messages: a 64 MiB all-reduce on 4 oversubscribed ranks takes ~0.2 s."""
    if nbytes <= 64 << 10:
        base = 50
    elif nbytes <= 1 << 20:
        base = 20
    elif nbytes <= 4 << 20:
        base = 10
    else:
        base = 5
    return max(3, round(base * scale))


def make_calls(op: str, nbytes: int, world: int, stats: CommStats) -> dict[str, Callable[[], object]]:
    """The two implementations of ``op`` on fresh fp32 buffers of ``nbytes`` (see module docstring)."""
    if op == "all_reduce":
        buf = torch.ones(nbytes // 4)
        return {
            "torch": lambda: dist.all_reduce(buf),
            "thinwire": lambda: all_reduce_sum_(buf, stats=stats),
        }
    if nbytes % (4 * world):
        raise ValueError(f"all_gather of {nbytes} B does not split into {world} fp32 parts")
    inp = torch.ones(nbytes // 4 // world)
    out = torch.empty(nbytes // 4)
    return {
        "torch": lambda: _all_gather_single(out, inp),
        "thinwire": lambda: all_gather_variable([inp], stats=stats),
    }


def check_results(world: int, rank: int) -> None:
    """The two implementations agree on a small input (a benchmark of a wrong result is worthless)."""
    x = torch.arange(8, dtype=torch.float32) + rank
    y = x.clone()
    dist.all_reduce(x)
    all_reduce_sum_(y)
    expected = torch.arange(8, dtype=torch.float32) * world + world * (world - 1) / 2
    assert torch.equal(x, expected) and torch.equal(y, expected), (x, y, expected)
    gathered = torch.empty(8 * world)
    _all_gather_single(gathered, torch.arange(8, dtype=torch.float32) + rank)
    per_rank = all_gather_variable([torch.arange(8, dtype=torch.float32) + rank])
    assert torch.equal(torch.cat([parts[0] for parts in per_rank]), gathered)


def time_size(
    op: str, nbytes: int, world: int, warmup: int, repeats: int, stats: CommStats
) -> dict[str, list[float]]:
    """Per implementation, the slowest rank's seconds for each timed call."""
    calls = make_calls(op, nbytes, world, stats)
    for _ in range(warmup):
        for call in calls.values():
            call()
    samples: dict[str, list[float]] = {impl: [] for impl in calls}
    for i in range(repeats):
        order = IMPLS if i % 2 == 0 else IMPLS[::-1]
        for impl in order:
            dist.barrier()
            start = time.perf_counter()
            calls[impl]()
            samples[impl].append(time.perf_counter() - start)
    return {impl: max_over_ranks(seconds) for impl, seconds in samples.items()}


def bus_factor(op: str, world: int) -> float:
    """Ring-algorithm bytes per rank link per result byte (nccl-tests' busbw convention)."""
    return 2 * (world - 1) / world if op == "all_reduce" else (world - 1) / world


def plot(csv_path: Path, png_path: Path) -> None:
    """Time and bus bandwidth against size for the latest run of every (backend, world size)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_rows(csv_path)
    latest: dict[tuple[str, str], str] = {}
    for row in rows:
        key = (row["backend"], row["world_size"])
        latest[key] = max(latest.get(key, ""), row["date"])
    rows = [r for r in rows if latest[(r["backend"], r["world_size"])] == r["date"]]
    lines: dict[tuple[str, str, str, str], list[dict[str, str]]] = {}
    for row in rows:
        lines.setdefault((row["op"], row["backend"], row["world_size"], row["impl"]), []).append(row)

    fig, axes = plt.subplots(2, len(OPS), figsize=(12, 8), sharex=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    worlds = sorted({int(w) for _, _, w, _ in lines})
    for (op, backend, world, impl), points in sorted(lines.items()):
        points.sort(key=lambda r: int(r["bytes"]))
        x = [int(r["bytes"]) for r in points]
        col = OPS.index(op)
        style = {
            "color": colors[worlds.index(int(world)) % len(colors)],
            "linestyle": "-" if impl == "torch" else "--",
            "marker": "o" if impl == "torch" else "x",
            "label": f"{impl}, {backend} W={world}",
        }
        axes[0, col].plot(x, [float(r["median_s"]) for r in points], **style)
        axes[1, col].plot(x, [float(r["busbw_GBps"]) for r in points], **style)
    for col, op in enumerate(OPS):
        axes[0, col].set_title(f"{op} (median of repeats)")
        axes[0, col].set_ylabel("time [s]")
        axes[1, col].set_ylabel("bus bandwidth [GB/s]")
        axes[1, col].set_xlabel("message bytes (all-gather: gathered result)")
        for row in range(2):
            axes[row, col].set_xscale("log", base=2)
            axes[row, col].set_yscale("log")
            axes[row, col].grid(True, which="both", alpha=0.3)
        axes[0, col].legend(fontsize=8)
    dates = sorted({r["date"] for r in rows})
    fig.suptitle(f"thinwire collectives on CPU gloo ranks ({dates[0]} .. {dates[-1]})", fontsize=10)
    fig.tight_layout()
    png_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png_path, dpi=110)
    plt.close(fig)


def run(args: argparse.Namespace, rank: int, world: int) -> None:
    date, sha, backend = now_iso(), git_sha(), dist.get_backend()
    log0(f"[collectives] world_size={world} backend={backend} git={sha} loadavg(1,5,15)={load_average()}")
    check_results(world, rank)
    stats = CommStats()
    rows: list[dict[str, object]] = []
    for op in OPS:
        for nbytes in message_sizes(args.min_bytes, args.max_bytes, args.factor):
            repeats = num_repeats(nbytes, args.repeat_scale)
            samples = time_size(op, nbytes, world, args.warmup, repeats, stats)
            medians = {impl: quartiles(s)[1] for impl, s in samples.items()}
            for impl in IMPLS:
                algbw = nbytes / medians[impl] / 1e9
                rows.append(
                    {
                        "date": date,
                        "git_sha": sha,
                        "backend": backend,
                        "world_size": world,
                        "op": op,
                        "impl": impl,
                        "bytes": nbytes,
                        "median_s": f"{medians[impl]:.6g}",
                        "algbw_GBps": f"{algbw:.4g}",
                        "busbw_GBps": f"{algbw * bus_factor(op, world):.4g}",
                    }
                )
            overhead = medians["thinwire"] / medians["torch"] - 1
            log0(
                f"  {op:10s} {nbytes:>10d} B x{repeats:<2d} torch {medians['torch'] * 1e3:9.3f} ms"
                f"  thinwire {medians['thinwire'] * 1e3:9.3f} ms ({overhead:+.0%})"
                f"  algbw {nbytes / medians['torch'] / 1e9:.3f} GB/s"
            )
    log0(f"[collectives] done, loadavg(1,5,15)={load_average()}")
    if rank == 0 and not args.no_write:
        append_rows(args.csv, COLUMNS, rows)
        plot(args.csv, args.plot)
        log0(f"[collectives] appended {len(rows)} rows to {args.csv}; plot {args.plot}")


def main() -> None:
    args = parse_args()
    rank, world = init_gloo()
    try:
        run(args, rank, world)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
