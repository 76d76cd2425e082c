"""A launch owns its run folder and its processes (issue 18's faults, with real signals).

One launch holds the folder's lock from before any worker starts; a second launch on it fails at
once naming the first's pid. SIGKILL of the first launch's process group (what a killed DVC stage
or a lost shell does) kills its torchrun workers too, though torchrun puts them in sessions of
their own, so no output appears after the launch died; a new launch then resumes from the
checkpoint. The first launch's workers are stopped from its first checkpoint until just before the
kill: the run can be short (240 steps) and is still killed mid-run on any machine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from common.paths import REPO_ROOT
from tests.helpers.mlflow_store import fresh_store
from tests.helpers.processes import run_group
from tests.helpers.train_once import CONFIG


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
