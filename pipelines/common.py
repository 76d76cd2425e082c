"""Shared by the stage entry points: environment, params loading, logging."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from common.config import RunConfig, compose
from common.methods import checked_config
from common.paths import REPO_ROOT

PIPELINES_DIR = REPO_ROOT / "pipelines"
RESULTS_DIR = REPO_ROOT / "results"
# A run's model.pt and ckpt/ when its folder is under results/: the same place below artifacts/
# (git-ignored and no stage's output, so that a fresh clone, which lacks them, holds every stage's
# outputs whole and `dvc repro` retrains nothing).
ARTIFACTS_DIR = REPO_ROOT / "artifacts"
# Where a run launched by hand without --out goes (git-ignored): only DVC stages, which name their
# output folder with --out, write under results/.
SCRATCH_DIR = REPO_ROOT / "scratch"

# Nothing is sent anywhere: DVC analytics and MLflow telemetry off in every entry point.
QUIET_ENV = {
    "DVC_NO_ANALYTICS": "1",
    "ITERATIVE_DO_NOT_TRACK": "1",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "true",
    "HF_HUB_OFFLINE": "1",
}


def quiet_environment() -> None:
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)


def setup_logging(rank: int = 0) -> None:
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )


def params_path(pipeline: str) -> Path:
    """``pipelines/<pipeline>/params.yaml``; a ``pipeline`` with a slash is a folder path (your own
    pipeline: a folder holding a params.yaml, anywhere)."""
    path = (Path(pipeline) if "/" in pipeline else PIPELINES_DIR / pipeline) / "params.yaml"
    if not path.exists():
        known = sorted(p.parent.name for p in PIPELINES_DIR.glob("*/params.yaml"))
        raise ValueError(f"unknown pipeline {pipeline!r} (no {path}); known pipelines: {', '.join(known)}")
    return path


# libyaml's safe loader: the same documents, ~9x faster than the pure-Python one (a run's start
# reads the params files ~10 times: ~1 s of a smoke run's start-up on 2 cores).
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _read_mapping(path: Path) -> dict[str, Any]:
    with path.open() as f:
        data = yaml.load(f, Loader=_SAFE_LOADER) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a mapping, got {type(data).__name__}")
    return data


def load_params(pipeline: str) -> dict[str, Any]:
    """A pipeline's params.yaml. With ``runs_from: <folder>``, every ``*.yaml`` in that folder (next
    to params.yaml) adds its top-level mapping to ``runs``: the leaderboard takes each paper's methods
    from its own file, so a new paper joins without editing the stage. Duplicate run names fail."""
    path = params_path(pipeline)
    params = _read_mapping(path)
    folder = params.get("runs_from")
    if folder is not None:
        runs = dict(params.get("runs") or {})
        origin = dict.fromkeys(runs, path.name)
        for extra in sorted((path.parent / str(folder)).glob("*.yaml")):
            for name, run in _read_mapping(extra).items():
                if name in runs:
                    raise ValueError(
                        f"run {name!r} is defined twice: in {origin[name]} and in {extra.name}; rename one"
                    )
                runs[name] = run
                origin[name] = extra.name
        params["runs"] = runs
    return params


FROM_KEY = "from"


def run_values(
    pipeline: str, run: str, scale: str | None = None, *, _seen: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The flat parameters of ``run``: ``defaults <- scales[scale] <- runs[run]``, or, for a run
    with ``from: <pipeline>/<run>`` (a paper's ablation of a suite run), that run's parameters at
    the same scale with this run's other keys on top (this pipeline's defaults and scales do not
    apply: the recipe is the other run's)."""
    params = load_params(pipeline)
    scale = scale or params.get("scale")
    spec = (params.get("runs") or {}).get(run)
    if not isinstance(spec, dict) or FROM_KEY not in spec:
        return compose(params, run, scale)
    source = spec[FROM_KEY]
    parts = source.split("/") if isinstance(source, str) else []
    if len(parts) != 2 or not all(parts):
        raise ValueError(
            f"run {run!r}: {FROM_KEY} must be '<pipeline>/<run>', e.g. suite/cifar_fp32, got {source!r}"
        )
    if f"{pipeline}/{run}" in _seen or source in _seen:
        raise ValueError(f"run {run!r}: {FROM_KEY} chain {' -> '.join((*_seen, source))} loops")
    other, base = parts
    other_scales = load_params(other).get("scales") or {}
    values = run_values(
        other, base, scale if scale in other_scales else None, _seen=(*_seen, f"{pipeline}/{run}")
    )
    values.update({k: v for k, v in spec.items() if k != FROM_KEY})
    return values


# A pipeline whose runs are not rows of RunConfig settings names, in its params.yaml, the module that
# makes them (``runs_module: papers.sparse_axonn.train``): the launcher and the ranks then ask it for a
# run's config (``stage_config(run, scale, inputs)``) and let it train the run around the thinwire loop
# (``train_run(config, out_dir, run=..., ...)``, which adds its own measurements). ``inputs``: the
# folder of an earlier stage's outputs it reads (sparse AxoNN: the prune stage's), given to the
# launcher with --inputs and to the ranks through this variable; default results/<pipeline>.
RUNS_MODULE_KEY = "runs_module"
INPUTS_ENV = "THINWIRE_INPUTS_DIR"


def run_stage(pipeline: str) -> Any:
    """The module a pipeline's ``runs_module:`` names, or None (its runs are RunConfig rows)."""
    name = load_params(pipeline).get(RUNS_MODULE_KEY)
    if name is None:
        return None
    import importlib

    return importlib.import_module(str(name))


def inputs_dir(pipeline: str) -> Path:
    """The earlier stage's outputs a pipeline's own stage reads: $THINWIRE_INPUTS_DIR or its results."""
    given = os.environ.get(INPUTS_ENV)
    return Path(given).resolve() if given else RESULTS_DIR / pipeline_name(pipeline)


def run_config(pipeline: str, run: str, scale: str | None = None) -> RunConfig:
    """The validated config of ``run`` in ``pipeline`` (errors name the bad key or value)."""
    stage = run_stage(pipeline)
    if stage is not None:
        config: RunConfig = stage.stage_config(run, scale, inputs_dir(pipeline))
        return config
    try:
        return checked_config(run_values(pipeline, run, scale))
    except ValueError as error:
        path = params_path(pipeline).resolve()
        shown = path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path
        raise ValueError(f"{shown}, run {run!r}: {error}") from None


def pipeline_name(pipeline: str) -> str:
    """The name a pipeline's runs are tracked under: its folder's name."""
    return Path(pipeline).name


def run_dir(pipeline: str, run: str) -> Path:
    """A stage's committed results of ``run`` (what its report reads)."""
    return RESULTS_DIR / pipeline_name(pipeline) / run


def artifacts_for(folder: str | Path) -> Path:
    """Where the run in ``folder`` keeps ``model.pt`` and ``ckpt/``: for a folder below ``results/``
    the same place below ``artifacts/`` (see ``ARTIFACTS_DIR``); any other folder (a hand run's
    ``--out``, scratch) keeps them itself."""
    folder = Path(folder).resolve()
    try:
        return ARTIFACTS_DIR / folder.relative_to(RESULTS_DIR)
    except ValueError:
        return folder


def scratch_dir(pipeline: str, run: str) -> Path:
    """Where a hand run of ``run`` writes without ``--out`` (git-ignored)."""
    return SCRATCH_DIR / pipeline_name(pipeline) / run
