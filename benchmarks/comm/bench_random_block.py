"""Random-block sparsification's point is cheapness: its compress + decompress against top-k's.

    python benchmarks/comm/bench_random_block.py            # ~2 minutes on 2 cores
    python benchmarks/comm/bench_random_block.py --device cuda

For tensors of 10^5, 10^6 and 10^7 fp32 entries (normal, seeded) at the DEF paper's densities 1/16
and 1/64, times ``compress`` then decompression of the registered compressors ``random_block``,
``topk`` (exact ``torch.topk`` of the magnitudes, values + int32 indices) and ``randomk`` (shared
indices: a permutation per call), two ways:

- **into a reused buffer** (``decompress_into``): the route GradientSync's all-reduce takes, which
  writes the mean straight into the gradient; this is the one the issue's bar is checked on;
- **fresh** (``decompress``): a new dense tensor per call, whose first touch (page faults on
  buffers the allocator maps anew) dominates random block's time at 10^7 entries and 10^5.

The median of at least ``--repeats`` calls (10x more at 10^5 entries), in 3 rounds in which each
method runs a batch of calls in turn (two warm-up calls per batch dropped), on one thread (CPU) or
with a device synchronize around each call (CUDA). The issue's bar: random block at most 5 % of
top-k's time at every size. Writes benchmarks/results/random_block_cost.md (random_block_cost_<device>.md off the CPU).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from common.compressors import build_compressor  # noqa: E402
from common.compressors.base import CompressorRNG  # noqa: E402
from trainer.fileio import atomic_write_text  # noqa: E402
from trainer.tracking import git_sha  # noqa: E402

SIZES = (10**5, 10**6, 10**7)
DENSITIES = (1 / 16, 1 / 64)
METHODS = ("random_block", "topk", "randomk")
BAR = 0.05  # random block's time / top-k's, at most
ROUNDS = 3


def time_roundtrips(density: float, x: torch.Tensor, repeats: int, *, into: bool) -> dict[str, float]:
    """Median seconds of compress + decompress per method: ``ROUNDS`` rounds in which each method in
    turn runs a batch of calls (warm caches within a batch, as a training loop's next tensor; the
    rounds spread machine noise over all methods alike); two warm-up calls per batch are dropped."""
    compressors = {m: build_compressor(m, density=density) for m in METHODS}
    rngs = {m: CompressorRNG(seed=0, rank=0, device=x.device) for m in METHODS}
    out = torch.empty_like(x)
    times: dict[str, list[float]] = {m: [] for m in METHODS}
    per_round = max(1, -(-repeats // ROUNDS))
    for _ in range(ROUNDS):
        for m, compressor in compressors.items():
            for i in range(per_round + 2):
                if x.is_cuda:
                    torch.cuda.synchronize()
                start = time.perf_counter()
                payload = compressor.compress(x, rngs[m])
                result = compressor.decompress_into(payload, out) if into else compressor.decompress(payload)
                if x.is_cuda:
                    torch.cuda.synchronize()
                if i >= 2:
                    times[m].append(time.perf_counter() - start)
                del result, payload
    return {m: statistics.median(t) for m, t in times.items()}


def repeats_for(numel: int, repeats: int) -> int:
    """More calls on small tensors, whose calls are short and whose medians noise moves most."""
    return max(repeats, repeats * 10**6 // numel)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    rows = []
    for numel in SIZES:
        x = torch.randn(numel, generator=torch.Generator().manual_seed(numel)).to(device)
        for density in DENSITIES:
            repeats = repeats_for(numel, args.repeats)
            into = time_roundtrips(density, x, repeats, into=True)
            fresh = time_roundtrips(density, x, repeats, into=False)
            rows.append((numel, density, into, fresh))
            print(
                f"n={numel:>10,} density=1/{round(1 / density)}: "
                + ", ".join(f"{m} {1e3 * into[m]:.3f} | {1e3 * fresh[m]:.3f} ms" for m in METHODS)
                + "  (reused | fresh)",
                flush=True,
            )
    where = f"{device.type}" + (
        f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ", 1 thread"
    )
    lines = [
        "# Random block against top-k: compress + decompress time\n",
        f"`python benchmarks/comm/bench_random_block.py --device {args.device}` at git `{git_sha()}`, "
        f"torch {torch.__version__}, {where}; median of {args.repeats} calls or more (x 10^6 / entries), "
        f"in {ROUNDS} rounds of a batch per method, 2 warm-up calls per batch dropped, fp32 normal tensors. Top-k: exact `torch.topk` of |x| "
        "(values + int32 indices); random-k: shared indices from a permutation; random block: one "
        "contiguous block at a shared random offset.\n",
        "**Into a reused buffer** (`decompress_into`, GradientSync's all-reduce route, which writes the "
        f"mean into the gradient). The bar (issue 7): random block at most {100 * BAR:.0f} % of top-k.\n",
        "| entries | density | random block (ms) | top-k (ms) | random-k (ms) | block / top-k | within bar |",
        "|---:|---:|---:|---:|---:|---:|---|",
    ]
    for numel, density, s, _ in rows:
        ratio = s["random_block"] / s["topk"]
        lines.append(
            f"| {numel:,} | 1/{round(1 / density)} | {1e3 * s['random_block']:.3f} | {1e3 * s['topk']:.3f} "
            f"| {1e3 * s['randomk']:.3f} | {100 * ratio:.2f} % | {'yes' if ratio <= BAR else '**no**'} |"
        )
    lines += [
        "",
        "**Fresh output** (`decompress`: a new dense tensor per call), for comparison; not the route "
        "training takes.\n",
        "| entries | density | random block (ms) | top-k (ms) | random-k (ms) | block / top-k |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for numel, density, _, s in rows:
        lines.append(
            f"| {numel:,} | 1/{round(1 / density)} | {1e3 * s['random_block']:.3f} | {1e3 * s['topk']:.3f} "
            f"| {1e3 * s['randomk']:.3f} | {100 * s['random_block'] / s['topk']:.2f} % |"
        )
    name = "random_block_cost.md" if device.type == "cpu" else f"random_block_cost_{device.type}.md"
    text = "\n".join(lines) + "\n"
    atomic_write_text(REPO / "benchmarks" / "results" / name, text)
    print(text)


if __name__ == "__main__":
    main()
