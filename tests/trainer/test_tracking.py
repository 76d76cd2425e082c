"""MLflow tracking on rank 0: a server that dies mid-run, buffered rows, SIGTERM, resume."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from trainer import tracking
from trainer.checks import checked_config

# -- a tracking server that dies mid-run (issue 18) ---------------------------------------------------


class _Server:
    """A real ``mlflow server`` on a SQLite store, in its own process group (stopped by its pid)."""

    def __init__(self, root: Path, port: int) -> None:
        self.root, self.port, self.process = root, port, None
        self.uri = f"http://127.0.0.1:{port}"

    def start(self) -> None:
        import sys
        import time

        from tests.helpers.mlflow_store import fresh_store

        mlflow = Path(sys.executable).parent / "mlflow"
        log = (self.root / "server.log").open("a")
        store = fresh_store(self.root)  # migrated already: the server starts sooner
        command = [str(mlflow), "server", "--backend-store-uri", store, "--host", "127.0.0.1",
                   "--default-artifact-root", str(self.root / "artifacts"), "--port", str(self.port),
                   "--workers", "1"]  # fmt: skip
        self.process = subprocess.Popen(
            command,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + 60
        while not tracking._reachable(self.uri, timeout=1):
            assert self.process.poll() is None and time.monotonic() < deadline, (
                self.root / "server.log"
            ).read_text()
            time.sleep(0.2)

    def kill(self) -> None:
        import os
        import signal

        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def test_a_server_killed_mid_run_leaves_the_run_marked_partial(tmp_path, monkeypatch):
    """The server is SIGKILLed at step 10 and back at step 30: training goes on, run.json says
    tracking: partial, and the MLflow run is tagged partial and ended FAILED, not left RUNNING."""
    import json

    import torch
    from mlflow.tracking import MlflowClient

    from tests.distributed import free_port
    from tests.helpers.train_once import CONFIG
    from trainer import train
    from trainer.distributed import DistContext

    server = _Server(tmp_path, free_port())
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    config = checked_config({**CONFIG, "world_size": 1, "epochs": 1, "log_every": 2, "eval_every": 100})

    def outage(info) -> None:
        if info.step == 10:
            server.kill()
        elif info.step == 30:
            server.start()

    ctx = DistContext(rank=0, world_size=1, local_rank=0, backend="gloo", device=torch.device("cpu"))
    try:
        server.start()
        metrics = train(
            config, tmp_path / "out", experiment="outage", run_name="r", callbacks=[outage], ctx=ctx
        )
    finally:
        server.kill()
    assert metrics["steps"] == 48  # training went on through the outage
    run_json = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run_json["tracking"] == "partial"
    run = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(run_json["mlflow_run_id"])
    assert run.info.status == "FAILED" and run.data.tags["tracking"] == "partial"


# -- rows a kill or SIGTERM would lose; the experiment of a hand run ----------------------------------

# A run of 30 steps in its own process: rows 1-20 before the checkpoint at step 20 (sent then unless
# CHECKPOINT_FLUSH is 0), rows 21-30 buffered after it; then it waits for its signal.
_CHILD = """
import os, sys, time
from trainer.tracking import Tracker
tracker = Tracker("faults", "r", flush_every=10_000)
tracker.start({"lr": 0.1}, {"stage": "r"})
for step in range(1, 21):
    tracker.log_metrics({"train_loss": 1.0 / step}, step)
if os.environ["CHECKPOINT_FLUSH"] == "1":
    tracker.flush(through_step=20)
for step in range(21, 31):
    tracker.log_metrics({"train_loss": 1.0 / step}, step)
