"""A pipeline's params.yaml (``pipelines/<pipeline>/params.yaml``, or your own folder's) and the flat
parameters of one of its runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from common.config import compose
from trainer.paths import REPO_ROOT

PIPELINES_DIR = REPO_ROOT / "pipelines"


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
STRETCH_KEY = "stretch"
# What a stretch multiplies: the run's length and every schedule point counted in steps or epochs,
# so that the lr schedule keeps its shape over the longer run (evaluations: num_evaluations, the same
# count). A strategy's own schedule (DGC's sparsity warm-up over its first 0.4 epochs) is left as the
# recipe has it: the paper fixes it in epochs whatever the length of training.
STRETCHED = ("epochs", "max_steps", "lr_warmup_steps", "lr_milestones")


def stretched(values: dict[str, Any], factor: Any) -> dict[str, Any]:
    """``values`` (a run's flat parameters) with the run ``factor`` times as long: the same recipe
    stretched (see STRETCHED). ``factor`` is a positive integer; the run must name its epochs."""
    if isinstance(factor, bool) or not isinstance(factor, int) or factor < 1:
        raise ValueError(f"{STRETCH_KEY} must be a positive integer (2: twice the epochs), got {factor!r}")
    if "epochs" not in values:
        raise ValueError(f"{STRETCH_KEY}: {factor} needs the run to name its epochs (it multiplies them)")
    out = dict(values)
    for key in STRETCHED:
        value = out.get(key)
        if isinstance(value, list | tuple):
            out[key] = [factor * v for v in value]
        elif value is not None:
            out[key] = factor * value
    return out


def run_values(
    pipeline: str, run: str, scale: str | None = None, *, _seen: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The flat parameters of ``run``: ``defaults <- scales[scale] <- runs[run]``, or, for a run
    with ``from: <pipeline>/<run>`` (a paper's ablation of a suite run), that run's parameters at
    the same scale with this run's other keys on top (this pipeline's defaults and scales do not
    apply: the recipe is the other run's). ``stretch: <n>`` makes the composed run n times as long
    (:func:`stretched`)."""
    params = load_params(pipeline)
    scale = scale or params.get("scale")
    spec = (params.get("runs") or {}).get(run)
    if not isinstance(spec, dict) or FROM_KEY not in spec:
        return _apply_stretch(compose(params, run, scale), run)
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
    return _apply_stretch(values, run)


def _apply_stretch(values: dict[str, Any], run: str) -> dict[str, Any]:
    if STRETCH_KEY not in values:
        return values
    factor = values.pop(STRETCH_KEY)
    try:
        return stretched(values, factor)
    except ValueError as error:
        raise ValueError(f"run {run!r}: {error}") from None
