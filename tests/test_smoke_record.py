"""The smoke-loss record: exact on a recorded platform, coarse elsewhere (tests/helpers/smoke_record.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import smoke_record


def _write_curve(root: Path, run: str, losses: list[float]) -> None:
    folder = root / run
    folder.mkdir(parents=True)
    rows = "".join(f"{i},{loss!r}\n" for i, loss in enumerate(losses))
    (folder / "train_curve.csv").write_text("step,train_loss\n" + rows)


@pytest.fixture
def record_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "record"
    monkeypatch.setattr(smoke_record, "RECORD_DIR", folder)
    monkeypatch.delenv(smoke_record.RECORD_ENV, raising=False)
    return folder


def test_a_recorded_platform_is_held_to_the_last_bits(record_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(smoke_record, "platform_key", lambda: "x86_64-here")
    record_dir.mkdir()
    (record_dir / "p.json").write_text(json.dumps({"x86_64-here": {"a": [2.0, 1.5]}}))
    _write_curve(tmp_path / "ok", "a", [2.0, 1.5])
    smoke_record.check_losses("p", tmp_path / "ok")
    _write_curve(tmp_path / "off", "a", [2.0, 1.5 * (1 + 1e-5)])
    with pytest.raises(AssertionError, match=r"p on x86_64-here a: logged loss 1"):
        smoke_record.check_losses("p", tmp_path / "off")


def test_another_platform_gets_the_coarse_check_against_every_record(record_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(smoke_record, "platform_key", lambda: "x86_64-elsewhere")
    record_dir.mkdir()
    (record_dir / "p.json").write_text(json.dumps({"x86_64-here": {"a": [2.0, 1.5]}}))
    _write_curve(tmp_path / "near", "a", [2.0, 1.5 * (1 + 1e-2)])  # last bits differ: passes
    smoke_record.check_losses("p", tmp_path / "near")
    _write_curve(tmp_path / "broken", "a", [2.0, 1.5 * 1.2])  # a broken method: fails
    with pytest.raises(AssertionError, match="against x86_64-here's record"):
        smoke_record.check_losses("p", tmp_path / "broken")


def test_recording_adds_this_platform_and_keeps_the_others(record_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(smoke_record, "platform_key", lambda: "x86_64-new")
    monkeypatch.setenv(smoke_record.RECORD_ENV, "1")
    record_dir.mkdir()
    (record_dir / "p.json").write_text(json.dumps({"x86_64-old": {"a": [3.0]}}))
    _write_curve(tmp_path / "runs", "a", [2.5])
    smoke_record.check_losses("p", tmp_path / "runs")
    assert json.loads((record_dir / "p.json").read_text()) == {
        "x86_64-new": {"a": [2.5]},
        "x86_64-old": {"a": [3.0]},
    }


def test_the_platform_key_names_the_architecture_and_a_cpu_path():
    arch, _, isa = smoke_record.platform_key().partition("-")
    assert arch and isa, smoke_record.platform_key()
