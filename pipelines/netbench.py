"""Time collectives on the current process group (one rank each); rank 0 writes a JSON report.

Started per rank by :func:`harness.netem.run_workers` (or torchrun)::

    python -m pipelines.netbench --op all_reduce --mbytes 10 --repeats 3 --out result.json

Each repeat is bracketed by barriers; the report holds every repeat's seconds (max over ranks)
and the bytes each rank handed to the collective, what ``CommStats`` would count.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist

from common.comm.collectives import all_gather_variable, all_reduce_sum_
from common.comm.stats import CommStats
from trainer.distributed import init_from_env, shutdown
from trainer.fileio import atomic_write_json

OPS = ("all_reduce", "all_gather")


def time_op(op: str, nbytes: int, repeats: int) -> dict[str, object]:
    numel = max(1, nbytes // 4)
    tensor = torch.ones(numel, dtype=torch.float32)
    stats = CommStats()
    seconds = []
    for i in range(repeats + 1):  # the first call sets up the connections' buffers: not timed
        dist.barrier()
        start = time.perf_counter()
        if op == "all_reduce":
            all_reduce_sum_(tensor, stats=stats if i else None)
        else:
            all_gather_variable([tensor], sizes_known=True, stats=stats if i else None)
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        if i:
            seconds.append(float(elapsed))
    return {
        "op": op,
        "bytes": numel * 4,
        "seconds": seconds,
        "ops": {
            name: [calls / repeats, stats.bits_by_op[name] / 8 / repeats]
            for name, calls in stats.calls.items()
        },
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--op", choices=OPS, action="append", required=True)
    parser.add_argument(
        "--mbytes", type=float, action="append", required=True, help="MB per rank (1e6 bytes)"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    ctx = init_from_env("gloo")
    try:
        results = [time_op(op, int(mb * 1e6), args.repeats) for op in args.op for mb in args.mbytes]
        if ctx.is_main:
            atomic_write_json(args.out, {"world_size": ctx.world_size, "results": results})
            print(json.dumps(results))
    finally:
        shutdown()


if __name__ == "__main__":
    main()
