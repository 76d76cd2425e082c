"""The task suite trained once at smoke scale for every pipeline test that reads it (a paper's
report judges its accuracy claims on the suite's runs)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.helpers.mlflow_store import fresh_store
from tests.helpers.processes import run_group
from trainer.paths import REPO_ROOT

# every strategy the suite uses (data parallel, dgc, def, sparse), both task kinds, what the paper
# pipelines' tests read (TernGrad on MNIST, DGC and QSGD on Tiny Shakespeare)
SUITE_RUNS = (
    "mnist_fp32,mnist_dgc,mnist_def,mnist_exdyna,mnist_terngrad,shakespeare_fp32,shakespeare_qsgd4,shakespeare_dgc,"
    "shakespeare_exdyna"
)
SUITE_SEEDS = (0, 1)
# the CIFAR-10 runs the papers' training-length studies read: the 1x pair and fp32 at 2x and 4x
LENGTH_SUITE_RUNS = "cifar_fp32,cifar_dgc,cifar_def,cifar_fp32x2,cifar_fp32x4"


# Stages whose ``main(argv)`` the tests call in this process (torch and MLflow are imported already:
# a subprocess would spend seconds importing them again); a launch always gets its own processes.
IN_PROCESS = ("pipelines.evaluate", "pipelines.suite.report")


def _runs_in_process(command: list[str]) -> bool:
    if command[1:2] != ["-m"]:
        return False
    module = command[2]
    return module in IN_PROCESS or (module.startswith("papers.") and module.endswith(".report"))


def _in_process(command: list[str], env: dict[str, str]) -> None:
    import importlib

    module = importlib.import_module(command[2])
    saved, cwd = dict(os.environ), os.getcwd()
    os.chdir(REPO_ROOT)
    os.environ.clear()
    os.environ.update(env)
    try:
        module.main(command[3:])
    except SystemExit as error:
        assert error.code in (0, None), f"{' '.join(command[2:])} exited with {error.code!r}"
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(saved)


def run_steps(steps: list[list[str]], env: dict[str, str], timeout: float = 600) -> None:
    for command in steps:
        if _runs_in_process(command):
            _in_process(command, env)
            continue
        result = run_group(command, cwd=REPO_ROOT, env=env, timeout=timeout)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]


def tracking_env(root: Path) -> dict[str, str]:
    return {**os.environ, "MLFLOW_TRACKING_URI": fresh_store(root)}


@pytest.fixture(scope="session")
def suite_smoke(tmp_path_factory) -> Path:
    """``<root>/runs/group/<run>/seed<k>``, ``<root>/evaluations/group/...`` and the suite's report."""
    root = tmp_path_factory.mktemp("suite")
    seeds = ",".join(str(s) for s in SUITE_SEEDS)
    launch = [
        sys.executable,
        "-m",
        "pipelines.launch",
        "suite",
        SUITE_RUNS,
        "--scale",
        "smoke",
        "--seeds",
        seeds,
    ]
    run_steps(
        [
            [*launch, "--out", str(root / "runs" / "group")],
            [sys.executable, "-m", "pipelines.evaluate", "suite", "group", "--root", str(root)],
            [sys.executable, "-m", "pipelines.suite.report", "--root", str(root)],
        ],
        tracking_env(root),
    )
    return root


@pytest.fixture(scope="session")
def length_suite(tmp_path_factory) -> Path:
    """The suite's CIFAR-10 runs of the training-length studies at smoke scale (seed 0: each model's
    evaluation covers the whole 10,000-image test split), evaluated and reported, in a suite folder
    of their own (the shared one has no CIFAR-10 runs)."""
    root = tmp_path_factory.mktemp("length_suite")
    launch = [sys.executable, "-m", "pipelines.launch", "suite", LENGTH_SUITE_RUNS, "--scale", "smoke"]
    run_steps(
        [
            [*launch, "--seeds", "0", "--out", str(root / "runs" / "group")],
            [sys.executable, "-m", "pipelines.evaluate", "suite", "group", "--root", str(root)],
            [sys.executable, "-m", "pipelines.suite.report", "--root", str(root)],
        ],
        tracking_env(root),
    )
    return root


# The length studies' first test sets up a CIFAR-10 suite and a paper's longer runs, and evaluates 7
# models on the whole test split: beyond END_TO_END_TIMEOUT (900 s) when the 2 cores are shared.
LENGTH_TIMEOUT = 1800


def train_evaluate_report(
    pipeline: str, runs: str, group: str, seeds: str, suite_root: Path, root: Path, report: str
) -> Path:
    """A paper pipeline at smoke scale in ``root``: its ``runs`` (one launch) into ``runs/<group>``,
    the evaluate stage, then its report module against the suite's results in ``suite_root``."""
    launch = [sys.executable, "-m", "pipelines.launch", pipeline, runs, "--scale", "smoke", "--seeds", seeds]
    run_steps(
        [
            [*launch, "--out", str(root / "runs" / group)],
            [sys.executable, "-m", "pipelines.evaluate", pipeline, group, "--root", str(root)],
            [sys.executable, "-m", report, "--suite", str(suite_root), "--root", str(root)],
        ],
        tracking_env(root),
    )
    return root
