"""TernGrad's performance model: training throughput against workers, bandwidth and compute.

The paper models an iteration as measured compute plus the time to move the gradients (message
bytes over bandwidth, parameter-server or all-reduce pattern) and shows TernGrad's advantage
growing with workers and shrinking with bandwidth. Here every input is measured: per-step compute
(the slowest rank's, per step) and per-step traffic by collective come from our runs
(``results/terngrad/runs``), and the link parameters (alpha, efficiency, gamma) from the cost-model
calibration over tc-shaped links (``results/costmodel/fit.json``). TernGrad's codes can travel
either way, so each point takes the cheaper: all-gather of 2-bit codes ((W-1) x contribution) or a
ring all-reduce of int8 code sums (2 (W-1)/W x one byte per element).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness import costmodel

WORKERS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


@dataclass(frozen=True)
class Measured:
    """One run's per-step numbers, as measured at ``p`` workers."""

    name: str
    p: int
    batch_per_rank: int
    compute_seconds: float  # forward + backward + optimizer + compression, slowest rank per step
    ops: Mapping[str, tuple[float, float]]  # op -> (calls, bytes) per step per rank
    numel: int  # gradient entries per step (dense_bits / 32)


def measured(name: str, metrics: Mapping[str, Any], run: Mapping[str, Any]) -> Measured:
    steps = float(metrics["steps"])
    return Measured(
        name=name,
        p=int(metrics["world_size"]),
        batch_per_rank=int(run["config"]["batch_size"]),
        compute_seconds=float(metrics["sync_compute_seconds"]) / steps,
        ops={op: (float(c), float(b)) for op, (c, b) in run["comm_ops_per_step"].items()},
        numel=round(float(metrics["dense_bits_per_step"]) / 32),
    )


def ternary_routes(m: Measured) -> list[dict[str, tuple[float, float]]]:
    """TernGrad's two ways to move its codes, from what was measured over one of them."""
    scalers = {"all_reduce": m.ops["all_reduce"]} if "all_reduce" in m.ops else {}
    codes_allgather = {**scalers, **{k: v for k, v in m.ops.items() if k.startswith("all_gather")}}
    calls, nbytes = scalers.get("all_reduce", (0.0, 0.0))
    code_sums = {"all_reduce": (calls + 1.0, nbytes + m.numel)}  # int8: one byte per element
    return [codes_allgather, code_sums]


def step_seconds(m: Measured, p: int, rate_bps: float, params: costmodel.LinkParams, ternary: bool) -> float:
    routes = ternary_routes(m) if ternary else [dict(m.ops)]
    comm = min(costmodel.comm_time(ops, p, rate_bps, params) for ops in routes)
    return m.compute_seconds + comm


def throughput_table(
    runs: Sequence[tuple[Measured, bool]],
    params: costmodel.LinkParams,
    rates: Sequence[float],
    workers: Sequence[int] = WORKERS,
) -> list[dict[str, Any]]:
    """Samples per second (global batch / step time) for each run, rate and worker count."""
    rows = []
    for m, ternary in runs:
        for rate in rates:
            for p in workers:
                seconds = step_seconds(m, p, rate, params, ternary)
                rows.append(
                    {
                        "run": m.name,
                        "rate_bps": rate,
                        "workers": p,
                        "step_seconds": seconds,
                        "samples_per_second": p * m.batch_per_rank / seconds,
                    }
                )
    return rows


def plot(rows: Sequence[Mapping[str, Any]], path: Any, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from trainer.fileio import atomic_write

    tasks = sorted({str(r["run"]).split("_")[0] for r in rows})
    fig, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4.5), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        for run in sorted({r["run"] for r in rows if str(r["run"]).startswith(task)}):
            for rate in sorted({r["rate_bps"] for r in rows}):
                pts = [r for r in rows if r["run"] == run and r["rate_bps"] == rate]
                ax.plot(
                    [r["workers"] for r in pts],
                    [r["samples_per_second"] for r in pts],
                    marker="o",
                    ls="-" if "terngrad" in run else "--",
                    label=f"{run}, {costmodel.format_rate(rate)}",
                )
        ax.set(xscale="log", yscale="log", xlabel="workers", ylabel="modelled samples / s", title=task)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    atomic_write(path, lambda p: fig.savefig(p, format="png", dpi=110))
    plt.close(fig)
