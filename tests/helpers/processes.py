"""Run a command in its own process group and stop the whole group on every exit path."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence


def run_group(command: Sequence[str], *, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """Like ``subprocess.run(capture_output=True, text=True)``, but a timeout (or any error) kills
    the command's whole process group: torchrun's or dvc's workers included, by group id."""
    process = subprocess.Popen(
        list(command),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **kwargs,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    return subprocess.CompletedProcess(list(command), process.returncode, stdout, stderr)
