"""A real small filesystem for disk faults: a tmpfs of a given size (full disk) or read-only.

Needs root (``mount``); otherwise the test is skipped with the reason. Always unmounted on exit.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def tmpfs(where: Path, *, size: str = "1m", read_only: bool = False) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``where`` (created), unmounted on every exit path."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a real full or read-only filesystem needs root and mount(8) (tmpfs)")
    where.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (mount: {mounted.stderr.strip()})")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], capture_output=True, check=False)
        if os.path.ismount(where):  # still busy (an open file): detach it now, freed when closed
            subprocess.run(["umount", "-l", str(where)], capture_output=True, check=True)


@contextmanager
def read_only_folder(where: Path) -> Iterator[Path]:
    """A folder nobody may write at ``where``: a read-only tmpfs as root (root ignores permissions),
    else a folder of mode 0555 (given back its write permission on exit)."""
    if os.geteuid() == 0:
        with tmpfs(where, size="64k", read_only=True) as folder:
            yield folder
        return
    where.mkdir(parents=True)
    where.chmod(0o555)
    try:
        yield where
    finally:
        where.chmod(0o755)
