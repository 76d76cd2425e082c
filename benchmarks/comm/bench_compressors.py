"""Per call: thinwire's top-k, QSGD, TernGrad and DGC against their peers' code, in plain torch.

    PYTHONPATH=. .venv/bin/python benchmarks/comm/bench_compressors.py            # writes compressors.md
    PYTHONPATH=. .venv/bin/python benchmarks/comm/bench_compressors.py --no-write

Why: issue 20 measured thinwire against GRACE (sands-lab/grace, ``grace_dl/torch/compressor``),
whose code is not installable here. Its three compressors are a few torch expressions each, written
out below as GRACE computes them (top-k: ``topk(|x|)`` then ``gather``, ``zeros().scatter_()`` to
decompress; QSGD: one l2 norm per tensor, ``uniform_`` noise, int8 levels; TernGrad: 2.5 sigma
clamp, ``uniform_(0, scalar)``, int8 signs), so the comparison is on this machine, in one process,
same tensors. DGC's peer is its official code (``synxlin/deep-gradient-compression``,
``_sparsify`` and ``decompress``: ``tests/helpers/official_dgc.py``, the start of its strided
sample from Python's ``random`` as there; decompression into the gradient it compressed, as there).
thinwire's are the registry's compressors with the suite's options (top-k 1 %, QSGD 4-bit buckets
of 512 fixed-width, TernGrad shared-scaler clipping at 2.5 sigma, DGC at 0.1 %), bit-packed;
decompression into the tensor it compressed (``decompress_into``, as GradientSync decodes into the
bucket) where the compressor has its own, else ``decompress``. ``qsgd_fused`` / ``terngrad_fused``:
the same with ``fused_rng`` (the noise drawn
inside the quantizing kernel, ``kernels._native`` on a CPU).
For each size (1e5, 1e6, 1e7 fp32 entries) and thread count (1, 2) the calls alternate, thinwire then
the peer, in rounds (5x ``--repeats`` at 1e5, ``--repeats`` at 1e6, a third at 1e7); reported: median
ms of compress and of decompress (one payload), the median over rounds of the ratio thinwire / peer
in the round (below 1: thinwire faster; the issue's harness took paired ratios too), and the bits
each puts on the wire.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from _bench_util import git_sha, now_iso

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # the official DGC code lives in tests/helpers, which is not installed

from common.compressors import Compressor, CompressorRNG, build_compressor  # noqa: E402
from tests.helpers import official_dgc as official  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "results" / "compressors.md"
SIZES = (10**5, 10**6, 10**7)
THINWIRE = {
    "topk": ("topk", {"density": 0.01}),
    "qsgd": ("qsgd", {"bits": 4, "bucket_size": 512, "encoding": "fixed"}),
    "terngrad": ("terngrad", {"clip": 2.5}),
    "dgc": ("dgc", {"density": 0.001}),
    # the same with the noise drawn inside the quantizing kernel (kernels._native on a CPU)
    "qsgd_fused": ("qsgd", {"bits": 4, "bucket_size": 512, "encoding": "fixed", "fused_rng": True}),
    "terngrad_fused": ("terngrad", {"clip": 2.5, "fused_rng": True}),
}


def grace_topk(x: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], Callable[[], torch.Tensor]]:
    k = max(1, int(x.numel() * 0.01))
    _, indices = torch.topk(x.abs(), k, sorted=False)
    values = torch.gather(x, 0, indices)
    return (values, indices), lambda: torch.zeros(x.numel()).scatter_(0, indices, values)


def grace_qsgd(x: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], Callable[[], torch.Tensor]]:
    levels = 7  # 4 bits: the same number of levels as thinwire's
    norm = x.norm().flatten()
    level_float = levels / norm * x.abs()
    previous = level_float.floor()
    is_next = (torch.empty_like(x).uniform_() < (level_float - previous)).type(torch.float32)
    codes = ((previous + is_next) * x.sign()).type(torch.int16).type(torch.int8)
    return (codes, norm), lambda: norm / levels * codes.type(torch.float32)


def grace_terngrad(x: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], Callable[[], torch.Tensor]]:
    std = torch.sqrt(torch.mean((x - torch.mean(x)) ** 2))
    c = 2.5 * std.item()
    gradient = torch.clamp(x, -c, c)
    abs_gradient = gradient.abs()
    scalar = abs_gradient.max()
    signs = gradient.sign() * scalar
    signs[torch.empty_like(x).uniform_(0, scalar.item()) >= abs_gradient] = 0
    codes = signs.sign().type(torch.int8)
    return (codes, scalar.flatten()), lambda: codes.type(torch.float32) * scalar


def official_dgc(x: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], Callable[[], torch.Tensor]]:
    _, _, _, stride = official.sample_plan(x.numel(), 0.001)
    values, indices = official.sparsify(x, 0.001, random.randint(0, stride - 1))
    # the code decodes into its reused gradient: here the gradient it compressed (the round's copy)
    return (values, indices), lambda: official.decompress(values, indices, x)


PEERS = {
    "topk": grace_topk,
    "qsgd": grace_qsgd,
    "terngrad": grace_terngrad,
    "dgc": official_dgc,
    "qsgd_fused": grace_qsgd,
    "terngrad_fused": grace_terngrad,
}
PEER_NAMES = {name: "DGC's code" if name == "dgc" else "GRACE" for name in PEERS}


def _time(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(name: str, numel: int, repeats: int) -> dict[str, float]:
    compressor = build_compressor(THINWIRE[name][0], **THINWIRE[name][1])
    x = torch.randn(numel, generator=torch.Generator().manual_seed(numel))
    rng = CompressorRNG(0, 0)
    into = type(compressor).decompress_into is not Compressor.decompress_into
    times: dict[str, list[float]] = {k: [] for k in ("ours_c", "ours_d", "grace_c", "grace_d")}
    for _ in range(repeats + 1):  # the first round warms up and is dropped
        # Each side gets its own copy of the gradient (untimed) and decodes into it where its code
        # decodes into a buffer: GradientSync into the bucket it compressed, DGC's code into the
        # gradient; GRACE's decoders return fresh tensors. (A buffer the other side's calls pushed
        # out of the cache made 10^5-entry decodes up to 2x slower than a fresh, cache-warm tensor.)
        ours_x, peer_x = x.clone(), x.clone()
        start = time.perf_counter()
        payload = compressor.compress(ours_x, rng)
        times["ours_c"].append(time.perf_counter() - start)
        if into:
            times["ours_d"].append(_time(lambda p=payload, o=ours_x: compressor.decompress_into(p, o)))
        else:
            times["ours_d"].append(_time(lambda p=payload: compressor.decompress(p)))
        start = time.perf_counter()
        wire, decompress = PEERS[name](peer_x)
        times["grace_c"].append(time.perf_counter() - start)
        times["grace_d"].append(_time(decompress))
    med = {k: statistics.median(v[1:]) for k, v in times.items()}
    return {
        **med,
        # the median of the rounds' own ratios: a slow moment of the machine hits both calls of a round
        "ratio_c": statistics.median(
            a / b for a, b in zip(times["ours_c"][1:], times["grace_c"][1:], strict=True)
        ),
        "ratio_d": statistics.median(
            a / b for a, b in zip(times["ours_d"][1:], times["grace_d"][1:], strict=True)
        ),
        "ours_bits": payload.num_bits,
        "grace_bits": sum(t.numel() * t.element_size() * 8 for t in wire),
    }


def _repeats(repeats: int, numel: int) -> int:
    """Rounds for one size: 5x at 10^5 entries (a call of 0.1 ms moves 20-40 % between runs of 9
    rounds on a shared 2-core machine), a third at 10^7 (calls of 0.1-0.4 s)."""
    return 5 * repeats if numel <= 10**5 else repeats if numel < 10**7 else max(3, repeats // 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--compressors", nargs="+", choices=list(THINWIRE), default=list(THINWIRE))
    args = parser.parse_args()
    lines = [
        "# Per call: thinwire's compressors against their peers' code (plain torch, this machine)",
        "",
        f"`{' '.join(['python', *sys.argv])}` at git {git_sha()}, {now_iso()}; the script's docstring says how.",
        "Median ms of one call; ratio: the median over rounds of thinwire / peer in the round (below 1:",
        "thinwire faster); Mbit on the wire. Rounds: 5x --repeats at 1e5 entries, --repeats at 1e6, a third at 1e7.",
        "Peers: GRACE's algorithms for top-k, QSGD and TernGrad; DGC's official code for DGC.",
        "",
        "| compressor | peer | entries | threads | compress ms (ours / peer) | ratio | decompress ms (ours / peer) | ratio | Mbit (ours / peer) |",
        "|---|---|---:|---:|---|---:|---|---:|---|",
    ]
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for name in args.compressors:
            for numel in SIZES:
                r = measure(name, numel, _repeats(args.repeats, numel))
                row = (
                    f"| {name} | {PEER_NAMES[name]} | {numel:.0e} | {threads} | {r['ours_c'] * 1e3:.2f} / {r['grace_c'] * 1e3:.2f} | "
                    f"{r['ratio_c']:.2f} | {r['ours_d'] * 1e3:.2f} / {r['grace_d'] * 1e3:.2f} | "
                    f"{r['ratio_d']:.2f} | {r['ours_bits'] / 1e6:.3f} / {r['grace_bits'] / 1e6:.3f} |"
                )
                print(row, flush=True)
                lines.append(row)
    if not args.no_write:
        RESULTS.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
