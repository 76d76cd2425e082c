"""Timing, bandwidth and CSV code shared by the kernel benchmarks (``bench_<op>.py``).

Not a library module: the bench scripts import it from this folder (Python puts a script's folder
first on ``sys.path``). Each script builds, per size, the variants to time (the Triton kernels on a
GPU, the torch references on a CPU) and the baselines to compare them with, then calls ``run``.

What a row means:

- ``median_ms``: median time of one call. GPU: ``triton.testing.do_bench`` (CUDA events, L2 flushed
  between calls, ``return_mode="median"``). CPU: ``time.perf_counter`` around single calls after
  warm-up, median of at least ``--repeats`` calls (more for fast calls: up to 200 within about
  0.3 s), the variants and baselines of a size interleaved call by call; one torch thread by
  default (``--threads``).
- ``gbps``: the op's minimal traffic (bytes it must read + write, given by the script) / time.
- ``copy_gbps``: the same machine's ``dst.copy_(src)`` on an fp32 tensor of ``numel`` elements
  (``8 * numel`` bytes moved), measured by the same script, so ``fraction_of_copy`` says how close
  the op runs to the memory system's streaming rate.
- ``baseline`` / ``speedup_vs_baseline``: ``baseline_ms / median_ms``; above 1 the variant is faster.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
CSV_PATH = REPO_ROOT / "benchmarks" / "results" / "kernels.csv"
COLUMNS = (
    "date",
    "git_sha",
    "device",
    "op",
    "backend",
    "numel",
    "dtype",
    "median_ms",
    "gbps",
    "copy_gbps",
    "fraction_of_copy",
    "baseline",
    "speedup_vs_baseline",
)


@dataclass
class Timed:
    """One callable to time: a variant (``label`` is the backend column) or a baseline."""

    label: str
    fn: Callable[[], object]


@dataclass
class Case:
    """One op at one size: what to time, what to compare it with, and its minimal traffic."""

    op: str
    numel: int
    dtype: str
    bytes_moved: int
    variants: list[Timed]
    baselines: list[Timed] = field(default_factory=list)


def parse_args(
    description: str, extra: Callable[[argparse.ArgumentParser], None] | None = None
) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--device", default="auto", help="cuda, cpu or auto (cuda when available)")
    parser.add_argument("--log2-min", type=int, default=None, help="smallest size 2**k (GPU 20, CPU 16)")
    parser.add_argument("--log2-max", type=int, default=None, help="largest size 2**k (GPU 27, CPU 22)")
    parser.add_argument("--log2-step", type=int, default=None, help="step in k (GPU 1, CPU 2)")
    parser.add_argument("--repeats", type=int, default=15, help="CPU: least timed calls per measurement")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="CPU: torch intra-op threads (default 1: other processes share the 2 cores of the dev "
        "machines, and one thread gives far steadier medians)",
    )
    parser.add_argument("--no-csv", action="store_true", help="print only; do not append to the CSV")
    parser.add_argument("--csv", type=Path, default=CSV_PATH, help="CSV to append rows to")
    if extra is not None:
        extra(parser)
    return parser.parse_args()


def resolve_device(args: argparse.Namespace) -> torch.device:
    """The device named by ``--device``; on a CPU also sets the thread count from ``--threads``."""
    name = args.device
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    return device


def sizes(args: argparse.Namespace, device: torch.device) -> list[int]:
    """Powers of two: 2**20..2**27 on a GPU, 2**16..2**22 (every other power) on a CPU."""
    gpu = device.type == "cuda"
    low = args.log2_min if args.log2_min is not None else (20 if gpu else 16)
    high = args.log2_max if args.log2_max is not None else (27 if gpu else 22)
    step = args.log2_step if args.log2_step is not None else (1 if gpu else 2)
    return [2**k for k in range(low, high + 1, step)]


def time_ms(fns: Sequence[Callable[[], object]], device: torch.device, repeats: int) -> list[float]:
    """Median milliseconds of one call of each of ``fns``.

    On a CPU the calls are interleaved (fn0, fn1, ..., fn0, fn1, ...) so that a change in the load
    from other processes during the measurement falls on all of them alike.
    """
    if device.type == "cuda":
        import triton.testing

        return [float(triton.testing.do_bench(fn, return_mode="median")) for fn in fns]
    for fn in fns:
        fn()
    start = time.perf_counter()
    for fn in fns:
        fn()
    # At least ``repeats`` rounds, more for fast calls (up to 200 or about 0.3 s): the medians of
    # sub-millisecond calls on a shared machine need many samples to settle.
    round_s = max(time.perf_counter() - start, 1e-6)
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(min(200, max(repeats, int(0.3 / round_s)))):
        for fn, fn_samples in zip(fns, samples):
            start = time.perf_counter()
            fn()
            fn_samples.append((time.perf_counter() - start) * 1e3)
    return [statistics.median(s) for s in samples]


_COPY_GBPS: dict[tuple[str, int], float] = {}


def copy_gbps(numel: int, device: torch.device, repeats: int) -> float:
    """GB/s of ``dst.copy_(src)`` for fp32 tensors of ``numel`` elements (cached per size)."""
    key = (str(device), numel)
    if key not in _COPY_GBPS:
        src = torch.ones(numel, device=device)
        dst = torch.empty_like(src)
        _COPY_GBPS[key] = 8 * numel / time_ms([lambda: dst.copy_(src)], device, repeats)[0] / 1e6
    return _COPY_GBPS[key]


def git_sha() -> str:
    """``git rev-parse --short HEAD``, with ``-dirty`` when the kernel code differs from it.

    ``uncommitted`` outside a repository or before the first commit. Only read-only git commands
    (``diff-index`` does not refresh the index, unlike ``status``).
    """

    def git(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", *argv], cwd=REPO_ROOT, capture_output=True, text=True)

    try:
        head = git("rev-parse", "--short", "HEAD")
        if head.returncode != 0 or not head.stdout.strip():
            return "uncommitted"
        paths = ("--", "kernels", "benchmarks/kernels")
        changed = git("diff-index", "--quiet", "HEAD", *paths).returncode != 0
        untracked = bool(git("ls-files", "--others", "--exclude-standard", *paths).stdout.strip())
    except OSError:
        return "uncommitted"
    return head.stdout.strip() + ("-dirty" if changed or untracked else "")


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    threads = torch.get_num_threads()
    return f"{model or platform.processor() or 'cpu'} ({threads} threads)"


def run(cases: Iterable[Case], args: argparse.Namespace, device: torch.device) -> list[dict[str, object]]:
    """Time every case, print a table, append the rows to the CSV (unless ``--no-csv``)."""
    date = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    sha, name = git_sha(), device_name(device)
    rows: list[dict[str, object]] = []
    print(f"# {name}, git {sha}; load average before: {_load()}")
    print(
        f"{'op':<27}{'backend':<14}{'dtype':<14}{'numel':>9}{'ms':>10}{'GB/s':>8}{'copy':>8}{'frac':>7}  "
        f"{'baseline':<36}{'speedup':>8}"
    )
    for case in cases:
        copy = copy_gbps(case.numel, device, args.repeats)
        timed = [*case.variants, *case.baselines]
        medians = time_ms([t.fn for t in timed], device, args.repeats)
        baseline_ms = {b.label: ms for b, ms in zip(case.baselines, medians[len(case.variants) :])}
        for variant, ms in zip(case.variants, medians):
            gbps = case.bytes_moved / ms / 1e6
            for baseline in case.baselines or [Timed("", lambda: None)]:
                speedup = baseline_ms[baseline.label] / ms if baseline.label else float("nan")
                row: dict[str, object] = {
                    "date": date,
                    "git_sha": sha,
                    "device": name,
                    "op": case.op,
                    "backend": variant.label,
                    "numel": case.numel,
                    "dtype": case.dtype,
                    "median_ms": f"{ms:.4f}",
                    "gbps": f"{gbps:.2f}",
                    "copy_gbps": f"{copy:.2f}",
                    "fraction_of_copy": f"{gbps / copy:.3f}",
                    "baseline": baseline.label,
                    "speedup_vs_baseline": f"{speedup:.3f}",
                }
                rows.append(row)
                print(
                    f"{case.op:<27}{variant.label:<14}{case.dtype:<14}{case.numel:>9}{ms:>10.3f}{gbps:>8.2f}"
                    f"{copy:>8.2f}{gbps / copy:>7.3f}  {baseline.label:<36}{speedup:>8.2f}"
                )
    print(f"# load average after: {_load()}")
    if not args.no_csv:
        write_rows(rows, args.csv)
    return rows


def write_rows(rows: Sequence[dict[str, object]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    new_file = not path.exists() or path.stat().st_size == 0
    with path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        if new_file:
            writer.writeheader()
        writer.writerows(rows)


def _load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def on_gpu(device: torch.device) -> bool:
    return device.type == "cuda"


def compare(
    device: torch.device,
    call: Callable[[Any], object],
    cpu_baseline: Timed,
    gpu_variants: Sequence[Timed] = (),
    gpu_baselines: Sequence[Timed] = (),
) -> tuple[list[Timed], list[Timed]]:
    """``(variants, baselines)`` for an op whose public function is ``call(backend)``.

    GPU: the Triton kernel (plus ``gpu_variants``) against the torch reference (plus
    ``gpu_baselines``). CPU: the reference against a dense torch expression doing comparable work.
    """
    if on_gpu(device):
        variants = [Timed("triton", lambda: call("triton")), *gpu_variants]
        return variants, [Timed("reference", lambda: call("reference")), *gpu_baselines]
    return [Timed("reference", lambda: call("reference"))], [cpu_baseline]


def main(
    doc: str,
    build: Callable[[int, torch.device, argparse.Namespace], list[Case]],
    extra: Callable[[argparse.ArgumentParser], None] | None = None,
) -> list[dict[str, object]]:
    """Parse the common arguments, build the cases for every size, time them, write the rows."""
    args = parse_args(doc.strip().splitlines()[0], extra)
    device = resolve_device(args)
    # A generator: each size's tensors are built just before they are timed and freed after.
    cases = (case for numel in sizes(args, device) for case in build(numel, device, args))
    return run(cases, args, device)
