"""One training run, on every rank (started by ``pipelines.launch`` through torchrun).

    torchrun --standalone --nproc_per_node 4 -m pipelines.train baseline fp32

Writes ``scratch/<pipeline>/<run>/`` (metrics.json, curves, plot.png, run.json, ckpt/) and logs
to MLflow (run name = run; experiment = pipeline for a run under ``results/``, a DVC stage's, and
``scratch-<pipeline>`` for any other folder: a hand run never lands among a release's runs). The launcher may redirect both through the
environment (``THINWIRE_OUT_DIR``, ``THINWIRE_RUN_NAME``): torchrun would mistake options after
the module name for its own.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from common.config import RunConfig, check_stop_at
from harness.entry import quiet_environment, setup_logging
from harness.failures import recorded
from harness.folders import RESULTS_DIR, artifacts_for, pipeline_name, scratch_dir
from harness.params import STRETCHED, load_params, stretched
from pipelines.common import inputs_dir, run_config, run_stage
from trainer import StepInfo, train
from trainer.distributed import init_from_env, shutdown
from trainer.tracking import experiment_for

OUT_DIR_ENV = "THINWIRE_OUT_DIR"
RUN_NAME_ENV = "THINWIRE_RUN_NAME"
SEED_ENV = "THINWIRE_SEED"  # overrides the run's seed (repeated runs of one configuration)
SEEDS_ENV = "THINWIRE_SEEDS"  # several seeds, one after the other: <out>/<run>/seed<k>, <run>-seed<k>
STOP_AT_ENV = "THINWIRE_STOP_AT"  # "test_accuracy=0.99": every run of the launch ends at that target
STRETCH_ENV = "THINWIRE_STRETCH"  # "2": every run of the launch twice as long, its schedule stretched


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2"`` -> ``[0, 1, 2]``; distinct non-negative integers, at least one."""
    try:
        seeds = [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"--seeds {text!r}: expected comma-separated integers, e.g. 0,1,2") from None
    if any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds {text!r}: seeds must be distinct non-negative integers")
    return seeds


def parse_stop_at(text: str) -> dict[str, float]:
    """``"test_accuracy=0.99"`` -> ``{"test_accuracy": 0.99}`` (checked as RunConfig.stop_at)."""
    name, sep, value = text.partition("=")
    try:
        stop_at = {name.strip(): float(value)} if sep else {}
    except ValueError:
        stop_at = {}
    if not stop_at:
        raise ValueError(
            f"--stop-at {text!r}: expected METRIC=VALUE, e.g. test_accuracy=0.99 or test_loss=1.6"
        )
    check_stop_at(stop_at)
    return stop_at


def parse_stretch(text: str) -> int:
    """``"2"`` -> 2: how many times as long every run of a launch trains (a positive integer)."""
    try:
        factor = int(text)
    except ValueError:
        factor = 0
    if factor < 1:
        raise ValueError(f"--stretch {text!r}: expected a positive integer, e.g. 2 (twice the epochs)")
    return factor


def stretch_config(config: RunConfig, factor: int) -> RunConfig:
    """``config`` trained ``factor`` times as long, its schedule stretched (harness.params.stretched)."""
    length = stretched({key: getattr(config, key) for key in STRETCHED}, factor)
    return dataclasses.replace(config, **length)


def resolve_config(pipeline: str, run: str, scale: str | None) -> RunConfig:
    """The run's config with the launcher's overrides (stretch, seed, stop_at) applied."""
    config = run_config(pipeline, run, scale)
    seed = os.environ.get(SEED_ENV)
    stop_at = os.environ.get(STOP_AT_ENV)
    stretch = os.environ.get(STRETCH_ENV)
    if stretch:
        config = stretch_config(config, parse_stretch(stretch))
    if seed:
        config = dataclasses.replace(config, seed=int(seed))
    return dataclasses.replace(config, stop_at=parse_stop_at(stop_at)) if stop_at else config


def parse_runs(text: str) -> list[str]:
    """``"a,b"`` -> ``["a", "b"]``: the runs one launch trains, one after the other."""
    runs = [part.strip() for part in text.split(",")]
    if not all(runs) or len(set(runs)) != len(runs):
        raise ValueError(f"runs {text!r}: expected distinct comma-separated run names, e.g. fp32,dgc")
    return runs


