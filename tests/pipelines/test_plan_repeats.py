"""Where a launch writes: one run and several lay out the same ``<out>/<run>/seed<k>`` with seeds."""

from __future__ import annotations

import pytest

from pipelines.train import OUT_DIR_ENV, RUN_NAME_ENV, SEEDS_ENV, plan_repeats


@pytest.fixture
def env(monkeypatch, tmp_path):
    for name in (OUT_DIR_ENV, RUN_NAME_ENV, SEEDS_ENV):
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
