"""Test-wide set-up.

TRITON_INTERPRET must be set before any ``@triton.jit`` function is defined (otherwise a launch on
CPU tensors fails with "0 active drivers"), so it is set here, before test modules import kernels.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
for _key, _value in {
    "DVC_NO_ANALYTICS": "1",
    "ITERATIVE_DO_NOT_TRACK": "1",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "true",
    "HF_HUB_OFFLINE": "1",
}.items():
    os.environ.setdefault(_key, _value)

import atexit  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

import pytest  # noqa: E402

# Tests never log into the repository's own mlflow.db (a developer's store of real runs): tracking
# that a test does not point elsewhere goes to a store of its own, removed at exit.
if "MLFLOW_TRACKING_URI" not in os.environ:
    _mlflow_dir = tempfile.mkdtemp(prefix="thinwire-tests-mlflow-")
    atexit.register(shutil.rmtree, _mlflow_dir, True)
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{_mlflow_dir}/mlflow.db"


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA (none on this machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
