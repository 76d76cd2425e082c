"""The MLflow UI thinwire serves opens in the model-training view on a browser's first visit.

MLflow 3.17's UI keeps its GenAI / Model training switch in the browser and starts a new browser
on GenAI, whatever the experiment's tags; ``pipelines.mlflow_ui`` serves MLflow's page with the
switch starting on Model training. Driven in a real headless browser where one is installed
(Debian: ``apt-get install chromium``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from pipelines import mlflow_ui
from tests.distributed import free_port
from tests.helpers.mlflow_store import fresh_store
from tests.helpers.processes import run_group
from trainer.paths import REPO_ROOT

BROWSER = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)


def _mlflow_files() -> tuple[Path, str]:
    import mlflow.server

    index = Path(mlflow.server.__file__).parent / "js" / "build" / "index.html"
    bundle = next((index.parent / "static" / "js").glob("main.*.js")).read_text()
    return index, bundle


def test_the_page_starts_a_new_browser_on_model_training() -> None:
    """The line runs before MLflow's own script, and sets the key MLflow's bundle reads the switch
    from (its local-storage hook: ``key:"mlflow.workflowType",version:1`` read as ``<key>_v<version>``)."""
    index, bundle = _mlflow_files()
    page = mlflow_ui.with_default_view(index.read_text())
    assert page.index(mlflow_ui.DEFAULT_VIEW_SCRIPT) < page.index("<script defer")
    assert 'key:"mlflow.workflowType",version:1' in bundle and "`${e}_v${t}`" in bundle
    assert f'MACHINE_LEARNING="{mlflow_ui.MODEL_TRAINING}"' in bundle
    with pytest.raises(ValueError, match="no <head>"):
        mlflow_ui.with_default_view("<html><body></body></html>")


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode()


def test_a_first_visit_lists_the_runs(tmp_path: Path) -> None:
    """The server starts (MLflow's own, with its page changed), and a browser with a fresh profile
    opening an experiment sees its runs: the model-training view, not GenAI's Evaluation runs."""
    from mlflow.tracking import MlflowClient

    from trainer.tracking import ensure_experiment

    uri = fresh_store(tmp_path)
    client = MlflowClient(uri)
    experiment = ensure_experiment(client, "suite", uri)
    client.set_terminated(client.create_run(experiment, run_name="first-visit-run").info.run_id)
    port = free_port()
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": str(REPO_ROOT)}
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "pipelines.mlflow_ui", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                assert _get(f"{url}/health") == "OK"
                break
            except OSError:
                assert server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "the UI did not start in 180 s"
                time.sleep(0.5)
        assert mlflow_ui.DEFAULT_VIEW_SCRIPT in _get(url)
        if BROWSER is None:
            pytest.skip("no chromium: the page was served, the browser check needs one")
        command = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'profile'}",
                   "--virtual-time-budget=20000", "--dump-dom", f"{url}/#/experiments/{experiment}"]  # fmt: skip
        page = run_group(command, timeout=150).stdout
        (tmp_path / "page.html").write_text(page)  # kept with the test's folder when it fails
        assert "first-visit-run" in page and "matching run" in page, page[-2000:]
        assert "Evaluation runs" not in page  # GenAI's experiment navigation
    finally:
        log.close()
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
