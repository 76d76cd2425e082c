"""git_sha: which edits mark a run's code as dirty."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from common import tracking
from common.methods import checked_config


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "common").mkdir()
    (tmp_path / "common" / "x.py").write_text("a = 1\n")
    (tmp_path / "papers").mkdir()
    (tmp_path / "papers" / "README.md").write_text("# notes\n")
    (tmp_path / "pipelines").mkdir()
    (tmp_path / "pipelines" / "dvc.lock").write_text("schema: '2.0'\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    monkeypatch.setattr(tracking, "REPO_ROOT", tmp_path)
    return tmp_path


def test_clean_checkout_has_no_suffix(repo: Path) -> None:
    sha = tracking.git_sha()
    assert len(sha) >= 7 and not sha.endswith("-dirty")


def test_code_edit_is_dirty(repo: Path) -> None:
    (repo / "common" / "x.py").write_text("a = 2\n")
    assert tracking.git_sha().endswith("-dirty")


def test_documentation_and_locks_are_not_code(repo: Path) -> None:
    (repo / "papers" / "README.md").write_text("# notes, edited while a pipeline runs\n")
    (repo / "pipelines" / "dvc.lock").write_text("schema: '2.0'\nstages: {}\n")
    (repo / "results.txt").write_text("untracked output\n")
    assert not tracking.git_sha().endswith("-dirty")


def test_outside_a_repository_is_unknown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracking, "REPO_ROOT", tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert tracking.git_sha() == "unknown"


def test_a_process_records_the_commit_it_loaded_not_where_head_moved(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A launch's later runs ran the code its ranks imported: a commit landing meanwhile (or an
    edit) does not change the sha they record."""
    monkeypatch.setattr(tracking, "_LOADED_SHA", None)
    loaded = tracking.loaded_git_sha()
    assert loaded == tracking.git_sha() and not loaded.endswith("-dirty")
    (repo / "common" / "x.py").write_text("a = 2\n")
    assert tracking.git_sha().endswith("-dirty")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "later")
    assert tracking.git_sha() != loaded
    assert tracking.loaded_git_sha() == loaded


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

    from common.distributed import DistContext
    from common.train import train
    from tests.distributed import free_port
    from tests.helpers.train_once import CONFIG

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
