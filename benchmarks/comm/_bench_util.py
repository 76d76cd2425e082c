"""Helpers shared by the communication benchmarks (process group, timing statistics, CSV rows).

Not a library module: imported by ``bench_collectives.py`` and ``bench_sync_overhead.py`` from this
folder (torchrun puts the script's folder first on ``sys.path``).
"""

from __future__ import annotations

import csv
import datetime as dt
import os
import statistics
import subprocess
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"


def init_gloo() -> tuple[int, int]:
    """Join the torchrun process group on gloo with one intra-op thread per rank (2-core machines)."""
    if "RANK" not in os.environ:
        raise SystemExit("launch with torchrun, e.g. torchrun --standalone --nproc_per_node 2 <script>")
    # torchrun sets OMP_NUM_THREADS=1 already; set it anyway for other launchers (mpirun, a debugger).
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def log0(message: str) -> None:
    """Progress line from rank 0 only."""
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(message, flush=True)


def git_sha() -> str:
    """The commit of the code this process loaded (read once, at import: a commit landing while a
    benchmark runs does not relabel what it measured)."""
    return _LOADED_SHA


def _head_sha() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        )
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def now_iso() -> str:
    """UTC timestamp (seconds); every row of one run carries the same one, so it names the run."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def max_over_ranks(seconds: Sequence[float]) -> list[float]:
    """Elementwise max over ranks: a collective or a step is done when its slowest rank is."""
    t = torch.tensor(list(seconds), dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """(q1, median, q3); with fewer than two values all three are that value."""
    if len(values) < 2:
        return (values[0],) * 3 if values else (float("nan"),) * 3
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def append_rows(path: Path, columns: Sequence[str], rows: Sequence[dict[str, object]]) -> None:
    """Append ``rows`` to the CSV at ``path``, writing the header when the file is new.

    An existing file with another header is an error rather than a silently misaligned table.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.stat().st_size > 0:
        with path.open(newline="") as f:
            header = next(csv.reader(f))
        if header != list(columns):
            raise ValueError(f"{path} has columns {header}, expected {list(columns)}; move it aside")
        mode = "a"
    else:
        mode = "w"
    with path.open(mode, newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns))
        if mode == "w":
            writer.writeheader()
        writer.writerows(rows)


def read_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def write_markdown(name: str, lines: Sequence[str], *, no_write: bool) -> None:
    """A benchmark's table into ``benchmarks/results/<name>`` (not with ``--no-write``)."""
    if not no_write:
        (RESULTS_DIR / name).write_text("\n".join(lines) + "\n")


_LOADED_SHA = _head_sha()
