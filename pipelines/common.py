"""The launcher's view of a pipeline: a run's validated config, from its params or from the paper's
module the pipeline names (``runs_module``). Params files, result folders and the entry points'
set-up live in :mod:`harness` (``params``, ``folders``, ``entry``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from common.config import RunConfig
from harness.folders import RESULTS_DIR, pipeline_name
from harness.params import load_params, params_path, run_values
from trainer.checks import checked_config
from trainer.paths import REPO_ROOT

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
