"""MATCHA's clocks: each run's training-loss curve per seed, its time (measured or modelled), and
the time two runs take to a training loss both of them reach.

Training loss: the mean over ranks of each rank's loss on its own batches (each rank its own model),
averaged over the run's logging interval, then a trailing mean over ``SMOOTH`` logged points.

Time is one of two clocks, and every table and panel says which:

- **measured** (``wall``): the runs' own training wall clock (rank 0, evaluation excluded), when the
  task ran on links shaped with tc (``run.json`` names the rate, e.g. ``100mbit``);
- **modelled**: the paper's model ``T(k) = k t_comp + R(k) t_round`` (``R(k)``: exchange rounds up
  to step k, one per active matching, counted by the run), with ``t_round`` the calibrated cost
  model's time for one point-to-point message of the model at the same rate and ``t_comp`` the
  median compute time per step of the seed's runs (wall minus communication). Centralized SGD:
  ``k (t_comp + t_allreduce)``, the model's time for the step's all-reduces (one per parameter
  tensor, as the run made them).

The target of a comparison (one seed, two runs): the higher of the two runs' final smoothed losses
plus ``TARGET_SLACK`` (2 %: every run has the same one-cycle schedule, so a budgeted run ends near
vanilla's loss, not below it). Both runs reach it by construction (each at the latest at its last
step), so every seed gives both a time and a claim over seeds always has its interval; where the run
ends at or below vanilla's loss the target is vanilla's final loss + 2 % (release 1's). A run's time
to it is its first logged step at or below it.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from harness.claims import Runs
from harness.costmodel import LinkParams, collective_time

SMOOTH = 4  # logged points in the trailing mean
TARGET_SLACK = 0.02  # the target: the higher final smoothed training loss of the two + 2 %
WORLD = 8  # MATCHA's runs: 8 workers


def number(value: float | None) -> float:
    """A metric, NaN where the run has none (JSON writes NaN as null)."""
    return float("nan") if value is None else float(value)


def smooth(values: list[float], width: int = SMOOTH) -> list[float]:
    """Trailing mean over ``width`` points (fewer at the start)."""
    return [statistics.fmean(values[max(0, i + 1 - width) : i + 1]) for i in range(len(values))]


def curve(run: str, seed: int, files: dict[str, Any]) -> dict[str, Any]:
    """One seed of ``run`` (:func:`harness.claims.load_runs`'s files) as the curves the clocks read."""
    info, metrics, train = files["info"], files["metrics"], files["train"]
    ops = info["comm_ops_per_step"]
    op = "send" if "send" in ops else "all_reduce"
    calls, nbytes = ops[op]
    options = info["config"]["strategy_options"]
    mode = options.get("mode", "centralized")
    return {
        "run": run,
        "seed": seed,
        "mode": mode,
        "budget": options.get("budget", 1.0) if mode in ("matcha", "periodic") else 1.0,
        "network": info["network"],
        "steps": [int(r["step"]) for r in train],
        "loss": smooth([r["train_loss"] for r in train]),
        "wall": [r["wall_seconds"] for r in train],
        "comm": [r["communicate_seconds"] for r in train],
        "rounds": [r.get("gossip_rounds", 0.0) for r in train],
        "op": op,
        "calls": calls,  # per step (rank 0): gossip one message of the whole model per exchange,
        "bytes": nbytes,  # centralized one all-reduce per parameter tensor
        "message_bytes": nbytes / calls if calls else 0.0,
        "metrics": metrics,
        "mlflow_run_id": info["mlflow_run_id"],
        "git_sha": info["git_sha"],
    }


def compute_per_step(run: dict[str, Any]) -> float:
    """Seconds per step outside communication (rank 0's wall minus its communication)."""
    return (run["wall"][-1] - run["comm"][-1]) / run["steps"][-1]


def modelled_times(run: dict[str, Any], t_comp: float, params: LinkParams, rate: float) -> list[float]:
    if run["mode"] == "centralized":
        t_reduce = collective_time("all_reduce", WORLD, run["bytes"], rate, params, calls=run["calls"])
        return [k * (t_comp + t_reduce) for k in run["steps"]]
    t_round = collective_time("send", WORLD, run["message_bytes"], rate, params)
    return [k * t_comp + r * t_round for k, r in zip(run["steps"], run["rounds"], strict=True)]


def first_reach(
    loss: list[float], times: list[float], steps: list[int], target: float
) -> tuple[int, float] | None:
    for step, value, t in zip(steps, loss, times, strict=True):
        if value <= target:
            return step, t
    return None


def common_target(a: dict[str, Any], b: dict[str, Any]) -> float:
    """The loss both runs reach: the higher of their final smoothed losses + ``TARGET_SLACK``."""
    return max(a["loss"][-1], b["loss"][-1]) * (1 + TARGET_SLACK)


def reach(run: dict[str, Any], target: float, clock: str) -> tuple[int, float]:
    """The first logged step and time (``clock``: ``wall`` or ``modelled``) at or below ``target``."""
    hit = first_reach(run["loss"], run[clock], run["steps"], target)
    if hit is None:
        raise ValueError(
            f"{run['run']} seed {run['seed']} never reaches the loss {target:.4f} (its final smoothed "
            f"loss is {run['loss'][-1]:.4f}): a target must be at or above both runs' final losses"
        )
    return hit


def times_to(a: dict[str, Any], b: dict[str, Any], clock: str) -> tuple[float, float, float]:
    """The common target of ``a`` and ``b`` (one seed each) and the time each takes to it."""
    target = common_target(a, b)
    return target, reach(a, target, clock)[1], reach(b, target, clock)[1]


def seed_curves(
    names: list[str], runs: Runs, params: LinkParams, rate: float, measured_rate: str
) -> tuple[dict[int, dict[str, dict[str, Any]]], bool]:
    """seed -> run -> its curves with the ``modelled`` clock added (``t_comp``: the median over the
    seed's runs), and whether every run of every seed was measured on links shaped at
    ``measured_rate``. Every run must have the same seeds (a comparison pairs them)."""
    missing = [n for n in names if n not in runs]
    if missing:
        raise SystemExit(
            f"error: no results for {', '.join(missing)}: run `dvc repro pipelines/matcha/dvc.yaml`"
        )
    seeds = sorted(runs[names[0]])
    for name in names:
        if sorted(runs[name]) != seeds:
            raise SystemExit(
                f"error: {name} has seeds {sorted(runs[name])}, {names[0]} has {seeds}: every run of a "
                "task needs the same seeds (each comparison pairs them)"
            )
    out: dict[int, dict[str, dict[str, Any]]] = {}
    for seed in seeds:
        curves = {n: curve(n, seed, runs[n][seed]) for n in names}
        bad = [n for n, c in curves.items() if not c["loss"] or not math.isfinite(c["loss"][-1])]
        if bad:
            raise SystemExit(f"error: seed {seed} of {', '.join(bad)} ended with no finite training loss")
        t_comp = statistics.median(compute_per_step(c) for c in curves.values())
        for c in curves.values():
            c["t_comp"] = t_comp
            c["modelled"] = modelled_times(c, t_comp, params, rate)
        out[seed] = curves
    measured = all(c["network"] == measured_rate for s in out.values() for c in s.values())
    return out, measured
