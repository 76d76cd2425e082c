"""Every pipeline's smoke-scale losses against a committed record, so that a refactor of the
library or the loop that changes any training arithmetic shows up as a failing test.

The record (``tests/pipelines/smoke_losses/<pipeline>.json``) maps a CPU platform
(:func:`platform_key`) to each run folder's logged training losses (run folders relative to the
fixture's output). It is written, never edited by hand:

    THINWIRE_RECORD_SMOKE=1 pytest tests/pipelines -k smoke_losses

which records (or replaces) this platform's entry and keeps the others. A change that is meant to
alter the arithmetic (a documented deviation) re-records it in the same commit, saying why, and
drops the entries of platforms it could not re-record. ``before-platform-keys`` is the record made
before platforms were told apart (at 01c875a, ExDyna's at d9d7769, on the machine of those sessions,
whose CPU is not known for sure): it serves only the coarse check.

Why per platform: the same code, seeds and thread count give other last bits on another CPU.
oneDNN's bf16 (autocast) and fp32 kernels differ between an AMX CPU and an AVX512-BF16 one; on
the smoke runs (measured 2026-12-02, an AMD EPYC with AVX512-BF16 against the record made before
platform keys existed) the logged losses differed by up to 8.2e-5 relative (suite), 2.7e-2 for
ExDyna (a threshold selection that flips one entry changes the next steps), and under 1e-7 where
nothing runs in bf16 (baseline, sparse AxoNN). So the record is exact (``REL_TOL``) on a platform
it was made on, and only a coarse check (``CROSS_PLATFORM_REL_TOL``, against every recorded
platform) elsewhere, which catches a broken method but not a change in the last digits.
"""

from __future__ import annotations

import csv
import json
import math
import os
import platform
from pathlib import Path

import torch

RECORD_DIR = Path(__file__).resolve().parents[1] / "pipelines" / "smoke_losses"
RECORD_ENV = "THINWIRE_RECORD_SMOKE"
# The runs are deterministic on one platform (gloo, fixed seeds, fixed threads); the slack only
# absorbs a libm difference in the last bits, far below any change in what a method computes.
REL_TOL = 1e-6
# Between platforms: 5e-2 covers the 2.7e-2 measured for ExDyna (module docstring).
CROSS_PLATFORM_REL_TOL = 5e-2

CURVES = {"train_curve.csv": "train_loss", "steps.csv": "loss"}  # the loop's log, sparse AxoNN's


def platform_key() -> str:
    """The machine's architecture and the widest CPU path oneDNN takes for the smoke runs' kernels:
    ``x86_64-amx``, ``x86_64-avx512_bf16``, ``x86_64-avx512``, ``x86_64-avx2``, ``aarch64-default``..."""
    cpu = torch.cpu
    if getattr(cpu, "_is_amx_tile_supported", lambda: False)():
        isa = "amx"
    elif getattr(cpu, "_is_avx512_bf16_supported", lambda: False)():
        isa = "avx512_bf16"
    else:
        isa = torch.backends.cpu.get_cpu_capability().lower()
    return f"{platform.machine()}-{isa}"


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


def compare(
    measured: dict[str, list[float]], expected: dict[str, list[float]], rel_tol: float, what: str
) -> None:
    """Assert that ``measured`` has the runs of ``expected``, each loss within ``rel_tol``."""
    assert sorted(measured) == sorted(expected), (
        f"{what}: the smoke runs are not the recorded ones: new {sorted(set(measured) - set(expected))}, "
        f"missing {sorted(set(expected) - set(measured))}"
    )
    for run, values in expected.items():
        got = measured[run]
        assert len(got) == len(values), f"{what} {run}: {len(got)} logged losses, recorded {len(values)}"
        for step, (a, b) in enumerate(zip(got, values, strict=True)):
            assert math.isclose(a, b, rel_tol=rel_tol, abs_tol=1e-12) or (math.isnan(a) and math.isnan(b)), (
                f"{what} {run}: logged loss {step} is {a!r}, recorded {b!r} (relative tolerance {rel_tol:g})"
            )


def check_losses(pipeline: str, root: Path) -> None:
    """Assert that the smoke runs under ``root`` logged the recorded losses (or record them)."""
    measured = read_losses(root)
    assert measured, f"no training curve under {root}"
    record = RECORD_DIR / f"{pipeline}.json"
    platforms: dict[str, dict[str, list[float]]] = json.loads(record.read_text()) if record.is_file() else {}
    key = platform_key()
    if os.environ.get(RECORD_ENV) == "1":
        RECORD_DIR.mkdir(parents=True, exist_ok=True)
        platforms[key] = measured
        record.write_text(json.dumps(platforms, indent=1, sort_keys=True) + "\n")
        return
    assert platforms, f"no smoke-loss record {record}: record it with {RECORD_ENV}=1"
    if key in platforms:
        compare(measured, platforms[key], REL_TOL, f"{pipeline} on {key}")
        return
    for other, expected in platforms.items():  # a platform not recorded: the coarse check
        compare(measured, expected, CROSS_PLATFORM_REL_TOL, f"{pipeline} on {key} against {other}'s record")
