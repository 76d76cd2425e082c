"""Calibration and leaderboard at smoke scale over real shaped links, in a temporary copy of the repo."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest

from harness import netem
from tests.helpers.mlflow_store import fresh_store
from tests.helpers.processes import run_group
from tests.pipelines.test_baseline_pipeline import _copy_repo
from trainer.paths import cache_root, data_root

pytestmark = pytest.mark.skipif(
    not netem.supported(), reason="needs root and iproute2 (ip, tc) for network namespaces"
)


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("repo")
    _copy_repo(root)
    env = {
        **os.environ,
        "PYTHONPATH": str(root),
        "THINWIRE_DATA": str(data_root()),
        "THINWIRE_CACHE": str(cache_root()),  # decoded once, shared: read-only use
        "MLFLOW_TRACKING_URI": fresh_store(root),
    }
    return root, env


def _run(root: Path, env: dict[str, str], *args: str, timeout: float = 600):
    result = run_group([sys.executable, "-m", *args], cwd=root, env=env, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def calibrated(repo):
    """The cost-model fit at smoke scale over real shaped links, in the copy of the repository."""
    root, env = repo
    _run(
        root,
        env,
        "pipelines.calibrate",
        "--scale",
        "smoke",
        "--workers",
        "2",
        "--bandwidths",
        "200mbit",
        "1gbit",
    )
    fit = json.loads((root / "results/costmodel/fit.json").read_text())
    assert len(fit["rows"]) == 4  # 1 worker count x 2 bandwidths x 2 methods
    assert fit["params"]["efficiency"] > 0.5  # the links are really shaped: wire time dominates
    assert (root / "results/costmodel/fit.png").stat().st_size > 0
    table = (root / "results/costmodel/fit.md").read_text()
    assert "| fp32 | 2 | 200 Mbit/s |" in table and "| topk1_ef | 2 | 1 Gbit/s |" in table

    return fit


def test_leaderboard_measures_the_small_vision_task_and_models_every_task(repo, calibrated, suite_smoke):
    root, env = repo
    _run(
        root,
        env,
        "pipelines.leaderboard",
        "--scale",
        "smoke",
        "--suite",
        str(suite_smoke),
        "--tasks",
        "mnist",
        "shakespeare",
        "--methods",
        "fp32",
        "dgc",
        "--bandwidths",
        "200mbit",
        "--spot-checks",
        "shakespeare_dgc@200mbit",
        "--seeds",
        "0",
    )
    report = json.loads((root / "results/leaderboard/report.json").read_text())
    runs = root / "results/leaderboard/runs"
    assert sorted(p.name for p in runs.iterdir()) == ["mnist_200mbit", "shakespeare_s0", "spot_200mbit"]
    rows = {(r["task"], r["method"]): r for r in report["rows"]}
    assert set(rows) == {(t, m) for t in ("mnist", "shakespeare") for m in ("fp32", "dgc")}
    fp32, dgc = rows[("mnist", "fp32")], rows[("mnist", "dgc")]
    assert fp32["network"] == "200mbit" and fp32["rate"] == "200mbit"  # really trained over the shaped link
    # every run is the suite's recipe stretched to 2x its steps (smoke: max_steps 6 -> 12), stopped at the target
    config = json.loads((runs / "mnist_200mbit" / "mnist_dgc" / "seed0" / "run.json").read_text())["config"]
    assert config["max_steps"] == 12 and config["stop_at"] and report["stretch"] == 2
    for row in report["rows"]:
        assert row["step_limit"] == 12 and row["seeds"] == [0] and len(row["steps_to_target"]) == 1
        reached = row["steps_to_target"][0]
        assert row["within"] == (reached is not None) and (reached is None or reached <= 12)
    assert dgc["bits_per_step"] < fp32["bits_per_step"] / 2
    assert fp32["measured_step_ms"] > 0 and fp32["modelled_step_ms"] > 0
    # the modelled tasks: steps to target x modelled step time, no measurement
    assert "measured_seconds" not in rows[("shakespeare", "fp32")]
    spot = report["spot_checks"]
    assert [(s["run"], s["rate"]) for s in spot] == [("shakespeare_dgc", "200mbit")]
    assert spot[0]["network"] == "200mbit" and spot[0]["measured_step_ms"] > 0
    assert {r["method"] for r in report["extrapolation"]} == {"fp32", "dgc"}
    text = (root / "results/leaderboard/report.md").read_text()
    assert "Spot checks" in text and "512 workers" in text
    missed = [r for r in report["rows"] if not r["within"]]
    assert all("not within 2x steps (0 of 1 seeds reached)" in text for _ in missed)
    assert (root / "results/leaderboard/leaderboard.png").stat().st_size > 0


def test_a_bad_method_fails_before_any_network_is_built(repo, suite_smoke):
    root, env = repo
    result = run_group(
        [
            sys.executable,
            "-m",
            "pipelines.leaderboard",
            "--suite",
            str(suite_smoke),
            "--methods",
            "fp32",
            "nope",
        ],
        cwd=root,
        env=env,
        timeout=120,
    )
    assert result.returncode != 0
    assert "stage.methods nope have no" in result.stderr


def test_the_root_stages_train_every_group_of_the_params():
    import yaml

    from harness.params import load_params
    from pipelines.leaderboard.training import groups, modelled_group, settings
    from trainer.paths import REPO_ROOT

    cfg = settings(list(load_params("suite")["runs"]))
    stages = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())["stages"]
    assert stages["leaderboard_train"]["foreach"] == list(groups(cfg))
    assert cfg.stretch == 2 and cfg.seeds == (0, 1, 2)
    measured = groups(cfg)["mnist_100mbit"]
    assert (
        measured.rate == "100mbit" and measured.seeds == (0, 1, 2) and len(measured.runs) == len(cfg.methods)
    )
    # a modelled task: one seed and at most group_runs methods per group, every method once per seed
    assert cfg.group_runs == 4
    parts = [g for name, g in groups(cfg).items() if name.startswith("cifar_s1_")]
    assert [len(g.runs) for g in parts] == [4, 4, 4, 2]
    assert [r for g in parts for r in g.runs] == [f"cifar_{m}" for m in cfg.methods]
    assert all(g.seeds == (1,) and g.rate is None for g in parts)
    assert modelled_group(cfg, "cifar_dgc", 1) == "cifar_s1_b"
    assert groups(cfg)["spot_100mbit"].runs == ["cifar_fp32", "cifar_dgc"]


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "4"])
def test_a_bad_group_size_is_refused_naming_it(bad):
    from harness.params import load_params
    from pipelines.leaderboard.training import settings

    with pytest.raises(ValueError, match=rf"stage.group_runs must be a positive integer .* got {bad!r}"):
        settings(list(load_params("suite")["runs"]), {"group_runs": bad})


def test_without_a_group_size_a_modelled_seed_is_one_group():
    from harness.params import load_params
    from pipelines.leaderboard.training import groups, modelled_group, settings

    cfg = dataclasses.replace(settings(list(load_params("suite")["runs"])), group_runs=None)
    assert groups(cfg)["shakespeare_s2"].runs == [f"shakespeare_{m}" for m in cfg.methods]
    assert modelled_group(cfg, "shakespeare_fp32", 2) == "shakespeare_s2"
    with pytest.raises(ValueError, match="no unshaped leaderboard group trains cifar_fp32 at seed 7"):
        modelled_group(cfg, "cifar_fp32", 7)
