"""Where a pipeline's runs write: its committed results, their git-ignored artifacts, hand runs'
scratch."""

from __future__ import annotations

from pathlib import Path

from trainer.paths import REPO_ROOT

RESULTS_DIR = REPO_ROOT / "results"
# A run's model.pt and ckpt/ when its folder is under results/: the same place below artifacts/
# (git-ignored and no stage's output, so that a fresh clone, which lacks them, holds every stage's
# outputs whole and `dvc repro` retrains nothing).
ARTIFACTS_DIR = REPO_ROOT / "artifacts"
# Where a run launched by hand without --out goes (git-ignored): only DVC stages, which name their
# output folder with --out, write under results/.
SCRATCH_DIR = REPO_ROOT / "scratch"


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
