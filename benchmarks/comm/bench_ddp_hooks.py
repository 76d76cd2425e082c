"""DDP step time with PyTorch's own comm hooks and thinwire's, side by side, against no hook.

    PYTHONPATH=. .venv/bin/torchrun --standalone --nproc_per_node 2 benchmarks/comm/bench_ddp_hooks.py
    PYTHONPATH=. .venv/bin/torchrun --standalone --nproc_per_node 2 benchmarks/comm/bench_ddp_hooks.py --models mobilenet_v2

One step = zero_grad + forward + backward (DDP runs the hook) + SGD step, on a fixed random batch
of ``--batch-size`` 3x32x32 images per rank, torchvision's ResNet-18 (11.2M parameters) or
MobileNetV2 (2.2M) for 10 classes. Every variant is its own DDP model from the same initial
parameters, with one bucket (``bucket_cap_mb=1024``: on gloo, torch's PowerSGD hook aborted with
DDP's default buckets, "Received data size doesn't match expected size", issue 20):

- ``allreduce``: no hook (DDP's built-in fp32 all-reduce), the baseline of every ratio;
- ``torch_fp16`` / ``thinwire_fp16``: ``fp16_compress_hook`` / ``install_ddp_hook(m, "fp16")``
  (``thinwire_fp16_unchecked``: the same without GradientSync's NaN/inf check of each bucket,
  which torch's hook does not make);
- ``torch_powersgd_rK`` / ``thinwire_powersgd_rK``: ``powerSGD_hook`` (error feedback, warm start,
  ``start_powerSGD_iter=2``) / ``install_ddp_hook(m, "powersgd", rank=K, error_feedback=True)``;
- thinwire's top-k 1 % + EF, QSGD 4-bit, TernGrad, EF-signSGD, random block 1 % + EF and random-k
  1 % through ``install_ddp_hook`` (``*_fused``: with ``fused_rng``, the noise drawn inside the
  quantizing kernel), and DGC's whole step at 0.1 % (``DGCDataParallel.install``: its hook and its
  SGD), no PyTorch counterpart. All on a CPU's default route, per tensor with the compiled kernels
  (the fused route, CUDA's default, costs a CPU 1.4-40x more per reduction: see docs/benchmarks.md).

After warm-up (which runs torch's PowerSGD past its two plain all-reduces) the variants take turns
step by step, in an order rotated every cycle, so that load from other processes falls on all
alike; a step's time is the slowest rank's. Reported per variant: median step time, the median of
the paired ratios to ``allreduce``'s step of the same cycle (with its IQR), and the fp32-equivalent
bits a rank hands to collectives per step: thinwire's from its CommStats, torch's PowerSGD from its
state's element counts (``PowerSGDState.compression_stats``: P's, Q's and uncompressed entries),
torch's fp16 as half the gradient. Rank 0 writes ``benchmarks/results/ddp_hooks.md`` (the latest run
of each model and world size) and appends to ``ddp_hooks.csv`` (``--no-write``: print only).

``--bucket-cap-mb 25`` (DDP's default) gives a model several buckets, so that a hook's collective can
overlap the rest of the backward pass; torch's PowerSGD variants are left out there (they abort on
gloo with several buckets, above), and ``thinwire_topk1_ef_blocking`` is top-k through a hook that
waits for its all-gather (the hook before its all-gather ran in the background): the overlap's worth,
in the same run. Results go to ``ddp_hooks_b<cap>.md`` / ``.csv``.
"""

# No ``from __future__ import annotations``: DDP checks a comm hook's annotations at run time.
import argparse
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torchvision
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
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from common.comm import GradientSync, install_ddp_hook
from common.compressors import build_compressor
from common.strategies import DGCDataParallel

MODELS = {"resnet18": torchvision.models.resnet18, "mobilenet_v2": torchvision.models.mobilenet_v2}
RANKS = (1, 4)
# thinwire's other compressors through the same hook (no PyTorch counterpart): the issue-20 figures
OTHERS = {
    "topk1_ef": {"compressor": "topk", "density": 0.01, "error_feedback": True},
    "qsgd4": {"compressor": "qsgd", "bits": 4},
    "terngrad": {"compressor": "terngrad"},
    # the same with the noise drawn inside the quantizing kernel (kernels._native on a CPU)
    "qsgd4_fused": {"compressor": "qsgd", "bits": 4, "fused_rng": True},
    "terngrad_fused": {"compressor": "terngrad", "fused_rng": True},
    "signsgd_ef": {"compressor": "signsgd", "error_feedback": True},
    "random_block1_ef": {"compressor": "random_block", "density": 0.01, "error_feedback": True},
    "randomk1": {"compressor": "randomk", "density": 0.01},
}
COLUMNS = (
    "date",
    "git_sha",
    "world_size",
    "model",
    "num_params",
    "variant",
    "batch_per_rank",
    "cycles",
    "median_s",
    "ratio_vs_allreduce",
    "ratio_q1",
    "ratio_q3",
    "bits_per_step",
    "loadavg",
    "command",
)


