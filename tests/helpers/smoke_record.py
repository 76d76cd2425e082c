"""Every pipeline's smoke-scale losses against a committed record, so that a refactor of the
library or the loop that changes any training arithmetic shows up as a failing test.

The record (``tests/pipelines/smoke_losses/<pipeline>.json``) maps each run folder (relative to
the fixture's output) to its logged training losses. It is written, never edited by hand:

    THINWIRE_RECORD_SMOKE=1 pytest tests/pipelines -k smoke_losses

A change that is meant to alter the arithmetic (a documented deviation) re-records it in the same
commit, saying why.
"""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path

RECORD_DIR = Path(__file__).resolve().parents[1] / "pipelines" / "smoke_losses"
RECORD_ENV = "THINWIRE_RECORD_SMOKE"
# The runs are deterministic (gloo, fixed seeds, two threads); the slack only absorbs a libm or
# thread-count difference in the last bits, far below any change in what a method computes.
REL_TOL = 1e-6

CURVES = {"train_curve.csv": "train_loss", "steps.csv": "loss"}  # the loop's log, sparse AxoNN's


def read_losses(root: Path) -> dict[str, list[float]]:
    """Every run folder under ``root`` with its logged training losses, in step order."""
    losses: dict[str, list[float]] = {}
    for name, column in CURVES.items():
        for curve in sorted(root.rglob(name)):
            if "mlartifacts" in curve.parts:  # MLflow's copies of the same files
                continue
            with curve.open() as f:
                losses[curve.parent.relative_to(root).as_posix()] = [
                    float(row[column]) for row in csv.DictReader(f)
                ]
    return losses


def check_losses(pipeline: str, root: Path) -> None:
    """Assert that the smoke runs under ``root`` logged the recorded losses (or record them)."""
    measured = read_losses(root)
    assert measured, f"no training curve under {root}"
    record = RECORD_DIR / f"{pipeline}.json"
    if os.environ.get(RECORD_ENV) == "1":
        RECORD_DIR.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps(measured, indent=1, sort_keys=True) + "\n")
        return
    assert record.is_file(), f"no smoke-loss record {record}: record it with {RECORD_ENV}=1"
    expected = json.loads(record.read_text())
    assert sorted(measured) == sorted(expected), (
        f"the smoke runs are not the recorded ones: new {sorted(set(measured) - set(expected))}, "
        f"missing {sorted(set(expected) - set(measured))}"
    )
    for run, values in expected.items():
        got = measured[run]
        assert len(got) == len(values), f"{run}: {len(got)} logged losses, recorded {len(values)}"
        for step, (a, b) in enumerate(zip(got, values, strict=True)):
            assert math.isclose(a, b, rel_tol=REL_TOL, abs_tol=1e-12) or (math.isnan(a) and math.isnan(b)), (
                f"{pipeline} {run}: logged loss {step} is {a!r}, recorded {b!r}"
            )