def plan_repeats(pipeline: str, run: str, scale: str | None) -> list[tuple[str, RunConfig, str, str]]:
    """(run, config, out dir, MLflow run name) of every training run one launch does, in order.

    One run without seeds: into ``$THINWIRE_OUT_DIR`` (default ``scratch/<pipeline>/<run>``,
    git-ignored: only DVC stages, which pass ``--out``, write under ``results/``), named
    ``$THINWIRE_RUN_NAME`` (default the run). Several runs (``a,b``), or any run with
    ``$THINWIRE_SEEDS``: each into ``<out>/<run>`` (default ``scratch/<pipeline>/<run>``), named
    after the run (one run: ``$THINWIRE_RUN_NAME`` if set); with seeds each of those gets
    ``/seed<k>`` and ``-seed<k>``. So a launch of one run and of several lay out the same
    ``<out>/<run>/seed<k>`` that the evaluate stage reads. All runs of a launch share its ranks: they
    must agree on ``world_size`` and ``max_restarts``.
    """
    runs = parse_runs(run)
    configs = {r: resolve_config(pipeline, r, scale) for r in runs}
    shapes = {(c.world_size, c.max_restarts) for c in configs.values()}
    if len(shapes) > 1:
        raise ValueError(
            f"runs {run!r} share one launch but differ in world_size/max_restarts "
            f"({', '.join(f'{r}: {c.world_size}/{c.max_restarts}' for r, c in configs.items())})"
        )
    out = os.environ.get(OUT_DIR_ENV)
    seeds = os.environ.get(SEEDS_ENV)
    if len(runs) == 1 and not seeds:
        (only,) = runs
        return [
            (
                only,
                configs[only],
                out or str(scratch_dir(pipeline, only)),
                os.environ.get(RUN_NAME_ENV) or only,
            )
        ]
    given = os.environ.get(RUN_NAME_ENV) if len(runs) == 1 else None
    targets = [
        (r, config, os.path.join(out, r) if out else str(scratch_dir(pipeline, r)), given or r)
        for r, config in configs.items()
    ]
    if not seeds:
        return targets
    return [
        (r, dataclasses.replace(config, seed=s), os.path.join(directory, f"seed{s}"), f"{name}-seed{s}")
        for r, config, directory, name in targets
        for s in parse_seeds(seeds)
    ]


def progress_bar() -> Callable[[StepInfo], None]:
    """A tqdm bar for rank 0, created at the first step (when the total is known)."""
    from tqdm import tqdm

    bar = None

    def update(info: StepInfo) -> None:
        nonlocal bar
        if bar is None:  # initial > 0 when resumed from a checkpoint
            interval = 1 if sys.stderr.isatty() else 15
            bar = tqdm(
                total=info.total_steps, initial=info.step - 1, desc="train", unit="step", mininterval=interval
            )
        bar.update(1)
        if "train_loss" in info.logged:
            bar.set_postfix(loss=f"{info.logged['train_loss']:.4f}", refresh=False)
        if info.last:
            bar.close()

    return update


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("pipeline", help="a folder of pipelines/ with a params.yaml")
    parser.add_argument("run", help="a key of that params.yaml's `runs`")
    parser.add_argument("--scale", default=None)
    args = parser.parse_args(argv)
    quiet_environment()
    rank = int(os.environ.get("RANK", "0"))
    setup_logging(rank)
    # an error a restart cannot fix (NaN, no intact checkpoint, a full or read-only disk, bad
    # options) is recorded for the launcher and exits with EXIT_NO_RETRY: it is not retried
    with recorded(rank):
        _run(args, rank)


def _run(args: argparse.Namespace, rank: int) -> None:
    scale = args.scale or load_params(args.pipeline)["scale"]
    repeats = plan_repeats(args.pipeline, args.run, args.scale)
    ctx = init_from_env(timeout_s=max(c.collective_timeout_s for _, c, _, _ in repeats))
    stage = run_stage(args.pipeline)  # a paper's own stage around the loop (sparse AxoNN's), or None
    try:
        for repeat_method, repeat_config, repeat_dir, repeat_name in repeats:
            callbacks = [progress_bar()] if ctx.is_main else []
            arguments: dict[str, Any] = {
                "experiment": experiment_for(pipeline_name(args.pipeline), repeat_dir, RESULTS_DIR),
                "run_name": repeat_name,
                "tags": {"scale": scale, "pipeline": pipeline_name(args.pipeline), "method": repeat_method},
                "callbacks": callbacks,
                "ctx": ctx,
            }
            arguments["artifacts_dir"] = str(artifacts_for(repeat_dir))  # results/ -> artifacts/
            if stage is None:
                metrics = train(repeat_config, repeat_dir, **arguments)
            else:
                inputs = inputs_dir(args.pipeline)
                metrics = stage.train_run(
                    repeat_config, repeat_dir, run=repeat_method, scale=args.scale, inputs=inputs, **arguments
                )
            if ctx.is_main:
                print(json.dumps({"run": repeat_name, **metrics}, indent=2))
    finally:
        shutdown()


if __name__ == "__main__":
    main()
