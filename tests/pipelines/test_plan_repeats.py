"""Where a launch writes: one run and several lay out the same ``<out>/<run>/seed<k>`` with seeds."""

from __future__ import annotations

import re

import pytest

from harness.folders import SCRATCH_DIR
from pipelines.launch import main as launch
from pipelines.train import OUT_DIR_ENV, RUN_NAME_ENV, SEEDS_ENV, STOP_AT_ENV, parse_stop_at, plan_repeats


@pytest.fixture
def env(monkeypatch, tmp_path):
    for name in (OUT_DIR_ENV, RUN_NAME_ENV, SEEDS_ENV, STOP_AT_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(OUT_DIR_ENV, str(tmp_path))
    return monkeypatch, tmp_path


def _layout(runs: str) -> list[tuple[str, int, str, str]]:
    return [(run, config.seed, out, name) for run, config, out, name in plan_repeats("suite", runs, "smoke")]


def test_one_run_with_seeds_goes_into_its_run_folder_like_several(env):
    monkeypatch, out = env
    monkeypatch.setenv(SEEDS_ENV, "0,2")
    assert _layout("cifar_dgc") == [
        ("cifar_dgc", 0, str(out / "cifar_dgc" / "seed0"), "cifar_dgc-seed0"),
        ("cifar_dgc", 2, str(out / "cifar_dgc" / "seed2"), "cifar_dgc-seed2"),
    ]
    assert _layout("cifar_dgc,cifar_def") == [
        ("cifar_dgc", 0, str(out / "cifar_dgc" / "seed0"), "cifar_dgc-seed0"),
        ("cifar_dgc", 2, str(out / "cifar_dgc" / "seed2"), "cifar_dgc-seed2"),
        ("cifar_def", 0, str(out / "cifar_def" / "seed0"), "cifar_def-seed0"),
        ("cifar_def", 2, str(out / "cifar_def" / "seed2"), "cifar_def-seed2"),
    ]
    monkeypatch.setenv(RUN_NAME_ENV, "mine")  # --run-name still names a lone run's repeats
    assert [name for *_, name in _layout("cifar_dgc")] == ["mine-seed0", "mine-seed2"]


def test_one_run_without_seeds_writes_into_out_itself(env):
    _, out = env
    assert _layout("cifar_dgc") == [("cifar_dgc", 0, str(out), "cifar_dgc")]
    assert [o for _, _, o, _ in _layout("cifar_dgc,cifar_def")] == [
        str(out / "cifar_dgc"),
        str(out / "cifar_def"),
    ]


def test_stop_at_reaches_every_repeat_and_bad_ones_fail_in_the_launcher(env, capsys):
    monkeypatch, _ = env
    monkeypatch.setenv(SEEDS_ENV, "0,1")
    monkeypatch.setenv(STOP_AT_ENV, "test_accuracy=0.985")
    assert {
        c.stop_at["test_accuracy"] for _, c, _, _ in plan_repeats("suite", "mnist_fp32,mnist_dgc", "smoke")
    } == {0.985}
    assert parse_stop_at("test_loss=1.6") == {"test_loss": 1.6}
    for bad, message in (
        ("accuracy=0.9", "stop_at must be one of {test_accuracy: X}"),
        ("test_loss", "--stop-at 'test_loss': expected METRIC=VALUE"),
        ("test_loss=low", "--stop-at 'test_loss=low': expected METRIC=VALUE"),
    ):
        with pytest.raises(ValueError, match=re.escape(message)):
            parse_stop_at(bad)
    with pytest.raises(SystemExit, match=re.escape("error: --stop-at 'test_loss=x': expected METRIC=VALUE")):
        launch(["suite", "mnist_fp32", "--stop-at", "test_loss=x", "--out", "/nonexistent/never-written"])


def test_a_hand_run_without_out_goes_to_scratch_never_to_results(env):
    """Only DVC stages (which pass --out) write under results/: a hand run at smoke scale once
    replaced a committed 98 % result by a 30 % one."""
    monkeypatch, _ = env
    monkeypatch.delenv(OUT_DIR_ENV)
    assert _layout("cifar_dgc") == [("cifar_dgc", 0, str(SCRATCH_DIR / "suite" / "cifar_dgc"), "cifar_dgc")]
    monkeypatch.setenv(SEEDS_ENV, "1")
    assert [o for _, _, o, _ in _layout("cifar_dgc,cifar_def")] == [
        str(SCRATCH_DIR / "suite" / "cifar_dgc" / "seed1"),
        str(SCRATCH_DIR / "suite" / "cifar_def" / "seed1"),
    ]
