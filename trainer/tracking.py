"""MLflow tracking for rank 0 (other ranks get a no-op), robust to an unreachable server.

The tracking URI comes from ``MLFLOW_TRACKING_URI``; the default is the SQLite file
``mlflow.db`` at the repository root (``mlflow ui --backend-store-uri sqlite:///mlflow.db``).
One experiment per pipeline, one run per stage instance; a run whose outputs go elsewhere than the
release's folder (a hand run) goes to ``scratch-<pipeline>`` (:func:`experiment_for`). If the
server cannot be reached, or any MLflow call fails, the run keeps training: one warning is logged
and tracking switches off. A run whose tracking broke after it started, or that lost rows, is
*partial* (:attr:`Tracker.state`; ``run.json`` says so): at its end the tracker tries once more to
tag the MLflow run ``tracking=partial`` and end it FAILED, so it does not stay RUNNING with a silent
gap in its metrics.

Rows are buffered and sent in batches. A checkpoint sends them first (:meth:`Tracker.flush` with
``through_step``, recorded in the run's tag ``thinwire.logged_through``), so a run killed after its
checkpoint loses no row a resume does not log again; SIGTERM sends them and ends the run KILLED (a
resume reopens it). A resume skips the rows the store already holds (the steps a kill made it log
twice) and marks the run partial if the store lacks rows up to its checkpoint.
``mlflow`` is imported lazily (it costs 1-2 s), and only on rank 0.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .code_version import CODE_PATHS, git_sha, loaded_git_sha
from .paths import REPO_ROOT

log = logging.getLogger(__name__)

# Re-exported: callers record the code version beside the tracking they set up.
__all__ = [
    "CODE_PATHS",
    "Tracker",
    "ensure_experiment",
    "experiment_for",
    "git_sha",
    "loaded_git_sha",
    "tracking_uri",
]


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{REPO_ROOT / 'mlflow.db'}"


# The experiment's kind: "custom_model_development" is the model-training view (runs, metrics,
# charts). MLflow 3.0-3.x UIs before the sidebar's GenAI / Model training switch open an experiment
# by this tag; 3.17's UI ignores it and follows the switch, which the browser keeps (default GenAI):
# pipelines.mlflow_ui serves the UI with the switch starting on Model training.
EXPERIMENT_KIND_TAG = ("mlflow.experimentKind", "custom_model_development")
# The step through which every row of the run is in the store (set by a checkpoint's flush).
LOGGED_THROUGH_TAG = "thinwire.logged_through"
# Final values without a curve of their own are tags "summary.<name>", not metrics: MLflow charts
# every metric, a single value as a bar, and puts a "<prefix>/" section above the curves (3.17).
SUMMARY_PREFIX = "summary."
SCRATCH_PREFIX = "scratch-"


def experiment_for(name: str, out_dir: str | Path, release_dir: str | Path) -> str:
    """The experiment of a run writing to ``out_dir``: ``name`` when that is inside ``release_dir``
    (the folder a release's stages write), else ``scratch-<name>`` (a hand run), so a hand run
    never lands among a release's runs."""
    try:
        Path(out_dir).resolve().relative_to(Path(release_dir).resolve())
    except ValueError:
        return f"{SCRATCH_PREFIX}{name}"
    return name


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
    sent in batches of ``flush_every`` rows so a run of thousands of steps costs a few writes; the
    loop sends them at each checkpoint (:meth:`flush` with ``through_step``). From :meth:`start` to
    :meth:`finish` SIGTERM sends them, ends the run KILLED and then does what it did before.
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
        self.partial = False  # tracking broke after the run was created, or rows were lost: gaps
        self._curve_keys: set[str] = set()  # keys logged per step (their last point is their final value)
        self._stored_through: dict[str, int] = {}  # a resumed run: each key's last step in the store
        self._ended = False
        self._in_call = 0  # MLflow calls under way in this thread (SIGTERM waits for them)
        self._sigterm_pending = False
        self._previous_sigterm: Any = None

    @property
    def state(self) -> str:
        """ "off" (never tracked), "partial" (tracking broke or rows were lost) or "complete"."""
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

    def start(
        self, params: Mapping[str, Any], tags: Mapping[str, str], *, resume_step: int | None = None
    ) -> str | None:
        """Start (or resume, if ``run_id`` was given) the run; returns its id or None.

        ``resume_step``: the checkpoint a resumed run continues from. If the store lacks rows up to
        it (they were buffered when the run was killed), the run is partial."""
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
            from mlflow.entities import Param, RunTag
            from mlflow.tracking import MlflowClient

            client = MlflowClient(tracking_uri=uri)
            if self.run_id is None:
                experiment_id = ensure_experiment(client, self.experiment, uri)
                run = client.create_run(experiment_id, run_name=self.run_name, tags=dict(tags))
                self.run_id = run.info.run_id
                client.log_batch(self.run_id, params=[Param(k, str(v)[:6000]) for k, v in params.items()])
            else:
                self._resume(client, resume_step)
                client.update_run(self.run_id, status="RUNNING")
                if tags:
                    client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])
            self._client = client
        except Exception as error:  # any MLflow or connection failure: train on
            self._fail("start", error)
            return None
        self._install_sigterm()
        return self.run_id

    def _resume(self, client: Any, resume_step: int | None) -> None:
        """What the store holds of the run: each key's last step (rows a resume logs again are
        skipped), and whether it has every row up to the checkpoint ``resume_step``."""
        run = client.get_run(self.run_id)
        for key in run.data.metrics:
            steps = [m.step for m in client.get_metric_history(self.run_id, key)]
            self._stored_through[key] = max(steps, default=-1)
            self._curve_keys.add(key)
        logged = run.data.tags.get(LOGGED_THROUGH_TAG)
        if resume_step and (logged is None or int(logged) < resume_step):
            self.partial = True
            log.warning(
                "MLflow run %s resumes at step %d but holds every row only through %s: the rows "
                "buffered when it was killed are lost; it is marked tracking=partial",
                self.run_id,
                resume_step,
                f"step {logged}" if logged is not None else "no checkpoint",
            )

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """One row per key at ``step`` (a curve's point)."""
        if not self.enabled or self._client is None:
            return
        self._curve_keys.update(metrics)
        self._queue(metrics, step)

    def log_summary(self, values: Mapping[str, float]) -> None:
        """A run's final values, so that its charts are its curves. A key logged as a curve is not
        sent again (its last point is the final value, shown in the runs table and searchable as
        ``metrics.<key>``); the others become tags ``summary.<key>`` (the run's overview lists them;
        the runs table can show them). Values that are not finite are left out."""
        if not self.enabled or self._client is None:
            return
        from mlflow.entities import RunTag

        summary = [
            RunTag(f"{SUMMARY_PREFIX}{k}", repr(float(v)))
            for k, v in values.items()
            if k not in self._curve_keys and math.isfinite(float(v))
        ]
        try:
            with self._calling():
                self._client.log_batch(self.run_id, tags=summary)
        except Exception as error:
            self._fail("log_batch", error)

    def _queue(self, metrics: Mapping[str, float], step: int) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._pending.extend(
            Metric(k, float(v), now, step)
            for k, v in metrics.items()
            if step > self._stored_through.get(k, -1)  # not in the store already (logged before a kill)
        )
        if len(self._pending) >= self.flush_every:
            self.flush()

    def flush(self, through_step: int | None = None) -> None:
        """Send the buffered rows. ``through_step`` (a checkpoint at that step): also record in the
        run (tag ``thinwire.logged_through``) that the store holds every row through it."""
        if not self.enabled or self._client is None or (not self._pending and through_step is None):
            return
        from mlflow.entities import RunTag

        tags = [RunTag(LOGGED_THROUGH_TAG, str(through_step))] if through_step is not None else []
        try:
            with self._calling():
                starts = range(0, max(len(self._pending), 1), 900)  # MLflow caps a batch at 1000 metrics
                for start in starts:
                    last = start == starts[-1]
                    batch = self._pending[start : start + 900]
                    self._client.log_batch(self.run_id, metrics=batch, tags=tags if last else [])
                self._pending = []
        except Exception as error:
            self._fail("log_batch", error)

    def log_artifact(self, path: str | Path) -> None:
        if not self.enabled or self._client is None:
            return
        try:
            with self._calling():
                self._client.log_artifact(self.run_id, str(path))
        except Exception as error:
            self._fail("log_artifact", error)

    def finish(self, status: str = "FINISHED") -> None:
        """Send what is buffered and end the run ``status`` (FAILED when it is partial and was to
        end FINISHED). A SIGTERM meanwhile ends it KILLED."""
        if not self._ended:
            self._end(status)
        self._uninstall_sigterm()

    def _end(self, status: str) -> None:
        if self.enabled and self._client is not None:
            self.flush()
            try:
                if not self.partial:
                    with self._calling():
                        self._client.set_terminated(self.run_id, status=status)
            except Exception as error:
                self._fail("set_terminated", error)
        if self.partial:
            self._mark_partial("FAILED" if status == "FINISHED" else status)
        self._ended = True

    # -- SIGTERM: send what is buffered, end the run KILLED, then what SIGTERM did before ----------

    def _install_sigterm(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # only the main thread may set a handler; a tracker elsewhere ends as it can
        try:
            self._previous_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)
        except (ValueError, OSError):
            return

    def _uninstall_sigterm(self) -> None:
        if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
            signal.signal(signal.SIGTERM, self._previous_sigterm or signal.SIG_DFL)

    @contextmanager
    def _calling(self) -> Iterator[None]:
        """An MLflow call: a SIGTERM arriving meanwhile is handled when it returns (sending rows from
        inside the handler would enter the store's client while it is in use)."""
        self._in_call += 1
        try:
            yield
        finally:
            self._in_call -= 1
            if self._sigterm_pending and not self._in_call:
                self._sigterm_pending = False
                self._on_sigterm(signal.SIGTERM, None)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if self._in_call:
            self._sigterm_pending = True
            return
        previous = self._previous_sigterm
        self._uninstall_sigterm()
        if not self._ended:
            if self.enabled and self._client is not None:
                log.warning(
                    "SIGTERM: MLflow run %s gets its buffered rows and ends KILLED (a resume reopens it)",
                    self.run_id,
                )
            self._end("KILLED")
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:  # the default: die of the signal, as without this handler
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    def _mark_partial(self, status: str = "FAILED") -> None:
        """Tag the run partial and end it ``status``, if the server is back; else say it stays RUNNING."""
        if self.run_id is None:
            return
        uri = tracking_uri()
        try:
            if not _reachable(uri):
                raise ConnectionError(f"{uri} is unreachable")
            from mlflow.tracking import MlflowClient

            client = MlflowClient(tracking_uri=uri)
            client.set_tag(self.run_id, "tracking", "partial")
            client.set_terminated(self.run_id, status=status)
            log.warning(
                "MLflow run %s has gaps in its metrics (the server was away or rows were lost): tagged "
                "tracking=partial and ended %s (the run's own files are complete)",
                self.run_id,
                status,
            )
        except Exception as error:
            log.warning(
                "MLflow run %s has gaps and could not be marked (%s: %s): it shows as RUNNING; run.json "
                "says tracking: partial",
                self.run_id,
                type(error).__name__,
                error,
            )
