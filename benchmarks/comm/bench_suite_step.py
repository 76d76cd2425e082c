"""Step time of every suite method on the suite's CIFAR-10 recipe, as ratios to fp32 in one run.

    PYTHONPATH=. .venv/bin/torchrun --standalone --nproc_per_node 2 benchmarks/comm/bench_suite_step.py

Why: the suite's CIFAR-10 runs took 1.15-1.6x fp32's time per run (results/suite/, stage by stage
beside other work), and the budget of issue 17 asked whether compression is what costs. Here every
method is the suite's own run configuration (``pipelines/suite/params.yaml``: airbench width 16,
bf16 autocast, channels_last, 256 images per rank, the per-tensor compression in one bucket, the
strategy's own update), built by ``trainer.default_strategy`` and stepped as the loop steps it
(zero_grad, forward + backward under autocast, after_backward, SGD, after_step) on fixed random
batches (data loading and augmentation are the same for every method and are left out). The
methods take turns step by step, in an order rotated every cycle, so the load of other processes
falls on all alike; a step's time is the slowest rank's (the ranks wait for each other in the
collectives). Reported per method: median step time, the median paired ratio to fp32's step of the
same cycle with its IQR, and the median seconds in compress / communicate / decompress.
Rank 0 writes ``benchmarks/results/suite_step.md`` (``--no-write``: print only).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
from _bench_util import RESULTS_DIR, git_sha, init_gloo, load_average, log0, now_iso, quartiles
from torch import nn

from pipelines.train import resolve_config
from trainer import autocast, default_strategy
from trainer.models import build_model

METHODS = ("fp32", "fp16", "terngrad", "qsgd2", "qsgd4", "qsgd8", "topk", "dgc", "def", "exdyna")


class Method:
    """One suite run's model, strategy and optimizer, stepped on a fixed batch."""

    def __init__(self, name: str, rank: int) -> None:
        self.name = name
        self.config = resolve_config("suite", f"cifar_{name}", "cpu")
        torch.manual_seed(0)
        model = build_model(
            "airbench", num_classes=10, in_channels=3, image_size=32, **self.config.model_options
        )
        self.model = model.to(memory_format=torch.channels_last)
        self.strategy = default_strategy(self.config)
        self.optimizer = self.strategy.optimizer(
            self.model,
            torch.optim.SGD,
            lr=self.config.lr * 0.1,
            momentum=self.config.momentum,
            weight_decay=self.config.weight_decay,
        )
        g = torch.Generator().manual_seed(rank)
        self.x = torch.randn(self.config.batch_size, 3, 32, 32, generator=g).contiguous(
            memory_format=torch.channels_last
        )
        self.y = torch.randint(0, 10, (self.config.batch_size,), generator=g)
        self.device = torch.device("cpu")

    def step(self) -> float:
        dist.barrier()
        start = time.perf_counter()
        self.strategy.set_epoch(1.0)  # past DGC's warm-up: the density of most of the run
        self.optimizer.zero_grad(set_to_none=True)
        with autocast(self.config, self.device):
            loss = nn.functional.cross_entropy(self.model(self.x).float(), self.y, label_smoothing=0.2)
        loss.backward()
        self.optimizer.step()  # after_backward, SGD, after_step: the loop's order
        seconds = torch.tensor([time.perf_counter() - start])
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        return float(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--cycles", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    rank, world = init_gloo()
    names = args.methods.split(",")
    if names[0] != "fp32":
        raise SystemExit("--methods must start with fp32 (the ratios' reference)")
    methods = [Method(n, rank) for n in names]
    for method in methods:
        for _ in range(args.warmup):
            method.step()
    phases = {m.name: dict(m.strategy.stats.seconds) for m in methods}
    times: dict[str, list[float]] = {m.name: [] for m in methods}
    for cycle in range(args.cycles):
        shift = cycle % len(methods)
        for method in methods[shift:] + methods[:shift]:
            times[method.name].append(method.step())
        if (cycle + 1) % 10 == 0:
            log0(f"cycle {cycle + 1}/{args.cycles}")
    lines = [
        "# Suite step time per method (CIFAR-10 recipe), ratios to fp32",
        "",
        f"`torchrun --standalone --nproc_per_node {world} benchmarks/comm/bench_suite_step.py` at git "
        f"{git_sha()}, {now_iso()}, load {load_average()}; {args.cycles} interleaved cycles after "
        f"{args.warmup} warm-up steps each. Step: the suite run's whole training step on a fixed batch "
        "of 256 per rank (no data loading); the slowest rank's time.",
        "",
        "| method | step ms (median) | / fp32, median paired [IQR] | compress ms | communicate ms | decompress ms |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for method in methods:
        ratios = [t / f for t, f in zip(times[method.name], times["fp32"], strict=True)]
        q1, median, q3 = quartiles(ratios)
        seconds = {
            k: (method.strategy.stats.seconds[k] - phases[method.name].get(k, 0.0)) / args.cycles * 1e3
            for k in ("compress", "communicate", "decompress")
        }
        lines.append(
            f"| {method.name} | {statistics.median(times[method.name]) * 1e3:.1f} | {median:.3f} "
            f"[{q1:.3f}, {q3:.3f}] | {seconds['compress']:.2f} | {seconds['communicate']:.2f} | "
            f"{seconds['decompress']:.2f} |"
        )
    text = "\n".join(lines) + "\n"
    if rank == 0:
        print(text)
        if not args.no_write:
            (RESULTS_DIR / "suite_step.md").write_text(text)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
