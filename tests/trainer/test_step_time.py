"""Per-step time outside communication: floats at once on a CPU, CUDA events resolved later."""

from __future__ import annotations

import pytest
import torch

from common.comm.stats import CommStats
from trainer.step_time import StepTimes


def test_on_a_cpu_a_step_is_its_wall_time_less_its_communicate_seconds():
    stats, times = CommStats(), StepTimes(torch.device("cpu"))
    stats.add_seconds("communicate", 4.0)  # before the step: not the step's
    times.start(stats)
    stats.add_seconds("communicate", 0.25)
    stats.add_seconds("compress", 1.0)  # not communication
    times.stop(stats, 1.5)
    assert times.take() == [1.25] and times.take() == []


class _Clock:
    """A fake device clock: events record its time, in seconds."""

    now = 0.0


class _FakeEvent:
    """``torch.cuda.Event``'s surface, on the fake clock (elapsed_time in milliseconds)."""

    def __init__(self, enable_timing: bool = False) -> None:
        self.time: float | None = None

    def record(self, stream: object = None) -> None:
        self.time = _Clock.now

    def synchronize(self) -> None:
        assert self.time is not None, "synchronized before it was recorded"

    def elapsed_time(self, end: _FakeEvent) -> float:
        assert self.time is not None and end.time is not None
        return (end.time - self.time) * 1e3


def _phase(stats: CommStats, name: str, begin: float, end: float) -> None:
    _Clock.now = begin
    with stats.phase(name, torch.device("cuda")):
        _Clock.now = end


def test_on_cuda_steps_are_resolved_when_taken_with_their_own_communication(monkeypatch):
    """Each step: the device span of its start and end events less the communicate phases it
    queued and the host-timed seconds it added; also when something reads ``stats.seconds`` inside
    a step (which resolves the earlier steps' phases too: they are not this step's)."""
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    stats, times = CommStats(), StepTimes(torch.device("cuda"))
    _Clock.now = 0.0
    times.start(stats)
    _phase(stats, "communicate", 1.0, 3.0)
    _phase(stats, "compress", 3.0, 4.0)
    stats.add_seconds("communicate", 0.5)
    _Clock.now = 10.0
    times.stop(stats, step_seconds=123.0)  # the host's time: not the measure on CUDA

    times.start(stats)
    _phase(stats, "communicate", 11.0, 12.0)
    assert stats.seconds["communicate"] == 3.5  # a read inside the step: both steps' phases so far
    _phase(stats, "communicate", 13.0, 17.0)
    _Clock.now = 20.0
    times.stop(stats, step_seconds=123.0)

    times.start(stats)
    _phase(stats, "communicate", 21.0, 22.0)
    _Clock.now = 22.5
    times.stop(stats, step_seconds=123.0)
    assert times.take() == pytest.approx([10.0 - 2.5, 10.0 - 5.0, 2.5 - 1.0])
    assert times.take() == []
    assert stats.seconds["communicate"] == pytest.approx(2.5 + 5.0 + 1.0)
