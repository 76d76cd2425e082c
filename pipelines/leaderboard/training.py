"""The leaderboard's settings and its runs: every method trained up to 2x fp32's steps.

Each method's suite run (``<task>_<method>``, the suite's recipe) is trained again with its schedule
stretched ``stage.stretch`` times (the launcher's ``--stretch``: epochs, warm-up and max_steps), so
that a method slower per step than fp32 may take up to twice fp32's steps, and stops at its first
evaluation at fp32's target (``--stop-at``). A run that ends without reaching it is "not within 2x
steps". The runs are grouped so that each group is one DVC stage (root ``dvc.yaml``:
``leaderboard_train@<group>``) short enough for one sitting:

- ``<measured_task>_<rate>``: the measured task over links shaped to each rate of
  ``stage.bandwidths``, every seed (one network namespace per rank);
- ``<task>_s<seed>_<part>``: each modelled task, unshaped, one seed per group and at most
  ``stage.group_runs`` methods (parts ``a``, ``b``, ... in the order of ``stage.methods``; no part
  suffix when one group holds them all). The modelled time is the steps it took x the cost model's
  step at each rate;
- ``spot_<rate>``: ``stage.spot_checks``, modelled runs measured over shaped links too (seed 0).

Runs land in ``results/leaderboard/runs/<group>/<task>_<method>/seed<k>/``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from harness import costmodel
from harness.claims import suite_tasks
from harness.folders import artifacts_for
from harness.params import load_params

PIPELINE = "leaderboard"
log = logging.getLogger(PIPELINE)


@dataclasses.dataclass(frozen=True)
class Settings:
    tasks: list[str]
    methods: list[str]
    measured_task: str
    bandwidths: list[str]
    spot_checks: list[tuple[str, str]]  # (run, rate)
    accuracy_points: float
    loss_nats: float
    extrapolation: dict[str, Any]
    stretch: int = 2  # every method may train up to this many times fp32's steps
    seeds: tuple[int, ...] = (0, 1, 2)
    group_runs: int | None = None  # the most methods in one modelled task's group (None: all)


@dataclasses.dataclass(frozen=True)
class Group:
    """One leaderboard_train stage: ``runs`` x ``seeds``, over links shaped to ``rate`` (None: unshaped)."""

    task: str
    runs: list[str]
    seeds: tuple[int, ...]
    rate: str | None


def settings(suite_runs: list[str], overrides: dict[str, Any] | None = None) -> Settings:
    """The stage's settings (``overrides`` on top: the command line's), checked against the suite's
    runs, so a typo fails before anything runs."""
    stage = dict(load_params(PIPELINE).get("stage") or {})
    stage.update({k: v for k, v in (overrides or {}).items() if v is not None})
    tasks = list(stage.get("tasks") or suite_tasks())
    unknown = sorted(set(tasks) - set(suite_tasks()))
    if unknown:
        raise ValueError(
            f"stage.tasks: unknown task(s) {', '.join(unknown)}; the suite's: {', '.join(suite_tasks())}"
        )
    methods = list(stage.get("methods") or [])
    for task in tasks:
        missing = [m for m in methods if f"{task}_{m}" not in suite_runs]
        if missing:
            raise ValueError(f"stage.methods {', '.join(missing)} have no {task}_<method> run in the suite")
    if "fp32" not in methods:
        raise ValueError("stage.methods must include fp32 (the target is fp32's converged metric)")
    measured = str(stage.get("measured_task", tasks[0]))
    if measured not in tasks:
        raise ValueError(f"stage.measured_task {measured!r} is not among stage.tasks ({', '.join(tasks)})")
    rates = [str(r) for r in stage.get("bandwidths") or []]
    for rate in rates:
        costmodel.parse_rate(rate)
    spots = []
    for item in stage.get("spot_checks") or []:
        run, _, rate = str(item).partition("@")
        if run not in suite_runs or not rate or run.split("_", 1)[0] not in tasks:
            raise ValueError(
                f"stage.spot_checks {item!r}: expected <suite run of a ranked task>@<rate>, e.g. cifar_fp32@100mbit"
            )
        costmodel.parse_rate(rate)
        spots.append((run, rate))
    stretch, seeds = stage.get("stretch", 2), [int(s) for s in stage.get("seeds") or [0]]
    if isinstance(stretch, bool) or not isinstance(stretch, int) or stretch < 1:
        raise ValueError(
            f"stage.stretch must be a positive integer (2: up to 2x fp32's steps), got {stretch!r}"
        )
    if len(set(seeds)) != len(seeds) or any(s < 0 for s in seeds):
        raise ValueError(f"stage.seeds must be distinct non-negative integers, got {seeds}")
    group_runs = stage.get("group_runs")
    if group_runs is not None and (
        isinstance(group_runs, bool) or not isinstance(group_runs, int) or group_runs < 1
    ):
        raise ValueError(
            f"stage.group_runs must be a positive integer (the most methods in one modelled group) or "
            f"absent (all in one), got {group_runs!r}"
        )
    target = dict(stage.get("target") or {})
    return Settings(
        tasks=tasks,
        methods=methods,
        measured_task=measured,
        bandwidths=rates,
        spot_checks=spots,
        accuracy_points=float(target.get("accuracy_points", 0.5)),
        loss_nats=float(target.get("loss_nats", math.log(1.02))),
        extrapolation=dict(stage.get("extrapolation") or {}),
        stretch=stretch,
        seeds=tuple(seeds),
        group_runs=group_runs,
    )


def groups(cfg: Settings) -> dict[str, Group]:
    """Every group of runs the stage trains, by name (see the module docstring), in training order."""
    out: dict[str, Group] = {}
    for task in cfg.tasks:
        runs = [f"{task}_{m}" for m in cfg.methods]
        if task == cfg.measured_task:
            out |= {f"{task}_{rate}": Group(task, runs, cfg.seeds, rate) for rate in cfg.bandwidths}
        else:
            size = cfg.group_runs or len(runs)
            parts = [runs[i : i + size] for i in range(0, len(runs), size)]
            for seed in cfg.seeds:
                for index, part in enumerate(parts):
                    name = f"{task}_s{seed}" + (f"_{chr(ord('a') + index)}" if len(parts) > 1 else "")
                    out[name] = Group(task, part, (seed,), None)
    for rate in dict.fromkeys(rate for _, rate in cfg.spot_checks):
        spots = [run for run, r in cfg.spot_checks if r == rate]
        out[f"spot_{rate}"] = Group(spots[0].split("_", 1)[0], spots, (cfg.seeds[0],), rate)
    return out


def modelled_group(cfg: Settings, run: str, seed: int) -> str:
    """The name of the unshaped group that trains ``run`` at ``seed`` (a modelled task's run)."""
    for name, group in groups(cfg).items():
        if group.rate is None and run in group.runs and seed in group.seeds:
            return name
    raise ValueError(f"no unshaped leaderboard group trains {run} at seed {seed}")


def stop_at(task: str, target: float) -> str:
    """The launcher's ``--stop-at`` for a task's target: a run ends where it reaches it."""
    if suite_tasks()[task]["metric"] == "accuracy":
        return f"test_accuracy={target / 100!r}"
    return f"test_loss={target!r}"


def launch_group(group: Group, stretch: int, out: Path, scale: str | None, stop: str) -> None:
    """The group's suite runs, stretched, in one launch (shaped to its rate, if any) into ``out``,
    each ending at its first evaluation past the target (``stop``): time to target needs no step
    beyond it, and a run that never reaches it runs its whole stretched length."""
    if len({r.split("_", 1)[0] for r in group.runs}) != 1:
        raise ValueError(f"a group's runs share one task (its target): {', '.join(group.runs)}")
    # Always a fresh measurement: a complete checkpoint from an earlier code version is never resumed,
    # but a partial one would be; the folder is this stage's own output.
    for run in group.runs:
        for seed in group.seeds:
            shutil.rmtree(artifacts_for(out / run / f"seed{seed}") / "ckpt", ignore_errors=True)
    seeds = ",".join(str(s) for s in group.seeds)
    command = [sys.executable, "-m", "pipelines.launch", "suite", ",".join(group.runs), "--seeds", seeds]
    command += ["--stretch", str(stretch), "--out", str(out), "--stop-at", stop]  # <out>/<run>/seed<k>
    command += ["--net-bandwidth", group.rate] if group.rate else []
    command += ["--scale", scale] if scale else []
    log.info("%s, seeds %s, at %s", ",".join(group.runs), seeds, group.rate or "host speed")
    process = subprocess.Popen(command)
    try:
        code = process.wait()
    except BaseException:  # Ctrl-C / SIGTERM: the launcher tears its namespaces down; wait for it
        process.terminate()
        process.wait()
        raise
    if code != 0:
        raise SystemExit(
            f"leaderboard runs {', '.join(group.runs)} failed (exit {code}); earlier runs are kept"
        )
