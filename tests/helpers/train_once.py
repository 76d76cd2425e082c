"""A small training run for the resume tests, started by torchrun.

    torchrun --standalone --nproc_per_node 2 --max-restarts 1 tests/helpers/train_once.py OUT [--kill-at STEP]

With ``--kill-at``, rank 1 SIGKILLs itself at that step the first time (a marker file in OUT
remembers it), so torchrun restarts both ranks and they resume from the last checkpoint. With
``--hang-at``, rank 1 sleeps there the first time (a hung peer): rank 0 gives up after
``--timeout`` seconds in its next collective, and torchrun restarts both. ``--epochs`` makes the
run longer (a different run). ``--world-size`` runs it on more ranks, ``--data-workers`` decodes through a DataLoader. With ``--kill-host-at`` the
last rank SIGKILLs its torchrun agent and itself there the first time: a lost host (its other ranks
die with the agent), for the emulated-cluster tests (``harness.netem.run_hosts``).
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

from common.config import RunConfig
from trainer import StepInfo, train
from trainer.checks import checked_config
from trainer.distributed import shutdown

CONFIG = {
    "dataset": "mnist",
    "model": "mlp",
    "model_options": {"hidden_sizes": [32]},
    # shared-index random-k draws from the shared generator and keeps a residual: resuming must
    # restore both exactly for the final parameters to match.
    "compressor": "randomk",
    "compressor_options": {"density": 0.1, "scaled": False},
    "error_feedback": True,
    "train_limit": 768,
    "eval_limit": 128,
    "batch_size": 16,
    "epochs": 2,
    "lr": 0.05,
    "log_every": 4,
    "eval_every": 12,
    "checkpoint_every": 8,
    "world_size": 2,
}


def config() -> RunConfig:
    return checked_config(CONFIG)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--kill-at", type=int, default=None)
    parser.add_argument("--hang-at", type=int, default=None)
    parser.add_argument("--timeout", type=float, default=None, help="collective_timeout_s")
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--world-size", type=int, default=None)
    parser.add_argument("--kill-host-at", type=int, default=None)
    parser.add_argument("--data-workers", type=int, default=None)
    args = parser.parse_args()
    out = Path(args.out)

    def maybe_die(info: StepInfo) -> None:
        host_marker = out / "host-killed-once"
        if (
            info.rank == int(os.environ["WORLD_SIZE"]) - 1
            and info.step == args.kill_host_at
            and not host_marker.exists()
        ):
            host_marker.parent.mkdir(parents=True, exist_ok=True)
            host_marker.touch()
            os.kill(os.getppid(), signal.SIGKILL)  # the agent: the host's other ranks die with it
            os.kill(os.getpid(), signal.SIGKILL)
        if info.rank != 1:
            return
        for step, marker in ((args.kill_at, out / "killed-once"), (args.hang_at, out / "hung-once")):
            if info.step == step and not marker.exists():
                marker.parent.mkdir(parents=True, exist_ok=True)
                marker.touch()
                if step == args.kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(3600)  # hung: torchrun's SIGTERM ends it once rank 0 has failed

    overrides = {
        "collective_timeout_s": args.timeout,
        "epochs": args.epochs,
        "world_size": args.world_size,
        "data_workers": args.data_workers,
    }
    run = checked_config({**CONFIG, **{k: v for k, v in overrides.items() if v is not None}})
    try:
        train(run, out, callbacks=[maybe_die])
    finally:
        shutdown()


if __name__ == "__main__":
    main()
