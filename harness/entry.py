"""What every entry point (a pipeline's stage, a paper's script) does first: keep the process quiet
on the network and set up logging."""

from __future__ import annotations

import logging
import os
import sys

# Nothing is sent anywhere: DVC analytics and MLflow telemetry off in every entry point.
QUIET_ENV = {
    "DVC_NO_ANALYTICS": "1",
    "ITERATIVE_DO_NOT_TRACK": "1",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "true",
    "HF_HUB_OFFLINE": "1",
}


def quiet_environment() -> None:
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)


def setup_logging(rank: int = 0) -> None:
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
