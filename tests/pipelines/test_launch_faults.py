"""A launch owns its run folder and its processes (issue 18's faults, with real signals), and
retries only what a restart can fix (issue 45).

One launch holds the folder's lock from before any worker starts; a second launch on it fails at
once naming the first's pid. SIGKILL of the first launch's process group (what a killed DVC stage
or a lost shell does) kills its torchrun workers too, though torchrun puts them in sessions of
their own, so no output appears after the launch died; a new launch then resumes from the
checkpoint. The first launch's workers are stopped from its first checkpoint until just before the
kill: the run can be short (240 steps) and is still killed mid-run on any machine.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from harness import netem
from harness.failures import EXIT_NO_RETRY
from tests.helpers import faulty_stage
from tests.helpers.mlflow_store import fresh_store
from tests.helpers.mounts import read_only_folder, tmpfs
from tests.helpers.processes import run_group
from tests.helpers.refusal import launch_refusal
from tests.helpers.train_once import CONFIG
from trainer.paths import REPO_ROOT

NAN_LINE = (
    r"error: rank [01] failed with non-finite values \(NaN or inf\): FloatingPointError: training loss "
    r"became (nan|inf|-inf) at step \d+: lower lr\. Not restarted: a restart would fail the same way"
)


# rank 0's tqdm bar ends its last redraw without a newline, so a line the launcher writes after it
# (or another rank's traceback) can share the bar's line: split them again
_BAR = re.compile(r"(train:\s*\d+%\|[^|\n]*\|[^\[\n]*\[[^\]\n]*\])(?=.)")


def _lines(stderr: str) -> list[str]:
    """The launch's stderr as non-blank lines, a progress bar's last redraw on a line of its own."""
    return [line for line in _BAR.sub(r"\1\n", stderr).splitlines() if line.strip()]


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"  # a zombie has exited (nobody reaped it yet)


def _wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.1)


def test_a_launch_owns_its_folder_and_its_workers_die_with_it(tmp_path):
    pipeline = tmp_path / "own_pipeline"  # a pipeline outside pipelines/: a folder with params.yaml
    pipeline.mkdir()
    # 240 steps of a small MLP, checkpointed at 100 and 200: the workers are stopped (SIGSTOP) from
    # the first checkpoint until the launch is killed, so it dies mid-run however slow the machine
    defaults = {**CONFIG, "epochs": 10, "checkpoint_every": 100, "num_evaluations": 2, "num_logs": 4}
    (pipeline / "params.yaml").write_text(yaml.safe_dump({"scale": "t", "scales": {"t": {}}, "defaults": defaults, "runs": {"r": {}}}))  # fmt: skip
    out = tmp_path / "out"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "MLFLOW_TRACKING_URI": fresh_store(tmp_path),
        "TMPDIR": str(tmp_path),  # what the SIGKILLed launch leaves in its temporary folder stays here
    }
    command = [sys.executable, "-m", "pipelines.launch", str(pipeline), "r", "--out", str(out)]
    log = (tmp_path / "first.log").open("w")
    first = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    workers: list[int] = []
    try:
        _wait_for(lambda: list(out.glob("ckpt/*/latest.json")), 120, "the first checkpoint")
        workers = _children(first.pid)  # the launcher runs torchrun's agent itself: same pid
        assert len(workers) == 2, (workers, (tmp_path / "first.log").read_text()[-2000:])
        for pid in workers:  # held mid-run while the second launch tries the folder
            os.kill(pid, signal.SIGSTOP)

        second = run_group(command, timeout=120, env=env)
        assert second.returncode != 0
        assert f"run folder {out} is in use by launch pid {first.pid}" in second.stderr, second.stderr[-2000:]
        assert all(_alive(w) for w in workers)  # the first launch is untouched

        for pid in workers:  # training again when their launcher dies
            os.kill(pid, signal.SIGCONT)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
        _wait_for(lambda: not any(_alive(w) for w in workers), 10, "the workers to die with their launcher")
        time.sleep(2)
        assert not (out / "metrics.json").exists()  # nothing written after the launch died

        third = run_group(command, timeout=300, env=env)
        assert third.returncode == 0, third.stderr[-3000:]
        assert "resumed from" in third.stderr
        assert (out / "metrics.json").exists()
    finally:
        log.close()
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
        for pid in workers:  # by their own pids, whatever happened above
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_nan_is_not_retried_and_the_last_line_names_the_rank_and_the_cause(tmp_path):
    """With 3 restarts left: rank 1 SIGKILLed at step 1 is restarted (a restart fixes that); the
    loss going NaN in the second attempt ends the launch at once, its last line naming the rank
    and the cause, not torchrun's failure block."""
    pipeline = tmp_path / "faulty"
    pipeline.mkdir()
    (pipeline / "params.yaml").write_text(yaml.safe_dump({"scale": "t", "runs_module": faulty_stage.__name__, "runs": {"r": {}}}))  # fmt: skip
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    command = [sys.executable, "-m", "pipelines.launch", str(pipeline), "r", "--out", str(out)]
    result = run_group(command, timeout=400, env=env)
    lines = _lines(result.stderr)
    assert result.returncode == 1, result.stderr[-3000:]
    assert (out / "killed-once").exists()  # the first attempt was the killed one
    attempts = [line for line in lines if line.startswith("launch: attempt")]
    assert len(attempts) == 1, attempts  # one restart, after the kill; none after the NaN
    assert attempts[0].startswith(f"launch: attempt 1 of {faulty_stage.MAX_RESTARTS + 1} failed ("), attempts
    assert "rank 1 was killed by SIGKILL" in attempts[0]
    assert re.fullmatch(NAN_LINE, lines[-1]), lines[-5:]
    assert sum(line.startswith("error:") for line in lines) == 1
    assert "error_file: <N/A>" not in result.stderr and "ChildFailedError" not in result.stderr
    assert f"exitcode: {EXIT_NO_RETRY}" in result.stderr  # the workers' exit code for it


