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
import functools  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

# Tests never log into the repository's own mlflow.db (a developer's store of real runs): tracking
# that a test does not point elsewhere goes to a store of its own, removed at exit. Each pytest-xdist
# worker makes its own (workers inherit the controller's environment; two writers on one SQLite
# file would wait on each other's locks).
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if "MLFLOW_TRACKING_URI" not in os.environ or os.environ.get("THINWIRE_TESTS_STORE_OF", _WORKER) != _WORKER:
    _mlflow_dir = tempfile.mkdtemp(prefix="thinwire-tests-mlflow-")
    atexit.register(shutil.rmtree, _mlflow_dir, True)
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{_mlflow_dir}/mlflow.db"
    os.environ["THINWIRE_TESTS_STORE_OF"] = _WORKER


# `make test` runs the tests on 2 pytest-xdist workers, a group of tests at a time (the scheduler
# below): a module's tests stay on one worker (its module-scoped fixtures run once), the modules that
# read the suite's smoke runs share one (that session fixture runs once), and the end-to-end modules
# go first, so that neither worker ends on a long module alone. (xdist's own `--dist loadgroup`
# does not group under pytest 9: it renames `item._nodeid`, which pytest 9 no longer reads.)
SUITE_GROUP = "suite_smoke"
FIRST = ("tests/pipelines/", "tests/test_examples.py", "tests/harness/test_cluster.py")
REPO_ROOT = Path(__file__).resolve().parent.parent


@functools.cache
def _group(module: str) -> str:
    """The group of the tests in ``module`` (a path from the repository root, as in a node id)."""
    path = REPO_ROOT / module
    reads_suite = path.suffix == ".py" and path.is_file() and "suite_smoke" in path.read_text()
    return SUITE_GROUP if reads_suite else module


def _order(nodeid: str) -> int:
    group = _group(nodeid.split("::")[0])
    if group == SUITE_GROUP:
        return 0
    return 1 if group.startswith(FIRST) else 2


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        """Whole groups to a worker, in collection order (which `pytest_collection_modifyitems` sets)."""

        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid.split("::")[0])

    config.option.loadscopereorder = False  # keep the order below, not xdist's largest-group-first
    return ByGroup(config, log)


# The end-to-end tests' limit (pyproject's timeout, 300 s, counts a test's fixtures too): beside the
# other worker, the first test of the suite's group trains the suite's and a paper's smoke runs in
# its set-up (115 s alone, 300 s and cut off beside another worker's end-to-end tests).
END_TO_END_TIMEOUT = 900


def pytest_collection_modifyitems(config, items):
    import torch

    items.sort(key=lambda item: _order(item.nodeid))  # stable: collection order within each rank
    for item in items:
        if _order(item.nodeid) < 2 and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(END_TO_END_TIMEOUT))
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA (none on this machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
