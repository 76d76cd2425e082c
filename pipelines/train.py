"""One training run, on every rank (started by ``pipelines.launch`` through torchrun).

    torchrun --standalone --nproc_per_node 4 -m pipelines.train baseline fp32

Writes ``results/<pipeline>/<run>/`` (metrics.json, curves, plot.png, run.json, ckpt/) and logs
to MLflow (experiment = pipeline, run name = run). The launcher may redirect both through the
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

from common.config import RunConfig
from common.distributed import init_from_env, shutdown
from common.train import StepInfo, train
from pipelines.common import load_params, quiet_environment, run_config, run_dir, setup_logging

OUT_DIR_ENV = "THINWIRE_OUT_DIR"
RUN_NAME_ENV = "THINWIRE_RUN_NAME"
SEED_ENV = "THINWIRE_SEED"  # overrides the run's seed (repeated runs of one configuration)
SEEDS_ENV = "THINWIRE_SEEDS"  # several seeds, one after the other: <out>/seed<k>, <run name>-seed<k>


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2"`` -> ``[0, 1, 2]``; distinct non-negative integers, at least one."""
    try:
        seeds = [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"--seeds {text!r}: expected comma-separated integers, e.g. 0,1,2") from None
    if any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds {text!r}: seeds must be distinct non-negative integers")
    return seeds


def resolve_config(pipeline: str, run: str, scale: str | None) -> RunConfig:
    """The run's config with the launcher's overrides (seed) applied."""
    config = run_config(pipeline, run, scale)
    seed = os.environ.get(SEED_ENV)
    return dataclasses.replace(config, seed=int(seed)) if seed else config


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
        if info.step == info.total_steps:
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
    config = resolve_config(args.pipeline, args.run, args.scale)
    scale = args.scale or load_params(args.pipeline)["scale"]
    out_dir = os.environ.get(OUT_DIR_ENV) or run_dir(args.pipeline, args.run)
    run_name = os.environ.get(RUN_NAME_ENV) or args.run
    seeds = os.environ.get(SEEDS_ENV)
    repeats = (
        [
            (dataclasses.replace(config, seed=s), os.path.join(out_dir, f"seed{s}"), f"{run_name}-seed{s}")
            for s in parse_seeds(seeds)
        ]
        if seeds
        else [(config, out_dir, run_name)]
    )
    ctx = init_from_env()
    try:
        for repeat_config, repeat_dir, repeat_name in repeats:
            callbacks = [progress_bar()] if ctx.is_main else []
            metrics = train(
                repeat_config,
                repeat_dir,
                experiment=args.pipeline,
                run_name=repeat_name,
                tags={"scale": scale, "pipeline": args.pipeline, "method": args.run},
                callbacks=callbacks,
                ctx=ctx,
            )
            if ctx.is_main:
                print(json.dumps({"run": repeat_name, **metrics}, indent=2))
    finally:
        shutdown()


if __name__ == "__main__":
    main()
