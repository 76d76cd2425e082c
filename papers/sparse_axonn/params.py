"""params.yaml of the sparse AxoNN pipeline, read at the entry points only."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.folders import RESULTS_DIR, SCRATCH_DIR
from harness.params import load_params

from .config import RunSpec, ScaleConfig, from_params

PIPELINE = "sparse_axonn"
OUT = RESULTS_DIR / PIPELINE


def load_config(scale: str | None = None) -> tuple[ScaleConfig, dict[str, RunSpec]]:
    """The scale's settings and the runs of ``pipelines/sparse_axonn/params.yaml``, checked."""
    try:
        return from_params(load_params(PIPELINE), scale)
    except ValueError as error:
        raise ValueError(f"pipelines/{PIPELINE}/params.yaml: {error}") from None


def out_dir(path: str | None) -> Path:
    """``path``, or the git-ignored scratch folder of a hand run: only the DVC stage, which passes
    ``--out results/sparse_axonn``, writes the committed results."""
    out = Path(path).resolve() if path else SCRATCH_DIR / PIPELINE
    if not path:
        print(f"no --out: writing under {out} (git-ignored scratch)", file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)
    return out


def flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (MLflow params)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def convergence(dense: Mapping[str, Any]) -> str:
    """Whether the prune stage's dense run converged before pruning, in one sentence (``prune.json``'s
    ``dense``: its validation curve and plateau check)."""
    p = dense.get("plateau")
    if not p:
        return "The dense run recorded no validation curve (a prune stage from before that check)."
    curve = ", ".join(f"{loss:.3f}" for _, loss in dense["eval_curve"])
    verdict = "converged before pruning" if p["reached"] else "**not converged** before pruning"
    return (
        f"Dense validation loss over training: {curve} nats; its last fifth (from step {p['from_step']:.0f}) "
        f"gained {p['improvement']:.4f} nats against the stated {p['tolerance']:.4f}: {verdict}."
    )
