"""One launch per run folder: an exclusive lock taken before any worker starts.

Two launches on one folder would resume from each other's checkpoints and write each other's
outputs (tried: the second hung in a collective with the first's ranks). The launcher locks
``<folder>/.launch.lock`` with ``flock`` and keeps the descriptor open across its ``exec`` into
torchrun, so the lock lives exactly as long as the launch; the kernel drops it when the process
dies, however it dies (no stale lock to clean up). The file holds the holder's pid and command, for
the error a second launch gets.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import time
from collections.abc import Iterable
from pathlib import Path

LOCK_NAME = ".launch.lock"


class RunFolderBusy(ValueError):
    """Another launch holds the folder's lock."""


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        info = {}
    if not info.get("pid"):
        return "another launch"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.get("started", 0)))
    return f"launch pid {info['pid']} (started {started}: {info.get('command', '?')})"


def lock_run_folders(folders: Iterable[str | os.PathLike[str]], *, inheritable: bool = True) -> list[int]:
    """Lock every folder for this process (and, if ``inheritable``, what it ``exec``s); return the fds.

    Raises :class:`RunFolderBusy` naming the holder if any folder is locked by another launch;
    then nothing stays locked.
    """
    fds: list[int] = []
    try:
        for folder in dict.fromkeys(Path(f).resolve() for f in folders):
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / LOCK_NAME
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            fds.append(fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise RunFolderBusy(
                    f"run folder {folder} is in use by {_holder(path)}: one launch trains a folder at a "
                    "time. Wait for it to finish, stop it, or pass another --out"
                ) from None
            record = {"pid": os.getpid(), "started": time.time(), "command": " ".join(sys.argv)}
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
            if inheritable:
                os.set_inheritable(fd, True)
    except BaseException:
        release(fds)
        raise
    return fds


def release(fds: Iterable[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)  # closing the last descriptor of the open file drops its flock
