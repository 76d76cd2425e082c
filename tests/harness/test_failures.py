"""What a restart cannot fix (:mod:`harness.failures`): the causes, found also where an error was
raised from, and what a rank records and exits with."""

from __future__ import annotations

import errno
import json
import math

import pytest

from common.finite import NonFiniteGradient, NonFiniteMetric
from harness import failures
from trainer.checkpoint import CheckpointError
from trainer.fileio import WriteError


@pytest.mark.parametrize(
    "error, cause",
    [
        (
            FloatingPointError("training loss became nan at step 3: lower lr"),
            "non-finite values (NaN or inf)",
        ),
        (NonFiniteGradient("gradient of w is not finite at step 3"), "non-finite values (NaN or inf)"),
        (NonFiniteMetric(f"final test_loss is {math.inf} at step 8"), "non-finite values (NaN or inf)"),
        (CheckpointError("no checkpoint in x is intact on every rank"), "no checkpoint it can resume"),
        (WriteError(errno.ENOSPC, "No space left on device", "/x/rank0.pt"), "a full disk"),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), "a full disk"),
        (OSError(errno.EROFS, "Read-only file system"), "a folder it cannot write"),
        (ValueError("density must be a number in (0, 1], got 2"), "bad options"),
        (RuntimeError("Connection reset by peer"), None),  # a peer died: a restart helps
        (OSError(errno.ECONNRESET, "Connection reset by peer"), None),
        (KeyError("w"), None),
    ],
)
def test_what_a_restart_cannot_fix(error, cause):
    assert failures.no_retry_cause(error) == cause


def test_the_cause_is_found_where_an_error_was_raised_from():
    try:
        try:
            raise FloatingPointError("nan")
        except FloatingPointError as inner:
            raise RuntimeError("step failed") from inner
    except RuntimeError as outer:
        assert failures.no_retry_cause(outer) == "non-finite values (NaN or inf)"
    try:
        try:
            raise ValueError("handled")
        except ValueError:
            raise RuntimeError("unrelated") from None  # only an explicit cause counts
    except RuntimeError as outer:
        assert failures.no_retry_cause(outer) is None


def test_a_rank_records_its_error_and_exits_without_retry(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(failures.FAILURES_ENV, str(tmp_path))
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    with pytest.raises(SystemExit) as exited, failures.recorded(1):
        raise FloatingPointError("training loss became nan at step 3: lower lr")
    assert exited.value.code == failures.EXIT_NO_RETRY
    record = json.loads((tmp_path / "rank1.json").read_text())
    assert record["rank"] == 1 and record["cause"] == "non-finite values (NaN or inf)"
    assert record["error"] == "FloatingPointError: training loss became nan at step 3: lower lr"
    err = capsys.readouterr().err
    assert err.endswith("rank 1: non-finite values (NaN or inf): a restart would fail the same way\n")
    assert "Traceback (most recent call last)" in err
    with pytest.raises(RuntimeError, match="^gloo: connection reset$"), failures.recorded(0):
        raise RuntimeError("gloo: connection reset")  # raised as it is: exit code 1, retried
    assert json.loads((tmp_path / "rank0.json").read_text())["cause"] is None
