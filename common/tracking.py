"""MLflow tracking for rank 0 (other ranks get a no-op), robust to an unreachable server.

The tracking URI comes from ``MLFLOW_TRACKING_URI``; the default is the SQLite file
``mlflow.db`` at the repository root (``mlflow ui --backend-store-uri sqlite:///mlflow.db``).
One experiment per pipeline, one run per stage instance. If the server cannot be reached, or any
MLflow call fails, the run keeps training: one warning is logged and tracking switches off. A run
whose tracking broke after it started is *partial* (:attr:`Tracker.state`; ``run.json`` says so): at
its end the tracker tries once more to tag the MLflow run ``tracking=partial`` and end it FAILED,
so it does not stay RUNNING with a silent gap in its metrics.
``mlflow`` is imported lazily (it costs 1-2 s), and only on rank 0.
"""

from __future__ import annotations

import logging
import os
import subprocess
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .paths import REPO_ROOT

log = logging.getLogger(__name__)


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{REPO_ROOT / 'mlflow.db'}"


CODE_PATHS = ("common", "kernels", "harness", "papers", "pipelines", "pyproject.toml", "requirements.txt")


def git_sha() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10
        )
        sha = out.stdout.strip() or "unknown"
        dirty = subprocess.run(
            # Dirty means the code differs from the commit; outputs (results/, dvc.lock files that
            # a running pipeline rewrites) and documentation (READMEs edited during a run) do not.
            [
                "git",
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                *CODE_PATHS,
                ":(exclude)*.lock",
                ":(exclude)*.md",
            ],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return f"{sha}-dirty" if dirty and sha != "unknown" else sha
    except (OSError, subprocess.SubprocessError):
        return "unknown"


_LOADED_SHA: str | None = None


def loaded_git_sha() -> str:
    """:func:`git_sha` when this process first asks: the commit of the code it loaded. A launch
    trains its runs one after the other in the same ranks; if a commit lands (or the tree is
    edited) meanwhile, the later runs still run the code the ranks imported, and record its sha, not
    the one HEAD has moved to (at git 4b9ec5d a launch's runs recorded 4 commits and a -dirty for
    the one set of code they ran)."""
    global _LOADED_SHA
    if _LOADED_SHA is None:
        _LOADED_SHA = git_sha()
    return _LOADED_SHA


# MLflow 3's UI opens an experiment without this tag in its GenAI view (an empty Traces page);
# "custom_model_development" is the model-training view (runs, metrics, charts).
EXPERIMENT_KIND_TAG = ("mlflow.experimentKind", "custom_model_development")


def ensure_experiment(client: Any, name: str, uri: str) -> str:
    """The id of experiment ``name`` (created if missing), tagged for the model-training view."""
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        experiment_id = str(experiment.experiment_id)
        if experiment.tags.get(EXPERIMENT_KIND_TAG[0]) != EXPERIMENT_KIND_TAG[1]:
            client.set_experiment_tag(experiment_id, *EXPERIMENT_KIND_TAG)
        return experiment_id
    # With a local SQLite store, artifacts go beside its file (not into the stage's cwd): the
    # default store's beside mlflow.db at the repository root, a test's in its own folder.
    location = None
    if uri.startswith("sqlite:///"):
        location = (Path(uri.removeprefix("sqlite:///")).resolve().parent / "mlartifacts").as_uri()
    experiment_id = str(client.create_experiment(name, artifact_location=location))
    client.set_experiment_tag(experiment_id, *EXPERIMENT_KIND_TAG)
    return experiment_id


def _reachable(uri: str, timeout: float = 3.0) -> bool:
    if not uri.startswith(("http://", "https://")):
        return True
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


class Tracker:
    """Logs params, per-step metrics, tags and artifacts to one MLflow run; never raises.

    ``enabled=False`` (ranks other than 0) makes every method a no-op. Metrics are buffered and
    sent in batches every ``flush_every`` calls so a run of thousands of steps costs a few writes.
    """

    def __init__(
        self,
        experiment: str,
        run_name: str,
        *,
        enabled: bool = True,
        run_id: str | None = None,
        flush_every: int = 50,
    ) -> None:
        self.experiment = experiment
        self.run_name = run_name
        self.enabled = enabled
        self.run_id = run_id
        self.flush_every = flush_every
        self._client: Any = None
        self._pending: list[Any] = []
        self.partial = False  # tracking broke after the run was created: its history has gaps

    @property
    def state(self) -> str:
        """ "off" (never tracked), "partial" (tracking broke mid-run) or "complete"."""
        if self.partial:
            return "partial"
        return "complete" if self.run_id is not None and self.enabled else "off"

    def _fail(self, what: str, error: BaseException) -> None:
        log.warning(
            "MLflow %s failed (%s: %s); continuing without tracking", what, type(error).__name__, error
        )
        self.enabled = False
        self._client = None
        if self.run_id is not None:
            self.partial = True

    def start(self, params: Mapping[str, Any], tags: Mapping[str, str]) -> str | None:
        """Start (or resume, if ``run_id`` was given) the run; returns its id or None."""
        if not self.enabled:
            return None
        uri = tracking_uri()
        if not _reachable(uri):
            log.warning("MLflow tracking server %s is unreachable; training continues without tracking", uri)
            self.enabled = False
            if self.run_id is not None:  # a resumed run: its history so far is there, the rest is not
                self.partial = True
            return None
        # A server that dies mid-run must cost seconds, not minutes of retries.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        try:
            from mlflow.tracking import MlflowClient

            client = MlflowClient(tracking_uri=uri)
            experiment_id = ensure_experiment(client, self.experiment, uri)
            if self.run_id is None:
                run = client.create_run(experiment_id, run_name=self.run_name, tags=dict(tags))
                self.run_id = run.info.run_id
                from mlflow.entities import Param

                client.log_batch(self.run_id, params=[Param(k, str(v)[:6000]) for k, v in params.items()])
            else:
                client.update_run(self.run_id, status="RUNNING")
                for key, value in tags.items():
                    client.set_tag(self.run_id, key, value)
            self._client = client
            return self.run_id
        except Exception as error:  # any MLflow or connection failure: train on
            self._fail("start", error)
            return None

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        if not self.enabled or self._client is None:
            return
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._pending.extend(Metric(k, float(v), now, step) for k, v in metrics.items())
        if len(self._pending) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        if not self.enabled or self._client is None or not self._pending:
            return
        try:
            for start in range(0, len(self._pending), 900):  # MLflow caps a batch at 1000 metrics
                self._client.log_batch(self.run_id, metrics=self._pending[start : start + 900])
            self._pending = []
        except Exception as error:
            self._fail("log_batch", error)

    def log_artifact(self, path: str | Path) -> None:
        if not self.enabled or self._client is None:
            return
        try:
            self._client.log_artifact(self.run_id, str(path))
        except Exception as error:
            self._fail("log_artifact", error)

    def finish(self, status: str = "FINISHED") -> None:
        if self.enabled and self._client is not None:
            self.flush()
            try:
                self._client.set_terminated(self.run_id, status=status)
            except Exception as error:
                self._fail("set_terminated", error)
        if self.partial:
            self._mark_partial()

    def _mark_partial(self) -> None:
        """Tag the run partial and end it FAILED, if the server is back; else say it stays RUNNING."""
        if self.run_id is None:
            return
        uri = tracking_uri()
        try:
            if not _reachable(uri):
                raise ConnectionError(f"{uri} is unreachable")
            from mlflow.tracking import MlflowClient

            client = MlflowClient(tracking_uri=uri)
            client.set_tag(self.run_id, "tracking", "partial")
            client.set_terminated(self.run_id, status="FAILED")
            log.warning(
                "MLflow run %s lost metrics while the server was away: tagged tracking=partial and ended "
                "FAILED (the run's own files are complete)",
                self.run_id,
            )
        except Exception as error:
            log.warning(
                "MLflow run %s has gaps and could not be marked (%s: %s): it shows as RUNNING; run.json "
                "says tracking: partial",
                self.run_id,
                type(error).__name__,
                error,
            )
