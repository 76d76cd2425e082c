"""A pipeline stage (``runs_module: tests.helpers.faulty_stage``) with two faults, for the launcher.

Its run diverges: lr 1e12 makes the loss NaN within a few steps, found at the first log (step 6),
an error a restart cannot fix. Before that, the first time only (a marker file in the run folder
remembers it), rank 1 SIGKILLs itself at step 1, a failure a restart does fix. So a launch must
restart once, then stop at the NaN however many restarts it has left.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from common.config import RunConfig
from tests.helpers.train_once import CONFIG
from trainer import StepInfo, train

KILL_AT_STEP = 1
MAX_RESTARTS = 3


def stage_config(run: str, scale: str | None, inputs: Path) -> RunConfig:
    return RunConfig.from_dict(
        {**CONFIG, "lr": 1e12, "epochs": 1, "num_logs": 4, "num_evaluations": 1, "max_restarts": MAX_RESTARTS}
    )


def train_run(
    config: RunConfig, out_dir: str | Path, *, callbacks: list[Any], **arguments: Any
) -> dict[str, float]:
    marker = Path(out_dir) / "killed-once"

    def kill_once(info: StepInfo) -> None:
        if info.rank == 1 and info.step == KILL_AT_STEP and not marker.exists():
            marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)

    for unused in ("run", "scale", "inputs", "experiment"):  # no paper stage, no MLflow: a quick start
        arguments.pop(unused, None)
    return train(config, out_dir, callbacks=[*callbacks, kill_once], **arguments)
