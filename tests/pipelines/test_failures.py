"""Which failures the launcher retries, decided from the ranks' records and exit codes
(:mod:`harness.failures`, whose classification ``tests/harness/test_failures.py`` tests).

The launcher's loop runs here against a stand-in for torchrun that fails as torchrun does (a
``ChildFailedError`` with each failed rank's exit code) after writing what a rank would record;
``tests/pipelines/test_launch_faults.py`` runs the real thing once.
"""

from __future__ import annotations

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from harness import failures
from pipelines import launch


def _failed(exits: dict[int, int]) -> ChildFailedError:
    return ChildFailedError(
        "pipelines.train",
        {
            rank: ProcessFailure(rank, 1000 + rank, code, "/nonexistent/error.json")
            for rank, code in exits.items()
        },
    )


def _torchrun(monkeypatch, folder, attempts: list[tuple[dict[int, int], dict[int, BaseException]]]):
    """A stand-in for torchrun: each call plays the next attempt (failed ranks' exit codes, the
    errors the ranks record); an attempt without failures succeeds. Returns the calls made."""
    calls: list[list[str]] = []

    def run(args: list[str]) -> None:
        exits, errors = attempts[len(calls)]
        calls.append(args)
        for rank, error in errors.items():
            failures.record(rank, error, failures.no_retry_cause(error), str(folder))
        if exits:
            raise _failed(exits)

    monkeypatch.setattr(launch, "run_torchrun", run)
    return calls


def test_a_failure_a_restart_can_fix_is_retried_until_an_attempt_succeeds(tmp_path, monkeypatch, capsys):
    calls = _torchrun(
        monkeypatch,
        tmp_path,
        [
            ({1: -9, 0: 1}, {0: RuntimeError("Connection reset by peer")}),  # rank 1 killed
            ({0: 1}, {0: RuntimeError("timed out")}),  # a record from the first attempt is gone
            ({}, {}),
        ],
    )
    assert launch.run_attempts(["-m", "pipelines.train"], 2, tmp_path) == 0
    assert len(calls) == 3
    assert capsys.readouterr().err.splitlines() == [
        "launch: attempt 1 of 3 failed (rank 0 failed: RuntimeError: Connection reset by peer; rank 1 was "
        "killed by SIGKILL); restarting every rank from the last checkpoint",
        "launch: attempt 2 of 3 failed (rank 0 failed: RuntimeError: timed out); restarting every rank "
        "from the last checkpoint",
    ]


def test_a_failure_no_restart_can_fix_ends_the_launch_at_once(tmp_path, monkeypatch, capsys):
    nan = FloatingPointError("training loss became nan at step 3: lower lr")
    calls = _torchrun(
        monkeypatch, tmp_path, [({0: 1, 1: failures.EXIT_NO_RETRY}, {0: RuntimeError("reset"), 1: nan})]
    )
    assert launch.run_attempts([], 5, tmp_path) == 1
    assert len(calls) == 1
    assert capsys.readouterr().err.splitlines() == [
        "error: rank 1 failed with non-finite values (NaN or inf): FloatingPointError: training loss became "
        "nan at step 3: lower lr. Not restarted: a restart would fail the same way"
    ]


def test_the_exit_code_alone_stops_retries_where_the_record_was_lost(tmp_path, monkeypatch, capsys):
    calls = _torchrun(monkeypatch, tmp_path, [({1: failures.EXIT_NO_RETRY}, {})])  # a full disk: no record
    assert launch.run_attempts([], 3, tmp_path) == 1
    assert len(calls) == 1
    assert capsys.readouterr().err.startswith(
        f"error: rank 1 exited with code {failures.EXIT_NO_RETRY} (an error a restart cannot fix"
    )


def test_the_last_attempt_s_failure_is_printed_once_when_restarts_run_out(tmp_path, monkeypatch, capsys):
    calls = _torchrun(monkeypatch, tmp_path, [({1: -9}, {}), ({1: -15}, {})])
    assert launch.run_attempts([], 1, tmp_path) == 1
    assert len(calls) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "error: rank 1 was killed by SIGTERM (in each of 2 attempts: max_restarts is 1)"
    )
