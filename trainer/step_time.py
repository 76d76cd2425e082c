"""Each training step's time outside communication, measured without waiting for the device.

The loop's ``sync_compute_seconds`` (metrics.json) sums over steps the slowest rank's time outside
communication. What one rank measures per step:

- on a CPU: the step's wall time (the loop's ``perf_counter`` span) minus the seconds its
  strategy's :class:`CommStats` added to ``communicate`` during the step, a float at once;
- on CUDA: the device time between two events recorded on the current stream at the step's start
  and end (it includes the device's idle time while the host launches the step) minus the step's
  communicate seconds: the CUDA phases it queued (event pairs) plus host-timed additions
  (``CommStats.add_seconds``). Nothing is read inside the step: :meth:`StepTimes.take` resolves
  the events, at log steps and before a checkpoint.

``CommStats.seconds`` resolves every pending CUDA phase (it waits for the device), so the step's
share is read from the stats' unresolved state instead (``_pending``, ``_seconds``: CommStats has
no public view of it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from common.comm.stats import CommStats

PHASE = "communicate"


@dataclass
class _CudaStep:
    """One CUDA step, unresolved: its span, and what it added to the communicate phase."""

    start: Any  # torch.cuda.Event at the step's start
    end: Any  # and at its end
    host_seconds: float  # added to the resolved communicate seconds during the step
    queued: list[tuple[Any, Any]]  # communicate phases the step queued, still pending at its end
    resolved_earlier: list[tuple[Any, Any]]  # earlier steps' phases a read inside this step resolved


class StepTimes:
    """Per-step non-communication seconds of one rank: :meth:`start` and :meth:`stop` around every
    step, :meth:`take` for the values since the last take (in step order)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._values: list[float] = []  # CPU: resolved at once
        self._steps: list[_CudaStep] = []  # CUDA: resolved by take()
        self._open: tuple[Any, float, list[Any], int] | float | None = None

    def start(self, stats: CommStats) -> None:
        if not self.cuda:
            self._open = stats.seconds[PHASE]
            return
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        self._open = (event, stats._seconds[PHASE], stats._pending, len(stats._pending))

    def stop(self, stats: CommStats, step_seconds: float) -> None:
        """End the step that :meth:`start` began; ``step_seconds``: its wall time on the host (the
        CPU measure; on CUDA the events' span is used instead)."""
        opened, self._open = self._open, None
        if not self.cuda:
            assert isinstance(opened, float), "StepTimes.stop without start"
            self._values.append(step_seconds - (stats.seconds[PHASE] - opened))
            return
        assert isinstance(opened, tuple), "StepTimes.stop without start"
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        start, seconds, pending, count = opened
        if stats._pending is pending:  # nothing read the stats during the step
            queued, resolved_earlier = pending[count:], []
        else:  # a read of stats.seconds in the step resolved all that was pending, earlier steps' too
            queued, resolved_earlier = stats._pending, pending[:count]
        self._steps.append(
            _CudaStep(start, end, stats._seconds[PHASE] - seconds, _phases(queued), _phases(resolved_earlier))
        )

    def take(self) -> list[float]:
        """The seconds of the steps since the last take; on CUDA this waits for their events."""
        values, self._values = self._values, []
        steps, self._steps = self._steps, []
        for step in steps:
            communicate = step.host_seconds + _elapsed(step.queued) - _elapsed(step.resolved_earlier)
            values.append(_elapsed([(step.start, step.end)]) - communicate)
        return values


def _phases(entries: list[tuple[str, Any, Any]]) -> list[tuple[Any, Any]]:
    return [(start, end) for name, start, end in entries if name == PHASE]


def _elapsed(pairs: list[tuple[Any, Any]]) -> float:
    total = 0.0
    for start, end in pairs:
        end.synchronize()
        total += start.elapsed_time(end) / 1e3
    return total
