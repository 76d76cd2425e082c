"""What one gradient bucket costs on each route: ATen ops (a GPU's launches), host reads, time.

    PYTHONPATH=. .venv/bin/python benchmarks/comm/bench_fused_route.py                 # ResNet-50's gradient
    PYTHONPATH=. .venv/bin/python benchmarks/comm/bench_fused_route.py --model resnet18 --out /tmp/x

One bucket holding every gradient of a torchvision model (ResNet-50: 161 tensors, 25.6M entries),
reduced by ``GradientSync.reduce_flat`` at world size 1 (the collectives are no-ops; compression,
error feedback and decompression run) on the per-tensor route (``fused=False``, a CPU's default) and
the fused route (``fused=True``, CUDA's default), for every method. Per route: the ATen ops one
reduction dispatches (``TorchDispatchMode``: on a GPU each is a launch, plus what the Triton
kernels launch themselves, not counted), the ones among them that read a device value on the host
(``.item()``, ``nonzero``, ...: on a GPU each waits for the device), and the median wall time of
``--repeats`` reductions on this machine's CPU (one thread). The ops are what the GPU hot-path
issue is about; the CPU time says what the fused route costs where launches are free (its torch
ops make a pass each over the bucket, where the per-tensor route's compiled kernels fuse them).
Writes ``benchmarks/results/fused_route.md`` (``--out DIR`` elsewhere, ``--no-write`` prints only).
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torchvision

from common.comm import GradientSync
from common.compressors import build_compressor

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.helpers.dispatch import count_ops

RESULTS = Path(__file__).resolve().parents[1] / "results"
METHODS = {  # name -> (compressor, options, error feedback)
    "fp16": ("fp16", {}, False),
    "topk 1 % + EF": ("topk", {"density": 0.01}, True),
    "DGC 0.1 % + EF": ("dgc", {"density": 0.001}, True),
    "random-k 1 %": ("randomk", {"density": 0.01}, False),
    "random block 1 % + EF": ("random_block", {"density": 0.01}, True),
    "TernGrad": ("terngrad", {}, False),
    "QSGD 4-bit": ("qsgd", {"bits": 4, "fused_rng": True}, False),
    "EF-signSGD": ("signsgd", {}, True),
    "PowerSGD r2 + EF": ("powersgd", {"rank": 2}, True),
}


def measure(
    model: torch.nn.Module, compressor: str, options: dict, ef: bool, fused: bool, repeats: int
) -> dict:
    named = [(n, p) for n, p in model.named_parameters()]
    names, sizes = [n for n, _ in named], [p.numel() for _, p in named]
    flat = torch.randn(sum(sizes), generator=torch.Generator().manual_seed(0))
    sync = GradientSync(
        build_compressor(compressor, **options),
        error_feedback=ef,
        bucket_numel=10**12,
        compress_per_tensor=True,
        fused=fused,
    )
    sync.name_parameters(model)
    for _ in range(2):  # layouts, plans and warm starts built
        sync.reduce_flat(names, flat.clone(), sizes)
    counted = count_ops(lambda: sync.reduce_flat(names, flat.clone(), sizes))
    times = []
    for _ in range(repeats):
        bucket = flat.clone()
        start = time.perf_counter()
        sync.reduce_flat(names, bucket, sizes)
        times.append(time.perf_counter() - start)
    return {"ops": counted.total, "reads": len(counted.host_reads), "ms": statistics.median(times) * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="resnet50", choices=["resnet50", "resnet18"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = getattr(torchvision.models, args.model)(num_classes=1000)
    numel = sum(p.numel() for p in model.parameters())
    rows = []
    for label, (compressor, options, ef) in METHODS.items():
        per_tensor = measure(model, compressor, options, ef, False, args.repeats)
        fused = measure(model, compressor, options, ef, True, args.repeats)
        rows.append((label, per_tensor, fused))
        print(f"{label:>22}: per tensor {per_tensor}, fused {fused}", file=sys.stderr, flush=True)
    sha = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    lines = [
        "# One gradient bucket on each route: ops (a GPU's launches), host reads, CPU time",
        "",
        f"`benchmarks/comm/bench_fused_route.py` (its docstring). {args.model}: "
        f"{len(list(model.parameters()))} tensors, {numel:,} entries in one bucket, world size 1; "
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%dT%H:%M:%SZ}, git {sha or 'unknown'}, one CPU thread.",
        "",
        f"`{shlex.join(['python', *sys.argv])}`",
        "",
        "| method | per tensor: ops | host reads | ms (CPU) | fused: ops | host reads | ms (CPU) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, a, b in rows:
        lines.append(
            f"| {label} | {a['ops']} | {a['reads']} | {a['ms']:.1f} | {b['ops']} | {b['reads']} | {b['ms']:.1f} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"fused_route_{args.model}.md").write_text(text)


if __name__ == "__main__":
    main()
