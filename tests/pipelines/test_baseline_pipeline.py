"""The baseline pipeline at smoke scale through ``dvc repro``, in a temporary copy of the repo."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.mlflow_store import fresh_store
from tests.helpers.processes import run_group
from tests.helpers.smoke_record import check_losses
from trainer.paths import REPO_ROOT, data_root

RUNS = ("fp32", "fp16", "topk1_ef")


def _copy_repo(dest: Path) -> None:
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for name in files:
        src = REPO_ROOT / name
        if src.is_file() and not name.startswith("results/"):
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(src.read_bytes())


@pytest.fixture(scope="module")
def smoke_repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("repo")
    _copy_repo(root)
    params_file = root / "pipelines/baseline/params.yaml"
    params = yaml.safe_load(params_file.read_text())
    params["scale"] = "smoke"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "-A"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "copy"], cwd=root, check=True)
    params_file.write_text(yaml.safe_dump(params, sort_keys=False))  # uncommitted: shows in params diff
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(root),
        "THINWIRE_DATA": str(data_root()),
        "THINWIRE_CACHE": str(root / ".cache"),
        "MLFLOW_TRACKING_URI": fresh_store(root),
        "DVC_NO_ANALYTICS": "1",
    }
    dvc = [str(Path(sys.executable).parent / "dvc")]
    result = run_group([*dvc, "repro", "pipelines/baseline/dvc.yaml"], cwd=root, env=env, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return root, env, dvc


def test_every_run_writes_metrics_and_curves(smoke_repo):
    root, _, _ = smoke_repo
    factors = {}
    for run in RUNS:
        folder = root / "results/baseline" / run
        metrics = json.loads((folder / "metrics.json").read_text())
        assert metrics["steps"] == 24 and metrics["world_size"] == 2
        assert 0.1 < metrics["test_accuracy"] <= 1.0
        factors[run] = metrics["compression_factor"]
        assert (folder / "plot.png").read_bytes()[:4] == b"\x89PNG"
        assert (folder / "train_curve.csv").read_text().startswith("step,")
    assert factors["fp32"] == 1.0 and factors["fp16"] == 2.0
    assert 30 < factors["topk1_ef"] < 50  # 1% of entries as (fp32 value, int32 index): at most 50x
    report = (root / "results/baseline/report.md").read_text()
    assert all(f"| {run} |" in report for run in RUNS)
    assert (root / "pipelines/baseline/dvc.lock").exists()


def test_mlflow_has_one_run_per_stage_with_params_metrics_tags_artifacts(smoke_repo):
    root, _, _ = smoke_repo
    db = sqlite3.connect(root / "mlflow.db")
    runs = db.execute(
        "select r.run_uuid, r.name, r.status from runs r join experiments e on r.experiment_id = e.experiment_id "
        "where e.name = 'baseline'"
    ).fetchall()
    assert sorted(name for _, name, _ in runs) == sorted(RUNS)
    assert {status for _, _, status in runs} == {"FINISHED"}
    for run_id, name, _ in runs:
        tags = dict(db.execute("select key, value from tags where run_uuid = ?", (run_id,)).fetchall())
        assert {"git_sha", "stage", "world_size", "backend", "device"} <= set(tags)
        assert tags["world_size"] == "2" and tags["backend"] == "gloo" and tags["stage"] == name
        losses = db.execute(
            "select count(*) from metrics where run_uuid = ? and key = 'train_loss'", (run_id,)
        ).fetchone()
        assert losses[0] == 6  # logged every 4 of 24 steps
        params = dict(db.execute("select key, value from params where run_uuid = ?", (run_id,)).fetchall())
        assert params["dataset"] == "mnist" and params["world_size"] == "2"
        run_json = json.loads((root / "results/baseline" / name / "run.json").read_text())
        assert run_json["mlflow_run_id"] == run_id
    artifacts = {p.name for p in (root / "mlartifacts").rglob("*") if p.is_file()}
    assert {"metrics.json", "plot.png"} <= artifacts


def test_dvc_metrics_show_and_params_diff(smoke_repo):
    root, env, dvc = smoke_repo
    shown = subprocess.run(
        [*dvc, "metrics", "show", "--json"], cwd=root, env=env, capture_output=True, text=True
    )
    assert shown.returncode == 0, shown.stderr
    assert "compression_factor" in shown.stdout
    diff = subprocess.run(
        [*dvc, "params", "diff", "--json"], cwd=root, env=env, capture_output=True, text=True
    )
    assert diff.returncode == 0, diff.stderr
    changed = json.loads(diff.stdout)["pipelines/baseline/params.yaml"]
    assert changed["scale"] == {"old": "cpu", "new": "smoke"}
    status = subprocess.run(
        [*dvc, "status", "pipelines/baseline/dvc.yaml"], cwd=root, env=env, capture_output=True, text=True
    )
    assert "up to date" in status.stdout, status.stdout


def test_smoke_losses_equal_the_record(smoke_repo):
    """Training arithmetic unchanged by refactors: the logged losses are the recorded ones."""
    check_losses("baseline", smoke_repo[0] / "results/baseline")
