"""Benchmark ``threshold_select`` (density 1e-3, capacity 2k, fp32) and ``estimate_threshold``.

Run from the repository root (``benchmarks/kernels/run_all.sh`` runs every kernel benchmark)::

    .venv/bin/python benchmarks/kernels/bench_threshold_select.py     # GPU if present, else CPU
    .venv/bin/python benchmarks/kernels/bench_threshold_select.py --density 0.01

The threshold is the exact k-th largest |x| (k = density * N), fixed outside the timing.
GPU: the Triton kernel against the torch reference and against ``torch.topk(|x|, k)`` (what a top-k
sparsifier pays for the same k). CPU: the reference against ``x[x.abs() >= threshold]`` (boolean
indexing: same scan, variable-size output, one host sync). ``estimate_threshold`` (pure torch, 1 %
sample) is timed against the exact ``torch.topk(|x|, k).values.min()`` on both devices.
Traffic: one read of x (4 bytes per element) plus 8 bytes per selected entry.
"""

from __future__ import annotations

import argparse
import math

import _common
import torch
from _common import Case, Timed, compare, on_gpu

from kernels.threshold_select import estimate_threshold, threshold_select


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--density", type=float, default=1e-3)


def build(numel: int, device: torch.device, args: argparse.Namespace) -> list[Case]:
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(numel, generator=gen, device=device)
    k = max(1, math.ceil(args.density * numel))
    threshold = x.abs().topk(k).values.min()
    capacity = 2 * k
    topk = Timed(f"torch.topk(|x|,k={k})", lambda: torch.topk(x.abs(), k))
    select = compare(
        device,
        lambda b: threshold_select(x, threshold, capacity, backend=b),
        Timed("x[x.abs()>=threshold]", lambda: x[x.abs() >= threshold]),
        gpu_baselines=[topk],
    )
    estimate_label = "reference" if not on_gpu(device) else "torch"
    estimate = Timed(estimate_label, lambda: estimate_threshold(x, args.density, generator=gen))
    exact = Timed(f"torch.topk(|x|,k={k}).values.min()", lambda: torch.topk(x.abs(), k).values.min())
    num_samples = max(math.ceil(0.01 * numel), math.ceil(2 / args.density))
    return [
        Case("threshold_select", numel, "float32", 4 * numel + 8 * k, *select),
        Case("estimate_threshold", numel, "float32", 12 * min(num_samples, numel), [estimate], [exact]),
    ]


def main() -> None:
    _common.main(__doc__, build, add_args)


if __name__ == "__main__":
    main()
