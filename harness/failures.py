"""Failures a restart cannot fix: classified by the ranks, read by the launcher, never retried.

A rank whose run raises writes ``$THINWIRE_FAILURES_DIR/rank<k>.json`` first thing (the error, and
the cause where a restart cannot help), then, for such a cause, prints its traceback and exits with
:data:`EXIT_NO_RETRY`: the exit code decides even where a full disk refused the record. The causes
(:func:`no_retry_cause`):

- non-finite values: a NaN or inf loss or gradient, or a last evaluation that gives one
  (``FloatingPointError``), recurs from the same checkpoint with the same data;
- no checkpoint to resume: :class:`~trainer.checkpoint.CheckpointError` (damaged on every step, or
  written by another world size);
- a full disk (ENOSPC, EDQUOT) or a folder that cannot be written (EROFS, EACCES, EPERM);
- bad options: a ``ValueError`` (validation, missing data).

Anything else (a killed rank, a peer that hung past ``collective_timeout_s``, a lost connection) is
retried up to ``max_restarts`` times by every restart loop that reads these: the launcher's
(``pipelines.launch.run_attempts``, torchrun on one machine) and the emulated networks'
(:func:`harness.netem.run_workers`, :func:`harness.netem.run_hosts`). Here, below both, so that
the network emulation can tell the two kinds apart without importing the pipelines.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sys
import time
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trainer.checkpoint import CheckpointError

FAILURES_ENV = "THINWIRE_FAILURES_DIR"  # where ranks record their failures (set by the launcher)
EXIT_NO_RETRY = 79  # a rank's exit code for an error that a restart cannot fix

_FULL = (errno.ENOSPC, errno.EDQUOT)
_NOT_WRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)


def no_retry_cause(error: BaseException) -> str | None:
    """Why a restart cannot fix ``error`` (or what it was raised from), or None if one may."""
    seen: BaseException | None = error
    for _ in range(8):  # the error and its explicit causes (``raise ... from``)
        if seen is None:
            break
        if isinstance(seen, FloatingPointError):
            return "non-finite values (NaN or inf)"
        if isinstance(seen, CheckpointError):
            return "no checkpoint it can resume"
        if isinstance(seen, OSError) and seen.errno in _FULL:
            return "a full disk"
        if isinstance(seen, OSError) and seen.errno in _NOT_WRITABLE:
            return "a folder it cannot write"
        if isinstance(seen, ValueError):
            return "bad options"
        seen = seen.__cause__
    return None


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def record(rank: int, error: BaseException, cause: str | None, folder: str | None = None) -> None:
    """Write ``rank<k>.json`` into ``folder`` (default ``$THINWIRE_FAILURES_DIR``; none: nothing).
    Never raises: on a full disk the record may be lost, the exit code still tells."""
    folder = folder if folder is not None else os.environ.get(FAILURES_ENV)
    if not folder:
        return
    data = {"rank": rank, "error": _one_line(error), "cause": cause, "time": time.time()}
    path = Path(folder) / f"rank{rank}.json"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data) + "\n")
        os.replace(tmp, path)
    except OSError as problem:
        print(f"rank {rank}: cannot record its failure in {path} ({problem})", file=sys.stderr)
        tmp.unlink(missing_ok=True)


def _torch_error_file(error: BaseException, cause: str) -> None:
    """torchrun's own record (``TORCHELASTIC_ERROR_FILE``): its failure block then shows the error
    and that it is not retryable, not ``error_file: <N/A>``."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    data = {
        "message": {
            "message": _one_line(error),
            "extraInfo": {"py_callstack": traceback.format_exc(), "timestamp": str(int(time.time()))},
        },
        "errorTraits": {"category": cause, "retryability": "False"},
    }
    with contextlib.suppress(OSError):  # a full disk: the exit code still tells
        Path(path).write_text(json.dumps(data))


@contextmanager
def recorded(rank: int) -> Iterator[None]:
    """Around a rank's whole run: record any error it raises; one a restart cannot fix exits with
    :data:`EXIT_NO_RETRY` after its traceback, any other is raised as it is (exit code 1)."""
    try:
        yield
    except Exception as error:
        cause = no_retry_cause(error)
        record(rank, error, cause)
        if cause is None:
            raise
        _torch_error_file(error, cause)
        traceback.print_exc()
        print(f"rank {rank}: {cause}: a restart would fail the same way", file=sys.stderr)
        sys.stderr.flush()
        raise SystemExit(EXIT_NO_RETRY) from None


def read_records(folder: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The ranks' records in ``folder``, earliest first (unreadable ones skipped)."""
    records = []
    for path in Path(folder).glob("rank*.json"):
        try:
            data = json.loads(path.read_text())
            records.append({**data, "rank": int(data["rank"]), "error": str(data["error"])})
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return sorted(records, key=lambda r: (float(r.get("time") or 0), r["rank"]))


def clear_records(folder: str | os.PathLike[str]) -> None:
    for path in Path(folder).glob("*rank*.json*"):
        path.unlink(missing_ok=True)


@contextmanager
def records_folder(env: Mapping[str, str]) -> Iterator[str]:
    """Where the ranks of a restart loop record their failures: ``env``'s ``$THINWIRE_FAILURES_DIR``
    (the launcher's), else a temporary folder for the loop's duration (the caller passes it on)."""
    given = env.get(FAILURES_ENV)
    if given:
        yield given
        return
    import tempfile

    with tempfile.TemporaryDirectory(prefix="thinwire-failures-") as folder:
        yield folder


def _exit_text(code: int) -> str:
    if code < 0:
        import signal

        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def verdict(records: list[dict[str, Any]], exits: Mapping[int, int]) -> tuple[bool, str]:
    """(may a restart help?, one line naming the rank and the cause) from one attempt's records
    and the exit codes of the ranks that failed (``exits``: rank -> code, negative: a signal)."""
    fatal = [r for r in records if r.get("cause")]
    if fatal:
        first = fatal[0]
        return False, f"rank {first['rank']} failed with {first['cause']}: {_short(first['error'], 2000)}"
    unrecorded = sorted(rank for rank, code in exits.items() if code == EXIT_NO_RETRY)
    if unrecorded:
        return False, (
            f"rank {unrecorded[0]} exited with code {EXIT_NO_RETRY} (an error a restart cannot fix; "
            "its record was lost, its traceback is above)"
        )
    said = {r["rank"]: f"rank {r['rank']} failed: {_short(r['error'])}" for r in reversed(records)}
    for rank, code in exits.items():
        said.setdefault(rank, f"rank {rank} {_exit_text(code)}")
    return True, "; ".join(said[rank] for rank in sorted(said)) or "a rank failed (no record, no exit code)"


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
