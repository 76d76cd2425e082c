"""The MLflow UI on thinwire's store, opening in the model-training view.

    python -m pipelines.mlflow_ui               # make mlflow-ui; then http://127.0.0.1:5000
    python -m pipelines.mlflow_ui --port 5001   # any other option goes to `mlflow server`

MLflow 3.17's UI picks its view from a switch at the top of its sidebar (GenAI / Model training)
that the browser keeps (localStorage ``mlflow.workflowType_v1``), not from an experiment's
``mlflow.experimentKind`` tag. A browser that has never chosen gets GenAI, where an experiment opens
on an empty Traces overview. This runs MLflow's own server (``mlflow server``, as ``mlflow ui``
does, on the store ``MLFLOW_TRACKING_URI`` names, by default ``mlflow.db`` at the repository root)
with one line added to its page: a browser that has not chosen yet starts on Model training (runs,
metrics, charts). The switch works as before, and what the user picks is kept.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainer.paths import REPO_ROOT
from trainer.tracking import tracking_uri

# The UI's key for the switch (its local-storage hook adds "_v<version>") and the model-training value.
VIEW_KEY = "mlflow.workflowType_v1"
MODEL_TRAINING = "machine_learning"
# Runs before MLflow's own script (in <head>): the view a browser without a choice starts in.
DEFAULT_VIEW_SCRIPT = (
    f'<script>try{{localStorage.getItem("{VIEW_KEY}")||'
    f'localStorage.setItem("{VIEW_KEY}",JSON.stringify("{MODEL_TRAINING}"))}}catch(e){{}}</script>'
)
MLFLOW_APP = "mlflow.server.fastapi_app:app"  # what `mlflow server` runs under uvicorn


def with_default_view(page: str) -> str:
    """MLflow's ``index.html`` with :data:`DEFAULT_VIEW_SCRIPT` first in its head."""
    if "<head>" not in page:
        raise ValueError("MLflow's index.html has no <head>: pipelines/mlflow_ui.py needs updating")
    return page.replace("<head>", "<head>" + DEFAULT_VIEW_SCRIPT, 1)


def install(flask_app: Any) -> None:
    """Serve the page with the default view from MLflow's Flask app (the view ``serve``)."""
    from flask import Response

    original = flask_app.view_functions["serve"]
    index = Path(flask_app.static_folder) / "index.html"

    def serve() -> Any:
        if not index.exists():  # a source install without the built UI: MLflow's own message
            return original()
        page = with_default_view(index.read_text())
        return Response(page, mimetype="text/html", headers={"Cache-Control": "no-cache"})

    flask_app.view_functions["serve"] = serve


def __getattr__(name: str) -> Any:
    """``app``: MLflow's ASGI app with :func:`install` applied (what the server's uvicorn loads);
    built on first use, so that importing this module does not start a server's worth of imports."""
    if name != "app":
        raise AttributeError(name)
    from mlflow.server import app as flask_app
    from mlflow.server.fastapi_app import app

    install(flask_app)
    return app


def _serving_this_app(build: Callable[..., list[str]]) -> Callable[..., list[str]]:
    """MLflow's uvicorn command, loading this module's ``app`` instead of MLflow's."""

    def build_command(*args: Any, **kwargs: Any) -> list[str]:
        command = build(*args, **kwargs)
        if command[-1] != MLFLOW_APP:
            raise RuntimeError(
                f"`mlflow server` would start {command[-1]!r}, not {MLFLOW_APP!r}: this MLflow is not "
                "the one pipelines/mlflow_ui.py was written for; `mlflow ui` works (switch to Model "
                "training at the top of the sidebar)"
            )
        return [*command[:-1], "pipelines.mlflow_ui:app"]  # not __name__: "__main__" under -m

    return build_command


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5000)
    parser.add_argument("--backend-store-uri", default=None, help="default: MLFLOW_TRACKING_URI or mlflow.db")
    args, rest = parser.parse_known_args(argv)
    from harness.entry import quiet_environment

    quiet_environment()
    # MLflow's job runner serves GenAI features (scorers, trace roll-ups): 7 more processes and
    # seconds of start-up for a store that holds none
    os.environ.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    # the server's workers import this module: from the repository, wherever this was started
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    import mlflow.server
    from mlflow.cli import server

    mlflow.server._build_uvicorn_command = _serving_this_app(mlflow.server._build_uvicorn_command)
    uri = args.backend_store_uri or tracking_uri()
    print(
        f"MLflow UI on {uri}: http://{args.host}:{args.port} (opens in the model-training view)", flush=True
    )
    server.main(
        ["--backend-store-uri", uri, "--host", args.host, "--port", str(args.port), "--workers", "1", *rest],
        prog_name="mlflow ui",
    )


if __name__ == "__main__":
    main()
