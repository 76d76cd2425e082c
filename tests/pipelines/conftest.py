"""The task suite trained once at smoke scale for every pipeline test that reads it (a paper's
report judges its accuracy claims on the suite's runs)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from common.paths import REPO_ROOT
from tests.helpers.processes import run_group

# every strategy the suite uses (data parallel, dgc, def, sparse), both task kinds, what the paper
# pipelines' tests read (TernGrad on Fashion-MNIST, DGC and QSGD on Tiny Shakespeare)
SUITE_RUNS = (
    "fmnist_fp32,fmnist_dgc,fmnist_def,fmnist_exdyna,fmnist_terngrad,shakespeare_fp32,shakespeare_qsgd4,shakespeare_dgc,"
    "shakespeare_exdyna"
)
SUITE_SEEDS = (0, 1)


def run_steps(steps: list[list[str]], env: dict[str, str], timeout: float = 600) -> None:
    for command in steps:
        result = run_group(command, cwd=REPO_ROOT, env=env, timeout=timeout)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]


def tracking_env(root: Path) -> dict[str, str]:
    return {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}"}


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