@dataclass
class Variant:
    name: str
    model: DDP
    bits: Callable[[], float]  # fp32-equivalent bits a rank hands to collectives, per step so far
    optimizer: torch.optim.Optimizer = field(init=False)
    times: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        dist.barrier()
        start = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(self.model(x), y).backward()
        self.optimizer.step()
        return time.perf_counter() - start


BUCKET_CAP_MB = [1024]  # set from --bucket-cap-mb


def _ddp(model_name: str, state: dict[str, torch.Tensor]) -> DDP:
    model = MODELS[model_name](num_classes=10)
    model.load_state_dict(state)
    return DDP(model, bucket_cap_mb=BUCKET_CAP_MB[0], broadcast_buffers=False)


def _blocking_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """thinwire's hook as it was before its all-gather ran in the background: it waits."""
    params = bucket.parameters()
    names = [state.param_names[id(p)] for p in params]
    buffer = bucket.buffer()
    if bucket.is_last():
        state.stats.steps += 1
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(state.reduce_flat(names, buffer, [p.numel() for p in params]).view_as(buffer))
    return future


def build_variants(model_name: str) -> list[Variant]:
    torch.manual_seed(0)
    state = MODELS[model_name](num_classes=10).state_dict()
    numel = sum(p.numel() for p in MODELS[model_name](num_classes=10).parameters())
    variants = [Variant("allreduce", _ddp(model_name, state), lambda: 32.0 * numel)]
    fp16 = _ddp(model_name, state)
    fp16.register_comm_hook(None, default_hooks.fp16_compress_hook)
    variants.append(Variant("torch_fp16", fp16, lambda: 16.0 * numel))
    ours16 = _ddp(model_name, state)
    sync16 = install_ddp_hook(ours16, "fp16")
    variants.append(Variant("thinwire_fp16", ours16, _per_step(sync16)))
    unchecked = _ddp(model_name, state)  # the NaN/inf check's cost: one fp32 sum per bucket
    sync16_unchecked = install_ddp_hook(unchecked, "fp16")
    sync16_unchecked.nonfinite_check = False
    variants.append(Variant("thinwire_fp16_unchecked", unchecked, _per_step(sync16_unchecked)))
    for rank in RANKS if BUCKET_CAP_MB[0] >= 1024 else ():
        theirs = _ddp(model_name, state)
        torch_state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=rank, start_powerSGD_iter=2
        )
        theirs.register_comm_hook(torch_state, powerSGD_hook.powerSGD_hook)
        variants.append(Variant(f"torch_powersgd_r{rank}", theirs, _torch_powersgd_bits(torch_state)))
        ours = _ddp(model_name, state)
        sync = install_ddp_hook(ours, "powersgd", rank=rank, error_feedback=True)
        variants.append(Variant(f"thinwire_powersgd_r{rank}", ours, _per_step(sync)))
    for name, options in OTHERS.items():
        model = _ddp(model_name, state)
        sync = install_ddp_hook(
            model, options["compressor"], **{k: v for k, v in options.items() if k != "compressor"}
        )
        variants.append(Variant(f"thinwire_{name}", model, _per_step(sync)))
    if BUCKET_CAP_MB[0] < 1024:  # several buckets: the overlap's worth
        model = _ddp(model_name, state)
        sync = GradientSync(
            build_compressor("topk", density=0.01), error_feedback=True, compress_per_tensor=True
        )
        sync.name_parameters(model.module)  # what install_ddp_hook does, with the waiting hook
        model.register_comm_hook(sync, _blocking_hook)
        variants.append(Variant("thinwire_topk1_ef_blocking", model, _per_step(sync)))
    model = _ddp(model_name, state)  # DGC's whole step (momentum correction, masking) through the hook
    dgc = DGCDataParallel(build_compressor("dgc", density=0.001), momentum=0.9, weight_decay=5e-4)
    variant = Variant("thinwire_dgc", model, _per_step(dgc))
    variant.optimizer = dgc.install(model, lr=0.01)
    variants.append(variant)
    return variants


def _per_step(sync: Any) -> Callable[[], float]:
    return lambda: sync.stats.bits_sent / max(sync.stats.steps, 1)


