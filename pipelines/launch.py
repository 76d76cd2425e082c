"""Validate a run's parameters, then start its ranks with torchrun (the DVC ``train`` stage).

    python -m pipelines.launch baseline fp32

Bad parameters fail here, before any worker starts. The process then *becomes* torchrun
(``exec``), so Ctrl-C and DVC's signals reach torchrun, which stops its workers. A worker that
dies is restarted up to ``max_restarts`` times and resumes from the last checkpoint.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

from common.data import load_dataset
from pipelines.common import quiet_environment, run_config


def torchrun_command(pipeline: str, run: str, scale: str | None, nproc: int, max_restarts: int) -> list[str]:
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or shutil.which("torchrun")
    if torchrun is None:
        raise SystemExit("torchrun not found next to this python or on PATH: run `make setup` first")
    command = [
        torchrun,
        "--standalone",
        f"--nproc_per_node={nproc}",
        f"--max-restarts={max_restarts}",
        "-m",
        "pipelines.train",
        # positional: torchrun's own parser would take `--run` for an abbreviation of `--run-path`
        pipeline,
        run,
    ]
    return command + (["--scale", scale] if scale else [])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("pipeline", help="a folder of pipelines/ with a params.yaml")
    parser.add_argument("run", help="a key of that params.yaml's `runs`")
    parser.add_argument("--scale", default=None, help="override params.yaml's `scale`")
    args = parser.parse_args(argv)
    quiet_environment()
    try:
        config = run_config(args.pipeline, args.run, args.scale)
        # Missing or corrupt data fails here, once, not in every rank; a cold cache is filled now.
        load_dataset(config.dataset, "test", limit=1, seq_len=config.seq_len)
    except ValueError as error:  # DataError is a ValueError
        raise SystemExit(f"error: {error}") from None
    command = torchrun_command(args.pipeline, args.run, args.scale, config.world_size, config.max_restarts)
    for key, value in RESTART_SAFE_ENV.items():
        os.environ.setdefault(key, value)
    sys.stdout.flush()
    os.execv(command[0], command)


# torchrun (2.5+) shares its rendezvous TCPStore with the workers' init_process_group; after a
# restart the workers then read the previous attempt's gloo addresses and fail to connect
# ("Gloo connectFullMesh failed ... Connection refused"; pytorch/pytorch issue 135712).
RESTART_SAFE_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


if __name__ == "__main__":
    main()
