"""How the tbf bucket size changes a ring all-reduce over shaped links (why netem uses 128 KiB+).

    python benchmarks/comm/bench_netem_burst.py            # needs root and iproute2; ~3 minutes

8 ranks, each in its own namespace (harness.netem), all-reduce 2.14 MB (the leaderboard MLP's
fp32 gradient) 4 times per setting, at each bucket size and link rate; the ideal time is
2 (p-1)/p x bytes / rate. Writes benchmarks/results/netem_burst.md (the table) and prints it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from harness import netem  # noqa: E402
from trainer.fileio import atomic_write_text  # noqa: E402
from trainer.tracking import git_sha  # noqa: E402


def measure(workers: int, rate: str, burst: int, mbytes: float, repeats: int, out: Path) -> list[float]:
    network = netem.VirtualNetwork(workers, rate)
    assert network.shape is not None
    network.shape = dataclasses.replace(network.shape, burst_bytes=burst)
    argv = [sys.executable, "-m", "pipelines.netbench", "--op", "all_reduce", "--mbytes", str(mbytes)]
    argv += ["--repeats", str(repeats), "--out", str(out)]
    with netem.terminate_as_exception(), network:
        code = netem.run_workers(network, argv, env={"PYTHONPATH": str(REPO)})
    if code != 0:
        raise SystemExit(f"netbench failed at {rate}, burst {burst} (exit {code})")
    return list(json.loads(out.read_text())["results"][0]["seconds"])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--mbytes", type=float, default=2.14)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--rates", nargs="+", default=["100mbit", "300mbit", "1gbit"])
    parser.add_argument("--bursts", type=int, nargs="+", default=[32768, 67037, 131072, 196608])
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    netem.check_support()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for burst in args.bursts:
            for rate in args.rates:
                seconds = measure(
                    args.workers, rate, burst, args.mbytes, args.repeats, Path(tmp) / "out.json"
                )
                nbytes = int(args.mbytes * 1e6) // 4 * 4
                ideal = 2 * (args.workers - 1) / args.workers * nbytes * 8 / netem.parse_rate(rate)
                median = statistics.median(seconds)
                rows.append(
                    f"| {burst:,} | {rate} | {1e3 * median:.1f} | {1e3 * ideal:.1f} | {median / ideal:.2f} |"
                )
                print(rows[-1], flush=True)
    text = (
        "# Ring all-reduce over tbf-shaped links against the bucket size\n\n"
        f"`python benchmarks/comm/bench_netem_burst.py` at git {git_sha()}: {args.workers} ranks, "
        f"{args.mbytes} MB all-reduce, median of {args.repeats}; ideal = 2 (p-1)/p x bytes / rate.\n\n"
        "| bucket (bytes) | rate | measured (ms) | ideal (ms) | measured / ideal |\n|---:|---|---:|---:|---:|\n"
        + "\n".join(rows)
        + "\n"
    )
    if not args.no_write:
        atomic_write_text(REPO / "benchmarks" / "results" / "netem_burst.md", text)
    print(text)


if __name__ == "__main__":
    main()