print(tracker.run_id, flush=True)
time.sleep(120)
"""


def _run_child(tmp_path: Path, checkpoint_flush: bool, signum: int) -> tuple[str, int]:
    """Start the child on a store under ``tmp_path``, send it ``signum`` once it has logged its
    rows; its run id and exit status."""
    import os
    import sys

    env = {
        **os.environ,
        "PYTHONPATH": str(tracking.REPO_ROOT),
        "CHECKPOINT_FLUSH": str(int(checkpoint_flush)),
    }
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        run_id = child.stdout.readline().strip()  # printed after the rows were logged
        assert run_id, child.stderr.read() if child.poll() is not None else "no run id"
        os.kill(child.pid, signum)
        child.wait(timeout=60)
        return run_id, child.returncode
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
            child.wait()


def _steps(client, run_id: str, key: str = "train_loss") -> list[int]:
    return [
        m.step for m in sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))
    ]


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from mlflow.tracking import MlflowClient

    from tests.helpers.mlflow_store import fresh_store

    uri = fresh_store(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return MlflowClient(uri)


def test_sigterm_sends_the_buffered_rows_and_ends_the_run_killed(tmp_path, store):
    """SIGTERM: every row logged so far reaches the store (21-30 were only buffered), the run ends
    KILLED, not RUNNING, and the process still dies of the signal. The resume continues the run
    without logging a row twice and ends it FINISHED, untagged."""
    run_id, status = _run_child(tmp_path, checkpoint_flush=True, signum=signal.SIGTERM)
    assert status == -signal.SIGTERM
    run = store.get_run(run_id)
    assert run.info.status == "KILLED"
    assert _steps(store, run_id) == list(range(1, 31))
    assert run.data.tags[tracking.LOGGED_THROUGH_TAG] == "20"

    resumed = tracking.Tracker("faults", "r", run_id=run_id, flush_every=10_000)
    assert resumed.start({}, {}, resume_step=20) == run_id
    try:
        assert store.get_run(run_id).info.status == "RUNNING"
        for step in range(21, 41):  # the steps after the checkpoint again: 21-30 are in the store
            resumed.log_metrics({"train_loss": 1.0 / step}, step)
    finally:
        resumed.finish()
    run = store.get_run(run_id)
    assert run.info.status == "FINISHED" and "tracking" not in run.data.tags and resumed.state == "complete"
    assert _steps(store, run_id) == list(range(1, 41))
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # the test process's handler is back


@pytest.mark.parametrize("checkpoint_flush", [True, False], ids=["sent-at-checkpoint", "buffered"])
def test_a_killed_run_that_lost_rows_is_partial(tmp_path, store, checkpoint_flush):
    """SIGKILL: nothing runs in the process. Rows sent at the checkpoint survive and the resume
    logs the rest, so the run is complete; rows that were only buffered before the checkpoint are
    lost, so the resumed run is tagged tracking=partial and ends FAILED."""
    run_id, status = _run_child(tmp_path, checkpoint_flush=checkpoint_flush, signum=signal.SIGKILL)
    assert status == -signal.SIGKILL
    assert store.get_run(run_id).info.status == "RUNNING"
    assert _steps(store, run_id) == (list(range(1, 21)) if checkpoint_flush else [])

    resumed = tracking.Tracker("faults", "r", run_id=run_id)
    resumed.start({}, {}, resume_step=20)
    try:
        for step in range(21, 31):
            resumed.log_metrics({"train_loss": 1.0 / step}, step)
    finally:
        resumed.finish()
    run = store.get_run(run_id)
    if checkpoint_flush:
        assert resumed.state == "complete" and run.info.status == "FINISHED"
        assert "tracking" not in run.data.tags
        assert _steps(store, run_id) == list(range(1, 31))
    else:
        assert resumed.state == "partial" and run.info.status == "FAILED"
        assert run.data.tags["tracking"] == "partial"
        assert _steps(store, run_id) == list(range(21, 31))


def test_sigterm_during_an_mlflow_call_waits_for_it(store):
    """A SIGTERM arriving inside an MLflow call is handled when the call returns (entering the
    store's client from the handler could deadlock it): then the run ends KILLED and SIGTERM's
    previous handler runs."""
    received = []
    tracker = tracking.Tracker("faults", "r")
    tracker.start({}, {})
    try:
        tracker._previous_sigterm = lambda signum, frame: received.append(signum)
        tracker.log_metrics({"train_loss": 1.0}, 1)
        with tracker._calling():
            tracker._on_sigterm(signal.SIGTERM, None)
            assert received == [] and store.get_run(tracker.run_id).info.status == "RUNNING"
        assert received == [signal.SIGTERM]
        assert store.get_run(tracker.run_id).info.status == "KILLED"
        assert _steps(store, tracker.run_id) == [1]
    finally:
        tracker.finish()
    assert store.get_run(tracker.run_id).info.status == "KILLED"  # finish after the kill changes nothing


def test_final_values_with_a_curve_are_not_charted_twice(store):
    """The charts are the curves: a final value whose key is a curve is that curve's last point (not
    sent again); the others are tags summary.<key>, not single-point charts; values that are not
    finite are left out."""
    tracker = tracking.Tracker("faults", "r")
    tracker.start({}, {})
    try:
        tracker.log_metrics({"train_loss": 2.0, "test_accuracy": 0.5}, 10)
        tracker.log_metrics({"train_loss": 1.0, "test_accuracy": 0.8}, 20)
        tracker.log_summary(
            {"train_loss": 1.0, "test_accuracy": 0.8, "compression_factor": 32.5, "loss_scale": float("inf")}
        )
    finally:
        tracker.finish()
    run = store.get_run(tracker.run_id)
    assert run.data.metrics == {"train_loss": 1.0, "test_accuracy": 0.8}
    assert {k: v for k, v in run.data.tags.items() if k.startswith("summary.")} == {
        "summary.compression_factor": "32.5"
    }


def test_a_hand_run_has_an_experiment_of_its_own(tmp_path):
    results = tmp_path / "results"
    assert tracking.experiment_for("suite", results / "suite" / "runs" / "g", results) == "suite"
    assert tracking.experiment_for("suite", tmp_path / "scratch" / "suite" / "r", results) == "scratch-suite"
    assert tracking.experiment_for("suite", "/elsewhere/out", results) == "scratch-suite"
