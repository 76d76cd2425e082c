"""Atomic file writes: a failed or killed writer never leaves a half-written file behind.

A write that fails for want of space or permission raises :class:`WriteError`, an ``OSError`` that
names the file, the cause and what to do, whoever did the writing: torch's own writer hides the
errno of a full disk behind ``basic_ios::clear: iostream error`` or ``PytorchStreamWriter failed
writing file``; the filesystem's free space (``os.statvfs``) tells it apart.
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

# what torch's C++ stream writer says when a write fails (it drops the errno)
_STREAM_FAILURES = ("iostream error", "PytorchStreamWriter failed", "file write failed", "unexpected pos")
# a failed write leaves less than this free on a full filesystem (a block, a page, a buffer)
FULL_DISK_BYTES = 1 << 20
_NOT_WRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)


class WriteError(OSError):
    """Writing ``filename`` failed: ``errno`` (ENOSPC on a full disk, EROFS/EACCES where the folder
    is not writable, None where the writer gave no cause) and a message that says what to do."""

    def __init__(self, code: int | None, strerror: str, filename: str, detail: str = "") -> None:
        super().__init__(code, strerror, filename)
        self.detail = detail

    def __str__(self) -> str:
        return f"cannot write {self.filename}: {self.strerror}{self.detail}"

    def __reduce__(self) -> tuple[Any, ...]:  # across processes (errors of ranks, all_gather_object)
        return (type(self), (self.errno, self.strerror, self.filename, self.detail))


def _free_bytes(folder: Path) -> tuple[int, bool] | None:
    """(bytes this process may still write on ``folder``'s filesystem, inodes exhausted?)."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return None
    blocks = st.f_bfree if os.geteuid() == 0 else st.f_bavail  # root may use the reserved blocks
    return blocks * st.f_frsize, st.f_files > 0 and st.f_favail == 0


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    size, unit = n / 1024, "KiB"
    for larger in ("MiB", "GiB", "TiB"):
        if size < 1024:
            break
        size, unit = size / 1024, larger
    return f"{size:.1f} {unit}"


def _is_stream_failure(error: BaseException) -> bool:
    """Whether ``error`` (or what it was raised from) is torch's writer failing to write."""
    seen: BaseException | None = error
    for _ in range(4):
        if seen is None:
            return False
        if isinstance(seen, RuntimeError) and any(s in str(seen) for s in _STREAM_FAILURES):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def write_error(path: Path, error: BaseException) -> WriteError | None:
    """``error`` (raised writing ``path``) as a :class:`WriteError`, or None if it is not about
    writing (a bug in the writer, an interrupt: raised as it is). Call it before removing what the
    failed write left: that still holds the space a full disk lacked."""
    if isinstance(error, WriteError) or not isinstance(error, OSError | RuntimeError):
        return None
    if isinstance(error, RuntimeError) and not _is_stream_failure(error):
        return None
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    free = _free_bytes(folder)
    code = error.errno if isinstance(error, OSError) else None
    if code is None and free is not None and (free[0] < FULL_DISK_BYTES or free[1]):
        code = errno.ENOSPC  # torch's writer on a full filesystem
    if code == errno.ENOSPC or code == errno.EDQUOT:
        room = "" if free is None else f"{_size(free[0])}{' and no inodes' if free[1] else ''} free on "
        detail = (
            f" ({room}the filesystem of {folder}): free some space there or write elsewhere, then "
            "rerun (the file's previous version, if any, is unchanged)"
        )
        return WriteError(code, os.strerror(code), str(path), detail)
    if code in _NOT_WRITABLE:
        detail = f" ({folder} is not writable): make it writable, or write elsewhere"
        return WriteError(code, os.strerror(code), str(path), detail)
    if isinstance(error, OSError):
        return WriteError(code, error.strerror or str(error), str(path))
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    room = "" if free is None else f"; {_size(free[0])} free on the filesystem of {folder}"
    return WriteError(None, f"the write failed ({first}{room})", str(path))


def check_writable(folder: str | os.PathLike[str], what: str = "output folder") -> None:
    """Raise :class:`WriteError` naming ``folder`` unless files can be created in it: probed with a
    temporary file where it exists, else by the permissions of the nearest folder above it that
    does (where it would be created). Before a run starts, not at its first checkpoint."""
    folder = Path(folder)
    target = folder
    while not target.exists() and target != target.parent:
        target = target.parent
    try:
        if target == folder:
            if not folder.is_dir():
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(folder))
            fd, probe = tempfile.mkstemp(prefix=".write-probe.", dir=folder)
            os.close(fd)
            os.unlink(probe)
        elif not target.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(target))
        elif not os.access(target, os.W_OK | os.X_OK):  # EROFS too: access(2) checks the mount
            code = errno.EROFS if _read_only_mount(target) else errno.EACCES
            raise OSError(code, os.strerror(code), str(target))
    except OSError as error:
        where = folder if target == folder else f"{target} (where {folder} would be created)"
        raise WriteError(
            error.errno,
            error.strerror or str(error),
            str(folder),
            f": the {what} {where} is not writable; make it writable, or write elsewhere",
        ) from None


def _read_only_mount(folder: Path) -> bool:
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def atomic_write(path: str | os.PathLike[str], write: Callable[[Path], object]) -> None:
    """Call ``write(tmp_path)`` then rename ``tmp_path`` over ``path`` (same folder, so atomic).

    A failure to write (a full disk, a read-only folder, torch's writer failing) raises
    :class:`WriteError` naming ``path``; any other error of ``write`` is raised as it is."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as error:
        wrapped = write_error(path, error)
        if wrapped is None:
            raise
        raise wrapped from error
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600 files; give the usual permissions
        os.replace(tmp, path)
    except BaseException as error:
        wrapped = write_error(path, error)  # while the partial file still holds its space
        Path(tmp).unlink(missing_ok=True)
        if wrapped is None:
            raise
        raise wrapped from error


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    atomic_write(path, lambda p: p.write_text(text))


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")
