"""Decode-once cache of plain numpy arrays, safe for several processes starting at once.

A cache file is an uncompressed ``.npz``: zip stores a CRC-32 per array, which ``np.load`` checks when
it reads the array, so a corrupt or truncated file is detected (and rebuilt) rather than trained on.

Concurrency: the first process to find the cache cold takes an exclusive ``fcntl.flock`` on
``<file>.lock``, decodes and renames a complete temp file into place; the others wait on the lock,
then read the finished file. Readers never see a partial file (the rename is atomic). ``flock`` is
reliable on local file systems; on NFS point ``THINWIRE_CACHE`` at local disk.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import time
import zipfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from ..fileio import atomic_write
from .base import Arrays

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _exclusive_lock(lock_path: Path) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a+b") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another process to finish writing %s", lock_path.with_suffix(""))
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _save(path: Path, arrays: Arrays) -> None:
    # A file object, not a path: np.savez would append ".npz" to the temp file's name.
    with path.open("wb") as f:
        np.savez(f, allow_pickle=False, **arrays)


def _try_load(path: Path, check: Callable[[Arrays], None]) -> Arrays | None:
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in npz.files}
        check(arrays)
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as exc:
        log.warning("cache file %s is unreadable or corrupt (%s); rebuilding it", path, exc)
        return None
    return arrays


def load_or_build(path: Path, build: Callable[[], Arrays], check: Callable[[Arrays], None]) -> Arrays:
    """Return the arrays cached at ``path``, or ``build()`` them once (across processes) and cache them.

    ``check`` raises ``ValueError`` (e.g. ``DataError``) if arrays lack the expected structure; a
    cached file that fails it is rebuilt.
    """
    arrays = _try_load(path, check)
    if arrays is not None:
        log.debug("loaded %s from cache", path)
        return arrays
    with _exclusive_lock(path.with_name(path.name + ".lock")):
        # Another process may have built it while we waited for the lock.
        arrays = _try_load(path, check)
        if arrays is not None:
            return arrays
        start = time.perf_counter()
        arrays = build()
        check(arrays)
        atomic_write(path, lambda tmp: _save(tmp, arrays))
        log.info("decoded and cached %s in %.1f s", path, time.perf_counter() - start)
    return arrays