@pytest.mark.skipif(not netem.supported(), reason="needs root and iproute2 (ip, tc) for network namespaces")
def test_behind_shaped_links_a_nan_is_not_retried_either(tmp_path):
    """The same two faults with each rank behind a shaped link (``--net-bandwidth``: the restart
    loop of :func:`harness.netem.run_workers`, not torchrun's): the SIGKILL is restarted, the NaN
    is not, and the last line names the rank and the cause, once."""
    pipeline = tmp_path / "faulty"
    pipeline.mkdir()
    (pipeline / "params.yaml").write_text(yaml.safe_dump({"scale": "t", "runs_module": faulty_stage.__name__, "runs": {"r": {}}}))  # fmt: skip
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    command = [sys.executable, "-m", "pipelines.launch", str(pipeline), "r", "--out", str(out),
               "--net-bandwidth", "1gbit"]  # fmt: skip
    result = run_group(command, timeout=400, env=env)
    lines = _lines(result.stderr)
    assert result.returncode == EXIT_NO_RETRY, result.stderr[-3000:]
    assert (out / "killed-once").exists()  # the first attempt was the killed one
    assert f"rank 1 was killed by signal {signal.SIGKILL.value} (attempt 1 of 4)" in lines
    restarts = [line for line in lines if line.startswith("starting every worker again")]
    assert restarts == ["starting every worker again (1 of 3)"]  # after the kill; none after the NaN
    assert re.fullmatch(NAN_LINE, lines[-1]), lines[-5:]
    assert sum(line.startswith("error:") for line in lines) == 1


def test_a_full_disk_is_not_retried_and_the_last_line_names_the_file(tmp_path):
    """The run folder is a real 256 KiB tmpfs: the first checkpoint (step 8) does not fit. The
    launch fails once (max_restarts 2), its last line naming the rank, the file and ENOSPC."""
    pipeline = tmp_path / "own"
    pipeline.mkdir()
    defaults = {**CONFIG, "max_restarts": 2}
    (pipeline / "params.yaml").write_text(yaml.safe_dump({"scale": "t", "scales": {"t": {}}, "defaults": defaults, "runs": {"r": {}}}))  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "MLFLOW_TRACKING_URI": fresh_store(tmp_path)}
    with tmpfs(tmp_path / "disk", size="256k") as disk:
        command = [sys.executable, "-m", "pipelines.launch", str(pipeline), "r", "--out", str(disk / "run")]
        result = run_group(command, timeout=300, env=env)
    lines = _lines(result.stderr)
    assert result.returncode == 1, result.stderr[-3000:]
    assert not [line for line in lines if line.startswith("launch: attempt")]
    assert re.fullmatch(
        rf"error: rank [01] failed with a full disk: WriteError: cannot write {re.escape(str(disk))}/run/ckpt/\w+/"
        r"step-00000008/rank[01]\.pt: No space left on device \(.* free on the filesystem of .*\): free "
        r"some space there.*\. Checkpoint step 8 is not written; any before it in .* are intact and a "
        r"rerun resumes from the newest\. Not restarted: a restart would fail the same way",
        lines[-1],
    ), lines[-3:]


def test_a_read_only_run_folder_is_refused_before_any_worker_starts(tmp_path, monkeypatch):
    pipeline = tmp_path / "own"
    pipeline.mkdir()
    (pipeline / "params.yaml").write_text(yaml.safe_dump({"scale": "t", "scales": {"t": {}}, "defaults": CONFIG, "runs": {"r": {}}}))  # fmt: skip
    monkeypatch.setattr(os, "environ", dict(os.environ))  # main() exports settings for its workers
    with read_only_folder(tmp_path / "ro") as folder:
        message = launch_refusal(monkeypatch, [str(pipeline), "r", "--out", str(folder / "run")])
    assert message.startswith(f"error: cannot write {folder / 'run'}: "), message
    assert message.endswith(
        f": the run folder {folder} (where {folder / 'run'} would be created) is not writable; make it "
        "writable, or write elsewhere"
    ), message
