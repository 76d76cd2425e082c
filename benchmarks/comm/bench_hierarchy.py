"""Hierarchical against flat synchronisation on 2 emulated hosts x 2 ranks (needs root).

    PYTHONPATH=. .venv/bin/python benchmarks/comm/bench_hierarchy.py                 # writes hierarchy.md
    PYTHONPATH=. .venv/bin/python benchmarks/comm/bench_hierarchy.py --rates 1gbit --cycles 3 --no-write

For each inter-host rate, :func:`harness.netem.run_hosts` starts one torchrun agent per emulated
host (c10d rendezvous, the hosts' links shaped to the rate, each host's 2 ranks on its loopback)
running this script with ``--worker``. A step is ResNet-18's (torchvision, 11.2M parameters,
10 classes, 32 x 32 inputs, a fixed batch of 8 per rank) forward, backward and gradient sync
through ``GradientSync`` (buckets of 2^22 entries): fp32 and top-k 1 % + error feedback (per
tensor), each flat (every rank in the collective) and hierarchical (``common.comm.hierarchy``:
dense reduce onto the host's leader, the compressor between the 2 leaders, broadcast back). The
variants alternate, cycle by cycle; reported: the median step time (the slowest rank's), and the
bits per step by link class: what rank 0 hands to the gradient collective (flat: the all-reduce or
all-gather of all 4 ranks, whose ring crosses the host links and the loopbacks alike;
hierarchical: the 2 leaders' collective, which crosses only the host link), and what the host
reduce and broadcast move over a host's loopback (rank 1's reduce plus rank 0's broadcast).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_util import git_sha, load_average, now_iso, write_markdown

from common.comm import GradientSync
from common.comm.hierarchy import HostHierarchy
from common.compressors import build_compressor
from harness import netem

VARIANTS = ("fp32_flat", "fp32_hierarchical", "topk1_flat", "topk1_hierarchical")


def worker(out: Path, cycles: int, warmup: int) -> None:
    import torchvision

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    hierarchy = HostHierarchy.build()
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(8, 3, 32, 32, generator=g), torch.randint(0, 10, (8,), generator=g)
    syncs = {}
    for name in VARIANTS:
        topk = name.startswith("topk")
        syncs[name] = GradientSync(
            build_compressor("topk", density=0.01) if topk else build_compressor("identity"),
            error_feedback=topk,
            compress_per_tensor=topk,
            bucket_numel=2**22,
            hierarchy=hierarchy if name.endswith("hierarchical") else None,
        )
    host_bits = {name: 0 for name in VARIANTS}
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for cycle in range(warmup + cycles):
        shift = cycle % len(VARIANTS)
        for name in VARIANTS[shift:] + VARIANTS[:shift]:
            before = hierarchy.stats.bits_sent
            dist.barrier()
            start = time.perf_counter()
            model.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            syncs[name].sync_gradients(model)
            seconds = torch.tensor([time.perf_counter() - start])
            dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
            if cycle >= warmup:
                times[name].append(float(seconds))
                host_bits[name] += hierarchy.stats.bits_sent - before
    bits = torch.tensor([[syncs[n].stats.bits_sent for n in VARIANTS], [host_bits[n] for n in VARIANTS]],
                        dtype=torch.float64)  # fmt: skip
    gathered = [torch.empty_like(bits) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, bits)
    if rank == 0:
        steps = warmup + cycles
        result = {
            name: {
                "median_s": statistics.median(times[name]),
                "times": times[name],
                "between_hosts_bits_per_step": gathered[0][0][i].item() / steps,
                "inside_host_bits_per_step": (gathered[0][1][i].item() + gathered[1][1][i].item()) / cycles,
            }
            for i, name in enumerate(VARIANTS)
        }
        out.write_text(json.dumps(result, indent=1))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--rates", nargs="+", default=["100mbit", "1gbit"])
    parser.add_argument("--cycles", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if args.worker:
        worker(args.out, args.cycles, args.warmup)
        return
    netem.check_support()
    lines = [
        "# Hierarchical against flat synchronisation, 2 emulated hosts x 2 ranks",
        "",
        f"`{' '.join(['python', *sys.argv])}` at git {git_sha()}, {now_iso()}, load {load_average()}; "
        "the script's docstring says what a step is. Median step (the slowest rank's) over "
        f"{args.cycles} interleaved cycles; Mbit a rank hands to collectives per step.",
        "",
        "| between hosts | variant | step s | / flat | Mbit into the gradient collective (rank 0) | Mbit into the host reduce + broadcast |",
        "|---|---|---:|---:|---:|---:|",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for rate in args.rates:
            out = Path(tmp) / f"{rate}.json"
            target = [__file__, "--worker", "--out", str(out), "--cycles", str(args.cycles),
                      "--warmup", str(args.warmup)]  # fmt: skip
            with netem.terminate_as_exception(), netem.VirtualNetwork(2, rate) as network:
                code = netem.run_hosts(network, 2, target, env={"PYTHONPATH": os.getcwd()})
            if code != 0:
                raise SystemExit(f"the {rate} run failed with code {code}")
            result = json.loads(out.read_text())
            for name in VARIANTS:
                r = result[name]
                flat = result[name.replace("hierarchical", "flat")]["median_s"]
                row = (
                    f"| {rate} | {name} | {r['median_s']:.3f} | {r['median_s'] / flat:.2f} | "
                    f"{r['between_hosts_bits_per_step'] / 1e6:.2f} | {r['inside_host_bits_per_step'] / 1e6:.2f} |"
                )
                print(row, flush=True)
                lines.append(row)
    write_markdown("hierarchy.md", lines, no_write=args.no_write)


if __name__ == "__main__":
    main()