def _torch_powersgd_bits(state: Any) -> Callable[[], float]:
    """Per compressed step, from the hook's own element count (P's, Q's and uncompressed entries,
    accumulated over its compressed steps; fp32: 32 bits an element)."""
    return lambda: 32.0 * state.total_numel_after_compression / max(state.iter - state.start_powerSGD_iter, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["resnet18"], choices=list(MODELS))
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--warmup", type=int, default=4, help="untimed cycles (torch PowerSGD: 2 plain)")
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--variants", nargs="+", default=None, help="only these (allreduce always runs)")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument(
        "--bucket-cap-mb", type=int, default=1024, help="DDP's bucket size (default: one bucket)"
    )
    args = parser.parse_args()
    BUCKET_CAP_MB[0] = args.bucket_cap_mb
    suffix = "" if args.bucket_cap_mb == 1024 else f"_b{args.bucket_cap_mb}"
    rank, world = init_gloo()
    command = f"torchrun --nproc_per_node {world} {shlex.join(sys.argv)}"
    for model_name in args.models:
        variants = [
            v
            for v in build_variants(model_name)
            if not args.variants or v.name in {"allreduce", *args.variants}
        ]
        g = torch.Generator().manual_seed(rank)
        x = torch.randn(args.batch_size, 3, 32, 32, generator=g)
        y = torch.randint(0, 10, (args.batch_size,), generator=g)
        log0(f"{model_name}: {len(variants)} variants, {args.warmup} warm-up + {args.cycles} cycles")
        for _ in range(args.warmup):
            for v in variants:
                v.step(x, y)
        bits_before = {v.name: v.bits() for v in variants}
        for cycle in range(args.cycles):
            order = variants[cycle % len(variants) :] + variants[: cycle % len(variants)]
            for v in order:
                v.times.append(v.step(x, y))
        for v in variants:
            v.times = max_over_ranks(v.times)
        rows = _rows(model_name, variants, args, world, command, bits_before)
        if rank == 0:
            for row in rows:
                print(
                    f"{row['variant']:>22}: {row['median_s'] * 1e3:8.1f} ms  x{row['ratio_vs_allreduce']:.3f} "
                    f"[{row['ratio_q1']:.3f}, {row['ratio_q3']:.3f}]  {row['bits_per_step'] / 1e6:8.2f} Mbit/step"
                )
            if not args.no_write:
                append_rows(RESULTS_DIR / f"ddp_hooks{suffix}.csv", COLUMNS, rows)
    if rank == 0 and not args.no_write:
        _write_markdown(suffix)
    dist.destroy_process_group()


def _rows(model_name, variants, args, world, command, bits_before) -> list[dict[str, Any]]:
    base = variants[0].times
    numel = sum(p.numel() for p in variants[0].model.parameters())
    date, sha, load = now_iso(), git_sha(), load_average()
    rows = []
    for v in variants:
        ratios = [a / b for a, b in zip(v.times, base, strict=True)]
        q1, med, q3 = quartiles(ratios)
        rows.append(
            {
                "date": date,
                "git_sha": sha,
                "world_size": world,
                "model": model_name,
                "num_params": numel,
                "variant": v.name,
                "batch_per_rank": args.batch_size,
                "cycles": args.cycles,
                "median_s": statistics.median(v.times),
                "ratio_vs_allreduce": med,
                "ratio_q1": q1,
                "ratio_q3": q3,
                "bits_per_step": v.bits(),
                "loadavg": load,
                "command": command,
            }
        )
    return rows


def _write_markdown(suffix: str) -> None:
    rows = read_rows(RESULTS_DIR / f"ddp_hooks{suffix}.csv")
    latest: dict[tuple[str, str], str] = {}
    for row in rows:
        latest[(row["model"], row["world_size"])] = row["date"]
    lines = [
        "# DDP step time: PyTorch's comm hooks and thinwire's, against no hook",
        "",
        "`benchmarks/comm/bench_ddp_hooks.py` (its docstring: what a step is, how variants interleave).",
        "Ratio: median of the paired per-cycle ratios to the no-hook step, [IQR]. Bits: fp32-equivalent",
        "bits a rank hands to collectives per step.",
        "",
    ]
    for (model, world), date in sorted(latest.items()):
        run = [r for r in rows if r["model"] == model and r["world_size"] == world and r["date"] == date]
        lines += [
            f"## {model}, {world} gloo ranks ({run[0]['num_params']} parameters, batch {run[0]['batch_per_rank']}"
            f" per rank, {run[0]['cycles']} cycles), {date}, git {run[0]['git_sha']}",
            "",
            f"`{run[0]['command']}` (load average {run[0]['loadavg']})",
            "",
            "| variant | step (ms) | ratio to no hook | Mbit / step |",
            "|---|---:|---|---:|",
        ]
        for r in run:
            lines.append(
                f"| {r['variant']} | {float(r['median_s']) * 1e3:.1f} | {float(r['ratio_vs_allreduce']):.3f} "
                f"[{float(r['ratio_q1']):.3f}, {float(r['ratio_q3']):.3f}] | {float(r['bits_per_step']) / 1e6:.2f} |"
            )
        lines.append("")
    (RESULTS_DIR / f"ddp_hooks{suffix}.md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
