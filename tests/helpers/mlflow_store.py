"""A fresh MLflow SQLite store for a test in milliseconds: a copy of one migrated template.

Creating a store runs MLflow's schema migrations (2-5 s on 2 cores, more under load); a test
session creates a dozen. The template is built once per session, in a temporary folder removed
at exit, and copied into each test's own folder.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

_template: Path | None = None


def _build_template() -> Path:
    global _template
    if _template is None:
        from mlflow.tracking import MlflowClient

        folder = Path(tempfile.mkdtemp(prefix="thinwire-mlflow-template-"))
        atexit.register(shutil.rmtree, folder, True)
        path = folder / "mlflow.db"
        MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()  # creates every table
        _template = path
    return _template


def fresh_store(folder: str | Path) -> str:
    """``folder/mlflow.db``, an empty migrated store (unless one is there already); its URI."""
    path = Path(folder) / "mlflow.db"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_build_template(), path)
    return f"sqlite:///{path}"
